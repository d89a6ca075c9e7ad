# The README's two commands:
#   make main   - set up, then train + evaluate zpx-tiny on embedded data, draw it, save, reload through AutoModel
#   make test   - set up, then run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch; override with TORCH_SPEC=torch for your platform's default build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup main test test-hf lint bench

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

# transformers' own common model tests (ModelTesterMixin, ConfigTester) against every family: they ship
# in the source distribution of the installed transformers, fetched once into $(HF_TESTS) (ignored by git).
HF_TESTS := .hf-tests
HF_VERSION = $(shell $(PY) -c "import transformers; print(transformers.__version__)")

$(HF_TESTS)/transformers-%/tests/__init__.py:
	mkdir -p $(HF_TESTS)
	$(PY) -m pip download -q --no-binary :all: --no-deps "transformers==$*" -d $(HF_TESTS)
	tar -xzf $(HF_TESTS)/transformers-$*.tar.gz -C $(HF_TESTS) "transformers-$*/tests"
	touch $@  # the sdist omits the package marker its tests' relative imports need

test-hf: setup
	$(MAKE) $(HF_TESTS)/transformers-$(HF_VERSION)/tests/__init__.py
	$(PY) -c "import parameterized" 2>/dev/null || $(PY) -m pip install -q parameterized  # used by those tests
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -q -ra tests/test_hf_common.py

lint: setup
	$(PY) -m ruff check zpx_hf training tests benchmarks

bench: setup
	$(PY) benchmarks/bench_zpx_memory.py
