// ORA.head_scales: static fp8 scales per KV head (docs/FORMATS.md "Static scales per KV head").
// On a three-layer store whose scales differ per head, per layer and between K and V (ratios that
// are not powers of two), every page's bytes equal the independent oracle's with that (layer,
// half)'s head scales; the store's read, attention's vectorized page read (dequantize_rows) and the
// oracle's dequantization agree bit for bit; attention over the store equals attention over an f32
// store holding those values. The class it closes: a head's elements scaled with another head's
// scale (a wrong head stride), one head's scale on every head, K's scales on V, a reader that
// skips the descale or multiplies by the reciprocal.
// Bound: exact bytes and exact binary32 values (the oracle is the format definition; one division
// on store and one multiply on read, both binary32 RNE, FORMATS.md "fp8").
// Anti-vacuity: the oracle with head 0's scale on every head, with the heads' scales rotated by one,
// and with the other half's scales each give other bytes on some page of every (layer, half); every
// head's scale differs from every other.
#include <algorithm>
#include <cstring>
#include <set>

#include "catch_compat.hpp"
#include "head_scales.hpp"
#include "kvgate/attention.hpp"
#include "kvgate_oracle/formats.hpp"
#include "oracle_fixtures.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace ko = kvgate_oracle;

namespace {

std::vector<float> slice(const std::vector<float>& s, int l, int H) {
  return {s.begin() + static_cast<std::ptrdiff_t>(l) * H, s.begin() + static_cast<std::ptrdiff_t>(l + 1) * H};
}

}  // namespace

TEST_CASE("ORA.head_scales.bytes per-KV-head fp8 scales: page bytes and reads == oracle, distinct per head/layer/half",
          "[gate:ORA][fmt:fp8][fmt:fp8_e5m2]") {
  const int L = 3, B = 16;
  struct Geo {
    int H, D;
  };
  const KvFormat fmts[] = {{HalfFormat::fp8_e4m3, HalfFormat::fp8_e4m3},
                           {HalfFormat::fp8_e5m2, HalfFormat::fp8_e5m2},
                           {HalfFormat::fp8_e4m3, HalfFormat::fp8_e5m2},
                           {HalfFormat::int8, HalfFormat::fp8_e4m3}};
  long pages = 0;
  for (const KvFormat& fmt : fmts)
    for (const Geo geo : {Geo{4, 8}, Geo{2, 64}, Geo{8, 16}, Geo{3, 12}}) {
      const int n = 2 * B + 5, HD = geo.H * geo.D;
      const auto ks = gate_head_scales(L, geo.H, KvHalf::K), vs = gate_head_scales(L, geo.H, KvHalf::V);
      REQUIRE(std::set<float>(ks.begin(), ks.end()).size() == ks.size());  // distinct per head and layer
      for (float x : ks) REQUIRE(std::find(vs.begin(), vs.end(), x) == vs.end());  // K != V
      const HeadScaledStore st = fill_head_scaled(fmt, L, geo.H, geo.D, B, n, ks, vs, 41 + geo.H);
      const ko::PageShape shape{B, geo.H, geo.D};
      const auto table = st.store->block_table(st.seq);
      for (int l = 0; l < L; ++l)
        for (KvHalf kh : {KvHalf::K, KvHalf::V}) {
          const HalfFormat hf = st.store->half_format(kh);
          const ko::Half oh = oracle_half(hf);
          const std::vector<float> hs = slice(kh == KvHalf::K ? ks : vs, l, geo.H);
          std::vector<float> head0(hs.size(), hs[0]), rotated(hs.size()), other = slice(kh == KvHalf::K ? vs : ks, l, geo.H);
          for (std::size_t h = 0; h < hs.size(); ++h) rotated[h] = hs[(h + 1) % hs.size()];
          INFO("format " << fmt.name() << " H=" << geo.H << " D=" << geo.D << " layer " << l << (kh == KvHalf::K ? " K" : " V"));
          CHECK(std::equal(hs.begin(), hs.end(), st.store->head_scales(l, kh).begin()));
          bool head0_differs = false, rotated_differs = false, other_differs = false;
          const auto& rows = kh == KvHalf::K ? st.k[static_cast<std::size_t>(l)] : st.v[static_cast<std::size_t>(l)];
          for (std::size_t p = 0; p < table.size(); ++p) {
            const int t0 = static_cast<int>(p) * B, nt = std::min(B, n - t0);
            const float* in = rows.data() + static_cast<std::size_t>(t0) * HD;
            const auto expect = ko::quantize_page(oh, shape, in, nt, hs);
            const std::uint8_t* got = st.store->page(l, kh, table[p]);
            INFO("page " << p << ": " << first_diff(got, expect.data(), expect.size()));
            CHECK(std::equal(expect.begin(), expect.end(), got));
            ++pages;
            // Reads: the store's, attention's vectorized one, the oracle's.
            const auto want = ko::dequantize_page(oh, shape, expect.data(), nt, hs);
            std::vector<float> r1(want.size()), r2(want.size());
            st.store->read(st.seq, l, kh, t0, nt, r1.data());
            dequantize_rows(hf, st.store->geometry(), nt, got, st.store->head_scales(l, kh), r2.data());
            CHECK(std::memcmp(r1.data(), want.data(), want.size() * sizeof(float)) == 0);
            CHECK(std::memcmp(r2.data(), want.data(), want.size() * sizeof(float)) == 0);
            if (hf == HalfFormat::int8) continue;  // a half without a tensor scale: no alternative to tell apart
            head0_differs |= ko::quantize_page(oh, shape, in, nt, head0) != expect;
            rotated_differs |= ko::quantize_page(oh, shape, in, nt, rotated) != expect;
            other_differs |= ko::quantize_page(oh, shape, in, nt, other) != expect;
          }
          if (hf != HalfFormat::int8) {
            CHECK(head0_differs);
            CHECK(rotated_differs);
            CHECK(other_differs);
          }
        }
    }
  CHECK(pages >= 4 * 4 * 3 * 2 * 3);
}

TEST_CASE("ORA.head_scales.attention attention over a per-head-scaled fp8 store == attention over f32 rows of the "
          "oracle's values",
          "[gate:ORA][fmt:fp8][fmt:fp8_e5m2]") {
  // Both fast paths (the K tile read and transposed in one pass, the V rows) must multiply each
  // head's codes by that head's scale: attention over an f32 store holding the oracle's dequantized
  // values is then bit-identical, for every layer and query count.
  const int L = 2, B = 16;
  struct Geo {
    int H, D;
  };
  long compared = 0;
  for (HalfFormat hf : {HalfFormat::fp8_e4m3, HalfFormat::fp8_e5m2})
    for (const Geo geo : {Geo{4, 8}, Geo{2, 64}, Geo{8, 32}}) {
      const int n = 3 * B + 5, HD = geo.H * geo.D, Hq = 2 * geo.H;
      const auto ks = gate_head_scales(L, geo.H, KvHalf::K), vs = gate_head_scales(L, geo.H, KvHalf::V);
      const HeadScaledStore st = fill_head_scaled({hf, hf}, L, geo.H, geo.D, B, n, ks, vs, 77);
      StoreConfig cf = st.store->config();
      cf.format = {HalfFormat::f32, HalfFormat::f32};
      cf.k_scale.clear();
      cf.v_scale.clear();
      PagedKvStore sf(cf);
      const SeqId b = sf.create_sequence();
      sf.extend(b, n);
      const ko::PageShape shape{B, geo.H, geo.D};
      Rng r(9);
      for (int l = 0; l < L; ++l) {
        std::vector<float> kd, vd;
        for (int t0 = 0; t0 < n; t0 += B) {
          const int nt = std::min(B, n - t0);
          for (int half = 0; half < 2; ++half) {
            const auto& rows = half == 0 ? st.k[static_cast<std::size_t>(l)] : st.v[static_cast<std::size_t>(l)];
            const std::vector<float> hs = slice(half == 0 ? ks : vs, l, geo.H);
            const auto page = ko::quantize_page(oracle_half(hf), shape, rows.data() + static_cast<std::size_t>(t0) * HD, nt, hs);
            const auto vals = ko::dequantize_page(oracle_half(hf), shape, page.data(), nt, hs);
            (half == 0 ? kd : vd).insert((half == 0 ? kd : vd).end(), vals.begin(), vals.end());
          }
        }
        sf.write(b, l, 0, n, kd.data(), HD, vd.data(), HD);
        for (int n_q : {1, 6}) {
          std::vector<float> q(static_cast<std::size_t>(n_q) * Hq * geo.D);
          for (auto& x : q) x = r.normal();
          const AttentionArgs args{n_q, Hq, n - n_q, 0.0f};
          std::vector<float> oq(q.size()), of(q.size());
          attention(*st.store, st.seq, l, args, q.data(), oq.data());
          attention(sf, b, l, args, q.data(), of.data());
          INFO(name(hf) << " H=" << geo.H << " D=" << geo.D << " layer " << l << " n_q " << n_q);
          CHECK(std::memcmp(oq.data(), of.data(), oq.size() * sizeof(float)) == 0);
          ++compared;
        }
      }
    }
  CHECK(compared == 2 * 3 * 2 * 2);
}
