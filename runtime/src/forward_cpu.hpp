// CPU forward pass (private to the runtime): llama2.c forward() generalised to a chunk of tokens,
// GQA over the paged KV store in any format, RoPE styles, qkv bias, QK-norm, SwiGLU / GeGLU,
// sliding windows, Gemma's sandwich norms and soft-caps.
#pragma once
#include <vector>

#include "kvgate/kv_store.hpp"
#include "kvgate/model.hpp"
#include "thread_pool.hpp"

namespace kvgate::detail {

// out[t][i] (+)= dot(W[i], x[t]) (+ bias[i]) for t < T, i < n_out; W is [n_out][n_in] row-major.
void matmul(ThreadPool& pool, float* out, const float* x, const float* W, const float* bias, int T, int n_in,
            int n_out, bool accumulate);
// o = w * x / sqrt(mean(x^2) + eps)  (o may alias x)
void rmsnorm(float* o, const float* x, const float* w, int n, float eps);

class CpuForward {
 public:
  CpuForward(const Model& model, int max_chunk, ThreadPool& pool);

  // Runs tokens[0..T) (T <= max_chunk) at positions store.length(s)... through every layer: extends
  // the sequence by T, writes K/V rows of every layer into the store, attends over it. Writes the
  // logits of the last token to `logits` ([vocab]), or of every token ([T][vocab]) when all_logits.
  void forward(PagedKvStore& store, SeqId s, const int* tokens, int T, float* logits, bool all_logits);

  int max_chunk() const { return max_chunk_; }

 private:
  void rope(float* v, int T, int n_heads, int pos0) const;
  void attend(const PagedKvStore& store, SeqId s, int layer, int T, int pos0);
  void add_normed(const float* norm_w, int T);

  const Model& m_;
  const ModelConfig& c_;
  int max_chunk_;
  ThreadPool& pool_;
  std::vector<float> freq_;  // [head_dim/2] inverse frequencies
  std::vector<float> x_, xb_, xb2_, q_, k_, v_, att_, hb_, hb2_, cos_, sin_;
};

}  // namespace kvgate::detail
