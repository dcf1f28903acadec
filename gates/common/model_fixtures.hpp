// Shared model and engine set-up of the gate programs: synth models generated once per process, the
// "odd geometry" model on which q8_0 and k8v4 fall back, and engine options with the KV resolved for
// a model.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/model.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate/synth.hpp"
#include "scratch_dir.hpp"

namespace kvgate::gates {

// The synth model of options `o` (o.out is ignored), generated into a temporary folder on the first
// call with `key` and loaded once; the folder is removed when the process exits. `key` names the
// folder and tells models apart (one key, one set of options).
inline const Model& synth_model_once(const std::string& key, SynthOptions o) {
  struct Entry {
    ScratchDir dir{"kvgate-synth"};
    std::unique_ptr<Model> model;
  };
  static std::map<std::string, std::unique_ptr<Entry>> cache;
  auto& e = cache[key];
  if (!e) {
    auto made = std::make_unique<Entry>();
    o.out = made->dir.sub(key);
    synth_hf(o);
    made->model = std::make_unique<Model>(load_model(o.out));
    e = std::move(made);
  }
  return *e->model;
}

// The tensor-parallel gates' model (PAR.tp, PAR.cuda.tp, PAR.cuda.tp.stream, PAR.cuda.tp.persist): a 2-layer GQA Llama
// with 8 query / 4 KV heads of 32 (hidden 256, FFN 512, vocab 300), so 2 and 4 ranks split it and a
// 32-element block never straddles two heads.
inline SynthOptions synth_tp_options() {
  SynthOptions o;
  o.layers = 2;
  o.hidden = 256;
  o.heads = 8;
  o.kv_heads = 4;
  o.ffn = 512;
  o.vocab = 300;
  o.seed = 11;
  o.max_seq_len = 256;
  return o;
}

// Rows of 2 KV heads x head_dim 12 = 24 floats: no multiple of 32 and head_dim no power of two, so
// q8_0 and k8v4 fall back on it (docs/FORMATS.md, capability rules). Hidden 48, 4 query heads,
// FFN 64, vocabulary 300; the caller sets layers, seed and context.
inline SynthOptions odd_geometry_options(int layers, int max_seq_len) {
  SynthOptions o;
  o.layers = layers;
  o.hidden = 48;
  o.heads = 4;
  o.kv_heads = 2;
  o.head_dim = 12;
  o.ffn = 64;
  o.vocab = 300;
  o.max_seq_len = max_seq_len;
  return o;
}

// One Llama layer of hidden 256 (2 query heads of 128, 1 KV head, FFN 64) and a vocabulary of
// `vocab`: the embedding and the classifier hold vocab x 256 elements, so they span several pieces of
// the loaders' conversion, the synth generator's chunks (2^20) and the CUDA upload's staging (2^22,
// 2^23). The caller sets seed, context, dtype and out.
inline SynthOptions wide_embedding_options(int vocab) {
  SynthOptions o;
  o.arch = "llama";
  o.layers = 1;
  o.hidden = 256;
  o.ffn = 64;
  o.heads = 2;
  o.kv_heads = 1;
  o.head_dim = 128;
  o.vocab = vocab;
  return o;
}

// A DeepSeek-V3-style MLA model with DeepSeek-V3's latent widths (kv_lora_rank 512,
// qk_rope_head_dim 64) at toy size: 2 dense layers of hidden 128, 2 heads of nope 32 + rope 64 (an
// expanded token row of 192, no multiple of 128, while the latent is 4 tiles of 128), v 32, FFN 256,
// vocabulary 300, context 256, one generator thread. The caller sets out.
inline SynthOptions deepseek_latent512_options() {
  SynthOptions o;
  o.arch = "deepseek_v3";
  o.layers = 2;
  o.hidden = 128;
  o.heads = 2;
  o.ffn = 256;
  o.vocab = 300;
  o.kv_lora_rank = 512;
  o.qk_rope_head_dim = 64;
  o.qk_nope_head_dim = 32;
  o.v_head_dim = 32;
  o.max_seq_len = 256;
  o.threads = 1;
  return o;
}

// Engine options for KV format `fmt` on model `m` with the KV resolved as the engine would (a format
// the geometry cannot hold falls back, as resolve_kv says), pages of `block_size`, a context cap.
inline EngineOptions resolved_engine_options(const Model& m, const KvFormat& fmt, int block_size, int max_context) {
  KvRequest req;
  req.flag = fmt;
  EngineOptions o = engine_options_for(fmt);
  o.kv = resolve_kv(req, m.config, block_size);
  o.block_size = block_size;
  o.max_context = max_context;
  return o;
}

}  // namespace kvgate::gates
