#!/usr/bin/env bash
# One device call for this round's split and conformance work (docs/CUDA.md "Layer split over
# devices", "What a decode step reads on the GPU", Gates: INV.cuda.schedule): builds gate_cuda and
# kvgate from this tree, runs the whole gate_cuda in 6 Catch2 shards (the engine's per-stage rewrite
# touches every CudaEngine), compute-sanitizer memcheck over the byte counters and the split's KV
# files, `kvgate run --device cuda` with and without --pp (the same greedy ids expected) and
# with --tp 2 (ids printed: tensor parallelism reassociates the block sums), then the
# catalogued CUDA mutants of bench/cuda/split_device_mutants.txt ("ID<TAB>gate filter" per line)
# patched, rebuilt and run on their gates until DEADLINE seconds from the start. Run from the
# repository root:
#
#   bench/cuda/split_device_run.sh ASSETS OUT [DEADLINE]
#
# ASSETS holds xxhash/{include,lib} and models/ (stories260K). OUT gets summary.txt, failures.txt,
# the run JSONs and logs.tar.gz. First run in round 25 (bench/results/gate_proof_cuda_round25.md).
set -uo pipefail
t0=$(date +%s)
assets=$(cd "${1:?usage: bench/cuda/split_device_run.sh ASSETS OUT [DEADLINE]}" && pwd)
out=${2:?usage: bench/cuda/split_device_run.sh ASSETS OUT [DEADLINE]}; deadline=${3:-480}; mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
el() { echo "$(( $(date +%s) - t0 ))s"; }
export KVGATE_MODELS=$assets/models KVGATE_SOURCE_DIR=$PWD NCCL_NVLS_ENABLE=0
S=$out/summary.txt
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; nvidia-smi topo -m | head -3; } | tee "$S"
# A build folder kept from an earlier call on a warm machine may hold objects of that call's last
# mutants: this tree arrives with file times older than those objects, so ninja would keep them.
# Touch every source a catalogued mutant patches before building.
[ -f build-r24/build.ninja ] && python3 -c "import json; print('\n'.join(sorted({m['file'] for m in json.load(open('mutations/catalog.json'))['mutants']})))" | xargs -r touch
cmake -S . -B build-r24 -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a-real "-DCMAKE_CXX_FLAGS=-I$assets/xxhash/include -DXXH_INLINE_ALL" \
  "-DCMAKE_EXE_LINKER_FLAGS=-L$assets/xxhash/lib" >"$out/logs/configure.log" 2>&1 || { tail -20 "$out/logs/configure.log"; exit 1; }
ninja -C build-r24 -j16 gate_cuda kvgate >"$out/logs/build.log" 2>&1 || { grep -E "error" -A3 "$out/logs/build.log" | head -60; exit 1; }
echo "built $(el)" | tee -a "$S"
G=$PWD/$(find build-r24/gates -name gate_cuda -type f | head -1)
for i in 0 1 2 3 4 5; do ( cd build-r24 && timeout 170 "$G" --shard-count 6 --shard-index $i --durations yes > "$out/logs/shard$i.txt" 2>&1; echo "shard $i rc $?: $(grep -E '^(All tests|test cases)' "$out/logs/shard$i.txt" | tail -1)" >> "$S" ) & done
( cd build-r24 && timeout 170 "$(dirname "$(which nvcc)")/compute-sanitizer" --tool memcheck --error-exitcode 9 "$G" "PAR.cuda.pp.engine*,STO.cuda.bytes_read.int8*,STO.cuda.bytes_read.q4_0*,PAR.cuda.pp.persist.int8*" > "$out/logs/memcheck.txt" 2>&1; echo "memcheck rc $?: $(grep -h 'ERROR SUMMARY' "$out/logs/memcheck.txt" | tail -1)" >> "$S" ) &
wait
echo "gates $(el)" | tee -a "$S"
grep -h -B2 -A20 "FAILED" "$out"/logs/shard*.txt | head -120 > "$out/failures.txt"
grep -h -E "^[0-9.]+ s: " "$out"/logs/shard*.txt | sort -rn | head -5 >> "$S"
M=$assets/models/stories260K
for pp in "" "--pp 2" "--pp-layers 1,3,1 --devices 0,0,0" "--tp 2"; do (cd build-r24 && timeout 60 ./kvgate run --model $M/stories260K.bin --tokenizer $M/tok512.bin --prompt "Once upon a time" --steps 40 --kv int8 --device cuda $pp --json > "$out/run_$(echo $pp | tr -c 'a-z0-9' _).json" 2>>$out/logs/run.err); echo "run '$pp' rc $?" >> "$S"; done
python3 - "$out" <<'PY' >> "$S"
import json, glob, sys
rs = {f.split("/")[-1]: json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/run_*.json"))}
for f, j in rs.items():
    st = j.get("stats", {})
    print(f, "ids", j.get("generated_ids", [])[:8], "topology", st.get("topology"), "pool", st.get("kv_pool_bytes"))
split = {f: j for f, j in rs.items() if "_tp_" not in f}  # --tp reassociates sums: ids may differ, printed
print("same ids in every unsplit/--pp run:", len({json.dumps(j.get("generated_ids")) for j in split.values()}) == 1, "runs", len(split))
PY
mut() {
  local id=$1 gate=$2
  if [ $(( $(date +%s) - t0 )) -gt "$deadline" ]; then echo "$id: not run (deadline)" >>"$S"; return; fi
  local file
  file=$(python3 - "$id" <<'PY'
import json, sys, shutil
m = next(x for x in json.load(open("mutations/catalog.json"))["mutants"] if x["id"] == sys.argv[1])
s = open(m["file"]).read(); assert s.count(m["anchor"]) == 1
r = m["replacement"]; r = "\n".join(r) if isinstance(r, list) else r
shutil.copy(m["file"], "/tmp/mut.orig"); open(m["file"], "w").write(s.replace(m["anchor"], r)); print(m["file"])
PY
)
  [ -z "$file" ] && { echo "$id: patch failed" >>"$S"; return; }
  local tb
  tb=$(date +%s)
  if ninja -C build-r24 -j16 gate_cuda >"$out/logs/m_$id.build.log" 2>&1; then
    (cd build-r24 && timeout 120 "$G" "$gate" > "$out/logs/m_$id.txt" 2>&1); local rc=$?
    echo "$id: $([ $rc != 0 ] && echo killed || echo SURVIVED) by '$gate' (rc $rc, $(( $(date +%s) - tb ))s; $(grep -m1 -o 'test cases:.*' "$out/logs/m_$id.txt"))" >>"$S"
  else echo "$id: build failed" >>"$S"; fi
  cp /tmp/mut.orig "$file"; touch "$file"
}
while IFS=$'\t' read -r id gate; do [ -n "$id" ] && mut "$id" "$gate"; done < bench/cuda/split_device_mutants.txt
echo "done $(el)" | tee -a "$S"
cat "$S"; echo; head -60 "$out/failures.txt"
tar czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$out/logs"
