#!/bin/bash
# One H200 call (session 10): the CUDA build, the HF-reference and weight-storage CUDA gates, an 8B
# bf16 sharded synth model on the CUDA engine kept as stored (process memory, kvgate run --json), the
# rest of gate_cuda. Results: bench/results/weights_8b_round10.md, gate_cuda_h200_round10.txt.
#   bench/cuda/weights_device_run.sh ASSETS OUT   (ASSETS: xxhash/{include,lib}, models/stories260K)
set -u
A=$(cd "${1:?assets}" && pwd); OUT=${2:?out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PATH=/usr/local/cuda/bin:$PATH KVGATE_MODELS=$A/models
T0=$(date +%s); el() { echo "[+$(($(date +%s) - T0))s]"; }
B=build-families
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvidia-smi | grep -o "CUDA Version: [0-9.]*"; nvcc --version | grep -i release; git log -1 --format='%h %s' | cut -c1-90; nproc; free -g | head -2; } > "$OUT/device.txt" 2>&1
echo "$(el) configure"
timeout 60 cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON "-DCMAKE_CXX_FLAGS=-I$A/xxhash/include -DXXH_INLINE_ALL" "-DCMAKE_EXE_LINKER_FLAGS=-L$A/xxhash/lib" > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "$(el) build"
timeout 260 cmake --build $B -j16 --target gate_cuda kvgate bench_e2e_decode >> "$OUT/build.log" 2>&1 || { echo "build failed"; grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
echo "$(el) gates: hf references + weights"
timeout 120 $B/gates/gate_cuda "MOD.cuda.hf.*,STO.cuda.weights_as_stored*,STO.cuda.weights_bf16*" -r compact > "$OUT/gate_cuda_hf_weights.txt" 2>&1; echo "rc=$?" >> "$OUT/gate_cuda_hf_weights.txt"
tail -3 "$OUT/gate_cuda_hf_weights.txt"
$B/gates/gate_cuda "MOD.cuda.hf.*" -r xml > "$OUT/gate_cuda_hf.xml" 2>/dev/null
echo "$(el) 8B synth (bf16, 4 shards)"
M=/tmp/m8b
timeout 120 $B/kvgate synth --arch llama --layers 32 --hidden 4096 --ffn 14336 --heads 32 --kv-heads 8 --head-dim 128 --vocab 128256 --max-seq-len 8192 --dtype bf16 --rope llama3 --shards 4 --seed 1 --out $M > "$OUT/synth8b.log" 2>&1; echo "rc=$?" >> "$OUT/synth8b.log"; ls -la $M >> "$OUT/synth8b.log"
echo "$(el) 8B run --device cuda --cuda-weights bf16 (kept as stored)"
timeout 150 /usr/bin/time -v $B/kvgate run --device cuda --cuda-weights bf16 --model $M --prompt "The quick brown fox" --steps 16 --json > "$OUT/run8b_cuda_bf16.json" 2> "$OUT/run8b_cuda_bf16.err"; echo "rc=$?" >> "$OUT/run8b_cuda_bf16.err"
tail -25 "$OUT/run8b_cuda_bf16.err" | grep -E "rc=|Maximum resident|Elapsed|error" 
python3 -c "import json;j=json.load(open('$OUT/run8b_cuda_bf16.json'));print(j['model']['weights'],j['process'],j['stats']['ttft_ms'],j['stats']['decode_tok_s'])" 2>&1
echo "$(el) rest of gate_cuda"
left=$((560 - ($(date +%s) - T0)))
if [ $left -gt 60 ]; then
  timeout $left $B/gates/gate_cuda -r compact > "$OUT/gate_cuda_all.txt" 2>&1; echo "rc=$?" >> "$OUT/gate_cuda_all.txt"; tail -4 "$OUT/gate_cuda_all.txt"
fi
echo "$(el) done"
