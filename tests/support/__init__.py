"""Helper modules the tests share: `from support.<module> import ...` (tests/ is on
sys.path: pyproject.toml [tool.pytest.ini_options] pythonpath)."""
