#!/usr/bin/env bash
# libFuzzer harnesses of every parser (fuzz/README.md): build them (clang, ASan + UBSan + coverage),
# replay the committed seed corpus and every past crash (fuzz/crashes/) as regression cases, then
# fuzz each harness for a budget. A crash, a sanitizer report, a timeout (-timeout, a hang) or an
# allocation beyond -rss_limit_mb / -malloc_limit_mb is a finding: its input is copied to
# fuzz/crashes/<harness>/ (commit it with the fix) and the script exits 1.
#   scripts/fuzz.sh [--seconds N] [--runs N] [--max-len N] [--only NAME] [--replay-only] [--build DIR] [--out DIR]
# Default: 20 s per harness, build dir build-san, results in fuzz.out/ (summary.tsv: execs, coverage).
# --runs N also ends a harness after N executions (a campaign: --runs 10000000 --seconds 14400).
# --max-len N caps the length of the inputs libFuzzer makes (default: its own guess, the largest seed;
# the seeds are still replayed whole in step 1). The JSON harnesses run 4-10x faster at 8192 than at
# their 27-118 KB seeds' length (fuzz/README.md, "Long campaigns").
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds=20 runs=-1 max_len=0 only="" replay_only=0 build="$here/build-san" out="$here/fuzz.out"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --max-len) max_len="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --replay-only) replay_only=1; shift ;;
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n 2,13p "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is needed (libFuzzer)" >&2; exit 2; }
san="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer -fsanitize=fuzzer-no-link"
if [[ ! -f "$build/build.ninja" ]]; then
  CC=clang CXX=clang++ cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVGATE_CUDA=OFF \
    -DKVGATE_BUILD_BENCH=OFF -DKVGATE_FUZZ=ON "-DCMAKE_C_FLAGS=$san" "-DCMAKE_CXX_FLAGS=$san" \
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" >/dev/null
fi
cmake --build "$build" -j"$(nproc)" --target fuzzers
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
export KVGATE_SOURCE_DIR="$here"
mkdir -p "$out"
summary="$out/summary.tsv"
printf 'harness\tseconds\texecs\texec_per_s\tcov\tft\tcorpus\tresult\n' >"$summary"
status=0
# The harnesses are the sources in fuzz/harnesses/ (the build folder also holds generated files
# named fuzz_*, such as fuzz_gguf_build_paths.cpp, which are not programs).
for src in "$here"/fuzz/harnesses/fuzz_*.cpp; do
  name="$(basename "$src" .cpp)"; exe="$build/fuzz/$name"; name="${name#fuzz_}"
  [[ -n "$only" && "$only" != "$name" ]] && continue
  [[ -x "$exe" ]] || { echo "fuzz.sh: $exe was not built (target fuzzers)" >&2; exit 2; }
  seeds="$here/fuzz/corpus/$name"; crashes="$here/fuzz/crashes/$name"
  # 1. Regression replay: every seed and every past crash, each run once.
  # nullglob: an empty folder (a crash folder fuzz.sh made and a fix emptied) adds no literal "*".
  shopt -s nullglob
  inputs=("$seeds"/*)
  [[ -d "$crashes" ]] && inputs+=("$crashes"/*)
  shopt -u nullglob
  (( ${#inputs[@]} )) || { echo "fuzz.sh: $seeds holds no seed (make them: python3 fuzz/make_seeds.py)" >&2; exit 2; }
  if ! "$exe" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=20 "${inputs[@]}" >"$out/$name.replay.log" 2>&1; then
    echo "fuzz.sh: $name: the replay of the corpus / past crashes failed (see $out/$name.replay.log)" >&2
    printf '%s\t0\t0\t0\t-\t-\t-\treplay FAILED\n' "$name" >>"$summary"
    status=1
    continue
  fi
  [[ $replay_only == 1 ]] && { printf '%s\t0\t%d\t-\t-\t-\t-\treplay ok\n' "$name" "${#inputs[@]}" >>"$summary"; continue; }
  # 2. Fuzz for the budget in a scratch corpus (the committed seeds stay as they are).
  work="$out/$name"; rm -rf "$work"; mkdir -p "$work/corpus" "$work/artifacts"
  set +e
  t_fuzz=$(date +%s)
  "$exe" -max_total_time="$seconds" -runs="$runs" -max_len="$max_len" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=20 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" "$work/corpus" "$seeds" >"$out/$name.log" 2>&1
  rc=$?
  elapsed=$(( $(date +%s) - t_fuzz ))
  set -e
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$out/$name.log" | grep -o '[0-9]*$' | tail -n 1 || echo 0)"
  last="$(grep -E '^#[0-9]+' "$out/$name.log" | tail -1)"
  cov="$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")"; ft="$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$last")"
  corp="$(sed -n 's/.*corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")"
  result=ok
  if [[ $rc != 0 ]] || compgen -G "$work/artifacts/*" >/dev/null; then
    result="FINDING (rc $rc)"
    mkdir -p "$crashes"
    for a in "$work"/artifacts/*; do [[ -f "$a" ]] && cp "$a" "$crashes/"; done
    echo "fuzz.sh: $name: finding; input(s) copied to fuzz/crashes/$name/ (log: $out/$name.log)" >&2
    status=1
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$elapsed" "${execs:-0}" "$(( ${execs:-0} / (elapsed > 0 ? elapsed : 1) ))" \
    "${cov:--}" "${ft:--}" "${corp:--}" "$result" >>"$summary"
  rm -rf "$work/corpus"
done
column -t -s $'\t' "$summary"
exit $status
