#!/usr/bin/env python3
"""Writes the committed bad-input files of fuzz/bad_inputs/files/ (each a regression case of
fuzz/bad_inputs/cases.json) from the valid seeds of fuzz/corpus/ and the fixture fuzz/fixtures/hf_tiny.
Run from the repository root after fuzz/make_seeds.py."""
import json, os, shutil, struct, sys

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "fuzz"))
out = os.path.join(root, "fuzz", "bad_inputs", "files")
os.makedirs(out, exist_ok=True)


def rd(rel):
    with open(os.path.join(root, rel), "rb") as f:
        return f.read()


def wr(rel, data):
    p = os.path.join(out, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def hf_dir(name, **replace):
    """A copy of hf_tiny with some files replaced (name -> bytes or str)."""
    for f in ["config.json", "model.safetensors", "tokenizer.json"]:
        wr(name + "/" + f, replace.get(f, rd("fuzz/fixtures/hf_tiny/" + f)))


# GGUF with tokenizer.ggml.unknown_token_id outside the vocabulary (8 tokens).
g = rd("fuzz/corpus/gguf/tiny_llama_unk.gguf")
key = b"tokenizer.ggml.unknown_token_id"
i = g.index(key) + len(key) + 4  # key, then the uint32 type, then the value
wr("unk_out_of_range.gguf", g[:i] + struct.pack("<I", 9999) + g[i + 4:])

# GGUF whose second tensor overlaps the first (offset 0 for both).
def gguf_tensor_offsets(b):
    """(position of each tensor's offset field) by re-walking the header of the tiny seed."""
    pos = 4 + 4
    n_t, n_kv = struct.unpack_from("<QQ", b, pos); pos += 16
    def skip_str(p):
        n = struct.unpack_from("<Q", b, p)[0]; return p + 8 + n
    sizes = {4: 4, 5: 4, 6: 4, 7: 1, 0: 1, 1: 1, 2: 2, 3: 2, 10: 8, 11: 8, 12: 8}
    for _ in range(n_kv):
        pos = skip_str(pos)
        t = struct.unpack_from("<I", b, pos)[0]; pos += 4
        if t == 8: pos = skip_str(pos)
        elif t == 9:
            et, n = struct.unpack_from("<IQ", b, pos); pos += 12
            for _ in range(n):
                pos = skip_str(pos) if et == 8 else pos + sizes[et]
        else: pos += sizes[t]
    offs = []
    for _ in range(n_t):
        pos = skip_str(pos)
        nd = struct.unpack_from("<I", b, pos)[0]; pos += 4 + 8 * nd
        pos += 4
        offs.append(pos); pos += 8
    return offs

g = rd("fuzz/corpus/gguf/tiny_llama.gguf")
wr("tiny_llama.gguf", g)  # valid: the model of the flag cases
offs = gguf_tensor_offsets(g)
b = bytearray(g); struct.pack_into("<Q", b, offs[1], 0); wr("overlap.gguf", bytes(b))
b = bytearray(g)
o = struct.unpack_from("<Q", b, offs[1])[0]; struct.pack_into("<Q", b, offs[1], o + 4)
wr("misaligned.gguf", bytes(b))

# safetensors: a misaligned tensor (begins mid-element).
st = rd("fuzz/fixtures/hf_tiny/model.safetensors")
hlen = struct.unpack("<Q", st[:8])[0]
hdr = json.loads(st[8:8 + hlen]); data = st[8 + hlen:]
def st_file(h, d):
    t = json.dumps(h).encode(); t += b" " * ((-len(t)) % 8)
    return struct.pack("<Q", len(t)) + t + d
names = sorted((k for k in hdr if k != "__metadata__"), key=lambda k: hdr[k]["data_offsets"][0])
last = names[-1]
h = json.loads(json.dumps(hdr)); a, b2 = h[names[1]]["data_offsets"]; h[names[1]]["data_offsets"] = [a - 1, b2 - 1]  # f16: an odd byte offset
hf_dir("hf_misaligned", **{"model.safetensors": st_file(h, data)})
# safetensors: two tensors sharing bytes (the second moved back by one element onto the first), and a
# hole (the last tensor moved forward by one element, the data section one element longer).
es = {"F32": 4, "F16": 2, "BF16": 2}[hdr[names[1]]["dtype"]]
h = json.loads(json.dumps(hdr)); a, b2 = h[names[1]]["data_offsets"]; h[names[1]]["data_offsets"] = [a - es, b2 - es]
hf_dir("hf_overlap", **{"model.safetensors": st_file(h, data)})
es = {"F32": 4, "F16": 2, "BF16": 2}[hdr[last]["dtype"]]
h = json.loads(json.dumps(hdr)); a, b2 = h[last]["data_offsets"]; h[last]["data_offsets"] = [a + es, b2 + es]
hf_dir("hf_hole", **{"model.safetensors": st_file(h, data[:a] + bytes(es) + data[a:])})

# config.json nested 100000 deep (json dump / compare recursion); a wrong JSON type for a field.
cfg = json.loads(rd("fuzz/fixtures/hf_tiny/config.json"))
deep = json.dumps(cfg)[:-1] + ', "rope_scaling": ' + "[" * 100000 + "]" * 100000 + "}"
hf_dir("hf_deep", **{"config.json": deep})
c2 = dict(cfg); c2["num_hidden_layers"] = "two"
hf_dir("hf_type_error", **{"config.json": json.dumps(c2, indent=1)})
c3 = dict(cfg); c3["max_position_embeddings"] = 1 << 24
hf_dir("hf_huge_context", **{"config.json": json.dumps(c3, indent=1)})
c4 = dict(cfg); c4["eos_token_id"] = [1, "a"]  # only the first element was checked
hf_dir("hf_eos_list_mixed", **{"config.json": json.dumps(c4, indent=1)})
c5 = dict(cfg); c5["hidden_size"] = 1 << 17  # over the dimension limit: refused before any weight is read
hf_dir("hf_dim_over_limit", **{"config.json": json.dumps(c5, indent=1)})

# tokenizer.json with an added token id 2^31-1 and 1e8 (tables sized by the id).
tok = json.loads(rd("fuzz/fixtures/hf_tiny/tokenizer.json"))
for nm, v in [("hf_added_id_int_max", 2**31 - 1), ("hf_added_id_1e8", 100000000)]:
    t = json.loads(json.dumps(tok)); t["added_tokens"][0]["id"] = v
    hf_dir(nm, **{"tokenizer.json": json.dumps(t, indent=1)})

# A mutant catalog with a 40 KB string in a field the schema constrains with a pattern.
cat = json.loads(rd("mutations/catalog.json"))
cat["mutants"][0]["id"] = "A" * 40000
wr("catalog_long_string.json", json.dumps(cat, indent=1))
# The same catalog nested 100000 deep in one field.
c = json.loads(rd("mutations/catalog.json"))
txt = json.dumps(c, indent=1)
txt = txt.replace('"mutants"', '"deep": ' + "[" * 100000 + "]" * 100000 + ', "mutants"', 1)
wr("catalog_deep.json", txt)

# A report record nested 100000 deep (kvgate report --validate).
wr("report_deep.json", '{"schema": "kvgate.matrix/1", "x": ' + "[" * 100000 + "]" * 100000 + "}")
print("bad inputs written under", out)

# GGUF whose layer-0 attention output weights hold NaN: the forward pass names the layer (before:
# NaN logits, greedy token 0, exit 0).
g = bytearray(rd("fuzz/corpus/gguf/tiny_llama.gguf"))
offs = gguf_tensor_offsets(bytes(g))
data_start = (max(offs) + 8 + 31) // 32 * 32
o = struct.unpack_from("<Q", g, offs[7])[0]  # blk.0.attn_output.weight, F32 [8, 8]
for k in range(64):
    struct.pack_into("<f", g, data_start + o + 4 * k, float("nan"))
wr("nan_weights.gguf", bytes(g))

# GGUF whose last vocabulary piece is 65537 bytes, one over TOKEN_BYTES (before: accepted and run,
# exit 0). 65536 more bytes keep the data section's 32-byte alignment.
g = rd("fuzz/corpus/gguf/tiny_llama.gguf")
i = g.index(struct.pack("<Q", 1) + b"c", g.index(b"tokenizer.ggml.tokens"))
wr("long_piece.gguf", g[:i] + struct.pack("<Q", 65537) + b"c" * 65537 + g[i + 9:])

# tokenizer.json whose longest merged piece is renamed to a 65537-byte one (before: accepted).
tok = json.loads(rd("fuzz/fixtures/hf_tiny/tokenizer.json"))
v = tok["model"]["vocab"]
last = max(v, key=lambda k: v[k])
v["q" * 65537] = v.pop(last)
hf_dir("hf_long_piece", **{"tokenizer.json": json.dumps(tok, indent=1)})
# A valid SentencePiece-style tokenizer.json (the fuzz seed; cases that lower a limit with its
# KVGATE_LIMIT_ variable).
wr("sp_valid.json", rd("fuzz/corpus/tokenizer_json/sp_llama2.json"))
# A small valid catalog of 3 mutants (the first three of mutations/catalog.json).
cat = json.loads(rd("mutations/catalog.json"))
cat["mutants"] = [m for m in cat["mutants"] if m.get("category") != "canary"][:3]
wr("catalog_small.json", json.dumps(cat, indent=1))
# A gates.json of 8 gates (reports/tests/fixtures) and a matrix.json of 24 rows.
wr("gates_small.json", rd("reports/tests/fixtures/gates.json"))
wr("matrix_small.json", rd("reports/tests/fixtures/matrix.json"))
wr("outcomes_small.json", rd("reports/tests/fixtures/outcomes.json"))
# A SentencePiece-style tokenizer.json whose last piece has id 2^24 (the old bound of that reader):
# the id table was sized by it (16 M strings, 512 MB) before anything else was checked.
tok = json.loads(rd("fuzz/corpus/tokenizer_json/sp_llama2.json"))
v = tok["model"]["vocab"]
v[max(v, key=lambda k: v[k])] = 1 << 24
wr("sp_vocab_id_16m.json", json.dumps(tok, indent=1))

# llama2.c: the tiny checkpoint (vocab 8) and tokenizer.bin files for it (max_token_length, then per
# token a float32 score, an int32 length and the bytes), each with one field out of bounds. Named
# apart from tok8.bin / tokenizer.bin so the loader never picks one up beside the checkpoint.
wr("llama2c_tiny.bin", rd("fuzz/corpus/llama2c/tiny_shared.bin"))
def tok8(max_len=5, edit=None, n=8):
    pieces = [b"<unk>", b"<s>", b"</s>", b" a", b"b", b"ab", b" ab", b"c"][:n]
    toks = [[-float(i), len(p), p] for i, p in enumerate(pieces)]
    if edit: edit(toks)
    b = struct.pack("<i", max_len)
    for score, ln, p in toks:
        b += struct.pack("<fi", score, ln) + p
    return b
def set_tok(i, **kw):
    def f(toks):
        if "score" in kw: toks[i][0] = kw["score"]
        if "length" in kw: toks[i][1] = kw["length"]
        if "piece" in kw: toks[i][2] = kw["piece"]; toks[i][1] = kw.get("length", len(kw["piece"]))
    return f
wr("tok_nan_score.bin", tok8(edit=set_tok(3, score=float("nan"))))  # before: accepted, exit 0
wr("tok_inf_score.bin", tok8(edit=set_tok(3, score=float("inf"))))  # before: accepted, exit 0
wr("tok_negative_length.bin", tok8(edit=set_tok(3, length=-1)))
wr("tok_length_past_end.bin", tok8(edit=set_tok(3, length=2**31 - 1)))
wr("tok_max_len_over_limit.bin", tok8(max_len=65537))  # TOKEN_BYTES is 65536
wr("tok_piece_over_limit.bin", tok8(max_len=65536, edit=set_tok(7, piece=b"q" * 65537)))
wr("tok_fewer_tokens.bin", tok8(n=3))  # 3 tokens for the model's 8
# llama2.c headers (no weights) over the CONTEXT and DIM limits.
wr("llama2c_seq_len_over_limit.bin", struct.pack("<7i", 8, 8, 1, 2, 1, 8, (1 << 20) + 1))
wr("llama2c_dim_over_limit.bin", struct.pack("<7i", 65538, 8, 1, 2, 1, 8, 8))
# GGUF whose vocabulary score 3 is NaN (before: accepted, exit 0; refused now, as in tokenizer.bin).
g = bytearray(rd("fuzz/corpus/gguf/tiny_llama.gguf"))
i = g.index(b"tokenizer.ggml.scores") + len(b"tokenizer.ggml.scores") + 16  # type, element type, count
struct.pack_into("<f", g, i + 4 * 3, float("nan"))
wr("gguf_nan_score.gguf", bytes(g))
# --kv-scales files for llama2c_tiny.bin (1 layer, 1 KV head): a per-head list of the wrong length,
# a layer too many, a negative and a zero scale (docs/FORMATS.md "Static scales per KV head").
def kv_scales(layers):
    return json.dumps({"schema": "kvgate.kv-scales/1", "layers": layers}, indent=1)
wr("kv_scales_heads.json", kv_scales([{"k": [0.5, 0.25], "v": 0.5}]))
wr("kv_scales_layers.json", kv_scales([{"k": 0.5, "v": 0.5}, {"k": 0.5, "v": 0.5}]))
wr("kv_scales_negative.json", kv_scales([{"k": 0.5, "v": [-0.25]}]))
wr("kv_scales_zero.json", kv_scales([{"k": 0, "v": 0.5}]))
