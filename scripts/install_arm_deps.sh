#!/usr/bin/env bash
# Installs what the aarch64 cross build and its emulated tests need when it is missing
# (`make test-arm`): Debian's cross compiler (gcc-aarch64-linux-gnu: the aarch64 libc,
# libgomp and libstdc++ under /usr/aarch64-linux-gnu), user-mode emulation (qemu-user:
# qemu-aarch64), and oneDNN for aarch64 (the MLA prefill GEMMs) unpacked into PREFIX
# (default build-arm-deps): libdnnl2:arm64 and libdnnl-dev:arm64 fetched with
# `apt-get download` (arm64 added to dpkg's architectures for their package lists) and
# extracted with dpkg-deb -x, not installed, since libdnnl-dev:arm64 cannot be installed
# beside the amd64 one (their dnnl_config.h differ in DNNL_GPU_RUNTIME).
# Prints the oneDNN prefix (PREFIX/usr) as its last line.
set -e
prefix=${1:-build-arm-deps}
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
need=()
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
for p in libc6-dev-arm64-cross libgomp1-arm64-cross libstdc++6-arm64-cross; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
dnnl_ok() { [ -f "$prefix/usr/include/oneapi/dnnl/dnnl.h" ] && [ -e "$prefix/usr/lib/aarch64-linux-gnu/libdnnl.so" ]; }
updated=0
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  $SUDO apt-get update -qq; updated=1
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if ! dnnl_ok; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "adding arm64 to dpkg's architectures (for the arm64 package lists)"
    $SUDO dpkg --add-architecture arm64; updated=0
  fi
  [ $updated -eq 1 ] || $SUDO apt-get update -qq
  dl=$(mktemp -d); chmod 755 "$dl" # apt-get download runs as _apt
  (cd "$dl" && apt-get download -qq libdnnl2:arm64 libdnnl-dev:arm64)
  mkdir -p "$prefix"
  for deb in "$dl"/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
  rm -rf "$dl"
  dnnl_ok || { echo "oneDNN for aarch64 not found under $prefix after unpacking" >&2; exit 1; }
fi
echo "$(cd "$prefix" && pwd)/usr"
