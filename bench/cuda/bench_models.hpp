// The model shapes of the end-to-end CUDA benchmark (bench_e2e_decode), as host-only code: each is
// described the way its checkpoint describes it (`kvgate synth` options, or the config.json a
// transformers export of the shape holds) and mapped to the ModelConfig that the Hugging Face loader
// (runtime/src/load_hf.cpp) produces from that description. The benchmark generates random weights
// of that config on the device, so nothing here reads a file.
//
//   Llama   Llama-3-8B / Llama-3.1-8B: 32 layers, hidden 4096, 32 query / 8 KV heads, head_dim 128,
//           FFN 14336, vocab 128256, rope_theta 5e5, untied; RoPE plain, llama3 (Llama 3.1's
//           rope_parameters: factor 8, low/high_freq_factor 1/4, original 8192, as `kvgate synth
//           --rope llama3` writes them) or dynamic NTK (factor 4 over 8192; no synth option writes it).
//   Gemma 3 Gemma-3-4B (Gemma3ForCausalLM, the text model): 34 layers, hidden 2560, 8 query / 4 KV
//           heads, head_dim 256, FFN 10240, vocab 262208 (Gemma3TextConfig's; 262144 of them are the
//           tokenizer's text tokens), sliding_window 1024 on every layer but each 6th, global layers
//           rope_theta 1e6 with linear factor 8, local layers rope_theta 1e4 (plain), query_pre_attn_
//           scalar 256, QK-norm, GeGLU (tanh), sandwich norms, embeddings scaled by sqrt(hidden)
//           rounded to bf16, tied embeddings, no soft-caps (Gemma 3 declares them null).
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvgate/model.hpp"
#include "kvgate/numeric.hpp"
#include "kvgate/synth.hpp"

namespace kvgate::bench {

// --- Llama ------------------------------------------------------------------------------------

// `kvgate synth` options of the Llama-3-8B shape (bf16 tensors). rope: "plain" or "llama3" (the
// synth option); "dynamic" has no synth option (llama_config sets it).
inline SynthOptions llama3_8b_synth(int layers, const std::string& rope) {
  SynthOptions s;
  s.arch = "llama";
  s.layers = layers;
  s.hidden = 4096;
  s.ffn = 14336;
  s.heads = 32;
  s.kv_heads = 8;
  s.head_dim = 128;
  s.vocab = 128256;
  s.dtype = "bf16";
  s.rope_theta = 500000.0;
  s.max_seq_len = 131072;  // Llama 3.1's max_position_embeddings
  s.tie_embeddings = false;
  if (rope == "llama3") s.rope = "llama3";
  return s;
}

// The ModelConfig load_hf reads from the directory `kvgate synth` writes for `s` (config.json:
// LlamaForCausalLM, rms_norm_eps 1e-5, rope_theta or llama3 rope_parameters, bos/eos = vocab-2/-1).
// rope "dynamic": dynamic NTK, factor 4 over max_position 8192 (set here by hand: no synth option).
// Returns false (and leaves `why`) for an unknown rope.
inline bool llama_config(const SynthOptions& s, const std::string& rope, ModelConfig* out, std::string* why) {
  ModelConfig c;
  c.arch = "llama";
  c.dim = s.hidden;
  c.hidden_dim = s.ffn;
  c.n_layers = s.layers;
  c.n_heads = s.heads;
  c.n_kv_heads = s.kv_heads;
  c.head_dim = s.head_dim > 0 ? s.head_dim : s.hidden / s.heads;
  c.vocab_size = s.vocab;
  c.max_seq_len = s.max_seq_len;
  c.rms_eps = 1e-5f;
  c.rope_theta = static_cast<float>(s.rope_theta > 0 ? s.rope_theta : 10000.0);
  c.rope_style = RopeStyle::half;  // Hugging Face checkpoints
  c.rope.max_position = s.max_seq_len;  // the loader's read of max_position_embeddings
  c.rope.factor = 0;                    // no `factor` field (unused by the plain RoPE)
  c.tied_embeddings = s.tie_embeddings;
  c.bos_id = s.vocab - 2;
  c.eos_id = s.vocab - 1;
  if (rope == "llama3") {
    c.rope.type = RopeType::llama3;
    c.rope.factor = 8;
    c.rope.low_freq_factor = 1;
    c.rope.high_freq_factor = 4;
    c.rope.original_max = 8192;
  } else if (rope == "dynamic") {
    c.rope.type = RopeType::dynamic;
    c.rope.factor = 4;
    c.rope.max_position = 8192;
  } else if (rope != "plain") {
    *why = "--rope must be plain, llama3 or dynamic (got '" + rope + "')";
    return false;
  }
  *out = c;
  return true;
}

// --- Gemma 3 ----------------------------------------------------------------------------------

struct Gemma3Shape {
  int hidden = 2560, layers = 34, heads = 8, kv_heads = 4, head_dim = 256, ffn = 10240, vocab = 262208;
  int sliding_window = 1024;
  int pattern = 6;  // sliding_window_pattern: every pattern-th layer is global
  double rope_theta = 1e6, linear_factor = 8, local_theta = 1e4;
  double query_pre_attn_scalar = 256, rms_eps = 1e-6;
  int max_position = 131072;
  int bos = 2, eos = 1;
  // Whether layer l slides (transformers' Gemma3TextConfig: (l + 1) % pattern != 0).
  bool sliding(int l) const { return pattern <= 1 || (l + 1) % pattern != 0; }
};

// The config.json a transformers 5 export of the shape holds (Gemma3ForCausalLM, bf16), in the
// per-layer-type rope_parameters spelling with explicit layer_types.
inline nlohmann::json gemma3_hf_config(const Gemma3Shape& g) {
  nlohmann::json lt = nlohmann::json::array();
  for (int l = 0; l < g.layers; ++l) lt.push_back(g.sliding(l) ? "sliding_attention" : "full_attention");
  return {{"architectures", {"Gemma3ForCausalLM"}},
          {"model_type", "gemma3_text"},
          {"hidden_size", g.hidden},
          {"intermediate_size", g.ffn},
          {"num_hidden_layers", g.layers},
          {"num_attention_heads", g.heads},
          {"num_key_value_heads", g.kv_heads},
          {"head_dim", g.head_dim},
          {"vocab_size", g.vocab},
          {"max_position_embeddings", g.max_position},
          {"rms_norm_eps", g.rms_eps},
          {"hidden_activation", "gelu_pytorch_tanh"},
          {"query_pre_attn_scalar", g.query_pre_attn_scalar},
          {"sliding_window", g.sliding_window},
          {"_sliding_window_pattern", g.pattern},
          {"layer_types", lt},
          {"rope_parameters",
           {{"full_attention", {{"rope_type", "linear"}, {"factor", g.linear_factor}, {"rope_theta", g.rope_theta}}},
            {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", g.local_theta}}}}},
          {"attn_logit_softcapping", nullptr},
          {"final_logit_softcapping", nullptr},
          {"attention_bias", false},
          {"use_bidirectional_attention", false},
          {"tie_word_embeddings", true},
          {"bos_token_id", g.bos},
          {"eos_token_id", g.eos},
          {"dtype", "bfloat16"}};
}

// The ModelConfig load_hf reads from gemma3_hf_config(g) with bf16 embeddings (the fields its
// Gemma branch sets: windows per layer_types, the local RoPE from rope_parameters.sliding_attention,
// QK-norm, sandwich norms, GeGLU, query_pre_attn_scalar^-0.5, sqrt(hidden) in bf16, tied).
inline ModelConfig gemma3_config(const Gemma3Shape& g) {
  ModelConfig c;
  c.arch = "gemma3";
  c.dim = g.hidden;
  c.hidden_dim = g.ffn;
  c.n_layers = g.layers;
  c.n_heads = g.heads;
  c.n_kv_heads = g.kv_heads;
  c.head_dim = g.head_dim;
  c.vocab_size = g.vocab;
  c.max_seq_len = g.max_position;
  c.rms_eps = static_cast<float>(g.rms_eps);
  c.rope_style = RopeStyle::half;
  c.rope_theta = static_cast<float>(g.rope_theta);
  c.rope.type = RopeType::linear;
  c.rope.factor = g.linear_factor;
  c.rope.max_position = g.max_position;
  c.rope_local.type = RopeType::plain;
  c.rope_local.theta = g.local_theta;
  c.rope_local.factor = 0;  // no `factor` field (unused by the plain RoPE)
  c.rope_local.max_position = g.max_position;
  c.has_rope_local = true;
  c.layer_window.assign(static_cast<std::size_t>(g.layers), 0);
  for (int l = 0; l < g.layers; ++l)
    if (g.sliding(l)) c.layer_window[static_cast<std::size_t>(l)] = g.sliding_window;
  c.qk_norm = true;
  c.tied_embeddings = true;
  c.ffn_act = FfnAct::gelu_tanh;
  c.post_norms = true;
  c.attn_scale = static_cast<float>(1.0 / std::sqrt(g.query_pre_attn_scalar));
  c.attn_softcap = 0;
  c.final_softcap = 0;
  c.embed_scale = bf16_to_f32(f32_to_bf16_rne(static_cast<float>(std::sqrt(static_cast<double>(g.hidden)))));
  c.bos_id = g.bos;
  c.eos_id = g.eos;
  return c;
}

// Sliding (windowed) and global layer counts of a config.
inline int sliding_layers(const ModelConfig& c) {
  int n = 0;
  for (int l = 0; l < c.n_layers; ++l) n += c.window(l) > 0 ? 1 : 0;
  return n;
}

}  // namespace kvgate::bench
