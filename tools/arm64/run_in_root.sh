#!/usr/bin/env bash
# Run one command inside the arm64 Debian root (tools/arm64/make_root.sh) through qemu-user's binfmt
# handler, in a private mount namespace: proc, dev and the binds exist only for that command and vanish
# with it, whatever way it ends, so nothing stays mounted on the host. The host's environment stays
# out (env -i). Usage:
#   run_in_root.sh ROOT [--bind SRC:DST[:rw]]... [--cpuinfo FILE] [--env NAME=VALUE]... [--net] -- CMD...
# Binds are read-only unless :rw. --cpuinfo shows FILE as /proc/cpuinfo (qemu-user 7.2 passes the
# host's through, with x86 flags); --net gives the command the host's /etc/resolv.conf.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage() { echo "error: usage: run_in_root.sh ROOT [--bind SRC:DST[:rw]]... [--cpuinfo FILE] [--env K=V]... [--net] -- CMD..." >&2; exit 2; }
[ $# -ge 1 ] || usage
root=$(cd "$1" 2>/dev/null && pwd) || { echo "error: no arm64 root at $1 (make arm64-root)" >&2; exit 2; }
[ -x "$root/usr/bin/env" ] || { echo "error: $root is not a Debian root (make arm64-root)" >&2; exit 2; }
shift

if [ -z "${_LLMLAB_ROOT_NS:-}" ]; then
  [ "$(id -u)" = 0 ] || { echo "error: run_in_root.sh needs root (mount namespaces, chroot)" >&2; exit 2; }
  # shellcheck source=binfmt.sh
  . "$here/binfmt.sh"
  ensure_binfmt_aarch64
  _LLMLAB_ROOT_NS=1 exec unshare --mount --propagation private -- "$0" "$root" "$@"
fi

# from here on, inside the private namespace: every mount below dies with it
binds=(); cpuinfo=""; envs=(); net=0
while [ $# -gt 0 ]; do
  case $1 in
    --bind) [ $# -ge 2 ] || usage; binds+=("$2"); shift 2 ;;
    --cpuinfo) [ $# -ge 2 ] || usage; cpuinfo=$2; shift 2 ;;
    --env) [ $# -ge 2 ] || usage; envs+=("$2"); shift 2 ;;
    --net) net=1; shift ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[ $# -ge 1 ] || usage

mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t sysfs -o ro sysfs "$root/sys" 2>/dev/null || mount --rbind /sys "$root/sys"
for b in "${binds[@]}"; do
  IFS=: read -r src dst mode <<<"$b"
  [ -e "$src" ] || { echo "error: --bind: no such path $src" >&2; exit 2; }
  if [ -d "$src" ]; then mkdir -p "$root$dst"; else mkdir -p "$(dirname "$root$dst")"; touch "$root$dst"; fi
  mount --bind "$src" "$root$dst"
  [ "$mode" = rw ] || mount -o remount,bind,ro "$root$dst"
done
if [ -n "$cpuinfo" ]; then
  [ -f "$cpuinfo" ] || { echo "error: --cpuinfo: no such file $cpuinfo" >&2; exit 2; }
  mount --bind "$cpuinfo" "$root/proc/cpuinfo"
fi
if [ "$net" = 1 ]; then
  touch "$root/etc/resolv.conf"
  mount --bind /etc/resolv.conf "$root/etc/resolv.conf"
fi
exec chroot "$root" /usr/bin/env -i HOME=/root PATH=/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "${envs[@]}" "$@"
