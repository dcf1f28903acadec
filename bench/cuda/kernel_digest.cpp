// Bit-exact fingerprint of the CUDA attention kernels: runs decode (planner splits, forced splits,
// sliding window) and prefill (full and windowed) for every K/V half-format pair at head_dim 8
// (generic kernels), 64, 128 and 256 on fixed pseudo-random inputs, and prints one FNV-1a 64 hash
// of the output bytes per (op, format pair, head_dim). Two builds whose listings are equal
// computed the same bits: the check that a kernel refactor kept its numerics exactly.
//
//   kernel_digest [--out FILE]      (FILE: the listing, written atomically; stdout otherwise)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/format.hpp"

namespace kc = kvgate::cuda;
using kvgate::HalfFormat;
using kvgate::KvFormat;
using kvgate::SeqId;

namespace {

std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// Deterministic N(0, 1)-ish values (sum of 4 uniforms, centred and scaled): the same on every host.
struct Lcg {
  std::uint64_t s;
  float uniform() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>((s >> 40) & 0xFFFFFF) / 16777216.0f;
  }
  float normal() { return (uniform() + uniform() + uniform() + uniform() - 2.0f) * 1.7320508f; }
};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct Dev {
  float* p = nullptr;
  explicit Dev(std::size_t n) { check(cudaMalloc(&p, n * 4), "cudaMalloc"); }
  ~Dev() { cudaFree(p); }
};

std::uint64_t download_hash(const float* d, std::size_t n) {
  std::vector<float> h(n);
  check(cudaDeviceSynchronize(), "sync");
  check(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost), "download");
  return fnv1a(h.data(), n * 4);
}

const HalfFormat kHalves[] = {HalfFormat::f32,      HalfFormat::f16,  HalfFormat::bf16, HalfFormat::int8,
                              HalfFormat::fp8_e4m3, HalfFormat::fp8_e5m2, HalfFormat::q8_0, HalfFormat::q4_0,
                              HalfFormat::q4_0_rot};

// One (format pair, head_dim): lines "op fmt D hash" appended to out.
void digest(const KvFormat& f, int D, std::ostream& out) {
  const int H = 2, group = 4, Hq = H * group, B = 16, HD = H * D;
  const std::vector<int> lens = {301, 37, 1};
  const std::string tag = f.name() + " D=" + std::to_string(D);
  const kvgate::PageGeometry g{B, H, D};
  if (!kvgate::supports(f.k, g).ok || !kvgate::supports(f.v, g).ok) {
    out << "unsupported " << tag << "\n";
    return;
  }
  kvgate::StoreConfig cfg;
  cfg.format = f;
  cfg.n_kv_heads = H;
  cfg.head_dim = D;
  cfg.block_size = B;
  cfg.n_blocks = 64;
  cfg.k_scale = {0.37f};
  cfg.v_scale = {0.0213f};
  kc::CudaKvStore store(cfg);
  Lcg r{0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(D) << 32) ^ static_cast<std::uint64_t>(f.k) * 131 ^
        static_cast<std::uint64_t>(f.v)};
  const SeqId decoy = store.create_sequence();  // pages of the tested sequences do not start at block 0
  store.extend(decoy, B + 3);
  std::vector<SeqId> seqs;
  for (int n : lens) {
    std::vector<float> k(static_cast<std::size_t>(n) * HD), v(k.size());
    for (auto& x : k) x = r.normal();
    for (auto& x : v) x = r.normal() * 0.5f;
    const SeqId id = store.create_sequence();
    store.extend(id, n);
    store.write_host(id, 0, 0, n, k.data(), HD, v.data(), HD);
    seqs.push_back(id);
  }
  const int batch = static_cast<int>(seqs.size());
  std::vector<float> q(static_cast<std::size_t>(batch) * Hq * D);
  for (auto& x : q) x = r.normal() * 1.5f;
  Dev dq(q.size()), dout(q.size());
  check(cudaMemcpy(dq.p, q.data(), q.size() * 4, cudaMemcpyHostToDevice), "upload q");
  kc::DecodeWorkspace ws;
  struct DecodeRun {
    const char* name;
    int splits, window;
  };
  for (const DecodeRun& dr : {DecodeRun{"decode", 0, 0}, DecodeRun{"decode_split1", 1, 0},
                              DecodeRun{"decode_split7", 7, 0}, DecodeRun{"decode_window", 0, 21}}) {
    check(cudaMemset(dout.p, 0xFF, q.size() * 4), "memset");
    const kc::DecodePlan plan = store.decode(seqs, 0, Hq, dq.p, dout.p, ws, 0.0f, dr.splits, nullptr, dr.window);
    out << dr.name << " " << tag << " " << plan.path << " " << std::hex << download_hash(dout.p, q.size()) << std::dec
        << "\n";
  }
  // Prefill: the last 96 positions of the 301-token sequence as one chunk (n_past = 205).
  const int n_new = 96, pos0 = lens[0] - n_new;
  std::vector<float> pq(static_cast<std::size_t>(n_new) * Hq * D);
  for (auto& x : pq) x = r.normal() * 1.5f;
  Dev dpq(pq.size()), dpo(pq.size());
  check(cudaMemcpy(dpq.p, pq.data(), pq.size() * 4, cudaMemcpyHostToDevice), "upload prefill q");
  for (int window : {0, 45}) {
    check(cudaMemset(dpo.p, 0xFF, pq.size() * 4), "memset");
    const std::string path = store.prefill(seqs[0], 0, Hq, pos0, n_new, dpq.p, dpo.p, 0.0f, nullptr, window);
    out << (window ? "prefill_window " : "prefill ") << tag << " " << path << " " << std::hex
        << download_hash(dpo.p, pq.size()) << std::dec << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) out_path = argv[++i];
    else {
      std::cerr << "usage: kernel_digest [--out FILE]\n";
      return 2;
    }
  }
  std::ostringstream out;
  try {
    for (int D : {8, 64, 128, 256})
      for (HalfFormat k : kHalves)
        for (HalfFormat v : kHalves) digest(KvFormat{k, v}, D, out);
  } catch (const std::exception& e) {
    std::cerr << "kernel_digest: " << e.what() << "\n";
    return 1;
  }
  if (out_path.empty()) {
    std::cout << out.str();
    return 0;
  }
  const std::string tmp = out_path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << out.str();
    if (!f) {
      std::cerr << "kernel_digest: cannot write " << tmp << "\n";
      return 1;
    }
  }
  std::filesystem::rename(tmp, out_path);
  return 0;
}
