// Shared by the sources of gate_cuda: the skip rule without a device, a device float buffer, the
// oracle's name of a half format, a first-differing-byte report for page comparisons, a KV file's
// verified bytes, a bitwise comparison of float vectors and a latent (MLA) store's config.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include "catch_compat.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/kv_file.hpp"
#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/format.hpp"
#include "kvgate_oracle/formats.hpp"
#include "oracle_fixtures.hpp"
#include "store_harness.hpp"

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

// The bytes of a KV file, after read_kv_file has verified its structure and checksums.
inline std::vector<std::uint8_t> file_bytes(const std::string& path) {
  const KvFile f = read_kv_file(path);
  REQUIRE(f.file_bytes > kKvFileHeaderBytes);
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The bytes of a saved KV file after two checks of what it holds: `tokens` positions in its header
// and a body that is not all zeros (anti-vacuity: byte comparisons against an empty save prove
// nothing). The persistence gates' reference files go through it.
inline std::vector<std::uint8_t> saved_file_bytes(const std::string& path, int tokens) {
  const KvFile kf = read_kv_file(path);
  CHECK(kf.header.used_tokens == tokens);
  CHECK(std::any_of(kf.body.begin(), kf.body.end(), [](std::uint8_t x) { return x != 0; }));  // anti-vacuity
  return file_bytes(path);
}

// Two float vectors equal bit for bit (NaN payloads and signed zeros included).
inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

using gates::oracle_half;  // gates/common/oracle_fixtures.hpp

// The 2026 half formats (docs/CUDA.md "Dispatch"; typed here, not read from the runtime): a pair
// holding one prefills on the CUDA-core kernel and decodes on the generic kernel at every head_dim,
// except the pairs of decode_pipelined_on_cuda; store, decode and prefill all run it.
inline bool generic_only_on_cuda(HalfFormat h) {
  return h == HalfFormat::mxfp8 || h == HalfFormat::mxfp4 || h == HalfFormat::nvfp4 ||
         h == HalfFormat::fp8_per_token_head || h == HalfFormat::int8_per_token_head || h == HalfFormat::fp8_block128;
}
// The (K, V) pairs whose decode has a pipelined kernel (fast or tensor-core) at head_dim 64/128/256
// (typed here, not read from the runtime): every pair of the nine older halves; each 2026 half but
// fp8_block128 with itself (tensor cores); mxfp8 K with mxfp4 V (the preset k_mxfp8_v_mxfp4).
inline bool decode_pipelined_on_cuda(HalfFormat k, HalfFormat v) {
  if (!generic_only_on_cuda(k) && !generic_only_on_cuda(v)) return true;
  if (k == v) return k != HalfFormat::fp8_block128;
  return k == HalfFormat::mxfp8 && v == HalfFormat::mxfp4;
}

// The presets whose halves both have fast / tensor-core CUDA kernels, as X(name, slot) (slot: the
// preset's row in kvgate/format_list.hpp, from which the gate families derive their seeds). Their
// decode and prefill both copy pages asynchronously, so both slow-pool twin lists start from them.
#define KVGATE_CUDA_PIPELINED_PRESETS(X) \
  X(f16, 2) X(bf16, 3) X(int8, 4) X(fp8, 5) X(fp8_e5m2, 6) X(q8_0, 7) X(q4_0, 8) X(k8v4, 9)
// The 2026 presets, as X(name, slot): their decode runs on the tensor-core kernel at head_dim
// 64/128/256 (decode_pipelined_on_cuda), their prefill on the CUDA-core kernel, so only the decode
// slow-pool twin list takes them.
#define KVGATE_CUDA_DECODE_MMA_2026_PRESETS(X)                                                     \
  X(mxfp8, 20) X(mxfp4, 21) X(k_mxfp8_v_mxfp4, 22) X(nvfp4, 23) X(fp8_per_token_head, 24) \
      X(int8_per_token_head, 25)

// The pairs of the per-KV-head scale rows (ORA.cuda.decode*_head_scales, ORA.cuda.prefill*_head_scales),
// as X(id, format, seed): both halves fp8 (the tensor-core kernels), an fp8 K beside a 16-bit V (the
// per-head query multiplier on the CUDA-core decode kernel) and a 16-bit K beside an fp8 V (the
// per-head output scale).
#define CUDA_HEAD_SCALE_PAIRS(X)                 \
  X("fp8", "fp8", 9000)                          \
  X("fp8_e5m2", "fp8_e5m2", 9100)                \
  X("mixed.fp8-bf16", "k=fp8_e4m3,v=bf16", 9200) \
  X("mixed.bf16-fp8_e5m2", "k=bf16,v=fp8_e5m2", 9300)

// Rows of the gate files' X-macro lists into the two sets a twin-list gate declares, `twins` and
// `all`: a twin row (id, format, seed), a pipelined preset (name, slot), an ORA row (id, format,
// seed), a KVGATE_PRESETS row.
#define CUDA_TWIN_ROW(id, fmtname, seed) twins.insert(fmtname);
#define CUDA_TWIN_PRESET(name, slot) twins.insert(#name);
#define CUDA_ORA_ROW(id, fmtname, seed) all.insert(fmtname);
#define CUDA_ORA_PRESET(A, name, k, v, slot, kind) all.insert(#name);

// The slow-pool twin lists (STO.cuda.slow_pool_twins, STO.cuda.prefill.slow_pool_twins): `twins`
// must be exactly the formats of `all` (the ORA rows' presets and mixed pairs) for which the
// kernels' own choice `pipelined` holds; `n_twins` and `n_other` are the anti-vacuity counts.
inline void check_twin_list(const std::set<std::string>& twins, const std::set<std::string>& all,
                            const std::function<bool(const KvFormat&, std::string&)>& pipelined,
                            std::size_t n_twins, std::size_t n_other) {
  std::set<std::string> chosen;
  for (const std::string& name : all) {
    const auto f = parse_kv_format(name);
    REQUIRE(f.has_value());
    std::string why;
    const bool p = pipelined(*f, why);
    INFO(name << ": " << why);
    if (p) chosen.insert(name);
    CHECK(p == (twins.count(name) == 1));
  }
  CHECK(twins == chosen);
  for (const std::string& t : twins) CHECK(all.count(t) == 1);  // every twin names an ORA row's format
  CHECK(twins.size() == n_twins);
  CHECK(all.size() - twins.size() == n_other);
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

// The pages of some sequences of a device store (layer 0) copied into page-locked host memory
// mapped into the device's address space, and a CudaKvStore view over them (CudaKvStore::External)
// with the same tables and lengths: the kernels read the same bytes, each cp.async crossing PCIe
// (microseconds instead of HBM's ~0.5 us), so a stage read before its copies landed shows
// (PAR.cuda.decode.slow_pool, PAR.cuda.prefill.slow_pool).
struct MappedPages {
  std::uint8_t* host[2] = {nullptr, nullptr};
  std::unique_ptr<kvgate::cuda::CudaKvStore> view;
  std::vector<SeqId> seqs;  // the view's ids, in the order given to map()
  MappedPages() = default;
  MappedPages(const MappedPages&) = delete;
  MappedPages& operator=(const MappedPages&) = delete;
  ~MappedPages() {
    view.reset();
    for (std::uint8_t* p : host)
      if (p) cudaFreeHost(p);
  }
  void map(const kvgate::cuda::CudaKvStore& gpu, const std::vector<SeqId>& from) {
    const StoreConfig& cfg = gpu.config();
    const std::size_t stride = (std::max(gpu.page_bytes(KvHalf::K), gpu.page_bytes(KvHalf::V)) + 255) / 256 * 256;
    const std::size_t bytes = stride * static_cast<std::size_t>(cfg.n_blocks);
    kvgate::cuda::CudaKvStore::External ext;
    ext.stride = stride;
    ext.n_pages = cfg.n_blocks;
    for (int h = 0; h < 2; ++h) {
      REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&host[h]), bytes, cudaHostAllocMapped) == cudaSuccess);
      std::memset(host[h], 0, bytes);
      const KvHalf half = h == 0 ? KvHalf::K : KvHalf::V;
      for (SeqId s : from)
        for (int b : gpu.block_table(s)) {
          const auto page = gpu.download_page(0, half, b);
          std::memcpy(host[h] + static_cast<std::size_t>(b) * stride, page.data(), page.size());
        }
      void* d = nullptr;
      REQUIRE(cudaHostGetDevicePointer(&d, host[h], 0) == cudaSuccess);
      cudaPointerAttributes attr{};
      REQUIRE(cudaPointerGetAttributes(&attr, d) == cudaSuccess);
      REQUIRE(attr.type == cudaMemoryTypeHost);  // anti-vacuity: the view's pages really live in host memory
      ext.pools.push_back(static_cast<std::uint8_t*>(d));
    }
    view = std::make_unique<kvgate::cuda::CudaKvStore>(cfg, std::move(ext));
    for (SeqId s : from) {
      const SeqId v = view->create_sequence();
      const auto t = gpu.block_table(s);
      view->set_sequence(v, std::vector<int>(t.begin(), t.end()), gpu.length(s));
      seqs.push_back(v);
    }
  }
};

// One layer of a latent (MLA) store: the latent rows ([kv_lora] per token) in the K half, the
// shared RoPE key rows ([rope_dim]) in the V half, with the gates' K/V scales; the caller sets
// n_blocks.
inline StoreConfig latent_store_config(const KvFormat& f, int kv_lora, int rope_dim, int block_size) {
  StoreConfig sc;
  sc.format = f;
  sc.layout = KvLayout::mla_latent;
  sc.n_layers = 1;
  sc.n_kv_heads = 1;
  sc.head_dim = kv_lora;
  sc.v_head_dim = rope_dim;
  sc.block_size = block_size;
  sc.k_scale = {kGateKScale};
  sc.v_scale = {kGateVScale};
  return sc;
}

// The first byte of layer 0's V page in the first block the mirror's window holds: a byte that a
// coherence check (check_stream_coherent) must see when it changes behind the window (the streaming
// gates' anti-vacuity). Fails the case when the window holds no block of layer 0.
inline std::uint8_t* resident_mirror_byte(const PagedKvStore& h) {
  REQUIRE(h.window() != nullptr);
  for (int b = 0; b < h.total_blocks(); ++b)
    if (h.window()->resident(0, b)) return const_cast<std::uint8_t*>(h.host_page(0, KvHalf::V, b));
  FAIL("the mirror's window holds no block of layer 0");
  return nullptr;
}

}  // namespace kvgate::gates::cuda_gate
