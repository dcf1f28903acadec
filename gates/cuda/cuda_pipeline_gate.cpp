// PAR.cuda.pp.*: the layer split of the CUDA forward (kvgate/cuda/pipeline.hpp) against the unsplit
// forward, on the transformers reference models (datasets/models/hf_refs: dense Llama, Gemma 3 with
// sliding layers, Qwen3-MoE, DeepSeek-V3 with MLA; f32 weights).
//   PAR.cuda.pp.<model>.<fmt>  2 stages and 3 (uneven) stages vs the unsplit forward: the logits of
//                                every position of a chunked prefill (chunks of 5 tokens over pages
//                                of 4, so chunks and pages cross) and of 6 decode steps of a batch of
//                                two sequences (CUDA graphs, greedy feedback) are bitwise identical.
//                                The stages run on devices 0,0 (and 0,0,0): the split's whole code
//                                path on one GPU (stage stores, hand-over of the residual rows,
//                                per-stage graphs); on a machine with 2+ GPUs the 2-stage split also
//                                runs on devices 0,1 (peer hand-over), else that part prints SKIPPED.
//   Anti-vacuity: each stage's store holds only its layers (n_layers = its range, pool bytes = its
//   layers' pages, the stages' pools add up to the unsplit pool) and every pool byte of each of its
//   layers equals the unsplit store's pool of that model layer (so the stores are separate and
//   really written); the logits are finite and not constant across positions; a stage told to
//   return logits without the classifier, a later stage without an input stage and a device the
//   machine lacks are refused.
//   PAR.cuda.pp.engine           the CUDA engine with --pp 2 and --pp-layers 1,1 (kvgate run --device
//                                cuda --pp): prefill logits of every position (forward_all_logits), the
//                                next prefill's last row, and 24 greedy steps (GPU argmax through
//                                graphs) equal the unsplit engine's, bitwise and id for id; the stats
//                                report the topology and the stages' pools add up to the unsplit pool;
//                                refused with the split: --kv-resident, saving or hydrating a KV file,
//                                KV damage, a device list of the wrong length.
// Bound: zero, bitwise -- each stage performs the unsplit pass's float operations for its layers in
// the same order on the same rows (the same argument as the CPU split, PAR.split). Mutants in the
// hand-over (a stage embedding instead of reading its input, the input rows of another stage, a
// stage's KV written at the model layer index) break it.
// Without a device every case prints "SKIPPED: no CUDA device: <reason>" and passes.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../hf_reference/hf_ref_harness.hpp"
#include "catch_compat.hpp"
#include "cuda_gate_common.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/cuda/pipeline.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/kv_file.hpp"
#include "kvgate/sampler.hpp"

using namespace kvgate;
using namespace kvgate::gates::hf_ref;
namespace kc = kvgate::cuda;

namespace {

constexpr int kBlock = 4, kChunk = 5, kSteps = 6, kRows = 8;

const Loaded& loaded(const std::string& name) { return gates::hf_ref::loaded(name, "PAR.cuda.pp", "cuda"); }

// What one run produces: prefill logits of sequence 0 (every position), then per decode step the
// logits of both sequences.
struct Run {
  std::vector<float> logits;
  std::vector<int> greedy;
};

// The forward calls of one case, on either the unsplit forward or a pipeline (same signatures).
template <class F>
Run drive(F& f, SeqId s0, SeqId s1, const std::vector<int>& prompt, int vocab) {
  Run r;
  const std::span<const int> all(prompt);
  for (std::size_t p = 0; p < prompt.size(); p += kChunk) {  // sequence 0: chunks of kChunk, every row's logits
    const std::size_t n = std::min<std::size_t>(kChunk, prompt.size() - p);
    std::vector<float> z(n * static_cast<std::size_t>(vocab));
    f.forward_chunk(s0, all.subspan(p, n), z.data(), true);
    r.logits.insert(r.logits.end(), z.begin(), z.end());
  }
  std::vector<float> z1(static_cast<std::size_t>(vocab));  // sequence 1: a shorter prompt in one chunk
  int id1 = 0;
  f.forward_chunk(s1, all.subspan(0, 3), z1.data(), false, &id1);
  std::vector<SeqId> seqs{s0, s1};
  std::vector<int> tok{prompt.back(), id1}, ids(2);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> z(2 * static_cast<std::size_t>(vocab));
    f.forward_decode(seqs, tok, z.data(), ids.data());
    r.logits.insert(r.logits.end(), z.begin(), z.end());
    r.greedy.insert(r.greedy.end(), ids.begin(), ids.end());
    tok = ids;
  }
  return r;
}

StoreConfig store_config(const Model& m, const KvFormat& f, MlaCache mla, int max_ctx) {
  EngineOptions o = engine_options_for(f, 1);
  o.kv.backend = "cuda";
  o.mla_cache = mla;
  o.block_size = kBlock;
  return make_store_config(m, o, max_ctx, "PAR.cuda.pp");
}

// The unsplit forward as the pipeline's single stage would be: model, store, forward, two sequences.
struct Unsplit {
  kc::CudaModel model;
  kc::CudaKvStore store;
  kc::CudaForward fwd;
  SeqId s0, s1;
  Unsplit(const Model& m, const StoreConfig& sc, const kc::CudaForwardOptions& fo)
      : model(m, kc::WeightType::f32), store(sc), fwd(model, store, fo), s0(store.create_sequence()),
        s1(store.create_sequence()) {}
  void forward_chunk(SeqId s, std::span<const int> t, float* z, bool all, int* id = nullptr) {
    fwd.forward_chunk(s, t, z, all, id);
  }
  void forward_decode(std::span<const SeqId> s, std::span<const int> t, float* z, int* id) {
    fwd.forward_decode(s, t, z, id);
  }
};

std::vector<std::uint8_t> pool_bytes(kc::CudaKvStore& st, int layer, KvHalf h) {
  std::vector<std::uint8_t> b(static_cast<std::size_t>(st.total_blocks()) * st.page_stride(h));
  REQUIRE(cudaMemcpy(b.data(), st.pool(layer, h), b.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  return b;
}

void check_case(const std::string& model_name, const std::string& fmt_name, MlaCache mla) {
  const Loaded& l = loaded(model_name);
  const Model& m = l.m;
  const ModelConfig& c = m.config;
  const auto f = parse_kv_format(fmt_name);
  REQUIRE(f.has_value());
  const std::vector<int>& prompt = l.rc.tf.front().ids;
  REQUIRE(prompt.size() >= 12);
  const std::vector<int> p(prompt.begin(), prompt.begin() + 12);
  const int max_ctx = 32;
  const StoreConfig sc = store_config(m, *f, mla, max_ctx);
  kc::CudaForwardOptions fo;
  fo.max_rows = kRows;
  fo.max_context = max_ctx;
  Unsplit u(m, sc, fo);
  const Run ref = drive(u, u.s0, u.s1, p, c.vocab_size);
  REQUIRE(kvgate_oracle::count_nonfinite(std::span<const float>(ref.logits)) == 0);
  {
    float lo = ref.logits[0], hi = ref.logits[0];
    for (std::size_t i = 0; i < static_cast<std::size_t>(c.vocab_size); ++i)  // position 0's logits vary
      lo = std::min(lo, ref.logits[i]), hi = std::max(hi, ref.logits[i]);
    REQUIRE(hi > lo);
    REQUIRE(std::memcmp(ref.logits.data(), ref.logits.data() + c.vocab_size, c.vocab_size * sizeof(float)) != 0);
  }
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess) n_dev = 0;
  struct Split {
    std::vector<int> devices, layers;
  };
  std::vector<Split> splits{{{0, 0}, {}}};
  if (c.n_layers >= 3) splits.push_back({{0, 0, 0}, {}});
  if (c.n_layers >= 3) splits.push_back({{0, 0}, {c.n_layers - 1, 1}});  // uneven
  if (n_dev >= 2) splits.push_back({{0, 1}, {}});
  else WARN("SKIPPED: PAR.cuda.pp " << model_name << " on devices 0,1: this machine has " << n_dev << " CUDA device");
  for (const Split& s : splits) {
    kc::PipelineOptions po;
    po.devices = s.devices;
    po.stage_layers = s.layers;
    po.weights = kc::WeightType::f32;
    po.store = sc;
    po.forward = fo;
    kc::CudaPipeline pp(m, po);
    INFO("PAR.cuda.pp." << model_name << "." << fmt_name << " (" << pp.topology() << ", block " << kBlock
                          << ", chunk " << kChunk << ", " << kSteps << " decode steps of 2 sequences)");
    const SeqId s0 = pp.create_sequence(), s1 = pp.create_sequence();
    REQUIRE(s0 == u.s0);
    REQUIRE(s1 == u.s1);
    const Run got = drive(pp, s0, s1, p, c.vocab_size);
    REQUIRE(got.logits.size() == ref.logits.size());
    std::size_t first = got.logits.size();
    for (std::size_t i = 0; i < got.logits.size() && first == got.logits.size(); ++i)
      if (std::memcmp(&got.logits[i], &ref.logits[i], sizeof(float)) != 0) first = i;
    INFO("first differing logit: " << (first == got.logits.size() ? std::string("none")
                                                                 : std::to_string(first) + " (row " +
                                                                       std::to_string(first / c.vocab_size) + ")"));
    CHECK(first == got.logits.size());
    CHECK(got.greedy == ref.greedy);
    // Anti-vacuity: separate stores, each holding exactly its layers' pages, byte for byte the unsplit's.
    std::size_t pool_sum = 0;
    for (int i = 0; i < pp.n_stages(); ++i) {
      kc::CudaPipeline::Stage& st = pp.stage(i);
      const int n = st.range.end - st.range.first;
      REQUIRE(st.store->config().n_layers == n);
      REQUIRE(st.store->config().first_layer == st.range.first);
      REQUIRE(st.store.get() != &u.store);
      REQUIRE(cudaSetDevice(st.device) == cudaSuccess);
      for (int ll = 0; ll < n; ++ll)
        for (KvHalf h : {KvHalf::K, KvHalf::V}) {
          const auto a = pool_bytes(*st.store, ll, h);
          REQUIRE(cudaSetDevice(0) == cudaSuccess);
          const auto b = pool_bytes(u.store, st.range.first + ll, h);
          REQUIRE(cudaSetDevice(st.device) == cudaSuccess);
          INFO("stage " << i << " layer " << st.range.first + ll << (h == KvHalf::K ? " K" : " V") << " pool");
          CHECK(a == b);
          pool_sum += a.size();
        }
      REQUIRE(cudaSetDevice(0) == cudaSuccess);
    }
    std::size_t unsplit = 0;
    for (int ll = 0; ll < c.n_layers; ++ll)
      unsplit += static_cast<std::size_t>(u.store.total_blocks()) * (u.store.page_stride(KvHalf::K) + u.store.page_stride(KvHalf::V));
    CHECK(pool_sum == unsplit);
    // Refusals: logits from a stage without the classifier; a device the machine lacks.
    std::vector<float> z(static_cast<std::size_t>(c.vocab_size));
    const int one = p[0];
    CHECK_THROWS_WITH(pp.stage(0).forward->forward_chunk(pp.create_sequence(), std::span<const int>(&one, 1), z.data(), false),
                      kvgate_catch::contains("has no classifier"));
  }
  kc::PipelineOptions bad;
  bad.devices = {0, n_dev};
  bad.store = sc;
  bad.forward = fo;
  CHECK_THROWS_WITH(kc::CudaPipeline(m, bad), kvgate_catch::contains("is not on this machine"));
  // A later stage without its input stage is refused.
  {
    kc::CudaModel tail(m, kc::WeightType::f32, kc::LayerRange{1, -1});
    kc::CudaKvStore ts(stage_store_config(sc, engine_options_for(*f, 1), 1, c.n_layers));
    kc::CudaForward tf(tail, ts, fo);
    const SeqId s = ts.create_sequence();
    std::vector<float> z(static_cast<std::size_t>(c.vocab_size));
    CHECK_THROWS_WITH(tf.forward_chunk(s, std::span<const int>(p.data(), 1), z.data(), false),
                      kvgate_catch::contains("has no input stage"));
  }
}

kc::CudaEngineOptions engine_opts(int stages, std::vector<int> layers = {}) {
  kc::CudaEngineOptions o;
  o.engine = engine_options_for(KvFormat{HalfFormat::int8, HalfFormat::int8}, 1);
  o.engine.kv.backend = "cuda";
  o.engine.max_context = 64;
  o.engine.prefill_chunk = 5;
  o.engine.block_size = kBlock;
  o.engine.pipeline_stages = stages;
  o.engine.pipeline_layers = std::move(layers);
  return o;
}

}  // namespace

TEST_CASE("PAR.cuda.pp.engine the CUDA engine split by --pp == the unsplit engine, bitwise; what the split refuses",
          "[gate:PAR][multigpu][cuda][fmt:int8]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  const Loaded& l = loaded("llama_default");
  const Model& m = l.m;
  const std::vector<int> p(l.rc.tf.front().ids.begin(), l.rc.tf.front().ids.begin() + 12);
  SamplerOptions greedy;
  kc::CudaEngine one(m, engine_opts(1));
  const std::vector<float> ref_all = one.forward_all_logits(p);
  one.reset();
  const std::vector<float> ref_last = one.prefill(p);
  one.reset();
  const GenerateResult ref_gen = one.generate(p, 24, greedy);
  REQUIRE(ref_gen.tokens.size() == 24);
  REQUIRE(one.stats().pipeline_stages == 1);
  for (const auto& [stages, layers] : std::vector<std::pair<int, std::vector<int>>>{{2, {}}, {1, {1, 1}}}) {
    kc::CudaEngine split(m, engine_opts(stages, layers));
    INFO("--pp " << stages << " --pp-layers " << layers.size() << " stages: " << split.stats().topology);
    REQUIRE(split.stats().pipeline_stages == 2);
    CHECK(split.stats().topology == "pipeline:1+1");
    CHECK(split.stats().kv_pool_bytes == one.stats().kv_pool_bytes);
    const std::vector<float> all = split.forward_all_logits(p);
    REQUIRE(all.size() == ref_all.size());
    CHECK(std::memcmp(all.data(), ref_all.data(), all.size() * sizeof(float)) == 0);
    split.reset();
    const std::vector<float> last = split.prefill(p);
    CHECK(std::memcmp(last.data(), ref_last.data(), last.size() * sizeof(float)) == 0);
    split.reset();
    const GenerateResult gen = split.generate(p, 24, greedy);
    CHECK(gen.tokens == ref_gen.tokens);
    CHECK(split.position() == one.position());
    // Conversations and damage are single-store paths: refused with the split, naming --pp.
    CHECK_THROWS_WITH(split.save_kv(std::string("PAR.cuda.pp.engine.kv")), kvgate_catch::contains("--pp"));
    CHECK_THROWS_WITH(split.set_damage(KvDamage{}), kvgate_catch::contains("--pp"));
  }
  auto streamed = engine_opts(2);
  streamed.engine.kv_resident = 16;
  CHECK_THROWS_WITH(kc::CudaEngine(m, streamed), kvgate_catch::contains("--kv-resident"));
  auto wrong = engine_opts(2);
  wrong.devices = {0, 0, 0};
  CHECK_THROWS_WITH(kc::CudaEngine(m, wrong), kvgate_catch::contains("one device per stage"));
}

#define PP_CASE(id, model, fmt, mla)                                                                           \
  TEST_CASE("PAR.cuda.pp." id "." fmt " layer split (2 and 3 stages) == unsplit CUDA forward, bitwise",      \
            "[gate:PAR][multigpu][cuda][fmt:" fmt "]") {                                                     \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                           \
    check_case(model, fmt, mla);                                                                               \
  }

PP_CASE("llama_default", "llama_default", "f32", MlaCache::expanded)
PP_CASE("llama_default", "llama_default", "bf16", MlaCache::expanded)
PP_CASE("llama_default", "llama_default", "int8", MlaCache::expanded)
PP_CASE("llama_default", "llama_default", "k8v4", MlaCache::expanded)
PP_CASE("llama_default", "llama_default", "fp8", MlaCache::expanded)
PP_CASE("gemma3", "gemma3", "int8", MlaCache::expanded)
PP_CASE("qwen3_moe", "qwen3_moe", "int8", MlaCache::expanded)
PP_CASE("deepseek_v3", "deepseek_v3", "bf16", MlaCache::expanded)
PP_CASE("deepseek_v3.latent", "deepseek_v3", "bf16", MlaCache::latent)
