#!/bin/bash
# The tensor-core prefill against an earlier kernel in the same run, on one GPU (round 29's A/B):
# this tree's bench_prefill_attn and a copy of this tree with another prefill_mma.cuh, built side
# by side, run interleaved twice, with the PyTorch peer between; then the bar table. From the
# repository root on the GPU machine:
#
#   git show <rev>:runtime/cuda/kernels/prefill_mma.cuh > gpu_assets/base/prefill_mma.cuh   # (here)
#   bench/cuda/prefill_ab_device_run.sh gpu_assets OUT                                        # (there)
#
# ASSETS holds xxhash/{include,lib} (a machine without the package) and base/prefill_mma.cuh.
# OUT gets r.tgz: both builds' logs, prefill_{head,base}_{1,2}.json, torch_prefill_peer.json,
# prefill_bars_head.json and the printed output. TTFT=1 adds bench_e2e_decode's TTFT of one
# 32K-token prompt (Llama-3-8B shape, chunks of 8192) from both trees: ttft_{head,base}.json.
set -u
A=$(cd "${1:?usage: bench/cuda/prefill_ab_device_run.sh ASSETS OUT}" && pwd)
OUT=${2:?usage: bench/cuda/prefill_ab_device_run.sh ASSETS OUT}
mkdir -p "$OUT/r"; R=$(cd "$OUT/r" && pwd)
[ -f "$A/base/prefill_mma.cuh" ] || { echo "no $A/base/prefill_mma.cuh: extract the earlier kernel first (see the header)"; exit 2; }
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(($(date +%s) - T0))s]"; }
XX=("-DCMAKE_CXX_FLAGS=-I$A/xxhash/include -DXXH_INLINE_ALL" "-DCMAKE_EXE_LINKER_FLAGS=-L$A/xxhash/lib")
CFG=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real "${XX[@]}")
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$R/device.txt"
BASE=/tmp/kvgate-prefill-base
rm -rf $BASE && mkdir -p $BASE
tar --exclude="./build*" --exclude=./gpu_assets --exclude=./.git -cf - . | tar -xf - -C $BASE
cp "$A/base/prefill_mma.cuh" $BASE/runtime/cuda/kernels/prefill_mma.cuh
echo "== build this tree and the base $(el)"
cmake -S . -B build-prefill-ab "${CFG[@]}" > "$R/cfg.log" 2>&1 && ninja -C build-prefill-ab -j16 bench_prefill_attn > "$R/build.log" 2>&1 || { tail -20 "$R/build.log"; exit 1; }
(cd $BASE && cmake -S . -B build-base "${CFG[@]}" > "$R/base_cfg.log" 2>&1 && ninja -C build-base -j16 bench_prefill_attn > "$R/base_build.log" 2>&1) || { tail -20 "$R/base_build.log"; exit 1; }
BP=$(find build-prefill-ab -name bench_prefill_attn -type f | head -1); BB=$(find $BASE/build-base -name bench_prefill_attn -type f | head -1)
F=bf16,int8,fp8,q4_0,k8v4,q8_0
for round in 1 2; do
  echo "== this tree, run $round $(el)"; timeout 120 $BP --formats $F --contexts 8192,32768 --reps 3 --out $R/prefill_head_$round.json | tee $R/prefill_head_$round.txt
  echo "== base, run $round $(el)"; timeout 120 $BB --formats $F --contexts 8192,32768 --reps 3 --out $R/prefill_base_$round.json | tee $R/prefill_base_$round.txt
  if [ $round = 1 ]; then echo "== peer $(el)"; timeout 100 python3 bench/cuda/peer_sdpa_prefill.py --out $R/torch_prefill_peer.json | tee $R/peer.txt; fi
done
python3 bench/cuda/assess_prefill.py $R/prefill_head_1.json $R/torch_prefill_peer.json $R/prefill_bars_head.json | tee $R/assess_head.txt
if [ "${TTFT:-0}" = 1 ]; then  # TTFT of one 32K-token prompt (Llama-3-8B shape, chunks of 8192), both trees
  echo "== bench_e2e_decode, both trees $(el)"
  ninja -C build-prefill-ab -j16 bench_e2e_decode >> "$R/build.log" 2>&1 || tail -20 "$R/build.log"
  (cd $BASE && ninja -C build-base -j16 bench_e2e_decode >> "$R/base_build.log" 2>&1) || tail -20 "$R/base_build.log"
  EP=$(find build-prefill-ab -name bench_e2e_decode -type f | head -1); EB=$(find $BASE/build-base -name bench_e2e_decode -type f | head -1)
  TF=(--arch llama --rope plain --context 32768 --no-decode --formats "${TTFT_FORMATS:-bf16,int8,fp8,k8v4,q4_0}" --ttft 32768 --prefill-chunk 8192 --ttft-runs 2 --ttft-warmup 1)
  for t in head base; do
    exe=$EP; [ $t = base ] && exe=$EB
    echo "== TTFT $t $(el)"; timeout 150 "$exe" "${TF[@]}" --out "$R/ttft_$t.json" > "$R/ttft_$t.txt" 2>&1; grep -i "ttft" "$R/ttft_$t.txt" | tail -8
  done
fi
echo "== done $(el)"
cd "$OUT" && tar czf r.tgz r && rm -rf r
