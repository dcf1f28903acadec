#!/usr/bin/env bash
# The GPU mutation run in one call (docs/MUTATIONS.md "GPU mutants"): on a machine with a CUDA
# device, build the driver, then run every catalog mutant that `requires: cuda-device` against the
# GPU gates that must kill it, and print the kill table.
#
#   scripts/mutate-gpu.sh OUT_DIR [extra kvgate mutate options, e.g. --only ID,ID]
#
# Environment: JOBS (default: nproc) build jobs and gate processes; REQUIRES (default cuda-device)
# the requirement kinds selected, comma-separated (cuda,cuda-device: also the mutants that need only
# a CUDA build, e.g. the capability table); GATE_TARGETS (default gate_cuda)
# the gate executables to build and run, comma-separated (the KV damage mutants: gate_signoff_engine);
# KVGATE_MODELS the folder holding stories260K/ (the MOD.cuda gates; without it the model mutant is left out); BUDGET_S (default 570) the
# wall-clock budget of the whole script -- the driver gets SIGTERM when it runs out, restores the
# scratch copy and writes what it measured (exit 130); DRIVER_BUILD (default build-mutgpu-drv) the
# CPU-only build of the driver; XXHASH_DIR a folder with include/xxhash.h (and lib/libxxhash.a) for a
# GPU machine without the xxhash package (the lent H200 has none and no network: carry Debian's
# /usr/include/xxhash.h and libxxhash.a; the runtime then uses xxHash inline, XXH_INLINE_ALL);
# CUDA_ARCHS (default: the project's, 90a-real + 90-virtual) CMAKE_CUDA_ARCHITECTURES of the mutant
# build: 90a-real alone compiles each kernel TU once (SASS, no PTX), which shortens every rebuild.
#
# What runs (and why it fits a 10-minute device call):
#  1. kvgate-mutate: the driver alone (cli/kvgate_mutate.cpp), a CPU-only build of ~10 TUs.
#  2. kvgate-mutate --only-requires cuda-device: the device is probed (nvidia-smi -L); the scratch
#     copy (.scratch/mutants) is configured with -DKVGATE_CUDA=ON and only gate_cuda is built;
#     --expected-gates-only runs, per mutant, only the gate IDs it names in expect_killed_by (the
#     baseline and the canary: their union); --restore-objects puts the baseline objects back after
#     each mutant, so a decode-kernel header costs one recompile of its 9 TUs, not two (no ccache);
#     --skip-red-gates: a GPU gate red in the baseline (a gate not yet green on a device) costs only
#     the mutants that need it (reported, exit 4), not the whole call.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:?usage: scripts/mutate-gpu.sh OUT_DIR [kvgate mutate options]}"
shift
jobs="${JOBS:-$(nproc)}"
requires="${REQUIRES:-cuda-device}"
budget="${BUDGET_S:-570}"
drv="${DRIVER_BUILD:-$root/build-mutgpu-drv}"
t0=$(date +%s)
mkdir -p "$out"
out="$(cd "$out" && pwd)"

echo "== machine: $(nproc) cores, jobs $jobs, budget ${budget}s"
nvidia-smi -L 2>&1 | head -4 || true
nvcc --version 2>/dev/null | tail -1 || true
command -v ccache >/dev/null && echo "ccache: $(command -v ccache)" || echo "ccache: none (--restore-objects covers the reverts)"

echo "== 1. driver (CPU-only build of kvgate-mutate in $drv)"
if ! cmake -S "$root" -B "$drv" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=OFF -DKVGATE_BUILD_BENCH=OFF \
    >"$out/driver-configure.log" 2>&1; then
  tail -40 "$out/driver-configure.log"
  echo "mutate-gpu: configuring the driver failed ($out/driver-configure.log)"
  exit 1
fi
if ! ninja -C "$drv" -j "$jobs" kvgate_mutate >"$out/driver-build.log" 2>&1; then
  tail -40 "$out/driver-build.log"
  echo "mutate-gpu: building the driver failed ($out/driver-build.log)"
  exit 1
fi
echo "driver built in $(( $(date +%s) - t0 ))s"

# Which device mutants can run: a STALE anchor (a kernel file changed under the catalog) would stop
# the whole run (exit 5), and the MOD.cuda and engine PAR.cuda gates need stories260K; leave those out, saying why.
# Extra arguments (e.g. --only) replace this selection.
if [ $# -eq 0 ]; then
  models="${KVGATE_MODELS:-$root/../shared/models}"
  ids=""
  while read -r id _cat _file status rest; do
    wanted=0
    for kind in ${requires//,/ }; do
      case "$rest" in *"(requires $kind)"*) wanted=1 ;; esac
    done
    [ "$wanted" = 1 ] || continue
    if [ "$status" != ok ]; then
      echo "not run: $id (anchor $status: its file changed; refresh the catalog record)"
      continue
    fi
    case "$rest" in MOD.*|*,MOD.*|PAR.cuda.persist.*|*,PAR.cuda.persist.*|PAR.cuda.engine_stream.*|*,PAR.cuda.engine_stream.*)
      if [ ! -f "$models/stories260K/stories260K.bin" ]; then
        echo "not run: $id (its MOD.cuda / PAR.cuda engine gates need stories260K: set KVGATE_MODELS to a folder holding stories260K/)"
        continue
      fi ;;
    esac
    ids="$ids${ids:+,}$id"
  done < <("$drv/kvgate-mutate" --source-dir "$root" --list 2>&1)
  if [ -z "$ids" ]; then
    echo "mutate-gpu: no device mutant can run"
    exit 1
  fi
  set -- --only "$ids"
fi

xx=()
if [ -n "${XXHASH_DIR:-}" ]; then
  xx=(--cmake-arg "-DCMAKE_CXX_FLAGS=-I$XXHASH_DIR/include -DXXH_INLINE_ALL" --cmake-arg "-DCMAKE_EXE_LINKER_FLAGS=-L$XXHASH_DIR/lib")
  echo "xxhash from $XXHASH_DIR (inline)"
fi
if [ -n "${CUDA_ARCHS:-}" ]; then
  xx+=(--cmake-arg "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS")
  echo "CUDA architectures: $CUDA_ARCHS"
fi

left=$(( budget - ($(date +%s) - t0) ))
echo "== 2. kvgate-mutate --only-requires $requires (${left}s left)"
timeout --signal=TERM --kill-after=30 "$left" \
  "$drv/kvgate-mutate" --source-dir "$root" --only-requires "$requires" --expected-gates-only --restore-objects --skip-red-gates \
  --gate-targets "${GATE_TARGETS:-gate_cuda}" --jobs "$jobs" --min-timeout 60 --cmake-arg -DKVGATE_CUDA=ON --cmake-arg -DKVGATE_BUILD_BENCH=OFF \
  "${xx[@]}" --out "$out" "$@" 2>&1 | tee "$out/mutate.log"
rc=${PIPESTATUS[0]}

echo "== 3. kill table ($out/kill_matrix.md, exit $rc, $(( $(date +%s) - t0 ))s in all)"
if [ -f "$out/kill_matrix.md" ]; then
  sed -n '3,5p' "$out/kill_matrix.md"
  sed -n '/^## \(Problems\|Skipped\)/,/^## Matrix/p' "$out/kill_matrix.md" | sed '$d'
  sed -n '/^## Mutants/,/^## Gates/p' "$out/kill_matrix.md" | sed '$d'
elif [ -f "$out/outcomes.json" ]; then
  echo "(no kill_matrix.md: the run was cut short; outcomes.json has the mutants measured so far)"
  grep -E '"(id|status|killed_by)"' "$out/outcomes.json" | head -80
fi
exit "$rc"
