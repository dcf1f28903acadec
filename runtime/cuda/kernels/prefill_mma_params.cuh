// Parameters and compile-time configuration of the tensor-core prefill kernel, visible to the
// dispatch code (prefill_mma.cu) without instantiating any kernel (kernels/prefill_mma.cuh holds
// them; the prefill_mma_k_<fmt>.cu that runtime/cuda/CMakeLists.txt generates instantiate them
// one K half format per file).
#pragma once
#include "prefill.cuh"

namespace kvgate::cuda::detail {

inline constexpr int kPmmaWarps = 8;
inline constexpr int kPmmaThreads = kPmmaWarps * 32;
inline constexpr int kPmmaRows = 16 * kPmmaWarps;  // 128 query rows per CTA (the CUDA-core kernel: 64)

// Halves the MMA kernel reads: every stored format except f32 (an f32 store asks for FP32
// attention; those pairs stay on the CUDA-core kernel): the rows of KVGATE_HALF_FORMATS marked mma.
#define KVGATE_PMMA_IS_mma true
#define KVGATE_PMMA_IS_none false
#define KVGATE_PMMA_HALF_ROW(A, name, prefill_mma) \
  if (f == HF::name) return KVGATE_PMMA_IS_##prefill_mma;
KVGATE_HD constexpr bool pmma_half(HF f) {
  KVGATE_HALF_FORMATS(KVGATE_PMMA_HALF_ROW, _)
  return false;
}
#undef KVGATE_PMMA_HALF_ROW
KVGATE_HD constexpr bool pmma_head_dim(int d) { return d == 64 || d == 128 || d == 256; }

struct PmmaLaunch {
  PrefillLaunch p;  // the CUDA-core kernel's parameters (same tiling of rows)
  int n_qtiles = 1;
};

// Defined in prefill_mma.cuh, explicitly instantiated in prefill_mma_k_<fmt>.cu.
template <HF KF, HF VF, int D>
void launch_prefill_mma(const PmmaLaunch& L, cudaStream_t stream);

}  // namespace kvgate::cuda::detail
