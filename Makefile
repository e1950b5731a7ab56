# scalestudy — setup / run / test / bench / lint. Everything installs into .venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STUDY  ?= workflow/config/default.yaml
# The pin matters: an unpinned torch pulls a multi-GB CUDA build; 2.13.0 is a CPU build.
TORCH  ?= torch==2.13.0
# Bytecode is written (an environment may forbid it with PYTHONDONTWRITEBYTECODE): each of the
# hundreds of processes a study or the test suite starts (Snakemake jobs, runners, torchrun,
# ranks) then loads the project's modules compiled, not from source (about 0.2 s CPU each).
unexport PYTHONDONTWRITEBYTECODE

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
# the time the others wait (Slurm's status polls, a job's start, one rank at a time). The checks
# that read shares of a timed step (marked quiet) hold only on a host running nothing else:
# they are timing comparisons, so `make bench` runs them, alone
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=15 -m "not quiet"

# the unit tests alone (no torchrun, no Snakemake run): about a minute
test-quick: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 tests/unit

# the study schema, the settings reference and the docs' generated blocks (point.json example,
# template placeholders), generated from the declared settings
schema:
	$(PY) -c "from pathlib import Path; from scalestudy.plan.docs_gen import write_generated; print(*write_generated(Path('.')) or ['up to date'])"

# the benchmarks are not installed: `python -m benchmarks` from the repository root. First the
# step-share checks (marked quiet), alone; the benchmarks run whatever they gave, and a failed
# check still fails `make bench`
bench: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:xdist -m quiet; checks=$$?; \
	$(PY) -m benchmarks && exit $$checks

# Wheels the GPU machine's image lacks (no network there: the device tool carries the folder),
# for its Python (GPU_PY; 3.11 and 3.13 beside it for a wheel built for one CPython ABI),
# verified with a `pip install --dry-run --no-index` for that Python and against the image's
# package list (benchmarks/gpu_image_packages.txt). scripts/gpu_check.sh installs them by name.
GPU_PY ?= 3.12
gpu-wheels: setup
	$(PY) -m benchmarks.gpu_wheels download .gpu-wheels --python $(GPU_PY)
	$(PY) -m benchmarks.gpu_wheels verify .gpu-wheels --python $(GPU_PY)

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
