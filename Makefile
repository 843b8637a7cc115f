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

.PHONY: install install-torch demo test readme-check bench report reproduce-dyck reproduce-table1 \
	reproduce-table2 reproduce-table2-standin reproduce-table3 reproduce-table3-cpu \
	reproduce-table4 reproduce-table4-cpu reproduce-secondorder clean-demo

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

# The paper tables: run the runs that are missing, resume interrupted ones, print the table.
# `make -n reproduce-table1` shows the commands; `lstmablate sweep table1 --list` lists every run.
reproduce-dyck:
	$(PY) -m lstmablate sweep dyck-report --out $(RUNS) --threads $(THREADS)
	$(PY) -m lstmablate sweep dyck-rnn-trainable --out $(RUNS) --threads $(THREADS)
	$(PY) -m lstmablate report $(RUNS) --table dyck-report
	$(PY) -m lstmablate report $(RUNS) --table dyck-rnn-trainable

reproduce-table1:
	$(PY) -m lstmablate sweep table1 --out $(RUNS) --threads $(THREADS) $(SWEEP_ARGS)
	$(PY) -m lstmablate report $(RUNS) --table table1

# Table 2 (SQuAD v1.1 dev, DrQA and BiDAF): needs train-v1.1.json (and GloVe for the paper's
# embeddings); the stand-in trains on dev split by article and is labelled as such.
reproduce-table2:
	$(PY) -m lstmablate sweep table2 --out $(RUNS) --threads $(THREADS) $(SWEEP_ARGS)
	$(PY) -m lstmablate report $(RUNS) --table table2

reproduce-table2-standin:
	$(PY) -m lstmablate sweep table2-standin --out $(RUNS) --threads $(THREADS) $(SWEEP_ARGS)
	$(PY) -m lstmablate report $(RUNS) --table table2-standin

# Table 3 (UD EWT parsing, Parser-v1): paper scale needs a GPU; the CPU-scale recipe is labelled.
reproduce-table3:
	$(PY) -m lstmablate sweep table3 --out $(RUNS) --threads $(THREADS) $(SWEEP_ARGS)
	$(PY) -m lstmablate report $(RUNS) --table table3

reproduce-table3-cpu:
	$(PY) -m lstmablate sweep parsing-ewt-cpu --out $(RUNS) --threads $(THREADS) $(SWEEP_ARGS)
	$(PY) -m lstmablate report $(RUNS) --table parsing-ewt-cpu

# Table 4 (Multi30k En->De, OpenNMT-py's default model): paper scale needs a GPU.
reproduce-table4:
	$(PY) -m lstmablate sweep table4 --out $(RUNS) --threads $(THREADS) $(SWEEP_ARGS)
	$(PY) -m lstmablate report $(RUNS) --table table4

reproduce-table4-cpu:
	$(PY) -m lstmablate sweep nmt-multi30k-cpu --out $(RUNS) --threads $(THREADS) $(SWEEP_ARGS)
	$(PY) -m lstmablate report $(RUNS) --table nmt-multi30k-cpu

# The second-order report's PTB language models (Renganathan & Singh: Table 2, char BPC and word
# cross-entropy; Table 3, training on sentences cut at 25/50/75 characters). Paper scale needs a
# GPU (SWEEP_ARGS="--device cuda"); `make reproduce-secondorder CPU=1` runs the CPU stand-ins
# (secondorder-*-cpu: char models at 0.15M parameters and at most 20 epochs, word models
# at the report's sizes and 2 epochs). See docs/secondorder-lm.md.
reproduce-secondorder:
	$(PY) -m lstmablate sweep secondorder-table2$(if $(CPU),-cpu) --out $(RUNS) --threads $(THREADS) $(SWEEP_ARGS)
	$(PY) -m lstmablate sweep secondorder-table3$(if $(CPU),-cpu) --out $(RUNS) --threads $(THREADS) $(SWEEP_ARGS)
	$(if $(CPU),,$(PY) -m lstmablate sweep secondorder-char-1layer-matched --out $(RUNS) --threads $(THREADS) $(SWEEP_ARGS))
	$(PY) -m lstmablate report $(RUNS) --table secondorder-table2-char$(if $(CPU),-cpu)
	$(PY) -m lstmablate report $(RUNS) --table secondorder-table2-word$(if $(CPU),-cpu)
	$(PY) -m lstmablate report $(RUNS) --table secondorder-table3$(if $(CPU),-cpu)

clean-demo:
	rm -rf $(RUNS)/dyck-demo
