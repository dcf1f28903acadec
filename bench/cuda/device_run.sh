#!/bin/bash
# The issue-6 GPU run in one device call (docs/CUDA.md): every GPU gate, compute-sanitizer memcheck
# over the streaming / model / tensor-core decode cases, the decode-attention benchmark with its
# PyTorch peer and the bar assessment, the end-to-end decode benchmark, the A/B matrix's CUDA rows,
# and `kvgate run --device cuda`. Run from the repository root on the GPU machine:
#
#   bench/cuda/device_run.sh ASSETS_DIR OUT_DIR
#
# ASSETS_DIR holds gate_cuda, kvgate, bench_decode_attn, bench_e2e_decode (built with -DKVGATE_CUDA=ON;
# or bins.tgz with them, unpacked here) and models/stories260K/{stories260K.bin,tok512.bin}.
# OUT_DIR gets results.tgz (every log and JSON); bench/results/ holds the committed copies.
A=${1:?usage: bench/cuda/device_run.sh ASSETS_DIR OUT_DIR}
OUT=${2:?usage: bench/cuda/device_run.sh ASSETS_DIR OUT_DIR}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export KVGATE_MODELS=$PWD/$A/models KVGATE_SOURCE_DIR=$PWD PYTHONUNBUFFERED=1
[ -f $A/bins.tgz ] && tar xzf $A/bins.tgz -C $A
R=$OUT/r; mkdir -p $R
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; compute-sanitizer --version | tail -1; } | tee $R/device.txt
echo "== gate_cuda (all) $(el)"
timeout 200 $A/gate_cuda --durations yes > $R/gate_cuda.log 2>&1; echo "gate rc=$?"
grep -E "^[0-9.]+ s:|test cases|FAILED|failed" $R/gate_cuda.log | sort -rn | head -12
grep -B2 -A12 "FAILED:" $R/gate_cuda.log | head -60
echo "== memcheck: stream, model, changed mma decode $(el)"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $A/gate_cuda "PAR.cuda.stream*,MOD.cuda.*,ORA.cuda.decode.q4_0*,ORA.cuda.decode.int8*,ORA.cuda.decode.k8v4*" > $R/memcheck.log 2>&1; echo "memcheck rc=$?"
grep -E "ERROR SUMMARY|test cases" $R/memcheck.log
echo "== bench_decode_attn $(el)"
timeout 150 $A/bench_decode_attn --out $R/cuda_decode_h200.json > $R/cuda_decode_h200.log 2>&1; echo "bench rc=$?"
echo "== peer $(el)"
timeout 120 python3 bench/cuda/peer_sdpa.py --out $R/torch_peer_h200.json > $R/peer.log 2>&1; echo "peer rc=$?"; tail -2 $R/peer.log
python3 bench/cuda/assess_bars.py $R/cuda_decode_h200.json $R/torch_peer_h200.json $R/cuda_bars_h200.json > $R/bars.txt 2>&1; echo "bars rc=$?"; head -60 $R/bars.txt
echo "== e2e $(el)"
timeout 100 $A/bench_e2e_decode --out $R/cuda_e2e_decode_h200.json > $R/e2e.log 2>&1; echo "e2e rc=$?"; tail -14 $R/e2e.log | cut -c1-200
echo "== matrix (probe model, cpu + cuda timing rows) $(el)"
timeout 150 $A/kvgate bench --model datasets/models/probe --probe-model none --no-probes --no-quality --formats f16,bf16,int8,fp8,q8_0,q4_0,k8v4 --lengths 1024,4096 --windows 0 --devices cpu,cuda --repeats 2 --threads 16 --out $R/matrix_probe > $R/matrix.log 2>&1; echo "matrix rc=$?"
grep -E "^\| (f32|f16|bf16|int8|fp8|q8_0|q4_0|k8v4) " $R/matrix_probe/matrix.md | head -40
timeout 150 $A/kvgate bench --model $A/models/stories260K/stories260K.bin --probe-model none --no-probes --lengths 128,480 --windows 0 --devices cpu,cuda --repeats 3 --threads 16 --out $R/matrix_stories > $R/matrix_stories.log 2>&1; echo "matrix stories rc=$?"
echo "== kvgate run --device cuda $(el)"
timeout 30 $A/kvgate run --model $A/models/stories260K/stories260K.bin --device cuda --kv k8v4 --steps 128 > $R/run_cuda.txt 2> $R/run_cuda.err; echo "run rc=$?"; head -c 300 $R/run_cuda.txt; echo; cat $R/run_cuda.err | tail -3
echo "== kvgate run --device cuda: a conversation (two turns, --conv-id) and a streamed run (--kv-resident) $(el)"
for t in 1 2; do
  timeout 30 $A/kvgate run --model $A/models/stories260K/stories260K.bin --device cuda --kv q8_0 --steps 24 --conv-id gpu-conv --kv-cache-dir $R/kvcache --json > $R/conv_turn$t.json 2> $R/conv_turn$t.err; echo "turn $t rc=$?"
  grep -E '"(hydrated_tokens|prefill_tokens|saved_tokens|ttft_ms)"' $R/conv_turn$t.json; tail -2 $R/conv_turn$t.err
done
timeout 30 $A/kvgate run --model $A/models/stories260K/stories260K.bin --device cuda --kv int8 --steps 64 --kv-resident 128 --json > $R/run_resident.json 2> $R/run_resident.err; echo "kv-resident rc=$?"
grep -E '"(kv_resident_tokens|kv_device_bytes|kv_pool_bytes|kv_block_lookups|kv_block_misses|kv_bytes_moved)"' $R/run_resident.json; tail -2 $R/run_resident.err
echo "== done $(el)"
cd $OUT && tar czf results.tgz r && rm -rf r && ls -la $OUT
