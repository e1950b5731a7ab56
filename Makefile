# scalestudy — setup / run / test / bench / lint. Everything installs into .venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STUDY  ?= workflow/config/default.yaml
# The pin matters: an unpinned torch pulls a multi-GB CUDA build; 2.13.0 is a CPU build.
TORCH  ?= torch==2.13.0

.PHONY: setup setup-foreign run test bench lint docs clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
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

# the benchmarks are not installed: `python -m benchmarks` from the repository root
bench: setup
	$(PY) -m benchmarks

# the documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or anchor fails
docs: setup
	$(PY) -m pip install -q -e ".[docs]"
	$(PY) -m mkdocs build --strict

lint: setup
	$(PY) -m compileall -q src tests benchmarks
	for s in workflow/config/*.yaml; do $(PY) -m snakemake --lint --config study=$$s || exit 1; done

clean:
	rm -rf results/*/ .snakemake
