#!/bin/bash
# One device call for the decode-attention kernels (docs/CUDA.md, "Decode attention kernels"): build
# gate_cuda and bench_decode_attn from this tree, the PyTorch bf16 peer (during the build: the GPU is
# idle then), every decode gate, compute-sanitizer memcheck over tensor-core and CUDA-core decode
# cases, the decode benchmark, and the bars against the committed run of the previous kernels
# (bench/results/cuda_decode_h200.json, the same H200 type). Run from the repository root:
#
#   bench/cuda/decode_device_run.sh ASSETS OUT
#
# ASSETS holds xxhash/{include,lib} and models/ (stories260K for the MOD gates). Prints a short
# summary; OUT gets results.tgz (r/: every log, the bench JSON, the peer JSON, the bars JSON).
# Timeouts: configure 30 + build 230 (the peer, 200, runs inside it) + gates 110 + memcheck 60 +
# bench 100 + bars 5 = 535 s.
set -u
A=$(cd "${1:?usage: bench/cuda/decode_device_run.sh ASSETS OUT}" && pwd)
OUT=${2:?usage: bench/cuda/decode_device_run.sh ASSETS OUT}
R=$OUT/r
mkdir -p "$R"
export KVGATE_MODELS=$A/models KVGATE_SOURCE_DIR=$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0))s]"; }
B=build-decode
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1
  compute-sanitizer --version | tail -1; git log -1 --format='tree %h %s' 2>/dev/null | cut -c1-100; } | tee "$R/device.txt"

echo "== configure + build (peer in parallel) $(el)"
timeout 200 python3 bench/cuda/peer_sdpa.py --formats bf16 --out "$R/torch_peer_h200.json" > "$R/peer.log" 2>&1 &
PEER=$!
timeout 30 cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON \
  "-DCMAKE_CXX_FLAGS=-I$A/xxhash/include -DXXH_INLINE_ALL" "-DCMAKE_EXE_LINKER_FLAGS=-L$A/xxhash/lib" > "$R/cfg.log" 2>&1 ||
  { echo "configure failed"; tail -20 "$R/cfg.log"; }
timeout 230 nice -n 5 cmake --build $B -j16 --target gate_cuda bench_decode_attn > "$R/build.log" 2>&1
echo "build rc=$? $(el)"
grep -E "error|FAILED" "$R/build.log" | head -20
echo "ptxas spill warnings in decode kernels: $(grep -c 'spilled.*decode_\(mma\|fast\)' "$R/build.log")"
wait $PEER
echo "peer rc=$? $(el)"; tail -1 "$R/peer.log"

echo "== decode gates $(el)"
GATES="ORA.cuda.decode*,PAR.cuda.decode*,PAR.cuda.stream*,PAR.cuda.engine_stream*,MOD.cuda.*,STO.cuda.capability*,ORA.cuda.store*"
timeout 110 $B/gates/gate_cuda "$GATES" --durations yes > "$R/gate_cuda_decode.log" 2>&1
echo "gates rc=$? $(el)"
grep -E "^(All tests passed|test cases)" "$R/gate_cuda_decode.log" | tail -2
grep -E "^[0-9.]+ s: " "$R/gate_cuda_decode.log" | grep -c . | sed 's/^/test cases timed: /'
grep -B3 -A14 "FAILED:" "$R/gate_cuda_decode.log" | head -60

echo "== memcheck (tensor-core int8 + k8v4, CUDA-core bf16 decode) $(el)"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 $B/gates/gate_cuda \
  "ORA.cuda.decode.int8*,ORA.cuda.decode.k8v4*,ORA.cuda.decode.bf16*" > "$R/memcheck.log" 2>&1
echo "memcheck rc=$? $(el)"
grep -E "ERROR SUMMARY|^(All tests passed|test cases)" "$R/memcheck.log" | tail -3

echo "== bench_decode_attn $(el)"
timeout 100 $B/bench/bench_decode_attn --formats bf16,int8,fp8,fp8_e5m2,q8_0,q4_0,k8v4 \
  --out "$R/cuda_decode_h200.json" > "$R/cuda_decode_h200.log" 2>&1
echo "bench rc=$? $(el)"
head -2 "$R/cuda_decode_h200.log"

echo "== bars (before: bench/results/cuda_decode_h200.json, the previous kernels on an H200) $(el)"
timeout 5 python3 bench/cuda/assess_bars.py "$R/cuda_decode_h200.json" "$R/torch_peer_h200.json" "$R/cuda_bars_h200.json" \
  --before bench/results/cuda_decode_h200.json > "$R/bars.txt" 2>&1
echo "bars rc=$?"
sed -n '/^Memory-wall bars/,$p' "$R/bars.txt"
echo "== done $(el)"
cd "$OUT" && tar czf results.tgz r && rm -rf r && ls -la "$OUT"
