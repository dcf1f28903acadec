// A loaded decoder-only transformer: norms and biases in FP32; the weight matrices in FP32 or, from
// 16-bit safetensors, as the checkpoint stores them (kvgate/weight.hpp).
// Loaders (llama2.c, GGUF, Hugging Face) fill this; the forward pass reads it.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvgate/format.hpp"
#include "kvgate/rope.hpp"
#include "kvgate/weight.hpp"

namespace kvgate {

// Any problem with a model/tokenizer file: the message names the file, the field and the fix.
class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class RopeStyle : std::uint8_t {
  interleaved,  // rotates adjacent pairs (x[2i], x[2i+1]) -- llama2.c run.c, GGUF llama
  half          // rotate-half: pairs (x[i], x[i + d/2]) -- Hugging Face transformers
};

// Feed-forward activation of the gated MLP: act(x W1) * (x W3).
enum class FfnAct : std::uint8_t {
  silu,       // SwiGLU (Llama, Mistral, Qwen, Phi-3)
  gelu_tanh   // GeGLU with the tanh GELU (Gemma 2/3: hidden_activation = gelu_pytorch_tanh)
};

// Mixture-of-experts feed-forward (Qwen3-MoE, Mixtral; DeepSeek-V3 routing fields are read by the
// loader only where it supports them). A layer with layer_moe[l] != 0 replaces the dense gated MLP
// by: router logits r = W_router x; probabilities p = softmax(r) in f32; the top_k largest p (ties:
// the lower expert index first); when norm_topk, divided by their sum; out = sum over the selected
// experts, in increasing expert index, of p_e * W2_e (act(W1_e x) * (W3_e x)), then the residual add.
struct MoeConfig {
  int n_experts = 0;       // routed experts of an MoE layer (0: the model is dense)
  int top_k = 0;           // experts per token (num_experts_per_tok)
  int expert_dim = 0;      // intermediate width of one routed expert
  bool norm_topk = false;  // renormalise the top-k probabilities to sum 1 (Mixtral always; Qwen3-MoE norm_topk_prob)
  std::vector<std::uint8_t> layer_moe;  // per layer: 1 = MoE FFN, 0 = dense FFN (hidden_dim); empty: all dense
  // DeepSeek-V3 routing (sigmoid_groups): scores s = sigmoid(r) in f32; the choice adds the
  // per-expert correction bias (selection only); experts are split into n_group groups, each group
  // scored by the sum of its two best biased scores, the topk_group best groups kept (the others'
  // experts masked to 0), the top_k of the masked biased scores selected; weights = the unbiased s
  // of the selected, divided by (their sum + 1e-20) when norm_topk, times routed_scale.
  enum class Router : std::uint8_t { softmax_topk, sigmoid_groups } router = Router::softmax_topk;
  int n_group = 1, topk_group = 1;
  float routed_scale = 1.0f;
  // Shared expert (DeepSeek n_shared_experts): a dense gated MLP of width shared_dim run on every
  // token of an MoE layer and added to the routed sum; 0: none.
  int shared_dim = 0;
  bool is_moe(int layer) const {
    return n_experts > 0 && !layer_moe.empty() && layer_moe[static_cast<std::size_t>(layer)] != 0;
  }
  bool any() const {
    for (auto v : layer_moe)
      if (v) return n_experts > 0;
    return false;
  }
};

// Multi-head latent attention (DeepSeek-V2/V3). Per token: the latent c_kv = rmsnorm(W_kv_a x)[:kv_lora]
// and one shared RoPE key k_rope = W_kv_a x [kv_lora:] (rotated, interleaved pairs); per head
// [k_nope | v] = W_kv_b c_kv; q = W_q x (q_lora 0) or W_q_b rmsnorm(W_q_a x); query [q_nope | q_rope].
// The forward expands K = [k_nope | k_rope] and V (zero-padded to head_dim = nope + rope) per head
// into the KV store (EngineOptions::mla_cache expanded), or the store holds the latent and the RoPE key
// per token (mla_cache latent: KvLayout::mla_latent, attention_mla.hpp).
struct MlaConfig {
  int q_lora_rank = 0;   // 0: q_proj directly
  int kv_lora_rank = 0;  // 0: not an MLA model
  int nope_dim = 0;      // qk_nope_head_dim
  int rope_dim = 0;      // qk_rope_head_dim
  int v_dim = 0;         // v_head_dim
  bool rope_interleave = true;  // rope_interleave: rotate pairs (2i, 2i+1) (else rotate-half pairs)
  bool any() const { return kv_lora_rank > 0; }
};

struct ModelConfig {
  std::string arch = "llama";  // llama | mistral | qwen2 | qwen3
  int dim = 0;                 // model width
  int hidden_dim = 0;          // FFN width
  int n_layers = 0;
  int n_heads = 0;             // query heads
  int n_kv_heads = 0;          // KV heads (GQA)
  int head_dim = 0;            // usually dim / n_heads; Qwen3 may differ
  int vocab_size = 0;
  int max_seq_len = 0;
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeStyle rope_style = RopeStyle::interleaved;
  RopeConfig rope;              // RoPE variant (rope.hpp): plain unless the checkpoint declares one
  RopeConfig rope_local;        // the sliding-window layers' RoPE (Gemma 3), when has_rope_local
  bool has_rope_local = false;
  bool qkv_bias = false;       // qwen2
  bool qk_norm = false;        // qwen3: RMSNorm over each head of q and k before RoPE
  bool tied_embeddings = true;
  int bos_id = 1;
  int eos_id = 2;
  // KV format the checkpoint declares (config.json quantization_config.kv_cache_quant_algo or
  // hf_quant_config.json); empty when it declares none. The fp8 scales when it ships them:
  // [n_layers] (scalar tensors) or [n_layers * n_kv_heads] (a layer with a [n_kv_heads] tensor).
  std::string declared_kv;
  std::string declared_kv_source;  // which file/field declared it
  std::vector<float> k_scale, v_scale;
  // Per-layer attention windows and the Gemma 2/3 architecture switches.
  std::vector<int> layer_window;   // per layer: 0 = full attention, w > 0 = a query at position i sees keys
                                   // i-w+1 .. i (transformers' sliding mask); empty = every layer full
  FfnAct ffn_act = FfnAct::silu;
  bool post_norms = false;         // Gemma: RMSNorm of the attention and FFN outputs before the residual add
                                   // (LayerWeights::post_attn_norm / post_ffn_norm)
  float embed_scale = 0.0f;        // > 0: embeddings multiplied by it (Gemma: sqrt(hidden) in the weights' dtype)
  float attn_scale = 0.0f;         // > 0: softmax scale (Gemma: query_pre_attn_scalar^-0.5); 0: 1/sqrt(head_dim)
  float attn_softcap = 0.0f;       // > 0: scores s -> tanh(s / cap) * cap before the mask (Gemma 2)
  float final_softcap = 0.0f;      // > 0: logits z -> tanh(z / cap) * cap (Gemma 2)
  MoeConfig moe;                   // mixture-of-experts FFN layers (n_experts == 0: dense model)
  MlaConfig mla;                   // latent attention (DeepSeek); then head_dim = nope + rope, n_kv_heads = n_heads
  int window(int layer) const {
    return layer_window.empty() ? 0 : layer_window[static_cast<std::size_t>(layer)];
  }
  int kv_dim() const { return n_kv_heads * head_dim; }
  // Width of the attention output that o_proj reads (MLA: heads * v_head_dim).
  int attn_out_dim() const { return mla.any() ? n_heads * mla.v_dim : q_dim(); }
  int q_dim() const { return n_heads * head_dim; }
};

struct LayerWeights {
  std::vector<float> attn_norm;  // [dim]
  Weight wq;         // [q_dim][dim]   row-major [out][in]
  Weight wk;         // [kv_dim][dim]
  Weight wv;         // [kv_dim][dim]
  Weight wo;         // [dim][q_dim]
  std::vector<float> bq, bk, bv; // [q_dim], [kv_dim], [kv_dim] (qwen2 only; else empty)
  std::vector<float> q_norm, k_norm;  // [head_dim] (qwen3 only; else empty)
  std::vector<float> ffn_norm;   // [dim]
  Weight w1;         // [hidden][dim]  gate
  Weight w2;         // [dim][hidden]  down
  Weight w3;         // [hidden][dim]  up
  // Gemma (ModelConfig::post_norms): norms of the attention output and of the FFN output. Every
  // Gemma norm weight is stored as (1 + w) in f32 (the loader adds the 1), like the others.
  std::vector<float> post_attn_norm, post_ffn_norm;  // [dim]
  // MoE layers (ModelConfig::moe.is_moe): w1/w2/w3 are empty; the router and every routed expert's
  // matrices, experts stacked along the first axis (expert e's [expert_dim][dim] block at
  // e * expert_dim * dim), each loaded once from the checkpoint (per-expert or fused tensors).
  std::vector<float> router;  // [n_experts][dim]
  Weight ew1;     // [n_experts][expert_dim][dim]  gate
  Weight ew2;     // [n_experts][dim][expert_dim]  down
  Weight ew3;     // [n_experts][expert_dim][dim]  up
  std::vector<float> router_bias;  // [n_experts] DeepSeek e_score_correction_bias (selection only); else empty
  Weight sw1, sw2, sw3;  // shared expert [shared_dim][dim], [dim][shared_dim], [shared_dim][dim]
  // MLA (ModelConfig::mla): wq is q_proj [H*(nope+rope)][dim] or q_b_proj [H*(nope+rope)][q_lora];
  // wk/wv are empty; wo is [dim][H*v_dim].
  std::vector<float> wq_a, q_a_norm;     // [q_lora][dim], [q_lora] (q_lora_rank > 0)
  std::vector<float> wkv_a, kv_a_norm;   // [kv_lora + rope][dim], [kv_lora]
  std::vector<float> wkv_b;              // [H*(nope + v)][kv_lora]
  // Every tensor of the layer once, as ModelWeights::for_each_tensor.
  template <class F>
  void for_each_tensor(F&& f) const {
    for (const Weight* t : {&wq, &wk, &wv, &wo, &w1, &w2, &w3, &ew1, &ew2, &ew3, &sw1, &sw2, &sw3}) f(*t, true);
    for (const std::vector<float>* t : {&router, &wq_a, &wkv_a, &wkv_b}) f(*t, true);
    for (const std::vector<float>* t : {&attn_norm, &bq, &bk, &bv, &q_norm, &k_norm, &ffn_norm, &post_attn_norm,
                                        &post_ffn_norm, &router_bias, &q_a_norm, &kv_a_norm})
      f(*t, false);
  }
};

struct ModelWeights {
  Weight tok_embeddings;  // [vocab][dim]
  std::vector<LayerWeights> layers;   // [n_layers]
  std::vector<float> final_norm;      // [dim]
  Weight classifier;      // [vocab][dim]; empty when tied to tok_embeddings
  WeightView output_matrix() const { return classifier.empty() ? tok_embeddings.view() : classifier.view(); }
  // Bytes the weights hold in memory the model owns, and in mapped checkpoint files.
  std::size_t owned_bytes() const;
  std::size_t mapped_bytes() const;
  // Every tensor once: f(const Weight&, bool matrix) or f(const std::vector<float>&, bool matrix);
  // `matrix`: a weight matrix (what a backend may hold at a narrower width), else a norm / bias /
  // bias-like vector (always FP32). The one list behind the byte counts above and the CUDA upload's.
  template <class F>
  void for_each_tensor(F&& f) const {
    f(tok_embeddings, true);
    f(classifier, true);
    f(final_norm, false);
    for (const LayerWeights& L : layers) L.for_each_tensor(f);
  }
};

// The special tokens a tokenizer puts around a text (its BOS/EOS rule), as the tokenizer's own files
// define it: tokenizer.json post_processor, tokenizer_config.json add_bos_token/add_eos_token, GGUF
// tokenizer.ggml.add_bos_token/add_eos_token, llama2.c (always BOS). Never config.json's bos_token_id.
struct SpecialsRule {
  std::vector<int> prefix;  // e.g. {bos}
  std::vector<int> suffix;  // e.g. {eos}
  std::string source;       // where the rule came from, for messages
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // add_special: put the tokenizer's special tokens around the text (adds_bos()/adds_eos(), as
  // `tokenizers` encode(text, add_special_tokens=True)); false: the text's tokens only (e.g. a
  // continuation of a conversation).
  virtual std::vector<int> encode(const std::string& text, bool add_special) const = 0;
  // Piece for `token` following `prev` (prev < 0: the token starts the text). llama2.c's tokenizer
  // strips the leading space after BOS; tokenizer.json ones apply their decoder (Strip / Metaspace)
  // to the first token only, so the pieces concatenate to decode(ids).
  virtual std::string decode_piece(int prev, int token) const = 0;
  // A whole sequence; by default the pieces concatenated.
  virtual std::string decode(const std::vector<int>& ids) const {
    std::string s;
    int prev = -1;
    for (int id : ids) {
      s += decode_piece(prev, id);
      prev = id;
    }
    return s;
  }
  virtual int vocab_size() const = 0;
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  // Whether encode(text, true) starts with BOS / ends with EOS (the tokenizer's rule).
  virtual bool adds_bos() const = 0;
  virtual bool adds_eos() const = 0;
};

struct Model {
  std::string path;         // what was loaded
  std::string source_kind;  // "llama2c", "gguf", "hf"
  std::string fingerprint;  // hex hash of config + tensor contents (for KV files and reports)
  ModelConfig config;
  ModelWeights weights;
  std::unique_ptr<Tokenizer> tokenizer;  // may be null when no tokenizer was found
};

// What one token's KV cache rows hold for this model, for format-resolution output: the K/V heads
// the KV format is applied to. "kv_heads" for every non-MLA model; for MLA (DeepSeek) the expanded
// per-head rows (EngineOptions::mla_cache expanded).
std::string kv_cache_layout(const ModelConfig& c);
// The same for an MLA model run with the latent cache (EngineOptions::mla_cache latent): the K half
// holds c_kv, the V half the shared RoPE key, each in its half format.
std::string kv_cache_layout_latent(const ModelConfig& c, const KvFormat& f);

// Picks the loader from the path: a directory (Hugging Face), *.gguf, or a llama2.c .bin
// (tokenizer from `tokenizer_path`, or tok<vocab>.bin / tokenizer.bin beside it).
// `storage`: how 16-bit checkpoint weights are held (kvgate/weight.hpp; Hugging Face directories).
// A model whose weights need more memory than the machine has free is refused with both figures.
Model load_model(const std::string& path, const std::string& tokenizer_path = {},
                 WeightStorage storage = WeightStorage::as_stored);

}  // namespace kvgate
