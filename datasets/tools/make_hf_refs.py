#!/usr/bin/env python3
"""Makes the reference directories under datasets/models/hf_refs/ with code kvgate did not write.

Run where PyTorch, transformers (5.x) and tokenizers are installed (the lent H200 here; no network
needed, nothing is downloaded):

    python3 datasets/tools/make_hf_refs.py --out datasets/models/hf_refs

It writes, all from fixed seeds:
  tokenizers/<kind>/   tokenizer.json + tokenizer_config.json made with the `tokenizers` library
                       (trained on CORPUS below), and tok_ref.json: the ids the `tokenizers` library
                       and transformers' AutoTokenizer give for TEXTS, with and without special tokens,
                       the decoded text, and whether BOS/EOS were added.
  models/<case>/       a tiny random-weight model per family and RoPE type, saved by transformers
                       (config.json as transformers writes it, model.safetensors in f32) with one of the
                       tokenizers above, and ref.json + logits.f32: teacher-forced logits of every
                       position (one forward, use_cache=False, eager attention, f32) and a cached greedy
                       continuation with each step's top-1/top-2 margin.
  READY                the case names (the gates read the directories; this marks a complete run).

The references are computed from the directory *as saved* (reloaded with from_pretrained), so they
are what transformers does with exactly the files kvgate loads. Format of ref.json and tok_ref.json:
datasets/models/hf_refs/README.md.
"""
import argparse
import json
import math
import os
import shutil
import sys

import torch
import transformers
import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# ---- text --------------------------------------------------------------------------------------------

CORPUS = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
    "One day, she saw a big red ball under a tree. She ran to the ball and kicked it very hard.",
    "The ball flew over the fence and landed in the garden of an old man who lived next door.",
    "Lily was scared, but she went to the door and knocked. The old man smiled and gave her the ball.",
    "They became good friends and played together every day until the summer was over.",
    "Tom had a small dog called Max. Max liked to run, jump and bark at the birds in the sky.",
    "It was a sunny morning. The sun was warm and the flowers were bright and happy.",
    "\"Can I have some water?\" asked the bird. \"Yes, of course,\" said the kind frog.",
    "The numbers were 1, 2, 3, 10, 42 and 2026; the total was 2084.",
    "In the kitchen, Mom made soup with carrots, potatoes and onions for dinner.",
    "café naïve résumé über straße",
    "def main():\n    return 0\n\n",
] * 4

TEXTS = [
    "Hello world",
    "Once upon a time, there was a little girl named Lily.",
    " leading space and  two  spaces   three",
    "line one\nline two\n\n\ttabbed end",
    "naïve café — déjà vu ✓ 日本語 🙂 Ω≈ç√",
    "numbers 12345 and 3.14159 and 2026",
    "",
    "   ",
    "unseen letters: xyzzy QQQ jjj kkk",
]

# ---- tokenizers ----------------------------------------------------------------------------------------

QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
            r"\s+(?!\S)|\s+")
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
             r"\s+(?!\S)|\s+")


def train_bytelevel(pattern, specials, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def train_sentencepiece_bpe(specials, vocab_size):
    """A SentencePiece-style BPE: `▁` for spaces, byte_fallback with the 256 <0xXX> tokens right after
    the special tokens (as Llama 2 / Mistral / Gemma vocabularies have them), merges trained here with a
    small alphabet so that unseen characters fall back to bytes."""
    t = Tokenizer(models.BPE(unk_token=specials[0] if "<unk>" not in specials else "<unk>", byte_fallback=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, limit_alphabet=48,
                                  show_progress=False)
    t.train_from_iterator(CORPUS, trainer)
    j = json.loads(t.to_str())
    trained = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {}
    for s in specials:
        vocab[s] = len(vocab)
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for piece, _ in trained:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    j["model"]["vocab"] = vocab
    j["model"]["byte_fallback"] = True
    j["model"]["fuse_unk"] = True
    j["model"]["unk_token"] = "<unk>"
    for a in j["added_tokens"]:
        a["id"] = vocab[a["content"]]
    return Tokenizer.from_str(json.dumps(j))


def sp_decoder_replace_strip():
    return decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                              decoders.Strip(" ", 1, 0)])


def make_tokenizers():
    """kind -> (Tokenizer, tokenizer_config dict, bos token or None, eos token)."""
    out = {}
    # Qwen2 / Qwen2.5 / Qwen3 style: byte-level, post-processor ByteLevel only -> no BOS, although the
    # model configs declare bos_token_id.
    q = train_bytelevel(QWEN2_RE, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], 420)
    q.post_processor = processors.ByteLevel(trim_offsets=False)
    out["bytelevel_qwen"] = (q, {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
                                 "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                 "add_prefix_space": False, "split_special_tokens": False,
                                 "model_max_length": 4096}, "<|endoftext|>", "<|im_end|>")
    # Llama 3 style: byte-level + TemplateProcessing adding <|begin_of_text|>.
    l3 = train_bytelevel(LLAMA3_RE, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], 420)
    bot = l3.token_to_id("<|begin_of_text|>")
    l3.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bot)]),
    ])
    out["bytelevel_llama3"] = (l3, {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
                                    "eos_token": "<|end_of_text|>", "model_max_length": 4096},
                               "<|begin_of_text|>", "<|end_of_text|>")
    # Llama 2 / Mistral v0.1 style (tokenizers' conversion of a SentencePiece BPE model).
    sp = train_sentencepiece_bpe(["<unk>", "<s>", "</s>"], 340)
    sp_json = sp.to_str()
    l2 = Tokenizer.from_str(sp_json)
    l2.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    l2.pre_tokenizer = None
    l2.decoder = sp_decoder_replace_strip()
    l2.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                      special_tokens=[("<s>", l2.token_to_id("<s>"))])
    out["sp_llama2"] = (l2, {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                             "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
                             "model_max_length": 4096}, "<s>", "</s>")
    # Newer conversions of the same: Metaspace pre-tokenizer (prepend_scheme first), Metaspace decoder.
    ms = Tokenizer.from_str(sp_json)
    ms.normalizer = None
    ms.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    ms.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)])
    ms.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                      special_tokens=[("<s>", ms.token_to_id("<s>"))])
    out["sp_metaspace"] = (ms, {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                                "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": 4096},
                           "<s>", "</s>")
    # Gemma style: no prepended ▁, spaces replaced, <bos> by the template, its own special ids.
    g = train_sentencepiece_bpe(["<pad>", "<eos>", "<bos>", "<unk>"], 340)
    g.normalizer = normalizers.Replace(" ", "\u2581")
    g.pre_tokenizer = None
    g.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    g.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B:1",
                                                     special_tokens=[("<bos>", g.token_to_id("<bos>"))])
    out["sp_gemma"] = (g, {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
                           "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": True,
                           "add_eos_token": False, "model_max_length": 4096}, "<bos>", "<eos>")
    return out


def write_tokenizer(dirpath, tok, tok_cfg):
    os.makedirs(dirpath, exist_ok=True)
    tok.save(os.path.join(dirpath, "tokenizer.json"))
    with open(os.path.join(dirpath, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2, ensure_ascii=False)


def tok_reference(kind, dirpath, tok, bos, eos):
    specials = [a.content for a in tok.get_added_tokens_decoder().values()]
    texts = list(TEXTS) + ["special " + " and ".join(specials) + " inside", specials[-1] + "x" + specials[0]]
    ids, ids_ns, decoded, hf_ids = [], [], [], []
    try:
        hf = transformers.AutoTokenizer.from_pretrained(dirpath)
        hf_err = None
    except Exception as e:  # recorded, never hidden
        hf, hf_err = None, repr(e)
    for t in texts:
        e = tok.encode(t)
        ids.append(e.ids)
        ns = tok.encode(t, add_special_tokens=False).ids
        ids_ns.append(ns)
        decoded.append(tok.decode(ns, skip_special_tokens=False))
        hf_ids.append(hf(t)["input_ids"] if hf is not None else None)
    probe = tok.encode("x").ids
    probe_ns = tok.encode("x", add_special_tokens=False).ids
    bos_id = tok.token_to_id(bos) if bos else None
    eos_id = tok.token_to_id(eos) if eos else None
    ref = {
        "kind": kind,
        "tokenizers_version": tokenizers.__version__,
        "transformers_version": transformers.__version__,
        "texts": texts,
        "ids": ids,
        "ids_no_special": ids_ns,
        "decoded": decoded,
        "hf_input_ids": hf_ids,
        "hf_error": hf_err,
        "bos_added": bos_id is not None and len(probe) > len(probe_ns) and probe[0] == bos_id,
        "eos_added": eos_id is not None and len(probe) > len(probe_ns) and probe[-1] == eos_id,
        "special_tokens": {"bos": bos_id, "eos": eos_id},
        "vocab_size": tok.get_vocab_size(),
    }
    with open(os.path.join(dirpath, "tok_ref.json"), "w") as f:
        json.dump(ref, f, ensure_ascii=False)
    return ref


# ---- models --------------------------------------------------------------------------------------------

T_TF = 96       # teacher-forced positions: past every original_max_position_embeddings (32) and window (16)
PROMPT = 12     # greedy prompt length
GREEDY = 84     # greedy steps (prompt + steps = 96)


def base(vocab, bos, eos, **kw):
    c = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
             tie_word_embeddings=False, vocab_size=vocab, bos_token_id=bos, eos_token_id=eos)
    c.update(kw)
    return c


def cases(toks):
    """(case, family, transformers class names, tokenizer kind, config kwargs, rope_type)."""
    def ids(kind):
        t, _, b, e = toks[kind]
        return t.get_vocab_size(), (t.token_to_id(b) if b else None), t.token_to_id(e)

    V3, B3, E3 = ids("bytelevel_llama3")
    VQ, BQ, EQ = ids("bytelevel_qwen")
    VS, BS, ES = ids("sp_llama2")
    VM, BM, EM = ids("sp_metaspace")
    VG, BG, EG = ids("sp_gemma")
    # Qwen configs declare the <|endoftext|> id as bos_token_id although the tokenizer adds none.
    BQ = toks["bytelevel_qwen"][0].token_to_id("<|endoftext|>")
    llama3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    return [
        ("llama_default", "llama", "LlamaConfig", "LlamaForCausalLM", "bytelevel_llama3",
         base(V3, B3, E3, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), "default"),
        ("llama3_rope", "llama", "LlamaConfig", "LlamaForCausalLM", "bytelevel_llama3",
         base(V3, B3, E3, head_dim=32, rope_parameters=dict(llama3)), "llama3"),
        ("llama_linear", "llama", "LlamaConfig", "LlamaForCausalLM", "bytelevel_llama3",
         base(V3, B3, E3, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}), "linear"),
        ("llama_dynamic", "llama", "LlamaConfig", "LlamaForCausalLM", "bytelevel_llama3",
         # transformers' dynamic NTK takes its original length from max_position_embeddings.
         base(V3, B3, E3, max_position_embeddings=32,
              rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}), "dynamic"),
        ("llama_sp", "llama", "LlamaConfig", "LlamaForCausalLM", "sp_llama2",
         base(VS, BS, ES, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), "default"),
        ("qwen2", "qwen2", "Qwen2Config", "Qwen2ForCausalLM", "bytelevel_qwen",
         base(VQ, BQ, EQ, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
              use_sliding_window=False), "default"),
        ("qwen2_swa", "qwen2", "Qwen2Config", "Qwen2ForCausalLM", "bytelevel_qwen",
         base(VQ, BQ, EQ, num_hidden_layers=3, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
              use_sliding_window=True, sliding_window=16, max_window_layers=1), "default"),
        ("qwen3", "qwen3", "Qwen3Config", "Qwen3ForCausalLM", "bytelevel_qwen",
         base(VQ, BQ, EQ, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}), "default"),
        ("qwen3_yarn", "qwen3", "Qwen3Config", "Qwen3ForCausalLM", "bytelevel_qwen",
         base(VQ, BQ, EQ, max_position_embeddings=128,
              rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                           "original_max_position_embeddings": 32}), "yarn"),
        ("mistral_swa", "mistral", "MistralConfig", "MistralForCausalLM", "sp_metaspace",
         base(VM, BM, EM, sliding_window=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
         "default"),
        ("phi3", "phi3", "Phi3Config", "Phi3ForCausalLM", "sp_llama2",
         base(VS, BS, ES, head_dim=None, partial_rotary_factor=0.5,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
              original_max_position_embeddings=256, pad_token_id=0), "default"),
        ("phi3_longrope", "phi3", "Phi3Config", "Phi3ForCausalLM", "sp_llama2",
         base(VS, BS, ES, head_dim=None, max_position_embeddings=128, original_max_position_embeddings=32,
              pad_token_id=0,
              rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                               "short_factor": [1.0, 1.02, 1.05, 1.1, 1.2, 1.4, 1.7, 2.0],
                               "long_factor": [1.0, 1.3, 1.8, 2.5, 3.2, 4.0, 5.5, 8.0],
                               "original_max_position_embeddings": 32}), "longrope"),
        ("gemma2", "gemma2", "Gemma2Config", "Gemma2ForCausalLM", "sp_gemma",
         base(VG, BG, EG, num_hidden_layers=3, head_dim=32, query_pre_attn_scalar=24, sliding_window=16,
              attn_logit_softcapping=8.0, final_logit_softcapping=6.0, hidden_activation="gelu_pytorch_tanh",
              tie_word_embeddings=True, pad_token_id=0,
              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), "default"),
        ("gemma3", "gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", "sp_gemma",
         base(VG, BG, EG, num_hidden_layers=3, head_dim=32, query_pre_attn_scalar=32, sliding_window=16,
              hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, pad_token_id=0,
              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
              rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
         "linear+local"),
        # Mixture of experts. Layer 0 of qwen3_moe is dense (mlp_only_layers); the others route each token
        # to 2 of 4 experts.
        ("qwen3_moe", "qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", "bytelevel_qwen",
         base(VQ, BQ, EQ, num_hidden_layers=3, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
              norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0],
              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}), "default"),
        ("mixtral", "mixtral", "MixtralConfig", "MixtralForCausalLM", "sp_metaspace",
         base(VM, BM, EM, num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}), "default"),
        # Multi-head latent attention with DeepSeek-V3 routing: layer 0 dense (first_k_dense_replace), the
        # others 8 routed experts in 2 groups (sigmoid scores, selection bias) plus one shared expert.
        ("deepseek_v3", "deepseek_v3", "DeepseekV3Config", "DeepseekV3ForCausalLM", "bytelevel_llama3",
         base(V3, B3, E3, num_hidden_layers=3, num_key_value_heads=4, head_dim=None, kv_lora_rank=32,
              q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
              n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
              moe_intermediate_size=32, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), "default"),
        ("deepseek_v3_qlora", "deepseek_v3", "DeepseekV3Config", "DeepseekV3ForCausalLM", "bytelevel_llama3",
         base(V3, B3, E3, num_hidden_layers=3, num_key_value_heads=4, head_dim=None, kv_lora_rank=32,
              q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
              n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
              moe_intermediate_size=32, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
              max_position_embeddings=128,
              rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                               "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0,
                               "mscale": 1.0, "mscale_all_dim": 1.0}), "yarn"),
    ]


# Where a config class refuses the transformers-5 spelling, the older keyword spelling of the same
# settings (the saved config.json is whatever transformers then writes, and the references follow it).
LEGACY_KW = {
    "Gemma3TextConfig": lambda kw: dict({k: v for k, v in kw.items() if k != "rope_parameters"}, rope_theta=1000000.0,
                                        rope_local_base_freq=10000.0,
                                        rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "Phi3Config": lambda kw: dict({k: v for k, v in kw.items() if k != "rope_parameters"},
                                  rope_theta=kw["rope_parameters"]["rope_theta"],
                                  rope_scaling=({k: v for k, v in kw["rope_parameters"].items()
                                                 if k not in ("rope_theta", "partial_rotary_factor")}
                                                if kw["rope_parameters"]["rope_type"] != "default" else None)),
}


KEEP_NONE = {"q_lora_rank"}


def make_config(cls_name, kw):
    cls = getattr(transformers, cls_name)
    # None means "leave the class default", except where None is itself the setting (no query LoRA).
    kw = {k: v for k, v in kw.items() if v is not None or k in KEEP_NONE}
    try:
        return cls(**kw)
    except Exception as e:
        if cls_name not in LEGACY_KW:
            raise
        print("  %s refused the rope_parameters spelling (%r); using the keyword spelling" % (cls_name, e))
        return cls(**{k: v for k, v in LEGACY_KW[cls_name](kw).items() if v is not None})


def init_weights(model, family, seed):
    """Random weights large enough that logits are peaked (std ~3) and attention is not uniform, so
    RoPE, masks and caps change the outputs. Norm weights near their identity ((1 + w) for Gemma)."""
    g = torch.Generator().manual_seed(seed)
    gemma = family.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 3:  # experts fused as [expert, out, in] (transformers 5 MoE layout)
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            elif p.dim() == 2:
                std = 1.0 / math.sqrt(p.shape[1])
                if "embed_tokens" in name or "lm_head" in name:
                    std = 3.0 / math.sqrt(p.shape[1])
                if "q_proj" in name or ("qkv_proj" in name):
                    std *= 2.5
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            else:  # norm weights
                w = torch.randn(p.shape, generator=g) * 0.1
                p.copy_(w if gemma else 1.0 + w)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3: shifts expert selection only
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)


def safe_shape(d, name):
    from safetensors import safe_open
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        return tuple(f.get_slice(name).get_shape())


def load_eager(d):
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32)
    except TypeError:
        return transformers.AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager",
                                                                 torch_dtype=torch.float32)


def text_ids(tok, n):
    ids = []
    i = 0
    while len(ids) < n:
        ids += tok.encode(CORPUS[i % len(CORPUS)] + " ", add_special_tokens=(i == 0)).ids
        i += 1
    return ids[:n]


def random_ids(tok, n, bos_id, seed):
    g = torch.Generator().manual_seed(seed)
    n_special = len(tok.get_added_tokens_decoder())
    r = torch.randint(n_special, tok.get_vocab_size(), (n,), generator=g).tolist()
    return ([bos_id] + r[:-1]) if bos_id is not None else r


@torch.no_grad()
def references(model, tf_inputs, prompt):
    logits = []
    for name, ids in tf_inputs:
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
        logits.append((name, ids, out.logits[0].float().contiguous()))
    # Cached greedy, step by step (what generate(do_sample=False) does, without its stop rules).
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    past = out.past_key_values
    last = out.logits[0, -1].float()
    gen, margins = [], []
    for _ in range(GREEDY):
        top = torch.topk(last, 2)
        nxt = int(top.indices[0])
        gen.append(nxt)
        margins.append(float(top.values[0] - top.values[1]))
        out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        last = out.logits[0, -1].float()
    return logits, gen, margins


def make_model_case(root, case, family, cfg_cls, model_cls, kind, kw, rope_type, toks, seed):
    tok, tok_cfg, bos, _ = toks[kind]
    d = os.path.join(root, "models", case)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    torch.manual_seed(seed)
    cfg = make_config(cfg_cls, kw)
    model = getattr(transformers, model_cls)(cfg).to(torch.float32)
    init_weights(model, family, seed)
    model.save_pretrained(d)
    write_tokenizer(d, tok, tok_cfg)
    if family in ("qwen3_moe", "mixtral", "deepseek_v3"):
        from safetensors import safe_open
        with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
            names = sorted(f.keys())
        print("  %s: %d tensors, layer 1: %s" % (case, len(names),
              ", ".join("%s%s" % (n, list(f_shape)) for n, f_shape in
                        ((n, safe_shape(d, n)) for n in names if ".layers.1." in n))))
    model = load_eager(d)
    model.eval()
    bos_adds = len(tok.encode("x").ids) > len(tok.encode("x", add_special_tokens=False).ids)
    bos_id = tok.token_to_id(bos) if (bos and bos_adds) else None
    tf = [("corpus text", text_ids(tok, T_TF)), ("random ids", random_ids(tok, T_TF, bos_id, seed + 1))]
    prompt = tf[0][1][:PROMPT]
    logits, gen, margins = references(model, tf, prompt)
    offset = 0
    entries = []
    with open(os.path.join(d, "logits.f32"), "wb") as f:
        for name, ids, lg in logits:
            f.write(lg.numpy().astype("<f4").tobytes())
            entries.append({"name": name, "ids": ids, "offset": offset, "T": len(ids)})
            offset += lg.numel()
    saved_cfg = json.load(open(os.path.join(d, "config.json")))
    ref = {
        "case": case, "architecture": model_cls, "family": family, "rope_type": rope_type,
        "tokenizer_kind": kind,
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "attn_implementation": "eager", "dtype": "float32", "seed": seed,
        "vocab_size": int(saved_cfg.get("vocab_size", tok.get_vocab_size())),
        "bos_added": bool(bos_adds),
        "teacher_forced": entries,
        "greedy": [{"name": "corpus prompt", "prompt_ids": prompt, "generated": gen, "top2_margin": margins}],
    }
    with open(os.path.join(d, "ref.json"), "w") as f:
        json.dump(ref, f)
    return d, ref


def make_legacy_twin(root, src_case, dst_case, seed):
    """The same weights with the config in the legacy spelling (top-level rope_theta + rope_scaling),
    references recomputed by transformers from that config."""
    s = os.path.join(root, "models", src_case)
    d = os.path.join(root, "models", dst_case)
    if os.path.isdir(d):
        shutil.rmtree(d)
    shutil.copytree(s, d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    cfg["rope_scaling"] = rp
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    ref = json.load(open(os.path.join(d, "ref.json")))
    model = load_eager(d)
    model.eval()
    tf = [(e["name"], e["ids"]) for e in ref["teacher_forced"]]
    logits, gen, margins = references(model, tf, ref["greedy"][0]["prompt_ids"])
    with open(os.path.join(d, "logits.f32"), "wb") as f:
        for _, _, lg in logits:
            f.write(lg.numpy().astype("<f4").tobytes())
    ref["case"] = dst_case
    ref["greedy"][0]["generated"] = gen
    ref["greedy"][0]["top2_margin"] = margins
    ref["config_spelling"] = "legacy rope_scaling"
    with open(os.path.join(d, "ref.json"), "w") as f:
        json.dump(ref, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    os.makedirs(a.out, exist_ok=True)
    toks = make_tokenizers()
    done, failed = [], []
    for kind, (tok, cfg, bos, eos) in toks.items():
        d = os.path.join(a.out, "tokenizers", kind)
        write_tokenizer(d, tok, cfg)
        r = tok_reference(kind, d, tok, bos, eos)
        print("tokenizer %-17s vocab %4d bos_added=%s hf=%s" % (kind, r["vocab_size"], r["bos_added"],
                                                               "ok" if r["hf_error"] is None else r["hf_error"]))
        done.append("tokenizers/" + kind)
    only = set(x for x in a.only.split(",") if x)
    for i, (case, family, cfg_cls, model_cls, kind, kw, rope_type) in enumerate(cases(toks)):
        if only and case not in only:
            continue
        try:
            d, ref = make_model_case(a.out, case, family, cfg_cls, model_cls, kind, kw, rope_type, toks, 1000 + i)
            m = ref["greedy"][0]["top2_margin"]
            print("model %-14s %-18s rope %-12s greedy min margin %.4f" % (case, model_cls, rope_type, min(m)))
            done.append("models/" + case)
            if case == "llama3_rope":
                make_legacy_twin(a.out, "llama3_rope", "llama3_legacy", 1000 + i)
                print("model %-14s (legacy rope_scaling spelling of llama3_rope)" % "llama3_legacy")
                done.append("models/llama3_legacy")
        except Exception as e:
            import traceback
            traceback.print_exc()
            failed.append((case, repr(e)))
            print("model %-14s FAILED: %r" % (case, e))
    with open(os.path.join(a.out, "READY"), "w") as f:
        f.write("transformers %s, tokenizers %s, torch %s\n" % (transformers.__version__, tokenizers.__version__,
                                                               torch.__version__))
        for x in done:
            f.write(x + "\n")
        for c, e in failed:
            f.write("FAILED %s %s\n" % (c, e))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
