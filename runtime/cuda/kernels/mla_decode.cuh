// Latent attention (MLA, weight-absorbed) over the paged quantized latent cache (ops.hpp
// MlaDecodeArgs; the math of attention_mla.hpp), split-K like the decode kernels.
//
// One CTA = (16-query-head chunk, split of the row's keys, query row). Every head of DeepSeek's MLA
// reads the same latent row per token (one "KV head" shared by all query heads), so a CTA stages a
// tile of 16 tokens once -- latent c [16][kv_lora] and RoPE key r [16][rope], dequantized to FP32 in
// shared memory -- and its 8 warps each serve 2 query heads over it. A warp keeps its heads' queries
// and their o_lat accumulators in registers, lanes striding the latent's dims (lane j holds dims
// j, j + 32, ...: conflict-free shared reads); scores are warp sums in FP32, the softmax is online in
// base 2 with one rescale per tile, and P.c accumulates in FP32 on the CUDA cores. A second kernel
// merges the splits and applies the latent's tensor scale (folded out of the loop, as decode's V).
//
// Scales: the latent's tensor scale s_c multiplies q_lat's score terms (the query multiplier, as
// decode's K scale) and the output; the RoPE key's s_r multiplies q_rope's score terms. Block
// scales (q8_0, q4_0, MX, NVFP4's E4M3, the per-tile binary32 scale of fp8_block128, the int8 and
// per-(token, head) cell scales) are applied per element by load_elem (decode.cuh) as it dequantizes.
#pragma once
#include "decode.cuh"

namespace kvgate::cuda::detail {

inline constexpr int kMlaWarps = 8;
inline constexpr int kMlaHeadsPerWarp = 2;
inline constexpr int kMlaHeadsPerCta = kMlaWarps * kMlaHeadsPerWarp;  // 16
inline constexpr int kMlaTile = 16;                                   // tokens per shared-memory tile
inline constexpr int kMlaMaxLatent = 512;                             // kv_lora_rank (DeepSeek-V2/V3: 512)
inline constexpr int kMlaMaxRope = 64;                                // qk_rope_head_dim (64)
inline constexpr int kMlaLatPerLane = kMlaMaxLatent / 32;
inline constexpr int kMlaRopePerLane = kMlaMaxRope / 32;

struct MlaLaunch {
  const std::uint8_t* k_pool = nullptr;  // latent pages
  const std::uint8_t* v_pool = nullptr;  // RoPE-key pages
  std::size_t k_page_stride = 0, v_page_stride = 0;
  const int* block_tables = nullptr;  // [rows][table_stride]
  int table_stride = 0;
  const int* seq_lens = nullptr;  // [rows]
  const float* q = nullptr;       // [rows][n_heads][kv_lora + rope]
  float* part_o = nullptr;        // [rows][splits][n_heads][kv_lora]
  float* part_ml = nullptr;       // [rows][splits][n_heads][2]
  float* out = nullptr;           // [rows][n_heads][kv_lora]
  int rows = 0, n_heads = 0, kv_lora = 0, rope = 0, block_size = 0;
  int n_hchunks = 1, splits = 1, tokens_per_split = 0;
  HF rope_format = HF::bf16;
  float q_mul_lat = 1.0f;   // softmax_scale * log2(e) * s_c
  float q_mul_rope = 1.0f;  // softmax_scale * log2(e) * s_r
  float out_mul = 1.0f;     // s_c
  // Bytes-moved accounting (MlaDecodeArgs::bytes_read): null, the default, leaves it off; else each CTA
  // adds, once after its loop, the tokens it staged times token_bytes (latent + RoPE key bytes of one
  // token as the formats lay out a page).
  unsigned long long* bytes_read = nullptr;
  unsigned token_bytes = 0;
};

inline int mla_smem_bytes(int kv_lora, int rope) { return kMlaTile * (kv_lora + rope) * 4; }

#ifdef __CUDACC__
// Staging of one tile: thread (t, j) of the CTA's 16 x 16 reads token t's elements j, j + 16, ...
// (one page lookup per thread; all of a thread's loads issued before any is stored, so a tile costs
// about one DRAM round trip, not one per element).
inline constexpr int kMlaThreadsPerToken = kMlaWarps * 32 / kMlaTile;  // 16
inline constexpr int kMlaLatPerThread = kMlaMaxLatent / kMlaThreadsPerToken;
inline constexpr int kMlaRopePerThread = kMlaMaxRope / kMlaThreadsPerToken;

template <HF F, int N>
__device__ __forceinline__ void mla_load_row(const std::uint8_t* page, int B, int W, int slot, int j, float (&v)[N],
                                             int k0 = 0) {
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const int i = j + kMlaThreadsPerToken * (k0 + k);
    float sc = 1.0f;
    v[k] = i < W ? load_elem<F>(page, B, 1, W, slot, 0, i, sc) * sc : 0.0f;
  }
}

// Dequantizes tokens [t0, t0 + n) of the row's table into c_s [kMlaTile][KL] and r_s [kMlaTile][R];
// the RoPE key's format is a runtime switch (one unrolled load loop per case).
template <HF KF>
__device__ __forceinline__ void mla_stage_tile(const MlaLaunch& a, const int* table, int t0, int n, float* c_s,
                                               float* r_s) {
  const int B = a.block_size, KL = a.kv_lora, R = a.rope;
  const int t = threadIdx.x / kMlaThreadsPerToken, j = threadIdx.x % kMlaThreadsPerToken;
  if (t >= n) return;
  const int pos = t0 + t;
  const int page = __ldg(table + pos / B), slot = pos % B;
  // The latent in two halves of 16 loads (all 32 at once spill beside the compute loop's registers).
  const std::uint8_t* kp = a.k_pool + static_cast<std::size_t>(page) * a.k_page_stride;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    constexpr int N = kMlaLatPerThread / 2;
    float c[N];
    mla_load_row<KF>(kp, B, KL, slot, j, c, h * N);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int i = j + kMlaThreadsPerToken * (h * N + k);
      if (i < KL) c_s[t * KL + i] = c[k];
    }
  }
  float r[kMlaRopePerThread];
  const std::uint8_t* vp = a.v_pool + static_cast<std::size_t>(page) * a.v_page_stride;
  switch (a.rope_format) {
#define KVGATE_MLA_ROPE_ROW(A, name, prefill_mma) \
  case HF::name:                                  \
    mla_load_row<HF::name>(vp, B, R, slot, j, r); \
    break;
    KVGATE_HALF_FORMATS(KVGATE_MLA_ROPE_ROW, _)
#undef KVGATE_MLA_ROPE_ROW
  }
#pragma unroll
  for (int k = 0; k < kMlaRopePerThread; ++k) {
    const int i = j + kMlaThreadsPerToken * k;
    if (i < R) r_s[t * R + i] = r[k];
  }
}

template <HF KF>
__global__ void __launch_bounds__(kMlaWarps * 32, 2) mla_decode_kernel(MlaLaunch a) {
  extern __shared__ __align__(16) float mla_smem[];
  const int KL = a.kv_lora, R = a.rope, H = a.n_heads, QD = KL + R;
  float* c_s = mla_smem;
  float* r_s = mla_smem + kMlaTile * KL;
  const int hc = blockIdx.x, split = blockIdx.y, row = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seq_len = a.seq_lens[row];
  const int t_begin = split * a.tokens_per_split;
  const int t_end = min(t_begin + a.tokens_per_split, seq_len);
  const int* table = a.block_tables + static_cast<std::size_t>(row) * a.table_stride;
  const int h0 = hc * kMlaHeadsPerCta + warp * kMlaHeadsPerWarp;

  // The warp's queries in registers, times their multipliers (0 for a head past n_heads).
  float ql[kMlaHeadsPerWarp][kMlaLatPerLane], qr[kMlaHeadsPerWarp][kMlaRopePerLane];
#pragma unroll
  for (int g = 0; g < kMlaHeadsPerWarp; ++g) {
    const int h = h0 + g;
    const float* qp = a.q + (static_cast<std::size_t>(row) * H + min(h, H - 1)) * QD;
#pragma unroll
    for (int k = 0; k < kMlaLatPerLane; ++k) {
      const int i = lane + 32 * k;
      ql[g][k] = (h < H && i < KL) ? qp[i] * a.q_mul_lat : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kMlaRopePerLane; ++k) {
      const int i = lane + 32 * k;
      qr[g][k] = (h < H && i < R) ? qp[KL + i] * a.q_mul_rope : 0.0f;
    }
  }
  float acc[kMlaHeadsPerWarp][kMlaLatPerLane];
  float m[kMlaHeadsPerWarp], l[kMlaHeadsPerWarp];
#pragma unroll
  for (int g = 0; g < kMlaHeadsPerWarp; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int k = 0; k < kMlaLatPerLane; ++k) acc[g][k] = 0.0f;
  }

  int t0 = t_begin;  // after the loop: one tile past the last one staged (bytes_read)
  for (; t0 < t_end; t0 += kMlaTile) {
    const int n = min(kMlaTile, t_end - t0);
    __syncthreads();  // every warp is done with the previous tile
    mla_stage_tile<KF>(a, table, t0, n, c_s, r_s);
    __syncthreads();
    // Scores of the tile: s[g][t] = q_lat . c_t + q_rope . r_t (base-2 units), warp sums.
    float s[kMlaHeadsPerWarp][kMlaTile];
#pragma unroll
    for (int t = 0; t < kMlaTile; ++t) {
      float p0 = 0.0f, p1 = 0.0f;
      if (t < n) {
#pragma unroll
        for (int k = 0; k < kMlaLatPerLane; ++k) {
          const int i = lane + 32 * k;
          if (i < KL) {
            const float x = c_s[t * KL + i];
            p0 = fmaf(ql[0][k], x, p0);
            p1 = fmaf(ql[1][k], x, p1);
          }
        }
#pragma unroll
        for (int k = 0; k < kMlaRopePerLane; ++k) {
          const int i = lane + 32 * k;
          if (i < R) {
            const float x = r_s[t * R + i];
            p0 = fmaf(qr[0][k], x, p0);
            p1 = fmaf(qr[1][k], x, p1);
          }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          p0 += __shfl_xor_sync(0xffffffffu, p0, off);
          p1 += __shfl_xor_sync(0xffffffffu, p1, off);
        }
      }
      s[0][t] = t < n ? p0 : -INFINITY;
      s[1][t] = t < n ? p1 : -INFINITY;
    }
    // Online softmax: one rescale per tile, then P.c.
#pragma unroll
    for (int g = 0; g < kMlaHeadsPerWarp; ++g) {
      float mx = m[g];
#pragma unroll
      for (int t = 0; t < kMlaTile; ++t) mx = fmaxf(mx, s[g][t]);
      if (mx > m[g]) {
        const float corr = safe_exp2_diff(m[g], mx);
        l[g] *= corr;
#pragma unroll
        for (int k = 0; k < kMlaLatPerLane; ++k) acc[g][k] *= corr;
        m[g] = mx;
      }
#pragma unroll
      for (int t = 0; t < kMlaTile; ++t) {
        const float p = (t < n && m[g] != -INFINITY) ? exp2f(s[g][t] - m[g]) : 0.0f;
        s[g][t] = p;
        l[g] += p;
      }
    }
#pragma unroll
    for (int t = 0; t < kMlaTile; ++t) {
      if (t < n) {
#pragma unroll
        for (int k = 0; k < kMlaLatPerLane; ++k) {
          const int i = lane + 32 * k;
          if (i < KL) {
            const float x = c_s[t * KL + i];
            acc[0][k] = fmaf(s[0][t], x, acc[0][k]);
            acc[1][k] = fmaf(s[1][t], x, acc[1][k]);
          }
        }
      }
    }
  }
  // Bytes-moved accounting: the tokens of the tiles the loop staged (the last tile's n of them).
  if (a.bytes_read != nullptr && threadIdx.x == 0 && t0 > t_begin)
    atomicAdd(a.bytes_read, static_cast<unsigned long long>(min(t0, t_end) - t_begin) * a.token_bytes);
  // Partials of the split (a split past the row's keys leaves m = -inf, l = 0, o = 0).
#pragma unroll
  for (int g = 0; g < kMlaHeadsPerWarp; ++g) {
    const int h = h0 + g;
    if (h >= H) continue;
    const std::size_t slot = (static_cast<std::size_t>(row) * a.splits + split) * H + h;
#pragma unroll
    for (int k = 0; k < kMlaLatPerLane; ++k) {
      const int i = lane + 32 * k;
      if (i < KL) a.part_o[slot * KL + i] = acc[g][k];
    }
    if (lane == 0) {
      a.part_ml[slot * 2] = m[g];
      a.part_ml[slot * 2 + 1] = l[g];
    }
  }
}

// Merge of the splits: grid (n_heads, rows), o_lat = s_c * sum_s w_s o_s / sum_s w_s l_s with
// w_s = 2^(m_s - max m); splits in index order (a fixed association).
__global__ void __launch_bounds__(128) mla_combine_kernel(MlaLaunch a) {
  const int h = blockIdx.x, row = blockIdx.y, H = a.n_heads, KL = a.kv_lora;
  const std::size_t base = static_cast<std::size_t>(row) * a.splits * H + h;
  float M = -INFINITY;
  for (int s = 0; s < a.splits; ++s) M = fmaxf(M, a.part_ml[(base + static_cast<std::size_t>(s) * H) * 2]);
  float L = 0.0f;
  for (int s = 0; s < a.splits; ++s) {
    const std::size_t k = (base + static_cast<std::size_t>(s) * H) * 2;
    const float ms = a.part_ml[k];
    L += ms == -INFINITY ? 0.0f : exp2f(ms - M) * a.part_ml[k + 1];
  }
  const float inv = a.out_mul / L;
  for (int i = threadIdx.x; i < KL; i += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < a.splits; ++s) {
      const std::size_t k = base + static_cast<std::size_t>(s) * H;
      const float ms = a.part_ml[k * 2];
      if (ms != -INFINITY) o = fmaf(exp2f(ms - M), a.part_o[k * KL + i], o);
    }
    a.out[(static_cast<std::size_t>(row) * H + h) * KL + i] = o * inv;
  }
}
#endif

}  // namespace kvgate::cuda::detail
