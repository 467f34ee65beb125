# nmt: `make demo` installs and runs the whole pipeline on the embedded sample corpus;
# `make test` installs (with the export extra: CTranslate2 and transformers, CPU builds; the serve extra and its test
# clients) and runs the unit tests, LibreTranslate's own API tests among them (their wheel fetched by pip into
# .cache/libretranslate/ on the first run; skipped offline).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DIR ?= demo
DEMO_STEPS ?= 1200

.PHONY: install test test-avx2 test-fuzz test-all test-lowest test-transformers4 wheel-check demo lint bench clean

install: $(VENV)/.installed

# A CPU machine must never pull the CUDA wheels: install torch==2.13.0 (the CPU build on disk) first where no
# torch is present. A machine whose python already has a (CUDA) torch keeps it, through system site-packages;
# when that python is itself a virtual environment (whose packages a nested venv does not see), a .pth file
# puts its site-packages on the new environment's path.
$(VENV)/.installed: pyproject.toml
	@if $(PY) -c "import torch" >/dev/null 2>&1; then \
		echo "using the torch already installed for $(PY)"; \
		test -x $(BIN)/python || $(PY) -m venv --system-site-packages $(VENV); \
		$(BIN)/python -c "import torch" >/dev/null 2>&1 || $(PY) -c "import site; print('\n'.join(site.getsitepackages()))" \
			> "$$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_nmt_parent_site.pth"; \
	else \
		test -x $(BIN)/python || $(PY) -m venv $(VENV); \
		$(BIN)/python -c "import torch" >/dev/null 2>&1 || $(BIN)/pip install -q torch==2.13.0; \
	fi
	$(BIN)/pip install -q -e '.[test]'
	@touch $@

# The export extra (ctranslate2, transformers) for the tests of `nmt export`; prepare/train/translate never need it.
# Neither package depends on torch, so the CPU torch installed above stays.
$(VENV)/.export: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test,export]'
	@touch $@

# The serve extra (starlette, uvicorn, py3langid, python-docx, sentencex) and the clients its tests talk to it with (httpx,
# libretranslatepy, and selenium for the web page, in the system's Chromium: .ci/run installs it).
$(VENV)/.serve: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test,serve,test-serve]'
	@touch $@

# Tests run in TEST_WORKERS processes (pytest-xdist): most of the suite's time is single-threaded work (Python
# start-up, subprocesses of the CLI, tiny models), so 2 processes on 2 cores take ~0.57x the time of one
# (7 min 55 s against 13 min 59 s).
TEST_WORKERS ?= 2
test: install $(VENV)/.export $(VENV)/.serve
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

# The slow tests CI runs too (~2-3 min on 2 cores): the HTTP API fuzzed from its /spec (schemathesis, a fixed seed and
# number of examples per endpoint), nmt translate on every kind of bad input, and the writers on a full disk and
# killed (a few times each; bench/faults.py kills each 20 times). The 1-minute soak of nmt serve
# (tests/test_serve_soak.py) is a slow test outside CI.
FUZZ_TESTS ?= tests/test_serve_fuzz.py tests/test_translate_fuzz.py tests/test_faults.py
test-fuzz: install $(VENV)/.export $(VENV)/.serve
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m slow $(FUZZ_TESTS)

test-all: install $(VENV)/.export $(VENV)/.serve
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m ""

# oneDNN's products as on a CPU without VNNI or AMX (CI runs it after `make test`): ONEDNN_MAX_CPU_ISA holds oneDNN
# to AVX2 on any x86 CPU, so the int8 and packed float32 tests meet the kernels an AVX2-only CPU runs (FBGEMM keeps
# its own dispatch).
test-avx2: install
	ONEDNN_MAX_CPU_ISA=AVX2 $(BIN)/python -m pytest tests/test_int8.py tests/test_packed.py

# The hub path against the lowest huggingface-hub and pyarrow that pyproject.toml admits (CI runs it after
# `make test`): both are installed from PyPI into .lowest/, which PYTHONPATH puts before the environment's own.
# huggingface-hub < 1 talks HTTP through requests, so requests comes too.
LOWEST ?= huggingface-hub==0.23.0 pyarrow==16.0.0
test-lowest: install
	rm -rf .lowest
	$(BIN)/pip install -q --no-deps --target .lowest $(LOWEST) requests urllib3 certifi charset-normalizer
	NMT_EXPECT_VERSIONS="$(LOWEST)" PYTHONPATH=.lowest $(BIN)/python -m pytest tests/test_hub.py

# The Hugging Face export against the lowest transformers the export extra admits (4.57.6, with the
# huggingface-hub < 1 and tokenizers it needs), installed into .tf4/, which PYTHONPATH puts first. Not part of CI.
TF4 ?= transformers==4.57.6 tokenizers==0.22.1 huggingface-hub==0.36.0
test-transformers4: install $(VENV)/.export
	rm -rf .tf4
	$(BIN)/pip install -q --no-deps --target .tf4 $(TF4) requests urllib3 certifi charset-normalizer
	PYTHONPATH=.tf4 $(BIN)/python -m pytest tests/test_export.py tests/test_api.py

# The package as users install it (CI runs it after `make test`): `python -m build` makes dist/'s sdist and wheel
# (build isolation fetches setuptools from PyPI); the wheel, checked to hold the package only, is installed (not
# editable) into a fresh environment that borrows .venv's dependencies, where `nmt --version` and the sample
# pipeline run from a temporary directory (~70 s on 2 cores): scripts/wheel_check.sh.
wheel-check: install
	PY=$(BIN)/python bash scripts/wheel_check.sh

lint: install
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/ruff check src tests bench

demo: install
	NMT_DEMO_DIR=$(DEMO_DIR) NMT_DEMO_STEPS=$(DEMO_STEPS) NMT=$(BIN)/nmt bash scripts/demo.sh

bench: install
	$(BIN)/python bench/prepare.py
	$(BIN)/python bench/train.py
	$(BIN)/python bench/translate.py

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache .lowest .tf4 dist build src/nmt_cli.egg-info
