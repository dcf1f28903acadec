#!/usr/bin/env bash
# The test command (README, .ci/run): dependencies, configure, build, every CTest test.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$here/scripts/setup.sh" --deps
cmake -S "$here" -B "$here/build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$here/build" -j"$(nproc)"
ctest --test-dir "$here/build" --output-on-failure -j"$(nproc)"
# Untrusted input (fuzz/README.md): with clang, the ASan/UBSan job (unit tests, the parser and
# format gates, the bad-input corpus and the fuzz corpus replay, all sanitized) and every libFuzzer
# harness for a short budget (10 s each). KVGATE_CI_SANITIZE=0 skips both.
if command -v clang++ >/dev/null && [[ "${KVGATE_CI_SANITIZE:-1}" != 0 ]]; then
  "$here/scripts/sanitize.sh"
  "$here/scripts/fuzz.sh" --seconds "${KVGATE_CI_FUZZ_SECONDS:-10}"
fi
