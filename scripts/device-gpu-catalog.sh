#!/usr/bin/env bash
# The GPU part of every catalog on one GPU machine, detached from the calling shell so that it can
# outlive one device call (docs/MUTATIONS.md "GPU mutants"):
#
#   scripts/device-gpu-catalog.sh start ASSETS WORK   start it (setsid, nohup); returns at once
#   scripts/device-gpu-catalog.sh wait WORK SECONDS [OUT]
#                                                     print the log as it grows until it ends or
#                                                     SECONDS pass; then copy the results to OUT
#
# The detached run lives only as long as the machine: one given back between two calls (idle past
# its release time) loses it, and `wait` then says so at once.
# ASSETS: a folder holding models/stories260K/ and xxhash/{include/xxhash.h,lib/libxxhash.a} (the
# lent H200 has no xxhash package). WORK: where the run writes (outside the tree: a tree synced
# again between calls must not touch it).
# The steps, in order, each with what is left of TOTAL_S (default 1500 s):
#  1. catalog.json: every mutant that requires a CUDA build or a CUDA device, against the gates it
#     names (scripts/mutate-gpu.sh, REQUIRES=cuda,cuda-device; gate_cuda, gate_signoff_engine and
#     gate_cli). ONLY=ID,ID,... runs just those (the ones an earlier call did not reach).
#  2. adversarial2.json's CUDA mutants. They were written apart and name no gate
#     (UNKNOWN.written_apart), so they run against every gate_cuda oracle and parity gate of the
#     kernels they mutate (the decode, windowed-decode and store families, listed from the built
#     gate_cuda): a kill there is a kill; "survived" would mean only those families missed it.
set -uo pipefail
{
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="${1:?usage: device-gpu-catalog.sh start ASSETS WORK | wait WORK SECONDS [OUT]}"

if [ "$cmd" = start ]; then
  assets="$(cd "${2:?ASSETS}" && pwd)"
  work="${3:?WORK}"
  mkdir -p "$work"
  work="$(cd "$work" && pwd)"
  rm -f "$work/done" "$work/rc"
  setsid nohup bash "$0" run "$assets" "$work" >"$work/log.txt" 2>&1 </dev/null &
  echo "started (pid $!): $work/log.txt"
  exit 0
fi

if [ "$cmd" = wait ]; then
  work="${2:?WORK}"
  secs="${3:?SECONDS}"
  out="${4:-}"
  if [ ! -d "$work" ]; then
    # A machine given back between calls keeps nothing: the run is gone, do not wait for it.
    echo "== $work does not exist: this machine did not start the run (a fresh machine?)"
    exit 1
  fi
  t0=$(date +%s)
  shown=0
  while :; do
    if [ -f "$work/log.txt" ]; then
      n=$(wc -l <"$work/log.txt")
      [ "$n" -gt "$shown" ] && sed -n "$((shown + 1)),${n}p" "$work/log.txt" | cut -c1-300
      shown=$n
    fi
    [ -f "$work/done" ] && break
    [ $(( $(date +%s) - t0 )) -ge "$secs" ] && break
    sleep 5
  done
  if [ -f "$work/done" ]; then echo "== ended: rc $(cat "$work/rc" 2>/dev/null)"; else echo "== still running"; fi
  if [ -n "$out" ]; then
    mkdir -p "$out"
    for d in catalog adv2; do
      [ -d "$work/$d" ] || continue
      mkdir -p "$out/$d"
      for f in outcomes.json kill_matrix.md kill_matrix.csv mutate.log; do
        [ -f "$work/$d/$f" ] && cp "$work/$d/$f" "$out/$d/"
      done
    done
    cp "$work/log.txt" "$work/adv2-catalog.json" "$out/" 2>/dev/null
  fi
  exit 0
fi

[ "$cmd" = run ] || { echo "device-gpu-catalog.sh: unknown command '$cmd'"; exit 2; }
assets="$2"
work="$3"
total="${TOTAL_S:-1500}"
t0=$(date +%s)
left() { echo $(( total - ($(date +%s) - t0) )); }
export XXHASH_DIR="$assets/xxhash" KVGATE_MODELS="$assets/models" JOBS="${JOBS:-$(nproc)}"

echo "== 1. catalog.json, CUDA mutants ($(left)s left)"
REQUIRES=cuda,cuda-device GATE_TARGETS=gate_cuda,gate_signoff_engine,gate_cli BUDGET_S="$(left)" \
  "$root/scripts/mutate-gpu.sh" "$work/catalog" ${ONLY:+--only "$ONLY"}
rc1=$?
echo "== step 1 exit $rc1"

echo "== 2. adversarial2.json, CUDA mutants ($(left)s left)"
gate_cuda="$root/.scratch/mutants/build/gates/gate_cuda"
if [ -x "$gate_cuda" ] && [ "$(left)" -gt 120 ]; then
  # Catch2 3 lists names with "--list-tests -v quiet", Catch2 2 with --list-test-names-only.
  "$gate_cuda" --list-tests -v quiet >"$work/gate_cuda_tests.txt" 2>/dev/null ||
    "$gate_cuda" --list-test-names-only >"$work/gate_cuda_tests.txt" 2>/dev/null || true
  python3 - "$root/mutations/adversarial2.json" "$work/gate_cuda_tests.txt" "$work/adv2-catalog.json" <<'PY'
import json, sys
cat = json.load(open(sys.argv[1]))
names = [l.strip() for l in open(sys.argv[2]) if l.strip()]
ids = sorted({n.split(" ")[0] for n in names})
fams = ("ORA.cuda.decode.", "ORA.cuda.decode_window.", "ORA.cuda.store.", "PAR.cuda.decode.")
gates = [i for i in ids if i.startswith(fams)]
if not gates:
    sys.exit("no gate_cuda decode/store gate listed: " + sys.argv[2])
keep = []
for m in cat["mutants"]:
    if m["id"].startswith("CANARY.") or m.get("requires"):
        if m.get("requires"):
            m["expect_killed_by"] = gates
        keep.append(m)
cat["mutants"] = keep
cat["description"] = ("Generated on the device from mutations/adversarial2.json: its CUDA mutants, each run against "
                      "every gate_cuda decode/windowed-decode/store gate (they were written apart and name none).")
json.dump(cat, open(sys.argv[3], "w"), indent=2)
print(len(keep) - 1, "mutants,", len(gates), "gates")
PY
  REQUIRES=cuda-device GATE_TARGETS=gate_cuda BUDGET_S="$(left)" \
    "$root/scripts/mutate-gpu.sh" "$work/adv2" --catalog "$work/adv2-catalog.json"
  rc2=$?
  echo "== step 2 exit $rc2"
else
  echo "== step 2 not run: no gate_cuda at $gate_cuda or under 120 s left"
fi
echo "$rc1" >"$work/rc"
touch "$work/done"
}
