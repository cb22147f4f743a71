#!/usr/bin/env bash
# The offline kit: everything a room without internet needs to install and run the course.
# Usage: offline_kit.sh OUT_DIR [PLATFORM:PYTHON_VERSION ...]   (PYTHON: the interpreter that downloads)
#   OUT_DIR/wheels/        llmlab's own wheel, every runtime and JupyterLab dependency as a wheel, and the
#                          build backend (setuptools, wheel): `pip install -e .` builds llmlab from the
#                          checkout, and pip's isolated build installs setuptools from these same links
#   OUT_DIR/wheels-PLATFORM-PYTHON/  the same for another machine, e.g. macosx_11_0_arm64:3.12,
#                          win_amd64:3.12, manylinux2014_x86_64:3.11 (binary wheels only)
#   OUT_DIR/models/        the models (python -m llmlab fetch), to copy to ~/.cache/llmlab/models or to
#                          point LLMLAB_HOME at
#   OUT_DIR/INSTALL.txt    the commands for the learners' machines
# Only binary wheels are taken (--only-binary :all:), so nothing in the kit needs a compiler or a
# network to install. The oracle (llama-cpp-python) is not in it: it builds from source per platform.
set -euo pipefail
out=${1:?usage: offline_kit.sh OUT_DIR [PLATFORM:PYTHON_VERSION ...]}; shift
py=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
reqs="$out/requirements.txt"
# the runtime and lab dependencies, read from pyproject.toml (one list, never copied by hand)
"$py" - "$root/pyproject.toml" > "$reqs" <<'PY'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["lab"]))
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))
print("wheel")
PY
pipdl() { "$py" -m pip download -q --disable-pip-version-check --only-binary :all: "$@" -r "$reqs"; }
echo "kit: wheels for this machine ($("$py" -c 'import sys, sysconfig; print(sysconfig.get_platform(), sys.version.split()[0])'))"
pipdl -d "$out/wheels"
"$py" -m pip wheel -q --disable-pip-version-check --no-deps "$root" -w "$out/wheels"
for spec in "$@"; do
  plat=${spec%%:*}; ver=${spec#*:}
  echo "kit: wheels for $plat, Python $ver"
  pipdl -d "$out/wheels-$plat-$ver" --platform "$plat" --python-version "$ver" --implementation cp
  cp "$out"/wheels/llmlab-*.whl "$out/wheels-$plat-$ver/"
done
mkdir -p "$out/models"
for m in smollm2 gemma3; do
  f=$("$py" -m llmlab fetch "$m" --quiet | tail -1)
  cp -p "$f" "$f.sha256" "$out/models/" 2>/dev/null || cp -p "$f" "$out/models/"
done
cat > "$out/INSTALL.txt" <<'TXT'
llmlab offline kit: install with no network (replace wheels/ by wheels-PLATFORM-VERSION/ on another machine)

  python3 -m venv .venv && . .venv/bin/activate       # Windows: py -3.12 -m venv .venv; .venv\Scripts\activate
  python -m pip install --no-index --find-links wheels/ "llmlab[lab]"        # llmlab's wheel: nothing to build
  # or, in a checkout of the repository (editable; the build backend comes from wheels/ too):
  python -m pip install --no-index --find-links wheels/ -e ".[lab]"
  # models: copy models/* to ~/.cache/llmlab/models/ (Windows: %USERPROFILE%\.cache\llmlab\models\), or
  export LLMLAB_HOME=/path/to/kit        # the folder that holds models/
  python -m llmlab doctor                # one line per check; send the teacher its last line
TXT
du -sh "$out"/* | sed 's/^/kit: /'
