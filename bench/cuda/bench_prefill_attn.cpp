// GPU prefill-attention benchmark: causal attention of one chunk of n tokens from position 0 over the
// paged store (CudaKvStore::prefill), Llama-3-8B attention shape (32 query heads, 8 KV heads,
// head_dim 128, pages of 16 tokens, batch 1), per KV format, timed with CUDA events (median of
// --reps calls after one warm-up call). TFLOP/s counts the causal work as FlashAttention does:
// 4 * n^2 / 2 * n_heads * head_dim (two matmuls, half the square). The PyTorch peer
// (peer_sdpa_prefill.py) uses the same count; assess_prefill.py puts both next to the bars.
// Writes one JSON document (schema "kvgate.bench.cuda_prefill/1") with the GPU, driver and CUDA.
//
//   bench_prefill_attn [--out FILE] [--contexts 4096,8192,32768] [--formats bf16,int8,...] [--reps N]
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/cuda/util.hpp"
#include "kvgate/format.hpp"

namespace kc = kvgate::cuda;
using kvgate::KvFormat;

namespace {
std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string t;
  while (std::getline(ss, t, ',')) v.push_back(t);
  return v;
}
std::string jnum(double x) {
  if (!std::isfinite(x)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", x);
  return b;
}
}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "bench_prefill_attn.json";
  std::vector<std::string> ctxs = {"4096", "8192", "32768"};
  std::vector<std::string> formats;  // default: every preset without an f32 half (the tensor-core kernel's)
  for (const kvgate::Preset& p : kvgate::presets())
    if (p.fmt.k != kvgate::HalfFormat::f32 && p.fmt.v != kvgate::HalfFormat::f32) formats.emplace_back(p.name);
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_prefill_attn: %s needs a value\n", a.c_str());
        std::exit(1);
      }
      return argv[++i];
    };
    if (a == "--out") out_path = next();
    else if (a == "--contexts") ctxs = split(next());
    else if (a == "--formats") formats = split(next());
    else if (a == "--reps") reps = std::stoi(next());
    else {
      std::fprintf(stderr, "bench_prefill_attn: unknown argument '%s' (see the header of bench_prefill_attn.cpp)\n",
                   a.c_str());
      return 1;
    }
  }
  const kc::DeviceStatus& dev = kc::device_status();
  if (!dev.available) {
    std::fprintf(stderr, "bench_prefill_attn: %s\n", dev.reason.c_str());
    return 2;
  }
  std::printf("device: %s (sm_%d%d, %d SMs), driver %s, runtime %s\n", dev.name.c_str(), dev.cc_major, dev.cc_minor,
              dev.sm_count, kc::cuda_version_string(dev.driver_version).c_str(),
              kc::cuda_version_string(dev.runtime_version).c_str());
  const int Hq = 32, H = 8, D = 128, B = 16;
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::ostringstream res;
  bool first = true;
  for (const std::string& fname : formats) {
    const auto f = kvgate::parse_kv_format(fname);
    if (!f) {
      std::fprintf(stderr, "bench_prefill_attn: --formats: unknown format '%s'\n", fname.c_str());
      return 1;
    }
    for (const std::string& cs : ctxs) {
      const int n = std::stoi(cs);
      kvgate::StoreConfig cfg;
      cfg.format = *f;
      cfg.n_kv_heads = H;
      cfg.head_dim = D;
      cfg.block_size = B;
      cfg.n_blocks = (n + B - 1) / B + 8;
      cfg.k_scale = {0.37f};
      cfg.v_scale = {0.0213f};
      kc::CudaKvStore store(cfg);
      // A decoy sequence first, then the pages of the measured one shuffled (as a real pool is).
      const kvgate::SeqId decoy = store.create_sequence();
      store.extend(decoy, 8 * B);
      const kvgate::SeqId s = store.create_sequence();
      store.extend(s, n);
      float *dk, *dv, *dq, *dout;
      const std::size_t rows = static_cast<std::size_t>(n) * H * D, qn = static_cast<std::size_t>(n) * Hq * D;
      CK(cudaMalloc(&dk, rows * 4));
      CK(cudaMalloc(&dv, rows * 4));
      CK(cudaMalloc(&dq, qn * 4));
      CK(cudaMalloc(&dout, qn * 4));
      kc::fill_random(dk, rows, 11, 1.0f, st);
      kc::fill_random(dv, rows, 12, 0.05f, st);
      kc::fill_random(dq, qn, 13, 1.0f, st);
      store.write(s, 0, 0, n, dk, static_cast<std::size_t>(H) * D, dv, static_cast<std::size_t>(H) * D, st);
      CK(cudaStreamSynchronize(st));
      const kvgate::PageGeometry g{B, H, D};
      const std::string path = kc::supports_op(kc::Op::prefill, *f, g, Hq).path;
      const double flops = 4.0 * double(n) * double(n) / 2.0 * Hq * D;
      std::vector<double> ms;
      for (int r = 0; r <= reps; ++r) {
        CK(cudaEventRecord(e0, st));
        store.prefill(s, 0, Hq, 0, n, dq, dout, 0.0f, st);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float t = 0;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (r > 0) ms.push_back(t);  // the first call warms up (smem attribute, caches)
      }
      const double t_ms = kvgate::bench::median(ms);
      const double tflops = flops / (t_ms * 1e-3) / 1e12;
      std::printf("%-10s n=%6d  %-20s %9.3f ms  %7.1f TFLOP/s\n", fname.c_str(), n, path.c_str(), t_ms, tflops);
      res << (first ? "" : ",\n") << "    {\"format\": \"" << fname << "\", \"n\": " << n << ", \"path\": \"" << path
          << "\", \"time_ms\": " << jnum(t_ms) << ", \"tflops\": " << jnum(tflops) << ", \"flops\": " << jnum(flops)
          << ", \"timed_runs\": " << ms.size() << "}";
      first = false;
      CK(cudaFree(dk));
      CK(cudaFree(dv));
      CK(cudaFree(dq));
      CK(cudaFree(dout));
    }
  }
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::ofstream o(out_path + ".tmp");
  o << "{\n  \"schema\": \"kvgate.bench.cuda_prefill/1\",\n  \"when\": \"" << when << "\",\n"
    << "  \"device\": {\"name\": \"" << dev.name << "\", \"cc\": \"" << dev.cc_major << "." << dev.cc_minor
    << "\", \"sms\": " << dev.sm_count << ", \"driver_cuda\": \"" << kc::cuda_version_string(dev.driver_version)
    << "\", \"runtime_cuda\": \"" << kc::cuda_version_string(dev.runtime_version) << "\"},\n"
    << "  \"shape\": {\"n_heads\": " << Hq << ", \"n_kv_heads\": " << H << ", \"head_dim\": " << D << ", \"block_size\": " << B
    << ", \"batch\": 1, \"causal\": true, \"flops\": \"4 * n^2 / 2 * n_heads * head_dim\", "
    << "\"timing\": \"CUDA events around CudaKvStore::prefill, median\"},\n"
    << "  \"prefill\": [\n" << res.str() << "\n  ]\n}\n";
  o.close();
  std::rename((out_path + ".tmp").c_str(), out_path.c_str());
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
