#!/bin/bash
# One H200 call (session 10): the per-window decode plan under CUDA graphs: the windowed CUDA gates,
# then Gemma-3-shaped decode at 32K x 16 (graph vs plain launches in the same run). Results:
# bench/results/families_h200_round10.md ("After the fix").
#   bench/cuda/window_plan_device_run.sh ASSETS OUT
set -u
A=$(cd "${1:?assets}" && pwd); OUT=${2:?out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PATH=/usr/local/cuda/bin:$PATH KVGATE_MODELS=$A/models
T0=$(date +%s); el() { echo "[+$(($(date +%s) - T0))s]"; }
B=build-w
timeout 40 cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON "-DCMAKE_CXX_FLAGS=-I$A/xxhash/include -DXXH_INLINE_ALL" "-DCMAKE_EXE_LINKER_FLAGS=-L$A/xxhash/lib" > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
timeout 170 cmake --build $B -j16 --target gate_cuda bench_e2e_decode >> "$OUT/build.log" 2>&1 || { echo "$(el) build failed/timed out"; grep -E "error|FAILED" "$OUT/build.log" | head; exit 1; }
echo "$(el) built"
timeout 40 $B/gates/gate_cuda "MOD.cuda.hf_arch.*,MOD.cuda.hf.gemma*,MOD.cuda.hf.mistral_swa*,MOD.cuda.hf.qwen2_swa*,MOD.cuda.window*" > "$OUT/gate_window.txt" 2>&1; echo "$(el) window gates rc=$?"; tail -2 "$OUT/gate_window.txt"
left=$((270 - ($(date +%s) - T0)))
[ $left -gt 20 ] && timeout $left $B/bench/bench_e2e_decode --arch gemma3 --formats bf16,int8,q4_0 --steps 6 --warmup 2 --out "$OUT/e2e_gemma3_windowplan.json" > "$OUT/bench.log" 2>&1; echo "$(el) bench rc=$?"
python3 -c "
import json;j=json.load(open('$OUT/e2e_gemma3_windowplan.json'))
for r in j.get('rows',j.get('results',[])): print({k:r.get(k) for k in ('format','tok_s','wall_ms','status','decode_tok_s')})
print(j.get('graph_vs_plain'))" 2>&1 | head -12
