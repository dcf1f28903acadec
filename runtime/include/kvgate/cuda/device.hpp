// CUDA device discovery for the kvgate CUDA backend (library kvgate::cuda). Never throws: a
// machine without a device (CI) gets available = false and a reason to print.
#pragma once
#include <cstddef>
#include <string>

namespace kvgate::cuda {

struct DeviceStatus {
  bool available = false;
  std::string reason;  // when unavailable: "no CUDA device: <cudaGetErrorString>"
  int device = -1;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  std::size_t total_mem = 0;
  std::size_t l2_bytes = 0;
  int driver_version = 0;   // cudaDriverGetVersion, e.g. 13000
  int runtime_version = 0;  // cudaRuntimeGetVersion of the (static) runtime linked in
};

// Status of the current device (device 0 unless the caller selected another). Cached after the
// first call per device.
const DeviceStatus& device_status();

// "13.0" from 13000.
std::string cuda_version_string(int v);

}  // namespace kvgate::cuda
