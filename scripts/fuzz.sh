#!/usr/bin/env bash
# Runs the libFuzzer harnesses built by fuzz/Makefile.
#   scripts/fuzz.sh SECONDS [HARNESS...]      each harness for SECONDS (default: all)
# Environment: FUZZ_BUILD (build-fuzz), FUZZ_JOBS (harnesses run at once, default 1),
#   FUZZ_RUNS (stop a harness after this many executions instead of at SECONDS),
#   FUZZ_KEEP (directory: new corpus inputs are kept there per harness, else discarded).
# Seeds come from fuzz/corpus/<harness>/ (read only). Prints one line per harness,
# "fuzz_<h>: ok, N executions in S s" or "fuzz_<h>: FAILED ...", and closes with
# "N passed, M failed" counting harnesses. Exit status 0 only if all passed.
set -u
secs=${1:-60}
shift || true
build=${FUZZ_BUILD:-build-fuzz}
jobs=${FUZZ_JOBS:-1}
hs=("$@")
if [ ${#hs[@]} -eq 0 ]; then
  for f in fuzz/fuzz_*.c; do h=${f#fuzz/fuzz_}; hs+=("${h%.c}"); done
fi
run_one() {
  local h=$1 work log start rc runs
  log="$build/fuzz_$h.log"
  if [ -n "${FUZZ_KEEP:-}" ]; then work="$FUZZ_KEEP/$h"; mkdir -p "$work"; else work=$(mktemp -d); fi
  mkdir -p "fuzz/corpus/$h"
  local limit=(-max_total_time="$secs")
  [ -n "${FUZZ_RUNS:-}" ] && limit=(-runs="$FUZZ_RUNS")
  start=$(date +%s)
  "$build/fuzz_$h" "${limit[@]}" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/crash-$h-" "$work" "fuzz/corpus/$h" >"$log" 2>&1
  rc=$?
  runs=$(grep -E '^stat::number_of_executed_units:' "$log" | awk '{print $2}' | tail -n 1)
  [ -z "$runs" ] && runs=$(grep -oE '^Done [0-9]+ runs' "$log" | awk '{print $2}' | tail -n 1)
  [ -z "${FUZZ_KEEP:-}" ] && rm -rf "$work"
  if [ $rc -eq 0 ]; then
    echo "fuzz_$h: ok, ${runs:-0} executions in $(( $(date +%s) - start )) s" >"$build/fuzz_$h.result"
  else
    {
      echo "fuzz_$h: FAILED (exit $rc) after ${runs:-?} executions; log $log, input $(ls -t "$build"/crash-"$h"-* 2>/dev/null | head -n 1)"
      grep -E '==== llmkern|runtime error|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)' "$log" | head -n 3 | sed 's/^/    /'
    } >"$build/fuzz_$h.result"
  fi
  return $rc
}
mkdir -p "$build"
pids=()
for h in "${hs[@]}"; do
  if [ ! -x "$build/fuzz_$h" ]; then echo "fuzz_$h: FAILED (not built: make -f fuzz/Makefile)" >"$build/fuzz_$h.result"; continue; fi
  rm -f "$build/fuzz_$h.result"
  run_one "$h" &
  pids+=($!)
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 1; done
done
wait
pass=0; fail=0
for h in "${hs[@]}"; do
  r=$(cat "$build/fuzz_$h.result" 2>/dev/null || echo "fuzz_$h: FAILED (no result)")
  echo "$r"
  case "$r" in "fuzz_$h: ok"*) pass=$((pass + 1)) ;; *) fail=$((fail + 1)) ;; esac
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
