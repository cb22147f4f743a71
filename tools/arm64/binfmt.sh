# Sourced by the arm64 root's scripts: make the kernel run aarch64 ELF binaries through Debian's
# qemu-user-static, with the rule qemu-user-static ships for systemd-binfmt (flag F: the interpreter is
# opened once, so it also works inside a chroot that lacks it).
ensure_binfmt_aarch64() {
  local dir=/proc/sys/fs/binfmt_misc conf=/usr/lib/binfmt.d/qemu-aarch64.conf
  [ -e "$dir/register" ] || mount -t binfmt_misc binfmt_misc "$dir" \
    || { echo "error: cannot mount binfmt_misc on $dir" >&2; return 2; }
  if [ ! -e "$dir/qemu-aarch64" ]; then
    [ -f "$conf" ] || { echo "error: no $conf (apt-get install qemu-user-static; make arm64-deps)" >&2; return 2; }
    cat "$conf" >"$dir/register"
  fi
  grep -qx enabled "$dir/qemu-aarch64" || echo 1 >"$dir/qemu-aarch64"
}
