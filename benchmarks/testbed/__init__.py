"""What tests and benchmarks share: the test models (models_*.py, built seeded through
model_builds.py, with their committed weights in trained/) and a real sshd board on loopback
(ssh_board.py). Import as `from testbed import ...` with benchmarks/ on sys.path (a
benchmark script's own folder; pyproject.toml [tool.pytest.ini_options] pythonpath for tests)."""
