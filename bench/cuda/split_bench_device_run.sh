#!/bin/bash
# One device call for the split benchmark (docs/CUDA.md "Split benchmark"): builds bench_split_decode
# from this tree and times the Llama-3-8B shape (32 layers, bf16 random weights) at 32K context,
# unsplit (1: decode graphs; 1eager: no graphs, the tensor-parallel ranks' baseline), tensor parallel
# over 2 ranks (tp2) and layer split over 2 stages (pp2), per KV preset: TTFT of one 32K prompt,
# decode tok/s of the batch, and the bytes the split moves between its parts per step. Part i runs on
# device i mod the machine's device count: on one GPU both parts share it (the rows then measure the
# split's overhead, not a speedup; the benchmark says so); on a machine with 2+ GPUs the same script
# puts them on devices 0 and 1. Run from the repository root:
#
#   bench/cuda/split_bench_device_run.sh ASSETS OUT
#
# ASSETS holds xxhash/{include,lib}. OUT gets r/: device.txt, the build log, split_32k_x16.json
# (fp8, int8, k8v4 at batch 16) and split_bf16_32k_x8.json (bf16 at batch 8), their logs and
# summary.md (the tables). SPLITS / PRESETS in the environment replace the first run's lists (e.g.
# SPLITS=1,1eager,tp2,tp4,pp2,pp4 on 4 GPUs; more rows need more than this script's time).
#
# Memory (one 80 GB H100): weights 15.0 GiB of bf16 (tp2: 16.9 GiB, the ranks' replicated embeddings
# and head); KV of 16 x 32K tokens: fp8 32.1 GiB, int8 32.6 GiB, k8v4 25.3 GiB, bf16 64.1 GiB. bf16 at
# batch 16 needs 80 GiB with the weights: more than an H100 has (the benchmark would print the row as
# skipped with both figures), so the second run takes bf16 at batch 8 (32.0 GiB of KV), which fits
# H100 and H200 alike. Host: the 15.0 GiB host model and, while tp2 runs, its ranks' FP32 slices
# (26.0 GiB).
#
# Time, estimated for one H100 before its first run (round 26 measured 317 s for both runs on a warm build): configure 15 s + build
# ~130 s (bench_split_decode and the CUDA libraries from a bare tree, 16 cores; gate_cuda took 118 s)
# + run 1 ~230 s (host model ~5 s; per preset: 3 builds of the split, tp2's host slicing ~10-15 s of
# them, and 3 TTFT prefills of 32K tokens in chunks of 128 at ~10-15 s each, the 1eager row riding on
# 1's; 4 x 34 decode steps) + run 2 ~75 s (bf16, the same 3 prefills) = ~450 s. Limits: configure
# 40 + build 260; run 1 gets what is left of 520 s from the start, run 2 runs only when 90 s or more
# are left then, within 520 s; the summary after. Each JSON is rewritten after every row, so a run cut
# by its limit keeps the rows it finished (summary.md lists them).
set -u
A=$(cd "${1:?usage: bench/cuda/split_bench_device_run.sh ASSETS OUT}" && pwd)
OUT=${2:?usage: bench/cuda/split_bench_device_run.sh ASSETS OUT}
R=$OUT/r
mkdir -p "$R"
R=$(cd "$R" && pwd)
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0))s]"; }
left() { echo $((520 - ($(date +%s) - T0))); }
lim() { local l; l=$(left); [ "$l" -lt 1 ] && l=1; echo "$l"; }  # a timeout of 0 would mean none
B=build-splitbench
SPLITS=${SPLITS:-1,1eager,tp2,pp2}
PRESETS=${PRESETS:-fp8,int8,k8v4}
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1
  nvidia-smi topo -m | head -6; echo "cores $(nproc)"; free -g | head -2; } | tee "$R/device.txt"

echo "== configure + build bench_split_decode $(el)"
timeout 40 cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVGATE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real \
  "-DCMAKE_CXX_FLAGS=-I$A/xxhash/include -DXXH_INLINE_ALL" "-DCMAKE_EXE_LINKER_FLAGS=-L$A/xxhash/lib" > "$R/cfg.log" 2>&1 ||
  { echo "configure failed"; tail -20 "$R/cfg.log"; }
timeout 260 cmake --build $B -j16 --target bench_split_decode > "$R/build.log" 2>&1
echo "build rc=$? $(el)"
BIN=$B/bench/bench_split_decode
if [ ! -x "$BIN" ]; then grep -E "error|FAILED" -A3 "$R/build.log" | head -40; echo "no binary"; exit 1; fi

echo "== run 1: $PRESETS at 32K x 16, splits $SPLITS (limit $(left) s) $(el)"
timeout "$(lim)" "$BIN" --splits "$SPLITS" --presets "$PRESETS" --context 32768 --batch 16 --steps 32 --warmup 2 \
  --out "$R/split_32k_x16.json" > "$R/run1.log" 2>&1
echo "run 1 rc=$? $(el)"
grep -E "model:|host memory|host model:|plan |built in|TTFT|decode|skipped|error" "$R/run1.log" | tail -40

if [ "$(left)" -ge 90 ]; then
  echo "== run 2: bf16 at 32K x 8 (64 GiB of KV at batch 16 does not fit beside the weights on an H100) (limit $(left) s) $(el)"
  timeout "$(lim)" "$BIN" --splits "$SPLITS" --presets bf16 --context 32768 --batch 8 --steps 32 --warmup 2 \
    --out "$R/split_bf16_32k_x8.json" > "$R/run2.log" 2>&1
  echo "run 2 rc=$? $(el)"
  grep -E "built in|TTFT|decode|skipped|error" "$R/run2.log" | tail -20
else
  echo "run 2 (bf16 at 32K x 8) not run: $(left) s left of 520 $(el)"
fi

python3 - "$R/split_32k_x16.json" "$R/split_bf16_32k_x8.json" > "$R/summary.md" 2>&1 <<'PY'
import json, os, sys
def hb(b):
    for u, s in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= u: return "%.2f %s" % (b / u, s)
    return "%d B" % b
for path in sys.argv[1:]:
    if not os.path.exists(path):
        print("%s: not written" % path); continue
    j = json.load(open(path))
    d, s = j["device"], j["setup"]
    print("## %s (complete: %s, %.0f s)" % (os.path.basename(path), j.get("complete"), j.get("elapsed_s", 0)))
    print("devices: %s; driver CUDA %s, runtime %s; context %d x batch %d, %d steps; %s" % (
        ", ".join(g["name"] for g in d["gpus"]), d["driver"], d["cuda_runtime"], s["context"], s["batch"], s["steps"], s["note"]))
    print("host model generated in %s s\n" % j["model"].get("host_generate_s", "-"))
    print("| preset | split | devices | TTFT ms | decode tok/s | ms/step | decode vs 1 | decode vs 1eager | TTFT vs 1 | ids = 1 | between parts / step | KV pool | note |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|")
    f = lambda r, k, p: (p % r[k]) if isinstance(r.get(k), (int, float)) else "-"
    for r in j["results"]:
        note = r.get("skipped") and "skipped: " + r["skipped"] or r.get("error") and "error: " + r["error"] or r.get("topology", "")
        st = r.get("bytes_between_parts_per_step")
        same = {True: "yes", False: "no"}.get(r.get("same_ids_as_1"), "-")
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["preset"], r["split"], ",".join(str(x) for x in r.get("devices", [])), f(r, "ttft_ms", "%.1f"),
            f(r, "decode_tok_s", "%.1f"), f(r, "decode_ms_per_step", "%.2f"), f(r, "decode_tok_s_vs_1", "%.3f"),
            f(r, "decode_tok_s_vs_1eager", "%.3f"), f(r, "ttft_vs_1", "%.3f"), same, hb(st["between_parts_bytes"]) if st else "-",
            hb(r["kv_pool_bytes"]) if "kv_pool_bytes" in r else "-", note))
    print()
PY
cat "$R/summary.md"
echo "== done $(el)"
