#!/usr/bin/env python3
"""Converts a Hugging Face reference directory (datasets/models/hf_refs/models/<case>) to GGUF the way
llama.cpp's convert_hf_to_gguf.py does, with the Python standard library only (no numpy, no gguf
package): the GGUF writer follows the GGUF v3 specification (ggml's docs/gguf.md). The gates run it at
test time and write the files into the build directory; nothing it makes is committed.

    python3 datasets/tools/hf_to_gguf.py [--tokenizer DIR] <hf directory> <out.gguf>

What it does per architecture (llama.cpp's converter classes LlamaModel, Qwen2Model, Qwen3Model,
Phi3MiniModel, Gemma2Model, Gemma3Model and TextModel.set_gguf_parameters):
  LlamaForCausalLM, MistralForCausalLM -> "llama": q_proj / k_proj rows permuted for adjacent-pair
      RoPE (LlamaModel.permute, k with the KV head count); rope_type llama3 -> the rope_freqs tensor
      (LlamaModel.generate_extra_tensors); linear -> rope.scaling.type linear + factor.
  Qwen2ForCausalLM -> "qwen2", Qwen3ForCausalLM -> "qwen3" (q_norm / k_norm -> attn_q_norm /
      attn_k_norm); yarn -> rope.scaling.type yarn, factor, original_context_length, and
      yarn_attn_factor / yarn_beta_fast / yarn_beta_slow where the config gives them.
  Phi3ForCausalLM -> "phi3": qkv_proj -> attn_qkv, gate_up_proj -> ffn_up (both as stored),
      rope.dimension_count from partial_rotary_factor; longrope -> rope_factors_long / _short tensors,
      rope.scaling.attn_factor = sqrt(1 + ln(scale) / ln(original)), rope.scaling.original_context_length.
  Gemma2ForCausalLM -> "gemma2", Gemma3ForCausalLM -> "gemma3": every tensor whose name ends in
      "norm.weight" gets + 1 (Gemma's RMSNorm multiplies by 1 + w; the loader must not add it again),
      post_attention_layernorm -> post_attention_norm, pre_feedforward_layernorm -> ffn_norm,
      post_feedforward_layernorm -> post_ffw_norm; soft-caps, sliding_window, key_length; Gemma 3's
      global RoPE (rope_parameters.full_attention) -> rope.freq_base + rope.scaling, the local base
      (sliding_attention.rope_theta) -> rope.freq_base_swa.

Where a reference model has something llama.cpp's converter cannot express for its architecture, the
key llama.cpp defines for it (llama-arch.cpp) is written, and the tool prints it:
  {arch}.attention.scale                    Gemma's query_pre_attn_scalar when it is not head_dim
                                            (llama.cpp derives the scale from key_length);
  {arch}.attention.sliding_window_pattern   one bool per layer (true = sliding) when layer_types is
                                            not the architecture's fixed llama.cpp pattern (Gemma 2:
                                            even layers, Gemma 3: all but each 6th, else every layer);
  {arch}.attention.sliding_window           for Mistral and Qwen2 windows (llama.cpp's llama / qwen2
                                            converters drop it).
Refused (exit 2, naming the field): rope_type dynamic (no GGUF spelling), MoE / MLA architectures.
Tokenizer (convert_hf_to_gguf.py's _set_vocab_gpt2 / _set_vocab_llama_hf with gguf-py's SpecialVocab),
from <hf directory>/tokenizer.json + tokenizer_config.json, or from --tokenizer DIR (one of
datasets/models/hf_refs/tokenizers/*: for a directory without a tokenizer, or another one of the same
vocabulary size); without either, only bos/eos_token_id from config.json are written and the tool says so:
  byte-level BPE (byte_fallback false, ByteLevel decoder) -> tokenizer.ggml.model "gpt2": tokens as stored
      (byte-level strings), merges in rank order ("a b", a space inside a half as U+0120), token_type, and
      tokenizer.ggml.pre named from the Split regex ("llama-bpe", "qwen2"; llama.cpp names it by hashing
      the tokenizer's output, which needs the tokenizers library);
  SentencePiece-style BPE (byte_fallback true, Sequence decoder) -> "llama": tokens with their U+2581,
      token_type (<0xXX> pieces BYTE), scores, and add_space_prefix (true for a Prepend("\u2581")
      normalizer or a prepending Metaspace, false for Gemma's Replace-only one; Gemma2Model writes false).
      Scores: -rank of the first merge that makes the piece, 0 for pieces no merge makes, so llama.cpp's
      SentencePiece merge (highest score first) applies the merges in tokenizer.json's order; llama.cpp's
      LlamaHfVocab writes the placeholder -1000 for every piece instead. Metaspace prepend_scheme "first"
      has no GGUF spelling: llama.cpp prefixes every text fragment, which the tool prints.
  Both: token ids past the vocabulary become "[PAD<i>]" (UNUSED); added tokens CONTROL when special, else
      USER_DEFINED; bos/eos/unknown/padding_token_id from tokenizer_config.json's *_token (looked up in
      added_tokens), then config.json's *_token_id; add_bos_token / add_eos_token from the post_processor
      (TemplateProcessing's first / last special token, RobertaProcessing both), replaced by
      tokenizer_config.json's add_bos_token / add_eos_token (the rule kvgate's tokenizer.json loader uses).
  Refused (naming the field): another model type, a byte_fallback vocabulary without all 256 <0xXX>
      pieces, an unnamed pre-tokenizer regex, a token id past config.json's vocab_size.
Tensors are written as F32 (the reference checkpoints are f32). The output is written atomically.
"""
import array
import json
import math
import os
import struct
import sys

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGN = 32
# GGUF metadata value types.
T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY, T_U64 = 4, 5, 6, 7, 8, 9, 10
GGML_F32 = 0


class Refused(Exception):
    pass


def read_safetensors(path):
    """{name: (shape list, array('f'))}; F32 tensors only (the reference checkpoints)."""
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
        base = 8 + hlen
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] != "F32":
                raise Refused(f"{path}: tensor '{name}' field 'dtype' = {info['dtype']}: this tool converts F32 checkpoints only")
            b, e = info["data_offsets"]
            f.seek(base + b)
            a = array.array("f")
            a.frombytes(f.read(e - b))
            if sys.byteorder != "little":
                a.byteswap()
            out[name] = (list(info["shape"]), a)
    return out


def permute_rows(a, shape, n_head):
    """LlamaModel.permute: reshape(n_head, 2, rows/n_head/2, cols).swapaxes(1, 2): new row
    h*hd + 2j + t = old row h*hd + t*hd/2 + j."""
    rows, cols = shape
    hd = rows // n_head
    out = array.array("f", bytes(4 * len(a)))
    for h in range(n_head):
        for j in range(hd // 2):
            for t in range(2):
                src = (h * hd + t * (hd // 2) + j) * cols
                dst = (h * hd + 2 * j + t) * cols
                out[dst:dst + cols] = a[src:src + cols]
    return out


def plus_one(a):
    return array.array("f", (x + 1.0 for x in a))  # float32 rounding of (w + 1), as torch's f32 add


class Writer:
    def __init__(self):
        self.kv = []  # (key, type, payload bytes)
        self.tensors = []  # (name, shape (row-major, outermost first), array('f'))

    @staticmethod
    def _str(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def u32(self, k, v):
        self.kv.append((k, T_U32, struct.pack("<I", int(v))))

    def f32(self, k, v):
        self.kv.append((k, T_F32, struct.pack("<f", float(v))))

    def string(self, k, v):
        self.kv.append((k, T_STRING, self._str(v)))

    def boolean(self, k, v):
        self.kv.append((k, T_BOOL, bytes([1 if v else 0])))

    def strings(self, k, vs):
        self.kv.append((k, T_ARRAY, struct.pack("<IQ", T_STRING, len(vs)) + b"".join(self._str(v) for v in vs)))

    def i32s(self, k, vs):
        self.kv.append((k, T_ARRAY, struct.pack("<IQ", T_I32, len(vs)) + struct.pack(f"<{len(vs)}i", *vs)))

    def f32s(self, k, vs):
        self.kv.append((k, T_ARRAY, struct.pack("<IQ", T_F32, len(vs)) + struct.pack(f"<{len(vs)}f", *vs)))

    def bools(self, k, vs):
        self.kv.append((k, T_ARRAY, struct.pack("<IQ", T_BOOL, len(vs)) + bytes(1 if v else 0 for v in vs)))

    def tensor(self, name, shape, data):
        n = 1
        for d in shape:
            n *= d
        if n != len(data):
            raise Refused(f"internal: tensor {name} has {len(data)} values for shape {shape}")
        self.tensors.append((name, list(shape), data))

    def write(self, path):
        out = bytearray()
        out += GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self.kv))
        for k, t, payload in self.kv:
            out += self._str(k) + struct.pack("<I", t) + payload
        offset = 0
        offsets = []
        for name, shape, data in self.tensors:
            offsets.append(offset)
            ne = list(reversed(shape))  # ggml: ne[0] is the innermost (contiguous) dimension
            out += self._str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
            out += struct.pack("<IQ", GGML_F32, offset)
            offset += 4 * len(data)
            offset = (offset + ALIGN - 1) // ALIGN * ALIGN
        out += bytes((-len(out)) % ALIGN)
        for (name, shape, data), off in zip(self.tensors, offsets):
            b = data.tobytes() if sys.byteorder == "little" else _swapped(data)
            out += b
            out += bytes((-len(out)) % ALIGN)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(out)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def _swapped(a):
    b = array.array("f", a)
    b.byteswap()
    return b.tobytes()


ARCHS = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
}


def rope_params(cfg):
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rp = dict(rp)
    if "rope_theta" not in rp and "full_attention" not in rp and "rope_theta" in cfg:
        rp["rope_theta"] = cfg["rope_theta"]
    return rp


def llama3_factors(rp, head_dim):
    """LlamaModel.generate_extra_tensors (float32 frequencies, Python arithmetic as the converter)."""
    base = rp.get("rope_theta", 10000.0)
    dim = head_dim
    freqs = [1.0 / (base ** (i / dim)) for i in range(0, dim, 2)]
    freqs = list(array.array("f", freqs))  # torch.arange(...) / dim in float32, then base ** in float32
    factor = rp.get("factor", 8.0)
    low = rp.get("low_freq_factor", 1.0)
    high = rp.get("high_freq_factor", 4.0)
    old = rp.get("original_max_position_embeddings", 8192)
    low_wl, high_wl = old / low, old / high
    out = []
    for fr in freqs:
        wl = 2 * math.pi / fr
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old / wl - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return array.array("f", out)


# ---- tokenizer (convert_hf_to_gguf.py's _set_vocab_gpt2 / _set_vocab_llama_hf, gguf-py's SpecialVocab) ----
# llama.cpp's token types (gguf-py TokenType).
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6
# The Split regexes of the byte-level pre-tokenizers kvgate runs, by the name llama.cpp gives them
# (llama.cpp names a pre-tokenizer by hashing the tokenizer's output on a test text; these are the
# regexes behind "llama-bpe" and "qwen2").
PRE_REGEX = {
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+": "llama-bpe",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+": "qwen2",
}


def is_byte_piece(p):
    return len(p) == 6 and p.startswith("<0x") and p.endswith(">") and all(c in "0123456789abcdefABCDEF" for c in p[3:5])


def gpt2_pre(tj, path):
    """tokenizer.ggml.pre of a byte-level tokenizer.json: the name of its Split regex."""
    pre = tj.get("pre_tokenizer") or {}
    items = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    for it in items:
        if it.get("type") == "Split":
            rx = (it.get("pattern") or {}).get("Regex")
            if rx in PRE_REGEX:
                return PRE_REGEX[rx]
            raise Refused(f"{path}: field 'pre_tokenizer' Split pattern {rx!r} is not a pre-tokenizer this tool names "
                          f"(known: {sorted(set(PRE_REGEX.values()))})")
    if len(items) == 1 and items[0].get("type") == "ByteLevel" and items[0].get("use_regex", True):
        return "gpt-2"
    raise Refused(f"{path}: field 'pre_tokenizer' ({pre.get('type')!r}) is not a pre-tokenizer this tool names")


def token_content(entry):
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None


def special_ids_and_rule(tj, tc, cfg):
    """SpecialVocab: ids of bos/eos/unk/pad (tokenizer_config.json's *_token looked up in added_tokens,
    then config.json's *_token_id), and add_bos/add_eos (post_processor TemplateProcessing /
    RobertaProcessing, then tokenizer_config.json add_bos_token / add_eos_token replace a side)."""
    added = tj.get("added_tokens") or []
    ids = {}
    for typ in ("bos", "eos", "unk", "pad"):
        content = token_content(tc.get(f"{typ}_token"))
        if content is not None:
            tid = next((a["id"] for a in added if a.get("content") == content), None)
            if isinstance(tid, int):
                ids[typ] = tid
    for typ in ("bos", "eos", "unk", "pad"):
        tid = cfg.get(f"{typ}_token_id")
        if typ not in ids and isinstance(tid, int) and tid >= 0:
            ids[typ] = tid
    add = {}
    post = tj.get("post_processor") or {}
    bos_c, eos_c = token_content(tc.get("bos_token")), token_content(tc.get("eos_token"))
    for pr in post.get("processors", [post]) if post else []:
        if pr.get("type") == "RobertaProcessing":
            add["bos"] = add["eos"] = True
        elif pr.get("type") == "TemplateProcessing":
            single = pr.get("single") or []
            if len(single) > 1:
                first = (single[0].get("SpecialToken") or {}).get("id")
                last = (single[-1].get("SpecialToken") or {}).get("id")
                if first:
                    add["bos"] = first == (bos_c if tc else first)
                if last:
                    add["eos"] = last == (eos_c if tc else last)
    for typ in ("bos", "eos"):
        if isinstance(tc.get(f"add_{typ}_token"), bool):
            add[typ] = tc[f"add_{typ}_token"]
    return ids, add


def merge_pairs(model, path):
    out = []
    for i, m in enumerate(model.get("merges") or []):
        if isinstance(m, str):
            parts = m.split(" ")
        elif isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m):
            parts = m
        else:
            parts = None
        if not parts or len(parts) != 2:
            raise Refused(f"{path}: field 'model.merges[{i}]' = {m!r} is not a pair")
        out.append((parts[0], parts[1]))
    return out


def write_tokenizer(w, tok_dir, cfg, n_vocab):
    """Writes tokenizer.ggml.* from tok_dir/tokenizer.json (+ tokenizer_config.json), as llama.cpp's
    converter: "gpt2" for byte-level BPE, "llama" for SentencePiece-style BPE with byte_fallback."""
    path = os.path.join(tok_dir, "tokenizer.json")
    tj = json.load(open(path, encoding="utf-8"))
    tc_path = os.path.join(tok_dir, "tokenizer_config.json")
    tc = json.load(open(tc_path, encoding="utf-8")) if os.path.isfile(tc_path) else {}
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise Refused(f"{path}: field 'model.type' = {model.get('type')!r}: this tool converts BPE tokenizers only")
    decoder = (tj.get("decoder") or {}).get("type")
    if model.get("byte_fallback", False) and decoder == "Sequence":
        kind = "llama"  # LlamaHfVocab
    elif not model.get("byte_fallback", False) and decoder == "ByteLevel":
        kind = "gpt2"  # BpeVocab / get_vocab_base
    else:
        raise Refused(f"{path}: fields 'model.byte_fallback' = {model.get('byte_fallback')!r} and 'decoder.type' = "
                      f"{decoder!r}: neither byte-level BPE (false, ByteLevel) nor SentencePiece-style BPE (true, Sequence)")
    pieces = {}
    for piece, i in (model.get("vocab") or {}).items():
        pieces[i] = piece
    added = {}
    for a in tj.get("added_tokens") or []:
        pieces.setdefault(a["id"], a["content"])
        added[a["id"]] = a
    if pieces and max(pieces) >= n_vocab:
        raise Refused(f"{path}: token id {max(pieces)} is past the model's vocab_size {n_vocab} (config.json); "
                      "pass the tokenizer the model was trained with")
    tokens, types = [], []
    for i in range(n_vocab):
        p = pieces.get(i)
        if p is None:
            tokens.append(f"[PAD{i}]")
            types.append(TT_UNUSED)
        elif i in added:
            tokens.append(p)
            types.append(TT_CONTROL if added[i].get("special") else TT_USER_DEFINED)
        elif kind == "llama" and is_byte_piece(p):
            tokens.append(p)
            types.append(TT_BYTE)
        else:
            tokens.append(p)
            types.append(TT_NORMAL)
    merges = merge_pairs(model, path)
    w.string("tokenizer.ggml.model", kind)
    if kind == "gpt2":
        w.string("tokenizer.ggml.pre", gpt2_pre(tj, path))
    w.strings("tokenizer.ggml.tokens", tokens)
    if kind == "llama":
        missing = [b for b in range(256) if f"<0x{b:02X}>" not in model.get("vocab", {})]
        if missing:
            raise Refused(f"{path}: field 'model.vocab' has byte_fallback but no byte token <0x{missing[0]:02X}> "
                          f"({len(missing)} of 256 missing): add the <0x00>..<0xFF> pieces")
        # Scores that make llama.cpp's SentencePiece merge (the adjacent pair whose concatenation has the
        # highest score) apply the merges in their tokenizer.json order: -rank of the first merge making
        # the piece, 0 for pieces no merge makes. llama.cpp's LlamaHfVocab writes the placeholder -1000
        # for every piece, which merges leftmost-first instead of by rank.
        rank = {}
        for r, (a, b) in enumerate(merges):
            rank.setdefault(a + b, r)
        w.f32s("tokenizer.ggml.scores", [-float(rank[t]) if t in rank else 0.0 for t in tokens])
    w.i32s("tokenizer.ggml.token_type", types)
    if kind == "gpt2":
        # SpecialVocab: a space inside a merge half is written as chr(ord(' ') + 256), U+0120.
        w.strings("tokenizer.ggml.merges", [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in h)
                                                       for h in m) for m in merges])
    ids, add = special_ids_and_rule(tj, tc, cfg)
    for typ, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                     ("pad", "padding_token_id")):
        if typ in ids and ids[typ] < n_vocab:
            w.u32("tokenizer.ggml." + key, ids[typ])
    for typ in ("bos", "eos"):
        if typ in add:
            w.boolean(f"tokenizer.ggml.add_{typ}_token", add[typ])
    if kind == "llama":
        # The dummy "▁" prefix: SentencePiece's add_dummy_prefix, spelled in tokenizer.json as a Prepend("▁")
        # normalizer or a Metaspace pre-tokenizer that prepends (Gemma's Replace-only normalizer: none).
        norm = tj.get("normalizer") or {}
        norms = norm.get("normalizers", [norm]) if norm.get("type") == "Sequence" else [norm]
        pre = tj.get("pre_tokenizer") or {}
        scheme = pre.get("prepend_scheme", "always" if pre.get("add_prefix_space", True) else "never")
        prefix = any(n.get("type") == "Prepend" and n.get("prepend") == "\u2581" for n in norms) or \
            (pre.get("type") == "Metaspace" and scheme != "never")
        w.boolean("tokenizer.ggml.add_space_prefix", prefix)
        if pre.get("type") == "Metaspace" and scheme == "first":
            print("hf_to_gguf:   differs from the tokenizers library: Metaspace prepend_scheme 'first' has no GGUF "
                  "spelling; llama.cpp's rule prefixes every text fragment (also after a special token, and a text "
                  "that already starts with a space)")
    return kind, len(tokens), len(merges)


def convert(src, dst, tok_dir=None):
    cfg = json.load(open(os.path.join(src, "config.json")))
    hf_arch = (cfg.get("architectures") or [""])[0]
    if hf_arch not in ARCHS:
        raise Refused(f"{src}/config.json: field 'architectures' = {hf_arch!r}: this tool converts {sorted(ARCHS)}")
    arch = ARCHS[hf_arch]
    p = arch + "."
    t = read_safetensors(os.path.join(src, "model.safetensors"))
    n_layer = cfg["num_hidden_layers"]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    dim = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or dim // n_head
    gemma = arch in ("gemma2", "gemma3")
    rp = rope_params(cfg)
    rp_full = rp.get("full_attention", rp)
    rope_type = rp_full.get("rope_type", rp_full.get("type", "default"))
    notes = []

    w = Writer()
    w.string("general.architecture", arch)
    w.u32("general.alignment", ALIGN)
    w.u32(p + "context_length", cfg.get("max_position_embeddings", 2048))
    w.u32(p + "embedding_length", dim)
    w.u32(p + "block_count", n_layer)
    w.u32(p + "feed_forward_length", cfg["intermediate_size"])
    w.u32(p + "attention.head_count", n_head)
    w.u32(p + "attention.head_count_kv", n_kv)
    w.f32(p + "attention.layer_norm_rms_epsilon", cfg.get("rms_norm_eps", 1e-6))
    if "head_dim" in cfg:
        w.u32(p + "attention.key_length", head_dim)
        w.u32(p + "attention.value_length", head_dim)
    w.f32(p + "rope.freq_base", rp_full.get("rope_theta", 10000.0))
    if tok_dir is None and os.path.isfile(os.path.join(src, "tokenizer.json")):
        tok_dir = src
    if tok_dir is not None:
        kind, n_tok, n_merges = write_tokenizer(w, tok_dir, cfg, cfg.get("vocab_size", 0))
        print(f"hf_to_gguf: tokenizer {os.path.join(tok_dir, 'tokenizer.json')} -> tokenizer.ggml.model {kind} "
              f"({n_tok} tokens, {n_merges} merges{' as scores' if kind == 'llama' else ''})")
    else:
        print(f"hf_to_gguf: {src} has no tokenizer.json: no tokenizer written (pass --tokenizer DIR)")
        if "bos_token_id" in cfg and isinstance(cfg["bos_token_id"], int):
            w.u32("tokenizer.ggml.bos_token_id", cfg["bos_token_id"])
        eos = cfg.get("eos_token_id")
        if isinstance(eos, int):
            w.u32("tokenizer.ggml.eos_token_id", eos)

    # RoPE scaling (TextModel.set_gguf_parameters; llama3 and longrope come as tensors below).
    if rope_type == "linear":
        w.string(p + "rope.scaling.type", "linear")
        w.f32(p + "rope.scaling.factor", rp_full["factor"])
    elif rope_type == "yarn":
        w.string(p + "rope.scaling.type", "yarn")
        w.f32(p + "rope.scaling.factor", rp_full["factor"])
        w.u32(p + "rope.scaling.original_context_length", rp_full["original_max_position_embeddings"])
        for hf_key, key in (("attention_factor", "yarn_attn_factor"), ("beta_fast", "yarn_beta_fast"),
                            ("beta_slow", "yarn_beta_slow"), ("extrapolation_factor", "yarn_ext_factor")):
            if rp_full.get(hf_key) is not None:
                w.f32(p + "rope.scaling." + key, rp_full[hf_key])
    elif rope_type == "dynamic":
        raise Refused(f"{src}/config.json: field 'rope_parameters.rope_type' = 'dynamic': GGUF has no spelling for "
                      "dynamic NTK (llama.cpp's converter leaves it to a few model classes)")
    elif rope_type not in ("default", "llama3", "longrope", "su"):
        raise Refused(f"{src}/config.json: field 'rope_parameters.rope_type' = {rope_type!r} is not converted")
    if gemma and "sliding_attention" in rp and rp["sliding_attention"].get("rope_theta") is not None:
        w.f32(p + "rope.freq_base_swa", rp["sliding_attention"]["rope_theta"])

    rot = head_dim
    if arch == "phi3":
        prf = rp_full.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
        rot = int(prf * dim // n_head) if "head_dim" not in cfg else int(prf * head_dim)
        w.u32(p + "rope.dimension_count", rot)

    # Soft-caps and Gemma's softmax scale.
    if arch == "gemma2":
        w.f32(p + "attn_logit_softcapping", cfg.get("attn_logit_softcapping") or 0.0)
        w.f32(p + "final_logit_softcapping", cfg.get("final_logit_softcapping") or 0.0)
    if arch == "gemma3" and cfg.get("final_logit_softcapping"):
        w.f32(p + "final_logit_softcapping", cfg["final_logit_softcapping"])
    if gemma:
        qpas = cfg.get("query_pre_attn_scalar", 256)
        if qpas != head_dim:
            w.f32(p + "attention.scale", qpas ** -0.5)
            notes.append(f"attention.scale = query_pre_attn_scalar {qpas} ** -0.5 (llama.cpp would use key_length {head_dim})")

    # Sliding windows: the window, and the layer pattern when it is not llama.cpp's fixed one.
    lt = cfg.get("layer_types")
    window = cfg.get("sliding_window")
    if arch in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        window = None
    if window:
        sliding = [x == "sliding_attention" for x in lt] if lt else [True] * n_layer
        n = {"gemma2": 2, "gemma3": 6}.get(arch, 1)
        fixed = [n == 1 or l % n < n - 1 for l in range(n_layer)]
        if any(sliding):
            w.u32(p + "attention.sliding_window", window)
            if arch not in ("gemma2", "gemma3", "phi3"):
                notes.append(f"attention.sliding_window = {window} (llama.cpp's {arch} converter drops it)")
            if sliding != fixed:
                w.bools(p + "attention.sliding_window_pattern", sliding)
                notes.append(f"attention.sliding_window_pattern = {sliding} (llama.cpp's fixed pattern: {fixed})")

    # Tensors.
    def get(name):
        if name not in t:
            raise Refused(f"{src}/model.safetensors: missing tensor '{name}'")
        return t.pop(name)

    def put(gname, hfname, fn=None):
        shape, a = get(hfname)
        if gemma and hfname.endswith("norm.weight"):
            a = plus_one(a)
        if fn:
            a = fn(shape, a)
        w.tensor(gname, shape, a)

    put("token_embd.weight", "model.embed_tokens.weight")
    put("output_norm.weight", "model.norm.weight")
    if "lm_head.weight" in t:
        if gemma:
            t.pop("lm_head.weight")  # Gemma2Model.filter_tensors: lm_head is not used (tied)
        else:
            put("output.weight", "lm_head.weight")
    if rope_type == "llama3" and arch == "llama":
        w.tensor("rope_freqs.weight", [head_dim // 2], llama3_factors(rp_full, head_dim))
    if rope_type in ("longrope", "su"):
        if arch != "phi3":
            raise Refused(f"{src}/config.json: longrope is converted for Phi-3 only")
        orig = rp_full.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
        mx = cfg["max_position_embeddings"]
        scale = mx / orig
        attn = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
        w.f32(p + "rope.scaling.attn_factor", attn)
        w.u32(p + "rope.scaling.original_context_length", orig)
        for key, gname in (("long_factor", "rope_factors_long.weight"), ("short_factor", "rope_factors_short.weight")):
            fac = rp_full[key]
            if len(fac) != rot // 2:
                raise Refused(f"{src}/config.json: field 'rope_parameters.{key}' has {len(fac)} entries, rotary dim / 2 = {rot // 2}")
            w.tensor(gname, [len(fac)], array.array("f", fac))

    def perm(n):
        return lambda shape, a: permute_rows(a, shape, n)

    for l in range(n_layer):
        h, b = f"model.layers.{l}.", f"blk.{l}."
        put(b + "attn_norm.weight", h + "input_layernorm.weight")
        if arch == "phi3":
            put(b + "attn_qkv.weight", h + "self_attn.qkv_proj.weight")
        else:
            put(b + "attn_q.weight", h + "self_attn.q_proj.weight", perm(n_head) if arch == "llama" else None)
            put(b + "attn_k.weight", h + "self_attn.k_proj.weight", perm(n_kv) if arch == "llama" else None)
            put(b + "attn_v.weight", h + "self_attn.v_proj.weight")
        for x in ("q", "k", "v"):
            if h + f"self_attn.{x}_proj.bias" in t:
                put(b + f"attn_{x}.bias", h + f"self_attn.{x}_proj.bias")
        put(b + "attn_output.weight", h + "self_attn.o_proj.weight")
        if h + "self_attn.q_norm.weight" in t:
            put(b + "attn_q_norm.weight", h + "self_attn.q_norm.weight")
            put(b + "attn_k_norm.weight", h + "self_attn.k_norm.weight")
        if gemma:
            put(b + "post_attention_norm.weight", h + "post_attention_layernorm.weight")
            put(b + "ffn_norm.weight", h + "pre_feedforward_layernorm.weight")
            put(b + "post_ffw_norm.weight", h + "post_feedforward_layernorm.weight")
        else:
            put(b + "ffn_norm.weight", h + "post_attention_layernorm.weight")
        if arch == "phi3":
            put(b + "ffn_up.weight", h + "mlp.gate_up_proj.weight")
        else:
            put(b + "ffn_gate.weight", h + "mlp.gate_proj.weight")
            put(b + "ffn_up.weight", h + "mlp.up_proj.weight")
        put(b + "ffn_down.weight", h + "mlp.down_proj.weight")
    if t:
        raise Refused(f"{src}/model.safetensors: tensors this tool does not map: {sorted(t)[:5]}")
    w.write(dst)
    return arch, notes


def main(argv):
    args = argv[1:]
    tok_dir = None
    if len(args) >= 2 and args[0] == "--tokenizer":
        tok_dir = args[1]
        args = args[2:]
    if len(args) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if tok_dir is not None and not os.path.isfile(os.path.join(tok_dir, "tokenizer.json")):
        print(f"hf_to_gguf: --tokenizer {tok_dir}: no tokenizer.json there", file=sys.stderr)
        return 2
    try:
        arch, notes = convert(args[0], args[1], tok_dir)
    except Refused as e:
        print(f"hf_to_gguf: {e}", file=sys.stderr)
        return 2
    print(f"hf_to_gguf: {args[0]} -> {args[1]} (arch {arch})")
    for n in notes:
        print(f"hf_to_gguf:   beyond llama.cpp's converter: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
