// Op: tensor-core causal prefill attention (kernels/prefill_mma.cuh). Which calls it takes
// (prefill_mma_applies), the row tiling (the CUDA-core kernel's), and the one dispatch switch from the
// runtime (K half, V half, head_dim) to the templates, instantiated one K half per file
// (prefill_mma_k_<fmt>.cu). prefill_attention (prefill.cu) calls it first.
#include <algorithm>
#include <cmath>

#include "kernels/prefill_mma_params.cuh"
#include "kvgate/cuda/ops.hpp"

namespace kvgate::cuda {

bool prefill_mma_applies(const KvFormat& f, const PageGeometry& g) {
  return detail::pmma_half(f.k) && detail::pmma_half(f.v) && detail::pmma_head_dim(g.head_dim);
}

bool prefill_attention_mma(const PrefillArgs& a, cudaStream_t stream) {
  // Sliding-window calls run on the CUDA-core kernel (it skips the tiles before the window); the
  // tensor-core kernel attends to every key up to the causal diagonal.
  if (a.window > 0 || !prefill_mma_applies(a.format, a.geometry)) return false;
  const int H = a.geometry.n_kv_heads, D = a.geometry.head_dim;
  detail::PmmaLaunch L;
  detail::PrefillLaunch& p = L.p;
  p.k_pool = a.k_pool;
  p.v_pool = a.v_pool;
  p.k_page_stride = a.k_page_stride;
  p.v_page_stride = a.v_page_stride;
  p.block_table = a.block_table;
  p.q = a.q;
  p.out = a.out;
  p.n_heads = a.n_heads;
  p.n_kv_heads = H;
  p.head_dim = D;
  p.block_size = a.geometry.block_size;
  p.group = a.n_heads / H;
  // As the CUDA-core kernel: up to 8 query heads of a GQA group per CTA, the rest of its
  // kPmmaRows (128) rows consecutive query tokens.
  p.heads_per_cta = std::min(p.group, detail::kPrefillMaxHeadsPerCta);
  p.n_hchunks = (p.group + p.heads_per_cta - 1) / p.heads_per_cta;
  p.tokens_per_cta = detail::kPmmaRows / p.heads_per_cta;
  p.n_past = a.n_past;
  p.n_new = a.n_new;
  p.softcap2 = detail::softcap_base2(a.softcap, "prefill_attention");
  const float scale = a.softmax_scale > 0 ? a.softmax_scale : 1.0f / std::sqrt(static_cast<float>(D));
  const float k_ts = detail::applied_tensor_scale(a.format.k, a.k_scale);
  p.v_mul = detail::applied_tensor_scale(a.format.v, a.v_scale);
  p.q_mul = static_cast<float>(static_cast<double>(scale) * 1.4426950408889634 * k_ts);
  p.k_heads = detail::applied_head_scales(a.format.k, a.k_head_scales, "prefill_attention");
  p.v_heads = detail::applied_head_scales(a.format.v, a.v_head_scales, "prefill_attention");
  p.sm_scale = scale;
  p.had_c = detail::hadamard_scale(D);
  L.n_qtiles = (a.n_new + p.tokens_per_cta - 1) / p.tokens_per_cta;
  detail::dispatch_half(a.format.k, [&](auto kf) {
    detail::dispatch_half(a.format.v, [&](auto vf) {
      constexpr HalfFormat KF = decltype(kf)::value, VF = decltype(vf)::value;
      if constexpr (detail::pmma_half(KF) && detail::pmma_half(VF)) {
        if (D == 64) detail::launch_prefill_mma<KF, VF, 64>(L, stream);
        else if (D == 128) detail::launch_prefill_mma<KF, VF, 128>(L, stream);
        else detail::launch_prefill_mma<KF, VF, 256>(L, stream);
      }
    });
  });
  return true;
}

}  // namespace kvgate::cuda
