# scalestudy — setup / run / test / bench / lint. Everything installs into .venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STUDY  ?= workflow/config/default.yaml
# The pin matters: an unpinned torch pulls a multi-GB CUDA build; 2.13.0 is a CPU build.
TORCH  ?= torch==2.13.0

.PHONY: setup run test bench lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

run: setup
	$(VENV)/bin/scalestudy run "$(STUDY)"

test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q --durations=15

# the benchmarks are not installed: `python -m benchmarks` from the repository root
bench: setup
	$(PY) -m benchmarks

lint: setup
	$(PY) -m compileall -q src tests benchmarks
	for s in workflow/config/*.yaml; do $(PY) -m snakemake --lint --config study=$$s || exit 1; done

clean:
	rm -rf results/*/ .snakemake
