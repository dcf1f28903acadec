// Causal prefill attention over the paged quantized store (docs/CUDA.md "Prefill attention").
//
// One CTA = (tile of query rows, KV head, chunk of <= 8 query heads of its GQA group). A query row is
// one (query token, query head) pair; a CTA holds kPrefillRows = 64 of them: QT = 64 / GC tokens x GC
// heads of the same KV head, so every K/V tile is read and dequantized once for the whole GQA group.
// Per KV tile of kPrefillKvTile = 32 tokens:
//   1. K and V cells -> shared memory as FP32 (code x cell/block scale, which is exact in binary32:
//      an <= 8-bit code times an f16 scale has <= 19 significant bits) through the element accessor
//      load_elem of decode.cuh, so the bytes are read exactly as FORMATS.md defines them (32-blocks
//      spanning heads when D < 32 included);
//   2. S = Q K^T on the CUDA cores: each thread owns 4 rows x 2 keys, one sequential FP32 FMA chain of
//      length D per score (summation depth D, stated in the gate's bound);
//   3. causal mask (key t visible to query i iff t <= n_past + i), online softmax in base 2 (row max and
//      sum over the tile by butterflies across the 16 lanes of a row group), P -> shared memory;
//   4. O += P V: each thread owns 4 rows x ceil(D/16) dims, one sequential FMA per key (depth n_ctx).
// Tiles past the last key visible to the CTA's last query are never visited (causal skipping).
// Per-tensor scales: the fp8 K scale is folded into the query multiplier (with softmax_scale and
// log2 e), the fp8 V scale multiplies the output. q4_0_rot is handled like decode: H is symmetric and
// involutory, so the query is rotated once (q.(H y) = (H q).y) and the output once (sum p H y =
// H sum p y); K/V rows stay in the rotated domain in shared memory.
#pragma once
#include "decode.cuh"

namespace kvgate::cuda::detail {

inline constexpr int kPrefillRows = 64;     // query rows (token x head) per CTA
inline constexpr int kPrefillKvTile = 32;   // keys per tile
inline constexpr int kPrefillThreads = 256; // 16 row groups x 16 lanes
inline constexpr int kPrefillMaxHeadDim = 256;
inline constexpr int kPrefillMaxHeadsPerCta = 8;
inline constexpr int kPrefillDimsPerLane = kPrefillMaxHeadDim / 16;

struct PrefillLaunch {
  const std::uint8_t* k_pool = nullptr;
  const std::uint8_t* v_pool = nullptr;
  std::size_t k_page_stride = 0, v_page_stride = 0;
  const int* block_table = nullptr;
  const float* q = nullptr;  // [n_new][n_heads][D]
  float* out = nullptr;      // [n_new][n_heads][D]
  int n_heads = 0, n_kv_heads = 0, head_dim = 0, block_size = 0;
  int group = 1;        // query heads per KV head
  int heads_per_cta = 1, n_hchunks = 1, tokens_per_cta = 1;
  int n_past = 0, n_new = 0;
  float q_mul = 1.0f;  // softmax_scale * log2(e) * k_tensor_scale
  float v_mul = 1.0f;  // v tensor scale
  const float* k_heads = nullptr;  // per-KV-head K / V scales [n_kv_heads] (device): the CTA's KV head's
  const float* v_heads = nullptr;  // q_mul / v_mul (head_q_mul, head_v_mul); null: q_mul / v_mul
  float sm_scale = 0.0f;           // softmax_scale (what head_q_mul multiplies with a head's scale)
  float had_c = 1.0f;  // float(1/sqrt(double(D)))
  int window = 0;      // > 0: sliding window, query i sees keys n_past + i - window + 1 .. n_past + i
  float softcap2 = 0.0f;  // > 0: attention-logit soft-cap in base-2 score units (cap * log2(e)); decode.cuh softcap2
};

// Shared memory: Q/O [64][DP], K [32][DP], V [32][DP], P [64][33] floats; DP = D | 1 (odd row
// stride: the 16 keys a warp reads at one dim, and its row groups' query rows, fall in distinct banks).
KVGATE_HD constexpr int prefill_row_stride(int D) { return D | 1; }
KVGATE_HD constexpr int prefill_smem_bytes(int D) {
  return ((kPrefillRows + 2 * kPrefillKvTile) * prefill_row_stride(D) + kPrefillRows * (kPrefillKvTile + 1)) * 4;
}

// In-place Walsh-Hadamard transform of `rows` rows of length D (stride DP) in shared memory, times c.
__device__ inline void prefill_fwht_rows(float* x, int rows, int D, int DP, float c) {
  const int half = D / 2;
  for (int len = 1; len < D; len <<= 1) {
    for (int p = threadIdx.x; p < rows * half; p += blockDim.x) {
      const int r = p / half, k = p % half;
      const int i = (k / len) * 2 * len + (k % len);
      float* row = x + r * DP;
      const float a = row[i], b = row[i + len];
      row[i] = a + b;
      row[i + len] = a - b;
    }
    __syncthreads();
  }
  for (int p = threadIdx.x; p < rows * D; p += blockDim.x) x[(p / D) * DP + p % D] *= c;
  __syncthreads();
}

// Dequantizes keys [t0, t0 + 32) of KV head kvh of one half into dst[32][DP] (rows past t_end: 0).
template <HF F>
__device__ inline void prefill_load_tile(const std::uint8_t* pool, std::size_t page_stride, const int* table, int B,
                                         int H, int D, int DP, int kvh, int t0, int t_end, float* dst) {
  for (int i = threadIdx.x; i < kPrefillKvTile * D; i += blockDim.x) {
    const int tau = i / D, d = i % D, t = t0 + tau;
    float x = 0.0f;
    if (t < t_end) {
      const std::uint8_t* page = pool + static_cast<std::size_t>(__ldg(table + t / B)) * page_stride;
      float sc;
      x = load_elem<F>(page, B, H, D, t % B, kvh, d, sc);
      x *= sc;
    }
    dst[tau * DP + d] = x;
  }
}

template <HF KF, HF VF>
__global__ void __launch_bounds__(kPrefillThreads) prefill_kernel(PrefillLaunch a) {
  extern __shared__ __align__(16) float psm[];
  const int D = a.head_dim, DP = prefill_row_stride(D);
  float* q_s = psm;                              // [64][DP], reused for the output
  float* k_s = q_s + kPrefillRows * DP;          // [32][DP]
  float* v_s = k_s + kPrefillKvTile * DP;        // [32][DP]
  float* p_s = v_s + kPrefillKvTile * DP;        // [64][33]

  const int kvh = blockIdx.y / a.n_hchunks, hc = blockIdx.y % a.n_hchunks;
  const int GC = a.heads_per_cta, QT = a.tokens_per_cta;
  const int hq0 = kvh * a.group + hc * GC;
  const int nh = min(GC, a.group - hc * GC);
  const int i0 = blockIdx.x * QT;                       // first query token of the CTA (chunk index)
  const int i_last = min(i0 + QT, a.n_new) - 1;         // last query token of the CTA
  const int t_end = a.n_past + i_last + 1;              // keys visible to the CTA's last query
  const int H = a.n_kv_heads, B = a.block_size;

  // Row r = (token i0 + r / GC, head hq0 + r % GC); rows beyond QT*GC, nh or n_new are padding.
  auto row_valid = [&](int r) { return r < QT * GC && r % GC < nh && i0 + r / GC < a.n_new; };
  const float q_mul = head_q_mul(a.q_mul, a.sm_scale, a.k_heads, kvh);
  for (int idx = threadIdx.x; idx < kPrefillRows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    float x = 0.0f;
    if (row_valid(r))
      x = a.q[(static_cast<std::size_t>(i0 + r / GC) * a.n_heads + hq0 + r % GC) * D + d] * q_mul;
    q_s[r * DP + d] = x;
  }
  __syncthreads();
  if constexpr (is_rot(KF)) prefill_fwht_rows(q_s, kPrefillRows, D, DP, a.had_c);

  const int rg = threadIdx.x >> 4, cg = threadIdx.x & 15;  // row group (4 rows), lane in the row group
  int lim[4];  // last visible key of each of the thread's rows (padding rows: see every loaded key)
  int lo[4];   // first visible key (sliding window; 0 without one)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = rg * 4 + i;
    lim[i] = row_valid(r) ? a.n_past + i0 + r / GC : t_end - 1;
    lo[i] = a.window > 0 ? max(0, lim[i] - a.window + 1) : 0;
  }
  // With a window, tiles wholly before the CTA's first query's window are never visited.
  const int t_first = a.window > 0 ? max(0, a.n_past + i0 - a.window + 1) / kPrefillKvTile * kPrefillKvTile : 0;
  float m[4], l[4], acc[4][kPrefillDimsPerLane];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < kPrefillDimsPerLane; ++k) acc[i][k] = 0.0f;
  }

  for (int t0 = t_first; t0 < t_end; t0 += kPrefillKvTile) {
    prefill_load_tile<KF>(a.k_pool, a.k_page_stride, a.block_table, B, H, D, DP, kvh, t0, t_end, k_s);
    prefill_load_tile<VF>(a.v_pool, a.v_page_stride, a.block_table, B, H, D, DP, kvh, t0, t_end, v_s);
    __syncthreads();

    // Scores of rows rg*4+i, keys cg and cg+16.
    float s[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = 0.0f;
    {
      const float* qr = q_s + rg * 4 * DP;
      const float* k0 = k_s + cg * DP;
      const float* k1 = k_s + (cg + 16) * DP;
      for (int d = 0; d < D; ++d) {
        const float ka = k0[d], kb = k1[d];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float qv = qr[i * DP + d];
          s[i][0] = fmaf(qv, ka, s[i][0]);
          s[i][1] = fmaf(qv, kb, s[i][1]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int t = t0 + cg + 16 * c;
        if (a.softcap2 > 0.0f) s[i][c] = softcap2(s[i][c], a.softcap2);
        if (t > lim[i] || t < lo[i] || t >= t_end) s[i][c] = -INFINITY;
      }
      float mx = fmaxf(s[i][0], s[i][1]);
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m[i], mx);
      // Without a window every row sees key 0, so m_new is finite from the first tile on; with one,
      // a row may see none of a tile's keys (m_new = -inf): the guards below keep that exact.
      const float corr = m[i] == -INFINITY ? 0.0f : exp2f(m[i] - m_new);
      const float p0 = s[i][0] == -INFINITY ? 0.0f : exp2f(s[i][0] - m_new);
      const float p1 = s[i][1] == -INFINITY ? 0.0f : exp2f(s[i][1] - m_new);
      float ps = p0 + p1;
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
      l[i] = l[i] * corr + ps;
      m[i] = m_new;
#pragma unroll
      for (int k = 0; k < kPrefillDimsPerLane; ++k) acc[i][k] *= corr;
      p_s[(rg * 4 + i) * (kPrefillKvTile + 1) + cg] = p0;
      p_s[(rg * 4 + i) * (kPrefillKvTile + 1) + cg + 16] = p1;
    }
    __syncthreads();

    // O += P V over the tile's keys that any row of the CTA can see.
    const int nk = min(kPrefillKvTile, t_end - t0);
    for (int j = 0; j < nk; ++j) {
      float p[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) p[i] = p_s[(rg * 4 + i) * (kPrefillKvTile + 1) + j];
      const float* vr = v_s + j * DP;
#pragma unroll
      for (int k = 0; k < kPrefillDimsPerLane; ++k) {
        const int d = cg + 16 * k;
        if (d < D) {
          const float vv = vr[d];
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[i][k] = fmaf(p[i], vv, acc[i][k]);
        }
      }
    }
    __syncthreads();  // k_s, v_s, p_s are overwritten by the next tile
  }

  // Epilogue: O / l (times the fp8 V scale) -> shared memory, inverse rotation for a rotated V,
  // then coalesced stores of the valid rows.
  float* o_s = q_s;
  const float v_mul = head_v_mul(a.v_mul, a.v_heads, kvh);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float inv = v_mul / l[i];
#pragma unroll
    for (int k = 0; k < kPrefillDimsPerLane; ++k) {
      const int d = cg + 16 * k;
      if (d < D) o_s[(rg * 4 + i) * DP + d] = acc[i][k] * inv;
    }
  }
  __syncthreads();
  if constexpr (is_rot(VF)) prefill_fwht_rows(o_s, kPrefillRows, D, DP, a.had_c);
  for (int idx = threadIdx.x; idx < kPrefillRows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    if (row_valid(r)) a.out[(static_cast<std::size_t>(i0 + r / GC) * a.n_heads + hq0 + r % GC) * D + d] = o_s[r * DP + d];
  }
}

}  // namespace kvgate::cuda::detail
