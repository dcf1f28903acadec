#!/usr/bin/env python3
"""Writes the committed seed corpus of every harness (fuzz/corpus/<harness>/) from the project's own
valid files: the synth fixture fuzz/fixtures/hf_tiny, the tokenizer fixtures of datasets/, the mutant
catalog, the release policy, report records, and tiny llama2.c / GGUF / KV files written here in the
documented layouts. Run from the repository root: python3 fuzz/make_seeds.py [--models DIR]."""
import json, os, re, struct, sys, glob, shutil

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
models = os.environ.get("KVGATE_MODELS", "")
if "--models" in sys.argv:
    models = sys.argv[sys.argv.index("--models") + 1]
out = os.path.join(root, "fuzz", "corpus")


def put(harness, name, data):
    data = re.sub(rb"[Ii]ssue [0-9]+", b"the tracker", data)  # seeds carry no tracker references
    d = os.path.join(out, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def rd(rel):
    with open(os.path.join(root, rel), "rb") as f:
        return f.read()


def floats(n, k=0):
    return struct.pack("<%df" % n, *[((i * 37 + k * 11) % 17 - 8) / 64.0 for i in range(n)])


# --- llama2.c checkpoint: 7 int32 (dim, hidden, layers, heads, kv_heads, vocab, seq_len), fp32 arrays.
def llama2c(dim=8, hidden=8, layers=1, heads=2, kv_heads=1, vocab=8, seq_len=8, shared=True):
    hs = dim // heads
    kvd = kv_heads * hs
    b = struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab if shared else -vocab, seq_len)
    parts = [vocab * dim, layers * dim, layers * dim * dim, layers * dim * kvd, layers * dim * kvd, layers * dim * dim,
             layers * dim, layers * hidden * dim, layers * dim * hidden, layers * hidden * dim, dim,
             seq_len * hs // 2, seq_len * hs // 2]
    if not shared:
        parts.append(vocab * dim)
    for k, n in enumerate(parts):
        b += floats(n, k)
    return b


put("llama2c", "tiny_shared.bin", llama2c())
put("llama2c", "tiny_unshared.bin", llama2c(shared=False, vocab=5))
put("llama2c", "header_only.bin", llama2c()[:28])


# --- llama2.c tokenizer.bin: max_token_length, then per token: float score, int32 len, bytes.
def tokbin(pieces):
    b = struct.pack("<i", max(len(p) for p in pieces))
    for i, p in enumerate(pieces):
        b += struct.pack("<fi", -float(i), len(p)) + p
    return b


pieces = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % i for i in range(4)] + [b" a", b"b", b"ab", b" ab"]
put("llama2c_tokenizer", "tiny.bin", bytes([len(pieces)]) + tokbin(pieces))
if models and os.path.exists(os.path.join(models, "stories260K", "tok512.bin")):
    with open(os.path.join(models, "stories260K", "tok512.bin"), "rb") as f:
        put("llama2c_tokenizer", "tok512.bin", b"\x00" + f.read())  # first byte 0: vocab 512
# The edges of the reader's checks, valid (the fuzzer mutates across them): an empty piece, a piece of
# exactly max_token_length, the largest finite scores, -0 and the smallest denormal; max_token_length
# at the TOKEN_BYTES limit (65536). Vocab 5, as fuzz/corpus/llama2c/tiny_unshared.bin.
def tokbin_scored(max_len, toks):
    b = struct.pack("<i", max_len)
    for score, p in toks:
        b += struct.pack("<fi", score, len(p)) + p
    return b


flt_max = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]
edge = [(flt_max, b"<unk>"), (-flt_max, b"<s>"), (-0.0, b"</s>"), (1e-45, b""), (-4.0, b"abcde")]
put("llama2c_tokenizer", "edges.bin", bytes([len(edge)]) + tokbin_scored(5, edge))
put("llama2c_tokenizer", "max_len_at_limit.bin", bytes([len(edge)]) + tokbin_scored(65536, edge))


# --- GGUF v3, architecture llama, F32 tensors, SentencePiece tokenizer in metadata.
def gstr(s):
    s = s.encode()
    return struct.pack("<Q", len(s)) + s


def gkv(key, typ, val):
    b = gstr(key) + struct.pack("<I", typ)
    if typ == 4: b += struct.pack("<I", val)          # uint32
    elif typ == 6: b += struct.pack("<f", val)        # float32
    elif typ == 7: b += struct.pack("<?", val)        # bool
    elif typ == 8: b += gstr(val)                     # string
    elif typ == 9:                                    # array (elem type, n, items)
        et, items = val
        b += struct.pack("<IQ", et, len(items))
        for it in items:
            b += gstr(it) if et == 8 else struct.pack("<f" if et == 6 else "<i", it)
    return b


def gguf(dim=8, hidden=8, heads=2, kv_heads=1, ctx=16, extra_kv=()):
    toks = ["<unk>", "<s>", "</s>", "\u2581a", "b", "\u2581ab", "<0x0A>", "c"]
    vocab = len(toks)
    kvd = dim // heads * kv_heads
    kvs = [gkv("general.architecture", 8, "llama"), gkv("general.alignment", 4, 32),
           gkv("llama.context_length", 4, ctx), gkv("llama.embedding_length", 4, dim),
           gkv("llama.block_count", 4, 1), gkv("llama.feed_forward_length", 4, hidden),
           gkv("llama.attention.head_count", 4, heads), gkv("llama.attention.head_count_kv", 4, kv_heads),
           gkv("llama.attention.layer_norm_rms_epsilon", 6, 1e-5), gkv("llama.rope.dimension_count", 4, dim // heads),
           gkv("tokenizer.ggml.model", 8, "llama"), gkv("tokenizer.ggml.tokens", 9, (8, toks)),
           gkv("tokenizer.ggml.scores", 9, (6, [-float(i) for i in range(vocab)])),
           gkv("tokenizer.ggml.token_type", 9, (5, [2, 3, 3, 1, 1, 1, 6, 1])),
           gkv("tokenizer.ggml.bos_token_id", 4, 1), gkv("tokenizer.ggml.eos_token_id", 4, 2)] + list(extra_kv)
    tensors = [("token_embd.weight", [dim, vocab]), ("output_norm.weight", [dim]), ("output.weight", [dim, vocab]),
               ("blk.0.attn_norm.weight", [dim]), ("blk.0.attn_q.weight", [dim, dim]),
               ("blk.0.attn_k.weight", [dim, kvd]), ("blk.0.attn_v.weight", [dim, kvd]),
               ("blk.0.attn_output.weight", [dim, dim]), ("blk.0.ffn_norm.weight", [dim]),
               ("blk.0.ffn_gate.weight", [dim, hidden]), ("blk.0.ffn_up.weight", [dim, hidden]),
               ("blk.0.ffn_down.weight", [hidden, dim])]
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    data, infos = b"", b""
    for k, (name, dims) in enumerate(tensors):
        n = 1
        for d in dims: n *= d
        infos += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", 0, len(data))
        data += floats(n, k)
        data += b"\0" * ((-len(data)) % 32)
    b = head + infos
    b += b"\0" * ((-len(b)) % 32)
    return b + data


put("gguf", "tiny_llama.gguf", gguf())
put("gguf", "tiny_llama_unk.gguf", gguf(extra_kv=[gkv("tokenizer.ggml.unknown_token_id", 4, 0)]))
put("gguf", "header_only.gguf", gguf()[:24])

# --- safetensors (first byte even: model.safetensors; odd: the index) and config files.
fx = "fuzz/fixtures/hf_tiny"
st = rd(fx + "/model.safetensors")
put("safetensors", "hf_tiny.safetensors", b"\x00" + st)
hlen = struct.unpack("<Q", st[:8])[0]
header = json.loads(st[8:8 + hlen])
index = {"metadata": {"total_size": len(st) - 8 - hlen},
         "weight_map": {k: "model-00001-of-00001.safetensors" for k in header if k != "__metadata__"}}
put("safetensors", "index.json", b"\x01" + json.dumps(index, indent=1).encode())
put("safetensors", "header_only.safetensors", b"\x00" + st[:8 + hlen])

put("hf_config", "config.json", b"\x00" + rd(fx + "/config.json"))
for name in sorted(glob.glob(os.path.join(root, "datasets/models/hf_refs/models/*/config.json")))[:6]:
    put("hf_config", "config_" + os.path.basename(os.path.dirname(name)) + ".json", b"\x00" + open(name, "rb").read())
put("hf_config", "tokenizer_config.json", b"\x01" + rd("datasets/models/hf_refs/models/llama_sp/tokenizer_config.json"))
put("hf_config", "generation_config.json", b"\x02" + rd("datasets/models/hf_refs/models/llama_sp/generation_config.json"))

# --- tokenizer.json: byte-level BPE and SentencePiece-style BPE fixtures.
put("tokenizer_json", "hf_tiny.json", rd(fx + "/tokenizer.json"))
for d in sorted(glob.glob(os.path.join(root, "datasets/models/hf_refs/tokenizers/*/tokenizer.json"))):
    put("tokenizer_json", os.path.basename(os.path.dirname(d)) + ".json", open(d, "rb").read())

# --- mutant catalog, release policy, report records.
cat = json.loads(rd("mutations/catalog.json"))
put("catalog", "catalog.json", rd("mutations/catalog.json"))
small = dict(cat)
if isinstance(cat.get("mutants"), list):
    small["mutants"] = cat["mutants"][:3]
put("catalog", "catalog_small.json", json.dumps(small, indent=1).encode())
put("catalog", "adversarial.json", rd("mutations/adversarial.json"))
put("policy", "default.json", rd("reports/policy/default.json"))
for p in sorted(glob.glob(os.path.join(root, "reports/tests/fixtures/*.json"))):
    if os.path.getsize(p) < 200000:
        put("report", "fixture_" + os.path.basename(p), open(p, "rb").read())
for p in sorted(glob.glob(os.path.join(root, "bench/results/matrix_h200/*.json")))[:4] + \
         [os.path.join(root, "bench/results/mutation_outcomes_gpu_h200_round4.json")]:
    if os.path.exists(p) and os.path.getsize(p) < 200000:
        put("report", "bench_" + os.path.basename(p), open(p, "rb").read())


# --- Small seeds (under 8 KB) for campaigns run with --max-len 8192 (scripts/fuzz.sh): libFuzzer cuts
# every input at max_len, so a long seed would reach the harness cut (invalid JSON) and its deep paths
# would be lost. Each keeps the structure of a full file: minified, every list cut to its first items,
# long strings cut, until it fits.
def shrink_json(doc, budget=7000):
    def cut(x, n, slen):
        if isinstance(x, dict):
            return {k: cut(v, n, slen) for k, v in x.items()}
        if isinstance(x, list):
            return [cut(v, n, slen) for v in x[:n]]
        if isinstance(x, str) and len(x) > slen:
            return x[:slen]
        return x
    for n, slen in [(8, 200), (4, 120), (3, 80), (2, 60), (1, 40)]:
        data = json.dumps(cut(doc, n, slen), separators=(",", ":")).encode()
        if len(data) <= budget:
            return data
    return data


def small_tokenizer(doc, budget=7000):
    """A tokenizer.json of the same kind with its vocabulary cut to the first n tokens (merges whose
    parts and result are all kept stay), minified."""
    m = doc.get("model", {})
    vocab = m.get("vocab")
    for n in [400, 300, 200, 150, 100, 60]:
        d = json.loads(json.dumps(doc))
        dm = d["model"]
        if isinstance(vocab, dict):
            keep = {k: v for k, v in vocab.items() if v < n}
            dm["vocab"] = keep
        elif isinstance(vocab, list):
            dm["vocab"] = vocab[:n]
            keep = {e[0] if isinstance(e, list) else e: i for i, e in enumerate(dm["vocab"])}
        else:
            keep = {}
        merges = m.get("merges") or []
        kept = []
        for mg in merges:
            a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
            if a in keep and b in keep and (a + b) in keep:
                kept.append(mg)
        if "merges" in dm:
            dm["merges"] = kept
        d["added_tokens"] = [t for t in d.get("added_tokens") or [] if t.get("id", 0) < n]
        data = json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode()
        if len(data) <= budget:
            return data
    return data


for p in sorted(glob.glob(os.path.join(out, "tokenizer_json", "*.json"))):
    name = os.path.basename(p)
    if not name.startswith("small_"):
        put("tokenizer_json", "small_" + name, small_tokenizer(json.loads(open(p, "rb").read())))
for p in sorted(glob.glob(os.path.join(out, "report", "*.json"))):
    name = os.path.basename(p)
    if not name.startswith("small_") and os.path.getsize(p) > 8000:
        put("report", "small_" + name, shrink_json(json.loads(open(p, "rb").read())))
print("seeds written under", out)

# --- KV files: written by kvgate itself (kvgate run --conv-id) when a build and the model are here.
kvgate = os.path.join(root, "build", "kvgate")
stories = os.path.join(models, "stories260K") if models else ""
if os.path.exists(kvgate) and stories and os.path.exists(os.path.join(stories, "stories260K.bin")):
    import subprocess, tempfile
    with tempfile.TemporaryDirectory() as td:
        for kv in ["f16", "q4_0", "k8v4"]:
            subprocess.run([kvgate, "run", "--model", os.path.join(stories, "stories260K.bin"), "--tokenizer",
                            os.path.join(stories, "tok512.bin"), "--prompt", "Once upon", "--steps", "3",
                            "--conv-id", "s_" + kv, "--kv-cache-dir", td, "--kv", kv], check=True,
                           stdout=subprocess.DEVNULL)
            with open(os.path.join(td, "s_" + kv + ".kvf"), "rb") as f:
                put("kv_file", "s_" + kv + ".kvf", f.read())
# The MLA latent cache (KV file version 5: layout mla_latent, V rows of the RoPE key), from the
# project's DeepSeek-V3 reference directory. (The three stories260K seeds committed were written by a
# kvgate of version 4 and are kept as they are: the reader's older-version path.)
deepseek = os.path.join(root, "datasets/models/hf_refs/models/deepseek_v3")
if os.path.exists(kvgate) and os.path.isdir(deepseek):
    import subprocess, tempfile
    with tempfile.TemporaryDirectory() as td:
        subprocess.run([kvgate, "run", "--model", deepseek, "--prompt", "Once upon", "--steps", "3", "--mla-cache",
                        "latent", "--kv", "k=q8_0,v=bf16", "--conv-id", "s_mla_latent", "--kv-cache-dir", td],
                       check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(td, "s_mla_latent.kvf"), "rb") as f:
            put("kv_file", "s_mla_latent.kvf", f.read())
