#!/bin/bash
# The tensor-core prefill's GPU run in one device call (docs/CUDA.md "Tensor-core prefill"): build
# (-DKVGATE_CUDA=ON, gate_cuda + bench_prefill_attn), every ORA/STO.cuda.prefill gate, memcheck and
# racecheck on a subset, the prefill benchmark with its PyTorch peer and the bar table. From the
# repository root on the GPU machine:
#
#   XXHASH_DIR=gpu_assets/xxhash JOBS=16 bench/cuda/prefill_device_run.sh OUT_DIR
#
# XXHASH_DIR: a folder with include/xxhash.h and lib/libxxhash.a (a machine without the package).
# OUT_DIR gets the logs and the three JSON files (cuda_prefill_h200.json, torch_prefill_peer_h200.json,
# cuda_prefill_bars_h200.json); bench/results/ holds the committed copies.
OUT=${1:?usage: bench/cuda/prefill_device_run.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
J=${JOBS:-$(nproc)}
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }
XX=()
[ -n "${XXHASH_DIR:-}" ] && XXHASH_DIR=$(cd "$XXHASH_DIR" && pwd) &&
  XX=("-DCMAKE_CXX_FLAGS=-I$XXHASH_DIR/include -DXXH_INLINE_ALL" "-DCMAKE_EXE_LINKER_FLAGS=-L$XXHASH_DIR/lib")
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; } | tee "$OUT/device.txt"
echo "== build $(el)"
cmake -S . -B build-h200 -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON "${XX[@]}" > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
ninja -C build-h200 -j "$J" gate_cuda bench_prefill_attn > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
grep -c "spill" "$OUT/build.log" | sed 's/^/ptxas spill warnings: /'
G=build-h200/gates/gate_cuda; [ -x $G ] || G=$(find build-h200 -name gate_cuda -type f | head -1)
echo "== gates: ORA.cuda.prefill.*, STO.cuda.prefill.capability, STO.cuda.capability $(el)"
timeout 240 $G "ORA.cuda.prefill.*,STO.cuda.prefill.capability*,STO.cuda.capability*" --durations yes > "$OUT/gate_prefill.log" 2>&1; echo "gate rc=$?"
grep -E "test cases|assertions" "$OUT/gate_prefill.log" | tail -2
grep -B3 -A14 "FAILED:" "$OUT/gate_prefill.log" | head -80
grep -E "^ORA.cuda.prefill" "$OUT/gate_prefill.log" | cut -c1-300 | head -40
echo "== memcheck (int8, k8v4, mixed q4_0_rot-bf16) $(el)"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 $G "ORA.cuda.prefill.int8*,ORA.cuda.prefill.k8v4*,ORA.cuda.prefill.mixed.q4_0_rot-bf16*" > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?"
grep -E "ERROR SUMMARY|test cases" "$OUT/memcheck.log"
echo "== racecheck (bf16, q4_0) $(el)"
timeout 150 compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 3 $G "ORA.cuda.prefill.bf16*,ORA.cuda.prefill.q4_0*" > "$OUT/racecheck.log" 2>&1; echo "racecheck rc=$?"
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test cases" "$OUT/racecheck.log"
echo "== bench_prefill_attn $(el)"
B=$(find build-h200 -name bench_prefill_attn -type f | head -1)
timeout 150 $B --out "$OUT/cuda_prefill_h200.json" > "$OUT/bench.log" 2>&1; echo "bench rc=$?"; cat "$OUT/bench.log"
echo "== peer $(el)"
timeout 90 python3 bench/cuda/peer_sdpa_prefill.py --out "$OUT/torch_prefill_peer_h200.json" > "$OUT/peer.log" 2>&1; echo "peer rc=$?"; cat "$OUT/peer.log"
python3 bench/cuda/assess_prefill.py "$OUT/cuda_prefill_h200.json" "$OUT/torch_prefill_peer_h200.json" "$OUT/cuda_prefill_bars_h200.json"
echo "== done $(el)"
