#!/usr/bin/env python3
"""Cross-checks kvgate's f32 forward against Hugging Face transformers (code the project did not write).

Step 1, where transformers is installed (the H200 here):
    python3 datasets/models/probe/crosscheck.py hf --model datasets/models/probe --out DIR
  writes DIR/hf.json (the 4 prompts' token ids, HF greedy continuations) and DIR/hf_logits.f32
  (float32 little-endian, [prompt][position][vocab], 4 x 512 x 259).
Step 2, beside a kvgate build (standard library only):
    python3 datasets/models/probe/crosscheck.py kvgate --kvgate build/kvgate --model datasets/models/probe --hf DIR --out DIR
  runs `kvgate logits` on the same ids and the same greedy continuations, and compares: NMSE and
  max-abs of the logits over all 4 x 512 positions, argmax agreement, and greedy agreement over 256
  steps. Writes DIR/crosscheck.json and prints the table.
"""
import argparse
import array
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "probes"))
import recipe  # noqa: E402

BOS, EOS = 256, 257
POSITIONS = 512
GREEDY_STEPS = 256


def prompts():
    """Four 512-token inputs (BOS + bytes) from the probe recipe with evaluation seeds, so they mix
    log text, a needle question, counting and echo."""
    out = []
    c = recipe.make_needle(POSITIONS, 0.5, 1)
    e = recipe.make_echo(1, 0)
    out.append(("needle L=512 d=0.5 seed=1 + answer + echo", c["prompt"] + " " + c["key"] + "\n" + e["prompt"]))
    cnt = recipe.make_counting(300)
    out.append(("counting N=300", cnt["prompt"] + cnt["expected"]))
    s = ""
    i = 0
    while len(s) < 600:
        e = recipe.make_echo(7, i)
        s += e["prompt"] + " " + e["number"] + "\n"
        i += 1
    out.append(("echo seed=7 x%d" % i, s))
    c = recipe.make_needle(1024, 0.1, 2)
    out.append(("needle L=1024 d=0.1 seed=2 (first 512 tokens)", c["prompt"]))
    res = []
    for name, text in out:
        ids = [BOS] + list(text.encode("utf-8"))
        res.append({"name": name, "ids": ids[:POSITIONS]})
    assert all(len(r["ids"]) == POSITIONS for r in res)
    return res


def greedy_prompts():
    """Prompts for the 256-step greedy comparison (continuations long enough to matter)."""
    return [("count to 100", [BOS] + list(recipe.make_counting(100)["prompt"].encode())),
            ("needle L=2048 d=0.3 seed=3", [BOS] + list(recipe.make_needle(2048, 0.3, 3)["prompt"].encode())),
            ("filler: The cat", [BOS] + list(b"The cat watched the boats in the harbour. "))]


def cmd_hf(a):
    import torch
    import transformers
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = transformers.LlamaForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                                          attn_implementation="eager").to(dev).eval()
    os.makedirs(a.out, exist_ok=True)
    ps = prompts()
    logits = array.array("f")
    with torch.no_grad():
        for p in ps:
            x = torch.tensor([p["ids"]], device=dev)
            lg = model(input_ids=x).logits[0].float().cpu()
            logits.extend(lg.reshape(-1).tolist())
        greedy = []
        for name, ids in greedy_prompts():
            # Plain argmax over the whole vocabulary, EOS included and not stopping there: no
            # generation-config logic (min length, EOS handling) between the two sides.
            seq = list(ids)
            for _ in range(GREEDY_STEPS):
                lg = model(input_ids=torch.tensor([seq], device=dev)).logits[0, -1]
                seq.append(int(torch.argmax(lg).item()))
            greedy.append({"name": name, "prompt": ids, "tokens": seq[len(ids):]})
    with open(os.path.join(a.out, "hf_logits.f32"), "wb") as f:
        logits.tofile(f)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
            "attn_implementation": "eager", "tf32": False, "vocab": model.config.vocab_size,
            "prompts": ps, "greedy": greedy}
    with open(os.path.join(a.out, "hf.json"), "w") as f:
        json.dump(meta, f)
    print("wrote %d prompts x %d positions of logits, %d greedy runs" % (len(ps), POSITIONS, len(greedy)))


def run_kvgate(a, ids, extra):
    cmd = [a.kvgate, "logits", "--model", a.model, "--kv", "f32", "--ids", ",".join(map(str, ids))] + extra
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def cmd_kvgate(a):
    meta = json.load(open(os.path.join(a.hf, "hf.json")))
    vocab = meta["vocab"]
    hf = array.array("f")
    with open(os.path.join(a.hf, "hf_logits.f32"), "rb") as f:
        hf.frombytes(f.read())
    os.makedirs(a.out, exist_ok=True)
    rows = []
    tot_err = tot_ref = 0.0
    tot_max = 0.0
    tot_arg = tot_pos = 0
    for k, p in enumerate(meta["prompts"]):
        dump = os.path.join(a.out, "kvgate_logits_%d.f32" % k)
        run_kvgate(a, p["ids"], ["--logits-out", dump])
        kv = array.array("f")
        with open(dump, "rb") as f:
            kv.frombytes(f.read())
        n = len(p["ids"])
        assert len(kv) == n * vocab, "kvgate wrote %d floats, expected %d" % (len(kv), n * vocab)
        base = k * n * vocab
        err = ref = mx = 0.0
        arg = 0
        for t in range(n):
            h = hf[base + t * vocab: base + (t + 1) * vocab]
            g = kv[t * vocab: (t + 1) * vocab]
            if not all(math.isfinite(x) for x in g):
                raise SystemExit("kvgate logits at prompt %d position %d are not finite" % (k, t))
            for x, y in zip(h, g):
                d = x - y
                err += d * d
                ref += x * x
                mx = max(mx, abs(d))
            arg += max(range(vocab), key=h.__getitem__) == max(range(vocab), key=g.__getitem__)
        rows.append({"prompt": p["name"], "positions": n, "nmse": err / ref, "max_abs": mx, "argmax_agree": arg / n})
        tot_err += err
        tot_ref += ref
        tot_max = max(tot_max, mx)
        tot_arg += arg
        tot_pos += n
        os.remove(dump)
    greedy = []
    for g in meta["greedy"]:
        out = json.loads(run_kvgate(a, g["prompt"], ["--greedy", str(GREEDY_STEPS), "--json"]))
        toks = out["tokens"]
        same = 0
        while same < min(len(toks), len(g["tokens"])) and toks[same] == g["tokens"][same]:
            same += 1
        greedy.append({"prompt": g["name"], "steps": GREEDY_STEPS, "identical_prefix": same,
                       "all_identical": toks == g["tokens"]})
    res = {"hf": {k: meta[k] for k in ("transformers", "torch", "device", "attn_implementation", "tf32")},
           "kvgate": {"kv": "f32", "backend": "cpu"},
           "logits": {"prompts": rows, "positions": tot_pos, "nmse": tot_err / tot_ref, "max_abs": tot_max,
                      "argmax_agree": tot_arg / tot_pos},
           "greedy": greedy}
    tmp = os.path.join(a.out, "crosscheck.json.tmp")
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(a.out, "crosscheck.json"))
    print("| prompt | positions | NMSE | max-abs | argmax agree |\n|---|---|---|---|---|")
    for r in rows:
        print("| %s | %d | %.3g | %.3g | %.4f |" % (r["prompt"], r["positions"], r["nmse"], r["max_abs"], r["argmax_agree"]))
    print("| all | %d | %.3g | %.3g | %.4f |" % (tot_pos, tot_err / tot_ref, tot_max, tot_arg / tot_pos))
    for g in greedy:
        print("greedy %-30s %d/%d identical" % (g["prompt"], g["identical_prefix"], g["steps"]))
    ok = tot_err / tot_ref < a.max_nmse and all(g["all_identical"] for g in greedy)
    print("cross-check %s (bound: NMSE < %g, greedy identical over %d steps)" % ("PASS" if ok else "FAIL", a.max_nmse,
                                                                                GREEDY_STEPS))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hf")
    h.add_argument("--model", required=True)
    h.add_argument("--out", required=True)
    k = sub.add_parser("kvgate")
    k.add_argument("--kvgate", default="build/kvgate")
    k.add_argument("--model", required=True)
    k.add_argument("--hf", required=True, help="folder with hf.json and hf_logits.f32 from step 1")
    k.add_argument("--out", required=True)
    # Both sides compute in f32 with different summation orders over <= 1024-long dot products, so
    # per-logit differences are ~1e-6 relative; 1e-6 NMSE leaves room for that and none for a wrong
    # RoPE convention, norm or head mapping (those give NMSE >> 1e-3).
    k.add_argument("--max-nmse", type=float, default=1e-6)
    a = ap.parse_args()
    sys.exit({"hf": cmd_hf, "kvgate": cmd_kvgate}[a.cmd](a) or 0)


if __name__ == "__main__":
    main()
