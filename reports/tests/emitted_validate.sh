#!/usr/bin/env bash
# Every record kvgate emits validates against reports/schema: probe --json, bench (--no-timing),
# gate --json, signoff --quick (with the fixture outcomes), field-report --quick (--no-timing).
# Needs stories260K ($KVGATE_MODELS or ../shared/models); reads no clock itself.
set -euo pipefail
kvgate="$1"; out="$2"
rm -rf "$out"; mkdir -p "$out"
src="${KVGATE_SOURCE_DIR:?}"
"$kvgate" probe --probe echo --seeds 1..2 --json > "$out/probe-echo.json"
"$kvgate" probe --probe needle --lengths 128 --depths 0,1 --seeds 1 --kv k8v4 --json > "$out/probe-needle.json"
"$kvgate" probe --probe counting --lengths 10 --kv int8 --json > "$out/probe-counting.json"
"$kvgate" bench --no-timing --formats int8,k8v4 --lengths 64 --needle-lengths 128 --needle-depths 0,1 \
  --counting-n 10 --echo-seeds 1..2 --out "$out/bench" > /dev/null
"$kvgate" gate --format int8 --family STO --json "$out/gates-int8.json" > /dev/null
files=("$out"/probe-*.json "$out/bench/matrix.json" "$out/gates-int8.json")
if "$kvgate" --help | grep -q signoff; then
  "$kvgate" signoff --format int8 --quick --no-timing --probe-model none --mutants "$src/reports/tests/fixtures" --out "$out/signoff" > /dev/null || true
  files+=("$out/signoff/signoff.json" "$out/signoff/matrix.json" "$out/signoff/gates.json")
  # Bad input (a policy with a wrong unit, a corpus out of the vocabulary, a quantized baseline) is
  # refused with exit 1 before anything is written: the report folder is not even created.
  printf '{"schema": "kvgate.policy/1", "budgets": {"kl_mean": {"max": 0.05, "unit": "bits", "source": "x"}}}' > "$out/bad-policy.json"
  printf '1 2 3 999999\n' > "$out/bad-corpus.txt"
  for bad in "--policy $out/bad-policy.json" "--corpus $out/bad-corpus.txt" "--baseline int8"; do
    rc=0
    # shellcheck disable=SC2086
    "$kvgate" signoff --format int8 --quick --no-timing $bad --out "$out/refused" > /dev/null 2> "$out/refused.err" || rc=$?
    if [ "$rc" != 1 ] || [ -e "$out/refused" ]; then
      echo "signoff $bad: exit $rc (want 1) or $out/refused was written"; cat "$out/refused.err"; exit 1
    fi
    grep -q "fix:" "$out/refused.err" || { echo "signoff $bad: no fix in the message"; cat "$out/refused.err"; exit 1; }
  done
  # A corrupt or wrong-version outcomes.json (--mutants) is refused the same way, naming the file and
  # the field (mutations/schema/outcomes.schema.json, checked on read).
  head -c 200 "$src/reports/tests/fixtures/outcomes.json" > "$out/truncated-outcomes.json"
  sed 's/"format_version": 2/"format_version": 1/' "$src/reports/tests/fixtures/outcomes.json" > "$out/v1-outcomes.json"
  sed 's/"status": "survived"/"status": "sort of"/' "$src/reports/tests/fixtures/outcomes.json" > "$out/badstatus-outcomes.json"
  for bad in "truncated:field /" "v1:field /format_version" "badstatus:/status"; do
    name="${bad%%:*}"; want="${bad#*:}"; rc=0
    "$kvgate" signoff --format int8 --quick --no-timing --mutants "$out/$name-outcomes.json" --out "$out/refused" > /dev/null 2> "$out/refused.err" || rc=$?
    if [ "$rc" != 1 ] || [ -e "$out/refused" ]; then
      echo "signoff --mutants $name-outcomes.json: exit $rc (want 1) or $out/refused was written"; cat "$out/refused.err"; exit 1
    fi
    for needle in "$out/$name-outcomes.json" "$want" "fix:"; do
      grep -qF -- "$needle" "$out/refused.err" || { echo "signoff --mutants $name: '$needle' not in the message"; cat "$out/refused.err"; exit 1; }
    done
  done
fi
files+=("$src/reports/policy/default.json")
if "$kvgate" --help | grep -q field-report; then
  "$kvgate" field-report --quick --no-timing --no-gates --probe-model none --formats int8 --out "$out/field" > /dev/null
  files+=("$out/field/field-report.json" "$out/field/matrix.json")
fi
"$kvgate" report --validate "${files[@]}"
echo "validated ${#files[@]} records"
