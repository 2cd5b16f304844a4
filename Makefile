# Two commands on a fresh machine:  `make demo` (pre-train on the embedded default) and `make test`.
# Both create the virtual environment on first use.
PYTHON ?= python3
VENV ?= .venv
# torch's version; the build is the index's (README: Quick start). On a CUDA machine e.g. `make TORCH=torch demo`.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.retromae-installed

.PHONY: setup demo test smoke lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	HF_HUB_OFFLINE=1 $(BIN)/retromae pretrain

# pytest-xdist workers for `make test` and `make smoke`; each test file stays on one worker, so its module fixtures
# run once.
TEST_WORKERS ?= 2

test: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# End-to-end smoke runs of the experiment scripts and the longest checks (minutes; outside `make test`'s 10-minute
# budget).
smoke: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "experiment or long"

lint: setup
	$(BIN)/ruff check api modeling trainers tests benchmarks

bench: setup
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/pretrain_throughput.py

clean:
	rm -rf $(VENV) out
