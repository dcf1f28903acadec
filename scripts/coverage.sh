#!/usr/bin/env bash
# Line and branch coverage of the shipped code by the CPU test suite (every ctest test: the gates,
# the AVX2-less variants ctest runs, the unit tests), measured with gcov through gcovr.
#
#   scripts/coverage.sh [OUT]     default OUT = kvgate.out/coverage
#
# Writes OUT/scope.txt (the commit, targets and tests), OUT/summary.txt (per file: lines and the unreached line numbers), OUT/branches.txt, OUT/coverage.json
# (gcovr's JSON summary), OUT/html/index.html (per-file pages) and prints the totals.
# `kvgate signoff --coverage OUT` puts the figures into the sign-off report. The build goes
# to build-coverage/ (CUDA off: device code is not measured here; on a GPU machine the CUDA host code
# would need a CUDA build with --coverage, which this script does not do). Models: $KVGATE_MODELS.
#
# A scoped run (a loaded machine, or one library's figure): KVGATE_COVERAGE_TARGETS="gate_x gate_y"
# builds only those targets, KVGATE_COVERAGE_TESTS=REGEX runs only the ctest tests it matches.
# Tests not run can only lower the figures (a lower bound); OUT/scope.txt records the scope.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$here/kvgate.out/coverage}"
build="$here/build-coverage"

"$here/scripts/setup.sh" --deps
if ! command -v gcovr >/dev/null 2>&1; then
  echo "kvgate coverage: installing gcovr"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends gcovr
fi

# -O2 as the Release build (at -O1 the model-level gates ran past their 600 s ctest timeout on the
# 2-core machine); -fprofile-update=atomic
# because the CPU forward and the mutation tests run threads.
flags="--coverage -O2 -fprofile-update=atomic"
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=None -DKVGATE_CUDA=OFF \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="--coverage"
targets="${KVGATE_COVERAGE_TARGETS:-}"
tests="${KVGATE_COVERAGE_TESTS:-}"
if [ -n "$targets" ]; then
  for t in $targets; do cmake --build "$build" -j"$(nproc)" --target "$t"; done
else
  cmake --build "$build" -j"$(nproc)"
fi
find "$build" -name '*.gcda' -delete
# Notes files of objects the build no longer has (a folder renamed since the last coverage build)
# make gcovr's merge fail: keep only those of the current objects.
(cd "$build" && ninja -t targets all | sed -n 's/^\(.*\.o\): .*/\1/p' | sort -u > objects.txt &&
  find . -name '*.gcno' | sed 's|^\./||; s|\.gcno$|.o|' | sort | comm -13 objects.txt - | sed 's|\.o$|.gcno|' | xargs -r rm -f)
# Every test, as CI runs them (a failing test still leaves its counts; the script says so).
rc=0
ctest --test-dir "$build" -j"$(nproc)" --output-on-failure ${tests:+-R "$tests"} > "$build/ctest.log" 2>&1 || rc=$?
tail -n 5 "$build/ctest.log"
[ "$rc" -eq 0 ] || echo "kvgate coverage: WARNING: some tests failed (see $build/ctest.log); the figures still count what ran" >&2

mkdir -p "$out/html"
{
  echo "commit: $(git -C "$here" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$here" diff --quiet HEAD 2>/dev/null || echo ' (uncommitted changes)')"
  echo "targets: ${targets:-all}"
  echo "tests: ${tests:-all}"
  grep -E '^ *[0-9]+/[0-9]+ Test' "$build/ctest.log" | sed -E 's/^ *//; s/ +[0-9.]+ sec$//' || true
} > "$out/scope.txt"
# What ships: the runtime, the harness libraries (mutation driver, reports, matrix, probes), the CLI.
# Not counted: the gates and tests themselves, the oracle (a reference, not shipped code),
# benchmarks, the scratch trees the mutation tests copy.
filters=(--filter "$here/runtime/" --filter "$here/mutations/" --filter "$here/reports/" --filter "$here/bench/matrix/"
         --filter "$here/datasets/probes/" --filter "$here/cli/")
excludes=(--exclude "$here/build.*" --exclude "$here/\.scratch/.*" --exclude ".*/tests/.*" --exclude ".*/node_modules/.*")
gcovr -r "$here" --object-directory "$build" "${filters[@]}" "${excludes[@]}" \
  --gcov-ignore-parse-errors --exclude-unreachable-branches --exclude-throw-branches \
  --txt "$out/summary.txt" --json-summary-pretty --json-summary "$out/coverage.json" \
  --html-details "$out/html/index.html" --print-summary | tee "$out/totals.txt"
# Per-file branch coverage (the line table above lists the unreached lines of each file).
gcovr -r "$here" --object-directory "$build" "${filters[@]}" "${excludes[@]}" --gcov-ignore-parse-errors \
  --exclude-unreachable-branches --exclude-throw-branches --branches --txt "$out/branches.txt" > /dev/null
echo "kvgate coverage: $out/summary.txt (lines, unreached line numbers), $out/branches.txt, $out/coverage.json, $out/html/index.html"
exit 0
