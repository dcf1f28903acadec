// STO gates: exact byte accounting per cell/page/pool for every preset (formulas from
// docs/FORMATS.md written out here, independently of the runtime's tables), capability refusals,
// the swap/free state machine, and truncation that keeps scales aligned with their codes.
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "catch_compat.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate/kv_store.hpp"
#include "format_bytes.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;

namespace {

void run_bytes(const KvFormat& fmt) {
  const int geoms[][3] = {{16, 8, 128}, {1, 4, 8}, {7, 2, 64}, {16, 1, 256}, {3, 8, 64}};
  for (const auto& gg : geoms) {
    const PageGeometry g{gg[0], gg[1], gg[2]};
    INFO("format " << fmt.name() << " block_size=" << g.block_size << " kv_heads=" << g.n_kv_heads
                   << " head_dim=" << g.head_dim);
    const std::size_t ek = expected_page_bytes(fmt.k, gg[0], gg[1], gg[2]);
    const std::size_t ev = expected_page_bytes(fmt.v, gg[0], gg[1], gg[2]);
    CHECK(page_bytes(fmt.k, g) == ek);
    CHECK(page_bytes(fmt.v, g) == ev);
    CHECK(bytes_per_cell(fmt.k, g) == double(ek) / (gg[0] * gg[1]));
    // The runs of a page tile it exactly, in order.
    for (HalfFormat h : {fmt.k, fmt.v}) {
      std::size_t off = 0;
      for (const auto& r : page_runs(h, g)) {
        CHECK(r.offset == off);
        off += r.bytes;
      }
      CHECK(off == page_bytes(h, g));
    }
    // Pool: n_blocks x layers x (K page + V page); a sequence holds whole pages.
    StoreConfig cfg;
    cfg.format = fmt;
    cfg.n_layers = 3;
    cfg.n_kv_heads = g.n_kv_heads;
    cfg.head_dim = g.head_dim;
    cfg.block_size = g.block_size;
    cfg.n_blocks = 10;
    PagedKvStore store(cfg);
    CHECK(store.pool_bytes() == 10 * 3 * (ek + ev));
    const SeqId s = store.create_sequence();
    store.extend(s, 2 * g.block_size + 1);  // 3 pages
    CHECK(store.sequence_bytes(s) == 3 * 3 * (ek + ev));
    CHECK(store.free_blocks() == 7);
  }
}

}  // namespace

#define STO_BYTES(id, preset)                                                                   \
  TEST_CASE("STO.bytes." id " exact bytes per cell, page and pool", "[gate:STO][fmt:" preset "]") { \
    const auto f = parse_kv_format(preset);                                                     \
    REQUIRE(f.has_value());                                                                     \
    run_bytes(*f);                                                                              \
  }
#define STO_BYTES_ROW(A, name, k, v, slot, kind) STO_BYTES(#name, #name)
KVGATE_PRESETS(STO_BYTES_ROW, _)  // one row per preset: kvgate/format_list.hpp

TEST_CASE("STO.bytes.reference figures of the reference page: int8 page 33,280 B, f16 page 65,536 B at B16 H8 D128",
          "[gate:STO][fmt:int8][fmt:f16]") {
  const PageGeometry g{16, 8, 128};
  CHECK(page_bytes(HalfFormat::int8, g) * 2 == 33280);
  CHECK(page_bytes(HalfFormat::f16, g) * 2 == 65536);
}

TEST_CASE("STO.budget a memory budget buys more blocks for smaller formats", "[gate:STO]") {
  const PageGeometry g{16, 8, 128};
  const std::size_t budget = std::size_t{1} << 30;
  const int f16 = blocks_for_budget(*parse_kv_format("f16"), g, 32, budget);
  const int int8 = blocks_for_budget(*parse_kv_format("int8"), g, 32, budget);
  const int q4 = blocks_for_budget(*parse_kv_format("q4_0"), g, 32, budget);
  const int k8v4 = blocks_for_budget(*parse_kv_format("k8v4"), g, 32, budget);
  CHECK(f16 == static_cast<int>(budget / (32 * 65536)));
  CHECK(int8 == static_cast<int>(budget / (32 * 33280)));
  CHECK(int8 > f16);
  CHECK(k8v4 > int8);
  CHECK(q4 > k8v4);
}

TEST_CASE("STO.capability unsupported geometries are refused with a reason, never silently changed",
          "[gate:STO][fmt:q4_0][fmt:q8_0][fmt:k8v4]") {
  const PageGeometry odd_row{16, 1, 8};  // row of 8 elements: not a multiple of 32
  CHECK_FALSE(supports(HalfFormat::q8_0, odd_row).ok);
  CHECK(supports(HalfFormat::q8_0, odd_row).reason == "row_not_multiple_of_32");
  CHECK(supports(HalfFormat::q4_0, odd_row).reason == "row_not_multiple_of_32");
  const PageGeometry not_pow2{16, 2, 48};  // 96-element row is fine for q4_0, rotation is not
  CHECK(supports(HalfFormat::q4_0, not_pow2).ok);
  CHECK(supports(HalfFormat::q4_0_rot, not_pow2).reason == "head_dim_not_power_of_two");
  CHECK(supports(HalfFormat::int8, odd_row).ok);
  StoreConfig cfg;
  cfg.format = *parse_kv_format("k8v4");
  cfg.n_kv_heads = 2;
  cfg.head_dim = 48;
  bool threw = false;
  try {
    PagedKvStore store(cfg);
  } catch (const KvStoreError& e) {
    threw = true;
    CHECK(std::string(e.what()).find("head_dim_not_power_of_two") != std::string::npos);
  }
  CHECK(threw);
}

namespace {

std::unique_ptr<PagedKvStore> filled_store(const KvFormat& f, int n_blocks, SeqId& s, int n, std::uint64_t seed) {
  StoreConfig cfg;
  cfg.format = f;
  cfg.n_layers = 2;
  cfg.n_kv_heads = 4;
  cfg.head_dim = 32;
  cfg.block_size = 8;
  cfg.n_blocks = n_blocks;
  auto store = std::make_unique<PagedKvStore>(cfg);
  s = store->create_sequence();
  const StoreCase c{8, 4, 32, n, Pattern::gaussian, seed, 0};
  const auto k = make_rows(c, 1.0f, 1), v = make_rows(c, 0.3f, 2);
  store->extend(s, n);
  for (int l = 0; l < 2; ++l) store->write(s, l, 0, n, k.data(), 128, v.data(), 128);
  return store;
}

std::vector<std::uint8_t> snapshot(const PagedKvStore& st, SeqId s) {
  std::vector<std::uint8_t> out;
  for (int b : st.block_table(s))
    for (int l = 0; l < st.config().n_layers; ++l)
      for (KvHalf h : {KvHalf::K, KvHalf::V}) out.insert(out.end(), st.page(l, h, b), st.page(l, h, b) + st.page_bytes(h));
  return out;
}

}  // namespace

#define STO_LIFECYCLE(id, preset)                                                                              \
  TEST_CASE("STO.swap." id " swap out/in restores every byte; freeing a swapped sequence is refused",          \
            "[gate:STO][fmt:" preset "]") {                                                                    \
    const auto f = *parse_kv_format(preset);                                                                   \
    SeqId s;                                                                                                   \
    auto st = filled_store(f, 6, s, 21, 5);                                                                    \
    const auto before = snapshot(*st, s);                                                                      \
    st->swap_out(s);                                                                                           \
    CHECK(st->residency(s) == Residency::swapped);                                                             \
    CHECK(st->free_blocks() == 6);                                                                             \
    CHECK_THROWS_AS(st->free_sequence(s), KvStoreError);                                                       \
    /* occupy blocks so the swap-in cannot fit: it must fail and change nothing */                              \
    const SeqId other = st->create_sequence();                                                                 \
    st->extend(other, 8 * 4);                                                                                  \
    CHECK_THROWS_AS(st->swap_in(s), KvStoreError);                                                             \
    CHECK(st->residency(s) == Residency::swapped);                                                             \
    CHECK(st->free_blocks() == 2);                                                                             \
    st->free_sequence(other);                                                                                  \
    st->swap_in(s);                                                                                            \
    CHECK(st->residency(s) == Residency::resident);                                                            \
    CHECK(snapshot(*st, s) == before);                                                                         \
    /* anti-vacuity: the pages held data */                                                                    \
    std::size_t nonzero = 0;                                                                                   \
    for (auto b : before) nonzero += b != 0;                                                                   \
    CHECK(nonzero > before.size() / 4);                                                                        \
    st->free_sequence(s);                                                                                      \
    CHECK(st->free_blocks() == 6);                                                                             \
  }                                                                                                            \
  TEST_CASE("STO.truncate." id " truncation clears cut codes and scales; re-append equals a fresh store",      \
            "[gate:STO][fmt:" preset "]") {                                                                    \
    const auto f = *parse_kv_format(preset);                                                                   \
    SeqId s, s2;                                                                                               \
    auto st = filled_store(f, 6, s, 21, 9); /* 21 tokens: pages of 8, 8, 5 */                                  \
    st->truncate(s, 11);                                                                                       \
    CHECK(st->length(s) == 11);                                                                                \
    CHECK(st->block_table(s).size() == 2);                                                                     \
    auto fresh = filled_store(f, 6, s2, 11, 9);                                                                \
    CHECK(snapshot(*st, s) == snapshot(*fresh, s2)); /* slots 11.. of page 1 zero, scales included */          \
    /* re-append different data after the cut: kept tokens unchanged, new ones readable */                     \
    const StoreCase c{8, 4, 32, 4, Pattern::uniform, 77, 0};                                                   \
    const auto k = make_rows(c, 2.0f, 1), v = make_rows(c, 0.5f, 2);                                           \
    st->extend(s, 4);                                                                                          \
    fresh->extend(s2, 4);                                                                                      \
    for (int l = 0; l < 2; ++l) {                                                                              \
      st->write(s, l, 11, 4, k.data(), 128, v.data(), 128);                                                    \
      fresh->write(s2, l, 11, 4, k.data(), 128, v.data(), 128);                                                \
    }                                                                                                          \
    CHECK(snapshot(*st, s) == snapshot(*fresh, s2));                                                           \
    CHECK(st->check_guards().empty());                                                                         \
  }
#define STO_LIFECYCLE_ROW(A, name, k, v, slot, kind) STO_LIFECYCLE(#name, #name)
KVGATE_PRESETS(STO_LIFECYCLE_ROW, _)  // one row per preset: kvgate/format_list.hpp

TEST_CASE("STO.errors impossible requests fail with a clear message", "[gate:STO]") {
  SeqId s;
  auto st = filled_store(*parse_kv_format("int8"), 3, s, 10, 1);
  CHECK_THROWS_WITH(st->extend(s, 100), kvgate_catch::contains("out of KV blocks"));
  CHECK_THROWS_AS(st->truncate(s, 11), KvStoreError);
  CHECK_THROWS_AS(st->read(s, 0, KvHalf::K, 5, 10, nullptr), KvStoreError);
  CHECK_THROWS_AS(st->free_sequence(12345), KvStoreError);
  st->swap_out(s);
  CHECK_THROWS_AS(st->swap_out(s), KvStoreError);
  CHECK_THROWS_AS(st->extend(s, 1), KvStoreError);

  // The boundary: 3 blocks of 8 tokens hold 24 tokens. From 10 tokens (2 blocks, 1 free), +15 needs
  // two more blocks and must be refused with the sequence unchanged; +14 fills the pool exactly.
  SeqId s2;
  auto edge = filled_store(*parse_kv_format("int8"), 3, s2, 10, 1);
  REQUIRE(edge->free_blocks() == 1);
  CHECK_THROWS_WITH(edge->extend(s2, 15), kvgate_catch::contains("out of KV blocks"));
  CHECK(edge->length(s2) == 10);
  CHECK(edge->block_table(s2).size() == 2);
  CHECK_NOTHROW(edge->extend(s2, 14));
  CHECK(edge->length(s2) == 24);
  CHECK(edge->free_blocks() == 0);
}

TEST_CASE("STO.guards guard regions around every page detect an out-of-bounds write", "[gate:STO]") {
  SeqId s;
  auto st = filled_store(*parse_kv_format("q4_0"), 4, s, 12, 3);
  REQUIRE(st->check_guards().empty());
  // One byte past the end of a V page of layer 1, then one byte before a K page of layer 0.
  const int b = st->block_table(s)[1];
  std::uint8_t* v = st->page(1, KvHalf::V, b);
  const std::uint8_t saved = v[st->page_bytes(KvHalf::V)];
  v[st->page_bytes(KvHalf::V)] ^= 0xFF;
  const std::string report = st->check_guards();
  CHECK(report.find("layer 1 V page " + std::to_string(b)) != std::string::npos);
  v[st->page_bytes(KvHalf::V)] = saved;
  CHECK(st->check_guards().empty());
  st->page(0, KvHalf::K, 0)[-1] = 0;
  CHECK(st->check_guards().find("layer 0 K page 0") != std::string::npos);
}

// STO.names: every spelling a user types for a format reaches the format docs/FORMATS.md names,
// through both entry points (a half on its own, as --kv-k/--kv-v take it, and a K/V pair
// "k=<half>,v=<half>"). The expectations are this gate's own table (never the runtime's): each half
// format's canonical name, and the one alias, "fp8" = fp8_e4m3 (e4m3, not e5m2), which is also a
// preset. The table must cover every half format the runtime has, so a new one is spelled here too.
TEST_CASE("STO.names every half-format spelling, alone and in a K/V pair, maps to the documented format",
          "[gate:STO][fmt:fp8]") {
  struct Spelling {
    const char* text;
    HalfFormat want;
  };
  const Spelling table[] = {
      {"f32", HalfFormat::f32},         {"f16", HalfFormat::f16},           {"bf16", HalfFormat::bf16},
      {"int8", HalfFormat::int8},       {"fp8_e4m3", HalfFormat::fp8_e4m3}, {"fp8", HalfFormat::fp8_e4m3},
      {"fp8_e5m2", HalfFormat::fp8_e5m2}, {"q8_0", HalfFormat::q8_0},       {"q4_0", HalfFormat::q4_0},
      {"q4_0_rot", HalfFormat::q4_0_rot}, {"mxfp8", HalfFormat::mxfp8},     {"mxfp4", HalfFormat::mxfp4},
      {"nvfp4", HalfFormat::nvfp4},     {"fp8_per_token_head", HalfFormat::fp8_per_token_head},
      {"int8_per_token_head", HalfFormat::int8_per_token_head}, {"fp8_block128", HalfFormat::fp8_block128},
  };
  std::set<HalfFormat> covered;
  for (const Spelling& s : table) {
    INFO("spelling '" << s.text << "'");
    const auto h = parse_half(s.text);
    REQUIRE(h.has_value());
    CHECK(*h == s.want);
    covered.insert(s.want);
    // In a pair, on either side, next to another format.
    for (const char* other : {"f16", "q4_0"}) {
      const auto kv = parse_kv_format(std::string("k=") + s.text + ",v=" + other);
      REQUIRE(kv.has_value());
      CHECK(kv->k == s.want);
      CHECK(kv->v == *parse_half(other));
      const auto vk = parse_kv_format(std::string("k=") + other + ",v=" + s.text);
      REQUIRE(vk.has_value());
      CHECK(vk->v == s.want);
    }
  }
  // Anti-vacuity: the table names every half format the runtime has.
  for (HalfFormat f : all_half_formats()) {
    INFO("half format " << name(f) << " has no spelling in this gate's table");
    CHECK(covered.count(f) == 1);
  }
  // The preset "fp8" is e4m3 on both halves; unknown spellings are refused.
  CHECK(*parse_kv_format("fp8") == (KvFormat{HalfFormat::fp8_e4m3, HalfFormat::fp8_e4m3}));
  for (const char* bad : {"fp8_e4m3fn", "FP8", "e5m2", "int4", ""}) {
    INFO("spelling '" << bad << "'");
    CHECK_FALSE(parse_half(bad).has_value());
  }
}
