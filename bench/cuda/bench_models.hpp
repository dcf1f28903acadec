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
//   DeepSeek-V2-Lite (DeepseekV2ForCausalLM, deepseek-ai/DeepSeek-V2-Lite): 27 layers, hidden 2048,
//           16 heads, multi-head latent attention (kv_lora_rank 512, no q LoRA, qk_nope_head_dim 128,
//           qk_rope_head_dim 64, v_head_dim 128), first_k_dense_replace 1 (layer 0: dense FFN
//           10944), 26 MoE layers of 64 routed experts (moe_intermediate_size 1408, 6 per token) + 2
//           shared experts (one shared MLP of 2 x 1408 = 2816), softmax router, topk_method greedy
//           (n_group 1, topk_group 1), norm_topk_prob false, routed_scaling_factor 1.0, vocab 102400,
//           rms_norm_eps 1e-6, rope_theta 1e4 with YaRN (factor 40 over 4096, beta_fast 32,
//           beta_slow 1, mscale = mscale_all_dim = 0.707), max_position_embeddings 163840, untied,
//           bos 100000 / eos 100001; about 15.7 B parameters (31.4 GB as bf16).
//           The Hugging Face loader reads DeepseekV3ForCausalLM only (load_hf.cpp: no
//           DeepseekV2ForCausalLM, and its DeepSeek branch always builds V3's router), so the shape is
//           described by the config.json of a transformers DeepseekV3 export with the V2-Lite numbers
//           (deepseek_v2_lite_hf_config). The one difference from V2-Lite: the router scores are
//           sigmoid(logit) (V3, MoeConfig::Router::sigmoid_groups with n_group 1, topk_group 1 and a
//           zero e_score_correction_bias) where V2-Lite takes softmax(logits); both are monotonic in
//           the logits, so the 6 experts picked are the same, only their weights differ (norm_topk
//           false, scale 1). deepseek_v2_lite_hub_config is the V2 config.json as published, for the record.
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

// --- DeepSeek-V2-Lite ---------------------------------------------------------------------------

struct DeepseekV2LiteShape {
  int hidden = 2048, layers = 27, heads = 16;
  int kv_lora = 512, q_lora = 0 /* none */, nope = 128, rope = 64, v = 128;
  int first_dense = 1, ffn = 10944;  // first_k_dense_replace, intermediate_size (the dense layers' FFN)
  int moe_ffn = 1408, experts = 64, top_k = 6, shared = 2;  // moe_intermediate_size, n_routed_experts, ...
  int n_group = 1, topk_group = 1;
  bool norm_topk = false;
  double routed_scale = 1.0;
  int vocab = 102400, max_position = 163840;
  double rms_eps = 1e-6, rope_theta = 1e4;
  double yarn_factor = 40, beta_fast = 32, beta_slow = 1, mscale = 0.707, mscale_all_dim = 0.707;
  int original_max = 4096;
  int bos = 100000, eos = 100001;
};

// The config.json of deepseek-ai/DeepSeek-V2-Lite as published (DeepseekV2ForCausalLM, legacy
// rope_scaling spelling); for the record only: load_hf does not read this architecture.
inline nlohmann::json deepseek_v2_lite_hub_config(const DeepseekV2LiteShape& s) {
  return {{"architectures", {"DeepseekV2ForCausalLM"}},
          {"model_type", "deepseek_v2"},
          {"hidden_size", s.hidden},
          {"intermediate_size", s.ffn},
          {"moe_intermediate_size", s.moe_ffn},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.heads},
          {"kv_lora_rank", s.kv_lora},
          {"q_lora_rank", s.q_lora > 0 ? nlohmann::json(s.q_lora) : nlohmann::json(nullptr)},
          {"qk_nope_head_dim", s.nope},
          {"qk_rope_head_dim", s.rope},
          {"v_head_dim", s.v},
          {"first_k_dense_replace", s.first_dense},
          {"moe_layer_freq", 1},
          {"n_routed_experts", s.experts},
          {"num_experts_per_tok", s.top_k},
          {"n_shared_experts", s.shared},
          {"scoring_func", "softmax"},
          {"topk_method", "greedy"},
          {"n_group", s.n_group},
          {"topk_group", s.topk_group},
          {"norm_topk_prob", s.norm_topk},
          {"routed_scaling_factor", s.routed_scale},
          {"vocab_size", s.vocab},
          {"max_position_embeddings", s.max_position},
          {"rms_norm_eps", s.rms_eps},
          {"rope_theta", s.rope_theta},
          {"rope_scaling",
           {{"type", "yarn"}, {"factor", s.yarn_factor}, {"original_max_position_embeddings", s.original_max},
            {"beta_fast", s.beta_fast}, {"beta_slow", s.beta_slow}, {"mscale", s.mscale},
            {"mscale_all_dim", s.mscale_all_dim}}},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"tie_word_embeddings", false},
          {"bos_token_id", s.bos},
          {"eos_token_id", s.eos},
          {"torch_dtype", "bfloat16"}};
}

// The shape as the config.json of a transformers 5 DeepseekV3ForCausalLM export with the V2-Lite
// numbers (what load_hf reads: head_dim = qk_rope_head_dim, rope_parameters with YaRN,
// rope_interleave true; V3's router fields with one group, norm_topk_prob false, scale 1).
inline nlohmann::json deepseek_v2_lite_hf_config(const DeepseekV2LiteShape& s) {
  return {{"architectures", {"DeepseekV3ForCausalLM"}},
          {"model_type", "deepseek_v3"},
          {"hidden_size", s.hidden},
          {"intermediate_size", s.ffn},
          {"moe_intermediate_size", s.moe_ffn},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.heads},
          {"head_dim", s.rope},
          {"kv_lora_rank", s.kv_lora},
          {"q_lora_rank", s.q_lora > 0 ? nlohmann::json(s.q_lora) : nlohmann::json(nullptr)},
          {"qk_nope_head_dim", s.nope},
          {"qk_rope_head_dim", s.rope},
          {"qk_head_dim", s.nope + s.rope},
          {"v_head_dim", s.v},
          {"rope_interleave", true},
          {"first_k_dense_replace", s.first_dense},
          {"n_routed_experts", s.experts},
          {"num_experts_per_tok", s.top_k},
          {"n_shared_experts", s.shared},
          {"n_group", s.n_group},
          {"topk_group", s.topk_group},
          {"norm_topk_prob", s.norm_topk},
          {"routed_scaling_factor", s.routed_scale},
          {"vocab_size", s.vocab},
          {"max_position_embeddings", s.max_position},
          {"rms_norm_eps", s.rms_eps},
          {"rope_parameters",
           {{"rope_type", "yarn"}, {"rope_theta", s.rope_theta}, {"factor", s.yarn_factor},
            {"original_max_position_embeddings", s.original_max}, {"beta_fast", s.beta_fast},
            {"beta_slow", s.beta_slow}, {"mscale", s.mscale}, {"mscale_all_dim", s.mscale_all_dim}}},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"tie_word_embeddings", false},
          {"bos_token_id", s.bos},
          {"eos_token_id", s.eos},
          {"dtype", "bfloat16"}};
}

// The ModelConfig load_hf reads from deepseek_v2_lite_hf_config(s), field for field as its
// DeepSeek branch (read_hf_rope, then read_deepseek_config): head_dim = nope + rope with one KV head
// per query head (the expanded cache), the YaRN RoPE over the rope dims (interleaved pairs), the
// softmax scale qk_head_dim^-0.5 times mscale(factor, mscale_all_dim)^2, V3's router
// (sigmoid_groups), shared_dim = n_shared_experts x moe_intermediate_size, layers from
// first_k_dense_replace on MoE. load_hf has no DeepSeek-V2 reader (see the header comment).
inline ModelConfig deepseek_v2_lite_config(const DeepseekV2LiteShape& s) {
  ModelConfig c;
  c.arch = "deepseek_v3";
  c.dim = s.hidden;
  c.hidden_dim = s.ffn;
  c.n_layers = s.layers;
  c.n_heads = s.heads;
  c.n_kv_heads = s.heads;
  c.vocab_size = s.vocab;
  c.max_seq_len = s.max_position;
  c.rms_eps = static_cast<float>(s.rms_eps);
  c.rope_style = RopeStyle::half;  // Hugging Face checkpoints (MLA rotates by MlaConfig::rope_interleave)
  c.rope_theta = static_cast<float>(s.rope_theta);
  c.rope.type = RopeType::yarn;
  c.rope.theta = 0;  // the model's rope_theta
  c.rope.factor = s.yarn_factor;
  c.rope.original_max = s.original_max;
  c.rope.max_position = s.max_position;
  c.rope.beta_fast = s.beta_fast;
  c.rope.beta_slow = s.beta_slow;
  c.rope.mscale = s.mscale;
  c.rope.mscale_all_dim = s.mscale_all_dim;
  c.tied_embeddings = false;
  c.bos_id = s.bos;
  c.eos_id = s.eos;
  MlaConfig& a = c.mla;
  a.kv_lora_rank = s.kv_lora;
  a.q_lora_rank = s.q_lora;
  a.nope_dim = s.nope;
  a.rope_dim = s.rope;
  a.v_dim = s.v;
  a.rope_interleave = true;
  c.head_dim = s.nope + s.rope;
  double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  if (s.mscale_all_dim > 0 && s.yarn_factor > 0) {
    const double m = 0.1 * s.mscale_all_dim * std::log(s.yarn_factor) + 1.0;
    scale = scale * m * m;
  }
  c.attn_scale = static_cast<float>(scale);
  MoeConfig& m = c.moe;
  m.router = MoeConfig::Router::sigmoid_groups;
  m.n_experts = s.experts;
  m.top_k = s.top_k;
  m.expert_dim = s.moe_ffn;
  m.norm_topk = s.norm_topk;
  m.n_group = s.n_group;
  m.topk_group = s.topk_group;
  m.routed_scale = static_cast<float>(s.routed_scale);
  m.shared_dim = s.shared * s.moe_ffn;
  m.layer_moe.assign(static_cast<std::size_t>(s.layers), 0);
  for (int l = s.first_dense; l < s.layers; ++l) m.layer_moe[static_cast<std::size_t>(l)] = 1;
  return c;
}

// Device bytes of CudaModel::random(c, wt): the tensors it allocates (matrices at the weight type's
// width, gains and biases FP32), as it allocates them; for the memory check before generating.
inline std::size_t random_weight_bytes(const ModelConfig& c, bool bf16) {
  const std::size_t mb = bf16 ? 2 : 4, dim = c.dim, V = c.vocab_size;
  std::size_t mat = V * dim * (c.tied_embeddings ? 1 : 2), vec = dim;  // embeddings (+ classifier), final norm
  for (int l = 0; l < c.n_layers; ++l) {
    vec += 2 * dim;  // attn_norm, ffn_norm
    if (c.mla.any()) {
      const MlaConfig& a = c.mla;
      const std::size_t H = c.n_heads, QK = a.nope_dim + a.rope_dim, KL = a.kv_lora_rank, QL = a.q_lora_rank;
      mat += a.q_lora_rank > 0 ? QL * dim + H * QK * QL : H * QK * dim;
      vec += QL;
      mat += (KL + a.rope_dim) * dim + H * (a.nope_dim + a.v_dim) * KL + dim * H * a.v_dim;
      vec += KL;
    } else {
      mat += 2 * static_cast<std::size_t>(c.q_dim()) * dim + 2 * static_cast<std::size_t>(c.kv_dim()) * dim;
    }
    if (c.moe.is_moe(l)) {
      const std::size_t E = c.moe.n_experts, I = c.moe.expert_dim, S = c.moe.shared_dim;
      mat += E * dim + 3 * E * I * dim + 3 * S * dim;
      if (c.moe.router == MoeConfig::Router::sigmoid_groups) vec += E;
    } else {
      mat += 3 * static_cast<std::size_t>(c.hidden_dim) * dim;
    }
    if (c.qkv_bias) vec += static_cast<std::size_t>(c.q_dim()) + 2 * static_cast<std::size_t>(c.kv_dim());
    if (c.qk_norm) vec += 2 * static_cast<std::size_t>(c.head_dim);
    if (c.post_norms) vec += 2 * dim;
  }
  return mat * mb + vec * 4;
}

// Sliding (windowed) and global layer counts of a config.
inline int sliding_layers(const ModelConfig& c) {
  int n = 0;
  for (int l = 0; l < c.n_layers; ++l) n += c.window(l) > 0 ? 1 : 0;
  return n;
}

}  // namespace kvgate::bench
