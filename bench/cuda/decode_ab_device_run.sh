#!/bin/bash
# This tree's decode kernels against earlier ones, in one device call (round 31's A/B of the
# tensor-core decode's page tiles): build gate_cuda and bench_decode_attn once; the decode gates (or
# the whole gate_cuda) in Catch2 shards; mutants applied by hand (patch, rebuild gate_cuda, run the
# gates that must kill it, restore, rebuild); bench_decode_attn with this tree's kernels and with the
# base files swapped in (the same binary relinked), interleaved; Nsight Compute's instruction counts
# and pipe use of both. From the repository root on the GPU machine:
#
#   for f in runtime/cuda/kernels/decode.cuh runtime/cuda/kernels/decode_mma.cuh; do   # (here)
#     git show <rev>:$f > gpu_assets/base/$(basename $f); done
#   bench/cuda/decode_ab_device_run.sh gpu_assets OUT                                    # (there)
#
# ASSETS holds xxhash/{include,lib} (a machine without the package), models/ (KVGATE_MODELS) and
# base/<file> for each of BASE_FILES (default the two decode headers above). OUT gets r.tgz.
# STEPS (default "gates ab"): gates (GATES, a Catch2 filter, default every ORA/INV/PAR/STO decode
# gate; GATES=all runs the whole program), sanitize (compute-sanitizer memcheck over SAN_GATES, racecheck
# over two decode presets), mutants (MUTANTS: catalog ids), ab (A/B rows: AB_FORMATS,
# AB_CONTEXTS, AB_BATCHES, ROUNDS; AB_PT0=1 adds this tree's kernels with page tiles off), ncu (per-pipe instruction counts of one launch per NCU_CASES
# format:context:batch, this tree's and the base's). BUILD reuses a configured tree.
set -u
STEPS=${STEPS:-gates ab}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
A=$(cd "${1:?usage: bench/cuda/decode_ab_device_run.sh ASSETS OUT}" && pwd)
OUT=${2:?usage: bench/cuda/decode_ab_device_run.sh ASSETS OUT}
mkdir -p "$OUT/r"; R=$(cd "$OUT/r" && pwd)
BASE_FILES=${BASE_FILES:-runtime/cuda/kernels/decode.cuh runtime/cuda/kernels/decode_mma.cuh}
for f in $BASE_FILES; do [ -f "$A/base/$(basename "$f")" ] || { echo "no $A/base/$(basename "$f") (see the header)"; exit 2; }; done
export KVGATE_MODELS="$A/models"
B=${BUILD:-build-decode-ab}
. "$(dirname "$0")/device_ab_lib.sh"  # el, device_build, device_mutant
device_build

if has gates; then
  F=${GATES:-ORA.cuda.decode*,INV.cuda.schedule*,PAR.cuda.decode*,STO.cuda.bytes_read*}
  [ "$F" = all ] && F=""
  echo "== gate_cuda ${F:-(whole)}, 6 shards $(el)"
  for i in 0 1 2 3 4 5; do
    (cd $B && timeout 400 "../$G" $F --shard-count 6 --shard-index $i > "$R/gate_cuda.shard$i.txt" 2>&1; echo $? > "$R/gate_cuda.shard$i.rc") &
  done
  wait
  for i in 0 1 2 3 4 5; do echo "shard $i rc $(cat "$R/gate_cuda.shard$i.rc"): $(grep -E "^(All tests passed|test cases)" "$R/gate_cuda.shard$i.txt" | tail -1)"; grep -B2 -A12 FAILED "$R/gate_cuda.shard$i.txt" | head -30; done
fi

if has sanitize; then  # compute-sanitizer over decode gates that take both ways of both pipelined kernels
  device_sanitize "${SAN_GATES:-ORA.cuda.decode.int8*,ORA.cuda.decode.q4_0*,ORA.cuda.decode.bf16*,ORA.cuda.decode.f32*,PAR.cuda.decode.page_tiles.k8v4*,PAR.cuda.decode.page_tiles.mixed.int8-f32*}" \
    "ORA.cuda.decode.int8*,ORA.cuda.decode.bf16*"
fi

if has mutants; then
  echo "== mutants $(el)"
  # one rebuild after the last mutant (each mutant's build starts from the restored file)
  read -ra ids <<< "${MUTANTS:-}"
  for i in "${!ids[@]}"; do device_mutant "${ids[$i]}" "$([ "$i" = $((${#ids[@]} - 1)) ] && echo 1 || echo 0)"; done
fi

if has ab || has ncu; then
  echo "== base kernels: $BASE_FILES swapped, bench relinked $(el)"
  for f in $BASE_FILES; do cp "$f" "/tmp/head.$(basename "$f")"; cp "$A/base/$(basename "$f")" "$f"; done
  ninja -C $B -j16 bench_decode_attn > "$R/base_build.log" 2>&1 || tail -20 "$R/base_build.log"
  cp "$BD" /tmp/bench_decode_base
  for f in $BASE_FILES; do cp "/tmp/head.$(basename "$f")" "$f"; done
  ninja -C $B -j16 bench_decode_attn >> "$R/base_build.log" 2>&1 || tail -20 "$R/base_build.log"  # this tree's again
fi
if has ab; then
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for t in head base ${AB_PT0:+pt0}; do
      echo "== $t, run $round $(el)"
      # pt0: this tree's binary with page tiles off (the page tiles' share of head vs base)
      exe=/tmp/bench_decode_$t; pt=1
      [ "$t" = pt0 ] && { exe=/tmp/bench_decode_head; pt=0; }
      KVGATE_CUDA_PAGE_TILES=$pt timeout 200 "$exe" --formats "${AB_FORMATS:-int8,fp8,q8_0,q4_0,k8v4}" --contexts "${AB_CONTEXTS:-4096,32768,131072}" \
        --batches "${AB_BATCHES:-1,16,64}" --reps "${AB_REPS:-50}" --out "$R/ab_${t}_$round.json" > "$R/ab_${t}_$round.txt" 2>&1
      grep -v "store" "$R/ab_${t}_$round.txt" | tail -48
    done
  done
fi
if has ncu; then
  for c in ${NCU_CASES:-q4_0:32768:16 int8:32768:16}; do
    IFS=: read -r f ctx bt <<< "$c"
    for t in head base; do
      echo "== ncu $t $f ${ctx}x$bt $(el)"
      timeout 150 ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
        --section WarpStateStats --section Occupancy \
        --metrics smsp__inst_executed.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_pipe_tensor.sum,smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_pipe_adu.sum,smsp__inst_executed_pipe_uniform.sum,smsp__inst_executed_pipe_cbu.sum \
        -k regex:"decode_(mma|fast)" --launch-skip 3 --launch-count 1 \
        /tmp/bench_decode_$t --formats "$f" --contexts "$ctx" --batches "$bt" --reps 1 --out /tmp/ncu_bench.json > "$R/ncu_${t}_${f}_${ctx}x$bt.txt" 2>&1
      grep -E "Duration|DRAM Throughput|Issue Slots Busy|highest-utilized|No Eligible|inst_executed" "$R/ncu_${t}_${f}_${ctx}x$bt.txt" | cut -c1-160 | head -16
    done
  done
fi
echo "== done $(el)"
cd "$OUT" && tar czf r.tgz r && rm -rf r
