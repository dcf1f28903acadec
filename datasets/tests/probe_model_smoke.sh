#!/usr/bin/env bash
# The committed probe model (datasets/models/probe) passes a small slice of each probe at f32 KV
# through kvgate on CPU: a regression here means the model, its files or the runtime's HF path broke.
# The full acceptance grid is in datasets/models/probe/eval_kvgate_cpu.md.
set -euo pipefail
kvgate="$1"; model="$2"
check() {  # probe args...: every case must pass
  local out
  out=$("$kvgate" probe --model "$model" --kv f32 --threads 0 --json "$@")
  python3 -c '
import json, sys
r = json.loads(sys.argv[1])
print("%s: %d/%d passed (%d skipped)" % (r["probe"], r["passed"], r["cases"], r.get("skipped", 0)))
sys.exit(0 if r["cases"] > 0 and r["passed"] == r["cases"] else 1)' "$out"
}
check --probe echo --seeds 1..8
check --probe counting --lengths 30,100
check --probe needle --lengths 512,2048 --depths 0,0.5,1 --seeds 1
