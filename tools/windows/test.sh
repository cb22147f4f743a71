#!/bin/bash
# make test-windows: llmlab on the official Windows CPython under Wine (tools/windows/setup.sh, cached in $WIN,
# default ~/.cache/llmlab/windows). Copies the checkout's llmlab into the Windows Python's path, gives it the
# cached SmolLM2 (fetched here first if missing), and runs tools/windows/checks.py there (QUICK=1: the CI
# subset). The Windows side sees no /proc/cpuinfo reader (it is Windows: the profile comes from CPUID and
# IsProcessorFeaturePresent), and the expected profile is the one this machine's llmlab detects.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
WIN=${WIN:-$HOME/.cache/llmlab/windows}; export WIN
PY=${PY:-python3}
T0=$(date +%s)
bash "$HERE/setup.sh"
# llmlab itself: a copy (nothing is written into the checkout); numba's kernel cache stays beside the copy's
# kernels between runs (kept __pycache__ folders: numba checks each entry against its source's time stamp)
mkdir -p "$WIN/src/llmlab"
(cd "$ROOT" && tar cf - --exclude=__pycache__ llmlab) | tar xf - -C "$WIN/src"
(cd "$ROOT/llmlab" && find . -name '*.py' | sort) > "$WIN/.want"; (cd "$WIN/src/llmlab" && find . -name '*.py' | sort) > "$WIN/.have"
comm -13 "$WIN/.want" "$WIN/.have" | (cd "$WIN/src/llmlab" && xargs -r rm -f)         # files the checkout no longer has
MODEL=$(cd "$ROOT" && PYTHONPATH="$ROOT" $PY -m llmlab fetch smollm2 --quiet)
# Wine 8.0 answers "no" to IsProcessorFeaturePresent(PF_AVX512F_INSTRUCTIONS_AVAILABLE) on every CPU (Windows 10
# 2004 and later say what the OS enables): where it says so beside a "yes" to AVX2, llmlab on Windows rightly
# takes AVX-512 as off (profiles.windows_flags), so the host's profile is expected without it
PF=$("$HERE/wpy" -c "import ctypes; k = ctypes.WinDLL('kernel32'); print(k.IsProcessorFeaturePresent(40), \
k.IsProcessorFeaturePresent(41))" | tr -d '\r' | tail -1)
NO512=$([ "$PF" = "1 0" ] && echo True || echo False)
PROFILE=$(cd "$ROOT" && PYTHONPATH="$ROOT" $PY -c "from llmlab.ggml.cpu import profiles as p; \
flags = {x for x in p.cpu_flags() if not ($NO512 and x.startswith(('avx512', 'amx')))}; \
f = p._from_flags(flags); print(f.name if f else p.nearest().name)")
[ "$NO512" = True ] && echo "test-windows: Wine reports no AVX-512 (PF_AVX512F), so the profile expected is $PROFILE"
winpath() { echo "Z:$(echo "$1" | tr / '\\')"; }
export LLMLAB_HOME=$(winpath "$(dirname "$(dirname "$MODEL")")")     # the same model cache, seen from Windows
cp "$HERE/checks.py" "$WIN/checks.py"
cd "$WIN/prefix/drive_c"
set +e
"$HERE/wpy" -X utf8 "$(winpath "$WIN/checks.py")" --model "$(winpath "$MODEL")" --profile "$PROFILE" ${QUICK:+--quick}
rc=$?
set -e
echo "test-windows${QUICK:+ (quick)}: exit $rc after $(( $(date +%s) - T0 )) s"
exit $rc
