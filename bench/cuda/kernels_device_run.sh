#!/bin/bash
# One device call for the kernel work (docs/CUDA.md "Kernel structure"): build gate_cuda and
# kernel_digest with CUDA, the same digest from a base tree (BASE_TGZ: `git archive` of the
# revision to compare with), the diff of the two listings (bit identity of every decode/prefill
# output), every GPU gate (in the background), and the GPU mutants given in MUTANTS, each patched
# by hand from mutations/catalog.json, rebuilt incrementally and run against its expected killers.
#   bench/cuda/kernels_device_run.sh ASSETS OUT   (ASSETS: xxhash/, models/, base.tgz)
# Environment: MUTANTS ("ID|killer,killer[|objects to force-rebuild] ..."), MUT_DEADLINE (s after
# which no mutant starts), GATE_FILTER / GATE_T (the background gate run), RACECHECK=1 (also the
# opt-in STO.cuda.prefill_mma.racecheck), JOBS / BASE_JOBS (build parallelism).
set -u
A=${1:?assets folder}; OUT=${2:?output folder}; R=$OUT/r; mkdir -p "$R"
exec > >(tee "$R/run.log") 2>&1
export KVGATE_MODELS=$A/models KVGATE_SOURCE_DIR=$PWD PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }
FL=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON "-DCMAKE_CXX_FLAGS=-I$A/xxhash/include -DXXH_INLINE_ALL"
    "-DCMAKE_EXE_LINKER_FLAGS=-L$A/xxhash/lib")
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1
  compute-sanitizer --version | tail -1; } | tee "$R/device.txt"
OLD=/tmp/kvgate_base
if [ -f "${BASE_TGZ:-$A/base.tgz}" ]; then
  rm -rf $OLD; mkdir -p $OLD; tar xzf "${BASE_TGZ:-$A/base.tgz}" -C $OLD; [ -e $OLD/datasets ] || ln -s "$PWD/datasets" $OLD/datasets
  cp bench/cuda/kernel_digest.cpp $OLD/bench/cuda/
  grep -q kernel_digest $OLD/bench/cuda/CMakeLists.txt || grep -A3 "^# Bit-exact fingerprint" bench/cuda/CMakeLists.txt >> $OLD/bench/cuda/CMakeLists.txt
  ( cmake -S $OLD -B $OLD/b "${FL[@]}" > "$R/base_cfg.log" 2>&1 && timeout 400 cmake --build $OLD/b -j${BASE_JOBS:-6} \
      --target kernel_digest > "$R/base_build.log" 2>&1; echo "base build rc=$? $(el)"
    $OLD/b/bench/kernel_digest --out "$R/digest_base.txt"; echo "base digest rc=$? $(el)" ) &
  BPID=$!
fi
echo "== configure+build $(el)"
cmake -S . -B build-gpu "${FL[@]}" > "$R/cfg.log" 2>&1 || tail -20 "$R/cfg.log"
timeout 400 cmake --build build-gpu -j${JOBS:-12} --target gate_cuda kernel_digest > "$R/build.log" 2>&1; echo "build rc=$? $(el)"
grep -E "error|FAILED" "$R/build.log" | head -20
echo "== digest $(el)"
build-gpu/bench/kernel_digest --out "$R/digest_new.txt"; echo "digest rc=$?"
if [ -n "${RACECHECK:-}" ]; then
  timeout 300 build-gpu/gates/gate_cuda "STO.cuda.prefill_mma.racecheck*" > "$R/racecheck.log" 2>&1
  echo "racecheck rc=$? $(el)"; grep -E "test cases|All tests passed|RACECHECK SUMMARY" "$R/racecheck.log" | head -3
fi
echo "== gate_cuda (all, background) $(el)"
cp build-gpu/gates/gate_cuda /tmp/gate_cuda_all
( cd "$PWD" && timeout ${GATE_T:-300} /tmp/gate_cuda_all ${GATE_FILTER:-} --durations yes > "$R/gate_cuda.log" 2>&1; echo "gate rc=$?" > "$R/gate_rc.txt" ) &
GPID=$!
# ---- mutants: id|expected killers (comma-separated test IDs)|objects to force-rebuild (optional)
mutant() {
  local id=$1 killers=$2 objs=${3:-}
  local file; file=$(python3 - "$id" <<'PY'
import json, sys
c = json.load(open("mutations/catalog.json")); ms = c["mutants"] if isinstance(c, dict) else c
m = next(m for m in ms if m["id"] == sys.argv[1])
j = lambda x: x if isinstance(x, str) else "\n".join(x)
s = open(m["file"]).read(); a, r = j(m["anchor"]), j(m["replacement"])
assert s.count(a) == 1, "anchor not found once"
open("/tmp/mut_backup", "w").write(s); open(m["file"], "w").write(s.replace(a, r)); print(m["file"])
PY
) || { echo "MUTANT $id: apply failed"; return; }
  if [ -n "$objs" ]; then  # header mutant instantiated in these objects only: keep the header's mtime, drop them
    touch -r /tmp/mut_orig_mtime_ref "$file" 2>/dev/null; for o in $objs; do rm -f "build-gpu/$o"; done
  fi
  local t
  t=$(date +%s)
  timeout 300 cmake --build build-gpu -j16 --target gate_cuda > "$R/mut_$id.build.log" 2>&1; local brc=$?
  local res="" killed=0
  for k in ${killers//,/ }; do
    timeout 240 build-gpu/gates/gate_cuda "$k*" > "$R/mut_$id.$k.log" 2>&1; local rc=$?
    res="$res $k=rc$rc"; [ $rc -ne 0 ] && killed=1
  done
  cp /tmp/mut_backup "$file"; [ -n "$objs" ] && { touch -r /tmp/mut_orig_mtime_ref "$file"; for o in $objs; do rm -f "build-gpu/$o"; done; }
  echo "MUTANT $id build_rc=$brc $([ $killed = 1 ] && echo KILLED || echo SURVIVED):$res ($(( $(date +%s) - t ))s) $(el)"
}
for spec in ${MUTANTS:-}; do
  IFS='|' read -r id killers objs <<< "$spec"
  [ $(( $(date +%s) - T0 )) -gt ${MUT_DEADLINE:-100000} ] && { echo "MUTANT $id not run: past MUT_DEADLINE $(el)"; continue; }
  f=$(python3 -c "import json,sys;c=json.load(open('mutations/catalog.json'));ms=c['mutants'] if isinstance(c,dict) else c;print(next(m['file'] for m in ms if m['id']==sys.argv[1]))" "$id")
  touch -r "$f" /tmp/mut_orig_mtime_ref
  mutant "$id" "$killers" "${objs//,/ }"
done
if [ -n "${BPID:-}" ]; then
  echo "== waiting for the base digest $(el)"; wait $BPID
  echo "lines: $(wc -l < "$R/digest_new.txt") new, $(wc -l < "$R/digest_base.txt") base; differing: $(diff "$R/digest_base.txt" "$R/digest_new.txt" | grep -c '^>')"
  diff "$R/digest_base.txt" "$R/digest_new.txt" | head -20
fi
echo "== waiting for gate_cuda $(el)"
wait $GPID; cat "$R/gate_rc.txt"
grep -E "test cases|assertions" "$R/gate_cuda.log" | tail -2
grep -E "^[0-9.]+ s: " "$R/gate_cuda.log" | sort -rn | head -6
grep -B3 -A14 "FAILED:" "$R/gate_cuda.log" | head -120
echo "== done $(el)"
cd "$OUT" && tar czf results.tgz r && rm -rf r
