# Two commands do all the set-up on a fresh machine with only Python and pip:
#   make demo   -> creates .venv if missing, installs, runs the main job, prints where its results are
#   make test   -> creates .venv if missing, installs, runs the whole test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv demo test test-fast test-oldest lab bench docs clean help

help:
	@echo "make demo   run the main job (data, scaling + batch/LR sweeps, report) and print where results are"
	@echo "make test   run the whole test suite (CPU, simulated replicas)"
	@echo "make test-fast  the unit tests only (about 1.5 min on 2 cores)"
	@echo "make test-oldest  the unit tests and a short train, scale and predict on the oldest supported TensorFlow"
	@echo "make lab    open JupyterLab on notebooks/ with the project's kernel"
	@echo "make docs   build the documentation site into site/ (strict; notebooks executed in smoke mode)"
	@echo "make bench  run the benchmarks in benchmarks/ (figures go to BENCHMARKS.md by hand)"

# Re-install when pyproject.toml changes; the stamp keeps repeated `make test` calls fast.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,lab,docs]"
	$(PY) -m ipykernel install --sys-prefix --name tftoolkit --display-name "Python (tftoolkit)" >/dev/null
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tftoolkit demo --out runs/demo

# Three pytest workers on 2 cores: the slow tests wait on subprocesses, servers and kernels starting, and with two
# workers the cores were 1.61 busy (565 s); with three 1.77 (491 s, in a slower phase of the machine; BENCHMARKS.md).
# A test file stays on one worker (--dist loadfile), so module fixtures and the notebook runs they share are built
# once. Files go out in tests/conftest.py's LONGEST_FIRST order: pytest-xdist would otherwise sort them by test
# count (--loadscope-reorder, its default since 3.6), leaving long files of few tests for last on one worker.
PYTEST := $(PY) -m pytest -q -p no:cacheprovider --dist loadfile --no-loadscope-reorder

test: $(STAMP)
	$(PYTEST) -n 3

# Unit tests only (no subprocesses, notebooks or long trainings), on two workers: nothing in them waits, and a third
# worker only adds its start (2026-12-02: 101 and 107 s with two, 112 and 113 s with three; BENCHMARKS.md).
test-fast: $(STAMP)
	$(PYTEST) -n 2 -m "not slow"

# The oldest versions the package allows (constraints/oldest.txt: TensorFlow 2.16, Keras 3.13, NumPy 1.26), in a venv
# of their own: the unit tests, then a short train, scale and predict through the console script. CI runs it after
# `make test` (.ci/run).
OLDEST := .venv-oldest
SMOKE  := --dataset synthetic --image-size 16 --train-images 512 --model small_cnn --per-replica-batch 32 --steps 8 \
          --steps-per-loop 2 --timing-warmup-steps 2 --warmup-epochs 0 --schedule constant --quiet

test-oldest:
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet -c constraints/oldest.txt -e ".[dev,lab]"
	$(OLDEST)/bin/python -m pytest -q -p no:cacheprovider -n 2 -m "not slow" --ignore=tests/docs
	rm -rf runs/oldest
	$(OLDEST)/bin/tftoolkit train --replicas 2 $(SMOKE) --out runs/oldest/train
	$(OLDEST)/bin/tftoolkit scale --replica-counts 1,2 $(SMOKE) --out runs/oldest/scale
	$(OLDEST)/bin/tftoolkit predict --model resnet50 --per-replica-batch 256 --gpu a100-sxm4-80 \
	    --interconnect dgx-a100 --replica-counts 1,8

# Jupyter refuses to start as root unless told; containers and CI often run as root.
lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/ $$([ "$$(id -u)" = 0 ] && echo --allow-root)

# The site (mkdocs.yml; the reference pages are generated from the code by docs/hooks/reference.py). The notebooks
# are executed first in smoke mode, each with its own first cell's papermill parameters, into build/docs/notebooks/,
# so their pages show figures (a few minutes on 2 cores); the committed notebooks stay without outputs.
docs: $(STAMP)
	$(PY) docs/hooks/execute_notebooks.py build/docs
	NO_MKDOCS_2_WARNING=1 TFTOOLKIT_DOCS_EXECUTED=build/docs $(VENV)/bin/mkdocs build --strict --site-dir site

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf runs .pytest_cache site build/docs .venv-oldest
