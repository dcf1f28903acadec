// PAR.lifecycle: the engine stats matrix. Every entry point of an engine (fresh, generate, reset,
// truncate to 0 / a page boundary / mid-page, hydrate into a fresh and into a used engine, a second
// conversation turn, a streamed engine) x every engine kind (a fallen-back engine, a streamed one,
// an fp8 engine with per-layer scales) -> the stats it must report, as a table. The class it closes:
// an entry point that forgets or leaks a stat (a reset or hydrate that drops the fallback reason, a
// hydrate that does not report its tokens, a truncate that keeps the old history or pages).
//
// Expected values are derived from the options, never measured:
//  - the configuration stats (requested, effective, fallback reason, block size, page count, pool,
//    window, device bytes) are those of construction, whatever entry point ran since;
//  - position = history size = tokens in the sequence;
//  - kv_bytes = ceil(position / B) * kv_pool_bytes / n_blocks (a sequence holds whole pages; the pool
//    is n_blocks pages of every layer, K and V);
//  - kv_device_bytes of a streamed engine = ceil(window / B) * kv_pool_bytes / n_blocks, of a
//    resident one the whole pool;
//  - hydrated_tokens = the prefix restored (the file's tokens, leaving one prompt token to prefill),
//    0 after reset and on a fresh engine.
// Compared exactly (integers and strings).
#include <string>
#include <vector>

#include "kvgate/resolve.hpp"
#include "model_fixtures.hpp"
#include "par_common.hpp"

using namespace kvgate;
using namespace kvgate::par;
using kvgate::gates::odd_geometry_options;
using kvgate::gates::resolved_engine_options;
using kvgate::gates::synth_model_once;

namespace {

// The odd-geometry model (gates/common/model_fixtures.hpp): q8_0 and k8v4 fall back on its rows of 24
// (to the format resolve_kv names). Two layers, seed 9, context 128.
const Model& odd_geometry() {
  SynthOptions o = odd_geometry_options(2, 128);
  o.seed = 9;
  return synth_model_once("hd12", o);
}

struct Kind {
  std::string name;
  const Model* model;
  EngineOptions opts;
};

std::vector<Kind> kinds() {
  std::vector<Kind> ks;
  ks.push_back({"fallen back (q8_0 on rows of 24)", &odd_geometry(),
                resolved_engine_options(odd_geometry(), fmt_of("q8_0"), 16, 128)});
  {
    EngineOptions o = resolved_engine_options(odd_geometry(), fmt_of("k8v4"), 8, 128);
    o.kv_resident = 20;  // a window of 3 pages of 8
    ks.push_back({"fallen back and streamed (k8v4, window 20, B=8)", &odd_geometry(), o});
  }
  ks.push_back({"fp8 per-layer scales (stories260K, B=16)", &stories(), options(stories(), fmt_of("fp8"))});
  ks.push_back({"int8 streamed (stories260K, window 32, B=16)", &stories(), options(stories(), fmt_of("int8"), 32)});
  return ks;
}

std::size_t pages(int tokens, int B) { return static_cast<std::size_t>((tokens + B - 1) / B); }

// The stats every entry point keeps from construction.
void check_config(const EngineStats& s, const EngineStats& at_construction, const Kind& k, const std::string& entry) {
  INFO(k.name << " / " << entry);
  CHECK(s.requested_kv == at_construction.requested_kv);
  CHECK(s.effective_kv == at_construction.effective_kv);
  CHECK(s.fallback_reason == at_construction.fallback_reason);
  CHECK(s.backend == at_construction.backend);
  CHECK(s.block_size == k.opts.block_size);
  CHECK(s.n_blocks == at_construction.n_blocks);
  CHECK(s.kv_pool_bytes == at_construction.kv_pool_bytes);
  CHECK(s.kv_resident_tokens == k.opts.kv_resident);
  const std::size_t page_all_layers = at_construction.kv_pool_bytes / static_cast<std::size_t>(at_construction.n_blocks);
  CHECK(s.kv_device_bytes ==
        (k.opts.kv_resident > 0 ? pages(k.opts.kv_resident, k.opts.block_size) * page_all_layers : at_construction.kv_pool_bytes));
}

void check_sequence(const Engine& e, int tokens, int hydrated, const Kind& k, const std::string& entry) {
  INFO(k.name << " / " << entry << ": expected " << tokens << " tokens, " << hydrated << " hydrated");
  const EngineStats& s = e.stats();
  CHECK(e.position() == tokens);
  CHECK(static_cast<int>(e.history().size()) == tokens);
  CHECK(s.hydrated_tokens == hydrated);
  CHECK(s.kv_bytes == pages(tokens, k.opts.block_size) * (s.kv_pool_bytes / static_cast<std::size_t>(s.n_blocks)));
}

}  // namespace

TEST_CASE("PAR.lifecycle every engine entry point reports the stats the table derives", "[gate:PAR][fmt:q8_0][fmt:k8v4][fmt:fp8][fmt:int8]") {
  int fallen_back = 0;
  for (const Kind& k : kinds()) {
    TempDir td;
    const int B = k.opts.block_size;
    Engine e(*k.model, k.opts);
    const EngineStats c = e.stats();
    if (!c.fallback_reason.empty()) {
      ++fallen_back;
      CHECK(c.effective_kv != c.requested_kv);  // anti-vacuity: a real fallback, named
    }
    check_config(c, c, k, "fresh");
    check_sequence(e, 0, 0, k, "fresh");

    // generate: prompt of 2B + 1 tokens (a page boundary + 1), 2B - 2 steps. On stories260K the
    // prompt is BOS + its verified greedy text (the continuation stays text: no BOS/EOS stop).
    std::vector<int> prompt;
    for (int i = 0; i < 2 * B + 1; ++i)
      prompt.push_back(k.model == &stories() ? (i == 0 ? 1 : gates::kStories260KGreedy64[static_cast<std::size_t>(i - 1)])
                                             : 5 + (i * 37) % 200);
    const GenerateResult r = e.generate(prompt, 2 * B - 2, SamplerOptions{});
    REQUIRE(r.stop_reason == "steps");
    const int after_gen = static_cast<int>(prompt.size() + r.tokens.size()) - 1;  // the last sampled id is not in the KV
    check_config(e.stats(), c, k, "generate");
    check_sequence(e, after_gen, 0, k, "generate");
    CHECK(e.stats().prefill_tokens == static_cast<long long>(prompt.size()));
    const std::vector<int> full(e.history().begin(), e.history().end());
    e.save_kv(td.file("a.kv"), std::span<const int>(&r.tokens.back(), 1));

    // truncate to k*B + 1, k*B, k*B - 1 (mid-page and both sides of a page boundary), then 0.
    for (const int n : {2 * B + 1, 2 * B, 2 * B - 1, B, 1, 0}) {
      e.truncate(n);
      check_config(e.stats(), c, k, "truncate " + std::to_string(n));
      check_sequence(e, n, 0, k, "truncate " + std::to_string(n));
      CHECK(std::equal(e.history().begin(), e.history().end(), full.begin()));
    }

    // reset of a used engine.
    e.generate(prompt, 3, SamplerOptions{});
    e.reset();
    check_config(e.stats(), c, k, "reset");
    check_sequence(e, 0, 0, k, "reset");
    CHECK(e.stats().prefill_tokens == 0);
    CHECK(e.stats().decode_tokens == 0);

    // hydrate into a fresh engine and into a used one: the whole file but the last prompt token.
    std::vector<int> turn2 = full;
    turn2.push_back(r.tokens.back());
    turn2.push_back(17);
    const KvFile f = read_kv_file(td.file("a.kv"));
    Engine fresh(*k.model, k.opts);
    const int n_fresh = fresh.hydrate(f, turn2);
    CHECK(n_fresh == after_gen);
    check_config(fresh.stats(), c, k, "hydrate (fresh engine)");
    check_sequence(fresh, after_gen, after_gen, k, "hydrate (fresh engine)");
    e.generate(prompt, 2, SamplerOptions{});
    const int n_used = e.hydrate(f, turn2);
    CHECK(n_used == after_gen);
    check_config(e.stats(), c, k, "hydrate (used engine)");
    check_sequence(e, after_gen, after_gen, k, "hydrate (used engine)");

    // the second turn continues from the hydrated prefix: prefills the rest, keeps the hydrated count.
    const std::span<const int> rest = std::span<const int>(turn2).subspan(static_cast<std::size_t>(n_used));
    const GenerateResult r2 = e.generate(rest, 3, SamplerOptions{});
    check_config(e.stats(), c, k, "conversation turn 2");
    check_sequence(e, after_gen + static_cast<int>(rest.size() + r2.tokens.size()) - 1, after_gen, k, "conversation turn 2");
    CHECK(e.stats().prefill_tokens == static_cast<long long>(rest.size()));

    // reset after hydrate: the hydrated count goes, the configuration stays.
    e.reset();
    check_config(e.stats(), c, k, "reset after hydrate");
    check_sequence(e, 0, 0, k, "reset after hydrate");
  }
  CHECK(fallen_back == 2);  // anti-vacuity: both odd-geometry engines really fell back
}
