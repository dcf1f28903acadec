#!/usr/bin/env python3
"""Assess the performance bars (bench/results/README.md, "Bars") from one run's bench_decode_attn JSON and peer_sdpa JSON.

Bars (at >= 32K context and batch >= 16):
  - bf16/f16/int8/fp8 decode attention >= 85% of the measured copy bandwidth; q4_0/k8v4 >= 75%
  - speedup over PyTorch bf16 SDPA (flash, same shapes, same run): int8 and fp8 >= 1.8x,
    k8v4 >= 2.2x, q4_0 >= 2.8x
Then the decode-attention bars of the memory-wall work (issue bars: absolute KV-read rates, the
speedups at 32K x 16 and 128K x 16, the batch-1 latencies), each row also against an earlier run's
JSON when one is given (`--before OLD_BENCH.json`, e.g. the committed bench/results/cuda_decode_h200.json).
Writes a JSON summary and prints Markdown tables.

  assess_bars.py BENCH.json PEER.json OUT.json [--before OLD_BENCH.json]
"""
import json
import sys

BW_BARS = {"bf16": 0.85, "f16": 0.85, "int8": 0.85, "fp8": 0.85, "q4_0": 0.75, "k8v4": 0.75}
SPEEDUP_BARS = {"int8": 1.8, "fp8": 1.8, "k8v4": 2.2, "q4_0": 2.8}
# Memory-wall bars: KV read rate at >= 32K context, batch 16 and 64 (GB/s); speedup over the
# PyTorch bf16 peer at 32K x 16 and 128K x 16; batch-1 latency (us) at 32K, 128K and 4K.
RATE_BARS = {"int8": 3700, "fp8": 3700, "fp8_e5m2": 3700, "q8_0": 3700, "k8v4": 3400, "q4_0": 3400, "bf16": 4000, "f16": 4000}
WALL_SPEEDUP_BARS = {"int8": 1.9, "fp8": 1.9, "k8v4": 2.4, "q4_0": 3.2, "bf16": 1.0}
B1_BARS = {32768: {"int8": 25, "fp8": 25, "q4_0": 20, "k8v4": 20}, 131072: {"int8": 70, "fp8": 70, "q4_0": 50, "k8v4": 50}}
B1_4K_BAR = 15


def wall_bars(dec, torch_bf16, before):
    """Rows of the memory-wall bars: (format, ctx, batch, kind, value, bar, met, before value)."""
    rows = []
    for (fmt, c, b), r in sorted(dec.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        old = before.get((fmt, c, b))
        if fmt in RATE_BARS and c >= 32768 and b in (16, 64):
            rows.append({"format": fmt, "context": c, "batch": b, "kind": "GB/s", "value": r["GBps"],
                         "bar": RATE_BARS[fmt], "met": r["GBps"] >= RATE_BARS[fmt],
                         "before": old["GBps"] if old else None})
        tb = torch_bf16.get((c, b))
        if fmt in WALL_SPEEDUP_BARS and b == 16 and c in (32768, 131072) and tb:
            sp = tb["time_us"] / r["time_us"]
            rows.append({"format": fmt, "context": c, "batch": b, "kind": "x torch bf16", "value": sp,
                         "bar": WALL_SPEEDUP_BARS[fmt], "met": sp >= WALL_SPEEDUP_BARS[fmt],
                         "before": tb["time_us"] / old["time_us"] if old else None})
        if b == 1:
            bar = B1_4K_BAR if c == 4096 else B1_BARS.get(c, {}).get(fmt)
            if bar is not None:
                rows.append({"format": fmt, "context": c, "batch": b, "kind": "us (<=)", "value": r["time_us"],
                             "bar": bar, "met": r["time_us"] <= bar, "before": old["time_us"] if old else None})
    return rows


def main(bench_path, peer_path, out_path, *opts):
    before = {}
    if opts:
        if len(opts) != 2 or opts[0] != "--before":
            sys.exit("usage: assess_bars.py BENCH.json PEER.json OUT.json [--before OLD_BENCH.json]")
        try:
            old = json.load(open(opts[1]))
            before = {(r["format"], r["context"], r["batch"]): r for r in old["decode"] if not r.get("forced_splits")}
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"assess_bars.py: --before {opts[1]}: not a bench_decode_attn JSON ({e}); "
                     "give the file bench_decode_attn --out wrote")
    bench = json.load(open(bench_path))
    peer = json.load(open(peer_path))
    copy = bench["limits"]["copy_d2d_GBps"]
    # the planner's rows (a --splits sweep adds rows with forced split counts)
    dec = {(r["format"], r["context"], r["batch"]): r for r in bench["decode"] if not r.get("forced_splits")}
    # PyTorch bf16 peer: the faster of the two GQA expressions per shape.
    torch_bf16 = {}
    for r in peer["records"]:
        if r.get("format") == "bf16" and "time_us" in r:
            k = (r["context"], r["batch"])
            if k not in torch_bf16 or r["time_us"] < torch_bf16[k]["time_us"]:
                torch_bf16[k] = r
    torch_deq = {(r["format"], r["context"], r["batch"]): r for r in peer["records"] if "time_us" in r and r["format"] != "bf16"}
    rows, verdicts = [], []
    shapes = sorted({(c, b) for (_, c, b) in dec if c >= 32768 and b >= 16})
    for fmt in ["bf16", "f16", "int8", "fp8", "q4_0", "k8v4", "fp8_e5m2", "q8_0", "f32"]:
        for (c, b) in shapes:
            r = dec.get((fmt, c, b))
            if r is None:
                continue
            frac = r["GBps"] / copy
            tb = torch_bf16.get((c, b))
            sp = tb["time_us"] / r["time_us"] if tb else None
            td = torch_deq.get((fmt, c, b))
            sp_deq = td["time_us"] / r["time_us"] if td else None
            row = {"format": fmt, "context": c, "batch": b, "time_us": r["time_us"], "GBps": r["GBps"],
                   "frac_of_copy": frac, "speedup_vs_torch_bf16": sp, "speedup_vs_torch_dequant_sdpa": sp_deq,
                   "torch_bf16_us": tb["time_us"] if tb else None, "torch_bf16_variant": tb["variant"] if tb else None}
            if fmt in BW_BARS:
                row["bw_bar"] = BW_BARS[fmt]
                row["bw_met"] = frac >= BW_BARS[fmt]
                row["bw_miss_pts"] = max(0.0, BW_BARS[fmt] - frac) * 100
            if fmt in SPEEDUP_BARS and sp is not None:
                row["speedup_bar"] = SPEEDUP_BARS[fmt]
                row["speedup_met"] = sp >= SPEEDUP_BARS[fmt]
                row["speedup_miss_factor"] = SPEEDUP_BARS[fmt] / sp if sp < SPEEDUP_BARS[fmt] else 1.0
            rows.append(row)
    doc = {"schema": "kvgate.bench.cuda_bars/1", "device": bench["device"], "copy_d2d_GBps": copy,
           "read_probe_GBps": bench["limits"].get("read_probe_GBps"), "bench_when": bench.get("when"),
           "torch": peer.get("torch"), "rows": rows, "wall_bars": wall_bars(dec, torch_bf16, before)}
    json.dump(doc, open(out_path, "w"), indent=1)
    print(f"copy D2D {copy:.0f} GB/s, read probe {bench['limits'].get('read_probe_GBps', 0):.0f} GB/s; "
          f"{bench['device']['name']}, driver CUDA {bench['device']['driver_cuda']}, torch {peer.get('torch')}\n")
    print("| format | ctx | batch | kvgate us | GB/s | % copy | bar | torch bf16 us | speedup | bar | vs torch dequant+SDPA |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        bw = f"{r['bw_bar']*100:.0f}% {'met' if r['bw_met'] else 'MISSED by %.1f pts' % r['bw_miss_pts']}" if "bw_bar" in r else "-"
        sp = f"{r['speedup_vs_torch_bf16']:.2f}x" if r["speedup_vs_torch_bf16"] else "-"
        spb = (f"{r['speedup_bar']}x {'met' if r['speedup_met'] else 'MISSED (%.2fx short)' % r['speedup_miss_factor']}"
               if "speedup_bar" in r else "-")
        sd = f"{r['speedup_vs_torch_dequant_sdpa']:.1f}x" if r["speedup_vs_torch_dequant_sdpa"] else "-"
        tb = f"{r['torch_bf16_us']:.0f}" if r["torch_bf16_us"] else "-"
        print(f"| {r['format']} | {r['context']} | {r['batch']} | {r['time_us']:.0f} | {r['GBps']:.0f} | "
              f"{r['frac_of_copy']*100:.1f}% | {bw} | {tb} | {sp} | {spb} | {sd} |")
    wb = doc["wall_bars"]
    print(f"\nMemory-wall bars: {sum(r['met'] for r in wb)} of {len(wb)} met"
          + (f" (before: the run in {opts[1]})" if before else ""))
    print("| format | ctx | batch | measure | value | bar | verdict | before | change |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in wb:
        v, o = r["value"], r["before"]
        fmt_v = (lambda x: f"{x:.2f}") if r["kind"].startswith("x") else (lambda x: f"{x:.0f}" if x >= 100 else f"{x:.1f}")
        ch = "-" if o is None else (f"{o / v:.2f}x faster" if r["kind"].startswith("us") else f"{v / o:.2f}x")
        print(f"| {r['format']} | {r['context']} | {r['batch']} | {r['kind']} | {fmt_v(v)} | {r['bar']} | "
              f"{'met' if r['met'] else 'MISSED'} | {'-' if o is None else fmt_v(o)} | {ch} |")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit("usage: assess_bars.py BENCH.json PEER.json OUT.json [--before OLD_BENCH.json]")
    main(*sys.argv[1:])
