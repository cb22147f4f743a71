#!/usr/bin/env bash
# Build llama.cpp's rpc-server (tools/rpc, target ggml-rpc-server) from the llama.cpp vendored in
# llama-cpp-python's sdist: CPU backend with GGML_NATIVE like the oracle wheel pip builds here, so the
# server runs the very kernels the oracle runs. Only the sdist comes from PyPI (reused when cached).
# llama-completion is built beside it, with the RPC client in: llama.cpp's own way through the server, the
# oracle of llmlab's RPC backend (tests/test_rpc.py).
# Usage: build_server.sh CACHE_DIR LLAMA_CPP_PYTHON_VERSION
#   e.g. build_server.sh ~/.cache/llmlab 0.3.36
# The binary is kept in CACHE_DIR/rpc-server/VERSION-CPUKEY/rpc-server, where CPUKEY names the
# compiler's -march=native and a hash of the CPU flags (a binary built with -march=native is only
# valid on the CPU it was built for); an existing one is kept. The last line printed is its path.
# With RPC_SERVER_NO_BUILD=1 it only prints the path of an existing build, or fails (the tests ask so).
set -euo pipefail
cache=$1; version=$2
py=${PYTHON:-python3}
march=$(${CC:-cc} -march=native -Q --help=target 2>/dev/null | awk '$1 == "-march=" && !m {m = $2} END {print m}')
flags=$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2 | tr ' ' '\n' | sort | tr '\n' ' ' | sha256sum | cut -c1-8)
key="$version-$(uname -m)-${march:-unknown}-$flags"
dest="$cache/rpc-server/$key"
if [ -x "$dest/rpc-server" ] && [ -x "$dest/llama-completion" ]; then echo "$dest/rpc-server"; exit 0; fi
[ "${RPC_SERVER_NO_BUILD:-0}" = 1 ] && { echo "no rpc-server built for $key (make rpc-server)" >&2; exit 1; }
src=$(PYTHON=$py "$(dirname "$0")/../llama_cpp_source.sh" "$cache" "$version" | tail -n1)
bld="$cache/rpc-server/build-$key"
echo "building llama.cpp's rpc-server and llama-completion $version for this CPU ($key), about 15 minutes on 2 cores" >&2
cmake -S "$src" -B "$bld" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_RPC=ON -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >&2
ninja -C "$bld" -j "${JOBS:-2}" ggml-rpc-server llama-completion >&2
mkdir -p "$dest"
cp "$bld/bin/llama-completion" "$dest/llama-completion.tmp" && mv "$dest/llama-completion.tmp" "$dest/llama-completion"
cp "$bld/bin/ggml-rpc-server" "$dest/rpc-server.tmp" && mv "$dest/rpc-server.tmp" "$dest/rpc-server"
rm -rf "$bld"
echo "$dest/rpc-server"
