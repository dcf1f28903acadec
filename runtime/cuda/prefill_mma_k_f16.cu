// Thin instantiation: tensor-core prefill kernels with K stored as f16, every V half format the
// kernel reads (all but f32), head_dim 64, 128, 256.
#include "kernels/prefill_mma.cuh"

namespace kvgate::cuda::detail {
KVGATE_PMMA_INST_K(HF::f16)
}  // namespace kvgate::cuda::detail
