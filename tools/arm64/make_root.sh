#!/usr/bin/env bash
# An arm64 Debian root where llmlab runs as on an ARM Linux machine, through qemu-user (binfmt): made
# once with debootstrap from the Debian mirror of the host's apt sources (minbase + python3, venv, pip,
# CA certificates), given the host's own CA certificates (pip's TLS may go through them), and a venv
# /venv with numpy, numba and llvmlite as aarch64 wheels plus llmlab's runtime dependencies from
# pyproject.toml (only binary wheels: nothing compiles under emulation). The project is not installed:
# run_in_root.sh binds the checkout read-only at run time.
#   Usage: make_root.sh CACHE      (RELEASE=bookworm, PYTHON=the host python that reads pyproject.toml)
# Kept in CACHE/arm64-root/<release>-<key>/root, key = hash of what goes in; a stamp file marks a finished
# root, which is reused. The last line printed is the root's path.
set -euo pipefail
[ $# -eq 1 ] || { echo "error: usage: make_root.sh CACHE" >&2; exit 2; }
cache=$1
release=${RELEASE:-bookworm}
here=$(cd "$(dirname "$0")" && pwd)
project=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
include=python3,python3-venv,python3-pip,ca-certificates
# numpy/numba/llvmlite first (the kernels), then pyproject's runtime dependencies
reqs=$("$py" - "$project/pyproject.toml" <<'PY'
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print(" ".join(["numpy", "numba", "llvmlite", *deps]))
PY
)
key=$(printf '%s\n' "$release" "$include" "$reqs" | sha256sum | cut -c1-12)
dir=$cache/arm64-root/$release-$key
if [ -f "$dir/stamp" ] && [ -x "$dir/root/venv/bin/python" ]; then
  echo "kept $dir/root"; echo "$dir/root"; exit 0
fi
[ "$(id -u)" = 0 ] || { echo "error: make_root.sh needs root (debootstrap, chroot)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "error: debootstrap is missing (apt-get install debootstrap; make arm64-deps)" >&2; exit 2; }
# shellcheck source=binfmt.sh
. "$here/binfmt.sh"
ensure_binfmt_aarch64

# the Debian mirror the host uses (deb822 "URIs:" or one-line "deb URI suite"), else deb.debian.org
mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
  | sed -nE 's/^(URIs:|deb)[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+).*/\3/p' \
  | grep -E '/debian/?$' | head -n1 || true)
mirror=${mirror:-http://deb.debian.org/debian}

# built in root.tmp, moved to root when complete; a finished debootstrap (its marker) is kept for a retry
tmp=$dir/root.tmp
mkdir -p "$dir"
log=$dir/build.log
t_all=$SECONDS
if [ -f "$dir/debootstrap.done" ] && [ -d "$tmp" ]; then
  echo "kept the debootstrapped $tmp"
else
  rm -rf "$tmp" "$dir/debootstrap.done"; : >"$log"
  echo "debootstrap $release arm64 from $mirror (about 10-20 minutes under emulation)"
  t0=$SECONDS
  # its own mount namespace, so a failed debootstrap leaves no proc/sys mounted on the host
  unshare --mount --propagation private -- debootstrap --arch=arm64 --variant=minbase --include="$include" \
    "$release" "$tmp" "$mirror" >"$dir/debootstrap.log" 2>&1 \
    || { tail -n 20 "$dir/debootstrap.log" >&2; echo "error: debootstrap failed (log: $dir/debootstrap.log)" >&2; exit 1; }
  echo "debootstrap: $((SECONDS - t0)) s" | tee -a "$log"
  touch "$dir/debootstrap.done"
fi

t0=$SECONDS
shopt -s nullglob
certs=(/usr/local/share/ca-certificates/*.crt)
[ ${#certs[@]} -eq 0 ] || cp "${certs[@]}" "$tmp/usr/local/share/ca-certificates/"
"$here/run_in_root.sh" "$tmp" -- update-ca-certificates >/dev/null 2>&1 \
  || { echo "error: update-ca-certificates failed in the root" >&2; exit 1; }
"$here/run_in_root.sh" "$tmp" -- python3 -m venv /venv
echo "certificates and venv: $((SECONDS - t0)) s" | tee -a "$log"

t0=$SECONDS
echo "pip install --only-binary :all: $reqs"
# shellcheck disable=SC2086
"$here/run_in_root.sh" "$tmp" --net --env PIP_CERT=/etc/ssl/certs/ca-certificates.crt --env PIP_DISABLE_PIP_VERSION_CHECK=1 -- \
  /venv/bin/python -m pip install -q --no-cache-dir --only-binary :all: $reqs
echo "pip: $((SECONDS - t0)) s" | tee -a "$log"

"$here/run_in_root.sh" "$tmp" -- /venv/bin/python -c \
  "import platform, numpy, numba, llvmlite; print(platform.machine(), platform.python_version(), 'numpy', numpy.__version__, 'numba', numba.__version__, 'llvmlite', llvmlite.__version__)" \
  | tee "$dir/versions.txt"
echo "total: $((SECONDS - t_all)) s" | tee -a "$log"
rm -rf "$dir/root"; mv "$tmp" "$dir/root"; rm -f "$dir/debootstrap.done"
printf 'release=%s\nkey=%s\nmirror=%s\nreqs=%s\nbuilt=%s\n' "$release" "$key" "$mirror" "$reqs" "$(date -u +%FT%TZ)" >"$dir/stamp"
echo "$dir/root"
