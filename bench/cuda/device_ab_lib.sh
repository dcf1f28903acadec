# shellcheck shell=bash
# Sourced by the A/B device-run scripts of bench/cuda (combine_ab_device_run.sh,
# decode_ab_device_run.sh), from the repository root, after they set A (the assets folder, absolute),
# R (the log folder) and B (the build folder):
#   el              the seconds since sourcing, for the progress lines;
#   device_build    prints the device, configures B (CUDA for sm_90a, benchmarks on, xxHash from
#                   A/xxhash inline) and builds gate_cuda and bench_decode_attn (and EXTRA_TARGETS);
#                   sets G and BD (their paths below the repository root) and keeps a copy of the
#                   benchmark as /tmp/bench_decode_head; on a failed build prints the errors and
#                   exits (OUT/r.tgz holds the log);
#   device_mutant ID [REBUILD]  applies the catalog's anchor -> replacement of mutant ID to its
#                   file, rebuilds gate_cuda, runs each gate the mutant must be killed by, restores
#                   the file and (REBUILD 1, the default) rebuilds again, so a later step never runs
#                   the mutant's binary; REBUILD 0 leaves that to the caller (a run of mutants
#                   rebuilds once after the last: each mutant's own build starts from the restored
#                   file), and prints KILLED or SURVIVED;
#   device_sanitize MEMCHECK RACECHECK  compute-sanitizer memcheck over the Catch2 filter MEMCHECK and
#                   racecheck over RACECHECK, on gate_cuda (logs R/memcheck_decode.txt,
#                   R/racecheck_decode.txt), printing each tool's summary.
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0))s]"; }
device_build() {
  local xx=("-DCMAKE_CXX_FLAGS=-I$A/xxhash/include -DXXH_INLINE_ALL" "-DCMAKE_EXE_LINKER_FLAGS=-L$A/xxhash/lib")
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; } | tee "$R/device.txt"
  echo "== build gate_cuda + bench_decode_attn $(el)"
  # shellcheck disable=SC2086  # EXTRA_TARGETS: a list of ninja targets
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DKVGATE_BUILD_BENCH=ON "${xx[@]}" > "$R/build.log" 2>&1 &&
    ninja -C "$B" -j16 gate_cuda bench_decode_attn ${EXTRA_TARGETS:-} >> "$R/build.log" 2>&1 ||
    { grep -E "error|FAILED" -A3 "$R/build.log" | head -40; cd "$OUT" && tar czf r.tgz r; exit 1; }
  G=$(find "$B/gates" -name gate_cuda -type f | head -1)
  BD=$(find "$B/bench" -name bench_decode_attn -type f | head -1)
  cp "$BD" /tmp/bench_decode_head
}
device_mutant() {
  local id=$1 rebuild=${2:-1}
  python3 - "$id" <<'PY' || return 1
import json, sys
c = json.load(open("mutations/catalog.json"))
m = next(x for x in c["mutants"] if x["id"] == sys.argv[1])
a = m["anchor"] if isinstance(m["anchor"], str) else "\n".join(m["anchor"])
r = m["replacement"] if isinstance(m["replacement"], str) else "\n".join(m["replacement"])
s = open(m["file"]).read()
assert s.count(a) == 1, "anchor not unique"
open("/tmp/mutant.orig", "w").write(s)
open("/tmp/mutant.file", "w").write(m["file"])
open(m["file"], "w").write(s.replace(a, r))
open("/tmp/mutant.gates", "w").write(" ".join(m["expect_killed_by"]))
PY
  local f killed=0 g
  f=$(cat /tmp/mutant.file)
  ninja -C "$B" -j16 gate_cuda > "$R/mut_$id.build.log" 2>&1 || echo "$id: build failed"
  for g in $(cat /tmp/mutant.gates); do
    (cd "$B" && timeout 120 "../$G" "$g*" > "$R/mut_$id.$g.txt" 2>&1) || killed=1
    echo "$id: $g $(grep -q "All tests passed" "$R/mut_$id.$g.txt" && echo pass || echo RED)"
  done
  cp /tmp/mutant.orig "$f"
  [ "$rebuild" = 1 ] && { ninja -C "$B" -j16 gate_cuda > "$R/mut_$id.restore.log" 2>&1 || echo "$id: rebuild after restore failed"; }
  echo "$id: $([ $killed = 1 ] && echo KILLED || echo SURVIVED) $(el)"
}
device_sanitize() {
  local mem=$1 race=$2
  echo "== memcheck over $mem, racecheck over $race $(el)"
  (cd "$B" && timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 "../$G" "$mem" \
    > "$R/memcheck_decode.txt" 2>&1; echo "memcheck rc=$?: $(grep -E "ERROR SUMMARY" "$R/memcheck_decode.txt" | tail -1) $(grep -E "^(All tests passed|test cases)" "$R/memcheck_decode.txt" | tail -1)")
  (cd "$B" && timeout 150 compute-sanitizer --tool racecheck --error-exitcode 3 "../$G" "$race" \
    > "$R/racecheck_decode.txt" 2>&1; echo "racecheck rc=$?: $(grep -E "RACECHECK SUMMARY" "$R/racecheck_decode.txt" | tail -1) $(grep -E "^(All tests passed|test cases)" "$R/racecheck_decode.txt" | tail -1)")
}
