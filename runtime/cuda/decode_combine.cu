// Split-K merge of the decode partials, per-tensor V scale, and the inverse rotation of the output
// for a Walsh-Hadamard-rotated V (the accumulation ran in the rotated domain).
#include "kernels/decode_params.cuh"

namespace kvgate::cuda::detail {

__device__ __forceinline__ float safe_exp2_diff_c(float m, float M) { return m == -INFINITY ? 0.0f : exp2f(m - M); }

// ---- split merge + output transform --------------------------------------------------------------
template <bool RotV>
__global__ void decode_combine_kernel(CombineLaunch a) {
  extern __shared__ float o_s[];
  const int hq = blockIdx.x, b = blockIdx.y, D = a.head_dim;
  const std::size_t base = static_cast<std::size_t>(b) * a.splits * a.n_heads + hq;  // + s * n_heads
  float M = -INFINITY;
  for (int s = 0; s < a.splits; ++s) M = fmaxf(M, a.part_ml[(base + static_cast<std::size_t>(s) * a.n_heads) * 2]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f, l = 0.0f;
    for (int s = 0; s < a.splits; ++s) {
      const std::size_t row = base + static_cast<std::size_t>(s) * a.n_heads;
      const float f = safe_exp2_diff_c(a.part_ml[row * 2], M);
      o += a.part_o[row * D + d] * f;
      l += a.part_ml[row * 2 + 1] * f;
    }
    o_s[d] = l > 0.0f || l != l ? o / l * a.v_mul : 0.0f;  // a query with no visible key gets 0
  }
  __syncthreads();
  if constexpr (RotV) {
    const int half = D / 2;
    for (int len = 1; len < D; len <<= 1) {
      for (int p = threadIdx.x; p < half; p += blockDim.x) {
        const int i = (p / len) * 2 * len + (p % len);
        const float x = o_s[i], y = o_s[i + len];
        o_s[i] = x + y;
        o_s[i + len] = x - y;
      }
      __syncthreads();
    }
  }
  float* out = a.out + (static_cast<std::size_t>(b) * a.n_heads + hq) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) out[d] = RotV ? o_s[d] * a.had_c : o_s[d];
}

void launch_combine(const CombineLaunch& a, bool rot_v, cudaStream_t stream) {
  const dim3 grid(a.n_heads, a.batch);
  const int threads = a.head_dim < 32 ? 32 : (a.head_dim > 256 ? 256 : a.head_dim);
  const std::size_t smem = static_cast<std::size_t>(a.head_dim) * sizeof(float);
  if (rot_v) decode_combine_kernel<true><<<grid, threads, smem, stream>>>(a);
  else decode_combine_kernel<false><<<grid, threads, smem, stream>>>(a);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvgate::cuda::detail
