# scalestudy — setup / run / test / bench / lint. Everything installs into .venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STUDY  ?= workflow/config/default.yaml
# The pin matters: an unpinned torch pulls a multi-GB CUDA build; 2.13.0 is a CPU build.
TORCH  ?= torch==2.13.0

.PHONY: setup setup-foreign run test test-quick bench gpu-wheels lint docs schema clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test,hta,mlflow,wandb,tensorboard]" "$(TORCH)"
	touch $@

# The foreign trainers tests/integration/test_foreign.py sweeps live (the `foreign` extra: torchtitan,
# DeepSpeed), installed with the torch pin so pip can never swap the CPU torch for another
# build (it fails instead), then checked; DeepSpeed's CPU communication op is compiled here,
# once, not inside a timed test.
setup-foreign: setup
	$(PY) -m pip install -q -e ".[foreign]" "$(TORCH)"
	$(PY) -c "import importlib.metadata as m, sys; v = m.version('torch'); sys.exit(0 if v.split('+')[0] == '$(subst torch==,,$(TORCH))' else f'torch {v} is not the pin $(TORCH)')"
	DS_ACCELERATOR=cpu $(PY) -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()"

run: setup
	$(VENV)/bin/scalestudy run "$(STUDY)"

# three pytest-xdist workers, a test file per worker at a time, in the order of tests/conftest.py
# (the longest files first; not xdist's order by test count): on 2 cores, a third worker fills
# the time the others wait (Slurm's status polls, a job's start, one rank at a time)
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=15

# the unit tests alone (no torchrun, no Snakemake run): about a minute
test-quick: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 tests/unit

# the study schema, the settings reference and the docs' generated blocks (point.json example,
# template placeholders), generated from the declared settings
schema:
	$(PY) -c "from pathlib import Path; from scalestudy.plan.docs_gen import write_generated; print(*write_generated(Path('.')) or ['up to date'])"

# the benchmarks are not installed: `python -m benchmarks` from the repository root
bench: setup
	$(PY) -m benchmarks

# Wheels the GPU machine's image lacks (no network there: the device tool carries the folder),
# for its Python (GPU_PY): jsonschema and its dependencies; HTA with its runtime modules only
# (its jupyterlab dependency is for notebooks). scripts/gpu_check.sh installs from them.
GPU_PY ?= 3.12
GPU_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
gpu-wheels: setup
	$(PY) -m pip download -q -d .gpu-wheels --only-binary=:all: --python-version $(GPU_PY) \
		--implementation cp $(GPU_PLATFORMS) jsonschema
	$(PY) -m pip download -q -d .gpu-wheels --no-deps --only-binary=:all: --python-version $(GPU_PY) \
		--implementation cp $(GPU_PLATFORMS) traceinsight plotly narwhals networkx pydot pyparsing psutil

# the documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or anchor fails
docs: setup
	$(PY) -m pip install -q -e ".[docs]"
	$(PY) -m mkdocs build --strict

lint: setup
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m compileall -q src tests benchmarks
	for s in workflow/config/*.yaml; do $(PY) -m snakemake --lint --config study=$$s || exit 1; done

clean:
	rm -rf results/*/ .snakemake
