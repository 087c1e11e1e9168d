# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.pomt-installed
# What each stamp stands for: STAMP the core with [dev] (make run, lint); DEPLOY_STAMP also [deploy]
# (ONNX Runtime, OpenVINO) and [hf] (transformers), which make test needs. A change to pyproject.toml redoes both.
DEPLOY_STAMP := $(VENV)/.pomt-installed-deploy
# The tests keep one thread each (tests/conftest.py): one worker process a core.
TEST_WORKERS ?= 2

.PHONY: install install-deploy run test test-fast lint clean

install: $(STAMP)

install-deploy: $(DEPLOY_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install -e ".[dev]"
	# The DINOv2 authors' model code; its pins are stale, the code runs on current torch.
	$(BIN)/pip install --no-deps "dinov2==0.0.1.dev2"
	touch $(STAMP)

$(DEPLOY_STAMP): $(STAMP)
	$(BIN)/pip install -e ".[dev,deploy,hf]"
	touch $(DEPLOY_STAMP)

run: install
	$(BIN)/python offline_computation.py --model deit_base --batch-size 4

test: install-deploy
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal

test-fast: install-deploy
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not slow"

lint: install
	$(BIN)/ruff check .
	$(BIN)/shellcheck scripts/*.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
