# spectrial: `make demo` runs the embedded default trial; `make test` runs every test that can run here.
# Both create and use .venv in the repo root. Heavy artifacts (llama-server build, models) are cached
# outside the repo in $(SPECTRIAL_CACHE) (default ~/.cache/spectrial), keyed by version.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.spectrial-installed
PYTEST_ARGS ?=

.PHONY: setup demo test lab llama-server sshd lint clean-venv

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

setup: $(STAMP)

llama-server: setup
	$(BIN)/spectrial provision llama-server

sshd:
	@./scripts/ensure-sshd.sh

demo: llama-server
	$(BIN)/spectrial notebook 02 -p params_file=params/local.yaml -p steps=2

test: llama-server sshd
	$(BIN)/ruff check lib tests benchmarks
	$(BIN)/pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check lib tests benchmarks

lab: setup
	$(BIN)/python -m pip install -q -e '.[lab]'
	$(BIN)/jupyter lab notebooks

clean-venv:
	rm -rf $(VENV)
