# lstmablate — the two set-up commands are `make demo` and `make test`.
#
# Both install into the active virtual environment, or create ./.venv if none
# is active. PyTorch is installed first, so the project's `torch>=2.1`
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
THREADS ?= 2
PYTEST_ARGS ?= -q
SWEEP_ARGS ?=   # e.g. SWEEP_ARGS="--device cuda"

# (reproduce-% is a pattern rule, which .PHONY would switch off; no file has such a name.)
.PHONY: install install-torch demo test readme-check bench gpu-check report clean-demo

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

demo: install
	$(PY) -m lstmablate sweep dyck-demo --out $(RUNS) --threads $(THREADS)
	$(PY) -m lstmablate report $(RUNS) --table dyck-demo

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

# The README's "Using it" commands, in order, in a fresh folder after the demo (CI runs it).
readme-check: install
	$(PY) tests/readme_check.py

report:
	$(PY) -m lstmablate report $(RUNS)

bench:
	$(PY) -m lstmablate bench --threads $(THREADS)

# On a GPU machine: tests/gpu/, the cell and PTB training-step benchmarks against cuDNN, 200
# PTB-medium training steps per paper cell through the trainer (PTB data: LSTMABLATE_DATA);
# writes benchmarks/results/gpu-check-<gpu>-<date>.json and .md (docs/performance.md).
# Needs only PyTorch with CUDA (and Triton) and this checkout installed: it uses the
# virtual environment's python if there is one, else $(PYTHON) (no `make install`).
GPU_CHECK_PY = $(if $(wildcard $(PY)),$(PY),$(PYTHON))
gpu-check:
	$(GPU_CHECK_PY) -m lstmablate.bench.gpu_check --out benchmarks/results

# The paper tables: `make reproduce-<name>` sweeps the recipe or table spec <name> (runs the
# runs that are missing, resumes interrupted ones) and prints its table: reproduce-table1 …
# reproduce-table4 (the paper's scale: a GPU job, SWEEP_ARGS="--device cuda"),
# reproduce-table2-standin (SQuAD without the official training file: dev split by article,
# labelled), and the names below, which sweep or report more than one recipe.
# `make -n reproduce-table1` shows the commands; `lstmablate sweep table1 --list` every run.
RECIPES_table3-cpu := parsing-ewt-cpu    # Table 3 at CPU scale (3 x 100, 4,000 steps)
RECIPES_table4-cpu := nmt-multi30k-cpu   # Table 4 at CPU size (2 x 256)
RECIPES_dyck := dyck-report dyck-rnn-trainable
# The second-order report's PTB language models (Renganathan & Singh: Table 2, char BPC and word
# cross-entropy; Table 3, training on sentences cut at 25/50/75 characters). CPU=1 runs the CPU
# stand-ins (secondorder-*-cpu: char models at 0.15M parameters and at most 20 epochs, word
# models at the report's sizes and 2 epochs). See docs/secondorder-lm.md.
RECIPES_secondorder := secondorder-table2$(if $(CPU),-cpu) secondorder-table3$(if $(CPU),-cpu) \
	$(if $(CPU),,secondorder-char-1layer-matched)
TABLES_secondorder := secondorder-table2-char$(if $(CPU),-cpu) secondorder-table2-word$(if $(CPU),-cpu) \
	secondorder-table3$(if $(CPU),-cpu)
# The Stanford Sentiment Treebank (SST-5 and SST-2, sentence accuracy): the five paper cells in an
# InferSent-style BiLSTM-max classifier with Tai et al. (2015)'s training. For the published
# setting add GloVe 840B: SWEEP_ARGS="--set model.pretrained=PATH/glove.840B.300d.txt"; without
# it the embeddings are random. CPU=1 runs the CPU-scale recipes (sst{5,2}-bilstm-max-cpu:
# random 100-d embeddings, three seeds; docs/results/sst.md).
RECIPES_sst := sst$(if $(CPU),-cpu)

define newline


endef
reproduce-%:
	$(foreach r,$(or $(RECIPES_$*),$*),$(PY) -m lstmablate sweep $(r) --out $(RUNS) --threads $(THREADS) $(SWEEP_ARGS)$(newline))
	$(foreach t,$(or $(TABLES_$*),$(RECIPES_$*),$*),$(PY) -m lstmablate report $(RUNS) --table $(t)$(newline))

clean-demo:
	rm -rf $(RUNS)/dyck-demo
