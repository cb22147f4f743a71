# Two commands do everything on a fresh Debian machine: `make demo` and `make test`.
# Set-up is idempotent and layered, one stamp per layer, each redone only when pyproject.toml changes:
#   runtime + lab (JupyterLab, nbclient)        demo, lab, notebooks, html
#   + dev (pytest, the llama.cpp oracle)         test, test-slow, notebooks
#   + browser (playwright, Debian's chromium)    test-browser
# so `make test` after `make demo` only adds the dev extras.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check
STAMP_LAB     := $(VENV)/.llmlab-lab
STAMP_DEV     := $(VENV)/.llmlab-dev
STAMP_BROWSER := $(VENV)/.llmlab-browser
MODEL  ?= smollm2
PYTEST_ARGS ?=
LAB_ARGS ?=
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
HTML_DIR ?= build/html
IS_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo 1)

.PHONY: setup setup-dev system-deps browser-deps demo test test-slow test-browser test-all bench lab notebooks html clean

setup: system-deps $(STAMP_LAB)
setup-dev: system-deps $(STAMP_DEV)

# Graphviz's `dot` draws the compute graphs; Noto CJK and colour-emoji fonts let Chinese text and
# emoji render in the notebooks (browser and matplotlib). Installed with apt-get when missing and root.
system-deps:
	@missing=""; \
	command -v dot >/dev/null 2>&1 || missing="$$missing graphviz"; \
	fc-list 2>/dev/null | grep -q "Noto Sans CJK" || missing="$$missing fonts-noto-cjk"; \
	fc-list 2>/dev/null | grep -q "Noto Color Emoji" || missing="$$missing fonts-noto-color-emoji"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing fontconfig >/dev/null; \
	  else echo "warning: missing system packages:$$missing (apt-get install$$missing); graphs or CJK/emoji text may not render"; fi; \
	fi

# Debian's chromium for the browser test (never a browser downloaded by playwright).
browser-deps: system-deps $(STAMP_BROWSER)
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	  else echo "error: chromium is missing (apt-get install chromium)"; exit 1; fi; }

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip

$(STAMP_LAB): pyproject.toml | $(VENV)/bin/python
	$(PIP) -e '.[lab]'
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

$(STAMP_DEV): $(STAMP_LAB) pyproject.toml
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(PIP) -e '.[dev,lab]'
	touch $@

$(STAMP_BROWSER): $(STAMP_DEV) pyproject.toml
	$(PIP) -e '.[dev,lab,browser]'
	touch $@

DEMO_PROMPT ?= <|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n<|im_start|>assistant\n

# the main job: text generation on the default model, llama.cpp-exact and token by token
demo: setup
	$(PY) -m llmlab fetch $(MODEL)
	$(PY) -m llmlab generate -m $(MODEL) -n 32 -p "$$(printf '$(DEMO_PROMPT)')"

# the oracles (llama-cpp-python, gguf-py) are installed here, so a test skipped for lack of one fails
test: setup-dev
	$(PY) -m llmlab fetch smollm2 --quiet
	$(PY) -m llmlab fetch gemma3 --quiet
	LLMLAB_REQUIRE_ORACLES=1 $(PY) -m pytest -q -rs $(PYTEST_ARGS)

# long suites: notebooks top to bottom, whole-model llama.cpp comparisons
test-slow: setup-dev
	LLMLAB_REQUIRE_ORACLES=1 $(PY) -m pytest -q -rs --slow -m "slow and not browser" $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

# JupyterLab in headless chromium: runs notebooks 00, 01, 05, 06, 08, screenshots in build/browser/
test-browser: browser-deps
	$(PY) -m llmlab fetch smollm2 --quiet
	$(PY) -m llmlab fetch gemma3 --quiet
	$(PY) -m pytest -q --slow -m browser tests/test_browser.py $(PYTEST_ARGS)

bench: setup-dev
	$(PY) benchmarks/bench_gguf_open.py
	$(PY) benchmarks/bench_tokenizer.py
	$(PY) benchmarks/bench_quant.py

# JupyterLab on the course; as root (containers, cloud workshop machines) it needs --allow-root
lab: setup
	$(VENV)/bin/jupyter lab $(if $(IS_ROOT),--allow-root) $(LAB_ARGS) notebooks/

# re-run every notebook top to bottom in order (fresh kernel each), store its outputs, stop at the
# first error; the committed outputs include the llama.cpp comparisons, so this uses the dev extras
notebooks: setup-dev
	$(PY) -m llmlab.notebook_runner --write $(NOTEBOOKS)

# the executed notebooks as static HTML a teacher can host or hand out (no kernel, no network)
html: setup
	$(PY) -m llmlab.notebook_runner --html $(HTML_DIR) $(NOTEBOOKS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
