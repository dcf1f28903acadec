#include "kvgate/cuda/device.hpp"

#include <cuda_runtime_api.h>

#include <cmath>
#include <map>
#include <mutex>

#include "kernels/common.cuh"

namespace kvgate::cuda {

std::string cuda_version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

const DeviceStatus& device_status() {
  static std::mutex mu;
  static std::map<int, DeviceStatus> cache;
  std::lock_guard<std::mutex> lock(mu);
  int dev = 0;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    auto& s = cache[-1];
    s = DeviceStatus{};
    s.reason = std::string("no CUDA device: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount returned 0");
    cudaDriverGetVersion(&s.driver_version);
    cudaRuntimeGetVersion(&s.runtime_version);
    return s;
  }
  if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
  auto it = cache.find(dev);
  if (it != cache.end()) return it->second;
  DeviceStatus s;
  cudaDeviceProp p{};
  const cudaError_t pe = cudaGetDeviceProperties(&p, dev);
  if (pe != cudaSuccess) {
    s.reason = std::string("no CUDA device: ") + cudaGetErrorString(pe);
    return cache[dev] = s;
  }
  s.available = true;
  s.device = dev;
  s.name = p.name;
  s.cc_major = p.major;
  s.cc_minor = p.minor;
  s.sm_count = p.multiProcessorCount;
  s.total_mem = p.totalGlobalMem;
  s.l2_bytes = static_cast<std::size_t>(p.l2CacheSize);
  cudaDriverGetVersion(&s.driver_version);
  cudaRuntimeGetVersion(&s.runtime_version);
  return cache[dev] = s;
}

namespace detail {
float hadamard_scale(int n) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))); }
float softcap_base2(float cap, const char* op) {
  if (!(cap >= 0.0f) || !std::isfinite(cap))
    throw std::invalid_argument(std::string("kvgate::cuda::") + op + ": softcap must be finite and >= 0 (got " +
                                std::to_string(cap) + "; 0 means none)");
  return cap > 0.0f ? static_cast<float>(static_cast<double>(cap) * 1.4426950408889634) : 0.0f;
}
const float* applied_head_scales(HF f, const float* heads, const char* op) {
  if (!heads || !kvgate::info(f).per_tensor_scale) return nullptr;
  if (is_fp8(f)) return heads;
  throw std::invalid_argument(std::string("kvgate::cuda::") + op + ": per_head_scales_unsupported: the " +
                              std::string(kvgate::name(f)) +
                              " half keeps one global scale per (layer, K|V); pass its tensor scale, not a per-head table");
}
}  // namespace detail

}  // namespace kvgate::cuda
