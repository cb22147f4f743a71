#!/usr/bin/env bash
# Cross-build llama.cpp (the one vendored in llama-cpp-python's sdist) for aarch64, once per ARM
# feature level, with llmlab-oracle (llmlab_oracle.cpp) linked in statically, so that qemu-user runs
# it as the oracle of an ARM CPU profile. Everything comes from Debian (cross compilers, qemu) and
# PyPI (the sdist). Usage: build_oracle.sh OUT_DIR LLAMA_CPP_PYTHON_VERSION ARCH...
#   e.g. build_oracle.sh ~/.cache/llmlab/oracle-arm64 0.3.36 armv8.2-a+dotprod+fp16
# Each ARCH gives OUT_DIR/ARCH/llmlab-oracle; an existing one is kept.
set -euo pipefail
out=$1; version=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
mkdir -p "$out/src"
if [ ! -d "$out/src/llama_cpp_python-$version" ]; then
  "$py" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: -d "$out/src" "llama-cpp-python==$version"
  tar -xzf "$out/src/llama_cpp_python-$version.tar.gz" -C "$out/src"
fi
src="$out/src/llama_cpp_python-$version/vendor/llama.cpp"
for arch in "$@"; do
  dest="$out/$arch"
  [ -x "$dest/llmlab-oracle" ] && { echo "kept $dest/llmlab-oracle"; continue; }
  bld="$out/build-$arch"
  echo "cross-building llama.cpp for $arch (about 15 minutes on 2 cores)"
  cmake -S "$src" -B "$bld" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
    -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
    -DGGML_NATIVE=OFF "-DGGML_CPU_ARM_ARCH=$arch" -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF >/dev/null
  ninja -C "$bld" -j "${JOBS:-2}" llama >/dev/null
  mkdir -p "$dest"
  libs=$(find "$bld" -name 'libllama.a' -o -name 'libggml.a' -o -name 'libggml-cpu.a' -o -name 'libggml-base.a' | sort -r)
  aarch64-linux-gnu-g++ -O2 -std=c++17 "-march=$arch" -static -o "$dest/llmlab-oracle" "$here/llmlab_oracle.cpp" \
    -I "$src/include" -I "$src/ggml/include" -Wl,--start-group $libs -Wl,--end-group -lpthread -lm
  echo "built $dest/llmlab-oracle"
done
