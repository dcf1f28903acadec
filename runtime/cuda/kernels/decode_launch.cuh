// Launchers of the decode kernels: generic (D == 0), tensor-core (both halves narrow, D in
// {64, 128, 256}) or CUDA-core fast path; explicitly instantiated one K half format per file.
#pragma once
#include "decode_mma.cuh"

namespace kvgate::cuda::detail {

// Launcher definitions (explicitly instantiated in decode_k_<fmt>.cu, one file per K half format).
template <HF KF, HF VF, int D>
void launch_decode(const DecodeLaunch& a, int smem_bytes, cudaStream_t stream) {
  // The fast and tensor-core kernels give each warp one KV head (kDecodeWarps heads per CTA).
  const int head_ctas = D != 0 ? (a.n_kv_heads + kDecodeWarps - 1) / kDecodeWarps : a.n_kv_heads;
  const dim3 grid(head_ctas * a.n_hchunks, a.splits, a.batch);
  if constexpr (D == 0) {
    auto k = decode_generic_kernel<KF, VF>;
    static int smem_set = -1;  // the attribute is per kernel: set it once per size
    if (smem_set != smem_bytes) {
      KVGATE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
      smem_set = smem_bytes;
    }
    k<<<grid, kDecodeWarps * 32, smem_bytes, stream>>>(a);
  } else if constexpr (use_mma<KF, VF, D>()) {
    auto k = decode_mma_kernel<KF, VF, D>;
    static int smem_set = -1;
    if (smem_set != smem_bytes) {
      KVGATE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
      smem_set = smem_bytes;
    }
    k<<<grid, kDecodeWarps * 32, smem_bytes, stream>>>(a);
  } else {
    auto k = decode_fast_kernel<KF, VF, D>;
    static int smem_set = -1;
    if (smem_set != smem_bytes) {
      KVGATE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
      smem_set = smem_bytes;
    }
    k<<<grid, kDecodeWarps * 32, smem_bytes, stream>>>(a);
  }
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

template <HF KF, HF VF, int D>
int decode_max_active(int smem_bytes) {
  int n = 0;
  if constexpr (D == 0) {
    auto k = decode_generic_kernel<KF, VF>;
    KVGATE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    KVGATE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kDecodeWarps * 32, smem_bytes));
  } else if constexpr (use_mma<KF, VF, D>()) {
    auto k = decode_mma_kernel<KF, VF, D>;
    KVGATE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    KVGATE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kDecodeWarps * 32, smem_bytes));
  } else {
    auto k = decode_fast_kernel<KF, VF, D>;
    KVGATE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    KVGATE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kDecodeWarps * 32, smem_bytes));
  }
  return n;
}

// One file per K half format instantiates every V half format x {generic, 64, 128, 256}.
#define KVGATE_DECODE_INST_KV(KF, VF)                                                       \
  template void launch_decode<KF, VF, 0>(const DecodeLaunch&, int, cudaStream_t); \
  template int decode_max_active<KF, VF, 0>(int); \
  template void launch_decode<KF, VF, 64>(const DecodeLaunch&, int, cudaStream_t); \
  template int decode_max_active<KF, VF, 64>(int); \
  template void launch_decode<KF, VF, 128>(const DecodeLaunch&, int, cudaStream_t); \
  template int decode_max_active<KF, VF, 128>(int); \
  template void launch_decode<KF, VF, 256>(const DecodeLaunch&, int, cudaStream_t); \
  template int decode_max_active<KF, VF, 256>(int);
#define KVGATE_DECODE_INST_K(KF)                                                            \
  KVGATE_DECODE_INST_KV(KF, HF::f32)                                                        \
  KVGATE_DECODE_INST_KV(KF, HF::f16)                                                        \
  KVGATE_DECODE_INST_KV(KF, HF::bf16)                                                       \
  KVGATE_DECODE_INST_KV(KF, HF::int8)                                                       \
  KVGATE_DECODE_INST_KV(KF, HF::fp8_e4m3)                                                   \
  KVGATE_DECODE_INST_KV(KF, HF::fp8_e5m2)                                                   \
  KVGATE_DECODE_INST_KV(KF, HF::q8_0)                                                       \
  KVGATE_DECODE_INST_KV(KF, HF::q4_0)                                                       \
  KVGATE_DECODE_INST_KV(KF, HF::q4_0_rot)

}  // namespace kvgate::cuda::detail
