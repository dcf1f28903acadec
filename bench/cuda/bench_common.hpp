// Shared by the standalone CUDA benchmarks (bench_decode_attn, bench_mla_decode, bench_e2e_decode):
// the CUDA error check that ends the run, the median they report, CUDA-event timing, the JSON number
// printer, comma-separated integer lists, the memory limits measured in the run, the document head
// (time, device, limits) and the atomic file write.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/util.hpp"

#define CK(expr)                                                                                              \
  do {                                                                                                        \
    const cudaError_t e_ = (expr);                                                                            \
    if (e_ != cudaSuccess) {                                                                                  \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #expr); \
      std::exit(2);                                                                                           \
    }                                                                                                         \
  } while (0)

namespace kvgate::bench {

// Seconds since the program started (the first use of bench_clock_start).
inline const std::chrono::steady_clock::time_point bench_clock_start = std::chrono::steady_clock::now();
inline double elapsed_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - bench_clock_start).count();
}
// A progress line with the UTC time and the seconds since the start, flushed (a run cut short still
// says how far it got).
__attribute__((format(printf, 1, 2))) inline void progress(const char* fmt, ...) {
  const std::time_t now = std::time(nullptr);
  char utc[16];
  std::strftime(utc, sizeof utc, "%H:%M:%S", std::gmtime(&now));
  std::printf("[%s +%.1fs] ", utc, elapsed_s());
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::printf("\n");
  std::fflush(stdout);
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Elapsed time between two events recorded on a stream.
struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  void start(cudaStream_t s) { CK(cudaEventRecord(a, s)); }
  double stop_ms(cudaStream_t s) {
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
  }
};

// The device a benchmark runs on, printed (name, SMs, memory, driver and runtime versions); null after
// printing "SKIPPED: <reason>" when there is none (the caller exits 0).
inline const kvgate::cuda::DeviceStatus* device_or_skip() {
  const kvgate::cuda::DeviceStatus& dev = kvgate::cuda::device_status();
  if (!dev.available) {
    std::printf("SKIPPED: %s\n", dev.reason.c_str());
    return nullptr;
  }
  std::printf("device: %s (sm_%d%d, %d SMs, %.1f GiB), driver %s, runtime %s\n", dev.name.c_str(), dev.cc_major,
              dev.cc_minor, dev.sm_count, dev.total_mem / 1073741824.0,
              kvgate::cuda::cuda_version_string(dev.driver_version).c_str(),
              kvgate::cuda::cuda_version_string(dev.runtime_version).c_str());
  return &dev;
}

// A JSON number ("null" for NaN/Inf).
inline std::string jnum(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

inline std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) v.push_back(std::stoi(tok));
  return v;
}

// The physical limits every benchmark reports against, measured in its own run: a 4 GiB
// device-to-device copy (bytes read + written, median of 10 after 3 warm-ups) and the read-only probe
// (kvgate/cuda/util.hpp read_probe).
struct MemoryLimits {
  double copy_GBps = 0, read_GBps = 0;
};
inline MemoryLimits measure_memory_limits(int sm_count, cudaStream_t st) {
  const std::size_t bytes = std::size_t{4} << 30;
  void *src = nullptr, *dst = nullptr;
  unsigned* sink = nullptr;
  CK(cudaMalloc(&src, bytes));
  CK(cudaMalloc(&dst, bytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemsetAsync(src, 0x5A, bytes, st));
  Timer tm;
  std::vector<double> cms, rms;
  for (int i = 0; i < 3; ++i) CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
  for (int i = 0; i < 10; ++i) {
    tm.start(st);
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
    cms.push_back(tm.stop_ms(st));
  }
  for (int i = 0; i < 3; ++i) kvgate::cuda::read_probe(src, bytes, sink, sm_count, st);
  for (int i = 0; i < 10; ++i) {
    tm.start(st);
    kvgate::cuda::read_probe(i % 2 ? src : dst, bytes, sink, sm_count, st);
    rms.push_back(tm.stop_ms(st));
  }
  MemoryLimits m;
  m.copy_GBps = 2.0 * bytes / (median(cms) * 1e-3) / 1e9;  // bytes read + bytes written
  m.read_GBps = 1.0 * bytes / (median(rms) * 1e-3) / 1e9;
  CK(cudaFree(src));
  CK(cudaFree(dst));
  CK(cudaFree(sink));
  std::printf("copy D2D (read+write counted): %.0f GB/s   read-only probe: %.0f GB/s\n", m.copy_GBps, m.read_GBps);
  return m;
}

// What a bandwidth benchmark starts from: its device (printed by device_or_skip; null when there is
// none: the caller exits 0), a non-blocking stream, and the memory limits measured on it in this run.
struct BenchDevice {
  const kvgate::cuda::DeviceStatus* dev = nullptr;
  cudaStream_t stream = nullptr;
  MemoryLimits lim;
};
inline BenchDevice open_bench_device() {
  BenchDevice b;
  b.dev = device_or_skip();
  if (!b.dev) return b;
  CK(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
  b.lim = measure_memory_limits(b.dev->sm_count, b.stream);
  return b;
}

// The head members of a benchmark document, as JSON text ending in ",\n": schema, UTC time of the
// write, the device (name, compute capability, SMs, memory, L2, driver and runtime CUDA) and the
// limits measured in the run.
inline std::string document_head(const std::string& schema, const kvgate::cuda::DeviceStatus& dev, const MemoryLimits& lim) {
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::ostringstream o;
  o << "  \"schema\": \"" << schema << "\",\n  \"when\": \"" << when << "\",\n"
    << "  \"device\": {\"name\": \"" << dev.name << "\", \"cc\": \"" << dev.cc_major << "." << dev.cc_minor
    << "\", \"sms\": " << dev.sm_count << ", \"memory_bytes\": " << dev.total_mem << ", \"l2_bytes\": " << dev.l2_bytes
    << ", \"driver_cuda\": \"" << kvgate::cuda::cuda_version_string(dev.driver_version) << "\", \"runtime_cuda\": \""
    << kvgate::cuda::cuda_version_string(dev.runtime_version) << "\"},\n"
    << "  \"limits\": {\"copy_d2d_GBps\": " << jnum(lim.copy_GBps)
    << ", \"copy_note\": \"cudaMemcpy D2D of 4 GiB, bytes read + written\", "
    << "\"read_probe_GBps\": " << jnum(lim.read_GBps) << "},\n";
  return o.str();
}

// `text` to `path` through a temporary file beside it, renamed over it: a reader never sees half a
// file. Exits 2 naming the file when it cannot be written.
inline void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) {
      std::fprintf(stderr, "cannot write '%s' (the output directory must exist and be writable)\n", tmp.c_str());
      std::exit(2);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::fprintf(stderr, "cannot rename '%s' to '%s': %s\n", tmp.c_str(), path.c_str(), ec.message().c_str());
    std::exit(2);
  }
}

}  // namespace kvgate::bench
