#!/usr/bin/env bash
# The steps every CI recipe in docs/ci/ runs (GitHub Actions, GitLab CI, Slurm), kept here so the
# recipes stay one line per step and the mutation_driver_fixture test runs exactly these steps.
#
#   docs/ci/kvgate-ci.sh gates OUT [kvgate gate args...]
#       every gate; OUT/gates.xml (JUnit) and OUT/gates.json; exit 1 when a gate failed
#   docs/ci/kvgate-ci.sh shard K N OUT [kvgate mutate args...]
#       shard K of N (0 <= K < N) of the mutation proof into OUT/shard-K (and OUT/shard-K.xml);
#       survivors do not fail this step (the merge judges the whole run): exit 0 unless the shard
#       could not run (usage error, red baseline or canary, stale catalog, interrupted)
#   docs/ci/kvgate-ci.sh merge OUT [kvgate mutate merge args...]
#       joins OUT/shard-* into OUT/merged (outcomes.json, kill_matrix.md, index.html) and
#       OUT/mutants.xml; exit: kvgate mutate's exit code for the whole run (0: every mutant killed)
#
# KVGATE: the kvgate binary (default build/kvgate of this tree). FORMAT: text or github (default:
# github under GitHub Actions, else text): ::error annotations for survivors at their anchor line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
kvgate="${KVGATE:-$here/build/kvgate}"
format="${FORMAT:-$([ -n "${GITHUB_ACTIONS:-}" ] && echo github || echo text)}"

usage() {
  sed -n '5,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 1
}
[ -x "$kvgate" ] || { echo "kvgate-ci: $kvgate is not an executable; fix: build it (cmake --build build --target kvgate) or set KVGATE" >&2; exit 1; }

step="${1:-}"
shift || true
case "$step" in
  gates)
    [ $# -ge 1 ] || usage
    out="$1"; shift
    mkdir -p "$out"
    exec "$kvgate" gate --junit "$out/gates.xml" --json "$out/gates.json" "$@"
    ;;
  shard)
    [ $# -ge 3 ] || usage
    k="$1" n="$2" out="$3"; shift 3
    mkdir -p "$out"
    rc=0
    "$kvgate" mutate --shard "$k/$n" --out "$out/shard-$k" --junit "$out/shard-$k.xml" --format "$format" "$@" || rc=$?
    echo "$rc" > "$out/shard-$k.exit"
    case "$rc" in
      0|2|3|6|7) echo "kvgate-ci: shard $k/$n finished (kvgate mutate exit $rc; the merge decides)"; exit 0 ;;
      *) echo "kvgate-ci: shard $k/$n could not run (kvgate mutate exit $rc): see $out/shard-$k/kill_matrix.md" >&2; exit "$rc" ;;
    esac
    ;;
  merge)
    [ $# -ge 1 ] || usage
    out="$1"; shift
    shopt -s nullglob
    shards=("$out"/shard-*/)
    [ ${#shards[@]} -gt 0 ] || { echo "kvgate-ci: no $out/shard-*/ folder; fix: run the shard step (or download its artifacts) into $out first" >&2; exit 1; }
    exec "$kvgate" mutate merge "${shards[@]%/}" --out "$out/merged" --junit "$out/mutants.xml" --format "$format" "$@"
    ;;
  *) usage ;;
esac
