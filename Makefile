# Two commands do everything on a fresh Debian machine: `make demo` and `make test`.
# Set-up is idempotent: the venv is rebuilt only when pyproject.toml changes.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.llmlab-installed
MODEL  ?= smollm2
PYTEST_ARGS ?=

.PHONY: setup system-deps demo test test-slow test-all bench lab notebooks clean oracle-avx2 test-avx2

setup: system-deps $(STAMP)

# Graphviz's `dot` renders the compute graphs; installed with apt-get when missing and root.
system-deps:
	@command -v dot >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing graphviz (dot) with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null; \
	  else echo "warning: Graphviz's dot is missing (apt-get install graphviz); graph pictures will be unavailable"; fi; }

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(PY) -m pip install -q --disable-pip-version-check -e '.[dev,lab]'
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

DEMO_PROMPT ?= <|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n<|im_start|>assistant\n

# the main job: text generation on the default model, llama.cpp-exact and token by token
demo: setup
	$(PY) -m llmlab fetch $(MODEL)
	$(PY) -m llmlab generate -m $(MODEL) -n 32 -p "$$(printf '$(DEMO_PROMPT)')"

# the oracles (llama-cpp-python, gguf-py) are installed here, so a test skipped for lack of one fails
test: setup
	$(PY) -m llmlab fetch smollm2 --quiet
	$(PY) -m llmlab fetch gemma3 --quiet
	LLMLAB_REQUIRE_ORACLES=1 $(PY) -m pytest -q -rs $(PYTEST_ARGS)

# long suites: notebooks top to bottom, whole-model llama.cpp comparisons
test-slow: setup
	LLMLAB_REQUIRE_ORACLES=1 $(PY) -m pytest -q -rs --slow -m slow $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

# A second llama.cpp with only AVX2 kernels (no AVX-512), beside the native one, to check the avx2 CPU
# profile on an AVX-512 machine. Built once (~10 min on 2 cores) from PyPI's source; the wheel is kept
# in $(AVX2_WHEELS) (reused by any checkout) and installed into $(AVX2_ORACLE).
AVX2_WHEELS ?= $(HOME)/.cache/llmlab/wheels-avx2
AVX2_ORACLE ?= build/llama-cpp-avx2
AVX2_CMAKE  := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
# the live comparisons: kernels, node by node (both models, flash attention on and off), decode steps
AVX2_TESTS  ?= tests/test_graph_exact.py tests/test_forward_kernels.py tests/test_quant_ggml.py tests/test_llamacpp.py \
               tests/test_llamacpp_graph.py tests/test_forward_decode.py tests/test_forward.py tests/test_attention.py

oracle-avx2: setup
	@if [ ! -d $(AVX2_ORACLE)/llama_cpp ]; then \
	  set -e; \
	  if ! ls $(AVX2_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1; then \
	    echo "building llama-cpp-python with AVX2 kernels only (about 10 minutes)"; \
	    CMAKE_ARGS="$(AVX2_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=2 $(PY) -m pip wheel -q --no-cache-dir --no-deps \
	      -w $(AVX2_WHEELS) "$$($(PY) -c 'import importlib.metadata as m; print("llama-cpp-python==" + m.version("llama-cpp-python"))')"; \
	  fi; \
	  $(PY) -m pip install -q --no-deps --target $(AVX2_ORACLE) $(AVX2_WHEELS)/llama_cpp_python-*.whl; \
	fi
	@PYTHONPATH=$(AVX2_ORACLE) $(PY) -c "import llama_cpp; i = llama_cpp.llama_print_system_info().decode(); \
	  assert 'AVX2 = 1' in i and 'AVX512 = 1' not in i, i; print('AVX2-only llama.cpp:', i)"

# the live llama.cpp tests against the AVX2-only build, with llmlab's avx2 profile
test-avx2: oracle-avx2
	$(PY) -m llmlab fetch smollm2 --quiet
	$(PY) -m llmlab fetch gemma3 --quiet
	LLMLAB_CPU=avx2 PYTHONPATH=$(AVX2_ORACLE) $(PY) -m pytest -q --slow $(AVX2_TESTS) $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/bench_gguf_open.py
	$(PY) benchmarks/bench_tokenizer.py
	$(PY) benchmarks/bench_quant.py

lab: setup
	$(VENV)/bin/jupyter lab notebooks/

# re-run every notebook top to bottom and store its outputs
notebooks: setup
	$(PY) -m llmlab.notebook_runner --write notebooks/*.ipynb

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
