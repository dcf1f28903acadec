// INV.directed.layers: per-layer power-of-two scale invariance on a three-layer fp8 store with the
// directed scales (gates/common/populations.hpp: non-unit, distinct per layer, K != V). Moving
// layer l's K scale by 2^(l+1) and its V scale by 2^-(l+1) (a different move per layer and per
// half) leaves every dequantized value of every layer bit-identical, while all x/s stay normal and
// unsaturated (data banded to |x| in [0.5, 4] * the layer's scale). The class it closes: a store or
// reader that takes a layer's or a half's scale from another one (it cancels only if all layers and
// halves share a scale, which no directed fixture does).
// Exact (bitwise). Anti-vacuity: the two stores hold different fp8 codes in every layer and half
// (the moves really change the bytes), and a non-power-of-two move (x 1.5) changes the values.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "catch_compat.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;

namespace {

std::vector<float> banded_rows(int n, std::uint64_t seed, float magnitude) {
  Rng r(seed);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (auto& v : x) v = static_cast<float>((r.next() & 1 ? 1 : -1) * (0.5 + 3.5 * r.uniform()) * magnitude);
  return x;
}

struct Read {
  std::vector<std::vector<float>> values;       // [layer * 2 + half]
  std::vector<std::vector<std::uint8_t>> page0;  // the first page's bytes, same order
};

Read store_read(HalfFormat hf, const std::vector<float>& ks, const std::vector<float>& vs,
                                           const std::vector<std::vector<float>>& kd, const std::vector<std::vector<float>>& vd,
                                           int H, int D, int n) {
  const int L = static_cast<int>(ks.size());
  StoreConfig cfg;
  cfg.format = KvFormat{hf, hf};
  cfg.n_layers = L;
  cfg.n_kv_heads = H;
  cfg.head_dim = D;
  cfg.block_size = 16;
  cfg.n_blocks = n / 16 + 2;
  cfg.k_scale = ks;
  cfg.v_scale = vs;
  PagedKvStore store(cfg);
  const SeqId s = store.create_sequence();
  store.extend(s, n);
  Read out;
  for (int l = 0; l < L; ++l) store.write(s, l, 0, n, kd[l].data(), static_cast<std::size_t>(H * D), vd[l].data(), static_cast<std::size_t>(H * D));
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < 2; ++h) {
      std::vector<float> r(static_cast<std::size_t>(n * H * D));
      const KvHalf kh = h == 0 ? KvHalf::K : KvHalf::V;
      store.read(s, l, kh, 0, n, r.data());
      out.values.push_back(r);
      const std::uint8_t* pg = store.page(l, kh, store.block_table(s)[0]);
      out.page0.emplace_back(pg, pg + store.page_bytes(kh));
    }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("INV.directed.layers per-layer power-of-two K/V scale moves leave every layer's values bit-identical",
          "[gate:INV][fmt:fp8][fmt:fp8_e5m2]") {
  const int L = 3, H = 4, D = 64, n = 33;  // 33 = 2B + 1 tokens
  for (const HalfFormat hf : {HalfFormat::fp8_e4m3, HalfFormat::fp8_e5m2}) {
    INFO("half " << name(hf));
    const std::vector<float> ks = directed_k_scales(L), vs = directed_v_scales(L);
    std::vector<std::vector<float>> kd, vd;
    for (int l = 0; l < L; ++l) {
      kd.push_back(banded_rows(n * H * D, 100 + l, ks[l]));
      vd.push_back(banded_rows(n * H * D, 200 + l, vs[l]));
    }
    std::vector<float> ks2, vs2, ksp, vsp;
    for (int l = 0; l < L; ++l) {
      ks2.push_back(std::ldexp(ks[l], l + 1));     // x/s moves to [0.5, 4] / 2^(l+1) >= 1/16: normal
      vs2.push_back(std::ldexp(vs[l], -(l + 1)));  // x/s moves to [0.5, 4] * 2^(l+1) <= 32: unsaturated
      ksp.push_back(ks[l] * 1.5f);
      vsp.push_back(vs[l] * 1.5f);
    }
    const auto a = store_read(hf, ks, vs, kd, vd, H, D, n), b = store_read(hf, ks2, vs2, kd, vd, H, D, n);
    const auto p = store_read(hf, ksp, vsp, kd, vd, H, D, n);
    for (std::size_t i = 0; i < a.values.size(); ++i) {
      INFO("layer " << i / 2 << (i % 2 ? " V" : " K"));
      CHECK(same_bits(a.values[i], b.values[i]));
      CHECK(a.page0[i] != b.page0[i]);                   // anti-vacuity: other codes, same values
      CHECK_FALSE(same_bits(a.values[i], p.values[i]));  // anti-vacuity: a non-power-of-two move shows
    }
  }
}
