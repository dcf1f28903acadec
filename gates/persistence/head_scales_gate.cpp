// PAR.head_scales.<fmt>: the lifecycle of static fp8 scales per KV head (docs/FORMATS.md "Static
// scales per KV head"). An engine whose K and V scales differ per head, per layer and between K
// and V (gates/common/head_scales.hpp) continues with logits bitwise identical to an untouched
// engine after each state transition, and its scales stay byte-identical: swap out/in (into other
// blocks), truncate mid-page, persist/hydrate (a fresh engine, the conversation turn of
// kv_cache_dir's Conversation), streaming (a window far smaller than the context), and the
// pipeline split (a file saved by two stages hydrates one store). The KV file (version 3) carries
// every head's scale; a run whose scales differ in one head is refused naming the layer and head.
// Bound: bitwise (every transition moves bytes; no arithmetic is re-done differently).
// Anti-vacuity: the same engine with each layer's head-0 scale on every head gives other logits
// (the heads' scales matter on this model), the file's head-scales region holds every (layer,
// half, head) scale, and a doctored file whose head scales were reset to 1.0 is refused.

#include "head_scales.hpp"
#include "par_common.hpp"

using namespace kvgate;
using namespace kvgate::par;
using kvgate::gates::gate_head_scales;

namespace {

EngineOptions head_options(const Model& m, const KvFormat& f, int resident = 0, int stages = 1) {
  EngineOptions o = options(m, f, resident);
  o.k_scale = gate_head_scales(m.config.n_layers, m.config.n_kv_heads, KvHalf::K);
  o.v_scale = gate_head_scales(m.config.n_layers, m.config.n_kv_heads, KvHalf::V);
  o.pipeline_stages = stages;
  return o;
}

std::vector<int> all_turns(const Model& m) {
  std::vector<int> p;
  for (const auto& t : three_turns(m)) p.insert(p.end(), t.begin(), t.end());
  return p;
}

// Every head scale of every layer and half of the engine's store(s), in layer order.
std::vector<float> scales_of(const Engine& e) {
  std::vector<float> s;
  const PagedKvStore& st = e.store();
  for (int l = 0; l < st.config().n_layers; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V})
      for (float x : st.head_scales(l, h)) s.push_back(x);
  return s;
}

std::string hydrate_refusal(Engine& e, const KvFile& file, std::span<const int> prompt) {
  try {
    e.hydrate(file, prompt);
  } catch (const KvFileError& err) {
    return err.what();
  }
  return "(no refusal)";
}

void run_head_scales(const Model& m, const KvFormat& f) {
  INFO("model " << m.path << ", format " << f.name());
  const auto turns = three_turns(m);
  const std::vector<int> prompt = all_turns(m);
  Engine ref(m, head_options(m, f));
  Trace tref;
  greedy_turn(ref, prompt, 8, tref);
  const std::vector<float> want_scales = scales_of(ref);
  CHECK(ref.store().per_head_scales());

  SECTION("anti-vacuity: head 0's scale on every head gives other logits") {
    EngineOptions o = head_options(m, f);
    const std::size_t H = static_cast<std::size_t>(m.config.n_kv_heads);
    for (auto* s : {&o.k_scale, &o.v_scale})
      for (std::size_t i = 0; i < s->size(); ++i) (*s)[i] = (*s)[i / H * H];
    Engine e(m, o);
    Trace t;
    greedy_turn(e, prompt, 8, t);
    CHECK(first_difference(tref, t) != -1);
  }
  SECTION("swap out/in") {
    Engine u(m, head_options(m, f)), s(m, head_options(m, f));
    Trace tu, ts;
    const std::size_t n0 = turns[0].size();
    greedy_turn(u, std::span<const int>(prompt).first(n0), 0, tu);
    greedy_turn(s, std::span<const int>(prompt).first(n0), 0, ts);
    PagedKvStore& st = s.store();
    const std::vector<int> before(st.block_table(s.sequence()).begin(), st.block_table(s.sequence()).end());
    st.swap_out(s.sequence());
    const SeqId other = scribble_sequence(st, m.config, static_cast<int>(before.size()) * st.config().block_size, 3, 1.0f);
    st.swap_in(s.sequence());
    CHECK(std::vector<int>(st.block_table(s.sequence()).begin(), st.block_table(s.sequence()).end()) != before);
    greedy_turn(u, std::span<const int>(prompt).subspan(n0), 8, tu);
    greedy_turn(s, std::span<const int>(prompt).subspan(n0), 8, ts);
    CHECK(first_difference(tu, ts) == -1);
    CHECK(scales_of(s) == want_scales);
    st.free_sequence(other);
  }
  SECTION("truncate mid-page") {
    Engine a(m, head_options(m, f)), b(m, head_options(m, f));
    const std::size_t keep = prompt.size() - ((prompt.size() - 3) % 16 == 0 ? 4 : 3);  // mid-page
    REQUIRE(keep % 16 != 0);
    Trace ta;
    a.prefill(std::span<const int>(prompt).first(keep));
    greedy_turn(a, turns[1], 6, ta);  // tokens that will be cut (past a page boundary)
    a.truncate(static_cast<int>(keep));
    b.prefill(std::span<const int>(prompt).first(keep));
    Trace ca, cb;
    greedy_turn(a, std::span<const int>(prompt).subspan(keep), 8, ca);
    greedy_turn(b, std::span<const int>(prompt).subspan(keep), 8, cb);
    CHECK(first_difference(ca, cb) == -1);
    CHECK(scales_of(a) == want_scales);
  }
  SECTION("streamed, window 12") {
    Engine s(m, head_options(m, f, 12));
    Trace ts;
    greedy_turn(s, prompt, 8, ts);
    CHECK(s.store().streaming());
    CHECK(s.store().stream_counters().misses > 0);
    CHECK(first_difference(tref, ts) == -1);
    CHECK(scales_of(s) == want_scales);
  }
  SECTION("persist/hydrate, conversation turns, pipeline split") {
    TempDir dir;
    KvCacheDir cache(dir.path);
    Trace tc;
    for (std::size_t t = 0; t < turns.size(); ++t) {
      // A fresh engine per turn; the middle turn runs split in two pipeline stages.
      Engine e(m, head_options(m, f, 0, t == 1 ? 2 : 1));
      Conversation c(cache, "par-head-scales");
      std::vector<int> p = c.transcript();  // the previous turns and their pending sample
      p.insert(p.end(), turns[t].begin(), turns[t].end());
      const int n = c.hydrate(e, p);
      CHECK((t == 0) == (n == 0));
      const int pend[1] = {greedy_turn(e, std::span<const int>(p).subspan(static_cast<std::size_t>(n)), 8, tc)};
      c.save(e, pend);
      const KvFile file = read_kv_file(c.path());
      CHECK(file.header.version == kKvFileVersion);
      CHECK(file.header.version >= 3);
      std::vector<float> fs;
      for (int l = 0; l < m.config.n_layers; ++l)
        for (const std::vector<float>* s : {&file.header.k_scale, &file.header.v_scale})
          for (int h = 0; h < m.config.n_kv_heads; ++h) fs.push_back((*s)[static_cast<std::size_t>(l * m.config.n_kv_heads + h)]);
      CHECK(fs == want_scales);
      if (t == 0) {
        // A run whose scales differ in one head (layer 1, V, head 2) is refused, naming them.
        EngineOptions o = head_options(m, f);
        o.v_scale[static_cast<std::size_t>(1 * m.config.n_kv_heads + 2)] *= 1.5f;
        Engine other(m, o);
        CHECK_THAT(hydrate_refusal(other, file, p), kvgate_catch::contains("V scale of layer 1 KV head 2"));
        // Head scales reset to 1.0 in a doctored file (checksums made to match): refused the same way.
        KvFileHeader h = file.header;
        std::fill(h.k_scale.begin(), h.k_scale.end(), 1.0f);
        const std::vector<std::uint8_t> orig = read_bytes(c.path());
        const Regions r = regions_of(orig, file.header);
        const KvFile doctored = parse_kv_file(assemble(h, r.tokens, r.body, r.scales), "doctored.kvf");
        Engine fresh(m, head_options(m, f));
        CHECK_THAT(hydrate_refusal(fresh, doctored, p), kvgate_catch::contains("K scale of layer 0 KV head 0"));
      }
    }
    // The same three turns live, in one engine.
    Engine live(m, head_options(m, f));
    const Trace tl = live_turns(live, turns, 8);
    CHECK(first_difference(tl, tc) == -1);
  }
}

}  // namespace

TEST_CASE("PAR.head_scales.fp8 per-KV-head scales survive swap, truncate, stream, persist/hydrate, conversation "
          "turns and the pipeline split: bitwise logits, byte-identical scales",
          "[gate:PAR][fmt:fp8]") {
  run_head_scales(stories(), fmt_of("fp8"));
}

TEST_CASE("PAR.head_scales.fp8_e5m2 per-KV-head scales (K e4m3, V e5m2) survive every transition",
          "[gate:PAR][fmt:fp8][fmt:fp8_e5m2]") {
  run_head_scales(stories(), *parse_kv_format("k=fp8_e4m3,v=fp8_e5m2"));
}
