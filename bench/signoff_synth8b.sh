#!/usr/bin/env bash
# The sign-off budget run: a random-weight Llama-3-8B-shaped model (`kvgate synth`, bf16 tensors),
# then `kvgate signoff --device cuda` over every preset with the quality corpus reaching 32K tokens
# (depth buckets 0-1K, 1K-4K, 4K-16K, 16K+) and the needle grid to 32K, on one GPU. Prints the
# elapsed time of every stage (the script's own and, from kvgate, the sign-off's).
#
#   bench/signoff_synth8b.sh [--tiny] [--layers N] [--build DIR] [--out DIR] [--gates] [--synth-only]
#
#   --tiny    the same pipeline on a tiny synth model, the CPU engine and a 2K-token grid (checks the
#             script end to end on a machine without a GPU; a few minutes on two cores)
#   --layers  the 8B shape with N layers instead of 32 (a profile of the stages: the per-layer ones
#             scale with N, the per-position logit comparison over the 128K vocabulary does not)
#   --build   the build folder holding kvgate (default build-cuda, --tiny: build)
#   --out     work folder (default /tmp/kvgate_synth8b; the 8B model takes 16 GB of disk there)
#   --gates   also run the gates (conformance); by default the gate folder is empty, so conformance
#             reads NOT-VALIDATED and the budget covers what depends on the model: quality, probes,
#             probe sensitivity and timing. The mutation proof is never part of it (--quick).
#   --synth-only  write (or reuse) the model and the corpus, then stop: a later run with the same
#             arguments reuses them, so the synth step can run beside other work
#
# Budget: <= 15 minutes of the sign-off on one H200 (the synth step is timed apart). The estimate
# behind the defaults, Llama-3-8B shape (32 layers, d 4096, FFN 14336, 32/8 heads of 128, vocab
# 128256; 7.5 GFLOP/token of GEMMs x 2, attention 2*d*L^2 per layer = 2.8e14 FLOP for a 32K prefill):
#   - GEMMs (cuBLAS bf16, 128-row chunks, ~300 TFLOP/s assumed): 1.6 s per 32K pass;
#   - attention: the tensor-core prefill (bf16 86, fp8 151, q4_0 76 TFLOP/s measured at 32K) ~3.5 s
#     per 32K pass; f32 KV takes the CUDA-core kernel (~7.5 TFLOP/s): ~37 s per 32K pass;
#   - quality: 11 chunked 32K passes (9 presets, the bf16 baseline, the f32 noise run; f32 twice):
#     ~9 x 5 s + 2 x 39 s ~ 125 s, plus logits to the host (16.8 GB per pass, ~1.5 s) and the
#     per-position comparison on 16 cores (~5 s per pass): ~200 s; the decode-path noise run, 2048
#     decode steps at ~5 ms: ~10 s;
#   - probes: needle L = 4096, 32768 at depth 0.5, counting N = 10, 30, echo seeds 1..4, for 9
#     formats: 8 x 6 s + 39 s (f32) + decode ~15 s ~ 100 s;
#   - timing rows at 4K and 16K (cold + warm TTFT, 32 decode steps): ~45 s;
#   - model load (16 GB bf16 -> f32 host) ~60 s and three weight uploads (~15 s each);
#   - probe sensitivity: the damage runs on the CPU engine only for cases the baseline passes on the
#     GPU; the random-weight model passes none, so it costs nothing and every probe reads VACUOUS.
#   Total ~ 8 minutes; the 15-minute budget leaves room for f32 attention below its estimate.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tiny=0
build=""
out=/tmp/kvgate_synth8b
gates=0
synth_only=0
layers=32
while [ $# -gt 0 ]; do
  case "$1" in
    --tiny) tiny=1 ;;
    --layers) layers="$2"; shift ;;
    --build) build="$2"; shift ;;
    --out) out="$2"; shift ;;
    --gates) gates=1 ;;
    --synth-only) synth_only=1 ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "signoff_synth8b: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$build" ] || build=$([ $tiny = 1 ] && echo "$here/build" || echo "$here/build-cuda")
kvgate="$build/kvgate"
[ -x "$kvgate" ] || { echo "signoff_synth8b: $kvgate not found: build it first (cmake --build $build --target kvgate)" >&2; exit 2; }
mkdir -p "$out"

t_start=$(date +%s.%N)
t_last=$t_start
stage() {  # stage NAME: the time since the last stage and since the start
  local now; now=$(date +%s.%N)
  awk -v n="$1" -v a="$t_last" -v b="$now" -v s="$t_start" 'BEGIN { printf "script stage: %-34s %8.1f s   (total %8.1f s)\n", n, b - a, b - s }'
  t_last=$now
}

if [ $tiny = 1 ]; then
  device=cpu
  synth=(--arch llama --layers 2 --hidden 64 --ffn 172 --heads 4 --kv-heads 2 --vocab 512 --max-seq-len 2304 --dtype bf16)
  corpus_len=2048
  # shellcheck disable=SC2054  # the commas are inside arguments (lists of lengths)
  grid=(--needle-lengths 256,2048 --needle-depths 0.5 --counting-n 10 --echo-seeds 1..2 --bench-lengths 256,1024 --repeats 1)
  extra=(--threads 2)
else
  device=cuda
  # Llama-3-8B: 32 x (4096, FFN 14336), 32 query / 8 KV heads of 128, vocab 128256, RoPE llama3
  # (theta 5e5); context 32K + room for a needle's question and answer.
  synth=(--arch llama --layers "$layers" --hidden 4096 --ffn 14336 --heads 32 --kv-heads 8 --head-dim 128 --vocab 128256
         --max-seq-len 33024 --rope-theta 500000 --rope llama3 --dtype bf16 --shards 4)
  corpus_len=32768
  # shellcheck disable=SC2054  # the commas are inside arguments (lists of lengths)
  grid=(--needle-lengths 4096,32768 --needle-depths 0.5 --counting-n 10,30 --echo-seeds 1..4 --bench-lengths 4096,16384 --repeats 1)
  extra=(--cuda-weights bf16 --decode-path-tokens 2048)
fi

model="$out/model"
if [ -f "$model/config.json" ] && [ -f "$out/synth.args" ] && [ "$(cat "$out/synth.args")" = "${synth[*]}" ]; then
  echo "signoff_synth8b: reusing $model (same synth arguments)"
else
  rm -rf "$model"
  "$kvgate" synth "${synth[@]}" --seed 1 --out "$model"
  printf '%s' "${synth[*]}" > "$out/synth.args"
fi
stage "synth model"

# One sequence of corpus_len token ids (deterministic LCG over the vocabulary, ids >= 3), so every
# depth bucket up to 16K+ has positions; the project corpus (8 x 256 tokens) is added by signoff.
vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$model/config.json" | head -1)
awk -v n="$corpus_len" -v v="$vocab" 'BEGIN { x = 12345; for (i = 0; i < n; ++i) { x = (x * 1103515245 + 12345) % 2147483648; printf "%d%s", 3 + x % (v - 3), (i % 32 == 31) ? "\n" : " " } printf "\n" }' \
  > "$out/corpus_ids.txt"
stage "corpus ($corpus_len token ids)"
[ $synth_only = 1 ] && { echo "signoff_synth8b: --synth-only: model $model, corpus $out/corpus_ids.txt"; exit 0; }

gate_args=()
if [ $gates = 0 ]; then
  mkdir -p "$out/no_gates"
  gate_args=(--gates-dir "$out/no_gates")
fi
set +e
"$kvgate" signoff --all --quick --device "$device" --model "$model" --probe-model none --corpus "$out/corpus_ids.txt" \
  "${grid[@]}" "${extra[@]}" "${gate_args[@]}" --out "$out/signoff"
rc=$?
set -e
stage "kvgate signoff (exit $rc)"
echo "signoff_synth8b: report $out/signoff/index.md; stages in $out/signoff/signoff.json (\"stages\")"
# Exit codes 0/2/3/4 are verdicts (4: NOT-VALIDATED, expected with --quick); anything else failed.
case $rc in 0|2|3|4) exit 0 ;; *) exit "$rc" ;; esac
