#!/usr/bin/env python3
"""Trains kvgate's probe model: a small Llama (transformers' LlamaForCausalLM, so the exported
directory is a plain Hugging Face checkpoint) that solves the needle, counting and echo probes of
datasets/probes/RECIPE.md at up to 8K tokens with a byte-level vocabulary.

Runs on one CUDA GPU with PyTorch + transformers and no network. Every hyper-parameter is an
argument below with its default; the data come from datasets/probes/recipe.py (the same recipe the
C++ probes use) with trainer seeds drawn from 2**32 upward, so no evaluation seed (1..1000) is seen.

    python3 datasets/models/probe/train.py train  --work DIR [--steps N --max-seconds S]   (resumable)
    python3 datasets/models/probe/train.py export --work DIR --out datasets/models/probe
    python3 datasets/models/probe/train.py eval   --model datasets/models/probe --json FILE

Vocabulary: ids 0..255 are the bytes, 256 = BOS, 257 = EOS, 258 = PAD (259 in all).
"""
import argparse
import json
import math
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "probes"))
import recipe  # noqa: E402  (datasets/probes/recipe.py)

BOS, EOS, PAD, VOCAB = 256, 257, 258, 259
TRAIN_SEED_BASE = 1 << 32  # RECIPE.md: evaluation seeds are 1..1000, trainers draw from 2^32 up

# The architecture (also written to config.json by `export`).
ARCH = dict(
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=6,
    num_attention_heads=4,   # head_dim 64
    num_key_value_heads=2,   # GQA: 2 query heads per KV head
    head_dim=64,
    max_position_embeddings=8448,  # trained on 8192-token rows; +256 leaves room for an answer after an 8K prompt
    rope_theta=10000.0,      # transformers' rotate_half convention (non-interleaved halves)
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    vocab_size=VOCAB,
    bos_token_id=BOS,
    eos_token_id=EOS,
    pad_token_id=PAD,
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
)


# ---- data ------------------------------------------------------------------------------------------

def enc(text):
    return list(text.encode("utf-8"))


FILLER_SUBJECTS = ["The cat", "A small robot", "My neighbour", "The old clock", "Every morning the baker",
                   "The river", "A tired engineer", "The lighthouse keeper", "Our team", "The red kite"]
FILLER_VERBS = ["watched", "counted", "repaired", "found", "carried", "painted", "forgot", "remembered",
                "measured", "followed"]
FILLER_OBJECTS = ["the boats in the harbour", "three blue stones", "a letter from the city", "the broken gate",
                  "the numbers on the wall", "a quiet song", "the last train", "seven paper cranes",
                  "the map of the valley", "a jar of honey"]
FILLER_ENDINGS = [".", " before noon.", " and smiled.", " again.", " in the rain.", " without a word.",
                  " for an hour.", " with great care."]


def filler_doc(rng, max_bytes):
    """Plain text so the model is not only a probe machine: templated sentences or a raw log."""
    if rng.random() < 0.5:
        out = []
        n = 0
        while n < max_bytes:
            s = "%s %s %s%s " % (rng.choice(FILLER_SUBJECTS), rng.choice(FILLER_VERBS), rng.choice(FILLER_OBJECTS),
                                 rng.choice(FILLER_ENDINGS))
            if rng.random() < 0.15:
                s += "\n"
            out.append(s)
            n += len(s)
        return "".join(out)[:max_bytes]
    g = recipe.SplitMix64(rng.getrandbits(63) + TRAIN_SEED_BASE)
    clock = [g.below(43200) * 1000]
    out = []
    n = 0
    while n < max_bytes:
        line = recipe.next_line(g, clock)[1]
        out.append(line)
        n += len(line)
    return "".join(out)[:max_bytes]


def sample_doc(rng, room, w_prompt):
    """One training document as (tokens, weights) with len <= room (room >= 64).

    weights[t] is the loss weight of predicting tokens[t] from tokens[:t]: 1 on answers (the
    continuation the probes score, its newline and EOS), w_prompt on prompt / filler text."""
    r = rng.random()
    if r < 0.45:  # needle, length log-uniform over 128..min(room, 8192)
        hi = min(room, 8192)
        if hi < 160:
            return None
        length = int(math.exp(rng.uniform(math.log(128), math.log(hi))))
        u = rng.random()
        depth = 0.0 if u < 0.05 else 1.0 if u < 0.10 else rng.random()
        case = recipe.make_needle(length, depth, TRAIN_SEED_BASE + rng.getrandbits(40))
        prompt, answer = case["prompt"], " %s\n" % case["key"]
    elif r < 0.70:  # counting, N up to 450 (the probe asks up to 300)
        n = rng.randint(1, 450)
        case = recipe.make_counting(n)
        prompt, answer = case["prompt"], case["expected"] + "\n"
    elif r < 0.90:  # echo, the recipe's number distribution (1..12 digits) with trainer seeds
        case = recipe.make_echo(TRAIN_SEED_BASE + rng.getrandbits(40), rng.randint(0, 1 << 20))
        prompt, answer = case["prompt"], " %s\n" % case["number"]
    else:
        text = filler_doc(rng, rng.randint(32, min(room, 4096) - 1))
        toks = [BOS] + enc(text)
        return toks, [0.0] + [w_prompt] * (len(toks) - 1)
    p = [BOS] + enc(prompt)
    a = enc(answer) + [EOS]
    if len(p) + len(a) > room:
        return None
    return p + a, [0.0] + [w_prompt] * (len(p) - 1) + [1.0] * len(a)


def make_row(rng, seq_len, w_prompt):
    """Packs documents into one row of seq_len tokens; the tail is PAD with weight 0."""
    toks, wts = [], []
    tries = 0
    while seq_len - len(toks) >= 64 and tries < 50:
        d = sample_doc(rng, seq_len - len(toks), w_prompt)
        tries += 1
        if d is None:
            continue
        toks += d[0]
        wts += d[1]
    pad = seq_len - len(toks)
    return toks + [PAD] * pad, wts + [0.0] * pad


def make_batch(task):
    """One batch for Pool.imap: task = (seed, index, rows, seq_len, w_prompt). Returns the tokens as
    int16 bytes and the weights as float32 bytes (compact to pass between processes)."""
    from array import array
    seed, index, rows, seq_len, w_prompt = task
    rng = random.Random((seed << 32) ^ index)
    t, w = array("h"), array("f")
    for _ in range(rows):
        a, b = make_row(rng, seq_len, w_prompt)
        t.extend(a)
        w.extend(b)
    return t.tobytes(), w.tobytes()


# ---- training --------------------------------------------------------------------------------------

def build_model(torch, transformers):
    args = dict(ARCH)
    theta = args.pop("rope_theta")
    try:  # transformers >= 5 keeps RoPE settings in rope_parameters
        cfg = transformers.LlamaConfig(**args, rope_parameters={"rope_type": "default", "rope_theta": theta})
    except TypeError:
        cfg = transformers.LlamaConfig(**args, rope_theta=theta)
    return transformers.LlamaForCausalLM(cfg)


def lr_at(step, a, frac=None):
    """Linear warmup over a.warmup steps, then cosine to a.min_lr_ratio * a.lr. The cosine runs over
    the step budget, or over the wall-clock budget (frac = elapsed / max_seconds) when one is set, so
    a run that is limited by time still ends at the low learning rate."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = frac if frac is not None else (step - a.warmup) / max(1, a.steps - a.warmup)
    t = min(1.0, max(0.0, t))
    return a.lr * (a.min_lr_ratio + (1 - a.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def cmd_train(a):
    # The data processes are forked before torch/CUDA exist in this process (forking after CUDA
    # initialisation can deadlock the children).
    import multiprocessing as mp
    pool = mp.get_context("fork").Pool(a.workers)
    import torch
    import transformers

    torch.manual_seed(a.seed)
    os.makedirs(a.work, exist_ok=True)
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    model = build_model(torch, transformers).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    ckpt = os.path.join(a.work, "ckpt.pt")
    step = 0
    if a.init:  # continue from exported weights (optimizer moments start fresh, after a new warmup)
        src = load_hf(a.init, dev)
        model.load_state_dict(src.state_dict())
        del src
        step = a.init_step
        print("initialized from %s at step %d" % (a.init, step), flush=True)
    elif os.path.exists(ckpt):
        st = torch.load(ckpt, map_location=dev)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step = st["step"]
        print("resumed at step %d" % step, flush=True)
    log = open(os.path.join(a.work, "train_log.jsonl"), "a")
    if step == 0:
        log.write(json.dumps({"event": "start", "params": nparams, "args": vars(a), "arch": ARCH,
                              "torch": torch.__version__, "transformers": transformers.__version__,
                              "gpu": torch.cuda.get_device_name(0)}) + "\n")
    print("params %d (%.2f M), gpu %s, torch %s, transformers %s" %
          (nparams, nparams / 1e6, torch.cuda.get_device_name(0), torch.__version__, transformers.__version__),
          flush=True)

    # Bounded prefetch: 2 batches per worker in flight (Pool.imap would run ahead without limit).
    import collections
    pending = collections.deque()
    next_index = [step]

    def refill():
        while len(pending) < 2 * a.workers:
            pending.append(pool.apply_async(make_batch, ((a.seed, next_index[0], a.rows, a.seq_len, a.w_prompt),)))
            next_index[0] += 1

    refill()
    model.train()
    t0 = time.time()
    tok_seen = 0
    ema = None
    while step < a.steps:
        if a.max_seconds and time.time() - t0 > a.max_seconds:
            break
        tb, wb = pending.popleft().get()
        refill()
        x = torch.frombuffer(bytearray(tb), dtype=torch.int16).view(a.rows, a.seq_len).to(dev).long()
        wt = torch.frombuffer(bytearray(wb), dtype=torch.float32).view(a.rows, a.seq_len).to(dev)
        frac = (time.time() - t0) / a.max_seconds if a.max_seconds else None
        lr = lr_at(step, a, frac)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        ce = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, VOCAB), x[:, 1:].reshape(-1),
                                               reduction="none").view(x.shape[0], -1)
        ww = wt[:, 1:]
        loss = (ce * ww).sum() / ww.sum().clamp_min(1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        step += 1
        tok_seen += x.numel()
        if step % 25 == 0 or step == 1:
            with torch.no_grad():
                ans = (ww == 1.0)
                ans_loss = (ce * ans).sum() / ans.sum().clamp_min(1)
                ans_acc = ((logits[:, :-1].argmax(-1) == x[:, 1:]) & ans).sum() / ans.sum().clamp_min(1)
            li = loss.item()
            ema = li if ema is None else 0.9 * ema + 0.1 * li
            el = time.time() - t0
            rec = {"step": step, "loss": round(li, 4), "answer_loss": round(ans_loss.item(), 4),
                   "answer_acc": round(ans_acc.item(), 5), "lr": lr, "grad_norm": round(gn.item(), 3),
                   "tok_per_s": round(tok_seen / el), "elapsed_s": round(el, 1)}
            log.write(json.dumps(rec) + "\n")
            log.flush()
            if step % 100 == 0 or step == 1:
                print(json.dumps(rec), flush=True)
    pool.terminate()
    tmp = ckpt + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, ckpt)
    log.write(json.dumps({"event": "stop", "step": step, "elapsed_s": round(time.time() - t0, 1)}) + "\n")
    log.close()
    print("saved step %d to %s" % (step, ckpt), flush=True)
    if a.out:
        export_state(model.state_dict(), step, a.out)


# ---- export ----------------------------------------------------------------------------------------

def tokenizer_json():
    """A byte-level tokenizer.json: the 256 byte tokens (GPT-2 byte->unicode map), no merges, and
    BOS/EOS/PAD as added special tokens."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    specials = [("<|bos|>", BOS), ("<|eos|>", EOS), ("<|pad|>", PAD)]
    for s, i in specials:
        vocab[s] = i
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for s, i in specials],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        # The model is trained on [BOS] + text: the tokenizer says so, as Llama's does (the
        # tokenizers library, transformers and kvgate add BOS only when the post-processor does).
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<|bos|>", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|bos|>": {"id": "<|bos|>", "ids": [BOS], "tokens": ["<|bos|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def config_json(dtype):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": dtype}
    c.update(ARCH)
    c["rope_parameters"] = {"rope_type": "default", "rope_theta": ARCH["rope_theta"]}
    c["rope_scaling"] = None
    c["attention_dropout"] = 0.0
    c["initializer_range"] = 0.02
    c["use_cache"] = True
    return c


def write_atomic(path, data, mode="w"):
    tmp = path + ".tmp"
    with open(tmp, mode) as f:
        f.write(data)
    os.replace(tmp, path)


def export_state(sd, step, out, shard_bytes=15 << 20):
    """Writes a Hugging Face directory: f32 weights in safetensors shards of <= shard_bytes (the device
    returns files of at most 16 MiB) with model.safetensors.index.json, config.json, tokenizer.json."""
    import torch
    from safetensors.torch import save_file

    sd = {k: v.detach().to(torch.float32).cpu().contiguous() for k, v in sd.items()
          if not k.endswith("rotary_emb.inv_freq")}
    os.makedirs(out, exist_ok=True)
    shards, cur, size = [], {}, 0
    for k in sorted(sd):
        nb = sd[k].numel() * 4
        if cur and size + nb > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = sd[k]
        size += nb
    shards.append(cur)
    weight_map = {}
    for i, sh in enumerate(shards):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        tmp = os.path.join(out, name + ".tmp")
        save_file(sh, tmp, metadata={"format": "pt", "kvgate_probe_step": str(step)})
        os.replace(tmp, os.path.join(out, name))
        for k in sh:
            weight_map[k] = name
    total = sum(v.numel() * 4 for v in sd.values())
    write_atomic(os.path.join(out, "model.safetensors.index.json"),
                 json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1) + "\n")
    write_atomic(os.path.join(out, "config.json"), json.dumps(config_json("float32"), indent=2) + "\n")
    write_atomic(os.path.join(out, "tokenizer.json"), json.dumps(tokenizer_json(), indent=1) + "\n")
    print("exported step %d: %d tensors in %d shards, %.2f M params to %s" %
          (step, len(sd), len(shards), total / 4e6, out), flush=True)


def cmd_export(a):
    import torch
    st = torch.load(os.path.join(a.work, "ckpt.pt"), map_location="cpu")
    export_state(st["model"], st["step"], a.out)


# ---- evaluation (GPU, greedy, the recipe's prompts and scoring) ---------------------------------------

def load_hf(model_dir, dev):
    import torch
    import transformers
    m = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return m.to(dev).eval()


def greedy(torch, model, ids, new_tokens, dev):
    x = torch.tensor([ids], dtype=torch.long, device=dev)
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, do_sample=False,
                         eos_token_id=EOS, pad_token_id=PAD)
    return [t for t in out[0, len(ids):].tolist()]


def decode_bytes(toks):
    return bytes(t for t in toks if t < 256).decode("utf-8", errors="replace")


def first_word(s):
    w = s.split()
    return w[0].rstrip(".,;:!?") if w else ""


def cmd_eval(a):
    import torch
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_hf(a.model, dev)
    res = {"model": a.model, "needle": [], "counting": [], "echo": []}
    lengths = [int(x) for x in a.lengths.split(",")]
    depths = [i / 10 for i in range(11)]
    seeds = [int(x) for x in a.seeds.split(",")]
    with torch.no_grad():
        for L in lengths:
            for d in depths:
                for s in seeds:
                    c = recipe.make_needle(L, d, s)
                    out = decode_bytes(greedy(torch, model, [BOS] + enc(c["prompt"]), 8 + 2 + 6, dev))
                    res["needle"].append({"length": L, "depth": d, "seed": s, "pass": first_word(out) == c["key"],
                                          "output": out})
        for n in [int(x) for x in a.counts.split(",")]:
            c = recipe.make_counting(n)
            out = decode_bytes(greedy(torch, model, [BOS] + enc(c["prompt"]), len(c["expected"]) + 6, dev))
            import re
            got = [int(x) for x in re.findall(r"\d+", out)][:n]
            res["counting"].append({"n": n, "pass": got == list(range(1, n + 1)), "output": out[:200]})
        for i in range(a.echo):
            c = recipe.make_echo(1, i)
            out = decode_bytes(greedy(torch, model, [BOS] + enc(c["prompt"]), len(c["number"]) + 2 + 6, dev))
            res["echo"].append({"seed": 1, "index": i, "number": c["number"], "pass": first_word(out) == c["number"],
                                "output": out})
    summ = {}
    for k in ("needle", "counting", "echo"):
        v = res[k]
        summ[k] = {"cases": len(v), "passed": sum(1 for r in v if r["pass"])}
    by_len = {}
    for r in res["needle"]:
        b = by_len.setdefault(r["length"], [0, 0])
        b[0] += r["pass"]
        b[1] += 1
    summ["needle_by_length"] = {str(k): "%d/%d" % tuple(v) for k, v in sorted(by_len.items())}
    res["summary"] = summ
    print(json.dumps(summ, indent=1))
    if a.json:
        write_atomic(a.json, json.dumps(res, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--work", required=True, help="checkpoint + log folder (resumes from ckpt.pt there)")
    t.add_argument("--steps", type=int, default=3000, help="total optimizer steps (the LR schedule spans them)")
    t.add_argument("--max-seconds", type=float, default=0, help="stop and checkpoint after this long (0 = off)")
    t.add_argument("--rows", type=int, default=16, help="rows per batch")
    t.add_argument("--seq-len", type=int, default=8192, help="tokens per row (documents packed)")
    t.add_argument("--lr", type=float, default=1.5e-3)
    t.add_argument("--min-lr-ratio", type=float, default=0.1)
    t.add_argument("--warmup", type=int, default=200)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--clip", type=float, default=1.0)
    t.add_argument("--w-prompt", type=float, default=0.1, help="loss weight of prompt/filler tokens (answers: 1)")
    t.add_argument("--workers", type=int, default=12, help="data-generation processes")
    t.add_argument("--seed", type=int, default=20261129)
    t.add_argument("--out", default="", help="also export the final weights as a Hugging Face directory here")
    t.add_argument("--init", default="", help="start from this exported directory instead of a fresh init")
    t.add_argument("--init-step", type=int, default=0, help="the step the --init weights were saved at")
    e = sub.add_parser("export")
    e.add_argument("--work", required=True)
    e.add_argument("--out", required=True)
    v = sub.add_parser("eval")
    v.add_argument("--model", required=True)
    v.add_argument("--lengths", default="512,1024,2048,4096,8192")
    v.add_argument("--seeds", default="1,2,3")
    v.add_argument("--counts", default="10,30,100,300")
    v.add_argument("--echo", type=int, default=100)
    v.add_argument("--json", default="")
    a = ap.parse_args()
    {"train": cmd_train, "export": cmd_export, "eval": cmd_eval}[a.cmd](a)


if __name__ == "__main__":
    main()
