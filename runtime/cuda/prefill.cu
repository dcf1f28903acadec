// Op: causal prefill attention over the paged store (kernels/prefill.cuh). Capability check, the
// CTA tiling of (query token, query head) rows, and the one dispatch switch from the runtime
// (K half, V half) pair to the kernel templates (every pair of the 14 half formats: 196
// instantiations, head_dim a runtime value <= 256).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/prefill.cuh"
#include "kvgate/cuda/ops.hpp"

namespace kvgate::cuda {

namespace {

template <HalfFormat KF, HalfFormat VF>
void launch_prefill(const detail::PrefillLaunch& L, dim3 grid, int smem, cudaStream_t stream) {
  auto k = detail::prefill_kernel<KF, VF>;
  static int smem_set = -1;  // the attribute is per kernel: set it when the size grows
  if (smem > smem_set) {
    KVGATE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    smem_set = smem;
  }
  k<<<grid, detail::kPrefillThreads, smem, stream>>>(L);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int prefill_first_key(int n_past, int window) {
  if (window <= 0) return 0;  // the kernel's t_first for its first CTA (i0 = 0; later CTAs start later)
  return std::max(0, n_past - window + 1) / detail::kPrefillKvTile * detail::kPrefillKvTile;
}

void prefill_attention(const PrefillArgs& a, cudaStream_t stream) {
  const OpSupport sup = supports_op(Op::prefill, a.format, a.geometry, a.n_heads);
  if (!sup.ok) throw std::invalid_argument("kvgate::cuda::prefill_attention: " + sup.reason + ": " + sup.detail);
  if (a.n_new < 1 || a.n_past < 0)
    throw std::invalid_argument("kvgate::cuda::prefill_attention: n_new must be >= 1 and n_past >= 0");
  if (prefill_attention_mma(a, stream)) return;  // tensor cores where they apply (prefill_mma.cu)
  const int H = a.geometry.n_kv_heads, D = a.geometry.head_dim;
  detail::PrefillLaunch L;
  L.k_pool = a.k_pool;
  L.v_pool = a.v_pool;
  L.k_page_stride = a.k_page_stride;
  L.v_page_stride = a.v_page_stride;
  L.block_table = a.block_table;
  L.q = a.q;
  L.out = a.out;
  L.n_heads = a.n_heads;
  L.n_kv_heads = H;
  L.head_dim = D;
  L.block_size = a.geometry.block_size;
  L.group = a.n_heads / H;
  // Up to 8 query heads of a GQA group share a CTA (and each dequantized K/V tile); the rest of the
  // CTA's 64 rows are consecutive query tokens (64 tokens for MHA, 16 for a group of 4).
  L.heads_per_cta = std::min(L.group, detail::kPrefillMaxHeadsPerCta);
  L.n_hchunks = (L.group + L.heads_per_cta - 1) / L.heads_per_cta;
  L.tokens_per_cta = detail::kPrefillRows / L.heads_per_cta;
  L.n_past = a.n_past;
  L.n_new = a.n_new;
  if (a.window < 0) throw std::invalid_argument("kvgate::cuda::prefill_attention: window must be >= 0");
  L.window = a.window;
  L.softcap2 = detail::softcap_base2(a.softcap, "prefill_attention");
  const float scale = a.softmax_scale > 0 ? a.softmax_scale : 1.0f / std::sqrt(static_cast<float>(D));
  const float k_ts = detail::applied_tensor_scale(a.format.k, a.k_scale);
  L.v_mul = detail::applied_tensor_scale(a.format.v, a.v_scale);
  L.q_mul = static_cast<float>(static_cast<double>(scale) * 1.4426950408889634 * k_ts);
  L.k_heads = detail::applied_head_scales(a.format.k, a.k_head_scales, "prefill_attention");
  L.v_heads = detail::applied_head_scales(a.format.v, a.v_head_scales, "prefill_attention");
  L.sm_scale = scale;
  L.had_c = detail::hadamard_scale(D);
  const dim3 grid((a.n_new + L.tokens_per_cta - 1) / L.tokens_per_cta, H * L.n_hchunks);
  const int smem = detail::prefill_smem_bytes(D);
  detail::dispatch_half(a.format.k, [&](auto kf) {
    detail::dispatch_half(a.format.v, [&](auto vf) {
      launch_prefill<decltype(kf)::value, decltype(vf)::value>(L, grid, smem, stream);
    });
  });
}

}  // namespace kvgate::cuda
