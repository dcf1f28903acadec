#!/bin/bash
# GPU mutants by hand, the way the driver runs one, for a device call too short for the driver's
# scratch CUDA build: configure + build gate_cuda once, then per mutant ID (mutations/catalog.json):
# patch its anchor in place, rebuild gate_cuda incrementally, run the gates it names as the filter
# (red = killed), restore the file; at the end rebuild and rerun two weight gates on the restored tree.
#   scripts/mutate-gpu-by-hand.sh ASSETS OUT ID [ID...]   (ASSETS: xxhash/{include,lib}, models/)
set -u
A=$(cd "${1:?assets}" && pwd); OUT=${2:?out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); shift 2
export PATH=/usr/local/cuda/bin:$PATH KVGATE_MODELS=$A/models
T0=$(date +%s); el() { echo "[+$(($(date +%s) - T0))s]"; }
B=build-cm
timeout 60 cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON -DKVGATE_BUILD_BENCH=OFF "-DCMAKE_CXX_FLAGS=-I$A/xxhash/include -DXXH_INLINE_ALL" "-DCMAKE_EXE_LINKER_FLAGS=-L$A/xxhash/lib" > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "$(el) build"
timeout 300 cmake --build $B -j16 --target gate_cuda >> "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head; exit 1; }
for id in "$@"; do
  python3 - "$id" > "$OUT/$id.patch.txt" <<'PY'
import json, sys, shutil
mid = sys.argv[1]
m = [x for x in json.load(open('mutations/catalog.json'))['mutants'] if x['id'] == mid][0]
anchor = m['anchor'] if isinstance(m['anchor'], str) else '\n'.join(m['anchor'])
rep = m['replacement'] if isinstance(m['replacement'], str) else '\n'.join(m['replacement'])
s = open(m['file']).read()
assert s.count(anchor) == 1, 'anchor count %d' % s.count(anchor)
shutil.copy(m['file'], '/tmp/restore.src')
open('/tmp/restore.dst', 'w').write(m['file'])
open(m['file'], 'w').write(s.replace(anchor, rep))
print(m['file'], ' '.join(m['expect_killed_by']))
PY
  read -r _ gates < "$OUT/$id.patch.txt"
  filt=$(echo "$gates" | sed 's/ /*,/g')'*'
  if timeout 200 cmake --build $B -j16 --target gate_cuda > "$OUT/$id.build.log" 2>&1; then
    timeout 120 $B/gates/gate_cuda "$filt" > "$OUT/$id.gate.txt" 2>&1; rc=$?
    [ $rc -ne 0 ] && r=killed || r=SURVIVED
  else r=unviable; fi
  cp /tmp/restore.src "$(cat /tmp/restore.dst)"
  echo "$(el) $id: $r (gates $filt)" | tee -a "$OUT/summary.txt"
done
timeout 200 cmake --build $B -j16 --target gate_cuda > "$OUT/restore.build.log" 2>&1
timeout 60 $B/gates/gate_cuda "STO.cuda.weights_as_stored*,STO.cuda.weights_bf16*" > "$OUT/baseline_after.txt" 2>&1; echo "$(el) baseline after restore rc=$?" | tee -a "$OUT/summary.txt"
