// Multi-head latent attention (DeepSeek-V2/V3) over the latent KV cache (KvLayout::mla_latent), in
// the weight-absorbed form: the cache holds per token the latent c (kv_lora_rank) in the store's K
// half and the shared RoPE key r (qk_rope_head_dim) in its V half, each in its own half format.
//
// Per query token and head h, with kv_b_proj = [W_UK_h (nope rows) ; W_UV_h (v_dim rows)] per head:
//   q_lat = W_UK_h^T q_nope                       (kv_lora)      absorb the key up-projection
//   s_j   = scale * (q_lat . c_j + q_rope . r_j)   for keys j <= pos0 + i (causal)
//   o_lat = sum_j softmax(s)_j c_j                 (kv_lora)      online softmax, FP32
//   out   = W_UV_h o_lat                           (v_dim)        the value up-projection
// which equals the textbook (expanded) attention with k_h = [W_UK_h c | r] and v_h = W_UV_h c by
// associativity; the oracle (kvgate_oracle/attention.hpp mla_attention_f64) computes that expanded
// form in FP64, and the ORA.mla gates compare the two over the store's own dequantized latent.
#pragma once
#include "kvgate/kv_store.hpp"

namespace kvgate {

struct MlaDims {
  int n_heads = 1;  // query heads
  int nope = 0;     // qk_nope_head_dim
  int rope = 0;     // qk_rope_head_dim (the store's V half width)
  int v_dim = 0;    // v_head_dim
  int kv_lora = 0;  // kv_lora_rank (the store's K half width)
};

struct MlaAttentionArgs {
  int n_q = 1;              // query tokens
  int pos0 = 0;             // absolute position of query 0; query i attends keys [0, pos0 + i]
  float softmax_scale = 0;  // must be > 0: the model's (qk_head_dim^-0.5, YaRN's mscale^2), never the latent width's
};

// q: [n_q][n_heads][nope + rope] (rope part already rotated); wkv_b: kv_b_proj,
// [n_heads * (nope + v_dim)][kv_lora] row-major; out: [n_q][n_heads][v_dim]. The store must be
// mla_latent with K rows of kv_lora and V rows of rope elements and hold pos0 + n_q tokens.
// Throws KvStoreError otherwise. Pages are dequantized once per call for every query and head
// (dequantize_rows, the read hook and read counter as attention()).
void mla_latent_attention(const PagedKvStore& store, SeqId s, int layer, const MlaDims& d, const MlaAttentionArgs& a,
                          const float* q, const float* wkv_b, float* out);

}  // namespace kvgate
