// PAR.split.*: the pipeline (layer) split of the CPU engine (EngineOptions::pipeline_stages), laid
// out as a multi-GPU split would be: every stage runs a contiguous range of layers over its own KV
// store and hands its activations to the next.
//   PAR.split.<fmt>          2 and 3 stages, even and uneven ranges, vs the unsplit engine: the
//                            logits of every prompt position (chunked prefill) and of every decode
//                            step are bitwise identical. Anti-vacuity: each stage's store holds
//                            only its layers (shape, first layer, pool bytes = its layers' pages;
//                            the stages' pools add up to the unsplit pool) and each of its layer
//                            slots holds, bitwise, the K/V rows the unsplit store holds for that
//                            model layer (so the stores really are separate and really written).
//   PAR.split.stream.<fmt>   streamed (--kv-resident) on a split vs resident unsplit: bitwise
//                            logits; every stage streams (misses on each) and after every step
//                            each stage's resident device copies equal its host mirror.
//   PAR.split.persist.<fmt>  a KV file saved from a split run is byte-identical to the unsplit
//                            run's; it hydrates into an unsplit engine and the unsplit file into a
//                            split one, and the next turn's logits are bitwise the live ones.
//   PAR.split.options        stage counts and layer lists that do not split the model are refused
//                            naming the option and the fix; the read hook sees model layer indices.
// Bound: zero, bitwise -- the split performs the same float operations in the same order on the
// same quantized rows (each stage's forward is the unsplit pass restricted to its layers); only the
// store holding the rows changes. No tolerance is derived because none is allowed (as PAR.persist
// and PAR.stream, the same parity argument).
#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>

#include "kvgate/format_list.hpp"
#include "par_common.hpp"

using namespace kvgate;
using namespace kvgate::par;

namespace {

constexpr int kSteps = 12;
constexpr int kChunk = 7;  // prefill chunks of 7 tokens: the prompt crosses chunks and pages

// The splits a model allows: 2 and 3 stages, even (the default ranges) and uneven.
std::vector<std::vector<int>> splits_of(const Model& m) {
  if (m.config.n_layers == 5) return {{3, 2}, {4, 1}, {2, 2, 1}, {1, 3, 1}};
  if (m.config.n_layers == 2) return {{1, 1}};
  throw std::runtime_error("PAR.split: no splits listed for a model of " + std::to_string(m.config.n_layers) + " layers");
}

std::string split_name(const std::vector<int>& s) { return topology_name(s); }

EngineOptions split_options(const Model& m, const KvFormat& f, const std::vector<int>& layers, int resident = 0) {
  EngineOptions o = options(m, f, resident, resident > 0 ? 4 : 16);
  o.prefill_chunk = kChunk;
  o.pipeline_stages = static_cast<int>(layers.size());
  o.pipeline_layers = layers;
  return o;
}

// Every prompt position's logits (forward_all_logits), then kSteps greedy decode steps.
struct Run {
  std::vector<std::vector<float>> logits;
};
Run run_prompt(Engine& e, std::span<const int> prompt) {
  Run r;
  const std::vector<float> all = e.forward_all_logits(prompt);
  const std::size_t V = static_cast<std::size_t>(e.vocab_size());
  for (std::size_t i = 0; i < prompt.size(); ++i)
    r.logits.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(i * V), all.begin() + static_cast<std::ptrdiff_t>((i + 1) * V));
  int tok = argmax(r.logits.back());
  for (int s = 0; s < kSteps; ++s) {
    r.logits.push_back(e.decode(tok));
    tok = argmax(r.logits.back());
  }
  return r;
}

int first_diff(const Run& a, const Run& b) {
  if (a.logits.size() != b.logits.size()) return static_cast<int>(std::min(a.logits.size(), b.logits.size()));
  for (std::size_t i = 0; i < a.logits.size(); ++i)
    if (!bitwise_equal(a.logits[i], b.logits[i])) return static_cast<int>(i);
  return -1;
}

void check_stores(const Engine& split, const Engine& single, const std::vector<int>& layers) {
  const PagedKvStore& whole = single.store();
  REQUIRE(split.stage_count() == static_cast<int>(layers.size()));
  std::size_t pools = 0;
  int first = 0;
  for (int i = 0; i < split.stage_count(); ++i) {
    INFO("stage " << i);
    const PagedKvStore& st = split.stage_store(i);
    const StoreConfig& c = st.config();
    CHECK(split.stage_layers(i) == std::pair<int, int>{first, first + layers[static_cast<std::size_t>(i)]});
    CHECK(c.n_layers == layers[static_cast<std::size_t>(i)]);
    CHECK(c.first_layer == first);
    CHECK(c.n_blocks == whole.config().n_blocks);
    // The pool holds this stage's layers' pages only.
    const std::size_t per_layer = static_cast<std::size_t>(c.n_blocks) * (st.page_bytes(KvHalf::K) + st.page_bytes(KvHalf::V));
    CHECK(st.pool_bytes() == per_layer * static_cast<std::size_t>(c.n_layers));
    pools += st.pool_bytes();
    const SeqId s = split.stage_sequence(i);
    REQUIRE(st.length(s) == single.position());
    for (int sl = 0; sl < c.n_layers; ++sl)
      for (KvHalf h : {KvHalf::K, KvHalf::V}) {
        INFO("layer slot " << sl << " (model layer " << first + sl << "), half " << (h == KvHalf::K ? "K" : "V"));
        const std::vector<float> got = layer_rows(st, s, sl, h), want = layer_rows(whole, single.sequence(), first + sl, h);
        CHECK(bitwise_equal(got, want));
        CHECK(std::any_of(got.begin(), got.end(), [](float x) { return x != 0.0f; }));  // really written
      }
    CHECK(st.check_guards().empty());
    first += c.n_layers;
  }
  CHECK(first == single.model().config.n_layers);
  CHECK(pools == whole.pool_bytes());
  CHECK(split.stats().kv_pool_bytes == whole.pool_bytes());
  CHECK(split.stats().kv_bytes == single.stats().kv_bytes);
  CHECK(split.stats().pipeline_stages == static_cast<int>(layers.size()));
  CHECK(split.stats().stage_layers == layers);
  CHECK(split.stats().topology == split_name(layers));
  CHECK(single.stats().topology == "single");
  CHECK(single.stage_count() == 1);
}

void run_split(const Model& m, const KvFormat& f) {
  INFO("model " << m.path << ", format " << f.name());
  const std::vector<int> prompt = joined_turns(m);
  REQUIRE(static_cast<int>(prompt.size()) > 2 * kChunk);
  EngineOptions so = options(m, f);
  so.prefill_chunk = kChunk;
  Engine single(m, so);
  const Run want = run_prompt(single, prompt);
  // Anti-vacuity: the logits move from position to position.
  CHECK_FALSE(bitwise_equal(want.logits.front(), want.logits.back()));
  for (const auto& layers : splits_of(m)) {
    INFO("split " << split_name(layers));
    Engine split(m, split_options(m, f, layers));
    const Run got = run_prompt(split, prompt);
    CHECK(first_diff(got, want) == -1);
    check_stores(split, single, layers);
  }
}

void run_split_stream(const Model& m, const KvFormat& f) {
  INFO("model " << m.path << ", format " << f.name());
  const std::vector<int> prompt = joined_turns(m);
  EngineOptions so = options(m, f, 0, 4);
  so.prefill_chunk = kChunk;
  Engine single(m, so);
  const Run want = run_prompt(single, prompt);
  const std::vector<int> layers = splits_of(m).back();
  for (int window : {3, 8}) {  // below a page (4 tokens) and two pages
    INFO("split " << split_name(layers) << ", window " << window << " tokens");
    Engine split(m, split_options(m, f, layers, window));
    Run got;
    {  // the prompt, then decode steps with the coherence of every stage checked after each
      const std::vector<float> all = split.forward_all_logits(prompt);
      const std::size_t V = static_cast<std::size_t>(split.vocab_size());
      for (std::size_t i = 0; i < prompt.size(); ++i)
        got.logits.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(i * V),
                                all.begin() + static_cast<std::ptrdiff_t>((i + 1) * V));
      int tok = argmax(got.logits.back());
      for (int s = 0; s < kSteps; ++s) {
        for (int i = 0; i < split.stage_count(); ++i) {
          INFO("stage " << i << ", step " << s);
          CHECK(split.stage_store(i).check_stream_coherent().empty());
        }
        got.logits.push_back(split.decode(tok));
        tok = argmax(got.logits.back());
      }
    }
    CHECK(first_diff(got, want) == -1);
    long long misses = 0;
    for (int i = 0; i < split.stage_count(); ++i) {
      INFO("stage " << i);
      const PagedKvStore& st = split.stage_store(i);
      REQUIRE(st.streaming());
      CHECK(st.stream_counters().misses > 0);  // this stage's window really moved
      CHECK(st.check_stream_coherent().empty());
      misses += st.stream_counters().misses;
    }
    CHECK(split.stats().kv_block_misses == misses);
  }
}

void run_split_persist(const Model& m, const KvFormat& f) {
  INFO("model " << m.path << ", format " << f.name());
  const auto turns = three_turns(m);
  const std::vector<int> layers = splits_of(m).size() > 2 ? splits_of(m)[3] : splits_of(m)[0];
  INFO("split " << split_name(layers));
  TempDir dir;
  EngineOptions so = options(m, f);
  so.prefill_chunk = kChunk;
  // Turn 1 live on both, saved with the pending sample.
  Engine single(m, so), split(m, split_options(m, f, layers));
  Trace ts, tp;
  const int pend_s = greedy_turn(single, turns[0], kSteps, ts);
  const int pend_p = greedy_turn(split, turns[0], kSteps, tp);
  REQUIRE(pend_s == pend_p);
  const int pend[1] = {pend_s};
  single.save_kv(dir.file("single.kvf"), pend);
  split.save_kv(dir.file("split.kvf"), pend);
  const auto bytes_single = read_bytes(dir.file("single.kvf")), bytes_split = read_bytes(dir.file("split.kvf"));
  CHECK(bytes_split == bytes_single);  // the same file whoever holds the layers
  const KvFile fsplit = read_kv_file(dir.file("split.kvf")), fsingle = read_kv_file(dir.file("single.kvf"));
  CHECK(fsplit.header.n_layers == m.config.n_layers);
  if (uses_tensor_scale(f)) CHECK(fsplit.header.k_scale == on_every_head(k_scales(m.config.n_layers), m.config.n_kv_heads));
  // Turn 2 live (the single engine continues) vs hydrated across topologies.
  std::vector<int> prompt = fsplit.tokens;
  prompt.insert(prompt.end(), turns[1].begin(), turns[1].end());
  std::vector<int> live_in{pend_s};
  live_in.insert(live_in.end(), turns[1].begin(), turns[1].end());
  Trace live;
  greedy_turn(single, live_in, kSteps, live);
  struct Case {
    const char* name;
    const KvFile* file;
    bool split_engine;
  };
  for (const Case& c : {Case{"split file -> unsplit engine", &fsplit, false}, Case{"unsplit file -> split engine", &fsingle, true}}) {
    INFO(c.name);
    Engine e(m, c.split_engine ? split_options(m, f, layers) : so);
    const int n = e.hydrate(*c.file, prompt);
    CHECK(n == c.file->header.used_tokens);
    CHECK(n > 0);
    Trace t;
    greedy_turn(e, std::span<const int>(prompt).subspan(static_cast<std::size_t>(n)), kSteps, t);
    CHECK(e.stats().prefill_tokens == static_cast<long long>(prompt.size()) - n);  // only the new tokens
    CHECK(first_difference(t, live) == -1);
  }
  // Negative control: a file whose body is zeroed (checksums made to match) changes turn 2 on the split.
  Regions r = regions_of(bytes_single, fsingle.header);
  KvFileHeader h = fsingle.header;
  std::vector<std::uint8_t> zero(r.body.size(), 0);
  h.body_xxh64 = kv_checksum(zero.data(), zero.size());
  write_bytes(dir.file("zero.kvf"), assemble(h, r.tokens, zero, r.scales));
  Engine e(m, split_options(m, f, layers));
  const int n = e.hydrate(read_kv_file(dir.file("zero.kvf")), prompt);
  Trace t;
  greedy_turn(e, std::span<const int>(prompt).subspan(static_cast<std::size_t>(n)), kSteps, t);
  CHECK(first_difference(t, live) != -1);
}

// Records the layers a read hook is handed.
struct LayerRecorder : KvReadHook {
  mutable std::mutex mu;
  mutable std::set<int> layers;
  void on_read(int layer, KvHalf, int, int, int, float*) const override {
    std::lock_guard<std::mutex> lock(mu);
    layers.insert(layer);
  }
};

}  // namespace

#define PAR_SPLIT(id, preset)                                                                                  \
  TEST_CASE("PAR.split." id " 2 and 3 pipeline stages (even, uneven) == unsplit, every position, bitwise",     \
            "[gate:PAR][fmt:" preset "]") {                                                                    \
    on_par_models(run_split, fmt_of(preset));                                                                  \
  }                                                                                                            \
  TEST_CASE("PAR.split.stream." id " streamed KV on a split == resident unsplit, bitwise; every stage streams", \
            "[gate:PAR][fmt:" preset "]") {                                                                    \
    run_split_stream(stories(), fmt_of(preset));                                                               \
  }                                                                                                            \
  TEST_CASE("PAR.split.persist." id " a split run's KV file == the unsplit one's; each hydrates the other",   \
            "[gate:PAR][fmt:" preset "]") {                                                                    \
    on_par_models(run_split_persist, fmt_of(preset));                                                          \
  }

KVGATE_PRESETS(PAR_PRESET_ROW, PAR_SPLIT)  // one test case per preset: kvgate/format_list.hpp
PAR_SPLIT("mixed", "k=q8_0,v=fp8_e5m2")

TEST_CASE("PAR.split.options a stage list that does not split the model is refused; the hook sees model layers",
          "[gate:PAR][fmt:int8]") {
  const Model& m = stories();
  const KvFormat f = fmt_of("int8");
  auto with = [&](int stages, std::vector<int> layers) {
    EngineOptions o = options(m, f);
    o.pipeline_stages = stages;
    o.pipeline_layers = std::move(layers);
    return o;
  };
  CHECK_THROWS_WITH(Engine(m, with(0, {})), kvgate_catch::contains("--pp 0 pipeline stages for a model of 5 layers"));
  CHECK_THROWS_WITH(Engine(m, with(6, {})), kvgate_catch::contains("give 1 (no split) to 5"));
  CHECK_THROWS_WITH(Engine(m, with(2, {2, 2})), kvgate_catch::contains("--pp-layers 2,2 does not split"));
  CHECK_THROWS_WITH(Engine(m, with(2, {5, 0})), kvgate_catch::contains("each >= 1, summing to 5"));
  CHECK_THROWS_WITH(Engine(m, with(3, {2, 3})), kvgate_catch::contains("into 3 stages"));
  // Default ranges: as even as possible, the first stages one layer more.
  Engine e3(m, with(3, {}));
  CHECK(e3.stats().stage_layers == std::vector<int>{2, 2, 1});
  CHECK(e3.stats().topology == "pipeline:2+2+1");
  CHECK_THROWS_WITH(e3.stage_store(3), kvgate_catch::contains("no pipeline stage 3"));
  // The read hook of a split is handed model layer indices, every one of them.
  auto rec = std::make_shared<LayerRecorder>();
  EngineOptions o = with(2, {1, 4});
  o.kv_read_hook = rec;
  Engine e(m, o);
  e.prefill(three_turns(m)[0]);
  CHECK(rec->layers == std::set<int>{0, 1, 2, 3, 4});
}
