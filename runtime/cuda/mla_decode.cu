// Op: latent attention (MLA, weight-absorbed) over the paged quantized latent cache. Capability
// check, split planning from the device's occupancy, and the dispatch from the latent's runtime
// half format to the kernel template (kernels/mla_decode.cuh; the RoPE key's format is a runtime
// switch inside the kernel).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/mla_decode.cuh"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/ops.hpp"

namespace kvgate::cuda {

using detail::HF;

OpSupport supports_mla(const KvFormat& f, int kv_lora, int rope, int n_heads) {
  if (kv_lora < 1 || rope < 0 || n_heads < 1)
    return {false, "head_dim_unsupported",
            "latent attention needs kv_lora_rank >= 1, qk_rope_head_dim >= 0 and >= 1 query head (got " +
                std::to_string(kv_lora) + ", " + std::to_string(rope) + ", " + std::to_string(n_heads) + ")",
            {}};
  if (kv_lora > detail::kMlaMaxLatent || rope > detail::kMlaMaxRope)
    return {false, "row_too_large",
            "the CUDA latent kernel holds kv_lora_rank <= " + std::to_string(detail::kMlaMaxLatent) +
                " and qk_rope_head_dim <= " + std::to_string(detail::kMlaMaxRope) + " per lane set (got " +
                std::to_string(kv_lora) + ", " + std::to_string(rope) + ")",
            {}};
  const PageGeometry gk{16, 1, kv_lora}, gv{16, 1, std::max(rope, 1)};
  for (int half = 0; half < 2; ++half) {
    const HalfFormat h = half == 0 ? f.k : f.v;
    const PageGeometry& g = half == 0 ? gk : gv;
    if (half == 1 && rope == 0) continue;  // no RoPE key stored
    if (h == HalfFormat::q4_0_rot)
      return {false, "format_unsupported",
              "the CUDA latent kernel does not apply the rotated format's inverse transform; store the latent "
              "and RoPE key in an unrotated format (q4_0 instead of q4_0_rot), or run on the CPU engine",
              {}};
    const Capability c = supports(h, g);
    if (!c.ok) return {false, c.reason, c.detail, {}};
  }
  const DeviceStatus& d = device_status();
  if (d.available && d.cc_major < 9)
    return {false, "arch_unsupported",
            "kvgate's CUDA kernels are built for sm_90a (+ compute_90 PTX); device '" + d.name + "' is sm_" +
                std::to_string(d.cc_major) + std::to_string(d.cc_minor),
            {}};
  return {true, {}, {}, "mla(fp32)"};
}

namespace {

template <HF KF>
int mla_max_active(int smem) {
  int n = 0;
  auto k = detail::mla_decode_kernel<KF>;
  KVGATE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  KVGATE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, detail::kMlaWarps * 32, smem));
  return n;
}

}  // namespace

DecodePlan plan_mla_decode(const MlaDecodeArgs& a) {
  const OpSupport sup = supports_mla(a.format, a.kv_lora, a.rope, a.n_heads);
  if (!sup.ok) throw std::invalid_argument("kvgate::cuda::mla_decode_attention: " + sup.reason + ": " + sup.detail);
  DecodePlan p;
  p.path = sup.path;
  p.head_chunks = (a.n_heads + detail::kMlaHeadsPerCta - 1) / detail::kMlaHeadsPerCta;
  p.smem_bytes = detail::mla_smem_bytes(a.kv_lora, a.rope);
  int per_sm = 1;
  detail::dispatch_half(a.format.k, [&](auto kf) { per_sm = mla_max_active<decltype(kf)::value>(p.smem_bytes); });
  const DeviceStatus& dev = device_status();
  p.resident_ctas = std::max(1, per_sm) * std::max(1, dev.sm_count);
  const long base = static_cast<long>(std::max(1, a.rows)) * p.head_chunks;
  const int max_len = std::max(1, a.max_seq_len);
  // Splits: at least one resident wave of CTAs, each split at least 4 tiles (64 keys).
  constexpr int kMinTokens = 4 * detail::kMlaTile;
  const int max_splits = std::max(1, (max_len + kMinTokens - 1) / kMinTokens);
  p.splits = a.num_splits > 0 ? a.num_splits
                              : std::min(max_splits, static_cast<int>((p.resident_ctas + base - 1) / base));
  p.splits = std::max(1, std::min(p.splits, max_len));
  p.tokens_per_split = (max_len + p.splits - 1) / p.splits;
  p.tokens_per_split = (p.tokens_per_split + detail::kMlaTile - 1) / detail::kMlaTile * detail::kMlaTile;
  p.splits = (max_len + p.tokens_per_split - 1) / p.tokens_per_split;
  p.ctas = static_cast<int>(base * p.splits);
  p.workspace_bytes =
      static_cast<std::size_t>(std::max(1, a.rows)) * p.splits * a.n_heads * (a.kv_lora + 2) * sizeof(float);
  return p;
}

DecodePlan mla_decode_attention(const MlaDecodeArgs& a, DecodeWorkspace& ws, cudaStream_t stream) {
  return mla_decode_attention(a, plan_mla_decode(a), ws, stream);
}

DecodePlan mla_decode_attention(const MlaDecodeArgs& a, const DecodePlan& p, DecodeWorkspace& ws, cudaStream_t stream) {
  if (a.rows <= 0) return p;
  if (!(a.softmax_scale > 0))
    throw std::invalid_argument("kvgate::cuda::mla_decode_attention: softmax_scale must be > 0 (the model's "
                                "qk_head_dim^-0.5, never the latent width's)");
  if (a.max_seq_len > p.splits * p.tokens_per_split)
    throw std::invalid_argument("kvgate::cuda::mla_decode_attention: the plan covers " +
                                std::to_string(p.splits * p.tokens_per_split) + " keys, the call up to " +
                                std::to_string(a.max_seq_len));
  auto* base = static_cast<float*>(ws.reserve(p.workspace_bytes));
  detail::MlaLaunch L;
  L.k_pool = a.k_pool;
  L.v_pool = a.v_pool;
  L.k_page_stride = a.k_page_stride;
  L.v_page_stride = a.v_page_stride;
  L.block_tables = a.block_tables;
  L.table_stride = a.table_stride;
  L.seq_lens = a.seq_lens;
  L.q = a.q;
  L.part_o = base;
  L.part_ml = base + static_cast<std::size_t>(a.rows) * p.splits * a.n_heads * a.kv_lora;
  L.out = a.out;
  L.rows = a.rows;
  L.n_heads = a.n_heads;
  L.kv_lora = a.kv_lora;
  L.rope = a.rope;
  L.block_size = a.block_size;
  L.n_hchunks = p.head_chunks;
  L.splits = p.splits;
  L.tokens_per_split = p.tokens_per_split;
  L.rope_format = a.format.v;
  const float s_c = detail::applied_tensor_scale(a.format.k, a.k_scale);
  const float s_r = detail::applied_tensor_scale(a.format.v, a.v_scale);
  L.q_mul_lat = static_cast<float>(static_cast<double>(a.softmax_scale) * 1.4426950408889634 * s_c);
  L.q_mul_rope = static_cast<float>(static_cast<double>(a.softmax_scale) * 1.4426950408889634 * s_r);
  L.out_mul = s_c;
  L.bytes_read = a.bytes_read;
  if (a.bytes_read != nullptr) {  // one token's latent + RoPE key bytes (page_bytes / block_size: exact)
    const std::size_t B = static_cast<std::size_t>(a.block_size);
    std::size_t tb = kvgate::page_bytes(a.format.k, PageGeometry{a.block_size, 1, a.kv_lora}) / B;
    if (a.rope > 0) tb += kvgate::page_bytes(a.format.v, PageGeometry{a.block_size, 1, a.rope}) / B;
    L.token_bytes = static_cast<unsigned>(tb);
  }
  const dim3 grid(static_cast<unsigned>(p.head_chunks), static_cast<unsigned>(p.splits), static_cast<unsigned>(a.rows));
  detail::dispatch_half(a.format.k, [&](auto kf) {
    auto k = detail::mla_decode_kernel<decltype(kf)::value>;
    KVGATE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, p.smem_bytes));
    k<<<grid, detail::kMlaWarps * 32, p.smem_bytes, stream>>>(L);
  });
  KVGATE_CUDA_CHECK(cudaGetLastError());
  detail::mla_combine_kernel<<<dim3(static_cast<unsigned>(a.n_heads), static_cast<unsigned>(a.rows)), 128, 0, stream>>>(L);
  KVGATE_CUDA_CHECK(cudaGetLastError());
  return p;
}

}  // namespace kvgate::cuda
