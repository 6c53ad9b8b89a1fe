#!/usr/bin/env bash
# Installs what the build and tests need when it is missing (Debian packages).
set -e
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v make >/dev/null || need+=(make)
command -v gcc >/dev/null || need+=(gcc)
command -v python3 >/dev/null || need+=(python3)
# oneDNN (the MLA prefix prefill's GEMMs: bf16 matmul, f32 sgemm): libdnnl.so + dnnl.h
dpkg -s libdnnl-dev >/dev/null 2>&1 || need+=(libdnnl-dev)
# SIMDe (headers only; x86): the sanitizer build's AVX-512 emulation on CPUs without it
# (Makefile ASAN_EMULATE_AVX512, src/cpu/vec/x86_emu.h)
case "$(uname -m)" in x86_64|amd64) dpkg -s libsimde-dev >/dev/null 2>&1 || need+=(libsimde-dev) ;; esac
# gcc's OpenMP runtime and the sanitizer runtimes ship with gcc on Debian (libgomp1,
# libasan8, libubsan1); check them by linking a probe
probe=$(mktemp -d)
printf 'int main(void){return 0;}\n' > "$probe/p.c"
if command -v gcc >/dev/null; then
  gcc -fopenmp "$probe/p.c" -o "$probe/p" 2>/dev/null || need+=(libgomp1)
  gcc -fsanitize=address,undefined "$probe/p.c" -o "$probe/p" 2>/dev/null || need+=(libasan8 libubsan1)
fi
rm -rf "$probe"
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" build-essential
fi
