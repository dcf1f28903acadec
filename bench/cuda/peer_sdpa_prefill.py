#!/usr/bin/env python3
"""Peer for bench_prefill_attn: PyTorch scaled_dot_product_attention, causal, bf16, flash backend,
Llama-3-8B attention shape (32 query heads, 8 KV heads via enable_gqa, head_dim 128), batch 1, at
the same contexts, in the same run. TFLOP/s = 4 * n^2 / 2 * heads * head_dim / time (the count
bench_prefill_attn uses). CUDA events, median of --reps calls after a warm-up call.
Writes JSON (schema kvgate.bench.torch_prefill_peer/1) with the GPU name, driver and CUDA versions."""
import argparse
import json
import os
import subprocess
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D = 32, 8, 128


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="torch_prefill_peer.json")
    ap.add_argument("--contexts", default="4096,8192,32768")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    for n in [int(x) for x in a.contexts.split(",")]:
        g = torch.Generator(device=dev).manual_seed(n)
        q = torch.randn(1, HQ, n, D, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, HKV, n, D, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, HKV, n, D, device=dev, dtype=torch.bfloat16, generator=g) * 0.05
        best = None
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            try:
                with sdpa_kernel([backend]):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    torch.cuda.synchronize()
                    ts = []
                    for _ in range(a.reps):
                        e0 = torch.cuda.Event(enable_timing=True)
                        e1 = torch.cuda.Event(enable_timing=True)
                        e0.record()
                        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                        e1.record()
                        e1.synchronize()
                        ts.append(e0.elapsed_time(e1))
                ts.sort()
                ms = ts[len(ts) // 2]
                flops = 4.0 * n * n / 2 * HQ * D
                r = {"n": n, "backend": str(backend).split(".")[-1], "time_ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}
                print(r, flush=True)
                if best is None or r["tflops"] > best["tflops"]:
                    best = r
            except RuntimeError as e:  # a backend not available for this shape/build
                print(f"n={n} {backend}: not available: {str(e).splitlines()[0]}", flush=True)
        if best:
            rows.append(best)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    doc = {"schema": "kvgate.bench.torch_prefill_peer/1",
           "device": {"name": torch.cuda.get_device_name(0), "nvidia_smi": smi, "torch": torch.__version__,
                      "cuda": torch.version.cuda},
           "shape": {"n_heads": HQ, "n_kv_heads": HKV, "head_dim": D, "batch": 1, "causal": True, "dtype": "bf16"},
           "peer": rows}
    d = os.path.dirname(os.path.abspath(a.out))
    with tempfile.NamedTemporaryFile("w", dir=d, delete=False) as f:
        json.dump(doc, f, indent=2)
    os.replace(f.name, a.out)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
