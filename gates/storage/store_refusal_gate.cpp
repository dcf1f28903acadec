// STO.store.refusals: every operation on a swapped-out sequence, every write/export outside the
// sequence, a released page read and bad per-tensor scales are refused with a KvStoreError naming the
// operation, the sequence and the numbers (bound: the exact message); after swap_in the same calls
// succeed and read back what was written (anti-vacuity).
// STO.store.head_scale_refusals: per-KV-head scales of the wrong count, a head scale <= 0, NaN or
// inf, and per-head scales on an nvfp4 half (one global scale per layer) are refused naming the
// field, layer and head (bound: the message); heads that agree are accepted (anti-vacuity).
// STO.store.copy: a copied (or assigned) store holds the same bytes and the same streaming window,
// and is independent of the original (a write to one leaves the other bit-identical).
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/kv_store.hpp"
#include "kvgate/kv_stream.hpp"

using namespace kvgate;
using PageRef = PagedKvStore::PageRef;

namespace {

StoreConfig small_config() {
  StoreConfig c;
  c.format = {HalfFormat::f32, HalfFormat::f32};
  c.n_layers = 2;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.block_size = 4;
  c.n_blocks = 8;
  return c;
}

template <class F>
std::string store_error(F&& f) {
  try {
    f();
  } catch (const KvStoreError& e) {
    return e.what();
  }
  return "<no KvStoreError>";
}

std::vector<float> rows(int n, float base) {
  std::vector<float> r(static_cast<std::size_t>(n) * 16);
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = base + static_cast<float>(i);
  return r;
}

void fill(PagedKvStore& st, SeqId s, int n, float base) {
  const auto k = rows(n, base), v = rows(n, -base);
  for (int l = 0; l < 2; ++l) st.write(s, l, 0, n, k.data(), 16, v.data(), 16);
}

std::vector<float> read_all(const PagedKvStore& st, SeqId s, int n) {
  std::vector<float> out(static_cast<std::size_t>(n) * 16 * 4);
  int at = 0;
  for (int l = 0; l < 2; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V}) st.read(s, l, h, 0, n, out.data() + static_cast<std::size_t>(at++) * n * 16);
  return out;
}

}  // namespace

TEST_CASE("STO.store.refusals swapped-out, out-of-range and released-page operations are refused by name",
          "[gate:STO][fmt:f32]") {
  {
    StoreConfig c = small_config();
    c.k_scale = {1.0f};
    CHECK(store_error([&] { PagedKvStore st(c); }) == "kv store: k_scale/v_scale must have one entry per layer (2) or one per layer and KV head (2 x " +
                                                                std::to_string(c.n_kv_heads) + " = " + std::to_string(2 * c.n_kv_heads) +
                                                                "), got 1 for k_scale");
    c = small_config();
    c.v_scale = {1.0f, 0.0f};
    CHECK(store_error([&] { PagedKvStore st(c); }) == "kv store: KV scales must be finite and > 0, got 0.000000 for v_scale of layer 1 KV head 0");
    c.v_scale = {1.0f, 0.5f};
    CHECK_NOTHROW(PagedKvStore(c));
  }
  PagedKvStore st(small_config());
  const SeqId s = st.create_sequence();
  st.extend(s, 6);
  fill(st, s, 6, 1.0f);
  const std::vector<float> before = read_all(st, s, 6);
  const auto k = rows(4, 9.0f);
  const std::string id = std::to_string(s);
  CHECK(store_error([&] { st.write(s, 0, 4, 4, k.data(), 16, k.data(), 16); }) ==
        "kv store: write of positions [4, 8) layer 0 is outside the sequence (length 6, layers 2)");
  CHECK(store_error([&] { st.write(s, 2, 0, 1, k.data(), 16, k.data(), 16); }) ==
        "kv store: write of positions [0, 1) layer 2 is outside the sequence (length 6, layers 2)");
  CHECK(store_error([&] { st.export_pages(s, 7, [](const PageRef&, const std::uint8_t*) {}); }) ==
        "kv store: export of 7 tokens from a sequence of 6");
  const PagedKvStore& cst = st;
  CHECK(store_error([&] { cst.page(0, KvHalf::K, -1); }) ==
        "kv store: read of a released page (block-table entry -1): a page outside every layer's sliding window was "
        "given back to the pool");
  st.swap_out(s);
  const std::vector<std::pair<std::string, std::function<void()>>> swapped = {
      {"write to swapped-out sequence " + id, [&] { st.write(s, 0, 0, 1, k.data(), 16, k.data(), 16); }},
      {"read of swapped-out sequence " + id, [&] { std::vector<float> o(16); st.read(s, 0, KvHalf::K, 0, 1, o.data()); }},
      {"truncate of swapped-out sequence " + id, [&] { st.truncate(s, 2); }},
      {"export of swapped-out sequence " + id, [&] { st.export_pages(s, 1, [](const PageRef&, const std::uint8_t*) {}); }},
      {"release of pages of swapped-out sequence " + id, [&] { st.release_before(s, 4); }},
      {"import needs an empty resident sequence (sequence " + id + " holds 6 tokens)",
       [&] { st.import_pages(s, 1, [](const PageRef&, std::uint8_t*) {}); }},
  };
  for (const auto& [want, op] : swapped) {
    INFO(want);
    CHECK(store_error(op) == "kv store: " + want);
  }
  st.swap_in(s);
  CHECK(read_all(st, s, 6) == before);
  int pages = 0;
  st.export_pages(s, 6, [&](const PageRef&, const std::uint8_t*) { ++pages; });
  CHECK(pages == 2 * 2 * 2);  // 2 layers x K/V x 2 pages of 4
  CHECK(st.release_before(s, 4) == 1);
}

TEST_CASE("STO.store.copy a copied or assigned store holds the same bytes and window, independently",
          "[gate:STO][fmt:f32]") {
  PagedKvStore a(small_config());
  const SeqId s = a.create_sequence();
  a.extend(s, 6);
  fill(a, s, 6, 2.0f);
  a.set_streaming(4);
  REQUIRE(a.window());
  PagedKvStore b(a);
  REQUIRE(b.window());
  CHECK(b.window()->window_tokens() == 4);
  for (int l = 0; l < 2; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V}) {
      const auto pa = a.host_pool(l, h), pb = b.host_pool(l, h);
      REQUIRE(pa.size() == pb.size());
      CHECK(std::memcmp(pa.data(), pb.data(), pa.size()) == 0);
    }
  const std::vector<float> before = read_all(a, s, 6);
  CHECK(read_all(b, s, 6) == before);
  fill(b, s, 6, 50.0f);  // the copy changes, the original does not
  CHECK(read_all(a, s, 6) == before);
  CHECK(read_all(b, s, 6) != before);
  // A host page written directly through page(): the window's device copy is invalidated first.
  const int blk = b.block_table(s)[0];
  std::memset(b.page(0, KvHalf::K, blk), 0, b.page_bytes(KvHalf::K));
  std::vector<float> row(16, 1.0f);
  b.read(s, 0, KvHalf::K, 0, 1, row.data());
  CHECK(row == std::vector<float>(16, 0.0f));
  CHECK(b.check_stream_coherent().empty());
  PagedKvStore c(small_config());
  c = a;  // assignment: the same as a copy
  CHECK(read_all(c, s, 6) == before);
  REQUIRE(c.window());
  CHECK(c.window()->window_tokens() == 4);
  c.set_streaming(0);  // 0 turns the window off
  CHECK(c.window() == nullptr);
  CHECK(read_all(c, s, 6) == before);
}

TEST_CASE("STO.store.head_scale_refusals per-KV-head scales: a wrong count, a head scale <= 0, NaN or inf, and per-head "
          "scales on an nvfp4 half are refused naming the field, the layer and the head",
          "[gate:STO][fmt:fp8][fmt:nvfp4]") {
  StoreConfig c = small_config();  // 2 layers x 2 KV heads
  c.format = {HalfFormat::fp8_e4m3, HalfFormat::fp8_e4m3};
  c.k_scale = {0.5f, 0.25f, 0.125f, 0.75f};
  c.v_scale = {0.5f, 0.5f, 0.5f};
  CHECK(store_error([&] { PagedKvStore st(c); }) ==
        "kv store: k_scale/v_scale must have one entry per layer (2) or one per layer and KV head (2 x 2 = 4), got 3 for v_scale");
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    c.v_scale = {0.5f, 0.5f, 0.5f, bad};
    const std::string msg = store_error([&] { PagedKvStore st(c); });
    INFO(msg);
    CHECK_THAT(msg, kvgate_catch::contains("for v_scale of layer 1 KV head 1"));
  }
  c.v_scale = {0.5f, 0.5f, 0.5f, 0.5f};
  const PagedKvStore ok(c);
  CHECK(ok.per_head_scales());
  CHECK(ok.head_scales(1, KvHalf::K)[1] == 0.75f);
  CHECK_THROWS_AS(ok.tensor_scale(1, KvHalf::K), KvStoreError);  // a per-tensor reader cannot use them
  CHECK(ok.tensor_scale(1, KvHalf::V) == 0.5f);
  // nvfp4 keeps one global scale per (layer, K|V): per-head scales are refused for its half.
  c.format = {HalfFormat::fp8_e4m3, HalfFormat::nvfp4};
  c.head_dim = 16;
  c.v_scale = {0.5f, 0.5f, 0.5f, 0.25f};
  const std::string msg = store_error([&] { PagedKvStore st(c); });
  INFO(msg);
  CHECK_THAT(msg, kvgate_catch::contains("V half is nvfp4"));
  CHECK_THAT(msg, kvgate_catch::contains("layer 1's v_scale differs per KV head"));
  c.v_scale = {0.5f, 0.5f, 0.25f, 0.25f};  // heads agree: accepted
  CHECK_NOTHROW(PagedKvStore(c));
}
