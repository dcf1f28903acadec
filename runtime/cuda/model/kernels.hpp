// The small kernels of the CUDA forward (runtime/cuda/model/kernels.cu): everything that is not a
// GEMM (cuBLAS) or attention/store (kvgate::cuda ops). Each mirrors one step of
// runtime/src/forward_cpu.cpp; the file is compiled without FMA contraction and with IEEE
// division/sqrt so each elementwise step rounds as the CPU's (-ffp-contract=off) does.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvgate/kv_damage.hpp"

namespace kvgate::cuda::model_kernels {

// x[r][:] = emb[tokens[r]][:] (bf16 embeddings widened exactly to f32).
void embed(const void* emb, bool bf16, const int* d_tokens, float* x, int rows, int dim, cudaStream_t st);
// o[r] = w * (x[r] * (1 / sqrt(mean(x[r]^2) + eps)))   (o may alias x), one block per row.
void rmsnorm(float* o, const float* x, const float* w, int rows, int n, float eps, cudaStream_t st);
// y[r][i] += b[i]
void add_bias(float* y, const float* b, int rows, int n, cudaStream_t st);
// RoPE of rows [rows][n_heads][D] at table rows d_pos[r] + offset, angles from the host tables
// cos/sin [table row][D/2]; the first rotary_dim dims of each head turn (interleaved pairs
// (2i, 2i+1) or rotate-half pairs (i, i + rotary_dim/2)), the rest pass through.
void rope(float* v, const int* d_pos, int offset, int rows, int n_heads, int D, int rotary_dim, bool interleaved,
          const float* cos_tab, const float* sin_tab, cudaStream_t st);
// h = silu(h) * up, n elements.
void swiglu(float* h, const float* up, std::size_t n, cudaStream_t st);
// h = gelu_tanh(h) * up (Gemma's GeGLU), n elements.
void geglu(float* h, const float* up, std::size_t n, cudaStream_t st);
// x *= s (Gemma's embedding scale), n elements.
void scale(float* x, std::size_t n, float s, cudaStream_t st);
// x = tanh(x / cap) * cap (Gemma 2's final-logit soft-cap), n elements.
void softcap(float* x, std::size_t n, float cap, cudaStream_t st);
// x += y, n elements.
void add(float* x, const float* y, std::size_t n, cudaStream_t st);
// y = bf16(x) round-to-nearest-even, n elements.
void to_bf16(const float* x, void* y, std::size_t n, cudaStream_t st);
// out[r] = the lowest index of the largest value of row r (CPU kvgate::argmax), one block per row.
void argmax_rows(const float* x, int rows, int n, int* out, cudaStream_t st);
// p[i] = uniform(-a, a) with a = sqrt(3) * stddev (a function of (seed, i) only), f32 or bf16;
// stddev == 0 with `value`: every element = value.
void fill_uniform(void* p, bool bf16, std::size_t n, std::uint64_t seed, float stddev, cudaStream_t st);
void fill_const(float* p, std::size_t n, float value, cudaStream_t st);
// Mixture-of-experts router, one row per thread, as the CPU forward's route(): p = softmax(logits[r])
// (max subtracted), the top_k largest (ties: the lower expert index), divided by their sum when
// norm_topk; gate[r][e] = the weight of expert e for row r, 0 for the experts not selected.
void moe_route(const float* logits, float* gate, int rows, int n_experts, int top_k, bool norm_topk, cudaStream_t st);
// DeepSeek-V3's router (the CPU forward's route_groups), one row per thread: sigmoid scores, the
// correction bias for the choice, n_group / topk_group, top_k, norm, routed_scale; dense gate as above.
void moe_route_groups(const float* logits, const float* bias, float* gate, int rows, int n_experts, int top_k,
                      int n_group, int topk_group, bool norm_topk, float routed_scale, cudaStream_t st);
// MLA, expanded (the CPU forward's mla_attention): per row r (position d_pos[r]) and head h, turns
// q's rope part in place and writes the head's K row [k_nope | k_rope] and V row [v | 0] (width
// nope + rope) from kvb [rows][H][nope + v] and the shared k_rope (ckv[r][kv_lora ..], turned).
// cos/sin tables [position][half_stride]; interleave: de-interleaved pairs (2i, 2i+1).
void mla_assemble(float* q, const float* ckv, const float* kvb, float* k, float* v, const int* d_pos, int rows,
                  int n_heads, int nope, int rope, int vdim, int kv_lora, bool interleave, const float* cos_tab,
                  const float* sin_tab, int half_stride, cudaStream_t st);
// MLA over the latent cache (the CPU forward's latent branch and attention_mla.hpp), three steps:
//  mla_rope_latent: per row r (position d_pos[r]) turns each head's q rope part and the row's shared
//    key (ckv[r][kv_lora ..]) in place;
//  mla_absorb: qlat[r][h] = [W_UK_h^T q_nope[r][h] | q_rope[r][h]] ([rows][H][kv_lora + rope]) from
//    kv_b_proj [H * (nope + vdim)][kv_lora] (f32, or bf16 when `bf16`);
//  mla_up_v: out[r][h] = W_UV_h o_lat[r][h] ([rows][H][vdim]) from o_lat [rows][H][kv_lora].
void mla_rope_latent(float* q, float* ckv, const int* d_pos, int rows, int n_heads, int nope, int rope, int kv_lora,
                     bool interleave, const float* cos_tab, const float* sin_tab, int half_stride, cudaStream_t st);
void mla_absorb(const float* q, const void* wkv_b, bool bf16, float* qlat, int rows, int n_heads, int nope, int rope,
                int vdim, int kv_lora, cudaStream_t st);
void mla_up_v(const float* olat, const void* wkv_b, bool bf16, float* out, int rows, int n_heads, int nope, int vdim,
              int kv_lora, cudaStream_t st);
// acc[r][:] += y[r][:] * gate[r * n_experts + expert] for the rows that selected the expert.
void moe_accumulate(float* acc, const float* y, const float* gate, int expert, int n_experts, int rows, int dim,
                    cudaStream_t st);

// Injected KV damage (kvgate/kv_damage.hpp) on the rows one forward call just stored in a float
// half (f32, f16 or bf16) of layer `layer`: rows r of [0, rows) at positions d_pos[r], store slots
// d_slot[r] (block * block_size + slot), consecutive positions of one sequence. The noise families
// read each stored row, take amax per cell from it, add the noise (damage_noisy) and store the result
// rounded to the half (RNE); v_repeat copies the stored bits of the undamaged previous row of the page
// (row r - 1 of this call, or `prev`, the undamaged last row of the previous call) and keeps the
// undamaged last row of this call in `prev` for the next.
struct KvDamageLaunch {
  KvDamage damage;
  int layer = 0;
  int format = 0;  // 0: f32, 1: f16, 2: bf16
  std::uint8_t* pool = nullptr;  // page p at pool + p * page_stride
  std::size_t page_stride = 0;
  int block_size = 0, n_kv_heads = 0, head_dim = 0;
  const int* d_pos = nullptr;
  const int* d_slot = nullptr;
  int rows = 0;
  void* prev = nullptr;  // v_repeat: [n_kv_heads * head_dim] stored elements
};
void kv_damage(const KvDamageLaunch& a, cudaStream_t st);

}  // namespace kvgate::cuda::model_kernels
