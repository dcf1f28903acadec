// PAR.cuda.stream.<fmt>: streamed KV on the GPU vs resident KV on the GPU, bitwise [gate:PAR][cuda].
//
// The same rows go into (a) a resident kvgate::cuda::CudaKvStore and (b) a CPU PagedKvStore whose
// streaming window lives in a CUDA device pool (stream_on_device: device slots, the store's pages
// page-locked as the host mirror, misses and write-throughs as async copies of the byte runs).
// Decode attention of (b) runs the same kernel over the window's slots through a table of slot ids
// (decode_streamed) with the same forced split count as (a): the outputs must be bitwise equal (same
// bytes, same kernel, same plan), not merely close -- the bound is 0 ulp because nothing but the
// page addresses differs.
//
// Access pattern per layer (window W pages = one sequence's context; sequences A and B of W pages
// each): decode A (cold: W misses), A (W hits), B (W misses, each evicting one of A's pages), A (W
// misses, evicting B's), then one appended token of A (written through to the resident block) and
// decode A (W hits). Expected, computed from the pattern and the oracle's page sizes (not from the
// runtime): lookups = L*5*W*2, misses = L*3*W, evictions = L*2*W, bytes_moved = misses x (K page +
// V page) bytes (every page is one list of byte runs covering the page), bytes_written_through = L x
// (K page + V page) / block_size (one token row of each half). Every upload came from pinned memory.
//
// Only the store's own pages are page-locked (pinned bytes == its page-aligned pools, rounded to pages).
//
// Anti-vacuity: a host-mirror byte changed after upload without write-through makes
// check_stream_coherent name the block (it reads the device slots back); a device-slot byte changed
// makes the streamed decode differ from the resident one, and restoring it makes them equal again.
// A window smaller than the context is refused with "window_smaller_than_context".
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/cuda/stream_pool.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate/kv_store.hpp"
#include "kvgate_oracle/formats.hpp"
#include "cuda_gate_common.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace ko = kvgate_oracle;
namespace kc = kvgate::cuda;

namespace {

struct Geo {
  int n_kv_heads, head_dim, n_heads, block_size, window_pages;
};

std::vector<float> rows(std::mt19937& rng, std::size_t n, float mag) {
  std::normal_distribution<float> d(0.0f, mag);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

using cuda_gate::DevFloats;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::size_t oracle_page_bytes(HalfFormat h, const PageGeometry& g) {
  const auto oh = ko::parse_half(name(h));
  REQUIRE(oh.has_value());
  return ko::page_bytes(*oh, ko::PageShape{g.block_size, g.n_kv_heads, g.head_dim});
}

void run_stream_gate(const KvFormat& f, const Geo& geo, unsigned seed) {
  const int L = 2, W = geo.window_pages, B = geo.block_size;
  StoreConfig cfg;
  cfg.format = f;
  cfg.n_layers = L;
  cfg.n_kv_heads = geo.n_kv_heads;
  cfg.head_dim = geo.head_dim;
  cfg.block_size = B;
  cfg.n_blocks = 4 * W;
  cfg.k_scale = {kGateKScale, 0.41f};
  cfg.v_scale = {kGateVScale, 0.05f};
  const PageGeometry g = cfg.geometry();
  const int HD = geo.n_kv_heads * geo.head_dim, QD = geo.n_heads * geo.head_dim;
  const int len_a = W * B - 3, len_b = (W - 1) * B + 5;  // both W pages, the last ones part-filled
  const int window_tokens = W * B;
  std::ostringstream params;
  params << "PAR.cuda.stream fmt=" << f.name() << " H=" << geo.n_kv_heads << " D=" << geo.head_dim
         << " n_heads=" << geo.n_heads << " B=" << B << " layers=" << L << " window=" << window_tokens
         << " tokens (" << W << " pages) len_a=" << len_a << " len_b=" << len_b << " seed=" << seed;
  INFO(params.str());

  const kc::OpSupport sup = kc::supports_op(kc::Op::decode, f, g, geo.n_heads);
  REQUIRE(sup.ok);

  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  };
  StreamGuard guard{stream};  // declared first: destroyed after the streamed store and its pool
  kc::CudaKvStore res(cfg);
  auto str = std::make_unique<PagedKvStore>(cfg);
  kc::CudaDevicePool& pool = kc::stream_on_device(*str, window_tokens, stream);
  REQUIRE(str->streaming());
  REQUIRE(str->window()->window_blocks() == W);
  CHECK(pool.slot_bytes() % 256 == 0);
  CHECK(str->window()->v_offset() % 256 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(pool.base()) % 256 == 0);
  {  // Exactly the store's own pool pages are page-locked (no neighbour shares a pinned page).
    const std::size_t pg = HostPageAlloc::page_size();
    std::size_t own = 0;
    for (int l = 0; l < L; ++l)
      for (KvHalf h : {KvHalf::K, KvHalf::V}) {
        const auto hp = str->host_pool(l, h);
        CHECK(reinterpret_cast<std::uintptr_t>(hp.data()) % pg == 0);
        own += (hp.size() + pg - 1) / pg * pg;
      }
    CHECK(pool.pinned_bytes() == own);
  }

  // Same rows into both stores.
  std::mt19937 rng(seed);
  const SeqId ra = res.create_sequence(), rb = res.create_sequence();
  const SeqId sa = str->create_sequence(), sb = str->create_sequence();
  for (auto [r, s, n] : {std::tuple{ra, sa, len_a}, std::tuple{rb, sb, len_b}}) {
    res.extend(r, n);
    str->extend(s, n);
    for (int l = 0; l < L; ++l) {
      const auto k = rows(rng, static_cast<std::size_t>(n) * HD, kGateKMagnitude);
      const auto v = rows(rng, static_cast<std::size_t>(n) * HD, kGateVMagnitude);
      res.write_host(r, l, 0, n, k.data(), HD, v.data(), HD);
      str->write(s, l, 0, n, k.data(), HD, v.data(), HD);
    }
  }
  // The window is cold: writes touched only the host mirror.
  CHECK(str->stream_counters().lookups == 0);
  CHECK(str->stream_counters().bytes_written_through == 0);
  // Both stores hold the same page bytes (the GPU store kernel == the CPU quantizer, ORA.cuda.store).
  for (auto [r, s] : {std::pair{ra, sa}, std::pair{rb, sb}})
    for (int l = 0; l < L; ++l)
      for (KvHalf h : {KvHalf::K, KvHalf::V})
        for (std::size_t p = 0; p < res.block_table(r).size(); ++p) {
          const auto dev = res.download_page(l, h, res.block_table(r)[p]);
          REQUIRE(dev.size() == str->page_bytes(h));
          CHECK(std::memcmp(dev.data(), str->host_page(l, h, str->block_table(s)[p]), dev.size()) == 0);
        }

  DevFloats dq(static_cast<std::size_t>(QD)), out_r(static_cast<std::size_t>(QD)), out_s(static_cast<std::size_t>(QD));
  kc::DecodeWorkspace ws_r, ws_s;
  long long compared = 0, unequal = 0, nontrivial = 0;
  std::vector<float> last_a, last_b;
  // One decode of both stores with the same query and forced split count; returns (resident, streamed).
  auto decode_both = [&](SeqId r, SeqId s, int layer, int splits) {
    dq.put(rows(rng, static_cast<std::size_t>(QD), 0.5f));
    const kc::DecodePlan pr = res.decode(std::span<const SeqId>(&r, 1), layer, geo.n_heads, dq.p, out_r.p, ws_r, 0.0f, splits);
    const kc::DecodePlan ps = kc::decode_streamed(*str, pool, s, layer, geo.n_heads, dq.p, out_s.p, ws_s, 0.0f, splits);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    INFO("layer " << layer << " splits forced " << splits << ": resident plan " << pr.path << " x" << pr.splits
                  << ", streamed plan " << ps.path << " x" << ps.splits);
    CHECK(pr.splits == ps.splits);
    CHECK(pr.path == ps.path);
    if (splits > 1) CHECK(pr.splits > 1);  // the split + combine path runs (the plan rounds splits to 16 tokens)
    return std::pair{out_r.get(), out_s.get()};
  };
  auto check_equal = [&](const std::pair<std::vector<float>, std::vector<float>>& o) {
    ++compared;
    if (!same_bits(o.first, o.second)) ++unequal;
    bool finite = true, nonzero = false;
    for (float x : o.first) {
      finite = finite && std::isfinite(x);
      nonzero = nonzero || x != 0.0f;
    }
    CHECK(finite);
    if (finite && nonzero) ++nontrivial;
  };

  // The access pattern (see the header): forced splits alternate 1 and 3.
  for (int l = 0; l < L; ++l) {
    int step = 0;
    for (auto [r, s] : {std::pair{ra, sa}, std::pair{ra, sa}, std::pair{rb, sb}, std::pair{ra, sa}}) {
      const auto o = decode_both(r, s, l, step % 2 == 0 ? 1 : 3);
      check_equal(o);
      (r == ra ? last_a : last_b) = o.second;
      ++step;
    }
  }
  CHECK_FALSE(same_bits(last_a, last_b));  // the two contexts give different outputs
  const std::size_t pk = oracle_page_bytes(f.k, g), pv = oracle_page_bytes(f.v, g);
  {
    const StreamCounters c = str->stream_counters();
    INFO("counters after the pattern: lookups " << c.lookups << " misses " << c.misses << " evictions " << c.evictions
                                                << " bytes_moved " << c.bytes_moved);
    CHECK(c.lookups == static_cast<long long>(L) * 4 * W * 2);
    CHECK(c.misses == static_cast<long long>(L) * 3 * W);
    CHECK(c.evictions == static_cast<long long>(L) * 2 * W);
    CHECK(c.bytes_moved == c.misses * static_cast<long long>(pk + pv));
    CHECK(c.bytes_written_through == 0);
    const std::string coh = str->check_stream_coherent();
    INFO("coherence: " << coh);
    CHECK(coh.empty());
  }

  // One appended token of A: the last page is resident, so the write goes through to the slot.
  res.extend(ra, 1);
  str->extend(sa, 1);
  for (int l = 0; l < L; ++l) {
    const auto k = rows(rng, static_cast<std::size_t>(HD), kGateKMagnitude);
    const auto v = rows(rng, static_cast<std::size_t>(HD), kGateVMagnitude);
    res.write_host(ra, l, len_a, 1, k.data(), HD, v.data(), HD);
    str->write(sa, l, len_a, 1, k.data(), HD, v.data(), HD);
  }
  for (int l = 0; l < L; ++l) {
    const auto o = decode_both(ra, sa, l, 0);  // planned from the device occupancy, the same for both
    check_equal(o);  // the new token's bytes reached the slot only through write_through
  }
  const StreamCounters c = str->stream_counters();
  CHECK(c.misses == static_cast<long long>(L) * 3 * W);  // hits only
  CHECK(c.lookups == static_cast<long long>(L) * 5 * W * 2);
  CHECK(c.bytes_written_through == static_cast<long long>(L) * static_cast<long long>((pk + pv) / B));
  const kc::DevicePoolCounters& pc = pool.counters();
  CHECK(pc.bytes_uploaded == c.bytes_moved + c.bytes_written_through);
  CHECK(pc.bytes_from_pageable == 0);
  CHECK(pc.bytes_from_pinned == pc.bytes_uploaded);
  CHECK(str->check_stream_coherent().empty());
  CHECK(compared == static_cast<long long>(L) * 5);
  CHECK(unequal == 0);
  CHECK(nontrivial == compared);

  // Anti-vacuity 1: a host-mirror byte changed without write-through (the field-note bug).
  const int blk = str->block_table(sa)[0];
  auto* host_k = const_cast<std::uint8_t*>(str->host_page(0, KvHalf::K, blk));  // bypasses page()'s invalidation
  host_k[0] ^= 0x5A;
  const std::string stale = str->check_stream_coherent();
  INFO("stale mirror: " << stale);
  CHECK(stale.find("layer 0 K block " + std::to_string(blk)) != std::string::npos);
  host_k[0] ^= 0x5A;
  CHECK(str->check_stream_coherent().empty());

  // Anti-vacuity 2: a device-slot byte changed (the last byte of token 0's V row: a sign/exponent
  // byte, an int8/fp8 code or a q-block code) -> streamed output differs; restored -> equal again.
  const std::uint8_t* dev_v = static_cast<const PagedKvStore&>(*str).page(0, KvHalf::V, blk);  // a hit
  const std::vector<ByteRun> tr = token_ranges(f.v, g, 0);
  const std::size_t off = tr[0].offset + tr[0].bytes - 1;
  const std::uint8_t orig = str->host_page(0, KvHalf::V, blk)[off];
  const std::uint8_t bad = static_cast<std::uint8_t>(orig ^ 0xFF);
  REQUIRE(cudaMemcpy(const_cast<std::uint8_t*>(dev_v) + off, &bad, 1, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK_FALSE(str->check_stream_coherent().empty());
  {
    const auto o = decode_both(ra, sa, 0, 1);
    CHECK_FALSE(same_bits(o.first, o.second));
  }
  REQUIRE(cudaMemcpy(const_cast<std::uint8_t*>(dev_v) + off, &orig, 1, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(str->check_stream_coherent().empty());
  {
    const auto o = decode_both(ra, sa, 0, 1);
    CHECK(same_bits(o.first, o.second));
  }

  // A context longer than the window: refused, nothing launched.
  const int grow = W * B + 1 - str->length(sa);
  str->extend(sa, grow);
  CHECK_THROWS_WITH(kc::decode_streamed(*str, pool, sa, 0, geo.n_heads, dq.p, out_s.p, ws_s),
                    kvgate_catch::contains("window_smaller_than_context"));

  std::cout << params.str() << ": " << compared << " decodes bitwise equal (splits 1/3/auto), lookups " << c.lookups
            << " misses " << c.misses << " evictions " << c.evictions << " bytes_moved " << c.bytes_moved
            << " written_through " << c.bytes_written_through << " pinned uploads " << pc.bytes_from_pinned << "/"
            << pc.bytes_uploaded << " B in " << pc.copies << " copies; anti-vacuity ok\n";
  str.reset();  // the pool (and its stream's work) goes before the stream
}

void run_all(const char* preset, unsigned seed) {
  const auto f = parse_kv_format(preset);
  REQUIRE(f.has_value());
  SECTION("H=2 D=128 GQA 4 B=16, window 5 pages") { run_stream_gate(*f, Geo{2, 128, 8, 16, 5}, seed); }
  SECTION("H=4 D=64 MHA B=8, window 7 pages") { run_stream_gate(*f, Geo{4, 64, 4, 8, 7}, seed + 1); }
}

}  // namespace

#define PAR_CUDA_STREAM(id, preset, seed)                                                                   \
  TEST_CASE("PAR.cuda.stream." id " GPU decode over a streamed window == GPU resident decode, bitwise",   \
            "[gate:PAR][fmt:" preset "][cuda]") {                                                          \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                       \
    run_all(preset, seed);                                                                                 \
  }

#define PAR_CUDA_STREAM_ROW(A, name, k, v, slot, kind) PAR_CUDA_STREAM(#name, #name, (9000 + 100 * slot))
KVGATE_PRESETS(PAR_CUDA_STREAM_ROW, _)  // one row per preset: kvgate/format_list.hpp
PAR_CUDA_STREAM("mixed", "k=q8_0,v=fp8_e5m2", 10000)
PAR_CUDA_STREAM("mixed_rot", "k=fp8_e4m3,v=q4_0_rot", 10100)
