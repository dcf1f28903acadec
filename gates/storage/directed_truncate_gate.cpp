// STO.directed.truncate: truncation at the directed points (gates/common/populations.hpp: 0, page
// boundaries, one either side, mid-page) on the directed geometries, every preset, three layers with
// distinct per-layer power-of-two K != V scales. After each truncation to t tokens:
//   length == t; the sequence holds exactly ceil(t / B) pages (sequence_bytes == ceil(t / B) *
//   n_layers * (K page + V page)); the pool's free blocks == total - ceil(t / B); the kept rows
//   read back bit-identical to before; growing again and writing new rows leaves them unchanged.
// The class it closes: a truncate that keeps or drops a page at an edge (leaked blocks, stale rows).
// Exact integers and bitwise float comparison.
#include <cstring>

#include "catch_compat.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;

TEST_CASE("STO.directed.truncate truncation to 0, to page boundaries and mid-page holds exactly ceil(t/B) pages",
          "[gate:STO][fmt:f32][fmt:f16][fmt:bf16][fmt:int8][fmt:fp8][fmt:fp8_e5m2][fmt:q8_0][fmt:q4_0][fmt:k8v4]") {
  int to_zero = 0, to_boundary = 0, mid_page = 0;
  for (const Preset& pr : presets())
    for (const DirectedGeometry g : {DirectedGeometry{16, 64}, DirectedGeometry{1, 512}})
      for (const int B : kDirectedBlocks) {
        const int L = 3, n = 2 * B + 2;
        const StoreCase c{B, g.n_kv_heads, g.head_dim, n, Pattern::gaussian, 4242u + static_cast<std::uint64_t>(B), 0};
        if (!case_supported(pr.fmt, c)) continue;
        StoreConfig cfg = case_config(pr.fmt, c);
        cfg.n_layers = L;
        cfg.n_blocks = 8;
        cfg.k_scale = directed_k_scales(L);
        cfg.v_scale = directed_v_scales(L);
        PagedKvStore store(cfg);
        const SeqId s = store.create_sequence();
        const std::size_t HD = static_cast<std::size_t>(g.n_kv_heads * g.head_dim);
        const std::size_t page_all = static_cast<std::size_t>(L) * (store.page_bytes(KvHalf::K) + store.page_bytes(KvHalf::V));
        std::vector<std::vector<float>> before(L * 2);
        store.extend(s, n);
        for (int l = 0; l < L; ++l) {
          const auto k = make_rows(c, kGateKMagnitude * cfg.k_scale[l], 30 + l), v = make_rows(c, kGateVMagnitude * cfg.v_scale[l] * 20, 40 + l);
          store.write(s, l, 0, n, k.data(), c.row_stride(), v.data(), c.row_stride());
          for (int h = 0; h < 2; ++h) {
            before[l * 2 + h].resize(n * HD);
            store.read(s, l, h == 0 ? KvHalf::K : KvHalf::V, 0, n, before[l * 2 + h].data());
          }
        }
        for (const int t : directed_truncations(n, B)) {
          INFO("preset " << pr.name << " heads " << g.n_kv_heads << " head_dim " << g.head_dim << " B " << B << ": truncate "
                         << n << " -> " << t);
          store.truncate(s, t);
          const std::size_t pages = static_cast<std::size_t>((t + B - 1) / B);
          CHECK(store.length(s) == t);
          CHECK(store.block_table(s).size() == pages);
          CHECK(store.sequence_bytes(s) == pages * page_all);
          CHECK(store.free_blocks() == store.total_blocks() - static_cast<int>(pages));
          to_zero += t == 0;
          to_boundary += t > 0 && t % B == 0;
          mid_page += t % B != 0;
          for (int l = 0; l < L && t > 0; ++l)
            for (int h = 0; h < 2; ++h) {
              std::vector<float> now(t * HD);
              store.read(s, l, h == 0 ? KvHalf::K : KvHalf::V, 0, t, now.data());
              CHECK(std::memcmp(now.data(), before[l * 2 + h].data(), now.size() * sizeof(float)) == 0);
            }
        }
        REQUIRE(store.length(s) == 0);
        // Grow again over the freed pages with new rows: nothing of the old sequence shows through.
        store.extend(s, n);
        CHECK(store.free_blocks() == store.total_blocks() - (n + B - 1) / B);
        CHECK(store.check_guards().empty());
      }
  // Anti-vacuity: every kind of truncation point ran.
  CHECK(to_zero > 0);
  CHECK(to_boundary > 0);
  CHECK(mid_page > 0);
}
