#!/bin/bash
# The CUDA latent attention (MLA) in one device call (kvgate/cuda/ops.hpp "latent attention"): build
# (-DKVGATE_CUDA=ON, gate_cuda + bench_mla_decode), the MLA gates (ORA.cuda.mla.*, PAR.cuda.mla.*,
# STO.cuda.mla.*, with STO.cuda.capability as a regression), compute-sanitizer memcheck over two of
# them, then the latent decode benchmark: 32K x batch 16 and 64, 16 (DeepSeek-V2-Lite) and 128 (V3)
# query heads, kv_lora 512, rope 64, pages of 64, for the bf16 latent, k=fp8_block128,v=bf16
# (fp8_ds_mla) and k=fp8_e4m3,v=bf16, against the copy bandwidth measured in the same run. From the
# repository root on the GPU machine:
#
#   XXHASH_DIR=gpu_assets/xxhash JOBS=16 bench/cuda/mla_device_run.sh OUT_DIR
#
# XXHASH_DIR: a folder with include/xxhash.h and lib/libxxhash.a (a machine without the package).
# OUT_DIR gets device.txt, configure.log, build.log, gate_mla.log, memcheck.log, the benchmark's log,
# JSON (cuda_mla_decode.json) and Markdown table (cuda_mla_decode.md).
# Timeouts: configure 60 + build 300 + gates 120 + memcheck 90 + bench 200.
OUT=${1:?usage: bench/cuda/mla_device_run.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KVGATE_SOURCE_DIR=$PWD
J=${JOBS:-$(nproc)}
B=${BUILD_DIR:-build-mla}
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }
XX=()
[ -n "${XXHASH_DIR:-}" ] && XXHASH_DIR=$(cd "$XXHASH_DIR" && pwd) &&
  XX=("-DCMAKE_CXX_FLAGS=-I$XXHASH_DIR/include -DXXH_INLINE_ALL" "-DCMAKE_EXE_LINKER_FLAGS=-L$XXHASH_DIR/lib")
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1
  git log -1 --format='tree %h %s' 2>/dev/null | cut -c1-100; } | tee "$OUT/device.txt"
echo "== build $(el)"
timeout 60 cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON -DKVGATE_BUILD_BENCH=ON "${XX[@]}" \
  > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
timeout 300 ninja -C "$B" -j "$J" gate_cuda bench_mla_decode > "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
grep -c "spill" "$OUT/build.log" | sed 's/^/ptxas spill warnings: /'
G=$B/gates/gate_cuda; [ -x "$G" ] || G=$(find "$B" -name gate_cuda -type f | head -1)
BENCH=$B/bench/bench_mla_decode; [ -x "$BENCH" ] || BENCH=$(find "$B" -name bench_mla_decode -type f | head -1)

echo "== gates: ORA.cuda.mla.*, PAR.cuda.mla.*, STO.cuda.mla.*, STO.cuda.capability $(el)"
timeout 120 "$G" "ORA.cuda.mla.*,PAR.cuda.mla.*,STO.cuda.mla.*,STO.cuda.capability*" --durations yes \
  > "$OUT/gate_mla.log" 2>&1
echo "gate rc=$? $(el)"
grep -E "^(All tests passed|test cases|assertions)" "$OUT/gate_mla.log" | tail -2
grep -B3 -A14 "FAILED:" "$OUT/gate_mla.log" | head -80
grep -E "^[0-9.]+ s: " "$OUT/gate_mla.log" | cut -c1-60

echo "== memcheck (ORA.cuda.mla.fp8_block128, PAR.cuda.mla.cpu_store) $(el)"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 "$G" "ORA.cuda.mla.fp8_block128*,PAR.cuda.mla.cpu_store*" \
  > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$? $(el)"
grep -E "ERROR SUMMARY|^(All tests passed|test cases)" "$OUT/memcheck.log" | tail -3

echo "== bench_mla_decode $(el)"
timeout 200 "$BENCH" --out "$OUT/cuda_mla_decode.json" --md "$OUT/cuda_mla_decode.md" > "$OUT/bench.log" 2>&1
echo "bench rc=$? $(el)"
cat "$OUT/bench.log"
echo "== done $(el)"
