// The small kernels of the CUDA forward (see kernels.hpp). Compiled with --fmad=false,
// -prec-div=true, -prec-sqrt=true (model/CMakeLists.txt): every elementwise step is the CPU's
// sequence of binary32 roundings; only the RMSNorm sum of squares is reduced in another order.
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "kernels.hpp"
#include "kernels/common.cuh"
#include "kernels/numeric.cuh"

namespace kvgate::cuda::model_kernels {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(std::size_t n) {
  const std::size_t g = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(g < 65535u * 16u ? g : 65535u * 16u);
}

__global__ void embed_kernel(const void* emb, bool bf16, const int* tokens, float* x, int dim) {
  const int r = blockIdx.x;
  const std::size_t src = static_cast<std::size_t>(tokens[r]) * dim;
  float* o = x + static_cast<std::size_t>(r) * dim;
  if (bf16) {
    const auto* e = static_cast<const __nv_bfloat16*>(emb) + src;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = __bfloat162float(e[i]);
  } else {
    const auto* e = static_cast<const float*>(emb) + src;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = e[i];
  }
}

__device__ float block_sum(float v) {
  __shared__ float warp_part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_part[warp] = v;
  __syncthreads();
  const int n_warps = (blockDim.x + 31) >> 5;
  v = lane < n_warps ? warp_part[lane] : 0.0f;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __shared__ float total;
  if (threadIdx.x == 0) total = v;
  __syncthreads();
  return total;
}

__global__ void rmsnorm_kernel(float* o, const float* x, const float* w, int n, float eps) {
  const std::size_t base = static_cast<std::size_t>(blockIdx.x) * n;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) ss += x[base + j] * x[base + j];
  ss = block_sum(ss);
  // as the CPU: ss /= n; ss += eps; ss = 1 / sqrt(ss); o = w * (ss * x)
  ss /= static_cast<float>(n);
  ss += eps;
  ss = 1.0f / sqrtf(ss);
  for (int j = threadIdx.x; j < n; j += blockDim.x) o[base + j] = w[j] * (ss * x[base + j]);
}

__global__ void add_bias_kernel(float* y, const float* b, std::size_t total, int n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    y[i] = y[i] + b[i % n];
}

__global__ void rope_kernel(float* v, const int* pos, int offset, int rows, int n_heads, int D, int rot_half,
                            bool interleaved, const float* cos_tab, const float* sin_tab) {
  const int half = D / 2;  // table row stride; the first rot_half pairs turn, the rest pass through
  const std::size_t total = static_cast<std::size_t>(rows) * n_heads * rot_half;
  for (std::size_t idx = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % rot_half);
    const std::size_t rh = idx / rot_half;  // row * n_heads + head
    const int r = static_cast<int>(rh / n_heads);
    const std::size_t t = static_cast<std::size_t>(pos[r] + offset) * half + i;
    const float fc = cos_tab[t], fs = sin_tab[t];
    float* x = v + rh * D;
    if (interleaved) {  // adjacent pairs (x[2i], x[2i+1])
      const float v0 = x[2 * i], v1 = x[2 * i + 1];
      x[2 * i] = v0 * fc - v1 * fs;
      x[2 * i + 1] = v0 * fs + v1 * fc;
    } else {  // rotate-half pairs (x[i], x[i + rotary_dim/2])
      const float v0 = x[i], v1 = x[i + rot_half];
      x[i] = v0 * fc - v1 * fs;
      x[i + rot_half] = v1 * fc + v0 * fs;
    }
  }
}

// One row per thread: E is small (tens to a few hundred), the selection is K passes as the CPU's.
__global__ void moe_route_kernel(const float* logits, float* gate, int rows, int E, int K, bool norm_topk) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* z = logits + static_cast<std::size_t>(r) * E;
  float* g = gate + static_cast<std::size_t>(r) * E;
  float mx = z[0];
  for (int e = 1; e < E; ++e) mx = fmaxf(mx, z[e]);
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) {
    const float p = expf(z[e] - mx);
    g[e] = p;
    sum += p;
  }
  for (int e = 0; e < E; ++e) g[e] /= sum;
  // Selected experts get a negative mark -(1 + k) in a second pass; the weights are kept in order.
  constexpr int kMaxK = 64;
  int sel[kMaxK];
  float w[kMaxK];
  for (int k = 0; k < K && k < kMaxK; ++k) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int j = 0; j < k; ++j) taken |= sel[j] == e;
      if (!taken && (best < 0 || g[e] > g[best])) best = e;
    }
    sel[k] = best;
    w[k] = g[best];
  }
  if (norm_topk) {
    float s = 0.0f;
    for (int k = 0; k < K; ++k) s += w[k];
    for (int k = 0; k < K; ++k) w[k] /= s;
  }
  for (int e = 0; e < E; ++e) g[e] = 0.0f;
  for (int k = 0; k < K; ++k) g[sel[k]] = w[k];
}

__global__ void moe_route_groups_kernel(const float* logits, const float* bias, float* gate, int rows, int E, int K,
                                        int G, int topk_group, bool norm_topk, float routed_scale) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* z = logits + static_cast<std::size_t>(r) * E;
  float* g = gate + static_cast<std::size_t>(r) * E;  // holds the unbiased scores until the end
  const int per = E / G;
  for (int e = 0; e < E; ++e) g[e] = 1.0f / (1.0f + expf(-z[e]));
  constexpr int kMaxG = 64, kMaxK = 64;
  float gs[kMaxG];
  bool keep[kMaxG];
  for (int q = 0; q < G && q < kMaxG; ++q) {
    float b1 = -INFINITY, b2 = -INFINITY;
    for (int j = 0; j < per; ++j) {
      const float v = g[q * per + j] + bias[q * per + j];
      if (v > b1) b2 = b1, b1 = v;
      else if (v > b2) b2 = v;
    }
    gs[q] = b1 + b2;
    keep[q] = false;
  }
  for (int k = 0; k < topk_group; ++k) {
    int best = -1;
    for (int q = 0; q < G; ++q)
      if (!keep[q] && (best < 0 || gs[q] > gs[best])) best = q;
    keep[best] = true;
  }
  int sel[kMaxK];
  float w[kMaxK];
  for (int k = 0; k < K && k < kMaxK; ++k) {
    int best = -1;
    float bv = 0.0f;
    for (int e = 0; e < E; ++e) {
      if (!keep[e / per]) continue;
      bool taken = false;
      for (int j = 0; j < k; ++j) taken |= sel[j] == e;
      const float v = g[e] + bias[e];
      if (!taken && (best < 0 || v > bv)) best = e, bv = v;
    }
    sel[k] = best;
    w[k] = g[best];
  }
  if (norm_topk) {
    float s = 0.0f;
    for (int k = 0; k < K; ++k) s += w[k];
    s += 1e-20f;
    for (int k = 0; k < K; ++k) w[k] /= s;
  }
  for (int k = 0; k < K; ++k) w[k] *= routed_scale;
  for (int e = 0; e < E; ++e) g[e] = 0.0f;
  for (int k = 0; k < K; ++k) g[sel[k]] = w[k];
}

// The RoPE of one MLA rope part (a head's, or the shared key) of width 2 rh at a row's position:
// de-interleaved first when interleave, then the rotate-half rotation (the CPU forward's turn()).
__device__ void mla_turn(const float* x, float* out, int rh, bool interleave, const float* fc, const float* fs) {
  float tmp[512];
  for (int i = 0; i < rh; ++i) {
    tmp[i] = interleave ? x[2 * i] : x[i];
    tmp[rh + i] = interleave ? x[2 * i + 1] : x[rh + i];
  }
  for (int i = 0; i < rh; ++i) {
    const float v0 = tmp[i], v1 = tmp[i + rh];
    out[i] = v0 * fc[i] - v1 * fs[i];
    out[i + rh] = v1 * fc[i] + v0 * fs[i];
  }
}

// Latent cache: one block per row; thread h < H turns head h's rope part of q in place, thread H the
// row's shared key in ckv (after the latent), in place.
__global__ void mla_rope_latent_kernel(float* q, float* ckv, const int* d_pos, int H, int N, int Rd, int KL,
                                       bool interleave, const float* cos_tab, const float* sin_tab, int half_stride) {
  const int r = blockIdx.x;
  const float* fc = cos_tab + static_cast<std::size_t>(d_pos[r]) * half_stride;
  const float* fs = sin_tab + static_cast<std::size_t>(d_pos[r]) * half_stride;
  for (int h = threadIdx.x; h <= H; h += blockDim.x) {
    float* x = h < H ? q + (static_cast<std::size_t>(r) * H + h) * (N + Rd) + N : ckv + static_cast<std::size_t>(r) * (KL + Rd) + KL;
    mla_turn(x, x, Rd / 2, interleave, fc, fs);
  }
}

template <class W>
__device__ __forceinline__ float weight_at(const W* w, std::size_t i) {
  if constexpr (std::is_same_v<W, float>) return w[i];
  else return __uint_as_float(static_cast<std::uint32_t>(w[i]) << 16);  // bf16 bits
}

constexpr int kMlaRowsPerBlock = 8;

// q_lat[r][h] = W_UK_h^T q_nope[r][h] (n ascending, FP32), q_rope copied after it: block (head, 8 rows),
// threads over the latent's dims (coalesced rows of W_UK).
template <class W>
__global__ void mla_absorb_kernel(const float* q, const W* wkv_b, float* qlat, int rows, int H, int N, int Rd, int VD,
                                  int KL) {
  extern __shared__ float qs[];  // [kMlaRowsPerBlock][N]
  const int h = blockIdx.x, r0 = blockIdx.y * kMlaRowsPerBlock;
  const int nr = min(kMlaRowsPerBlock, rows - r0), QK = N + Rd;
  for (int i = threadIdx.x; i < nr * N; i += blockDim.x) {
    const int rr = i / N, n = i % N;
    qs[rr * N + n] = q[(static_cast<std::size_t>(r0 + rr) * H + h) * QK + n];
  }
  __syncthreads();
  for (int j = threadIdx.x; j < KL; j += blockDim.x) {
    float acc[kMlaRowsPerBlock] = {};
    for (int n = 0; n < N; ++n) {
      const float w = weight_at(wkv_b, (static_cast<std::size_t>(h) * (N + VD) + n) * KL + j);
#pragma unroll
      for (int rr = 0; rr < kMlaRowsPerBlock; ++rr) acc[rr] = fmaf(qs[rr * N + n], w, acc[rr]);
    }
    for (int rr = 0; rr < nr; ++rr) qlat[(static_cast<std::size_t>(r0 + rr) * H + h) * (KL + Rd) + j] = acc[rr];
  }
  for (int i = threadIdx.x; i < nr * Rd; i += blockDim.x) {
    const int rr = i / Rd, k = i % Rd;
    qlat[(static_cast<std::size_t>(r0 + rr) * H + h) * (KL + Rd) + KL + k] =
        q[(static_cast<std::size_t>(r0 + rr) * H + h) * QK + N + k];
  }
}

// out[r][h][v] = W_UV_h[v] . o_lat[r][h]: block (head, 8 rows), a warp per output dim, lanes over the
// latent (coalesced rows of W_UV), a butterfly sum per row.
template <class W>
__global__ void mla_up_v_kernel(const float* olat, const W* wkv_b, float* out, int rows, int H, int N, int VD, int KL) {
  extern __shared__ float os[];  // [kMlaRowsPerBlock][KL]
  const int h = blockIdx.x, r0 = blockIdx.y * kMlaRowsPerBlock;
  const int nr = min(kMlaRowsPerBlock, rows - r0);
  for (int i = threadIdx.x; i < kMlaRowsPerBlock * KL; i += blockDim.x) {
    const int rr = i / KL, j = i % KL;
    os[i] = rr < nr ? olat[(static_cast<std::size_t>(r0 + rr) * H + h) * KL + j] : 0.0f;
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int v = warp; v < VD; v += nw) {
    const std::size_t wrow = (static_cast<std::size_t>(h) * (N + VD) + N + v) * KL;
    float acc[kMlaRowsPerBlock] = {};
    for (int j = lane; j < KL; j += 32) {
      const float w = weight_at(wkv_b, wrow + j);
#pragma unroll
      for (int rr = 0; rr < kMlaRowsPerBlock; ++rr) acc[rr] = fmaf(w, os[rr * KL + j], acc[rr]);
    }
#pragma unroll
    for (int rr = 0; rr < kMlaRowsPerBlock; ++rr)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[rr] += __shfl_xor_sync(0xffffffffu, acc[rr], off);
    if (lane < nr) {
      float o = 0.0f;
#pragma unroll
      for (int rr = 0; rr < kMlaRowsPerBlock; ++rr)
        if (rr == lane) o = acc[rr];
      out[(static_cast<std::size_t>(r0 + lane) * H + h) * VD + v] = o;
    }
  }
}

// One block per row, one thread per head (heads <= blockDim).
__global__ void mla_assemble_kernel(float* q, const float* ckv, const float* kvb, float* k, float* v, const int* d_pos,
                                    int H, int N, int Rd, int VD, int KL, bool interleave, const float* cos_tab,
                                    const float* sin_tab, int half_stride) {
  const int r = blockIdx.x;
  const int QK = N + Rd, rh = Rd / 2;
  const float* fc = cos_tab + static_cast<std::size_t>(d_pos[r]) * half_stride;
  const float* fs = sin_tab + static_cast<std::size_t>(d_pos[r]) * half_stride;
  auto turn = [&](const float* x, float* out) { mla_turn(x, out, rh, interleave, fc, fs); };
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    float* qh = q + (static_cast<std::size_t>(r) * H + h) * QK;
    turn(qh + N, qh + N);
    const float* kv = kvb + (static_cast<std::size_t>(r) * H + h) * (N + VD);
    float* kh = k + (static_cast<std::size_t>(r) * H + h) * QK;
    float* vh = v + (static_cast<std::size_t>(r) * H + h) * QK;
    for (int i = 0; i < N; ++i) kh[i] = kv[i];
    turn(ckv + static_cast<std::size_t>(r) * (KL + Rd) + KL, kh + N);
    for (int i = 0; i < VD; ++i) vh[i] = kv[N + i];
    for (int i = VD; i < QK; ++i) vh[i] = 0.0f;
  }
}

__global__ void moe_accumulate_kernel(float* acc, const float* y, const float* gate, int expert, int E, int rows,
                                      int dim) {
  const std::size_t n = static_cast<std::size_t>(rows) * dim;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = i / static_cast<std::size_t>(dim);
    const float w = gate[r * E + expert];
    if (w != 0.0f) acc[i] += y[i] * w;
  }
}

__global__ void swiglu_kernel(float* h, const float* up, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float val = h[i];
    val *= 1.0f / (1.0f + expf(-val));  // silu
    h[i] = val * up[i];
  }
}

// GeGLU (Gemma): gelu_tanh(gate) * up, the CPU's geglu() operation by operation.
__global__ void geglu_kernel(float* h, const float* up, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float x = h[i];
    const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    h[i] = 0.5f * x * (1.0f + tanhf(inner)) * up[i];
  }
}

__global__ void scale_kernel(float* x, std::size_t n, float s) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) x[i] *= s;
}

__global__ void softcap_kernel(float* x, std::size_t n, float cap) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) x[i] = tanhf(x[i] / cap) * cap;
}

__global__ void add_kernel(float* x, const float* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) x[i] += y[i];
}

__global__ void to_bf16_kernel(const float* x, __nv_bfloat16* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

// (value, index) with the CPU's rule: a later index wins only when strictly larger.
__device__ bool better(float vb, int ib, float va, int ia) {
  if (ia < 0) return ib >= 0;
  if (ib < 0) return false;
  return vb > va || (vb == va && ib < ia);
}

__global__ void argmax_kernel(const float* x, int n, int* out) {
  const float* row = x + static_cast<std::size_t>(blockIdx.x) * n;
  float bv = -FLT_MAX;
  int bi = -1;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (bi < 0 || row[i] > bv) bv = row[i], bi = i;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    const int n_warps = (blockDim.x + 31) >> 5;
    bv = lane < n_warps ? sv[lane] : -FLT_MAX;
    bi = lane < n_warps ? si[lane] : -1;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) out[blockIdx.x] = bi < 0 ? 0 : bi;
  }
}

__device__ std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_uniform_kernel(void* p, bool bf16, std::size_t n, std::uint64_t seed, float a) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(splitmix64(seed ^ (i * 0xD1B54A32D192ED03ull)) >> 40) * 0x1p-24f;  // [0, 1)
    const float val = (2.0f * u - 1.0f) * a;
    if (bf16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(val);
    else static_cast<float*>(p)[i] = val;
  }
}

__global__ void fill_const_kernel(float* p, std::size_t n, float value) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = value;
}

// ---- injected KV damage (kvgate/kv_damage.hpp) ----
__device__ __forceinline__ float damage_load(const void* row, int format, int i) {
  if (format == 0) return static_cast<const float*>(row)[i];
  const std::uint16_t h = static_cast<const std::uint16_t*>(row)[i];
  return format == 1 ? dev::f16_to_f32(h) : __uint_as_float(static_cast<std::uint32_t>(h) << 16);
}
__device__ __forceinline__ void damage_store(void* row, int format, int i, float x) {
  if (format == 0) static_cast<float*>(row)[i] = x;
  else static_cast<std::uint16_t*>(row)[i] = format == 1 ? dev::f32_to_f16_rne(x) : dev::f32_to_bf16_rne(x);
}
__device__ __forceinline__ std::uint8_t* damage_row(const KvDamageLaunch& a, int r, int elem_bytes) {
  const int slot = a.d_slot[r], B = a.block_size;
  return a.pool + static_cast<std::size_t>(slot / B) * a.page_stride +
         static_cast<std::size_t>(slot % B) * a.n_kv_heads * a.head_dim * elem_bytes;
}

// One block per row, one warp per cell (KV head): amax of the stored cell, then every element.
__global__ void kv_noise_kernel(KvDamageLaunch a) {
  const int r = blockIdx.x;
  const int pos = a.d_pos[r];
  const KvDamage& d = a.damage;
  if (d.kind == KvDamageKind::k_noise_span && (pos < d.pos0 || pos >= d.pos1)) return;
  if (a.d_slot[r] < 0) return;
  void* row = damage_row(a, r, a.format == 0 ? 4 : 2);
  const int D = a.head_dim, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const double amp = damage_amplitude(d);
  const std::uint64_t salt = damage_salt(d.kind);
  for (int h = warp; h < a.n_kv_heads; h += nwarps) {
    float amax = 0.0f;
    for (int i = lane; i < D; i += 32) amax = fmaxf(amax, fabsf(damage_load(row, a.format, h * D + i)));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    for (int i = lane; i < D; i += 32) {
      const int e = h * D + i;
      damage_store(row, a.format, e, damage_noisy(damage_load(row, a.format, e), amp, amax, a.layer, pos, e, salt));
    }
  }
}

// One thread per row element, the call's rows in descending order: row r reads row r - 1 before
// it is changed (or `prev` for r = 0).
template <class T>
__global__ void kv_repeat_kernel(KvDamageLaunch a) {
  const int HD = a.n_kv_heads * a.head_dim;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= HD || a.rows < 1) return;
  T* prev = static_cast<T*>(a.prev);
  auto at = [&](int r) { return reinterpret_cast<T*>(damage_row(a, r, sizeof(T))) + i; };
  const T last = *at(a.rows - 1);
  for (int r = a.rows - 1; r >= 0; --r) {
    const int p = a.d_pos[r];
    if (p % a.block_size == 0 || !damage_repeats(p, a.damage.size)) continue;
    *at(r) = r > 0 ? *at(r - 1) : prev[i];
  }
  prev[i] = last;
}

int block_for(int n) { return n >= 1024 ? 512 : n >= 256 ? 256 : n >= 64 ? 64 : 32; }

}  // namespace

void embed(const void* emb, bool bf16, const int* d_tokens, float* x, int rows, int dim, cudaStream_t st) {
  embed_kernel<<<rows, block_for(dim), 0, st>>>(emb, bf16, d_tokens, x, dim);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm(float* o, const float* x, const float* w, int rows, int n, float eps, cudaStream_t st) {
  if (rows <= 0) return;
  rmsnorm_kernel<<<rows, block_for(n), 0, st>>>(o, x, w, n, eps);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void add_bias(float* y, const float* b, int rows, int n, cudaStream_t st) {
  const std::size_t total = static_cast<std::size_t>(rows) * n;
  add_bias_kernel<<<grid_for(total), kThreads, 0, st>>>(y, b, total, n);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void rope(float* v, const int* d_pos, int offset, int rows, int n_heads, int D, int rotary_dim, bool interleaved,
          const float* cos_tab, const float* sin_tab, cudaStream_t st) {
  const int rot_half = rotary_dim / 2;
  const std::size_t total = static_cast<std::size_t>(rows) * n_heads * rot_half;
  rope_kernel<<<grid_for(total), kThreads, 0, st>>>(v, d_pos, offset, rows, n_heads, D, rot_half, interleaved, cos_tab,
                                                    sin_tab);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void moe_route(const float* logits, float* gate, int rows, int n_experts, int top_k, bool norm_topk, cudaStream_t st) {
  if (rows <= 0) return;
  if (top_k > 64) throw std::runtime_error("cuda forward: num_experts_per_tok > 64 is not supported by the router kernel");
  moe_route_kernel<<<(rows + 63) / 64, 64, 0, st>>>(logits, gate, rows, n_experts, top_k, norm_topk);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void moe_route_groups(const float* logits, const float* bias, float* gate, int rows, int n_experts, int top_k,
                      int n_group, int topk_group, bool norm_topk, float routed_scale, cudaStream_t st) {
  if (rows <= 0) return;
  if (top_k > 64 || n_group > 64)
    throw std::runtime_error("cuda forward: num_experts_per_tok or n_group > 64 is not supported by the router kernel");
  moe_route_groups_kernel<<<(rows + 63) / 64, 64, 0, st>>>(logits, bias, gate, rows, n_experts, top_k, n_group,
                                                           topk_group, norm_topk, routed_scale);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void mla_assemble(float* q, const float* ckv, const float* kvb, float* k, float* v, const int* d_pos, int rows,
                  int n_heads, int nope, int rope, int vdim, int kv_lora, bool interleave, const float* cos_tab,
                  const float* sin_tab, int half_stride, cudaStream_t st) {
  if (rows <= 0) return;
  if (rope > 512) throw std::runtime_error("cuda forward: qk_rope_head_dim > 512 is not supported");
  mla_assemble_kernel<<<rows, 64, 0, st>>>(q, ckv, kvb, k, v, d_pos, n_heads, nope, rope, vdim, kv_lora, interleave,
                                           cos_tab, sin_tab, half_stride);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void mla_rope_latent(float* q, float* ckv, const int* d_pos, int rows, int n_heads, int nope, int rope, int kv_lora,
                     bool interleave, const float* cos_tab, const float* sin_tab, int half_stride, cudaStream_t st) {
  if (rows <= 0) return;
  if (rope > 512) throw std::runtime_error("cuda forward: qk_rope_head_dim > 512 is not supported");
  mla_rope_latent_kernel<<<rows, 64, 0, st>>>(q, ckv, d_pos, n_heads, nope, rope, kv_lora, interleave, cos_tab, sin_tab,
                                              half_stride);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void mla_absorb(const float* q, const void* wkv_b, bool bf16, float* qlat, int rows, int n_heads, int nope, int rope,
                int vdim, int kv_lora, cudaStream_t st) {
  if (rows <= 0) return;
  const dim3 grid(static_cast<unsigned>(n_heads), static_cast<unsigned>((rows + kMlaRowsPerBlock - 1) / kMlaRowsPerBlock));
  const std::size_t smem = static_cast<std::size_t>(kMlaRowsPerBlock) * std::max(nope, 1) * sizeof(float);
  if (bf16)
    mla_absorb_kernel<<<grid, 256, smem, st>>>(q, static_cast<const std::uint16_t*>(wkv_b), qlat, rows, n_heads, nope,
                                               rope, vdim, kv_lora);
  else
    mla_absorb_kernel<<<grid, 256, smem, st>>>(q, static_cast<const float*>(wkv_b), qlat, rows, n_heads, nope, rope, vdim,
                                               kv_lora);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void mla_up_v(const float* olat, const void* wkv_b, bool bf16, float* out, int rows, int n_heads, int nope, int vdim,
              int kv_lora, cudaStream_t st) {
  if (rows <= 0) return;
  const dim3 grid(static_cast<unsigned>(n_heads), static_cast<unsigned>((rows + kMlaRowsPerBlock - 1) / kMlaRowsPerBlock));
  const std::size_t smem = static_cast<std::size_t>(kMlaRowsPerBlock) * kv_lora * sizeof(float);
  if (bf16)
    mla_up_v_kernel<<<grid, 256, smem, st>>>(olat, static_cast<const std::uint16_t*>(wkv_b), out, rows, n_heads, nope,
                                             vdim, kv_lora);
  else
    mla_up_v_kernel<<<grid, 256, smem, st>>>(olat, static_cast<const float*>(wkv_b), out, rows, n_heads, nope, vdim,
                                             kv_lora);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void moe_accumulate(float* acc, const float* y, const float* gate, int expert, int n_experts, int rows, int dim,
                    cudaStream_t st) {
  const std::size_t n = static_cast<std::size_t>(rows) * dim;
  if (n == 0) return;
  moe_accumulate_kernel<<<grid_for(n), kThreads, 0, st>>>(acc, y, gate, expert, n_experts, rows, dim);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void swiglu(float* h, const float* up, std::size_t n, cudaStream_t st) {
  swiglu_kernel<<<grid_for(n), kThreads, 0, st>>>(h, up, n);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void geglu(float* h, const float* up, std::size_t n, cudaStream_t st) {
  geglu_kernel<<<grid_for(n), kThreads, 0, st>>>(h, up, n);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void scale(float* x, std::size_t n, float s, cudaStream_t st) {
  scale_kernel<<<grid_for(n), kThreads, 0, st>>>(x, n, s);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void softcap(float* x, std::size_t n, float cap, cudaStream_t st) {
  softcap_kernel<<<grid_for(n), kThreads, 0, st>>>(x, n, cap);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void add(float* x, const float* y, std::size_t n, cudaStream_t st) {
  add_kernel<<<grid_for(n), kThreads, 0, st>>>(x, y, n);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void to_bf16(const float* x, void* y, std::size_t n, cudaStream_t st) {
  to_bf16_kernel<<<grid_for(n), kThreads, 0, st>>>(x, static_cast<__nv_bfloat16*>(y), n);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void argmax_rows(const float* x, int rows, int n, int* out, cudaStream_t st) {
  if (rows <= 0) return;
  argmax_kernel<<<rows, 256, 0, st>>>(x, n, out);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void fill_uniform(void* p, bool bf16, std::size_t n, std::uint64_t seed, float stddev, cudaStream_t st) {
  fill_uniform_kernel<<<grid_for(n), kThreads, 0, st>>>(p, bf16, n, seed, 1.7320508075688772f * stddev);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void fill_const(float* p, std::size_t n, float value, cudaStream_t st) {
  fill_const_kernel<<<grid_for(n), kThreads, 0, st>>>(p, n, value);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

void kv_damage(const KvDamageLaunch& a, cudaStream_t st) {
  if (a.rows <= 0) return;
  if (a.damage.kind == KvDamageKind::v_repeat) {
    const int HD = a.n_kv_heads * a.head_dim;
    const unsigned grid = static_cast<unsigned>((HD + kThreads - 1) / kThreads);
    if (a.format == 0) kv_repeat_kernel<std::uint32_t><<<grid, kThreads, 0, st>>>(a);
    else kv_repeat_kernel<std::uint16_t><<<grid, kThreads, 0, st>>>(a);
  } else {
    kv_noise_kernel<<<a.rows, kThreads, 0, st>>>(a);
  }
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvgate::cuda::model_kernels
