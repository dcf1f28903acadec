#!/usr/bin/env python3
"""The Markdown summary of one families run (bench/cuda/families_device_run.sh): bench_e2e_decode's
JSON for the plain Llama, the llama3-RoPE Llama and the Gemma 3 model of the same run, side by side
per KV preset: decode tok/s at the run's context x batch and the ratios llama3/plain and
gemma3/plain, the TTFT of the prompt and its ratios, and the plain figures of an earlier committed
run (--before, schema /1 or /2) for the plain path's speed across versions. Reads partial documents
("complete": false: a run cut short) and says so; a missing file is a missing column.

  families_summary.py --plain P.json --llama3 L.json --gemma3 G.json [--before B.json]
                      [--device device.txt] --out SUMMARY.md
"""
import argparse
import json
import os
import sys
import tempfile


def load(path, what):
    if not path or not os.path.exists(path):
        return None, f"{what}: no file ({path or 'not given'})"
    try:
        with open(path) as f:
            return json.load(f), None
    except (OSError, ValueError) as e:
        return None, f"{what}: '{path}' is not readable JSON ({e})"


def rows(doc):
    return {r["format"]: r for r in doc.get("results", [])} if doc else {}


def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def tok(r):
    return r.get("tok_s") if r else None


def ttft(r):
    t = (r or {}).get("ttft") or {}
    return t.get("wall_ms")


def why_not(r, key):
    """Why a row has no decode (key 'decode') or TTFT (key 'ttft') figure, in a few words."""
    if r is None:
        return "not run"
    if "skipped" in r:
        return "skipped"
    if key == "decode":
        if "decode_skipped" in r:
            return "skipped (pool)"
        if "decode_error" in r:
            return "error"
    else:
        t = r.get("ttft") or {}
        if "skipped" in t:
            return "skipped (pool)"
        if "error" in t:
            return "error"
    return "-"


def cell(v, r, key, nd=1):
    return fmt(v, nd) if v is not None else why_not(r, key)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plain", required=True)
    ap.add_argument("--llama3", required=True)
    ap.add_argument("--gemma3", required=True)
    ap.add_argument("--before")
    ap.add_argument("--device")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    notes = []
    docs = {}
    for name in ("plain", "llama3", "gemma3"):
        d, err = load(getattr(a, name), name)
        docs[name] = d
        if err:
            notes.append(err)
        elif not d.get("complete"):
            notes.append(f"{name}: the run was cut short (\"complete\": false); its missing presets say \"not run\"")
    before, err = load(a.before, "before") if a.before else (None, None)
    if err:
        notes.append(err)
    R = {k: rows(v) for k, v in docs.items()}
    B = rows(before)

    order = []
    for d in docs.values():
        for r in (d or {}).get("results", []):
            if r["format"] not in order:
                order.append(r["format"])

    out = ["# Model families on the CUDA engine: decode and TTFT per KV preset", ""]
    if a.device and os.path.exists(a.device):
        with open(a.device) as f:
            dev = [ln.strip() for ln in f if ln.strip()]
        out += ["Device (nvidia-smi, nvcc, tree): " + " · ".join(dev), ""]
    any_doc = next((d for d in docs.values() if d), None)
    if any_doc:
        dv = any_doc["device"]
        out += [f"Bench's device record: {dv['name']} (cc {dv['cc']}, {dv['sm_count']} SMs, "
                f"{dv['total_mem'] / 2**30:.1f} GiB), driver API {dv['driver']}, CUDA runtime {dv['cuda_runtime']}.", ""]
        s = any_doc["setup"]
        out += [f"Decode: context {s['context']} x batch {s['batch']}, median of {s['steps']} steps after "
                f"{s['warmup']} (CUDA graph replay; KV filled with random rows through the store kernel). "
                "tok/s = batch / host wall time of a step.", ""]
        if "ttft" in s:
            t = s["ttft"]
            out += [f"TTFT: one {t['prompt_tokens']}-token prompt, the CUDA engine's greedy prefill (chunks of "
                    f"{t['prefill_chunk']} tokens through CudaForward::forward_chunk, the last one's GPU argmax is the "
                    f"first token), median of {t['runs']} runs after {t['warmup']}; host wall ms.", ""]
    out += ["Models (random bf16 weights generated on the device, shapes of the real checkpoints):", ""]
    for name, d in docs.items():
        if not d:
            out.append(f"- {name}: no result")
            continue
        m = d["model"]
        c = m.get("config", {})
        line = (f"- **{name}**: {m['shape']} ({m['arch']}), {m['layers']} layers ({m.get('layers_note', '')}), "
                f"heads {c.get('heads')}/{c.get('kv_heads')}, head_dim {c.get('head_dim')}, vocab {c.get('vocab')}, "
                f"RoPE {c.get('rope', {}).get('describe') or c.get('rope', {}).get('type')}, "
                f"{m['weight_bytes'] / 1e9:.2f} GB of weights")
        if c.get("sliding_layers"):
            line += (f"; {c['sliding_layers']} sliding layers (window {c.get('window')}, local RoPE "
                     f"{c.get('rope_local', {}).get('type')} theta {c.get('rope_local', {}).get('theta')}), "
                     f"{c['global_layers']} global")
        out.append(line)
        if m.get("kv_release"):
            out.append(f"  - KV pages: {m['kv_release']}")
    out.append("")

    have_before = bool(B)
    hdr = ["KV", "plain tok/s", "llama3 tok/s", "llama3/plain", "gemma3 tok/s", "gemma3/plain"]
    if have_before:
        hdr += ["plain, before", "plain now/before"]
    out += ["## Decode tok/s", "", "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for f in order:
        p, l, g = R["plain"].get(f), R["llama3"].get(f), R["gemma3"].get(f)
        cells = [f, cell(tok(p), p, "decode"), cell(tok(l), l, "decode"), fmt(ratio(tok(l), tok(p)), 3),
                 cell(tok(g), g, "decode"), fmt(ratio(tok(g), tok(p)), 3)]
        if have_before:
            b = B.get(f)
            cells += [fmt(tok(b)) if tok(b) is not None else "-", fmt(ratio(tok(p), tok(b)), 3)]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "- llama3/plain: the same model with Llama 3.1's RoPE (a static table like the plain one), so 1.0 is "
            "the expectation. gemma3/plain compares two different models (the Gemma 3 4B shape against the Llama 8B "
            "one: other weights, KV bytes and attention windows); it places the Gemma path, it is not a regression "
            "measure."]
    if have_before:
        out += ["- plain now/before: the plain Llama path of this tree against the committed run of an earlier tree."]
    out.append("")
    if have_before:
        out += [f"\"before\": {a.before} (date {before.get('date', '?')}, "
                f"{before.get('device', {}).get('name', '?')}; another machine of the same type and another build, "
                "so a few percent either way is machine-to-machine noise, not a change of the code path).", ""]

    if any("ttft" in (r or {}) for d in R.values() for r in d.values()):
        hdr = ["KV", "plain ms", "llama3 ms", "llama3/plain", "gemma3 ms", "gemma3/plain", "plain prefill tok/s",
               "gemma3 prefill tok/s"]
        out += ["## TTFT", "", "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
        for f in order:
            p, l, g = R["plain"].get(f), R["llama3"].get(f), R["gemma3"].get(f)
            pt = lambda r: ((r or {}).get("ttft") or {}).get("prefill_tok_s")  # noqa: E731
            out.append("| " + " | ".join([
                f, cell(ttft(p), p, "ttft"), cell(ttft(l), l, "ttft"), fmt(ratio(ttft(l), ttft(p)), 3),
                cell(ttft(g), g, "ttft"), fmt(ratio(ttft(g), ttft(p)), 3), fmt(pt(p), 0), fmt(pt(g), 0)]) + " |")
        out.append("")

    out += ["## Graph replay vs plain launches (bf16 KV, ms per step)", "",
            "| model | batch graph | batch plain | batch 1 graph | batch 1 plain |", "|---|---|---|---|---|"]
    for name, d in docs.items():
        gv = (d or {}).get("graph_vs_plain") or {}
        if gv:
            b, b1 = gv["batch"], gv["batch1"]
            out.append(f"| {name} | {b['graph_wall_ms']:.3f} | {b['plain_wall_ms']:.3f} | {b1['graph_wall_ms']:.3f} | "
                       f"{b1['plain_wall_ms']:.3f} |")
    out.append("")

    skips = []
    for name, d in R.items():
        for f, r in d.items():
            for k, label in (("skipped", "all"), ("decode_skipped", "decode"), ("decode_error", "decode error")):
                if k in r:
                    skips.append(f"- {name} {f} ({label}): {r[k]}")
            t = r.get("ttft") or {}
            for k, label in (("skipped", "TTFT"), ("error", "TTFT error")):
                if k in t:
                    skips.append(f"- {name} {f} ({label}): {t[k]}")
    if skips:
        out += ["## Skipped or failed", ""] + skips + [""]
    if notes:
        out += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]

    text = "\n".join(out)
    d = os.path.dirname(os.path.abspath(a.out))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".families_summary.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, a.out)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
