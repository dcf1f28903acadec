// CPU attention over the paged quantized store: causal GQA scaled-dot-product attention with an
// online softmax, FP32 accumulation, pages dequantized once per (layer, page) for all query heads.
#pragma once
#include "kvgate/kv_store.hpp"

namespace kvgate {

struct AttentionArgs {
  int n_q = 1;              // query tokens (1 = decode, >1 = prefill chunk)
  int n_heads = 1;          // query heads; n_heads % n_kv_heads == 0 (GQA)
  int pos0 = 0;             // absolute position of query 0; query i attends keys [0, pos0 + i]
  float softmax_scale = 0;  // <= 0 means 1/sqrt(head_dim)
  int window = 0;           // > 0: sliding window, query at position p sees keys p-window+1 .. p (keys j with
                            // p - j >= window are masked, as transformers' sliding mask); 0: full causal
  float softcap = 0;        // > 0: every score s (after the scale) becomes tanh(s / softcap) * softcap
};

// q: [n_q][n_heads][head_dim]; out: same shape. Keys/values come from `layer` of sequence `s`,
// which must hold at least pos0 + n_q tokens. With a window, only the pages holding keys some query
// can see are read.
void attention(const PagedKvStore& store, SeqId s, int layer, const AttentionArgs& a, const float* q, float* out);

// Dequantizes slots [0, n) of a page into out[n][n_kv_heads * head_dim]: the vectorized read path
// attention uses, bit-identical to dequantize_token (format.hpp) slot by slot (gated).
// head_scales: the (layer, half)'s scale of each KV head (n_kv_heads entries, PagedKvStore::head_scales);
// the overload with one tensor_scale gives every head that scale.
void dequantize_rows(HalfFormat f, const PageGeometry& g, int n, const std::uint8_t* page,
                     std::span<const float> head_scales, float* out);
void dequantize_rows(HalfFormat f, const PageGeometry& g, int n, const std::uint8_t* page, float tensor_scale,
                     float* out);

}  // namespace kvgate
