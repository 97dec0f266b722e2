# Two commands on a fresh clone: `make demo` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EXAMPLE := examples/digits/data.npz
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: demo test install example lint bench bench-quick clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

$(EXAMPLE): $(STAMP) examples/digits/make_model.py
	$(PY) examples/digits/make_model.py

example: $(EXAMPLE)

# A test key for the mobile variant's encrypt stage, made once, never committed (.orchestrator
# is git-ignored). The demo reads it into ORCHESTRATOR_MODEL_KEY: the recipe names no key.
DEMO_KEY := .orchestrator/demo.key

$(DEMO_KEY): | $(STAMP)  # order-only: a reinstall must not remake (refuse to overwrite) the key
	$(VENV)/bin/orchestrator keygen -o $(DEMO_KEY)

demo: $(EXAMPLE) $(DEMO_KEY)
	@echo "model key: ORCHESTRATOR_MODEL_KEY from $(DEMO_KEY)"
	ORCHESTRATOR_MODEL_KEY="$$(cat $(DEMO_KEY))" $(VENV)/bin/orchestrator run recipes/digits.yaml -o out/digits

test: $(EXAMPLE)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check orchestrator tests examples benchmarks

bench: $(EXAMPLE)
	$(PY) benchmarks/int8_size.py
	$(PY) benchmarks/log_ranges.py
	$(PY) benchmarks/cached_rerun.py
	$(PY) benchmarks/litert_side_by_side.py

# Every benchmark end to end with small settings (what make test runs, so they cannot rot)
bench-quick: $(EXAMPLE)
	$(PY) -m pytest -q -p no:cacheprovider tests/test_benchmarks_quick.py

clean:
	rm -rf .orchestrator out .pytest_cache
