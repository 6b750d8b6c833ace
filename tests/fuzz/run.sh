#!/usr/bin/env bash
# Runs libFuzzer targets of build-fuzz/ over their seed corpora.
#   tests/fuzz/run.sh SECONDS [TARGET...]       each target for SECONDS
#   tests/fuzz/run.sh -runs=N [TARGET...]        each target for N executions
# New inputs go to build-fuzz/corpus/TARGET (the committed seeds stay as they
# are); a crash leaves its input in build-fuzz/findings/TARGET and fails the
# run. One line per target: executions, coverage, findings. Exit 77 when the
# fuzz build is missing (CTest reports the test skipped, never passed).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${PDKV_FUZZ_BIN:-$root/build-fuzz/bin}
budget=$1
shift
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(planner descriptors bootstrap control mooncake_frames)
if [[ $budget == -runs=* ]]; then limit=("$budget"); else limit=(-max_total_time="$budget"); fi
status=0
for t in "${targets[@]}"; do
  exe=$bin/fuzz_$t
  if [[ ! -x $exe ]]; then
    echo "fuzz $t: $exe is not built (make fuzz-build)"
    exit 77
  fi
  corpus=$root/build-fuzz/corpus/$t findings=$root/build-fuzz/findings/$t
  mkdir -p "$corpus" "$findings"
  log=$(mktemp)
  # ASan/UBSan stop at the first error; leaks are findings too.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$exe" "${limit[@]}" -print_final_stats=1 -artifact_prefix="$findings/" -rss_limit_mb=4096 \
    -timeout=30 "$corpus" "$root/tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  runs=$(grep -a -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  cov=$(grep -a -o 'cov: [0-9]*' "$log" | tail -1)
  found=$(find "$findings" -type f | wc -l)
  echo "fuzz $t: ${runs:-?} executions, ${cov:-cov: ?}, $found findings (exit $rc)"
  if [[ $rc -ne 0 ]]; then
    tail -40 "$log"
    status=1
  fi
  rm -f "$log"
done
exit $status
