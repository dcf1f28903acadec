// The CUDA backend's capability hook for kvgate::resolve_kv (backend "cuda"): a half format is
// usable when every op of the backend (store, decode, prefill) supports it at the model's geometry. A
// refusal keeps supports_op's stable reason ("head_dim_unsupported", "row_too_large",
// "arch_unsupported", ...), so a fallback or a strict-mode error names why: nothing falls back
// silently. The query-head count is not part of the hook's signature; the GQA ratio is checked
// again by the decode op itself.
#include "kvgate/cuda/ops.hpp"
#include "kvgate/resolve.hpp"

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

void register_capability() { register_backend_capability("cuda", &half_capability); }

}  // namespace kvgate::cuda
