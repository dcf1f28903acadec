// Shared by the standalone CUDA benchmarks (bench_decode_attn, bench_e2e_decode): the CUDA error
// check that ends the run, and the median they report.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(expr)                                                                                              \
  do {                                                                                                        \
    const cudaError_t e_ = (expr);                                                                            \
    if (e_ != cudaSuccess) {                                                                                  \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #expr); \
      std::exit(2);                                                                                           \
    }                                                                                                         \
  } while (0)

namespace kvgate::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace kvgate::bench
