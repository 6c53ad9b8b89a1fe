#!/usr/bin/env bash
# valgrind memcheck over a representative subset of the tests (default build dir:
# build-valgrind, an optimised build with debug info and no sanitizers):
#   test_limits       every operator, valid and rejected calls, negative strides
#   test_concurrency  every operator from 8 threads at once (OpenMP inside)
#   test_determinism  every operator with 1-4 threads (parallel kernels)
#   readme_example    the shared library as a user links it
# each on small shapes (LLMKERN_TEST_SMALL=1) and every ISA the CPU runs. Any memcheck
# error or definite leak fails the binary (libgomp's thread pool shows up as "possibly
# lost" TLS blocks and is not counted). Prints one line per binary and
# "N passed, M failed" (binaries).
set -u
d=${1:-build-valgrind}
if ! command -v valgrind >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  apt-cache policy valgrind 2>/dev/null | grep -q 'Candidate: [0-9]' || $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq valgrind
fi
pass=0; fail=0
for t in test_limits test_concurrency test_determinism readme_example; do
  bin="$d/tests/$t"
  if [ ! -x "$bin" ]; then echo "$t: FAILED (not built)"; fail=$((fail + 1)); continue; fi
  log="$d/valgrind_$t.log"
  start=$(date +%s)
  LLMKERN_TEST_SMALL=1 valgrind -q --error-exitcode=99 --leak-check=full --show-leak-kinds=definite \
    --errors-for-leak-kinds=definite --track-origins=yes "$bin" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  summary=$(grep -E '^[a-z_0-9]+: [0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
  if [ $rc -eq 0 ] && ! grep -q '^==[0-9]*== ' "$log"; then
    echo "$t: memcheck clean in ${secs} s ${summary:+($summary)}"; pass=$((pass + 1))
  else
    echo "$t: FAILED (exit $rc) in ${secs} s, see $log"; grep -m 5 '^==[0-9]*== ' "$log" | sed 's/^/    /'; fail=$((fail + 1))
  fi
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
