# lstmablate — the two set-up commands are `make demo` and `make test`.
#
# Both install into the active virtual environment, or create ./.venv if none
# is active: `make demo` the package alone (what a CPU run needs), `make test` with
# the dev extras (pytest, Triton for the kernel tests, deepsig, submitit, ruff).
# PyTorch is installed first, so the project's `torch>=2.1`
# dependency is already met and pip never pulls a second torch:
#   * a torch already installed is kept (e.g. your CUDA build);
#   * else a local wheel of torch==$(TORCH_VERSION) if pip can find one offline;
#   * else, on a machine with an NVIDIA driver (nvidia-smi), PyPI's default
#     (CUDA) build, or the index in TORCH_INDEX (e.g. .../whl/cu121);
#   * else the CPU-only build from the PyTorch CPU index (no CUDA wheels).

TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
PYTHON ?= python3
VENV ?= .venv
ifdef VIRTUAL_ENV
  PY := $(VIRTUAL_ENV)/bin/python
else
  PY := $(VENV)/bin/python
endif
RUNS ?= runs
# torch threads per run; empty: the cores free now (lstmablate/threads.py), chosen once per sweep
THREADS ?=
THREADS_ARG = $(if $(THREADS),--threads $(THREADS))
PYTEST_ARGS ?= -q
SWEEP_ARGS ?=   # e.g. SWEEP_ARGS="--device cuda"

# (reproduce-% is a pattern rule, which .PHONY would switch off; no file has such a name.)
.PHONY: install install-demo install-torch demo test test-slow lint readme-check recipe-snapshot \
	bench gpu-check report \
	clean-demo pages gpu-window-prepare gpu-window gpu-window-watch gpu-window-land

$(PY):
	$(PYTHON) -m venv $(VENV)

install-torch: $(PY)
	@if $(PY) -c "import torch" 2>/dev/null; then \
	  echo "torch $$($(PY) -c 'import torch; print(torch.__version__)') already installed: keeping it"; \
	elif [ -n "$(TORCH_INDEX)" ]; then \
	  $(PY) -m pip install "torch==$(TORCH_VERSION)" --index-url "$(TORCH_INDEX)"; \
	elif $(PY) -m pip download -q --no-deps --no-index -d "$$(mktemp -d)" "torch==$(TORCH_VERSION)" >/dev/null 2>&1; then \
	  echo "a local wheel of torch $(TORCH_VERSION) is available: installing it"; \
	  $(PY) -m pip install "torch==$(TORCH_VERSION)"; \
	elif command -v nvidia-smi >/dev/null 2>&1; then \
	  $(PY) -m pip install "torch==$(TORCH_VERSION)"; \
	else \
	  $(PY) -m pip install "torch==$(TORCH_VERSION)" --index-url "$(TORCH_CPU_INDEX)"; \
	fi

install: install-torch
	$(PY) -m pip install -e ".[dev]"

# the package alone: a CPU run needs none of the dev extras (Triton is the largest of them)
install-demo: install-torch
	$(PY) -m pip install -e .

demo: install-demo
	$(PY) -m lstmablate sweep dyck-demo --out $(RUNS) $(THREADS_ARG)
	$(PY) -m lstmablate report $(RUNS) --table dyck-demo
	@echo "A model this small moves by several points between CPUs, thread counts and seeds;"
	@echo "compare the cells' pattern, not single numbers (docs/results/dyck.md, 'What to expect')."

# the tests but those marked slow (over ~20 s each; README, "Tests"); `make test-slow` runs
# those, and CI runs both, so that every test runs once
test: install
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: install
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

# The resolved configs of every shipped recipe, which tests/test_recipes.py compares every
# recipe with: rewrite it only with a change meant to alter what a recipe runs (docs/recipes.md).
recipe-snapshot:
	$(PY) tests/fixtures/resolved_recipes.py

# ruff with the project's style (pyproject.toml [tool.ruff]); CI runs it before the tests, and
# pre-commit runs it on each commit (.pre-commit-config.yaml: `pre-commit install` once).
lint: install
	$(PY) -m ruff check .

# The README's "Using it" commands, in order, in a fresh folder after the demo (CI runs it).
readme-check: install-demo
	$(PY) tests/readme_check.py

report:
	$(PY) -m lstmablate report $(RUNS)

# Every marked table of the results pages (docs/results/*.md) and the README's headline,
# regenerated from the run records in experiments/results/ (docs/results/README.md); run it
# after adding or replacing records, and commit the pages with them.
pages:
	$(PY) tools/pages.py

bench:
	$(PY) -m lstmablate bench $(THREADS_ARG)

# On a GPU machine (docs/design/gpu-checks.md, "One command on a GPU machine"): tests/gpu/, every
# fast path against the reference at the paper's shapes (float32, bfloat16), the cell
# benchmark against cuDNN at FP32 and TF32, the recipes' training steps, the PTB model
# benchmark and a profiler kernel table, each stage within its share of BUDGET seconds; the
# record (.jsonl, .json, .md, .log) grows in OUT as each stage ends.  Needs only PyTorch with
# CUDA (and Triton) and this checkout installed: it uses the virtual environment's python if
# there is one, else $(PYTHON) (no `make install`).
GPU_CHECK_PY = $(if $(wildcard $(PY)),$(PY),$(PYTHON))
BUDGET ?= 480
gpu-check:
	$(GPU_CHECK_PY) -m lstmablate.bench.gpu_check --out $(or $(OUT),benchmarks/results) \
	  --budget $(BUDGET)

# A GPU window (docs/design/gpu-checks.md, "GPU window"): here, `make gpu-window-prepare` (the
# wheels the GPU machine lacks, WHEELS, and the runs' data from LSTMABLATE_DATA or DATA, into
# the git-ignored .gpuwindow/wheels and .gpuwindow/data that travel with the checkout); there,
# `make gpu-window MINUTES=9 THEN=4 OUT=DIR` (PLAN=FILE: another plan, e.g.
# benchmarks/plans/gates-lr-first.json), then at once `make gpu-window-watch MINUTES=4 OUT=DIR`;
# back here, `make gpu-window-land OUT=DIR` writes the finished runs into experiments/results.
MINUTES ?= 9
THEN ?= 0
WHEELS ?= sacremoses conllu
gpu-window-prepare:
	$(PY) -m lstmablate.bench.window prepare --wheels "$(WHEELS)" $(if $(DATA),--data-dir $(DATA))

# (DEVICE=cpu: a dry run; FOLDER: the window's folder; STAGES="environment steps ...": gpu-check's
# stages, in order, instead of all of them. On a machine without a GPU it stops at once, exit
# 2, with one line saying so.)
gpu-window:
	$(GPU_CHECK_PY) -m lstmablate.bench.window run --minutes $(MINUTES) --then $(THEN) \
	  --out $(or $(OUT),.gpuwindow/out) $(if $(PLAN),--plan $(PLAN)) \
	  $(foreach s,$(STAGES),--check-stage $(s)) \
	  $(if $(DEVICE),--device $(DEVICE)) $(if $(FOLDER),--folder $(FOLDER))

gpu-window-watch:
	$(GPU_CHECK_PY) -m lstmablate.bench.window watch --minutes $(MINUTES) \
	  --out $(or $(OUT),.gpuwindow/out)

gpu-window-land:
	$(PY) -m lstmablate.bench.window land $(or $(OUT),.gpuwindow/out)

# The paper tables: `make reproduce-NAME` sweeps the recipe or table spec NAME (runs the runs
# that are missing, resumes interrupted ones) and prints its table — for a set of tables (a
# table spec whose experiments are tables: secondorder, dyck), each of them. CPU=1 takes the
# CPU stand-in NAME-cpu instead (table3, table4, secondorder, sst). Which recipes form a table
# is said once, in its table spec (recipes/NAME.yaml; `lstmablate list recipes`): this file
# lists none. reproduce-table1 … reproduce-table4 are the paper's scale (a GPU job,
# SWEEP_ARGS="--device cuda"); reproduce-table2-standin is SQuAD without the official training
# file. `make -n reproduce-table1` shows the commands; `lstmablate sweep table1 --list` every run.
REPRODUCE = $(if $(CPU),$(patsubst %-cpu,%,$*)-cpu,$*)
# the tables of $(1) (lstmablate.recipes.report_tables), or $(1) itself where that cannot be
# asked (no virtual environment yet: the sweep before it says what is wrong)
report_tables = $(or $(shell $(PY) -c 'import sys; from lstmablate.recipes import report_tables; \
	print(*report_tables(sys.argv[1]))' $(1) 2>/dev/null),$(1))

define newline


endef
reproduce-%:
	$(PY) -m lstmablate sweep $(REPRODUCE) --out $(RUNS) $(THREADS_ARG) $(SWEEP_ARGS)
	$(foreach t,$(call report_tables,$(REPRODUCE)),$(PY) -m lstmablate report $(RUNS) --table $(t)$(newline))

clean-demo:
	rm -rf $(RUNS)/dyck-demo
