#!/bin/bash
# The CUDA engine's KV damage (probe sensitivity on the GPU, docs/CUDA.md "KV damage") in one device
# call: build gate_signoff_engine with -DKVGATE_CUDA=ON, run its gates (the [cuda] SGN.cuda.damage.*
# and SGN.cuda.sensitivity.probes_red first, then the whole program: the CPU gates and
# SGN.cuda.quality.paths_agree), memcheck on the damage gates. From the repository root:
#
#   XXHASH_DIR=gpu_assets/xxhash KVGATE_MODELS=shared/models JOBS=16 bench/cuda/damage_device_run.sh OUT_DIR
#
# XXHASH_DIR: a folder with include/xxhash.h and lib/libxxhash.a (a machine without the package);
# KVGATE_MODELS: the folder holding stories260K/. The eight damage mutants are a second call:
#   GATE_TARGETS=gate_signoff_engine XXHASH_DIR=... KVGATE_MODELS=... scripts/mutate-gpu.sh OUT2 --only <ids>
OUT=${1:?usage: bench/cuda/damage_device_run.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KVGATE_SOURCE_DIR=$PWD
if [ -n "${KVGATE_MODELS:-}" ]; then KVGATE_MODELS=$(cd "$KVGATE_MODELS" && pwd); export KVGATE_MODELS; fi
J=${JOBS:-$(nproc)}
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }
XX=()
[ -n "${XXHASH_DIR:-}" ] && XXHASH_DIR=$(cd "$XXHASH_DIR" && pwd) &&
  XX=("-DCMAKE_CXX_FLAGS=-I$XXHASH_DIR/include -DXXH_INLINE_ALL" "-DCMAKE_EXE_LINKER_FLAGS=-L$XXHASH_DIR/lib")
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; } | tee "$OUT/device.txt"
echo "== build $(el)"
cmake -S . -B build-h200 -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON -DKVGATE_BUILD_BENCH=OFF "${XX[@]}" \
  > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
ninja -C build-h200 -j "$J" gate_signoff_engine > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
G=build-h200/gates/gate_signoff_engine
echo "== [cuda] damage gates $(el)"
timeout 240 $G "SGN.cuda.damage.*,SGN.cuda.sensitivity.*" --durations yes > "$OUT/gate_damage.log" 2>&1; echo "gate rc=$?"
grep -E "test cases|assertions" "$OUT/gate_damage.log" | tail -2
grep -E "worst|pages compared| on cuda: |SKIPPED" "$OUT/gate_damage.log" | cut -c1-300 | head -40
grep -B3 -A20 "FAILED:" "$OUT/gate_damage.log" | head -100
echo "== memcheck (pages, changes) $(el)"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $G "SGN.cuda.damage.pages*,SGN.cuda.damage.changes*" > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?"
grep -E "ERROR SUMMARY|test cases" "$OUT/memcheck.log"
echo "== gate_signoff_engine (all) $(el)"
timeout 240 $G --durations yes > "$OUT/gate_signoff_engine.log" 2>&1; echo "gate rc=$?"
grep -E "test cases|assertions" "$OUT/gate_signoff_engine.log" | tail -2
grep -B3 -A20 "FAILED:" "$OUT/gate_signoff_engine.log" | head -60
echo "== done $(el)"
