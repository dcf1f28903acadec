// Split-K merge of the decode partials, the V scale (per tensor or per KV head), and the inverse
// rotation of the output for a Walsh-Hadamard-rotated V (the accumulation ran in the rotated domain).
// Launched as a programmatic dependent of the decode kernel (Hopper PDL): its CTAs may be scheduled
// while the decode kernel's last CTAs run, and wait (griddepcontrol.wait) for that grid to complete
// and its partials to be visible before the first read. KVGATE_CUDA_PDL=0 launches it plainly.
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/decode_params.cuh"
#include "kvgate/cuda/ops.hpp"

namespace kvgate::cuda {
bool decode_combine_pdl() {
  static const bool on = [] {
    const char* e = std::getenv("KVGATE_CUDA_PDL");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}
}  // namespace kvgate::cuda

namespace kvgate::cuda::detail {

__device__ __forceinline__ float safe_exp2_diff_c(float m, float M) { return m == -INFINITY ? 0.0f : exp2f(m - M); }

// ---- split merge + output transform --------------------------------------------------------------
// 16 warps per (query head, sequence) where there are that many splits: at batch 1 (hundreds of
// splits, n_heads CTAs) the merge is latency-bound, so its loads are issued in as few dependent
// rounds as possible. The count depends on the split count only, never on the batch, so a
// sequence's output does not depend on its companions.
inline constexpr int kCombineWarps = 16;  // warps per (query head, sequence): splits spread over them
inline constexpr int kCombineRowRegs = 64;  // floats of partial rows one lane holds in flight
inline int combine_warps(int splits) { return splits < kCombineWarps ? (splits < 1 ? 1 : splits) : kCombineWarps; }

// One lane's share of a partial row: VEC consecutive dims per chunk (one 16-byte load for
// VEC = 4), chunk c at dims 32 * VEC * c + VEC * lane; NCH chunks cover head_dim.
template <int VEC>
struct CombineVec;
template <>
struct CombineVec<4> {
  __device__ static __forceinline__ void load(const float* p, float (&v)[4]) {
    const float4 x = __ldcg(reinterpret_cast<const float4*>(p));  // written by another grid: L2, not L1
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  }
};
template <>
struct CombineVec<1> {
  __device__ static __forceinline__ void load(const float* p, float (&v)[1]) { v[0] = __ldcg(p); }
};

template <bool RotV, int VEC, int NCH>
__global__ void __launch_bounds__(kCombineWarps * 32) decode_combine_kernel(CombineLaunch a) {
  constexpr int PER = VEC * NCH;                    // floats of one row per lane
  constexpr int U = kCombineRowRegs / PER < 1 ? 1 : kCombineRowRegs / PER;  // rows per lane per round
  extern __shared__ float sm[];  // [D] output, [splits] weights, [splits] l, [32] scratch, [warps][D] partial sums
  const int hq = blockIdx.x, b = blockIdx.y, D = a.head_dim, S = a.splits;
  const float v_mul = head_v_mul(a.v_mul, a.v_heads, hq / a.group);  // the V scale of the head's KV head
  float* o_s = sm;
  float* w_s = sm + D;
  float* l_s = w_s + S;
  float* red = l_s + S;
  float* o_w = red + 32;
  const std::size_t base = static_cast<std::size_t>(b) * S * a.n_heads + hq;  // + s * n_heads
  const int tid = threadIdx.x, nthr = blockDim.x, lane = tid & 31, warp = tid >> 5, nw = (nthr + 31) / 32;
  const float* po = a.part_o + base * D;  // split s: po + s * n_heads * D
  const std::size_t ss = static_cast<std::size_t>(a.n_heads) * D;
  // Warp w merges the splits w, w + nw, w + 2 nw, ... in that order, U rows a round.
  auto load_round = [&](int s0, float (&v)[U][PER]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = s0 + u * nw;
#pragma unroll
      for (int c = 0; c < NCH; ++c) {
        const int d = 32 * VEC * c + VEC * lane;
        float x[VEC];
        if (s < S && d < D) CombineVec<VEC>::load(po + static_cast<std::size_t>(s) * ss + d, x);
        else
#pragma unroll
          for (int e = 0; e < VEC; ++e) x[e] = 0.0f;
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[u][c * VEC + e] = x[e];
      }
    }
  };
  // The decode kernel's partials: complete and visible after this (a no-op for a plain launch).
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  // 1. The first round of partial rows goes out before the (m, l) loads, so both are in flight
  //    together: at batch 1 (hundreds of splits, n_heads CTAs) one round covers nw * U splits.
  float v[U][PER];
  load_round(warp, v);
  // 2. (m_s, l_s) of every split in one pass of loads; M = max_s m_s (block reduction).
  float M = -INFINITY;
  for (int s = tid; s < S; s += nthr) {
    const std::size_t i = (base + static_cast<std::size_t>(s) * a.n_heads) * 2;
    const float m = __ldcg(a.part_ml + i);
    l_s[s] = __ldcg(a.part_ml + i + 1);
    w_s[s] = m;
    M = fmaxf(M, m);
  }
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  if (lane == 0) red[warp] = M;
  __syncthreads();
  M = -INFINITY;
  for (int w = 0; w < nw; ++w) M = fmaxf(M, red[w]);
  __syncthreads();
  // 3. weights w_s = 2^(m_s - M) and L = sum_s l_s w_s (from shared memory: no second pass of loads).
  float L = 0.0f;
  for (int s = tid; s < S; s += nthr) {
    const float w = safe_exp2_diff_c(w_s[s], M);
    w_s[s] = w;
    L += l_s[s] * w;
  }
  for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
  if (lane == 0) red[warp] = L;
  __syncthreads();
  L = 0.0f;
  for (int w = 0; w < nw; ++w) L += red[w];
  // 4. o[d] = sum_s o_s[d] w_s / L: each warp's rows in split order, the rounds after the first
  //    loaded a round at a time; the warps' sums then meet in warp order.
  {
    float acc[PER];
#pragma unroll
    for (int k = 0; k < PER; ++k) acc[k] = 0.0f;
    for (int s0 = warp;;) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int s = s0 + u * nw;
        const float w = s < S ? w_s[s] : 0.0f;
#pragma unroll
        for (int k = 0; k < PER; ++k) acc[k] += v[u][k] * w;
      }
      s0 += U * nw;
      if (s0 >= S) break;
      load_round(s0, v);
    }
#pragma unroll
    for (int c = 0; c < NCH; ++c)
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int d = 32 * VEC * c + VEC * lane + e;
        if (d < D) o_w[warp * D + d] = acc[c * VEC + e];
      }
  }
  __syncthreads();
  for (int d = tid; d < D; d += nthr) {
    float acc = 0.0f;
    for (int w = 0; w < nw; ++w) acc += o_w[w * D + d];
    o_s[d] = L > 0.0f || L != L ? acc / L * v_mul : 0.0f;  // a query with no visible key gets 0
  }
  __syncthreads();
  if constexpr (RotV) {
    const int half = D / 2;
    for (int len = 1; len < D; len <<= 1) {
      for (int p = tid; p < half; p += nthr) {
        const int i = (p / len) * 2 * len + (p % len);
        const float x = o_s[i], y = o_s[i + len];
        o_s[i] = x + y;
        o_s[i + len] = x - y;
      }
      __syncthreads();
    }
  }
  float* out = a.out + (static_cast<std::size_t>(b) * a.n_heads + hq) * D;
  for (int d = tid; d < D; d += nthr) out[d] = RotV ? o_s[d] * a.had_c : o_s[d];
}

// The instantiation for a head_dim: 16-byte row loads where rows stay 16-byte aligned (D % 4 == 0),
// one or two chunks of 128 dims; 4-byte loads, up to 8 chunks of 32, otherwise.
using CombineKernel = void (*)(CombineLaunch);
template <bool RotV>
CombineKernel combine_kernel_for(int D) {
  if (D % 4 == 0) return D <= 128 ? decode_combine_kernel<RotV, 4, 1> : decode_combine_kernel<RotV, 4, 2>;
  return D <= 128 ? decode_combine_kernel<RotV, 1, 4> : decode_combine_kernel<RotV, 1, 8>;
}

void launch_combine(const CombineLaunch& a, bool rot_v, cudaStream_t stream) {
  const dim3 grid(a.n_heads, a.batch);
  if (a.head_dim > 256)
    throw std::invalid_argument("kvgate::cuda decode combine: head_dim " + std::to_string(a.head_dim) + " > 256");
  const int nw = combine_warps(a.splits), threads = 32 * nw;
  const std::size_t smem = static_cast<std::size_t>(a.head_dim + 2 * a.splits + 32 + nw * a.head_dim) * sizeof(float);
  const CombineKernel kernel = rot_v ? combine_kernel_for<true>(a.head_dim) : combine_kernel_for<false>(a.head_dim);
  if (smem > 48 * 1024)
    KVGATE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = decode_combine_pdl() ? 1 : 0;
  KVGATE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a));
}

}  // namespace kvgate::cuda::detail
