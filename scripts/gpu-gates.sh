#!/usr/bin/env bash
# The CUDA gate programs (gate_cuda, gate_signoff_engine) built and run in one device call.
#
#   scripts/gpu-gates.sh [ASSETS] [OUT]
#
# ASSETS (default gpu_assets): a folder holding models/ (stories260K/ and the others the gates look
# for through KVGATE_MODELS) and, for a machine without the xxhash package, Debian's xxhash.h and
# libxxhash.a anywhere below it. OUT (default $OUT, else gpu-gates.out): receives configure.log,
# build.log and each program's Catch2 output with its test cases' durations.
# The build folder is build-gpu-gates (CMAKE_CUDA_ARCHITECTURES=90a-real: one SASS per kernel TU, for
# H100/H200). Prints the device, each program's summary and every failed block.
# With Catch2 3 (--shard-count), gate_cuda runs as SHARDS (default 6) processes side by side on the
# one GPU (its cases are small: six shards ran the whole program in ~100 s on an H100); then the
# opt-in STO.cuda.prefill_mma.racecheck (compute-sanitizer racecheck over the tensor-core prefill),
# compute-sanitizer memcheck over a prefill + decode subset, and memcheck + racecheck over the
# decode's page-tile twins (both pipelined kernels). OUT/logs.tgz holds every log (one
# file to bring back from a machine that returns few).
# The whole run can pass a device call's 600 s (the sanitizers alone may take up to ~16 min of
# timeouts), so it splits in two: PROGRAMS="" runs no gate program (sanitizers only), SANITIZE=0
# skips the sanitizers; PROGRAMS defaults to "gate_cuda gate_signoff_engine".
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
assets="$(cd "${1:-gpu_assets}" && pwd)"
out="${2:-${OUT:-gpu-gates.out}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc --version | tail -1
export KVGATE_MODELS="$assets/models"
flags=(-DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON -DKVGATE_BUILD_BENCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90a-real)
xxh_h="$(find "$assets" -name xxhash.h -print -quit)"
xxh_a="$(find "$assets" -name libxxhash.a -print -quit)"
if [ -n "$xxh_h" ]; then  # absolute paths: ninja compiles from inside the build folder
  flags+=("-DCMAKE_CXX_FLAGS=-I$(dirname "$xxh_h") -DXXH_INLINE_ALL")
  [ -n "$xxh_a" ] && flags+=("-DCMAKE_EXE_LINKER_FLAGS=-L$(dirname "$xxh_a")" "-DCMAKE_SHARED_LINKER_FLAGS=-L$(dirname "$xxh_a")")
fi
cmake -S . -B build-gpu-gates -G Ninja "${flags[@]}" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
ninja -C build-gpu-gates -j"$(nproc)" gate_cuda gate_signoff_engine >"$out/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A3 "$out/build.log" | head -60; exit 1; }
echo "built at $(( $(date +%s) - t0 ))s"
status=0
run_program() {  # $1: program name; Catch2 output with durations in $out/$1.txt (or $1.shard<i>.txt)
  local g=$1 exe shards=${SHARDS:-6}
  exe=$(find build-gpu-gates/gates -name "$g" -type f | head -1)
  if [ "$g" = gate_cuda ] && [ "$shards" -gt 1 ] && [ "$("$exe" --help 2>/dev/null | grep -c -- --shard-count)" -gt 0 ]; then
    local i rc=0
    for ((i = 0; i < shards; i++)); do
      ( cd build-gpu-gates && timeout 400 "../$exe" --shard-count "$shards" --shard-index "$i" --durations yes \
          >"$out/$g.shard$i.txt" 2>&1; echo $? >"$out/$g.shard$i.rc" ) &
    done
    wait
    for ((i = 0; i < shards; i++)); do
      [ "$(cat "$out/$g.shard$i.rc")" = 0 ] || rc=1
      echo "$g shard $i/$shards rc $(cat "$out/$g.shard$i.rc"): $(grep -E "^(All tests passed|test cases)" "$out/$g.shard$i.txt" | tail -1)"
      grep -B2 -A12 "FAILED" "$out/$g.shard$i.txt" | head -40
    done
    return $rc
  fi
  ( cd build-gpu-gates && timeout 400 "../$exe" --durations yes >"$out/$g.txt" 2>&1 )
  local rc=$?
  tail -3 "$out/$g.txt"
  grep -B2 -A12 "FAILED" "$out/$g.txt" | head -80
  return $rc
}
for g in ${PROGRAMS-gate_cuda gate_signoff_engine}; do
  run_program "$g" || status=1
  echo "$g done at $(( $(date +%s) - t0 ))s"
done
gc=$(find build-gpu-gates/gates -name gate_cuda -type f | head -1)
if [ "${SANITIZE:-1}" = 0 ]; then
  echo "SANITIZE=0: compute-sanitizer not run"
elif command -v compute-sanitizer >/dev/null; then
  ( cd build-gpu-gates && timeout 200 "../$gc" "STO.cuda.prefill_mma.racecheck*" >"$out/racecheck.txt" 2>&1 ) || status=1
  echo "racecheck gate: $(grep -E "^(All tests passed|test cases)" "$out/racecheck.txt" | tail -1)"
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$gc" \
    "ORA.cuda.prefill.int8*,ORA.cuda.prefill.q4_0*,ORA.cuda.prefill.bf16*,ORA.cuda.decode.int8*,ORA.cuda.decode.k8v4*" \
    >"$out/memcheck.txt" 2>&1 || status=1
  echo "memcheck: $(grep -E "ERROR SUMMARY" "$out/memcheck.txt" | tail -1)"
  # the decode's page tiles, both pipelined kernels (tensor-core: q4_0, k8v4; CUDA-core: bf16, int8-f32)
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 "$gc" \
    "PAR.cuda.decode.page_tiles.q4_0*,PAR.cuda.decode.page_tiles.k8v4*,PAR.cuda.decode.page_tiles.bf16*,PAR.cuda.decode.page_tiles.mixed.int8-f32*" \
    >"$out/memcheck_page_tiles.txt" 2>&1 || status=1
  echo "memcheck (page tiles): $(grep -E "ERROR SUMMARY" "$out/memcheck_page_tiles.txt" | tail -1)"
  timeout 200 compute-sanitizer --tool racecheck --error-exitcode 3 "$gc" \
    "PAR.cuda.decode.page_tiles.q4_0*,PAR.cuda.decode.page_tiles.bf16*" >"$out/racecheck_page_tiles.txt" 2>&1 || status=1
  echo "racecheck (page tiles): $(grep -E "RACECHECK SUMMARY" "$out/racecheck_page_tiles.txt" | tail -1)"
else
  echo "compute-sanitizer not found: racecheck and memcheck not run" | tee "$out/sanitizers.txt"
  status=1
fi
echo "done at $(( $(date +%s) - t0 ))s, status $status"
(cd "$out" && tar czf logs.tgz --exclude=logs.tgz -- *)
exit $status
