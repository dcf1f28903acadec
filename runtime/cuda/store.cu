// Op: quantize + append rows into the paged store (every half format, one template).
#include "kernels/store.cuh"
#include "kvgate/cuda/ops.hpp"

namespace kvgate::cuda {

void store_rows(HalfFormat f, const PageGeometry& g, const StoreRowsArgs& a, cudaStream_t stream) {
  const OpSupport sup = supports_op(Op::store, KvFormat{f, f}, g);
  if (!sup.ok) throw std::invalid_argument("kvgate::cuda::store_rows: " + sup.reason + ": " + sup.detail);
  if (a.n_tokens <= 0) return;
  detail::StoreLaunch L;
  L.rows = a.rows;
  L.row_stride = a.row_stride;
  L.slot_mapping = a.slot_mapping;
  L.n_tokens = a.n_tokens;
  L.pool = a.pool;
  L.page_stride = a.page_stride;
  L.block_size = g.block_size;
  L.n_kv_heads = g.n_kv_heads;
  L.head_dim = g.head_dim;
  L.tensor_scale = a.tensor_scale;
  L.head_scales = detail::applied_head_scales(f, a.head_scales, "store_rows");
  L.had_c = detail::hadamard_scale(g.head_dim);
  // Every format but the element-wise ones (f32, f16, bf16, fp8 per tensor) stages the row in shared memory.
  const bool staged = f != HalfFormat::f32 && f != HalfFormat::f16 && f != HalfFormat::bf16 && f != HalfFormat::fp8_e4m3 &&
                      f != HalfFormat::fp8_e5m2;
  const int smem = staged ? g.row_elems() * static_cast<int>(sizeof(float)) : 0;
  detail::dispatch_half(f, [&](auto F) {
    auto k = detail::store_kernel<decltype(F)::value>;
    if (smem > 48 * 1024)
      KVGATE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    k<<<a.n_tokens, 256, smem, stream>>>(L);
  });
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvgate::cuda
