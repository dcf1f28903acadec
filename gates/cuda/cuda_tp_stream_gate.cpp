// PAR.cuda.tp.stream.<fmt>: streaming (--kv-resident) per tensor-parallel rank on the CUDA engine
// (kvgate/cuda/tensor_parallel.hpp, docs/CUDA.md "Tensor parallelism"; the CPU counterpart is
// PAR.tp.stream, the split's per-stage counterpart PAR.cuda.pp.stream, gates/cuda/cuda_pipeline_gate.cpp).
//
// Model: the synth GQA Llama of PAR.cuda.tp (8 query / 4 KV heads of head_dim 32, hidden 256, FFN 512,
// 2 layers, f32 weights; 2 ranks hold 2 KV heads each) with a sliding window of 32 tokens on both
// layers, so the sliding-window release runs and a device window smaller than the context suffices.
// KV formats f32, int8, k8v4, fp8_e4m3 (fp8 with static scales distinct per (layer, KV head), so each
// rank's mirror and window carry its own heads' scales). Pages of 16 tokens, chunks of 7, a 128-token
// context. Calls: a prefill of 61 tokens (9 chunks, all logits), then 32 decode steps fed fixed ids:
// 93 tokens (6 pages) of context through a window of --kv-resident 64 (4 pages per layer, per rank; the
// engine's minimum for this run: check_window's largest call reads 4 pages once the release has
// dropped the pages before the first key read, prefill_first_key with tiles of 32).
//
//   Subject:   CudaEngine with EngineOptions::tensor_parallel = 2 and kv_resident = 64: each rank its
//              own host mirror (a PagedKvStore of the rank's StoreConfig) and device window, its forward
//              on a view over the window. Rank r on device r modulo the device count: both on cuda:0
//              where one GPU is (every run so far), on cuda:0 and cuda:1 where two are.
//   Reference: the same engine with tensor_parallel = 2 and every rank's KV resident.
//   Bound:     ZERO -- the logits of every prefill position and every decode step are bitwise equal.
//              Where it comes from: streaming moves page bytes, not arithmetic. The rank's forward runs
//              the same kernels with the same arguments on a view whose pages hold the same bytes as the
//              resident rank store's (the store kernel writes the window slot; the uploads copy mirror
//              pages that stream_out copied back from the device) and whose table points each position at
//              its slot; the all-reduce sums the same partials in the same rank order. Only the page
//              addresses differ, and no kernel's result depends on a page's address -- the argument of
//              PAR.cuda.pp.stream and PAR.cuda.engine_stream.
//   Also:      every rank streams: each rank's mirror counts misses > 0, exactly 2 layers x 6 pages (each
//              block loaded once: the window holds every live page of a call, released pages are never
//              read again; a replay of the engine's release / extend / lookup sequence on a host-pooled
//              PagedKvStore window of the rank's shape gave 12 misses, 0 evictions, at most 4 pages per
//              call), bytes moved = misses x (K page + V page) of the rank's geometry, both ranks alike; the engine's stats are the ranks' counters added; the window (kv_device_bytes) is
//              smaller than the resident ranks' pools; each rank's mirror holds its KV heads (n_kv_heads
//              = 4 / 2) and the mirrors are distinct; after the run each rank's mirror is coherent with
//              its device window (check_stream_coherent empty); after reset() the same prefill gives the
//              same logits again and the mirrors stay coherent.
//   Anti-vacuity: a byte of rank 1's mirror changed behind its window is detected and the report names
//              "rank 1" (then the byte is restored and the check is empty again); the window (64 tokens)
//              is smaller than the 93-token context, so the release and slot reuse are exercised.
// Without a device every case prints "SKIPPED: no CUDA device: <reason>" and passes.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "cuda_gate_common.hpp"
#include "head_scales.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/kv_store.hpp"
#include "kvgate/kv_stream.hpp"
#include "model_fixtures.hpp"

using namespace kvgate;
namespace kc = kvgate::cuda;

namespace {

constexpr int kBlock = 16, kChunk = 7, kCtx = 128, kPrompt = 61, kDecode = 32, kSlide = 32, kWindow = 64, kRanks = 2;

// The synth model of PAR.cuda.tp with a sliding window of kSlide tokens on every layer.
const Model& synth_tp_windowed() {
  static const Model m = [] {
    const Model& base = gates::synth_model_once("cuda_tp_stream", gates::synth_tp_options());
    Model w;
    w.path = base.path + " (sliding windows)";
    w.source_kind = base.source_kind;
    w.config = base.config;
    w.weights = base.weights;
    w.fingerprint = base.fingerprint;
    w.config.layer_window.assign(static_cast<std::size_t>(base.config.n_layers), kSlide);
    return w;
  }();
  return m;
}

kc::CudaEngineOptions tp_opts(const Model& m, const KvFormat& f, int resident) {
  kc::CudaEngineOptions o;
  o.engine = engine_options_for(f, 1);
  o.engine.kv.backend = "cuda";
  o.engine.block_size = kBlock;
  o.engine.max_context = kCtx;
  o.engine.prefill_chunk = kChunk;
  o.engine.tensor_parallel = kRanks;
  o.engine.kv_resident = resident;
  // Rank r on device r modulo the machine's device count (both on cuda:0 where one GPU is), as the
  // layer split's stream gate places its stages: on two GPUs the ranks' windows live on two devices.
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) n_dev = 1;
  for (int r = 0; r < kRanks; ++r) o.devices.push_back(r % n_dev);
  gates::set_gate_head_scales_if_fp8(o.engine, f, m.config.n_layers, m.config.n_kv_heads);
  o.weights = kc::WeightType::f32;
  return o;
}

std::vector<int> prompt_ids(const Model& m) {
  std::vector<int> p;
  for (int i = 0; i < kPrompt; ++i) p.push_back((37 * i + 11) % (m.config.vocab_size - 2));
  return p;
}

int decode_id(const Model& m, int i) { return (53 * i + 7) % (m.config.vocab_size - 2); }

// Every prefill position's logits, then every decode step's (fixed ids: both engines read the same tokens).
std::vector<float> run_all(kc::CudaEngine& e, const Model& m) {
  std::vector<float> out = e.forward_all_logits(prompt_ids(m));
  for (int i = 0; i < kDecode; ++i) {
    const std::vector<float>& lg = e.decode(decode_id(m, i));
    out.insert(out.end(), lg.begin(), lg.end());
  }
  return out;
}

// The first logit vector (prefill position or decode step) that differs in any bit; -1: none.
long first_difference(const std::vector<float>& a, const std::vector<float>& b, std::size_t vocab) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size() / vocab; ++i)
    if (std::memcmp(a.data() + i * vocab, b.data() + i * vocab, vocab * sizeof(float)) != 0) return static_cast<long>(i);
  return -1;
}

void tp_stream(const char* id, const std::string& preset) {
  const auto f = parse_kv_format(preset);
  REQUIRE(f.has_value());
  const Model& m = synth_tp_windowed();
  REQUIRE(widest_window_if_all(m.config) == kSlide);
  const int L = m.config.n_layers, ctx = kPrompt + kDecode, pages = (ctx + kBlock - 1) / kBlock;
  REQUIRE(kWindow < ctx);  // anti-vacuity: the window is smaller than the context
  const std::size_t V = static_cast<std::size_t>(m.config.vocab_size);
  std::cout << id << ": device " << kc::device_status().name << ", synth GQA (4 KV heads, 2 layers, sliding window "
            << kSlide << "), KV " << f->name() << ", --tp " << kRanks << ", --kv-resident " << kWindow << " ("
            << kWindow / kBlock << " pages per layer, every rank) of a " << ctx << "-token run (prefill " << kPrompt
            << " in chunks of " << kChunk << ", " << kDecode << " decode steps)\n";

  std::vector<float> ref;
  std::size_t resident_pool = 0;
  {
    kc::CudaEngine r(m, tp_opts(m, *f, 0));
    REQUIRE(r.stats().tensor_parallel == kRanks);
    REQUIRE(r.stage_host_mirror(0) == nullptr);  // resident
    resident_pool = r.stats().kv_device_bytes;
    ref = run_all(r, m);
    CHECK(r.stats().kv_block_lookups == 0);
  }
  REQUIRE(ref.size() == static_cast<std::size_t>(kPrompt + kDecode) * V);

  kc::CudaEngine e(m, tp_opts(m, *f, kWindow));
  REQUIRE(e.n_stages() == kRanks);  // the ranks
  CHECK(e.stats().tensor_parallel == kRanks);
  CHECK(e.stats().kv_resident_tokens == kWindow);
  CHECK(e.stats().kv_device_bytes < resident_pool);  // the ranks' windows are smaller than their pools
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(e.stage_host_mirror(r) != nullptr);
    CHECK(e.stage_host_mirror(r)->config().n_kv_heads == m.config.n_kv_heads / kRanks);
    CHECK(e.stage_host_mirror(r)->config().n_layers == L);
    CHECK(e.stage_store(r).config().n_kv_heads == m.config.n_kv_heads / kRanks);
  }
  CHECK(e.stage_host_mirror(0) != e.stage_host_mirror(1));

  const std::vector<float> got = run_all(e, m);
  const long diff = first_difference(ref, got, V);
  const EngineStats& st = e.stats();
  long long lookups = 0, misses = 0, bytes = 0;
  std::vector<StreamCounters> rc;
  for (int r = 0; r < kRanks; ++r) {
    rc.push_back(e.stage_host_mirror(r)->stream_counters());
    lookups += rc.back().lookups;
    misses += rc.back().misses;
    bytes += rc.back().bytes_moved;
  }
  const PageGeometry g = e.stage_host_mirror(0)->geometry();
  const long long page_pair = static_cast<long long>(page_bytes(f->k, g) + page_bytes(f->v, g));
  const long long want_misses = static_cast<long long>(L) * pages;  // per rank: every block loaded once
  std::cout << id << ": streamed --tp " << kRanks << " == resident --tp " << kRanks << " logits bitwise ("
            << kPrompt << " prefill positions, " << kDecode << " decode steps): "
            << (diff < 0 ? std::string("yes") : "no, first at " + std::to_string(diff)) << "\n";
  for (int r = 0; r < kRanks; ++r)
    std::cout << id << ": rank " << r << ": lookups " << rc[static_cast<std::size_t>(r)].lookups << ", misses "
              << rc[static_cast<std::size_t>(r)].misses << " (" << want_misses << "), evictions "
              << rc[static_cast<std::size_t>(r)].evictions << ", bytes moved " << rc[static_cast<std::size_t>(r)].bytes_moved
              << " (" << want_misses * page_pair << ")\n";
  INFO(id << ": first differing logit vector (prefill positions first, then decode steps): " << diff);
  CHECK(diff < 0);
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    const StreamCounters& c = rc[static_cast<std::size_t>(r)];
    CHECK(c.misses > 0);  // every rank streams
    CHECK(c.misses == want_misses);
    CHECK(c.bytes_moved == c.misses * page_pair);
    CHECK(c.lookups == rc[0].lookups);  // the ranks see the same lookups
  }
  CHECK(st.kv_block_lookups == lookups);  // the stats add the ranks' counters
  CHECK(st.kv_block_misses == misses);
  CHECK(st.kv_bytes_moved == bytes);

  const std::string coh = e.check_stream_coherent();
  INFO(coh);
  CHECK(coh.empty());
  {  // Anti-vacuity: a byte of rank 1's mirror changed behind its window is seen and named (then restored).
    const PagedKvStore& h = *e.stage_host_mirror(1);
    std::uint8_t* p = kvgate::gates::cuda_gate::resident_mirror_byte(h);
    p[0] ^= 0x5A;
    const std::string seen = e.check_stream_coherent();
    std::cout << id << ": rank 1 mirror byte changed: " << (seen.empty() ? std::string("not seen") : seen) << "\n";
    CHECK(seen.find("rank 1") != std::string::npos);
    CHECK(seen.find("rank 0") == std::string::npos);
    p[0] ^= 0x5A;
    CHECK(e.check_stream_coherent().empty());
  }
  {  // reset() frees and recreates every rank's sequence in its store and its mirror: the same prefill again.
    e.reset();
    CHECK(e.position() == 0);
    const std::vector<float> again = e.forward_all_logits(prompt_ids(m));
    REQUIRE(again.size() == static_cast<std::size_t>(kPrompt) * V);
    CHECK(std::memcmp(again.data(), ref.data(), again.size() * sizeof(float)) == 0);
    CHECK(e.check_stream_coherent().empty());
  }
}

}  // namespace

#define CUDA_TP_STREAM_CASE(id, name)                                                                               \
  TEST_CASE("PAR.cuda.tp.stream." id " CUDA engine --tp 2 --kv-resident (a window per rank) == --tp 2 resident, "   \
            "bitwise; every rank streams, mirrors coherent",                                                        \
            "[gate:PAR][multigpu][fmt:" id "][cuda]") {                                                                       \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                                \
    tp_stream("PAR.cuda.tp.stream." id, name);                                                                      \
  }

CUDA_TP_STREAM_CASE("f32", "f32")
CUDA_TP_STREAM_CASE("int8", "int8")
CUDA_TP_STREAM_CASE("k8v4", "k8v4")
CUDA_TP_STREAM_CASE("fp8_e4m3", "fp8")
