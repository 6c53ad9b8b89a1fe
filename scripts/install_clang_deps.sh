#!/usr/bin/env bash
# Installs what the clang-based targets need when it is missing (Debian packages):
#   clang-14            the compiler (fuzz harnesses, TSan build)
#   libclang-rt-14-dev  compiler-rt: libFuzzer, ASan/UBSan/TSan runtimes for clang
#   libomp-14-dev       LLVM's OpenMP runtime and its TSan support library (libarcher)
# Each missing piece is found by compiling a probe; package names are checked with
# apt-cache policy before installing.
set -e
need=()
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'int main(void){return 0;}\n' > "$probe/p.c"
printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n){(void)d;(void)n;return 0;}\n' > "$probe/f.c"
if ! command -v clang-14 >/dev/null; then
  need+=(clang-14 libclang-rt-14-dev libomp-14-dev)
else
  clang-14 -fsanitize=fuzzer,address,undefined "$probe/f.c" -o "$probe/f" 2>/dev/null &&
    clang-14 -fsanitize=thread "$probe/p.c" -o "$probe/t" 2>/dev/null || need+=(libclang-rt-14-dev)
  clang-14 -fopenmp "$probe/p.c" -o "$probe/o" 2>/dev/null || need+=(libomp-14-dev)
fi
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
for p in "${need[@]}"; do
  if ! apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    $SUDO apt-get update -qq
    break
  fi
done
for p in "${need[@]}"; do
  if ! apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    echo "install_clang_deps: no installable package $p (apt-cache policy $p)" >&2
    exit 1
  fi
done
echo "installing: ${need[*]}"
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
