// Thin instantiation: decode attention kernels with K stored as q8_0, every V half format,
// head_dim in {generic, 64, 128, 256}.
#include "kernels/decode_launch.cuh"

namespace kvgate::cuda::detail {
KVGATE_DECODE_INST_K(HF::q8_0)
}  // namespace kvgate::cuda::detail
