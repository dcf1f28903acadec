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
//                                refused with the split: KV damage, shared device weights, a device
//                                list of the wrong length; --kv-resident builds a window per stage.
//   PAR.cuda.pp.persist.<fmt>    KV files through the split engine (stories260K, 5 layers, splits 3+2
//                                and 2+2+1; f32, int8, k8v4, fp8 e4m3 with static scales per layer and
//                                KV head): the split engine's file == the unsplit engine's, byte for
//                                byte; the unsplit file hydrated split and the split file hydrated
//                                unsplit continue (a 20-token chunk, 5 decode steps) bitwise as the
//                                uninterrupted unsplit engine; a split engine's save right after its
//                                hydrate == the file read; each stage's store holds only its layers.
//   PAR.cuda.pp.stream.<fmt>     --kv-resident 80 per stage (every stage its own window over its own
//                                host mirror) on the same splits: logits == the resident unsplit
//                                engine bitwise, file == its file, the stats add the stages' counters
//                                (closed forms of PAR.cuda.engine_stream), every stage's mirror coherent
//                                (a byte changed in the last stage's mirror is seen and named), a
//                                streamed split hydrate of the unsplit prefix continues bitwise, a
//                                too-small window is refused naming the size that works.
// Bound: zero, bitwise -- each stage performs the unsplit pass's float operations for its layers in
// the same order on the same rows (the same argument as the CPU split, PAR.split). Mutants in the
// hand-over (a stage embedding instead of reading its input, the input rows of another stage, a
// stage's KV written at the model layer index) break it.
// Without a device every case prints "SKIPPED: no CUDA device: <reason>" and passes.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../hf_reference/hf_ref_harness.hpp"
#include "../model_vs_oracle/model_harness.hpp"
#include "catch_compat.hpp"
#include "cuda_gate_common.hpp"
#include "cuda_stories_subject.hpp"
#include "head_scales.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/cuda/pipeline.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/kv_file.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/sampler.hpp"
#include "models.hpp"
#include "scratch_dir.hpp"

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


// --- KV files and streaming through the split CUDA engine (PAR.cuda.pp.persist.*, PAR.cuda.pp.stream.*) ---
// stories260K (5 layers), pages of 16, chunks of 32, a 256-token context, as PAR.cuda.persist /
// PAR.cuda.engine_stream; the splits 3+2 and 2+2+1 (stage i on device i modulo the device count: every
// stage on device 0 where one GPU is, else the stages alternate over devices 0 and 1).
namespace conv {

constexpr int kBlock = 16, kChunk = 32, kCtx = 256;
constexpr int kN1 = 37;      // saved prefix: 2 whole pages + 5 tokens of a third
constexpr int kTurn = 20;    // the next turn's chunk (persist); 23 in the streaming case
constexpr int kDecode = 5;   // decode steps after it
constexpr int kWindow = 80;  // --kv-resident: 5 pages of 16 per layer, every stage

const std::vector<std::vector<int>>& splits() {
  static const std::vector<std::vector<int>> s{{3, 2}, {2, 2, 1}};
  return s;
}

using Subject = kvgate::gates::cuda_gate::StoriesSubject;

const Subject& subject() {
  const Subject& s = kvgate::gates::cuda_gate::stories_subject();
  REQUIRE(s.tokens.size() >= static_cast<std::size_t>(kN1 + 23 + kDecode + 1));
  REQUIRE(s.m.config.n_layers == 5);  // the splits below
  return s;
}

std::span<const int> toks(int from, int to) {
  return std::span<const int>(subject().tokens).subspan(static_cast<std::size_t>(from), static_cast<std::size_t>(to - from));
}

// The format's run options; fp8 with static scales distinct per layer, KV head and half (so each
// stage's slice of the table matters: a stage holding another stage's scales is refused or misreads).
kc::CudaEngineOptions opts(const KvFormat& f, bool head_scales, std::vector<int> layers = {}, int resident = 0) {
  kc::CudaEngineOptions o;
  o.engine = engine_options_for(f, 1);
  o.engine.kv.backend = "cuda";
  o.engine.block_size = kBlock;
  o.engine.max_context = kCtx;
  o.engine.prefill_chunk = kChunk;
  o.engine.kv_resident = resident;
  if (head_scales) {
    const ModelConfig& c = subject().m.config;
    o.engine.k_scale = kvgate::gates::gate_head_scales(c.n_layers, c.n_kv_heads, KvHalf::K);
    o.engine.v_scale = kvgate::gates::gate_head_scales(c.n_layers, c.n_kv_heads, KvHalf::V);
  }
  o.engine.pipeline_layers = std::move(layers);
  o.engine.pipeline_stages = o.engine.pipeline_layers.empty() ? 1 : static_cast<int>(o.engine.pipeline_layers.size());
  return o;
}

// One folder per process (mkdtemp, removed at exit).
std::string temp_file(const std::string& name) {
  static const kvgate::gates::ScratchDir dir("kvgate_cuda_pp_gate");
  return dir.sub(name);
}

using kvgate::gates::cuda_gate::bit_equal;
using kvgate::gates::cuda_gate::file_bytes;
using kvgate::gates::cuda_gate::saved_file_bytes;

// After the first kN1 tokens: a chunk of `turn` tokens (all logits), then kDecode decode steps fed
// with the corpus' next tokens (their logits appended).
std::vector<float> continuation(kc::CudaEngine& e, int turn) {
  std::vector<float> out = e.forward_all_logits(toks(kN1, kN1 + turn));
  for (int i = 0; i < kDecode; ++i) {
    const auto& lg = e.decode(subject().tokens[static_cast<std::size_t>(kN1 + turn + i)]);
    out.insert(out.end(), lg.begin(), lg.end());
  }
  return out;
}

std::string split_name(const std::vector<int>& layers) {
  std::string s;
  for (std::size_t i = 0; i < layers.size(); ++i) s += (i ? "+" : "") + std::to_string(layers[i]);
  return s;
}

// Each stage's store holds exactly its layers (anti-vacuity: the stores are separate).
void check_stage_stores(kc::CudaEngine& e, const std::vector<int>& layers) {
  REQUIRE(e.n_stages() == static_cast<int>(layers.size()));
  int first = 0;
  for (int i = 0; i < e.n_stages(); ++i) {
    CHECK(e.stage_store(i).config().n_layers == layers[static_cast<std::size_t>(i)]);
    CHECK(e.stage_store(i).config().first_layer == first);
    if (e.stage_host_mirror(i)) {
      CHECK(e.stage_host_mirror(i)->config().n_layers == layers[static_cast<std::size_t>(i)]);
      CHECK(e.stage_host_mirror(i)->config().first_layer == first);
    }
    if (i > 0) CHECK(&e.stage_store(i) != &e.stage_store(i - 1));
    first += layers[static_cast<std::size_t>(i)];
  }
}

void pp_persist(const char* id, const std::string& preset, bool head_scales) {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  const auto f = parse_kv_format(preset);
  REQUIRE(f.has_value());
  const Subject& s = subject();
  std::cout << id << ": device " << kc::device_status().name << ", model stories260K, KV " << f->name()
            << (head_scales ? " (static scales per layer and KV head)" : "") << ", block " << kBlock << ", chunk "
            << kChunk << ", prefix " << kN1 << " tokens, turn " << kTurn << " + " << kDecode << " decode steps\n";
  // The unsplit engine: its file at kN1 and its uninterrupted continuation.
  const std::string unsplit_file = temp_file(std::string(id) + ".unsplit.kv");
  std::vector<float> whole;
  {
    kc::CudaEngine u(s.m, opts(*f, head_scales));
    REQUIRE(u.n_stages() == 1);
    u.prefill(toks(0, kN1));
    u.save_kv(unsplit_file);
    whole = continuation(u, kTurn);
  }
  const std::vector<std::uint8_t> unsplit_bytes = saved_file_bytes(unsplit_file, kN1);
  {  // Anti-vacuity: a cold engine over the same tokens (no prefix) gives other logits.
    kc::CudaEngine cold(s.m, opts(*f, head_scales));
    const std::vector<float> c = cold.forward_all_logits(toks(kN1, kN1 + kTurn));
    CHECK(!bit_equal(std::vector<float>(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(c.size())), c));
  }
  for (const std::vector<int>& layers : splits()) {
    const std::string sn = split_name(layers);
    const std::string split_file = temp_file(std::string(id) + "." + sn + ".split.kv");
    // (1) The split engine's file == the unsplit engine's, byte for byte; its continuation == unsplit.
    {
      kc::CudaEngine e(s.m, opts(*f, head_scales, layers));
      INFO(id << " split " << sn << " (" << e.stats().topology << ")");
      check_stage_stores(e, layers);
      e.prefill(toks(0, kN1));
      e.save_kv(split_file);
      const bool same = file_bytes(split_file) == unsplit_bytes;
      const std::vector<float> got = continuation(e, kTurn);
      std::cout << id << ": split " << sn << ": file == unsplit file: " << (same ? "yes" : "no")
                << "; continuation == unsplit: " << (bit_equal(got, whole) ? "yes" : "no") << "\n";
      CHECK(same);
      CHECK(bit_equal(got, whole));
    }
    // (2) The unsplit file hydrated into the split engine: the file read back right after the hydrate
    // (every stage's device pages downloaded) is the file read, and the continuation == uninterrupted.
    {
      kc::CudaEngine e(s.m, opts(*f, head_scales, layers));
      INFO(id << " unsplit file -> split " << sn);
      CHECK(e.hydrate(read_kv_file(unsplit_file), toks(0, kN1 + kTurn)) == kN1);
      CHECK(e.stats().hydrated_tokens == kN1);
      CHECK(e.position() == kN1);
      const std::string again = temp_file(std::string(id) + "." + sn + ".rehydrated.kv");
      e.save_kv(again);
      CHECK(file_bytes(again) == unsplit_bytes);
      const std::vector<float> got = continuation(e, kTurn);
      CHECK(e.stats().prefill_tokens == kTurn);  // only the new tokens were prefilled
      std::cout << id << ": unsplit file -> split " << sn << " hydrate: continuation bit-identical: "
                << (bit_equal(got, whole) ? "yes" : "no") << "\n";
      CHECK(bit_equal(got, whole));
    }
    // (3) The split engine's file hydrated into the unsplit engine.
    {
      kc::CudaEngine u(s.m, opts(*f, head_scales));
      INFO(id << " split " << sn << " file -> unsplit");
      CHECK(u.hydrate(read_kv_file(split_file), toks(0, kN1 + kTurn)) == kN1);
      const std::vector<float> got = continuation(u, kTurn);
      CHECK(u.stats().prefill_tokens == kTurn);
      std::cout << id << ": split " << sn << " file -> unsplit hydrate: continuation bit-identical: "
                << (bit_equal(got, whole) ? "yes" : "no") << "\n";
      CHECK(bit_equal(got, whole));
    }
  }
  {  // A file saved with other scales is refused by the split engine too (the stages' scales are checked).
    if (head_scales) {
      kc::CudaEngine e(s.m, opts(*f, false, splits().front()));
      CHECK_THROWS_WITH(e.hydrate(read_kv_file(unsplit_file), toks(0, kN1 + kTurn)), kvgate_catch::contains("scale"));
      CHECK(e.position() == 0);
    }
  }
}

long long lookups_for(int layers, int len_after) { return 2LL * layers * ((len_after + kBlock - 1) / kBlock); }

void pp_stream(const char* id, const std::string& preset) {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  const auto f = parse_kv_format(preset);
  REQUIRE(f.has_value());
  const Subject& s = subject();
  const int L = s.m.config.n_layers, turn = 23;
  std::cout << id << ": device " << kc::device_status().name << ", model stories260K, KV " << f->name()
            << ", --kv-resident " << kWindow << " (" << kWindow / kBlock << " pages per layer, every stage) of a " << kCtx
            << "-token context, calls: prefill " << kN1 << " (chunks of " << kChunk << "), chunk " << turn << ", "
            << kDecode << " decode steps\n";
  const std::string res_file = temp_file(preset + ".pp.resident.kv"), pre_file = temp_file(preset + ".pp.prefix.kv");
  std::vector<float> ref;
  std::size_t resident_pool = 0, unsplit_window = 0;
  {
    kc::CudaEngine r(s.m, opts(*f, false));
    resident_pool = r.stats().kv_device_bytes;
    r.prefill(toks(0, kN1));
    r.save_kv(pre_file);
    ref = continuation(r, turn);
    r.save_kv(res_file);
  }
  {
    kc::CudaEngine one(s.m, opts(*f, false, {}, kWindow));
    unsplit_window = one.stats().kv_device_bytes;
  }
  const std::vector<std::uint8_t> res_bytes = file_bytes(res_file);
  for (const std::vector<int>& layers : splits()) {
    const std::string sn = split_name(layers);
    {
      kc::CudaEngine e(s.m, opts(*f, false, layers, kWindow));
      INFO(id << " split " << sn << " (" << e.stats().topology << ")");
      check_stage_stores(e, layers);
      for (int i = 0; i < e.n_stages(); ++i) REQUIRE(e.stage_host_mirror(i) != nullptr);
      CHECK(e.stats().kv_device_bytes == unsplit_window);  // the stages' windows add up to the unsplit window
      CHECK(e.stats().kv_device_bytes < resident_pool);
      e.prefill(toks(0, kN1));
      const std::vector<float> got = continuation(e, turn);
      const std::string str_file = temp_file(preset + "." + sn + ".pp.streamed.kv");
      e.save_kv(str_file);
      const EngineStats& st = e.stats();
      long long want_lookups = 0;  // the stages' layers add up to the model's
      for (int len : {kChunk, kN1}) want_lookups += lookups_for(L, len);
      want_lookups += lookups_for(L, kN1 + turn);
      for (int i = 1; i <= kDecode; ++i) want_lookups += lookups_for(L, kN1 + turn + i);
      const long long want_misses = static_cast<long long>(L) * ((kN1 + turn + kDecode + kBlock - 1) / kBlock);
      const PageGeometry g = e.host_mirror()->geometry();
      const long long page_pair = static_cast<long long>(page_bytes(f->k, g) + page_bytes(f->v, g));
      const bool same_file = file_bytes(str_file) == res_bytes;
      std::cout << id << ": split " << sn << ": streamed == resident unsplit logits bitwise: "
                << (bit_equal(ref, got) ? "yes" : "no") << ", file == resident unsplit file: " << (same_file ? "yes" : "no")
                << ", lookups " << st.kv_block_lookups << " (" << want_lookups << "), misses " << st.kv_block_misses
                << " (" << want_misses << "), bytes moved " << st.kv_bytes_moved << " (" << want_misses * page_pair << ")\n";
      CHECK(bit_equal(ref, got));
      CHECK(same_file);  // every stage's mirror holds its device pages
      CHECK(st.kv_block_lookups == want_lookups);
      CHECK(st.kv_block_misses == want_misses);
      CHECK(st.kv_bytes_moved == want_misses * page_pair);
      const std::string coh = e.check_stream_coherent();
      INFO(coh);
      CHECK(coh.empty());
      {  // Anti-vacuity: a byte of the LAST stage's mirror changed behind its window is seen (then restored).
        const int last = e.n_stages() - 1;
        const PagedKvStore& h = *e.stage_host_mirror(last);
        std::uint8_t* p = kvgate::gates::cuda_gate::resident_mirror_byte(h);
        p[0] ^= 0x5A;
        const std::string seen = e.check_stream_coherent();
        CHECK(seen.find("stage " + std::to_string(last)) != std::string::npos);
        p[0] ^= 0x5A;
        CHECK(e.check_stream_coherent().empty());
      }
    }
    {  // Streamed split hydrate of the resident unsplit engine's prefix file.
      kc::CudaEngine e(s.m, opts(*f, false, layers, kWindow));
      INFO(id << " unsplit prefix file -> streamed split " << sn);
      CHECK(e.hydrate(read_kv_file(pre_file), toks(0, kN1 + turn)) == kN1);
      const long long misses0 = e.stats().kv_block_misses;
      const std::vector<float> got = continuation(e, turn);
      CHECK(e.stats().kv_block_misses - misses0 == static_cast<long long>(L) * ((kN1 + turn + kDecode + kBlock - 1) / kBlock));
      CHECK(e.stats().prefill_tokens == turn);
      CHECK(e.check_stream_coherent().empty());
      std::cout << id << ": unsplit file -> streamed split " << sn << " hydrate: continuation bit-identical: "
                << (bit_equal(ref, got) ? "yes" : "no") << "\n";
      CHECK(bit_equal(ref, got));
    }
  }
  {  // A window smaller than one step's pages: refused with the size that works, nothing changed.
    kc::CudaEngine e(s.m, opts(*f, false, splits().back(), 2 * kBlock));
    CHECK_THROWS_WITH(e.prefill(toks(0, kN1)), kvgate_catch::contains("--kv-resident " + std::to_string(3 * kBlock) + " or more"));
    CHECK(e.position() == 0);
    CHECK(e.stats().kv_block_lookups == 0);
    e.prefill(toks(0, 2 * kBlock));  // what fits runs
    CHECK(e.position() == 2 * kBlock);
    CHECK(e.check_stream_coherent().empty());
  }
}

}  // namespace conv

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
    CHECK(split.n_stages() == 2);
    CHECK(split.stage_host_mirror(0) == nullptr);  // resident
    // KV damage is a single-model path: refused with the split, naming --pp. (KV files and streaming
    // go through every stage: PAR.cuda.pp.persist.*, PAR.cuda.pp.stream.*.)
    CHECK_THROWS_WITH(split.set_damage(KvDamage{}), kvgate_catch::contains("--pp"));
  }
  {  // --kv-resident with the split: a window and a host mirror per stage, each of its stage's layers.
    auto streamed = engine_opts(2);
    streamed.engine.kv_resident = 16;
    kc::CudaEngine se(m, streamed);
    REQUIRE(se.n_stages() == 2);
    for (int i = 0; i < 2; ++i) {
      REQUIRE(se.stage_host_mirror(i) != nullptr);
      CHECK(se.stage_host_mirror(i)->config().n_layers == 1);
      CHECK(se.stage_host_mirror(i)->config().first_layer == i);
    }
    CHECK(se.stage_host_mirror(0) != se.stage_host_mirror(1));
    CHECK(se.stats().kv_resident_tokens == 16);
    streamed.engine.kv_resident = -1;
    CHECK_THROWS_WITH(kc::CudaEngine(m, streamed), kvgate_catch::contains("--kv-resident must be >= 0"));
  }
  auto shared = engine_opts(2);
  shared.shared_weights = std::make_shared<const kc::CudaModel>(m, kc::WeightType::f32);
  CHECK_THROWS_WITH(kc::CudaEngine(m, shared), kvgate_catch::contains("--pp"));
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

// KV files and streaming through the split CUDA engine (the conv:: cases above).
#define PP_CONV_CASE(fmt, head_scales)                                                                            \
  TEST_CASE("PAR.cuda.pp.persist." fmt " split CUDA engine KV files == unsplit, byte for byte; hydrate across "   \
            "split and unsplit, bitwise",                                                                         \
            "[gate:PAR][multigpu][cuda][fmt:" fmt "]") {                                                         \
    conv::pp_persist("PAR.cuda.pp.persist." fmt, fmt, head_scales);                                               \
  }                                                                                                               \
  TEST_CASE("PAR.cuda.pp.stream." fmt " split CUDA engine --kv-resident per stage == resident unsplit, bitwise",  \
            "[gate:PAR][multigpu][cuda][fmt:" fmt "]") {                                                         \
    conv::pp_stream("PAR.cuda.pp.stream." fmt, fmt);                                                              \
  }

PP_CONV_CASE("f32", false)
PP_CONV_CASE("int8", false)
PP_CONV_CASE("k8v4", false)
PP_CONV_CASE("fp8", true)
