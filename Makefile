# Two commands on a fresh clone: `make demo` and `make test`. Each sets itself up.
# `make demo` installs what the demo runs (requirements/demo.lock); `make test` installs what
# the tests need as well (requirements/test.lock), or after a demo only the difference.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_LOCK := requirements/demo.lock
TEST_LOCK := requirements/test.lock
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-test
EXAMPLE := examples/digits/data.npz
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: demo test install install-test example lint bench bench-quick lock clean

# pip compiles what it installs to bytecode one file after the other (145 s of a 230 s
# install on the project's 2-core machine); compileall does it on every core, in 60 s. It
# skips the packages' own test suites and the dependencies of dependencies that neither a
# run nor the tests import (a fifth of the bytecode, sympy alone 8 %): were one imported,
# Python compiles it then, once
UNIMPORTED := sympy|mpmath|networkx|playwright|apprise|setuptools|cfnlint|wcwidth
# setuptools' note on every editable install ("Editable installation ... Please be careful
# with folders in your working directory with the same name as your package"): a warning
# filter on that message alone, for the backend and pip; other warnings and every error show
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"
COMPILE_SITE := $(PY) -m compileall -q -j 0 -x '/tests?/|/($(UNIMPORTED))/' \
	"$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" > /dev/null

# The locks pin every package, pip included; `-c` holds each install to them
$(DEMO_STAMP): pyproject.toml $(DEMO_LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c $(DEMO_LOCK) pip
	$(QUIET_EDITABLE) $(PY) -m pip install -q --no-compile -c $(DEMO_LOCK) -e .
	$(COMPILE_SITE)
	touch $@

# On a fresh clone, one pip run for both: test.lock holds what the demo needs at the same
# versions (`make lock`), so the demo's stamp is made too (an existing one is left as it is:
# a newer stamp would remake the example). After `make demo`, pip adds the difference.
$(TEST_STAMP): pyproject.toml $(DEMO_LOCK) $(TEST_LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c $(TEST_LOCK) pip
	$(QUIET_EDITABLE) $(PY) -m pip install -q --no-compile -c $(TEST_LOCK) -e ".[test]"
	$(COMPILE_SITE)
	test -e $(DEMO_STAMP) || touch $(DEMO_STAMP)
	touch $@

install: $(DEMO_STAMP)

install-test: $(TEST_STAMP)

$(EXAMPLE): $(DEMO_STAMP) examples/digits/make_model.py
	$(PY) examples/digits/make_model.py

example: $(EXAMPLE)

# A test key for the mobile variant's encrypt stage, made once, never committed (.orchestrator
# is git-ignored). The demo reads it into ORCHESTRATOR_MODEL_KEY: the recipe names no key.
DEMO_KEY := .orchestrator/demo.key

$(DEMO_KEY): | $(DEMO_STAMP)  # order-only: a reinstall must not remake (refuse to overwrite) the key
	$(VENV)/bin/orchestrator keygen -o $(DEMO_KEY)

# Writes the recipe's own output folder, out/digits-cnn (its name), as `orchestrator run` does
demo: $(EXAMPLE) $(DEMO_KEY)
	@echo "model key: ORCHESTRATOR_MODEL_KEY from $(DEMO_KEY)"
	ORCHESTRATOR_MODEL_KEY="$$(cat $(DEMO_KEY))" $(VENV)/bin/orchestrator run recipes/digits.yaml
	@echo "the orchestrator command: . $(VENV)/bin/activate (or run $(VENV)/bin/orchestrator)"

# The import layers first (docs/architecture.md; contracts in pyproject.toml), then the
# suite on every core (pytest-xdist: a test file's tests stay in one worker, which keeps its
# module's model and servers to itself; the files in the order tests/conftest.py gives them,
# longest first, which xdist would otherwise replace by the number of tests in a file); it
# ends with the 15 slowest tests, so that each change sees what it costs
test: $(TEST_STAMP) $(EXAMPLE)  # the install first: on a fresh clone it makes the demo's too
	$(VENV)/bin/lint-imports --no-logo --no-cache
	sh tests/device_setup.sh $(VENV)/bin/orchestrator
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=15

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check orchestrator tests examples benchmarks

bench: $(EXAMPLE) $(TEST_STAMP)
	$(PY) benchmarks/int8_size.py
	$(PY) benchmarks/log_ranges.py
	$(PY) benchmarks/cached_rerun.py
	$(PY) benchmarks/litert_side_by_side.py

# Every benchmark end to end with small settings (what make test runs, so they cannot rot;
# mini_xception.py runs whole, in its acceptance test)
bench-quick: $(EXAMPLE) $(TEST_STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/test_benchmarks_quick.py \
		tests/e2e/test_mini_xception.py

# Re-resolves both locks from pyproject.toml against the package index pip is configured
# with (pip-tools' pip-compile reads pip's configuration), for this Python (3.11) on Linux
# x86_64. test.lock first; demo.lock is held to its versions, so that `make test` after
# `make demo` adds packages and changes none. Commit both files.
LOCK_TOOLS := $(VENV)/lock-tools
COMPILE := $(LOCK_TOOLS)/bin/pip-compile -q --strip-extras --allow-unsafe --no-emit-index-url \
	--no-emit-find-links --no-emit-trusted-host --upgrade --annotation-style=line

lock: export CUSTOM_COMPILE_COMMAND := make lock
lock:
	test -x $(LOCK_TOOLS)/bin/pip-compile || ($(PYTHON) -m venv $(LOCK_TOOLS) && \
		$(LOCK_TOOLS)/bin/pip install -q pip-tools)
	mkdir -p requirements
	echo pip | $(COMPILE) --extra test -o $(TEST_LOCK) pyproject.toml -
	echo pip | $(COMPILE) -c $(TEST_LOCK) -o $(DEMO_LOCK) pyproject.toml -

clean:
	rm -rf .orchestrator out .pytest_cache
