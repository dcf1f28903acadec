// PAR.swap.<fmt>: a sequence swapped out to host memory and back (into other blocks, after another
// sequence scribbled on the pool) continues with logits bitwise identical to an untouched engine.
// PAR.truncate.<fmt>: a sequence extended, then truncated mid-page, continues exactly like one
// that never held the cut tokens (codes and scales of the cut slots are gone), resident and
// streamed.
#include <random>

#include "kvgate/format_list.hpp"
#include "par_common.hpp"

using namespace kvgate;
using namespace kvgate::par;

namespace {

std::vector<int> long_prompt(const Model& m) {
  std::vector<int> p;
  for (const auto& t : three_turns(m)) p.insert(p.end(), t.begin(), t.end());
  return p;
}

void run_swap(const Model& m, const KvFormat& f, int resident) {
  INFO("model " << m.path << ", format " << f.name() << ", window " << resident);
  const std::vector<int> prompt = long_prompt(m);
  Engine u(m, options(m, f, resident)), s(m, options(m, f, resident));
  Trace tu, ts;
  const int pu = greedy_turn(u, prompt, 5, tu);
  const int ps = greedy_turn(s, prompt, 5, ts);
  REQUIRE(pu == ps);
  PagedKvStore& st = s.store();
  const std::vector<int> before(st.block_table(s.sequence()).begin(), st.block_table(s.sequence()).end());
  st.swap_out(s.sequence());
  CHECK(st.residency(s.sequence()) == Residency::swapped);
  // Another sequence takes the freed blocks and fills them with different K/V.
  const SeqId other = scribble_sequence(st, m.config, static_cast<int>(before.size()) * st.config().block_size, 7, 2.0f);
  st.swap_in(s.sequence());
  const std::vector<int> after(st.block_table(s.sequence()).begin(), st.block_table(s.sequence()).end());
  CHECK(after != before);  // anti-vacuity: the pages really moved
  CHECK(st.check_stream_coherent().empty());
  Trace cu, cs;
  greedy_turn(u, std::span<const int>(&pu, 1), 12, cu);
  greedy_turn(s, std::span<const int>(&ps, 1), 12, cs);
  CHECK(first_difference(cu, cs) == -1);
  st.free_sequence(other);
}

void run_truncate(const Model& m, const KvFormat& f, int resident) {
  INFO("model " << m.path << ", format " << f.name() << ", window " << resident);
  const auto turns = three_turns(m);
  Engine a(m, options(m, f, resident)), b(m, options(m, f, resident));
  Trace ta, tb;
  // The kept prefix ends mid-page.
  const std::size_t n0 = turns[0].size() % 16 == 0 ? turns[0].size() - 1 : turns[0].size();
  a.prefill(std::span<const int>(turns[0]).first(n0));
  b.prefill(std::span<const int>(turns[0]).first(n0));
  const int keep = a.position();
  REQUIRE(keep % 16 != 0);
  greedy_turn(a, turns[1], 6, ta);  // tokens that will be cut (a page boundary is crossed)
  CHECK(a.position() > (keep / 16 + 1) * 16);
  a.truncate(keep);
  CHECK(a.position() == keep);
  CHECK(a.history().size() == static_cast<std::size_t>(keep));
  CHECK(a.store().check_stream_coherent().empty());
  // Right after the cut: every page byte (codes and scales of the cut slots included) equals the
  // store that never held the cut tokens.
  auto same_pages = [&](const Engine& x, const Engine& y) {
    const auto bx = x.store().block_table(x.sequence()), by = y.store().block_table(y.sequence());
    if (bx.size() != by.size()) return false;
    for (std::size_t p = 0; p < bx.size(); ++p)
      for (int l = 0; l < m.config.n_layers; ++l)
        for (KvHalf h : {KvHalf::K, KvHalf::V})
          if (std::memcmp(x.store().host_page(l, h, bx[p]), y.store().host_page(l, h, by[p]), x.store().page_bytes(h)) != 0)
            return false;
    return true;
  };
  CHECK(same_pages(a, b));
  Trace ca, cb;
  greedy_turn(a, turns[2], 10, ca);
  greedy_turn(b, turns[2], 10, cb);
  CHECK(first_difference(ca, cb) == -1);
  CHECK(same_pages(a, b));
}

}  // namespace

#define PAR_SWAP(id, preset)                                                                                        \
  TEST_CASE("PAR.swap." id " swap out/in (into other blocks) == untouched, bitwise logits", "[gate:PAR][fmt:" preset "]") { \
    const KvFormat f = fmt_of(preset);                                                                                \
    SECTION("stories260K resident") { run_swap(stories(), f, 0); }                                                  \
    SECTION("stories260K streamed, window 12") { run_swap(stories(), f, 12); }                                       \
    SECTION("synth head_dim 64") { run_swap(synth64(), f, 0); }                                                      \
  }                                                                                                                   \
  TEST_CASE("PAR.truncate." id " truncate mid-page == never appended, bitwise logits and bytes",                       \
            "[gate:PAR][fmt:" preset "]") {                                                                           \
    const KvFormat f = fmt_of(preset);                                                                                \
    SECTION("stories260K resident") { run_truncate(stories(), f, 0); }                                               \
    SECTION("stories260K streamed, window 20") { run_truncate(stories(), f, 20); }                                   \
    SECTION("synth head_dim 64") { run_truncate(synth64(), f, 0); }                                                  \
  }

#define PAR_SWAP_ROW(A, name, k, v, slot, kind) PAR_SWAP(#name, #name)
KVGATE_PRESETS(PAR_SWAP_ROW, _)  // one row per preset: kvgate/format_list.hpp
PAR_SWAP("mixed", "k=q8_0,v=fp8_e5m2")
PAR_SWAP("mixed_rot", "k=fp8_e4m3,v=q4_0_rot")
