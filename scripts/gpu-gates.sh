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
set -uo pipefail
cd "$(dirname "$0")/.."
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
for g in gate_cuda gate_signoff_engine; do
  exe=$(find build-gpu-gates/gates -name "$g" -type f | head -1)
  ( cd build-gpu-gates && timeout 400 "../$exe" --durations yes >"$out/$g.txt" 2>&1 ) || status=1
  tail -3 "$out/$g.txt"
  grep -B2 -A12 "FAILED" "$out/$g.txt" | head -80
  echo "$g done at $(( $(date +%s) - t0 ))s"
done
exit $status
