# The README's two commands:
#   make main   - set up, then train + evaluate zpx-tiny on embedded data, draw it, save, reload through AutoModel
#   make test   - set up, then run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch; override with TORCH_SPEC=torch for your platform's default build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup main test lint bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[train,dev]"
	touch $@

setup: $(VENV)/.installed

main: setup
	$(VENV)/bin/zpx-main

test: setup
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -q -ra

lint: setup
	$(PY) -m ruff check zpx_hf training tests benchmarks

bench: setup
	$(PY) benchmarks/bench_zpx_memory.py
