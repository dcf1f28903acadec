// PAR.stream.<fmt>: streamed KV (a resident window in the device pool, every block in the host
// mirror) vs all-resident: bitwise-identical attention outputs (store level: prefill chunks that
// cross the window, then decode) and bitwise-identical logits (engine level, stories260K and the
// synth head_dim-64 model), for windows smaller than a page, of one page, and of a few pages.
// Anti-vacuity: the counters prove misses happened (and hits where the window can hold the
// working set), bytes moved = misses x (K page + V page), and after every step every resident
// device copy equals its host mirror (a writer that skips either copy fails here or in parity).
#include <random>

#include "kvgate/attention.hpp"
#include "kvgate/format_list.hpp"
#include "par_common.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::par;

namespace {

// Store-level parity: same writes into a resident store and a streamed one, attention after each.
void store_parity(const KvFormat& f, int window_tokens) {
  INFO("format " << f.name() << ", window " << window_tokens << " tokens");
  StoreConfig cfg;
  cfg.format = f;
  cfg.n_layers = 2;
  cfg.n_kv_heads = 2;
  cfg.head_dim = 32;
  cfg.block_size = 4;
  cfg.n_blocks = 16;
  cfg.k_scale = {0.37f, 0.41f};
  cfg.v_scale = {0.0213f, 0.05f};
  PagedKvStore res(cfg), str(cfg);
  str.set_streaming(window_tokens);
  const SeqId a = res.create_sequence(), b = str.create_sequence();
  const int HD = cfg.n_kv_heads * cfg.head_dim, n_heads = 4;
  std::mt19937 rng(1234u + static_cast<unsigned>(window_tokens));
  // A prompt of 11 tokens (crosses the window and 3 pages), then 26 decode steps.
  std::vector<int> chunks{11};
  for (int i = 0; i < 26; ++i) chunks.push_back(1);
  int pos = 0;
  long long steps_with_diff = 0, checks = 0;
  for (int n : chunks) {
    res.extend(a, n);
    str.extend(b, n);
    for (int l = 0; l < cfg.n_layers; ++l) {
      const auto k = gates::normal_rows(rng, static_cast<std::size_t>(n) * HD, 1.0f);
      const auto v = gates::normal_rows(rng, static_cast<std::size_t>(n) * HD, 0.05f);
      res.write(a, l, pos, n, k.data(), HD, v.data(), HD);
      str.write(b, l, pos, n, k.data(), HD, v.data(), HD);
      const auto q = gates::normal_rows(rng, static_cast<std::size_t>(n) * n_heads * cfg.head_dim, 0.5f);
      AttentionArgs aa;
      aa.n_q = n;
      aa.n_heads = n_heads;
      aa.pos0 = pos;
      std::vector<float> oa(q.size()), ob(q.size());
      attention(res, a, l, aa, q.data(), oa.data());
      attention(str, b, l, aa, q.data(), ob.data());
      ++checks;
      if (!bitwise_equal(oa, ob)) ++steps_with_diff;
    }
    pos += n;
    const std::string coh = str.check_stream_coherent();
    INFO("after position " << pos << ": " << coh);
    REQUIRE(coh.empty());
  }
  CHECK(steps_with_diff == 0);
  CHECK(checks == static_cast<long long>(chunks.size()) * cfg.n_layers);
  const StreamCounters c = str.stream_counters();
  CHECK(c.misses > 0);
  CHECK(c.lookups > c.misses);
  CHECK(c.bytes_moved == c.misses * static_cast<long long>(str.page_bytes(KvHalf::K) + str.page_bytes(KvHalf::V)));
  CHECK(c.evictions > 0);  // the window is smaller than the 10 pages of the sequence
  CHECK(c.bytes_written_through > 0);  // decode writes hit resident blocks: the device copy was written
  CHECK(str.window()->window_blocks() == std::max(1, (window_tokens + cfg.block_size - 1) / cfg.block_size));
  // Reading through the window changes nothing in the host mirror.
  for (int p = 0; p < static_cast<int>(res.block_table(a).size()); ++p)
    for (int l = 0; l < cfg.n_layers; ++l)
      for (KvHalf h : {KvHalf::K, KvHalf::V})
        CHECK(std::memcmp(res.host_page(l, h, res.block_table(a)[static_cast<std::size_t>(p)]),
                          str.host_page(l, h, str.block_table(b)[static_cast<std::size_t>(p)]), res.page_bytes(h)) == 0);
}

// Engine-level parity: greedy logits of a long prompt (crossing the window) and decode steps.
void engine_parity(const Model& m, const KvFormat& f, int window_tokens, int threads = 1) {
  INFO("model " << m.path << ", format " << f.name() << ", window " << window_tokens << ", threads " << threads);
  const auto turns = three_turns(m);
  std::vector<int> prompt;
  for (const auto& t : turns) prompt.insert(prompt.end(), t.begin(), t.end());
  // With threads > 1 the resident engine splits a prefill chunk's queries across threads; the
  // streamed one reads its window from one thread: the results must still be bitwise equal.
  Engine res(m, options(m, f, 0, 16, threads)), str(m, options(m, f, window_tokens, 16, threads));
  Trace tr, ts;
  // Two prefill chunks (the second starts mid-page), then decode.
  const std::size_t cut = prompt.size() / 2 + 3;
  tr.logits.push_back(res.prefill(std::span<const int>(prompt).first(cut)));
  ts.logits.push_back(str.prefill(std::span<const int>(prompt).first(cut)));
  greedy_turn(res, std::span<const int>(prompt).subspan(cut), 20, tr);
  greedy_turn(str, std::span<const int>(prompt).subspan(cut), 20, ts);
  CHECK(first_difference(tr, ts) == -1);
  CHECK(str.store().check_stream_coherent().empty());
  const EngineStats& s = str.stats();
  CHECK(s.kv_resident_tokens == window_tokens);
  CHECK(s.kv_block_misses > 0);
  CHECK(s.kv_block_lookups > s.kv_block_misses);
  CHECK(s.kv_bytes_moved > 0);
  CHECK(s.kv_device_bytes < res.stats().kv_device_bytes);  // the window is smaller than the pool
  CHECK(res.stats().kv_block_lookups == 0);                 // the resident engine does not stream
  CHECK(str.position() > window_tokens);                    // the sequence crossed the window
}

}  // namespace

#define PAR_STREAM(id, preset)                                                                               \
  TEST_CASE("PAR.stream." id " streamed == resident: attention outputs and logits, bitwise; misses happened", \
            "[gate:PAR][fmt:" preset "]") {                                                                  \
    const KvFormat f = fmt_of(preset);                                                                       \
    SECTION("store: window of 1 token (smaller than a page)") { store_parity(f, 1); }                        \
    SECTION("store: window of 3 tokens (smaller than a page)") { store_parity(f, 3); }                       \
    SECTION("store: window of 1 page") { store_parity(f, 4); }                                               \
    SECTION("store: window of 2.25 pages") { store_parity(f, 9); }                                           \
    SECTION("engine stories260K: window of 5 tokens") { engine_parity(stories(), f, 5); }                   \
    SECTION("engine stories260K: window of 40 tokens") { engine_parity(stories(), f, 40); }                  \
    SECTION("engine synth head_dim 64: window of 20 tokens") { engine_parity(synth64(), f, 20); }            \
    SECTION("engine stories260K, 2 threads: window of 16 tokens") { engine_parity(stories(), f, 16, 2); }     \
  }

#define PAR_STREAM_ROW(A, name, k, v, slot, kind) PAR_STREAM(#name, #name)
KVGATE_PRESETS(PAR_STREAM_ROW, _)  // one row per preset: kvgate/format_list.hpp
PAR_STREAM("mixed", "k=q8_0,v=fp8_e5m2")
PAR_STREAM("mixed_rot", "k=fp8_e4m3,v=q4_0_rot")

TEST_CASE("PAR.stream.restore a hydrated streamed engine == a hydrated resident one, bitwise",
          "[gate:PAR][fmt:k8v4]") {
  const Model& m = stories();
  const KvFormat f = fmt_of("k8v4");
  const auto turns = three_turns(m);
  TempDir dir;
  Engine a(m, options(m, f));
  Trace ta;
  const int pending = greedy_turn(a, turns[0], 12, ta);
  const int pend[1] = {pending};
  a.save_kv(dir.file("c.kvf"), pend);
  const KvFile file = read_kv_file(dir.file("c.kvf"));
  std::vector<int> prompt = file.tokens;
  prompt.insert(prompt.end(), turns[1].begin(), turns[1].end());
  Engine res(m, options(m, f)), str(m, options(m, f, 7));
  // The streamed engine held another sequence first: its window is warm with stale blocks.
  Trace warm;
  greedy_turn(str, turns[2], 3, warm);
  const int n1 = res.hydrate(file, prompt), n2 = str.hydrate(file, prompt);
  CHECK(n1 == n2);
  CHECK(str.store().check_stream_coherent().empty());
  Trace tr, ts;
  greedy_turn(res, std::span<const int>(prompt).subspan(static_cast<std::size_t>(n1)), 8, tr);
  greedy_turn(str, std::span<const int>(prompt).subspan(static_cast<std::size_t>(n2)), 8, ts);
  CHECK(first_difference(tr, ts) == -1);
  CHECK(str.stats().kv_block_misses > 0);
}
