#!/usr/bin/env bash
# The llama.cpp that llama-cpp-python vendors, unpacked from its sdist (the only download: PyPI), once.
# Usage: llama_cpp_source.sh CACHE_DIR LLAMA_CPP_PYTHON_VERSION; the last line printed is the source's
# path (CACHE_DIR/sdist/llama_cpp_python-VERSION/vendor/llama.cpp, or the copy the arm64 oracle build
# unpacked). The rpc-server build and the tests that check llmlab's tables against the source use it.
set -euo pipefail
cache=$1; version=$2
py=${PYTHON:-python3}
for d in "$cache/sdist" "$cache/oracle-arm64/src"; do
  src="$d/llama_cpp_python-$version/vendor/llama.cpp"
  [ -f "$src/CMakeLists.txt" ] && { echo "$src"; exit 0; }
done
mkdir -p "$cache/sdist"
"$py" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: -d "$cache/sdist" "llama-cpp-python==$version" >&2
tar -xzf "$cache/sdist/llama_cpp_python-$version.tar.gz" -C "$cache/sdist"
echo "$cache/sdist/llama_cpp_python-$version/vendor/llama.cpp"
