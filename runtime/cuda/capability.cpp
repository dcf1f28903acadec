// The CUDA backend's capability hook for kvgate::resolve_kv (backend "cuda"): a half format is
// usable when every op of the backend (store, decode, prefill) supports it at the model's geometry. A
// refusal keeps supports_op's stable reason ("head_dim_unsupported", "row_too_large",
// "arch_unsupported", ...), so a fallback or a strict-mode error names why: nothing falls back
// silently. The query-head count is not part of the hook's signature; the GQA ratio is checked
// again by the decode op itself.
#include "kvgate/cuda/ops.hpp"
#include "kvgate/resolve.hpp"

#include <algorithm>
#include <span>
#include <string>
#include <vector>

namespace kvgate::cuda {

namespace {

Capability half_capability(HalfFormat h, const PageGeometry& g) {
  const KvFormat f{h, h};
  for (Op op : {Op::store, Op::decode, Op::prefill}) {
    const OpSupport s = supports_op(op, f, g, g.n_kv_heads);
    if (!s.ok) return {false, s.reason, s.detail};
  }
  return {};
}

}  // namespace

OpSupport supports_op(Op op, const StoreConfig& c, int n_heads) {
  // Scales per KV head (a [n_layers * n_kv_heads] table whose heads differ in some layer): the fp8
  // kernels take the layer's table (StoreRowsArgs::head_scales, DecodeArgs/PrefillArgs::k_/v_head_scales);
  // nvfp4's FP32 global scale is one per (layer, K|V), as on the CPU store.
  const std::size_t L = static_cast<std::size_t>(std::max(c.n_layers, 0));
  const std::size_t H = static_cast<std::size_t>(std::max(c.n_kv_heads, 1));
  for (int half = 0; half < 2; ++half) {
    const std::vector<float>& s = half == 0 ? c.k_scale : c.v_scale;
    const HalfFormat hf = half == 0 ? c.format.k : c.format.v;
    if (!info(hf).per_tensor_scale || hf == HalfFormat::fp8_e4m3 || hf == HalfFormat::fp8_e5m2 || H <= 1 || s.size() != L * H) continue;
    for (std::size_t l = 0; l < L; ++l)
      if (!uniform_heads(std::span<const float>(s).subspan(l * H, H)))
        return {false, "per_head_scales_unsupported",
                std::string("the ") + (half == 0 ? "K" : "V") + " half (" + std::string(name(hf)) + ") has scales that differ "
                    "across the KV heads of layer " + std::to_string(l) + ", but its FP32 global scale is one per (layer, "
                    "K|V): per-head scales apply to fp8_e4m3/fp8_e5m2 halves only; give one scale per layer for it",
                {}};
  }
  if (c.layout == KvLayout::mla_latent) {
    // The latent cache: each half is stored with its own row width (latent kv_lora, RoPE key rope);
    // attention over it is the latent kernel's (supports_mla), never decode's or prefill's.
    if (op != Op::store) return supports_mla(c.format, c.head_dim, c.half_geometry(KvHalf::V).head_dim, n_heads);
    for (KvHalf h : {KvHalf::K, KvHalf::V}) {
      const HalfFormat hf = h == KvHalf::K ? c.format.k : c.format.v;
      const OpSupport s = supports_op(op, KvFormat{hf, hf}, c.half_geometry(h), n_heads);
      if (!s.ok) return s;
    }
    return {true, {}, {}, "store"};
  }
  return supports_op(op, c.format, c.geometry(), n_heads);
}

void register_capability() { register_backend_capability("cuda", &half_capability); }

}  // namespace kvgate::cuda
