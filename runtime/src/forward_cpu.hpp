// CPU forward pass (private to the runtime): llama2.c forward() generalised to a chunk of tokens,
// GQA over the paged KV store in any format, RoPE styles, qkv bias, QK-norm, SwiGLU / GeGLU,
// sliding windows, Gemma's sandwich norms and soft-caps.
#pragma once
#include <functional>
#include <vector>

#include "kvgate/kv_store.hpp"
#include "kvgate/model.hpp"
#include "thread_pool.hpp"

namespace kvgate::detail {

// out[t][i] (+)= dot(W[i], x[t]) (+ bias[i]) for t < T, i < n_out; W is [n_out][n_in] row-major,
// FP32 or 16-bit (each row converted exactly before the same dot products: bit for bit the FP32 result).
void matmul(ThreadPool& pool, float* out, const float* x, WeightView W, const float* bias, int T, int n_in,
            int n_out, bool accumulate);
inline void matmul(ThreadPool& pool, float* out, const float* x, const Weight& W, const float* bias, int T, int n_in,
                   int n_out, bool accumulate) {
  matmul(pool, out, x, W.view(), bias, T, n_in, n_out, accumulate);
}
inline void matmul(ThreadPool& pool, float* out, const float* x, const std::vector<float>& W, const float* bias, int T,
                   int n_in, int n_out, bool accumulate) {
  matmul(pool, out, x, WeightView::of_f32(W.data(), W.size()), bias, T, n_in, n_out, accumulate);
}
// o = w * x / sqrt(mean(x^2) + eps)  (o may alias x)
void rmsnorm(float* o, const float* x, const float* w, int n, float eps);

class CpuForward {
 public:
  CpuForward(const Model& model, int max_chunk, ThreadPool& pool);

  // Runs tokens[0..T) (T <= max_chunk) at positions store.length(s)... through every layer: extends
  // the sequence by T, writes K/V rows of every layer into the store, attends over it. Writes the
  // logits of the last token to `logits` ([vocab]), or of every token ([T][vocab]) when all_logits.
  void forward(PagedKvStore& store, SeqId s, const int* tokens, int T, float* logits, bool all_logits);

  // The same pass in pieces, for a pipeline split (the engine's stages, each with its own
  // CpuForward and store): check_chunk; embed (the first stage) or receive (the activations the
  // previous stage handed over); run_layers over the stage's layers; head (the last stage).
  // forward() is check_chunk, extend, embed, run_layers(all layers), head.
  void check_chunk(const int* tokens, int T) const;
  void embed(const int* tokens, int T, int pos0);
  void receive(const float* x, int T, int pos0);
  // Model layers [l0, l1) over the chunk at pos0; layer l's K/V rows are layer l - l0 of `store`.
  void run_layers(PagedKvStore& store, SeqId s, int l0, int l1, int T, int pos0);
  void head(int T, float* logits, bool all_logits);
  // The residual stream of the chunk, [T][dim]: what a stage hands to the next.
  const float* activations() const { return x_.data(); }

  // The two blocks of a dense (non-MLA, non-MoE) layer, as run_layers runs them and as a tensor-
  // parallel rank runs them on its slice of the heads and FFN width (tensor_parallel.hpp): each
  // leaves its output y = [T][dim] in block_output(); add_block then adds it to the residual
  // stream (x += y, or x += rmsnorm_post(y) with post_norm). A rank's y is its partial sum, which
  // the all-reduce replaces by the sum over ranks before add_block.
  //   attention_block: xb = rmsnorm(x); q, k, v; K/V rows into layer `sl` of `store`; attention;
  //                    y = att Wo.
  //   ffn_block:       xb = rmsnorm(x); y = W2 (act(xb W1) * (xb W3)).
  void attention_block(PagedKvStore& store, SeqId s, int l, int sl, int T, int pos0);
  void ffn_block(int l, int T);
  void add_block(const float* post_norm, int T);
  float* block_output() { return xb2_.data(); }
  const float* attention_rows() const { return att_.data(); }  // [T][q_dim]: the heads' outputs
  const float* ffn_hidden() const { return hb_.data(); }       // [T][hidden]: act(xb W1) * (xb W3)
  // Overwrites the residual stream [T][dim] (a rank's replica; the chunk's RoPE angles stay).
  void set_residual(const float* x, int T);
  // Throws EngineError naming layer l when the residual stream holds NaN/inf.
  void check_finite(int l, int T, int pos0) const;

  int max_chunk() const { return max_chunk_; }
  // Width the RoPE turns: head_dim, or MLA's qk_rope_head_dim.
  int rope_width() const { return c_.mla.any() ? c_.mla.rope_dim : c_.head_dim; }

 private:
  // Rotates the first rotary_dim dims of every head with the chunk's angles (cos_/sin_, or the
  // sliding layers' cos_l_/sin_l_ when `local`).
  void rope(float* v, int T, int n_heads, bool local) const;
  // cos/sin of the chunk's positions pos0..pos0+T-1 for `r` into cs/sn [T][half].
  void rope_angles(const RopeConfig& r, std::vector<float>& freq, float& scaling, int pos0, int T, float* cs,
                   float* sn) const;
  // Attention of model layer `layer`, whose K/V rows are layer `store_layer` of the store.
  void attend(const PagedKvStore& store, SeqId s, int layer, int store_layer, int T, int pos0);
  // Splits a chunk's T queries into parts of about equal attention work (queries [i0, i0 + n) over
  // the keys they see, capped at `window`) run on the pool; one part (run(0, T)) when serial.
  void for_query_parts(int T, int pos0, int window, bool serial, const std::function<void(int, int)>& run);
  // RoPE angles of the chunk's positions, shared by every layer (and the sliding layers' own).
  void prepare_chunk(int pos0, int T);
  void add_normed(const float* norm_w, int T);
  // Mixture-of-experts FFN of layer L over the chunk: xb_ (normed) -> moe_ (the weighted expert sum).
  void moe_ffn(const LayerWeights& L, int T);
  // Routing of one token: probabilities p[E] (softmax of the router logits) -> the selected experts
  // (descending probability, ties to the lower index) and their weights.
  void route(const float* logits, int* sel, float* weight) const;
  // DeepSeek-V3's router (MoeConfig::Router::sigmoid_groups) for one token.
  void route_groups(const float* logits, const float* bias, int* sel, float* weight) const;
  // Latent attention (MLA) of layer l: projections, RoPE on the rope parts, then by the store's
  // layout either the expanded K/V rows into the store and attention(), or (mla_latent) the latent and
  // the RoPE key into the store and mla_latent_attention (absorbed); x += o_proj(heads' v outputs).
  void mla_attention(PagedKvStore& store, SeqId s, const LayerWeights& L, int l, int store_layer, int T, int pos0);

  const Model& m_;
  const ModelConfig& c_;
  int max_chunk_;
  ThreadPool& pool_;
  std::vector<float> freq_;  // [rotary_dim/2] inverse frequencies (re-made per chunk when length dependent)
  std::vector<float> freq_l_;  // the sliding layers' (Gemma 3 local RoPE), when the model has one
  float rope_scale_ = 1.0f, rope_scale_l_ = 1.0f;  // attention scaling on cos/sin (yarn, longrope)
  int rot_ = 0, rot_l_ = 0;  // rotated dims per head
  std::vector<float> x_, xb_, xb2_, q_, k_, v_, att_, hb_, hb2_, cos_, sin_, cos_l_, sin_l_;
  // MoE scratch: router logits [C][E], selections [C][top_k], gathered rows and their expert output.
  std::vector<float> rl_, rw_, xg_, hg_, hg2_, yg_, moe_;
  std::vector<int> rsel_, grow_;
  std::vector<float> qa_, ckv_, lat_, kvb_, attc_;  // MLA scratch
};

}  // namespace kvgate::detail
