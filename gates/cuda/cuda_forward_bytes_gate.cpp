// STO.cuda.bytes_read.forward.<fmt>: the bytes-moved accounting of STO.cuda.bytes_read.<preset>
// (gates/cuda/cuda_bytes_gate.cpp, docs/CUDA.md "What a decode step reads on the GPU") carried into the
// CUDA engine's own decode steps: CudaForward builds its DecodeArgs itself and hands them the store's
// counter (CudaKvStore::read_counter()), eagerly and under a captured CUDA graph.
//
// Model: a synth GQA Llama of 2 layers, hidden 256, 8 query / 2 KV heads of head_dim 128 (a group of
// 4 query heads: one head chunk), FFN 512, f32 weights -- head_dim 128 takes the fast or tensor-core
// decode kernels where the format has them; and the synth model of PAR.cuda.tp (4 KV heads of 32: the
// generic kernel). Pages of 16, a prompt of 37 tokens (chunks of 16), then 6 decode steps.
//
// The bound: a decode step at sequence length n (the new token's row written first, then attention
// over its n keys) needs, per layer, the K and V rows of those n tokens, every KV head:
//   need(step) = n_layers x n x (K page bytes + V page bytes) / B x ceil(group / 4),
// page bytes from docs/FORMATS.md "Geometry" (gates/common/format_bytes.hpp, written apart from the
// runtime's table). The kernels copy cells, not pages, and these geometries give whole bytes per cell,
// so the counted bytes equal the sum of need over the counted steps exactly -- the check of
// STO.cuda.bytes_read.<preset> (its slack of less than a page per split is not needed here).
// The steps: 1 with the counter off (eager or graph captured with no counter), then 4 counted (the
// graph of the first step was captured with a null counter: it must be dropped and captured again with
// the store's, or the count stays 0), then the counter off again and 1 more step (the counting graph
// dropped again: it would otherwise add to a freed counter).
// Anti-vacuity: the count is > 0 and grows by exactly n_layers x (K + V token bytes) x chunks per key
// from one step to the next; the logits of every step are bit for bit those of an engine that never
// counts (counting changes no arithmetic); with graphs on, graphs were captured and replayed.
// Without a device every case prints "SKIPPED: no CUDA device: <reason>" and passes.
#include <cstdint>
#include <cstring>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "cuda_gate_common.hpp"
#include "format_bytes.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "model_fixtures.hpp"

using namespace kvgate;
using kvgate::gates::expected_page_bytes;
namespace kc = kvgate::cuda;

namespace {

constexpr int kBlock = 16, kPrompt = 37, kChunk = 16, kCounted = 4;

const Model& wide_model() {
  SynthOptions o;
  o.layers = 2;
  o.hidden = 256;
  o.heads = 8;
  o.kv_heads = 2;
  o.head_dim = 128;
  o.ffn = 512;
  o.vocab = 300;
  o.seed = 23;
  o.max_seq_len = 256;
  return gates::synth_model_once("cuda_forward_bytes", o);
}
const Model& narrow_model() { return gates::synth_model_once("cuda_forward_bytes_tp", gates::synth_tp_options()); }

kc::CudaEngineOptions opts(const KvFormat& f, bool graphs) {
  kc::CudaEngineOptions o;
  o.engine = engine_options_for(f, 1);
  o.engine.kv.backend = "cuda";
  o.engine.block_size = kBlock;
  o.engine.max_context = 128;
  o.engine.prefill_chunk = kChunk;
  o.weights = kc::WeightType::f32;
  o.cuda_graphs = graphs;
  return o;
}

std::vector<int> prompt(const Model& m) {
  std::vector<int> p;
  for (int i = 0; i < kPrompt; ++i) p.push_back((29 * i + 5) % (m.config.vocab_size - 2));
  return p;
}
int step_id(const Model& m, int i) { return (41 * i + 3) % (m.config.vocab_size - 2); }

void forward_bytes(const char* id, const Model& m, const std::string& preset) {
  const auto f = parse_kv_format(preset);
  REQUIRE(f.has_value());
  const ModelConfig& c = m.config;
  const std::size_t B = kBlock, H = static_cast<std::size_t>(c.n_kv_heads), D = static_cast<std::size_t>(c.head_dim);
  const std::size_t page = expected_page_bytes(f->k, B, H, D) + expected_page_bytes(f->v, B, H, D);
  REQUIRE(page % (B * H) == 0);  // whole bytes per cell: the count is the need exactly
  const std::uint64_t token = page / B;
  const std::uint64_t chunks = static_cast<std::uint64_t>((c.n_heads / c.n_kv_heads + 3) / 4);
  const kc::OpSupport sup = kc::supports_op(kc::Op::decode, *f, PageGeometry{kBlock, c.n_kv_heads, c.head_dim}, c.n_heads);
  for (const bool graphs : {false, true}) {
    INFO(id << (graphs ? " with CUDA graphs" : " eager"));
    std::cout << id << ": device " << kc::device_status().name << ", " << c.n_layers << " layers, " << c.n_heads << "/"
              << c.n_kv_heads << " heads of " << c.head_dim << ", KV " << f->name() << ", decode path " << sup.path
              << (graphs ? ", CUDA graphs" : ", eager") << "\n";
    kc::CudaEngine e(m, opts(*f, graphs));
    kc::CudaEngine ref(m, opts(*f, graphs));  // never counts
    e.prefill(prompt(m));
    ref.prefill(prompt(m));
    int step = 0;
    auto both = [&] {  // one decode step of both engines; true when their logits are bit for bit equal
      const int t = step_id(m, step++);
      const std::vector<float>& a = e.decode(t);
      const std::vector<float>& b = ref.decode(t);
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    CHECK(both());  // counter off (a graph captured with no counter)
    CHECK_FALSE(e.store().read_counter_on());
    e.store().set_read_counter(true);
    std::uint64_t prev = 0, sum_need = 0, sum_counted = 0;
    for (int i = 0; i < kCounted; ++i) {
      e.store().reset_read_bytes();
      CHECK(both());
      const std::uint64_t counted = e.store().read_bytes();
      const std::uint64_t n = static_cast<std::uint64_t>(e.position());  // keys of the step (its own row included)
      const std::uint64_t need = static_cast<std::uint64_t>(c.n_layers) * n * token * chunks;
      std::cout << id << ": step at length " << n << ": counted " << counted << " B, need " << need << " B\n";
      CHECK(counted > 0);
      CHECK(counted == need);
      if (i > 0) CHECK(counted - prev == static_cast<std::uint64_t>(c.n_layers) * token * chunks);
      prev = counted;
      sum_need += need;
      sum_counted += counted;
    }
    e.store().set_read_counter(false);
    CHECK(both());  // counter off again: the counting graph dropped, nothing written to the freed counter
    CHECK(e.store().read_bytes() == 0);
    if (graphs) {
      CHECK(e.forward().graph_captures() >= 2);  // captured without, with and again without the counter
      CHECK(e.forward().graph_replays() > 0);
    }
    std::cout << id << ": " << kCounted << " counted steps: " << sum_counted << " B (need " << sum_need << " B)\n";
  }
}

}  // namespace

#define CUDA_FORWARD_BYTES_CASE(fmt, model)                                                                       \
  TEST_CASE("STO.cuda.bytes_read.forward." fmt " the CUDA engine's decode steps count the KV bytes they read: "    \
            "exactly the format's need, eager and under CUDA graphs",                                             \
            "[gate:STO][fmt:" fmt "][cuda]") {                                                                    \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                              \
    forward_bytes("STO.cuda.bytes_read.forward." fmt, model(), fmt);                                              \
  }

CUDA_FORWARD_BYTES_CASE("f16", wide_model)
CUDA_FORWARD_BYTES_CASE("int8", wide_model)
CUDA_FORWARD_BYTES_CASE("q4_0", wide_model)
CUDA_FORWARD_BYTES_CASE("fp8", wide_model)
CUDA_FORWARD_BYTES_CASE("mxfp8", wide_model)
CUDA_FORWARD_BYTES_CASE("k8v4", narrow_model)
