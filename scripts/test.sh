#!/usr/bin/env bash
# The test command (README, .ci/run): dependencies, configure, build, every CTest test.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$here/scripts/setup.sh" --deps
cmake -S "$here" -B "$here/build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$here/build" -j"$(nproc)"
ctest --test-dir "$here/build" --output-on-failure -j"$(nproc)"
# Untrusted input (fuzz/README.md), with clang: every libFuzzer harness replays its seed corpus and
# past crashes, then fuzzes for 10 s (ASan + UBSan; about 2 minutes after the build of build-san).
# KVGATE_CI_FUZZ=0 skips it. Then the ASan/UBSan job (scripts/sanitize.sh: the unit tests, gate_storage,
# gate_tokenizer and the bad-input corpus through the sanitized CLI, and the fuzz corpus replay) in the
# same build-san; it adds about 8 CPU-minutes of build and 15 s of tests on the 2-core machine.
# KVGATE_CI_SANITIZE=0 skips it.
if command -v clang++ >/dev/null && [[ "${KVGATE_CI_FUZZ:-1}" != 0 ]]; then
  "$here/scripts/fuzz.sh" --seconds "${KVGATE_CI_FUZZ_SECONDS:-10}"
fi
if command -v clang++ >/dev/null && [[ "${KVGATE_CI_SANITIZE:-1}" != 0 ]]; then
  "$here/scripts/sanitize.sh"
fi
