#!/usr/bin/env bash
# The GPU checks, in one run, on a machine with an NVIDIA GPU (no network
# needed once the Debian packages of scripts/install-deps.sh are there):
#   1. build with CUDA (nvcc in /usr/local/cuda, sm_90 + PTX) in build-gpu/;
#   2. the GPU tests (label gpu): staging kernels against the host
#      reference, and pdkv run --device cuda end to end;
#   3. pdkv run --device cuda, TP 1 -> 4 over 2 KV heads and 4 -> 2 over 8;
#   4. pdkv gpu-bench: gather and scatter GB/s against cudaMemcpy D2H.
# Prints a table last; writes every log under $OUT when set (else
# build-gpu/logs). Meant to end within 8 minutes; exits non-zero on the
# first failure.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${OUT:-build-gpu/logs}
mkdir -p "$LOGS"
JOBS=${JOBS:-$(nproc)}
started=$(date +%s)
declare -a table

step() {  # step NAME LOGFILE COMMAND...: runs it, logs it, records a row
  local name=$1 log=$2
  shift 2
  local t0=$(date +%s)
  echo "== $name" | tee -a "$LOGS/gpu-check.log"
  if "$@" >"$LOGS/$log" 2>&1; then
    table+=("$(printf '%-44s %-6s %4ss' "$name" ok $(( $(date +%s) - t0 )))")
  else
    table+=("$(printf '%-44s %-6s %4ss  (see %s)' "$name" FAILED $(( $(date +%s) - t0 )) "$LOGS/$log")")
    tail -n 40 "$LOGS/$log"
    finish 1
  fi
}

finish() {
  echo
  echo "== gpu-check: $(( $(date +%s) - started )) s"
  [ -f "$LOGS/gpu-bench.txt" ] && cat "$LOGS/gpu-bench.txt"
  printf '%s\n' "${table[@]}"
  exit "$1"
}

command -v nvidia-smi >/dev/null && nvidia-smi >"$LOGS/nvidia-smi.txt" 2>&1
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  # With network, the project's own script installs what is missing.
  step "install Debian packages" deps.log scripts/install-deps.sh
fi
step "configure (CUDA on)" configure.log \
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPDKV_WERROR=ON -DPDKV_WITH_CUDA=ON
step "build (-j $JOBS)" build.log cmake --build build-gpu -j "$JOBS"
# Skipped tests would read as passes here: a GPU machine must run them all.
step "GPU tests (ctest -L gpu, none skipped)" gpu-tests.log \
  bash -c 'cd build-gpu && ctest -L gpu --output-on-failure -j 4 | tee /dev/stderr | (! grep -q "Skipped")'
step "pdkv run --device cuda TP 1->4, 2 KV heads" run-1to4.log \
  build-gpu/bin/pdkv run --device cuda --backend mooncake --prefill-tp 1 --decode-tp 4 \
  --kv-heads 2 --layers 32 --tokens 1024 --requests 32
step "pdkv run --device cuda TP 4->2, 8 KV heads" run-4to2.log \
  build-gpu/bin/pdkv run --device cuda --backend nixl --prefill-tp 4 --decode-tp 2 \
  --kv-heads 8 --layers 32 --tokens 1024 --requests 32
step "pdkv gpu-bench (8k tokens)" gpu-bench.log \
  bash -c "build-gpu/bin/pdkv gpu-bench --device cuda --tokens 8192 | tee '$LOGS/gpu-bench.txt'"
for f in run-1to4.log run-4to2.log; do
  table+=("$(printf '  %s: %s' "$f" "$(tail -n 1 "$LOGS/$f")")")
done
finish 0
