# The README's two commands:
#   make main   - set up, then train + evaluate zpx-tiny on embedded data, draw it, save, reload through AutoModel
#   make test   - set up, then run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch; override with TORCH_SPEC=torch for your platform's default build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup main test test-oldest test-hf lint typecheck check bench

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

# The oldest releases pyproject declares, in a second venv: CI runs the suite there too (`make test` gets the newest
# that pip resolves), so a release that breaks the package breaks a branch, not a user. OLDEST pins the floors of
# the libraries whose internals the package touches; the rest resolve. torch is installed first (TORCH_SPEC) and
# pinned to that exact build for the rest, so nothing swaps in another build (a CUDA one). The dev extra's
# trl needs a newer accelerate, so this venv has the train extra and pytest; the tests of packages it lacks skip.
VENV_OLDEST ?= .venv-oldest
PY_OLDEST := $(VENV_OLDEST)/bin/python
OLDEST := transformers==5.17.0 peft==0.21.0 accelerate==1.3.0

$(VENV_OLDEST)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV_OLDEST)
	$(PY_OLDEST) -m pip install -q --upgrade pip
	$(PY_OLDEST) -c "import torch" 2>/dev/null || $(PY_OLDEST) -m pip install -q "$(TORCH_SPEC)"
	$(PY_OLDEST) -m pip install -q -e ".[train]" "pytest>=8" "parameterized>=0.9" $(OLDEST) \
		"torch==$$($(PY_OLDEST) -c 'import torch; print(torch.__version__)')"
	$(PY_OLDEST) -c "import torch, transformers, peft, accelerate; print('oldest venv: torch', torch.__version__, \
		'transformers', transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__)"
	touch $@

# The whole suite less what does not depend on these versions: torch.compile / torch.export and the Triton kernels
# (torch and triton are the same in both venvs), the inspection pictures, and the wheel's packaging.
OLDEST_SKIP := test_compile.py test_edges_compile.py test_deploy_export.py test_pct_kernels_compile.py \
	test_versor_kernels_compile.py test_inspect.py test_package_data.py
test-oldest: $(VENV_OLDEST)/.installed
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY_OLDEST) -m pytest -q -ra $(addprefix --ignore=tests/,$(OLDEST_SKIP))

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

# The checks CI runs (.ci/run) and the pre-commit hooks run: lint, formatting, then types. mypy reads its files and
# settings from pyproject.toml ([tool.mypy]: zpx_hf and zpx_hf_train) and keeps a cache in .mypy_cache (seconds
# once warm; the first run reads torch's and transformers' own types, about a minute).
RUFF_PATHS := zpx_hf zpx_hf_train tests benchmarks
lint: setup
	$(VENV)/bin/ruff check $(RUFF_PATHS)

typecheck: setup
	$(VENV)/bin/mypy

check: setup
	$(VENV)/bin/ruff check $(RUFF_PATHS)
	$(VENV)/bin/ruff format --check $(RUFF_PATHS)
	$(VENV)/bin/mypy

# Every benchmark, one after another (hours on a CPU; results land in benchmarks/results and the README tables
# are refreshed from them by `python benchmarks/update_readme.py`). `make bench QUICK=1` is the smoke run: tiny
# sizes, every script, nothing written (the evidence suite writes its quick run to a temporary folder).
# benchmarks/gpu_check.py runs on a CUDA machine only and is not part of this target.
BENCH_SCRIPTS := bench_attention bench_pct bench_versor bench_zpx_memory bench_step bench_compile bench_row_major bench_packing bench_text_packing bench_data
bench: setup
ifdef QUICK
	for script in $(BENCH_SCRIPTS); do $(PY) benchmarks/$$script.py --quick || exit 1; done
	tmp=$$(mktemp -d) && $(PY) -m benchmarks.evidence --size evidence_smoke --tasks mqar \
		--variants baseline zpx_full pct versor_hybrid --output $$tmp && rm -rf $$tmp
	tmp=$$(mktemp -d) && $(PY) -m benchmarks.bench_conversion --tiny --results $$tmp --work $$tmp/work && rm -rf $$tmp
else
	for script in $(BENCH_SCRIPTS); do $(PY) benchmarks/$$script.py || exit 1; done
	$(PY) -m benchmarks.evidence --size evidence --workers 2
	$(PY) -m benchmarks.bench_conversion
	$(PY) benchmarks/update_readme.py
endif
