#!/usr/bin/env python3
"""Assess the performance bars (bench/results/README.md, "Bars") from one run's bench_decode_attn JSON and peer_sdpa JSON.

Bars (at >= 32K context and batch >= 16):
  - bf16/f16/int8/fp8 decode attention >= 85% of the measured copy bandwidth; q4_0/k8v4 >= 75%
  - speedup over PyTorch bf16 SDPA (flash, same shapes, same run): int8 and fp8 >= 1.8x,
    k8v4 >= 2.2x, q4_0 >= 2.8x
Writes a JSON summary and prints a Markdown table.
"""
import json
import sys

BW_BARS = {"bf16": 0.85, "f16": 0.85, "int8": 0.85, "fp8": 0.85, "q4_0": 0.75, "k8v4": 0.75}
SPEEDUP_BARS = {"int8": 1.8, "fp8": 1.8, "k8v4": 2.2, "q4_0": 2.8}


def main(bench_path, peer_path, out_path):
    bench = json.load(open(bench_path))
    peer = json.load(open(peer_path))
    copy = bench["limits"]["copy_d2d_GBps"]
    dec = {(r["format"], r["context"], r["batch"]): r for r in bench["decode"]}
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
           "torch": peer.get("torch"), "rows": rows}
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


if __name__ == "__main__":
    main(*sys.argv[1:4])
