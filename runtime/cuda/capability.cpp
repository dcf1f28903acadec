// The CUDA backend's capability hook for kvgate::resolve_kv (backend "cuda"): a half format is
// usable when every op of the backend (store, decode, prefill) supports it at the model's geometry. A
// refusal keeps supports_op's stable reason ("head_dim_unsupported", "row_too_large",
// "arch_unsupported", ...), so a fallback or a strict-mode error names why: nothing falls back
// silently. The query-head count is not part of the hook's signature; the GQA ratio is checked
// again by the decode op itself.
#include "kvgate/cuda/ops.hpp"
#include "kvgate/resolve.hpp"

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

std::vector<float> per_layer_scales(const std::vector<float>& s, int n_layers, int n_kv_heads) {
  const std::size_t L = static_cast<std::size_t>(n_layers), H = static_cast<std::size_t>(n_kv_heads);
  if (H <= 1 || s.size() != L * H) return s;
  std::vector<float> out;
  for (std::size_t l = 0; l < L; ++l) {
    const std::span<const float> heads(s.data() + l * H, H);
    if (!uniform_heads(heads)) return s;
    out.push_back(heads[0]);
  }
  return out;
}

OpSupport supports_op(Op op, const StoreConfig& c, int n_heads) {
  for (int half = 0; half < 2; ++half) {
    const std::vector<float>& s = half == 0 ? c.k_scale : c.v_scale;
    const HalfFormat hf = half == 0 ? c.format.k : c.format.v;
    if (!info(hf).per_tensor_scale) continue;  // a half that reads no scale runs whatever the list holds
    const std::vector<float> per_layer = per_layer_scales(s, c.n_layers, c.n_kv_heads);
    if (c.n_kv_heads > 1 && per_layer.size() == static_cast<std::size_t>(c.n_layers) * static_cast<std::size_t>(c.n_kv_heads))
      return {false, "per_head_scales_unsupported",
              std::string("the ") + (half == 0 ? "K" : "V") + " half (" + std::string(name(hf)) +
                  ") has scales that differ across the KV heads of a layer; the CUDA kernels take one scale per "
                  "(layer, K|V): run it on the CPU backend (--device cpu), or give one scale per layer",
              {}};
  }
  return supports_op(op, c.format, c.geometry(), n_heads);
}

void register_capability() { register_backend_capability("cuda", &half_capability); }

}  // namespace kvgate::cuda
