// Shared by the sources of gate_cuda: the skip rule without a device, a device float buffer, the
// oracle's name of a half format and a first-differing-byte report for page comparisons.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/format.hpp"
#include "kvgate_oracle/formats.hpp"

// Every [cuda] case starts with this: without a device it prints "SKIPPED: no CUDA device: ..." and
// returns, so gate_cuda exits 0 on CPU-only CI while the message keeps the skip visible.
#define KVGATE_REQUIRE_DEVICE_OR_SKIP()                                        \
  do {                                                                         \
    const kvgate::cuda::DeviceStatus& st_ = kvgate::cuda::device_status();     \
    if (!st_.available) {                                                      \
      WARN("SKIPPED: " << st_.reason);                                         \
      return;                                                                  \
    }                                                                          \
  } while (0)

namespace kvgate::gates::cuda_gate {

inline kvgate_oracle::Half oracle_half(HalfFormat f) {
  const auto h = kvgate_oracle::parse_half(name(f));
  REQUIRE(h.has_value());
  return *h;
}

inline std::string first_diff(const std::uint8_t* a, const std::uint8_t* b, std::size_t n, const char* an,
                              const char* bn) {
  for (std::size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) {
      std::ostringstream o;
      o << "first differing byte at page offset " << i << ": " << an << " 0x" << std::hex << int(a[i]) << " " << bn
        << " 0x" << int(b[i]);
      return o.str();
    }
  return "identical";
}

// n floats of device memory (RAII). put/get copy whole buffers; put waits for the device, because a
// pageable cudaMemcpy may return before its DMA lands and a kernel on a non-blocking stream does
// not order after the legacy stream.
struct DevFloats {
  float* p = nullptr;
  std::size_t n = 0;
  explicit DevFloats(std::size_t n_) : n(n_) {
    REQUIRE(cudaMalloc(&p, std::max<std::size_t>(1, n) * sizeof(float)) == cudaSuccess);
  }
  ~DevFloats() { cudaFree(p); }
  DevFloats(const DevFloats&) = delete;
  DevFloats& operator=(const DevFloats&) = delete;
  void put(const std::vector<float>& h) {
    REQUIRE(h.size() == n);
    REQUIRE(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  std::vector<float> get() const {
    std::vector<float> h(n);
    REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
};

}  // namespace kvgate::gates::cuda_gate
