#!/usr/bin/env bash
# The gate proof (`kvgate-mutate --prove-gates`, docs/MUTATIONS.md "Proving every gate") in one
# call on a many-core machine, CPU-only, ending by itself inside the call's wall limit.
#
#   scripts/prove-device.sh ASSETS OUT [extra kvgate-mutate options]
#
# ASSETS: a folder holding models/stories260K/ (stories260K.bin, tok512.bin) and xxHash (a folder
# with xxhash.h and one with libxxhash.a, anywhere below ASSETS: the header and static library of
# Debian's libxxhash-dev, for a machine without the xxhash package).
# OUT: the folder that receives at most six files: proof.json, proof.md (rewritten while the proof
# runs, so a call killed at its limit still returns the record of every finished mutant run),
# mutate.log (the driver's log: the baseline's "not green" lines name a red gate and its log),
# driver-build.log, baseline-logs.tar.gz (the baseline's gate logs) and timing.txt.
#
# Environment:
#   BUDGET_S  (default 480) seconds after the script starts by which the proof has ended by itself:
#             the driver gets --prove-deadline so that its last run starts no later than
#             BUDGET_S - LAST_RUN_S, and the script stops it (SIGTERM: the run under way is
#             discarded, the record written) at BUDGET_S + 40 if it is still running.
#   LAST_RUN_S (default 45) the room left for the mutant run under way at the deadline.
#   JOBS      (default nproc) build jobs and gate processes.
#   SEEDS     (default: the committed CPU proof, the gate_conformance proof and the mutants'
#             outcomes below bench/results) --prove-seed files, space-separated.
#   TARGETS   (default: every gate program) --gate-targets, comma-separated: only these programs
#             are built, run in the baseline and proven (the seeds keep the others' proofs).
#   REBUILD   (default 1) --prove-rebuild: once every switch candidate is tried, the
#             patch-and-rebuild mutants (e.g. the byte-accounting tables of format.cpp, which the
#             STO.bytes gates need) run too, one incremental build each, until the deadline.
#   SHARDS    (default with CUDA=1: gate_cuda=8) --gate-shards PROGRAM=N[,PROGRAM=N...]: that gate
#             program runs as N processes side by side, each a Catch2 spec for its share of the gate
#             IDs (gate_cuda's FP64 oracles keep one core busy: 142 s as one process on an H100).
#   FIRST     (default none) --prove-first ID[,ID...]: the mutants tried first, in this order (the
#             ones known to reach many open gates), before the affinity order.
#   CANARY    (default 0) 1 runs the canary first. In a proof each proven gate carries its own
#             kill (a gate a mutant could not reach stays unproven, it is never counted proven), so
#             the canary adds no proof; it costs a rebuild, a run of every gate and a rebuild back
#             (a minute or more of the budget on 16 cores), so it is off unless asked for.
#   KILL      (default none) ID[,ID...]: instead of the proof, a kill run of these mutants: each
#             patched, rebuilt and run on the gates it names in expect_killed_by (--only ...
#             --expected-gates-only; the baseline runs their union first). OUT then receives
#             outcomes.json, kill_matrix.md and mutate.log (no proof.*): the outcomes seed later proofs.
#             KILL_CATALOG (default catalog.json) names the catalog file in mutations/.
#             KILL_ALL_GATES=1 runs every gate of TARGETS on each mutant instead (for mutants
#             written apart, whose expect_killed_by names no gate).
#             BUDGET_S still bounds the call (SIGTERM at BUDGET_S + 40; outcomes.json is rewritten
#             after every mutant).
#   CUDA      (default 0) 0: no GPU is used: the scratch build is configured with -DKVGATE_CUDA=OFF
#             and the device probe is told there is none (KVGATE_MUTATE_CUDA_DEVICE=0), so the CUDA
#             mutants are listed as skipped and the CUDA gates as not provable here.
#             1: the proof of the CUDA gate programs on a machine with a device: the scratch build is
#             configured with -DKVGATE_CUDA=ON (CMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS, default
#             90a-real: one SASS per kernel TU, the shortest rebuild on H100/H200), the device is
#             probed as usual, TARGETS defaults to gate_cuda,gate_signoff_engine, and the CUDA
#             mutants (patch-and-rebuild: device code cannot read the switch) are candidates beside them.
set -uo pipefail
# The whole script is one compound command: bash parses it before running any of it, so the file
# changing under a running call (a tree synced again) cannot make it run shifted text.
{
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
assets="${1:?usage: scripts/prove-device.sh ASSETS OUT [kvgate-mutate options]}"
out="${2:?usage: scripts/prove-device.sh ASSETS OUT [kvgate-mutate options]}"
shift 2
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
budget="${BUDGET_S:-480}"
last_run="${LAST_RUN_S:-45}"
jobs="${JOBS:-$(nproc)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
assets="$(cd "$assets" && pwd)"
drv="$root/build-prove-drv"
work="${PROVE_WORK:-/tmp/kvgate-prove.out}"
timing="$out/timing.txt"
: >"$timing"
note() { echo "$*"; echo "$(elapsed)s $*" >>"$timing"; }

note "machine: $(nproc) cores, jobs $jobs, budget ${budget}s; $(uname -m); git: $(command -v git || echo none)"

models="$assets/models"
if [ ! -f "$models/stories260K/stories260K.bin" ]; then
  echo "prove-device: $models/stories260K/stories260K.bin is missing (ASSETS must hold models/stories260K/)"
  exit 1
fi
xxh_h="$(find "$assets" -name xxhash.h -print -quit)"
xxh_a="$(find "$assets" -name libxxhash.a -print -quit)"
cxx_flags="" ld_flags=""
if [ -n "$xxh_h" ]; then
  # runtime/CMakeLists.txt links `xxhash` by name and includes <xxhash.h>: point the compiler and
  # the linker at the carried copies. XXH_INLINE_ALL makes the header self-contained.
  cxx_flags="-I$(dirname "$xxh_h") -DXXH_INLINE_ALL"
  [ -n "$xxh_a" ] && ld_flags="-L$(dirname "$xxh_a")"
  note "xxhash: $xxh_h${xxh_a:+, $xxh_a}"
elif [ ! -f /usr/include/xxhash.h ]; then
  echo "prove-device: no xxhash.h below $assets and none in /usr/include"
  exit 1
fi
cuda="${CUDA:-0}"
cmake_flags=(-DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=OFF -DKVGATE_BUILD_BENCH=OFF)
[ -n "$cxx_flags" ] && cmake_flags+=("-DCMAKE_CXX_FLAGS=$cxx_flags")
[ -n "$ld_flags" ] && cmake_flags+=("-DCMAKE_EXE_LINKER_FLAGS=$ld_flags" "-DCMAKE_SHARED_LINKER_FLAGS=$ld_flags")

export KVGATE_MODELS="$models"
if [ "$cuda" = 1 ]; then
  note "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1); $(nvcc --version 2>/dev/null | tail -1)"
  TARGETS="${TARGETS:-gate_cuda,gate_signoff_engine}"
else
  export KVGATE_MUTATE_CUDA_DEVICE=0 CUDA_VISIBLE_DEVICES=
fi

# 1. The driver alone (cli/kvgate_mutate.cpp, ~20 TUs).
if ! { cmake -S "$root" -B "$drv" -G Ninja "${cmake_flags[@]}" && ninja -C "$drv" -j "$jobs" kvgate_mutate; } \
    >"$out/driver-build.log" 2>&1; then
  tail -40 "$out/driver-build.log"
  echo "prove-device: building the driver failed ($out/driver-build.log)"
  exit 1
fi
note "driver built"

seeds=()
for f in ${SEEDS:-$root/bench/results/gate_proof_cpu_partial.json $root/bench/results/gate_proof_conformance.json $root/bench/results/gate_proof_parity.json $root/bench/results/gate_proof_scales.json $root/bench/results/gate_proof_resolve.json $root/bench/results/gate_proof_storage.json $root/bench/results/gate_proof_invariance.json $root/bench/results/gate_proof_mutants_outcomes.json $root/bench/results/gate_proof_paths_outcomes.json $root/bench/results/gate_proof_resolve_outcomes.json $root/bench/results/gate_proof_invariance_outcomes.json $root/bench/results/gate_proof_kill9_outcomes.json $root/bench/results/gate_proof_weights_outcomes.json $root/bench/results/gate_proof_open_h10_outcomes.json $root/bench/results/gate_proof_model_level_h10.json $root/bench/results/gate_proof_model_level_h10b.json $root/bench/results/gate_proof_model_level_h10c.json $root/bench/results/gate_proof_tool_h10_outcomes.json $root/bench/results/gate_proof_halflevels_h10_outcomes.json $root/bench/results/gate_proof_lock_h10_outcomes.json}; do
  if [ -f "$f" ]; then seeds+=(--prove-seed "$f"); else note "seed not found: $f"; fi
done
kill="${KILL:-}"
if [ -n "$kill" ]; then
  # A kill run reads one catalog (the driver joins catalogs only for a proof).
  args=(--source-dir "$root" --only "$kill" --skip-red-gates -j "$jobs"
        --catalog "$root/mutations/${KILL_CATALOG:-catalog.json}")
  [ "${KILL_ALL_GATES:-0}" = 1 ] || args+=(--expected-gates-only)
else
  args=(--source-dir "$root" --prove-gates --skip-red-gates -j "$jobs"
        --catalog "$root/mutations/catalog.json" --catalog "$root/mutations/adversarial.json"
        --catalog "$root/mutations/adversarial2.json" --catalog "$root/mutations/adversarial3.json")
fi
args+=(--cmake-arg -DKVGATE_BUILD_BENCH=OFF)
if [ "$cuda" = 1 ]; then
  args+=(--cmake-arg -DKVGATE_CUDA=ON --cmake-arg "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-90a-real}")
  # Without ccache a revert recompiles the kernel TUs again: put the baseline objects back instead.
  command -v ccache >/dev/null || args+=(--restore-objects)
else
  args+=(--cmake-arg -DKVGATE_CUDA=OFF)
fi
[ -n "$cxx_flags" ] && args+=(--cmake-arg "-DCMAKE_CXX_FLAGS=$cxx_flags")
[ -n "$ld_flags" ] && args+=(--cmake-arg "-DCMAKE_EXE_LINKER_FLAGS=$ld_flags" --cmake-arg "-DCMAKE_SHARED_LINKER_FLAGS=$ld_flags")
[ "${CANARY:-0}" = 1 ] || args+=(--no-canary)
[ "${REBUILD:-1}" = 1 ] && [ -z "$kill" ] && args+=(--prove-rebuild)
[ -n "${TARGETS:-}" ] && args+=(--gate-targets "$TARGETS")
shards="${SHARDS:-}"
[ -z "$shards" ] && [ "$cuda" = 1 ] && shards="gate_cuda=8"
IFS=',' read -r -a shard_list <<<"$shards"
for sh in "${shard_list[@]}"; do [ -n "$sh" ] && args+=(--gate-shards "$sh"); done
[ -n "${FIRST:-}" ] && [ -z "$kill" ] && args+=(--prove-first "$FIRST")
[ -n "$kill" ] && seeds=()  # a kill run starts from nothing: it measures, it does not resume

# 2. The proof. --prove-deadline counts from the driver's start.
deadline=$(( budget - last_run - $(elapsed) ))
[ "$deadline" -lt 1 ] && deadline=1
hard=$(( budget + 40 - $(elapsed) ))
rm -rf "$work"
mkdir -p "$work"
deadline_args=(--prove-deadline "$deadline")
[ -n "$kill" ] && deadline_args=()
note "${kill:+kill run of $kill; }proof: --prove-deadline ${deadline}s, SIGTERM after ${hard}s"

# proof.json / proof.md into OUT while it runs (each copy atomic: a temp name, then a rename).
copy_record() {
  for f in proof.json proof.md outcomes.json kill_matrix.md; do
    [ -f "$work/$f" ] && cp -f "$work/$f" "$out/.$f.tmp" 2>/dev/null && mv -f "$out/.$f.tmp" "$out/$f"
  done
}
( while sleep 5; do copy_record; done ) &
copier=$!

timeout --signal=TERM --kill-after=15 "$hard" \
  "$drv/kvgate-mutate" "${args[@]}" "${seeds[@]}" "${deadline_args[@]}" --out "$work" "$@" 2>&1 |
  tee "$out/mutate.log"
rc=${PIPESTATUS[0]}
kill "$copier" 2>/dev/null
wait "$copier" 2>/dev/null
copy_record
note "driver exit $rc"

# 3. The baseline's gate logs (the red gate's output when the baseline is red).
if [ -d "$work/baseline" ]; then
  tar -C "$work" -czf "$out/baseline-logs.tar.gz" --exclude='*.xml' baseline 2>/dev/null
  if [ "$(stat -c %s "$out/baseline-logs.tar.gz" 2>/dev/null || echo 0)" -gt 15000000 ]; then
    tar -C "$work" -czf "$out/baseline-logs.tar.gz" --exclude='*.xml' --exclude='build*.log' baseline 2>/dev/null
  fi
fi
if [ -n "$kill" ] && [ -f "$out/outcomes.json" ]; then
  python3 - "$out/outcomes.json" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
print("kill run:", json.dumps(d.get("summary", {})))
for m in d.get("mutants", []):
    print(f"  {m.get('id')}: {m.get('status')} by {', '.join(m.get('killed_by', []) or []) or '-'}")
PY
elif [ -f "$out/proof.md" ]; then
  sed -n '1,/^## Unproven/p' "$out/proof.md"
  grep -m 60 '^- \*\*' "$out/proof.md"
else
  echo "(no proof.md: the driver stopped before the proof loop; see mutate.log)"
  grep -E "not green|RED|error|failed" "$out/mutate.log" | head -40
fi
note "done"
exit "$rc"
}
