#!/usr/bin/env bash
# The ASan/UBSan job (fuzz/README.md): the unit tests and the fastest CPU gate subset that reaches
# every parser and every KV format, built with clang -fsanitize=address,undefined,float-cast-overflow
# (-fno-sanitize-recover=all: UBSan halts on the first error) in build-san (the build the fuzzers
# use), then run under ctest:
#   runtime_unit, json_schema_unit, reports_unit, mutations_unit   (unit tests)
#   gate_storage      every KV format's codec, page layout, KV file write/read/restore
#   gate_tokenizer    llama2.c tokenizer.bin, tokenizer.json (byte-level BPE and SentencePiece BPE)
#   bad_inputs_corpus every parser's refusal path through the sanitized kvgate CLI (GGUF, llama2.c,
#                     safetensors, config.json, tokenizer.json, catalog, reports, flags)
#   the fuzz corpus replay (scripts/fuzz.sh --replay-only): every parser on its seeds and past crashes
#   scripts/sanitize.sh [--build DIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$here/build-san"
[[ "${1:-}" == "--build" ]] && build="$2"
command -v clang++ >/dev/null || { echo "sanitize.sh: clang++ is needed" >&2; exit 2; }
san="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer -fsanitize=fuzzer-no-link"
if [[ ! -f "$build/build.ninja" ]]; then
  CC=clang CXX=clang++ cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVGATE_CUDA=OFF \
    -DKVGATE_BUILD_BENCH=OFF -DKVGATE_FUZZ=ON "-DCMAKE_C_FLAGS=$san" "-DCMAKE_CXX_FLAGS=$san" \
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" >/dev/null
fi
tests=(runtime_unit json_schema_unit reports_unit mutations_unit gate_storage gate_tokenizer)
t0=$SECONDS
cmake --build "$build" -j"$(nproc)" --target kvgate "${tests[@]}" fuzzers
t1=$SECONDS
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
regex="^($(IFS='|'; echo "${tests[*]}")|bad_inputs_corpus)\$"
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" -R "$regex"
"$here/scripts/fuzz.sh" --replay-only --build "$build" --out "$build/fuzz-replay"
echo "sanitize.sh: build $((t1 - t0)) s, tests $((SECONDS - t1)) s"
