#!/bin/bash
# The model families on the CUDA engine in one device call (docs/CUDA.md, "Model families"): build
# bench_e2e_decode from this tree (-DKVGATE_CUDA=ON), then three runs of it in the same call: the plain
# Llama-3-8B shape, the Llama-3.1-8B shape with llama3 RoPE, and the Gemma-3-4B shape (sliding windows,
# local RoPE, QK-norm, GeGLU, sandwich norms); each times decode at 32K x batch 16 and the TTFT of an
# 8K prompt for every KV preset (a preset without CUDA kernels, or whose pool does not fit, is
# recorded as skipped with the reason); then the Markdown summary side by side (families_summary.py),
# with the plain figures of the committed bench/results/cuda_e2e_decode_h200.json beside them. From
# the repository root on the GPU machine:
#
#   bench/cuda/families_device_run.sh ASSETS OUT
#
# ASSETS: a folder; when it holds xxhash/{include,lib} (a machine without the xxhash package) the
# build uses them. OUT gets device.txt, build.log, e2e_plain.json, e2e_llama3.json, e2e_gemma3.json
# (each rewritten after every preset, "complete": false until its run ends) and families_h200.md.
# Every line printed starts with the UTC time and the seconds since the start.
#
# Budget (BUDGET_S, default 470 s; the runs' time is shared out so the summary always runs):
# configure ~15 s + build ~140 s (the CUDA libraries, no gates; about 130 s for gate_cuda on the
# H200's 16 cores) + three runs of ~40-60 s each (per preset: KV pool allocation and fill, 10 decode
# steps of ~20-26 ms, 4 prefills of 8K tokens of ~0.3-1 s) + the summary: about 5-6 minutes.
set -u
set -o pipefail
A=${1:?usage: bench/cuda/families_device_run.sh ASSETS OUT}
[ -d "$A" ] || { echo "ASSETS '$A' is not a folder (it holds xxhash/{include,lib} on a machine without the xxhash package; name it in the device call's carry)"; exit 2; }
A=$(cd "$A" && pwd)
OUT=${2:?usage: bench/cuda/families_device_run.sh ASSETS OUT}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
DEADLINE=$((T0 + ${BUDGET_S:-470}))
el() { echo "[$(date -u +%H:%M:%S) +$(($(date +%s) - T0))s]"; }
# A step's timeout: its own cap, or what is left before the deadline less `reserve` seconds.
limit() {
  local cap=$1 reserve=$2 left
  left=$((DEADLINE - $(date +%s) - reserve))
  ((left < cap)) && cap=$left
  ((cap < 1)) && cap=1
  echo "$cap"
}
B=build-families
BIN=$B/bench/bench_e2e_decode

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvidia-smi | grep -o "CUDA Version: [0-9.]*"
  nvcc --version | grep -i release
  git log -1 --format='tree %h %s' 2>/dev/null | cut -c1-100
} | tee "$OUT/device.txt"

echo "$(el) == configure + build bench_e2e_decode"
XX=()
if [ -d "$A/xxhash" ]; then
  XX=("-DCMAKE_CXX_FLAGS=-I$A/xxhash/include -DXXH_INLINE_ALL" "-DCMAKE_EXE_LINKER_FLAGS=-L$A/xxhash/lib")
fi
timeout 60 cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON "${XX[@]}" > "$OUT/build.log" 2>&1 ||
  { echo "$(el) configure failed"; tail -30 "$OUT/build.log"; exit 1; }
timeout "$(limit 300 150)" cmake --build $B -j16 --target bench_e2e_decode >> "$OUT/build.log" 2>&1
rc=$?
echo "$(el) build rc=$rc"
if [ $rc -ne 0 ] || [ ! -x $BIN ]; then
  grep -E "error|FAILED" "$OUT/build.log" | head -30
  exit 1
fi

# name|arguments; every run: 32K x 16 decode, 8 steps after 2, TTFT of 8192 tokens (3 runs after 1).
RUNS=("plain|--arch llama --rope plain" "llama3|--arch llama --rope llama3" "gemma3|--arch gemma3")
COMMON="--context 32768 --batch 16 --steps 8 --warmup 2 --ttft 8192 --ttft-runs 3 --ttft-warmup 1"
n=${#RUNS[@]}
for spec in "${RUNS[@]}"; do
  name=${spec%%|*}
  args=${spec#*|}
  # this run's share of what is left, 15 s kept for the summary
  share=$(( (DEADLINE - $(date +%s) - 15) / n ))
  ((share < 1)) && share=1
  echo "$(el) == $name: bench_e2e_decode $args $COMMON (timeout ${share}s)"
  # shellcheck disable=SC2086  # the argument lists split on spaces
  timeout "$share" $BIN $args $COMMON --out "$OUT/e2e_$name.json" 2>&1
  rc=$?
  echo "$(el) $name rc=$rc$( ((rc == 124)) && echo " (timed out: e2e_$name.json holds the presets done)")"
  n=$((n - 1))
done

echo "$(el) == summary"
timeout "$(limit 30 0)" python3 bench/cuda/families_summary.py --plain "$OUT/e2e_plain.json" --llama3 "$OUT/e2e_llama3.json" \
  --gemma3 "$OUT/e2e_gemma3.json" --before bench/results/cuda_e2e_decode_h200.json --device "$OUT/device.txt" \
  --out "$OUT/families_h200.md"
rc=$?
echo "$(el) summary rc=$rc"
rm -f "$OUT"/*.tmp
ls -la "$OUT"
echo "$(el) == done"
