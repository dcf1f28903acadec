// ORA.directed: the runtime's page bytes equal the oracle's on the directed population
// (gates/common/populations.hpp): head_dim up to 512 and 16 KV heads, page sizes 16 and 32, token
// counts 1, B-1, B, B+1, 2B, 2B+1 (a ragged or exactly full last page), K and V with different
// values; and, on a three-layer store, per-layer non-unit power-of-two scales distinct per layer and
// between K and V (each layer's pages against the oracle with that layer's scale). The class it
// closes: a store that is right on the covering set but wrong at a large geometry, at a page edge,
// or with a scale taken from another layer or the other half.
// Bound: exact bytes (the oracle is the format definition), the whole page (used slots and tail).
// Anti-vacuity: every preset runs at least the cases its geometry rules allow, the multi-layer
// check runs on every preset with a per-tensor scale, and a scale from the wrong layer gives other
// bytes on at least one page.
#include <algorithm>

#include "catch_compat.hpp"
#include "kvgate_oracle/formats.hpp"
#include "oracle_fixtures.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace ko = kvgate_oracle;

namespace {

// Compares every page of `layer` with the oracle; returns the pages compared. `alt_scale` > 0:
// also counts the pages whose bytes the oracle gives differently with that scale (anti-vacuity).
long compare_layer(const PagedKvStore& store, SeqId s, const StoreCase& c, int layer, const std::vector<float>& k,
                   const std::vector<float>& v, float ks, float vs, float alt_ks, long* alt_differs) {
  long pages = 0;
  const ko::PageShape shape{c.block_size, c.n_kv_heads, c.head_dim};
  const auto table = store.block_table(s);
  for (int half = 0; half < 2; ++half) {
    const KvHalf kh = half == 0 ? KvHalf::K : KvHalf::V;
    const ko::Half oh = oracle_half(store.half_format(kh));
    for (std::size_t p = 0; p < table.size(); ++p) {
      const int t0 = static_cast<int>(p) * c.block_size, n = std::min(c.block_size, c.n_tokens - t0);
      const auto in = case_rows(c, half == 0 ? k : v, t0, n);
      const auto expect = ko::quantize_page(oh, shape, in.data(), n, half == 0 ? ks : vs);
      const std::uint8_t* got = store.page(layer, kh, table[p]);
      INFO("layer " << layer << (half == 0 ? " K" : " V") << " page " << p << " (" << n << " tokens): "
                    << first_diff(got, expect.data(), expect.size()));
      CHECK(std::equal(expect.begin(), expect.end(), got));
      ++pages;
      if (alt_differs && half == 0 && alt_ks > 0) {
        const auto alt = ko::quantize_page(oh, shape, in.data(), n, alt_ks);
        if (!std::equal(alt.begin(), alt.end(), expect.begin())) ++*alt_differs;
      }
    }
  }
  return pages;
}

}  // namespace

TEST_CASE("ORA.directed.bytes page bytes == oracle at head_dim up to 512, 16 KV heads, k*B-1/k*B/k*B+1 tokens",
          "[gate:ORA][fmt:f32][fmt:f16][fmt:bf16][fmt:int8][fmt:fp8][fmt:fp8_e5m2][fmt:q8_0][fmt:q4_0][fmt:k8v4]") {
  for (const Preset& pr : presets()) {
    long cases = 0, pages = 0, big = 0;
    for (const StoreCase& c : directed_cases(9100)) {
      if (!case_supported(pr.fmt, c)) continue;
      ++cases;
      big += c.head_dim == 512 && c.n_kv_heads == 16;
      INFO("preset " << pr.name << " case " << c.describe());
      const auto k = make_rows(c, kGateKMagnitude, 1), v = make_rows(c, kGateVMagnitude, 2);
      // Distinct non-unit power-of-two K and V scales (the fp8 halves use them, the others ignore them).
      PagedKvStore store(case_config(pr.fmt, c, 0.25f, 4.0f));
      const SeqId s = store.create_sequence();
      write_case(store, s, c, k, v);
      REQUIRE(store.check_guards().empty());
      pages += compare_layer(store, s, c, 0, k, v, 0.25f, 4.0f, 0, nullptr);
    }
    INFO("preset " << pr.name << ": " << cases << " directed cases, " << pages << " pages");
    // Anti-vacuity: every preset holds these geometries (head_dim a power of two, rows multiples
    // of 32), so all 60 cases run, the largest (16 x 512) among them.
    CHECK(cases == 60);
    CHECK(big == 12);
  }
}

TEST_CASE("ORA.directed.layers per-layer power-of-two scales, distinct per layer and K != V, on three layers",
          "[gate:ORA][fmt:fp8][fmt:fp8_e5m2]") {
  int presets_run = 0;
  for (const Preset& pr : presets()) {
    if (!info(pr.fmt.k).per_tensor_scale && !info(pr.fmt.v).per_tensor_scale) continue;
    ++presets_run;
    const int L = 3;
    const StoreCase c{16, 4, 128, 33, Pattern::gaussian, 777, 0};
    StoreConfig cfg = case_config(pr.fmt, c);
    cfg.n_layers = L;
    cfg.k_scale = directed_k_scales(L);
    cfg.v_scale = directed_v_scales(L);
    PagedKvStore store(cfg);
    const SeqId s = store.create_sequence();
    store.extend(s, c.n_tokens);
    std::vector<std::vector<float>> ks, vs;
    for (int l = 0; l < L; ++l) {  // different data per layer (salts), K and V different magnitudes
      // Magnitudes follow the layer's scale, so every layer's codes sit in the normal range and a
      // scale taken from another layer moves them (saturation or subnormals).
      ks.push_back(make_rows(c, kGateKMagnitude * cfg.k_scale[l], 10 + l));
      vs.push_back(make_rows(c, kGateVMagnitude * cfg.v_scale[l] * 20, 20 + l));
      store.write(s, l, 0, c.n_tokens, ks[l].data(), c.row_stride(), vs[l].data(), c.row_stride());
    }
    long pages = 0, alt_differs = 0;
    for (int l = 0; l < L; ++l) {
      INFO("preset " << pr.name << " layer " << l << " k_scale " << cfg.k_scale[l] << " v_scale " << cfg.v_scale[l]);
      CHECK(store.tensor_scale(l, KvHalf::K) == cfg.k_scale[l]);
      CHECK(store.tensor_scale(l, KvHalf::V) == cfg.v_scale[l]);
      pages += compare_layer(store, s, c, l, ks[l], vs[l], cfg.k_scale[l], cfg.v_scale[l], cfg.k_scale[(l + 1) % L], &alt_differs);
    }
    CHECK(pages == 2 * L * 3);
    CHECK(alt_differs > 0);  // anti-vacuity: another layer's scale gives other bytes
  }
  CHECK(presets_run >= 2);  // fp8 (e4m3) and fp8_e5m2
}
