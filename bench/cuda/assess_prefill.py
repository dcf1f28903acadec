#!/usr/bin/env python3
"""The prefill bars from bench_prefill_attn's and peer_sdpa_prefill.py's JSON of one run:
bf16 KV >= 0.9x the PyTorch causal bf16 SDPA peer at 8K and 32K; the 8-bit (int8, fp8, fp8_e5m2,
q8_0) and 4-bit (q4_0, k8v4) formats >= 0.8x. Prints a table; writes JSON (met, ratio, and by how
much a missed bar falls short).   assess_prefill.py KVGATE.json PEER.json OUT.json"""
import json
import os
import sys
import tempfile

BARS = {"bf16": 0.9, "int8": 0.8, "fp8": 0.8, "fp8_e5m2": 0.8, "q8_0": 0.8, "q4_0": 0.8, "k8v4": 0.8}


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    kv = json.load(open(sys.argv[1]))
    peer = json.load(open(sys.argv[2]))
    p = {r["n"]: r["tflops"] for r in peer["peer"]}
    rows = []
    print("| format | n | path | kvgate TFLOP/s | peer TFLOP/s | ratio | bar | met |")
    print("|---|---|---|---|---|---|---|---|")
    for r in kv["prefill"]:
        n, f = r["n"], r["format"]
        ratio = r["tflops"] / p[n] if n in p and r["tflops"] else None
        bar = BARS.get(f) if n in (8192, 32768) else None
        met = None if bar is None or ratio is None else ratio >= bar
        rows.append({**r, "peer_tflops": p.get(n), "ratio": ratio, "bar": bar, "met": met,
                     "short_by": None if met is None or met else bar - ratio})
        print(f"| {f} | {n} | {r['path']} | {r['tflops']:.1f} | {p.get(n, float('nan')):.1f} | "
              f"{ratio if ratio is None else round(ratio, 3)} | {bar} | {met} |")
    doc = {"schema": "kvgate.bench.cuda_prefill_bars/1", "device": kv["device"], "peer_device": peer["device"],
           "rows": rows}
    d = os.path.dirname(os.path.abspath(sys.argv[3]))
    with tempfile.NamedTemporaryFile("w", dir=d, delete=False) as fh:
        json.dump(doc, fh, indent=2)
    os.replace(fh.name, sys.argv[3])


if __name__ == "__main__":
    main()
