// Op: decode attention. Capability check, split planning from the device's occupancy, and the one
// dispatch switch from runtime (K half, V half, head_dim) to the kernel templates.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/decode_params.cuh"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/ops.hpp"

namespace kvgate::cuda {

using detail::HF;

namespace {
std::atomic<bool>& page_tiles_flag() {
  static std::atomic<bool> on{[] {
    const char* e = std::getenv("KVGATE_CUDA_PAGE_TILES");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }()};
  return on;
}
}  // namespace

bool decode_page_tiles() { return page_tiles_flag().load(std::memory_order_relaxed); }
void set_decode_page_tiles(bool on) { page_tiles_flag().store(on, std::memory_order_relaxed); }

namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kMaxStoreRowBytes = 227 * 1024;  // the row is staged in shared memory

bool fast_head_dim(int d) { return d == 64 || d == 128 || d == 256; }

template <class Fn>
decltype(auto) dispatch_head_dim(int d, Fn&& fn) {
  switch (d) {
    case 64: return fn(std::integral_constant<int, 64>{});
    case 128: return fn(std::integral_constant<int, 128>{});
    case 256: return fn(std::integral_constant<int, 256>{});
    default: return fn(std::integral_constant<int, 0>{});
  }
}

template <class Fn>
decltype(auto) dispatch_decode(const KvFormat& f, int head_dim, Fn&& fn) {
  return detail::dispatch_half(f.k, [&](auto kf) {
    return detail::dispatch_half(f.v, [&](auto vf) {
      return dispatch_head_dim(head_dim, [&](auto d) { return fn(kf, vf, d); });
    });
  });
}

// DecodeLaunch::cell_bytes: the K + V bytes of one cell (token x KV head) as the formats lay out a
// page. page_bytes / block_size is one token row's bytes, exact for every format (docs/FORMATS.md
// "Geometry"); a row's share per head is rounded up where a scale block spans heads (head_dim below
// the block), so the count never falls below the format's need.
unsigned decode_cell_bytes(const KvFormat& f, const PageGeometry& g) {
  const std::size_t B = static_cast<std::size_t>(g.block_size), H = static_cast<std::size_t>(g.n_kv_heads);
  const std::size_t row = kvgate::page_bytes(f.k, g) / B + kvgate::page_bytes(f.v, g) / B;
  return static_cast<unsigned>((row + H - 1) / H);
}

}  // namespace

OpSupport supports_op(Op op, const KvFormat& f, const PageGeometry& g, int n_heads) {
  OpSupport s;
  for (HalfFormat h : {f.k, f.v}) {
    const Capability c = supports(h, g);
    if (!c.ok) return {false, c.reason, c.detail, {}};
  }
  if (op == Op::store) {
    if (static_cast<long>(g.row_elems()) * 4 > kMaxStoreRowBytes)
      return {false, "row_too_large",
              "the CUDA store kernel stages one token row (n_kv_heads*head_dim floats) in shared memory; " +
                  std::to_string(g.row_elems()) + " floats exceed 227 KB",
              {}};
    s.path = "store";
  } else {
    if (n_heads < 1 || n_heads % g.n_kv_heads != 0)
      return {false, "gqa_ratio_invalid",
              "n_heads (" + std::to_string(n_heads) + ") must be a positive multiple of n_kv_heads (" +
                  std::to_string(g.n_kv_heads) + ")",
              {}};
    if (g.head_dim > kMaxHeadDim)
      return {false, "head_dim_unsupported",
              std::string(op == Op::prefill ? "CUDA prefill" : "CUDA decode") +
                  " attention supports head_dim <= 256 (got " + std::to_string(g.head_dim) + ")",
              {}};
    // Prefill: one tiled CUDA-core kernel per (K, V) pair, head_dim a runtime value (kernels/prefill.cuh).
    if (op == Op::prefill) {
      s.path = prefill_mma_applies(f, g) ? "prefill(mma,D=" + std::to_string(g.head_dim) + ")" : "prefill(fp32)";
    } else {
      // Tensor cores when both halves are narrow (kernels/common.cuh narrow_code_half); CUDA cores
      // otherwise; the generic kernel for a head_dim without a fast instantiation or a pair without
      // pipelined kernels (kernels/common.cuh has_pipelined_decode, the predicate that also decides
      // what decode_launch.cuh instantiates: a 2026 half beside an older one, fp8_block128).
      const std::string d = std::to_string(g.head_dim);
      const bool mma = detail::narrow_code_half(f.k) && detail::narrow_code_half(f.v);
      const bool fast = fast_head_dim(g.head_dim) && detail::has_pipelined_decode(f.k, f.v);
      s.path = !fast ? "generic" : mma ? "mma(D=" + d + ")" : "fast(D=" + d + ")";
    }
  }
  const DeviceStatus& d = device_status();
  if (d.available && d.cc_major < 9)
    return {false, "arch_unsupported",
            "kvgate's CUDA kernels are built for sm_90a (+ compute_90 PTX); device '" + d.name + "' is sm_" +
                std::to_string(d.cc_major) + std::to_string(d.cc_minor),
            {}};
  return s;
}

DecodeWorkspace::~DecodeWorkspace() {
  if (ptr_) cudaFree(ptr_);
}

void* DecodeWorkspace::reserve(std::size_t bytes) {
  if (bytes > bytes_) {
    if (ptr_) KVGATE_CUDA_CHECK(cudaFree(ptr_));
    ptr_ = nullptr;
    bytes_ = 0;
    KVGATE_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    bytes_ = bytes;
  }
  return ptr_;
}

DecodePlan plan_decode(const DecodeArgs& a) {
  const OpSupport sup = supports_op(Op::decode, a.format, a.geometry, a.n_heads);
  if (!sup.ok) throw std::invalid_argument("kvgate::cuda::decode_attention: " + sup.reason + ": " + sup.detail);
  DecodePlan p;
  // Sliding windows run on the generic kernel (the only one that reads a window start), so the
  // fast and tensor-core kernels of full attention keep their registers and speed; a window
  // bounds the keys read, which is where the generic kernel's lower throughput stops mattering.
  p.path = a.window > 0 ? "generic" : sup.path;
  const int H = a.geometry.n_kv_heads, D = a.geometry.head_dim;
  const int group = a.n_heads / H;
  p.head_chunks = (group + detail::kHeadsPerCta - 1) / detail::kHeadsPerCta;
  int per_sm = 1;
  dispatch_decode(a.format, p.path == "generic" ? 0 : D, [&](auto kf, auto vf, auto d) {
    p.smem_bytes = detail::decode_smem_bytes<decltype(kf)::value, decltype(vf)::value, decltype(d)::value>(D);
    per_sm = detail::decode_max_active<decltype(kf)::value, decltype(vf)::value, decltype(d)::value>(p.smem_bytes);
  });
  const DeviceStatus& dev = device_status();
  p.resident_ctas = std::max(1, per_sm) * std::max(1, dev.sm_count);
  const long head_ctas = p.path != "generic" ? (H + detail::kDecodeWarps - 1) / detail::kDecodeWarps : H;
  const long base = static_cast<long>(a.batch) * head_ctas * p.head_chunks;
  // A sliding window bounds the keys any query reads (the kernel starts at seq_len - window).
  const int max_len = std::max(1, a.window > 0 ? std::min(a.max_seq_len, a.window) : a.max_seq_len);
  if (a.num_splits > 0) {
    p.splits = a.num_splits;
  } else {
    // Enough CTAs to fill the device (at least one resident wave), each split not too short,
    // then the fewest waves that are nearly whole (a half-empty last wave costs as much as a full
    // one).
    // Minimum split: 32 tokens (two tiles of one warp) where a warp covers a split alone (fast,
    // mma), 128 for the generic kernel (its four warps share a split).
    const int min_tokens = p.path == "generic" ? 128 : 32;
    const int max_splits = std::max(1, (max_len + min_tokens - 1) / min_tokens);
    const int s_full = static_cast<int>((p.resident_ctas + base - 1) / base);
    if (s_full >= max_splits) {
      p.splits = max_splits;
    } else {
      double best = -1;
      p.splits = s_full;
      for (int s = s_full; s <= std::min(max_splits, 4 * s_full); ++s) {
        const double waves = static_cast<double>(base) * s / p.resident_ctas;
        // last-wave fill, minus a little per wave: every split re-fills its pipeline and adds a
        // partial to merge (H200: bf16 32K x 16 ran 617 us with 2 waves, 643 us with 4)
        const double util = waves / std::ceil(waves) - 0.03 * waves;
        if (util > best + 1e-3) {
          best = util;
          p.splits = s;
        }
      }
    }
  }
  p.splits = std::min(p.splits, max_len);
  p.tokens_per_split = (max_len + p.splits - 1) / p.splits;
  p.tokens_per_split = (p.tokens_per_split + 15) / 16 * 16;
  p.splits = (max_len + p.tokens_per_split - 1) / p.tokens_per_split;
  p.ctas = static_cast<int>(base * p.splits);
  p.workspace_bytes = static_cast<std::size_t>(a.batch) * p.splits * a.n_heads * (D + 2) * sizeof(float);
  return p;
}

DecodePlan decode_attention(const DecodeArgs& a, DecodeWorkspace& ws, cudaStream_t stream) {
  return decode_attention(a, plan_decode(a), ws, stream);
}

DecodePlan decode_attention(const DecodeArgs& a, const DecodePlan& p, DecodeWorkspace& ws, cudaStream_t stream) {
  if (a.batch <= 0) return p;
  const int H = a.geometry.n_kv_heads, D = a.geometry.head_dim;
  auto* base = static_cast<float*>(ws.reserve(p.workspace_bytes));
  detail::DecodeLaunch L;
  L.k_pool = a.k_pool;
  L.v_pool = a.v_pool;
  L.k_page_stride = a.k_page_stride;
  L.v_page_stride = a.v_page_stride;
  L.block_tables = a.block_tables;
  L.table_stride = a.table_stride;
  L.seq_lens = a.seq_lens;
  L.q = a.q;
  L.part_o = base;
  L.part_ml = base + static_cast<std::size_t>(a.batch) * p.splits * a.n_heads * D;
  L.batch = a.batch;
  L.n_heads = a.n_heads;
  L.n_kv_heads = H;
  L.head_dim = D;
  L.block_size = a.geometry.block_size;
  L.group = a.n_heads / H;
  L.n_hchunks = p.head_chunks;
  L.splits = p.splits;
  L.tokens_per_split = p.tokens_per_split;
  L.window = a.window;
  L.page_tiles = decode_page_tiles();
  if (a.window < 0) throw std::invalid_argument("kvgate::cuda::decode_attention: window must be >= 0");
  L.softcap2 = detail::softcap_base2(a.softcap, "decode_attention");
  L.bytes_read = a.bytes_read;
  if (a.bytes_read != nullptr) L.cell_bytes = decode_cell_bytes(a.format, a.geometry);
  const float scale = a.softmax_scale > 0 ? a.softmax_scale : 1.0f / std::sqrt(static_cast<float>(D));
  const float k_ts = detail::applied_tensor_scale(a.format.k, a.k_scale);
  const float v_ts = detail::applied_tensor_scale(a.format.v, a.v_scale);
  L.q_mul = static_cast<float>(static_cast<double>(scale) * 1.4426950408889634 * k_ts);
  L.k_heads = detail::applied_head_scales(a.format.k, a.k_head_scales, "decode_attention");
  L.sm_scale = scale;
  L.had_c = detail::hadamard_scale(D);
  // A windowed call runs the generic kernel even under a plan made for full attention (a CUDA
  // graph's one plan for every layer): the split ranges carry over, the shared memory is its own.
  const bool generic = a.window > 0 || p.path == "generic";
  const int smem = generic && p.path != "generic" ? detail::generic_smem_bytes(D) : p.smem_bytes;
  dispatch_decode(a.format, generic ? 0 : D, [&](auto kf, auto vf, auto d) {
    detail::launch_decode<decltype(kf)::value, decltype(vf)::value, decltype(d)::value>(L, smem, stream);
  });
  detail::CombineLaunch c;
  c.part_o = L.part_o;
  c.part_ml = L.part_ml;
  c.out = a.out;
  c.batch = a.batch;
  c.n_heads = a.n_heads;
  c.head_dim = D;
  c.splits = p.splits;
  c.v_mul = v_ts;
  c.v_heads = detail::applied_head_scales(a.format.v, a.v_head_scales, "decode_attention");
  c.group = a.n_heads / H;
  c.had_c = L.had_c;
  detail::launch_combine(c, a.format.v == HalfFormat::q4_0_rot, stream);
  return p;
}

}  // namespace kvgate::cuda
