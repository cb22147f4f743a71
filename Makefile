# Two commands do everything on a fresh Debian machine: `make demo` and `make test`.
# Set-up is idempotent: the venv is rebuilt only when pyproject.toml changes.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.llmlab-installed
MODEL  ?= smollm2
PYTEST_ARGS ?=

.PHONY: setup system-deps demo test test-slow test-all bench lab notebooks clean

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
