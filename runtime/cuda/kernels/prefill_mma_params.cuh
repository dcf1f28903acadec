// Parameters and compile-time configuration of the tensor-core prefill kernel, visible to the
// dispatch code (prefill_mma.cu) without instantiating any kernel (kernels/prefill_mma.cuh holds
// them; prefill_mma_k_<fmt>.cu instantiate them one K half format per file).
#pragma once
#include "prefill.cuh"

namespace kvgate::cuda::detail {

inline constexpr int kPmmaWarps = 4;
inline constexpr int kPmmaThreads = kPmmaWarps * 32;
inline constexpr int kPmmaRows = 16 * kPmmaWarps;  // 64 query rows per CTA, as kPrefillRows

// Halves the MMA kernel reads: every stored format except f32 (an f32 store asks for FP32
// attention; those pairs stay on the CUDA-core kernel).
KVGATE_HD constexpr bool pmma_half(HF f) { return f != HF::f32; }
KVGATE_HD constexpr bool pmma_head_dim(int d) { return d == 64 || d == 128 || d == 256; }

struct PmmaLaunch {
  PrefillLaunch p;  // the CUDA-core kernel's parameters (same tiling of rows)
  int n_qtiles = 1;
};

// Defined in prefill_mma.cuh, explicitly instantiated in prefill_mma_k_<fmt>.cu.
template <HF KF, HF VF, int D>
void launch_prefill_mma(const PmmaLaunch& L, cudaStream_t stream);

}  // namespace kvgate::cuda::detail
