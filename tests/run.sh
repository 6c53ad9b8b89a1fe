#!/usr/bin/env bash
# Runs every C test binary of the given build directories (default: build), then the
# README example, and prints the grand total as the last line: "N passed, N failed".
# LLMKERN_TEST_RUNNER: a command put before each binary (cross builds: the emulator,
# e.g. "qemu-aarch64 -L /usr/aarch64-linux-gnu"); empty: the binaries run directly.
# LLMKERN_TEST_JOBS: binaries run at once (default 1; the emulated suite runs 2), their
# outputs reported in the usual order.
set -u
runner=${LLMKERN_TEST_RUNNER:-}
jobs_max=${LLMKERN_TEST_JOBS:-1}
dirs=("$@")
[ ${#dirs[@]} -eq 0 ] && dirs=(build)
pass=0; fail=0; isa_note=""
outdir=$(mktemp -d); trap 'rm -rf "$outdir"' EXIT
for d in "${dirs[@]}"; do
  echo "=== tests in $d"
  t0=$SECONDS; isa_note_d=""
  tests=()
  for t in "$d"/tests/test_*; do [ -x "$t" ] && tests+=("$t"); done
  k=0
  for t in "${tests[@]}"; do
    if [ "$jobs_max" -gt 1 ]; then
      ( $runner "$t" >"$outdir/$k.out" 2>&1; echo $? >"$outdir/$k.rc" ) &
      while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
    fi
    k=$((k + 1))
  done
  wait
  k=0
  for t in "${tests[@]}"; do
    if [ "$jobs_max" -gt 1 ]; then out=$(cat "$outdir/$k.out"); rc=$(cat "$outdir/$k.rc")
    else out=$($runner "$t" 2>&1); rc=$?; fi
    k=$((k + 1))
    printf '%s\n' "$out" | grep -v '^  ok ' | grep -v '^  note: ISAs' | tail -n 40
    n=$(printf '%s\n' "$out" | grep '^  note: ISAs' | head -n 1); [ -n "$n" ] && isa_note_d="$d:${n#  note:}"
    line=$(printf '%s\n' "$out" | grep -E '^[a-z_0-9]+: [0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    if [ -z "$line" ]; then
      echo "$t: crashed or printed no summary (exit $rc)"; fail=$((fail + 1)); continue
    fi
    p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/'); f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed$/\1/')
    pass=$((pass + p)); fail=$((fail + f))
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then echo "$t: exit $rc"; fail=$((fail + 1)); fi
  done
  if [ -x "$d/tests/readme_example" ]; then
    if $runner "$d/tests/readme_example"; then pass=$((pass + 1)); echo "readme_example: ok"
    else fail=$((fail + 1)); echo "readme_example: FAILED"; fi
  fi
  echo "(tests in $d: $((SECONDS - t0)) s)"
  [ -n "$isa_note_d" ] && isa_note="$isa_note  note: $isa_note_d"$'\n'
done
skip=0
# extra suites whose closing line is added to the totals: LLMKERN_EXTRA_SUITES holds
# "name=command" entries separated by "|"
IFS='|' read -r -a suites <<< "${LLMKERN_EXTRA_SUITES:-}"
for suite in "${suites[@]}"; do
  [ -n "$suite" ] || continue
  name=${suite%%=*}; cmd=${suite#*=}
  echo "=== $name"
  t0=$SECONDS
  out=$(eval "$cmd" 2>&1); rc=$?
  printf '%s\n' "$out" | tail -n 15
  echo "($name: $((SECONDS - t0)) s)"
  line=$(printf '%s\n' "$out" | grep -E '[0-9]+ passed' | tail -n 1)
  p=$(echo "$line" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+'); p=${p:-0}
  f=$(echo "$line" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+'); f=${f:-0}
  s=$(echo "$line" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+'); s=${s:-0}
  e=$(echo "$line" | grep -oE '[0-9]+ errors?' | grep -oE '[0-9]+'); e=${e:-0}
  pass=$((pass + p)); fail=$((fail + f + e)); skip=$((skip + s))
  if [ -z "$line" ] || { [ $rc -ne 0 ] && [ $((f + e)) -eq 0 ]; }; then
    echo "$name: exit $rc without a passing summary"; fail=$((fail + 1))
  fi
done
[ -n "$isa_note" ] && printf '%s' "$isa_note"
if [ $skip -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"; else echo "$pass passed, $fail failed"; fi
[ $fail -eq 0 ]
