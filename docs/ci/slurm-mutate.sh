#!/usr/bin/env bash
# Slurm: the mutation proof as a job array (one shard per task), then a merge job that waits for
# the array. From the root of a built tree (cmake --build build --target kvgate):
#   jid=$(sbatch --parsable docs/ci/slurm-mutate.sh)
#   sbatch --dependency=afterany:$jid docs/ci/slurm-mutate.sh merge
# Each task mutates its own scratch copy ($TMPDIR or /tmp), so tasks on one node do not wait for
# each other's scratch lock. Every step is one call of docs/ci/kvgate-ci.sh (the
# mutation_driver_fixture test runs those steps). Extra arguments go to kvgate mutate.
#SBATCH --job-name=kvgate-mutate
#SBATCH --array=0-3
#SBATCH --cpus-per-task=2
#SBATCH --time=01:00:00
#SBATCH --output=ci-out/slurm-%A_%a.log
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "${BASH_SOURCE[0]}")/../..}"
out="${KVGATE_CI_OUT:-ci-out}"
if [ "${1:-}" = merge ]; then
  shift
  exec docs/ci/kvgate-ci.sh merge "$out" "$@"
fi
k="${SLURM_ARRAY_TASK_ID:?run through sbatch (a job array), or: docs/ci/kvgate-ci.sh shard K N OUT}"
n="${SLURM_ARRAY_TASK_COUNT:?run through sbatch --array}"
exec docs/ci/kvgate-ci.sh shard "$k" "$n" "$out" --scratch "${TMPDIR:-/tmp}/kvgate-shard-$k" -j "${SLURM_CPUS_PER_TASK:-2}" "$@"
