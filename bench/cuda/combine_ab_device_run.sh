#!/bin/bash
# The decode split merge (runtime/cuda/decode_combine.cu) against an earlier one, in one device call
# (round 30's A/B): build gate_cuda and bench_decode_attn once; the whole gate_cuda in Catch2
# shards; the combine's round mutants applied by hand (patch, rebuild gate_cuda, run the gates that
# must kill it, restore); then bench_decode_attn at batch 1 (forced split counts and the planner's)
# with this tree's merge and with the base merge, interleaved twice. From the repository root on
# the GPU machine:
#
#   git show <rev>:runtime/cuda/decode_combine.cu > gpu_assets/base/decode_combine.cu   # (here)
#   bench/cuda/combine_ab_device_run.sh gpu_assets OUT                                  # (there)
#
# ASSETS holds xxhash/{include,lib} (a machine without the package), models/ (KVGATE_MODELS) and
# base/decode_combine.cu. OUT gets r.tgz: the build log, the gate shards' logs, the mutants' logs,
# b1_{head,base}_{1,2}.json and the printed output. The base binary is this build with the one file
# swapped and relinked (the libraries are static), so the two differ only in the merge.
# STEPS (default "gates mutants ab"; "sanitize": memcheck + racecheck over decode gates; "bars" adds the memory-wall bars: PyTorch peer, every preset at
# 4K/32K/128K x 1/16/64, assess_bars.py) picks the steps after the build and ROUNDS (default 2) the A/B
# rounds, for a call that shares its ten minutes with other work; the build is reused when it exists.
# EXTRA_TARGETS: more ninja targets for the same build (bench_e2e_decode, bench_prefill_attn).
set -u
STEPS=${STEPS:-gates mutants ab}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
A=$(cd "${1:?usage: bench/cuda/combine_ab_device_run.sh ASSETS OUT}" && pwd)
OUT=${2:?usage: bench/cuda/combine_ab_device_run.sh ASSETS OUT}
mkdir -p "$OUT/r"; R=$(cd "$OUT/r" && pwd)
[ -f "$A/base/decode_combine.cu" ] || { echo "no $A/base/decode_combine.cu: extract the earlier merge first (see the header)"; exit 2; }
export KVGATE_MODELS="$A/models"
B=${BUILD:-build-combine-ab}  # BUILD: reuse a configured tree (e.g. scripts/gpu-gates.sh's build-gpu-gates)
. "$(dirname "$0")/device_ab_lib.sh"  # el, device_build, device_mutant
device_build

if has gates; then
echo "== gate_cuda, 6 shards $(el)"
for i in 0 1 2 3 4 5; do
  (cd $B && timeout 300 "../$G" --shard-count 6 --shard-index $i > "$R/gate_cuda.shard$i.txt" 2>&1; echo $? > "$R/gate_cuda.shard$i.rc") &
done
wait
for i in 0 1 2 3 4 5; do echo "shard $i rc $(cat "$R/gate_cuda.shard$i.rc"): $(grep -E "^(All tests passed|test cases)" "$R/gate_cuda.shard$i.txt" | tail -1)"; grep -B2 -A12 FAILED "$R/gate_cuda.shard$i.txt" | head -30; done
fi

if has sanitize; then  # compute-sanitizer over the decode gates that run the merge's rounds
  device_sanitize "ORA.cuda.decode.int8*,ORA.cuda.decode.k8v4*,ORA.cuda.decode.f32*,ORA.cuda.decode.q4_0*,INV.cuda.schedule.int8*" \
    "ORA.cuda.decode.int8*"
fi
if has mutants; then
echo "== combine mutants $(el)"
device_mutant CUDA.combine.tail_split_dropped
device_mutant CUDA.combine.second_round_not_loaded
fi
has ab || { echo "== done $(el)"; cd "$OUT" && tar czf r.tgz r && rm -rf r; exit 0; }

echo "== base merge: one file swapped, bench relinked $(el)"
cp runtime/cuda/decode_combine.cu /tmp/decode_combine.head.cu
cp "$A/base/decode_combine.cu" runtime/cuda/decode_combine.cu
ninja -C $B -j16 bench_decode_attn > "$R/base_build.log" 2>&1 || { tail -20 "$R/base_build.log"; }
cp "$BD" /tmp/bench_decode_base
cp /tmp/decode_combine.head.cu runtime/cuda/decode_combine.cu
ninja -C $B -j16 bench_decode_attn >> "$R/base_build.log" 2>&1 || { tail -20 "$R/base_build.log"; }  # this tree's again

F=int8,fp8,q4_0,k8v4,bf16
for round in $(seq 1 "${ROUNDS:-2}"); do
  for t in head base; do
    echo "== $t, run $round $(el)"
    timeout 150 /tmp/bench_decode_$t --formats $F --contexts 4096,32768,131072 --batches 1 --splits 0,64,128 \
      --reps 200 --out "$R/b1_${t}_$round.json" > "$R/b1_${t}_$round.txt" 2>&1
    grep -v "store" "$R/b1_${t}_$round.txt" | tail -46
  done
done
if has bars; then  # the memory-wall bars with this tree's kernels, the PyTorch bf16 peer in the same call
  echo "== bars: peer + bench_decode_attn (every preset, 4K/32K/128K x 1/16/64) $(el)"
  timeout 200 python3 bench/cuda/peer_sdpa.py --formats bf16 --out "$R/torch_peer.json" > "$R/peer.log" 2>&1
  timeout 200 /tmp/bench_decode_head --formats bf16,f16,int8,fp8,fp8_e5m2,q8_0,q4_0,k8v4 --out "$R/cuda_decode.json" \
    > "$R/cuda_decode.log" 2>&1
  BEFORE=(); [ -f "$A/base/cuda_decode_before.json" ] && BEFORE=(--before "$A/base/cuda_decode_before.json")  # an earlier run to compare
  timeout 10 python3 bench/cuda/assess_bars.py "$R/cuda_decode.json" "$R/torch_peer.json" "$R/cuda_bars.json" "${BEFORE[@]}" > "$R/bars.txt" 2>&1
  sed -n '/^Memory-wall bars/,$p' "$R/bars.txt" | head -3
fi
echo "== done $(el)"
cd "$OUT" && tar czf r.tgz r && rm -rf r
