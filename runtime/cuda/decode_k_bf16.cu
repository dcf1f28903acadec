// Thin instantiation: decode attention kernels with K stored as bf16, every V half format,
// head_dim in {generic, 64, 128, 256}.
#include "kernels/decode_launch.cuh"

namespace kvgate::cuda::detail {
KVGATE_DECODE_INST_K(HF::bf16)
}  // namespace kvgate::cuda::detail
