// Small device utilities used by the CUDA gates and benchmarks.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kvgate::cuda {

// x[i] = deterministic bell-shaped pseudo-random values (unit variance * scale), a function of
// (seed, i) only.
void fill_random(float* d_x, std::size_t n, std::uint64_t seed, float scale, cudaStream_t stream = nullptr);

// Streams `bytes` (a multiple of 16) through the SMs once with 16-byte loads and nothing written
// back: the device's read bandwidth ceiling, measured next to the copy bandwidth in the benchmarks.
void read_probe(const void* d_x, std::size_t bytes, unsigned* d_sink, int num_sms, cudaStream_t stream = nullptr);

// A kernel of `ctas` x `threads` that does nothing: the launch floor of a benchmark (what a launch
// and its grid's scheduling cost with no work, e.g. in a CUDA graph of dependent launches).
void launch_empty(int ctas, int threads, cudaStream_t stream = nullptr);

}  // namespace kvgate::cuda
