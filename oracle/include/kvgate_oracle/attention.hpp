// Scaled dot-product attention over dequantized K/V (GQA, causal, optional sliding window and
// logit soft-capping), FP32 and FP64.
#pragma once

namespace kvgate_oracle {

struct AttnShape {
    int n_q;           // query tokens
    int n_q_heads;     // query heads (a multiple of n_kv_heads)
    int n_kv;          // key/value tokens present (absolute positions 0..n_kv-1)
    int n_kv_heads;    // kv heads
    int head_dim;      // D
    int q_pos0;        // absolute position of query 0; query i attends keys 0..q_pos0+i
    float softmax_scale;  // <= 0: 1/sqrt(D)
    int window = 0;       // > 0: sliding window — key t is visible to the query at absolute position p
                          // iff t <= p and p - t < window (transformers: kv_idx > q_idx - window)
    float softcap = 0;    // > 0: logit soft-capping, s -> cap * tanh(s / cap) (after the scale)
};

// q[n_q][n_q_heads][D], k,v[n_kv][n_kv_heads][D] -> out[n_q][n_q_heads][D].
// Query head j reads kv head j / (n_q_heads / n_kv_heads). A query with no visible key gets 0.
// sdpa_f32: binary32 throughout (max-subtracted softmax). sdpa_f64: inputs widened, binary64.
void sdpa_f32(const AttnShape& a, const float* q, const float* k, const float* v, float* out);
void sdpa_f64(const AttnShape& a, const float* q, const float* k, const float* v, double* out);

// Multi-head latent attention (DeepSeek-V2/V3) in its textbook, non-absorbed form (transformers'
// DeepseekV3Attention): per key t the latent c_t [kv_lora] and the shared RoPE key r_t [rope]; per head
// h, kv_b_proj's rows [h (nope + v_dim), h (nope + v_dim) + nope) are W_UK_h and the next v_dim rows
// W_UV_h; the head's key is [W_UK_h c_t | r_t] and its value W_UV_h c_t, expanded in binary64, then
// causal softmax attention. q[n_q][n_heads][nope + rope], latent[n_kv][kv_lora], rope_k[n_kv][rope],
// wkv_b[n_heads (nope + v_dim)][kv_lora] -> out[n_q][n_heads][v_dim]. Query i attends keys 0..q_pos0+i.
struct MlaShape {
    int n_q, n_heads, n_kv;
    int nope, rope, v_dim, kv_lora;
    int q_pos0;
    double softmax_scale;  // > 0
};
void mla_attention_f64(const MlaShape& a, const float* q, const float* latent, const float* rope_k, const float* wkv_b,
                       double* out);

}  // namespace kvgate_oracle
