# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.pomt-installed

.PHONY: install run test test-fast lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install -e ".[dev]"
	# The DINOv2 authors' model code; its pins are stale, the code runs on current torch.
	$(BIN)/pip install --no-deps "dinov2==0.0.1.dev2"
	touch $(STAMP)

run: install
	$(BIN)/python offline_computation.py --model deit_base --batch-size 4

test: install
	$(BIN)/pytest -q

test-fast: install
	$(BIN)/pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check .
	$(BIN)/shellcheck scripts/*.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
