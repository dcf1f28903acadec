// INV gates: scale invariance. fp8 with a per-tensor scale: moving the K and V scales by powers of
// two leaves every dequantized value and every attention output bit-identical (while all scaled
// values stay normal and unsaturated). Dynamic-scale formats are homogeneous: quantize(2^k x) has
// the same codes and 2^k times the scale. INV.mla.*: the same two properties on the MLA latent
// cache (KvLayout::mla_latent: the latent c_kv in the K half, the RoPE key in the V half), with the
// weight-absorbed attention (mla_latent_attention) for the scale pairs.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "bounds.hpp"
#include "catch_compat.hpp"
#include "kvgate/attention.hpp"
#include "kvgate/attention_mla.hpp"
#include "kvgate/blocks.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate/numeric.hpp"
#include "head_scales.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;

namespace {

// Values bounded away from zero: |x| in [0.5, 4] * magnitude, random sign, so that x/s stays in
// fp8's normal range under every scale the gate uses (precondition asserted below).
std::vector<float> banded(int n, std::uint64_t seed, float magnitude) {
  Rng r(seed);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (auto& v : x) v = static_cast<float>((r.next() & 1 ? 1 : -1) * (0.5 + 3.5 * r.uniform()) * magnitude);
  return x;
}

struct Filled {
  std::unique_ptr<PagedKvStore> store;
  SeqId seq = 0;
};

// One layer of `cfg`'s shape (format, geometry, per-tensor scales), n tokens of K rows k_row wide and
// V rows v_row wide written.
Filled fill_store(StoreConfig cfg, int n, const std::vector<float>& k, int k_row, const std::vector<float>& v,
                  int v_row) {
  cfg.n_blocks = n / cfg.block_size + 2;
  Filled out{std::make_unique<PagedKvStore>(cfg), 0};
  out.seq = out.store->create_sequence();
  out.store->extend(out.seq, n);
  out.store->write(out.seq, 0, 0, n, k.data(), static_cast<std::size_t>(k_row), v.data(), static_cast<std::size_t>(v_row));
  return out;
}

Filled fill(const KvFormat& f, int B, int H, int D, int n, const std::vector<float>& k, const std::vector<float>& v,
            float ks = 1.0f, float vs = 1.0f) {
  StoreConfig cfg;
  cfg.format = f;
  cfg.n_kv_heads = H;
  cfg.head_dim = D;
  cfg.block_size = B;
  cfg.k_scale = {ks};
  cfg.v_scale = {vs};
  return fill_store(cfg, n, k, H * D, v, H * D);
}

// The MLA latent cache of one layer: n tokens of latent rows (kv_lora wide) and RoPE-key rows (rope
// wide), each half in its own format and per-tensor scale.
Filled fill_latent(const KvFormat& f, int B, int KL, int R, int n, const std::vector<float>& lat,
                   const std::vector<float>& rk, float ls = 1.0f, float rs = 1.0f) {
  StoreConfig cfg;
  cfg.format = f;
  cfg.layout = KvLayout::mla_latent;
  cfg.n_kv_heads = 1;
  cfg.head_dim = KL;
  cfg.v_head_dim = R;
  cfg.block_size = B;
  cfg.k_scale = {ls};
  cfg.v_scale = {rs};
  return fill_store(cfg, n, lat, KL, rk, R);
}

std::vector<float> read_all(const Filled& f, KvHalf h, int n) {
  const auto g = f.store->config().half_geometry(h);
  std::vector<float> out(static_cast<std::size_t>(n) * g.row_elems());
  f.store->read(f.seq, 0, h, 0, n, out.data());
  return out;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The scale-pair loop of INV.fp8* and INV.mla.fp8*: the K (latent) and V (RoPE key) halves in one fp8
// format with per-tensor scales ks, vs; moving them by different powers of two must leave both halves'
// dequantized rows and the attention output bit-identical, so a reader that took one half's scale
// for the other would show. make(ks, vs) fills a store with the same rows; attend(store) returns its
// attention output. Precondition: every scaled value stays normal and unsaturated. Anti-vacuity:
// each half's stored codes change (the scale reached the store).
template <class Make, class Attend>
void check_scale_pairs(const std::string& what, const std::vector<float>& k, const std::vector<float>& v, float ks,
                       float vs, double fmax, double min_normal, int n, Make make, Attend attend) {
  const auto base = make(ks, vs);
  const auto k0 = read_all(base, KvHalf::K, n), v0 = read_all(base, KvHalf::V, n);
  const std::vector<float> out0 = attend(base);
  const int pairs[][2] = {{1, -2}, {3, 2}, {-4, 5}, {5, -3}};
  for (const auto& p : pairs) {
    const float ks2 = std::ldexp(ks, p[0]), vs2 = std::ldexp(vs, p[1]);
    INFO(what << ": K scale " << ks << " -> " << ks2 << ", V scale " << vs << " -> " << vs2);
    for (float sc : {ks, ks2})
      for (float x : k) REQUIRE((std::fabs(x / sc) >= min_normal && std::fabs(x / sc) <= fmax));
    for (float sc : {vs, vs2})
      for (float x : v) REQUIRE((std::fabs(x / sc) >= min_normal && std::fabs(x / sc) <= fmax));
    const auto moved = make(ks2, vs2);
    for (KvHalf h : {KvHalf::K, KvHalf::V})
      CHECK(std::memcmp(base.store->page(0, h, 0), moved.store->page(0, h, 0), base.store->page_bytes(h)) != 0);
    CHECK(bit_equal(read_all(moved, KvHalf::K, n), k0));
    CHECK(bit_equal(read_all(moved, KvHalf::V, n), v0));
    CHECK(bit_equal(attend(moved), out0));
  }
}

void run_fp8_invariance(HalfFormat hf, double fmax, double min_normal) {
  const int B = 16, H = 4, D = 64, n = 40, Hq = 8;
  const auto k = banded(n * H * D, 11, 1.0f), v = banded(n * H * D, 12, 0.3f);
  const auto q = banded(2 * Hq * D, 13, 0.4f);
  const AttentionArgs args{2, Hq, n - 2, 0};
  check_scale_pairs(
      "format " + std::string(name(hf)), k, v, kGateKScale, kGateVScale * 10, fmax, min_normal, n,
      [&](float ks, float vs) { return fill({hf, hf}, B, H, D, n, k, v, ks, vs); },
      [&](const Filled& f) {
        std::vector<float> out(q.size());
        attention(*f.store, f.seq, 0, args, q.data(), out.data());
        return out;
      });
}

// INV.mla.fp8*: the latent (K half) and the RoPE key (V half) of the MLA latent cache, through the
// absorbed attention (mla_latent_attention).
void run_mla_fp8_invariance(HalfFormat hf, double fmax, double min_normal) {
  const int B = 16, KL = 128, R = 32, n = 37, H = 4, N = 16, VD = 16, nq = 3;
  const auto lat = banded(n * KL, 41, 1.0f), rk = banded(n * R, 42, 0.3f);
  const auto q = banded(nq * H * (N + R), 43, 0.4f);
  const auto w = banded(H * (N + VD) * KL, 44, 1.0f / std::sqrt(float(KL)));
  const MlaDims d{H, N, R, VD, KL};
  MlaAttentionArgs ma;
  ma.n_q = nq;
  ma.pos0 = n - nq;
  ma.softmax_scale = 1.0f / std::sqrt(float(N + R));
  check_scale_pairs(
      "MLA latent cache, format " + std::string(name(hf)), lat, rk, kGateKScale, kGateVScale * 10, fmax, min_normal, n,
      [&](float ls, float rs) { return fill_latent({hf, hf}, B, KL, R, n, lat, rk, ls, rs); },
      [&](const Filled& f) {
        std::vector<float> out(static_cast<std::size_t>(nq) * H * VD);
        mla_latent_attention(*f.store, f.seq, 0, d, ma, q.data(), w.data(), out.data());
        return out;
      });
}

// The stored scale of every scale-carrying unit of a page (cells for int8 and the per-token-head
// formats, 32-blocks otherwise),
// and the codes with the scales blanked, read with the layout of docs/FORMATS.md.
struct Decomposed {
  std::vector<float> scales;
  std::vector<std::uint8_t> codes;
};

Decomposed decompose(HalfFormat hf, const PageGeometry& g, const std::uint8_t* page, int n) {
  Decomposed d;
  const int HD = g.row_elems();
  if (hf == HalfFormat::int8) {
    d.codes.assign(page, page + static_cast<std::size_t>(n) * HD);
    const auto* sc = reinterpret_cast<const std::uint16_t*>(page + static_cast<std::size_t>(g.block_size) * HD);
    for (int i = 0; i < n * g.n_kv_heads; ++i) d.scales.push_back(f16_to_f32(sc[i]));
  } else if (hf == HalfFormat::fp8_per_token_head || hf == HalfFormat::int8_per_token_head) {
    // FORMATS.md: codes run [B][H][D] bytes, then the scales run [B][H] binary32.
    d.codes.assign(page, page + static_cast<std::size_t>(n) * HD);
    const std::uint8_t* sc = page + static_cast<std::size_t>(g.block_size) * HD;
    for (int i = 0; i < n * g.n_kv_heads; ++i) {
      float s;
      std::memcpy(&s, sc + static_cast<std::size_t>(i) * sizeof(float), sizeof(float));
      d.scales.push_back(s);
    }
  } else if (hf == HalfFormat::fp8_block128) {
    // FORMATS.md: codes run [B][H*D] bytes, then the scales run [B][H*D/128] binary32.
    d.codes.assign(page, page + static_cast<std::size_t>(n) * HD);
    const std::uint8_t* sc = page + static_cast<std::size_t>(g.block_size) * HD;
    for (int i = 0; i < n * HD / kTileBlock; ++i) {
      float s;
      std::memcpy(&s, sc + static_cast<std::size_t>(i) * sizeof(float), sizeof(float));
      d.scales.push_back(s);
    }
  } else if (hf == HalfFormat::q8_0) {
    const auto* b = reinterpret_cast<const block_q8_0*>(page);
    for (int i = 0; i < n * HD / kQBlock; ++i) {
      d.scales.push_back(f16_to_f32(b[i].d));
      d.codes.insert(d.codes.end(), reinterpret_cast<const std::uint8_t*>(b[i].qs),
                     reinterpret_cast<const std::uint8_t*>(b[i].qs) + kQBlock);
    }
  } else if (hf == HalfFormat::mxfp8 || hf == HalfFormat::mxfp4) {
    // FORMATS.md: codes run [B][H*D] (mxfp8) or [B][H*D/2] (mxfp4), then UE8M0 scales [B][H*D/32].
    const std::size_t row = hf == HalfFormat::mxfp8 ? HD : HD / 2;
    d.codes.assign(page, page + static_cast<std::size_t>(n) * row);
    const std::uint8_t* sc = page + static_cast<std::size_t>(g.block_size) * row;
    for (int i = 0; i < n * HD / 32; ++i) d.scales.push_back(std::ldexp(1.0f, int(sc[i]) - 127));
  } else {  // q4_0, q4_0_rot
    const auto* b = reinterpret_cast<const block_q4_0*>(page);
    for (int i = 0; i < n * HD / kQBlock; ++i) {
      d.scales.push_back(f16_to_f32(b[i].d));
      d.codes.insert(d.codes.end(), b[i].qs, b[i].qs + kQBlock / 2);
    }
  }
  return d;
}

bool dynamic_scale(HalfFormat h) {
  return h == HalfFormat::int8 || h == HalfFormat::q8_0 || h == HalfFormat::q4_0 || h == HalfFormat::q4_0_rot ||
         h == HalfFormat::mxfp8 || h == HalfFormat::mxfp4 || h == HalfFormat::fp8_per_token_head ||
         h == HalfFormat::int8_per_token_head || h == HalfFormat::fp8_block128;
}

// Homogeneity of one preset: store x and 2^k x; per half, codes equal and scales x 2^k (dynamic
// formats) and dequantized values x 2^k bit for bit (all formats here).
// latent: the MLA latent cache instead (a 512-wide latent and a 64-wide RoPE key per token).
void run_homogeneity(const KvFormat& fmt, bool latent = false) {
  const int B = 8, H = latent ? 1 : 4, D = 64, n = 20, KL = 512, R = 64;
  const int k_row = latent ? KL : H * D, v_row = latent ? R : H * D;
  const auto k = banded(n * k_row, 21, 1.0f), v = banded(n * v_row, 22, 0.2f);
  auto make = [&](const std::vector<float>& kk, const std::vector<float>& vv) {
    return latent ? fill_latent(fmt, B, KL, R, n, kk, vv) : fill(fmt, B, H, D, n, kk, vv);
  };
  const auto base = make(k, v);
  const auto table0 = base.store->block_table(base.seq);
  for (int e : {-3, 2, 5}) {
    std::vector<float> k2(k), v2(v);
    for (auto& x : k2) x = std::ldexp(x, e);
    for (auto& x : v2) x = std::ldexp(x, e);
    const auto moved = make(k2, v2);
    const auto table1 = moved.store->block_table(moved.seq);
    for (KvHalf h : {KvHalf::K, KvHalf::V}) {
      const HalfFormat hf = base.store->half_format(h);
      const PageGeometry g = base.store->config().half_geometry(h);
      INFO("format " << fmt.name() << (latent ? " (MLA latent cache)" : "") << " half " << name(hf)
                     << " exponent shift " << e);
      const auto x0 = read_all(base, h, n), x1 = read_all(moved, h, n);
      long checked = 0;
      for (std::size_t i = 0; i < x0.size(); ++i) {
        if (std::ldexp(x0[i], e) != x1[i]) {
          INFO("element " << i << ": " << x0[i] << " * 2^" << e << " != " << x1[i]);
          CHECK(std::ldexp(x0[i], e) == x1[i]);
          break;
        }
        ++checked;
      }
      CHECK(checked == static_cast<long>(x0.size()));
      if (!dynamic_scale(hf)) continue;
      for (std::size_t p = 0; p < table0.size(); ++p) {
        const int np = std::min(B, n - static_cast<int>(p) * B);
        const auto d0 = decompose(hf, g, base.store->page(0, h, table0[p]), np);
        const auto d1 = decompose(hf, g, moved.store->page(0, h, table1[p]), np);
        CHECK(d0.codes == d1.codes);
        REQUIRE(d0.scales.size() == d1.scales.size());
        for (std::size_t i = 0; i < d0.scales.size(); ++i) {
          // Precondition: the scale stays a normal binary16 (2^-14 .. 65504) at both magnitudes.
          REQUIRE(std::fabs(d0.scales[i]) >= 0x1p-14f);
          REQUIRE(std::fabs(d1.scales[i]) >= 0x1p-14f);
          CHECK(std::ldexp(d0.scales[i], e) == d1.scales[i]);
        }
        // Anti-vacuity: scales are data-driven (not all equal to 1).
        CHECK(d0.scales[0] != 1.0f);
      }
    }
  }
}

}  // namespace

TEST_CASE("INV.fp8 power-of-two K/V scale pairs give bit-identical values and attention", "[gate:INV][fmt:fp8]") {
  run_fp8_invariance(HalfFormat::fp8_e4m3, kE4m3Max, kE4m3MinNormal);
}
TEST_CASE("INV.fp8_e5m2 power-of-two K/V scale pairs give bit-identical values and attention",
          "[gate:INV][fmt:fp8_e5m2]") {
  run_fp8_invariance(HalfFormat::fp8_e5m2, kE5m2Max, kE5m2MinNormal);
}

#define INV_HOMOGENEOUS(id, preset)                                                                   \
  TEST_CASE("INV." id " homogeneous: quantize(2^k x) = same codes, 2^k scale", "[gate:INV][fmt:" preset "]") { \
    const auto f = parse_kv_format(preset);                                                           \
    REQUIRE(f.has_value());                                                                           \
    run_homogeneity(*f);                                                                              \
  }
// Every homogeneous preset (kvgate/format_list.hpp "kind"): f32 is exact and the fp8 presets scale
// per tensor (INV.fp8 / INV.fp8_e5m2 above).
#define INV_HOMOGENEOUS_ROW(A, name, k, v, slot, kind) INV_HOMOGENEOUS_ROW_##kind(name, slot)
#define INV_HOMOGENEOUS_ROW_reference(name, slot)
#define INV_HOMOGENEOUS_ROW_homogeneous(name, slot) INV_HOMOGENEOUS(#name, #name)
#define INV_HOMOGENEOUS_ROW_tensor_scaled(name, slot)
KVGATE_PRESETS(INV_HOMOGENEOUS_ROW, _)  // one row per preset: kvgate/format_list.hpp

TEST_CASE("INV.mla.fp8 MLA latent cache: power-of-two latent / RoPE-key scale pairs give bit-identical values and "
          "absorbed attention",
          "[gate:INV][mla][fmt:fp8]") {
  run_mla_fp8_invariance(HalfFormat::fp8_e4m3, kE4m3Max, kE4m3MinNormal);
}
TEST_CASE("INV.mla.fp8_e5m2 MLA latent cache: power-of-two latent / RoPE-key scale pairs give bit-identical values "
          "and absorbed attention",
          "[gate:INV][mla][fmt:fp8_e5m2]") {
  run_mla_fp8_invariance(HalfFormat::fp8_e5m2, kE5m2Max, kE5m2MinNormal);
}

// Every homogeneous half format as the latent (and as the RoPE key where its width allows; the
// 128-element tile format keeps the RoPE key in bf16, as fp8_ds_mla does).
#define INV_MLA_HOMOGENEOUS(id, fmt)                                                                              \
  TEST_CASE("INV.mla." id " MLA latent cache homogeneous: quantize(2^k x) = same codes, 2^k scale",               \
            "[gate:INV][mla][fmt:" id "]") {                                                                    \
    const auto f = parse_kv_format(fmt);                                                                        \
    REQUIRE(f.has_value());                                                                                     \
    run_homogeneity(*f, true);                                                                                  \
  }
INV_MLA_HOMOGENEOUS("f16", "f16")
INV_MLA_HOMOGENEOUS("bf16", "bf16")
INV_MLA_HOMOGENEOUS("int8", "int8")
INV_MLA_HOMOGENEOUS("q8_0", "q8_0")
INV_MLA_HOMOGENEOUS("q4_0", "q4_0")
INV_MLA_HOMOGENEOUS("mxfp8", "mxfp8")
INV_MLA_HOMOGENEOUS("mxfp4", "mxfp4")
INV_MLA_HOMOGENEOUS("fp8_per_token_head", "fp8_per_token_head")
INV_MLA_HOMOGENEOUS("int8_per_token_head", "int8_per_token_head")
INV_MLA_HOMOGENEOUS("fp8_ds_mla", "k=fp8_block128,v=bf16")

TEST_CASE("INV.rotation normalized Walsh-Hadamard round trip and orthogonality", "[gate:INV][fmt:k8v4]") {
  for (int n : {1, 2, 8, 64, 128, 256}) {
    INFO("n = " << n);
    const auto x = banded(n, 31 + n, 1.0f);
    std::vector<float> y(x);
    hadamard_normalized(y.data(), n);
    // Against the FP64 definition y = H x / sqrt(n) with H_ij = (-1)^popcount(i & j) (Sylvester).
    double l2 = 0;
    for (float v : x) l2 += double(v) * v;
    for (int i = 0; i < n; ++i) {
      double ref = 0;
      for (int j = 0; j < n; ++j) ref += (__builtin_popcount(static_cast<unsigned>(i & j)) & 1 ? -1.0 : 1.0) * x[j];
      ref /= std::sqrt(double(n));
      CHECK(std::fabs(ref - y[i]) <= wht_slack(n, std::sqrt(l2)));
    }
    hadamard_normalized(y.data(), n);
    for (int i = 0; i < n; ++i) CHECK(std::fabs(double(y[i]) - x[i]) <= 2 * wht_slack(n, std::sqrt(l2)));
    if (n >= 8) {  // anti-vacuity: the transform moved the data
      double moved = 0;
      std::vector<float> z(x);
      hadamard_normalized(z.data(), n);
      for (int i = 0; i < n; ++i) moved = std::max(moved, std::fabs(double(z[i]) - x[i]));
      CHECK(moved > 0.1);
    }
  }
}

TEST_CASE("INV.fp8.head_scales moving each KV head's scale by its own power of two leaves reads and attention "
          "bit-identical",
          "[gate:INV][fmt:fp8][fmt:fp8_e5m2]") {
  // Static scales per KV head, distinct per head, layer and half (head_scales.hpp); head h of layer l
  // moves by 2^e with e different per (layer, head, half), so a reader that took another head's
  // scale, or one scale for the layer, would give other values. Every scaled value stays normal and
  // unsaturated under both scale sets (x / s in [0.5, 60], e in [-2, 2]: [2^-3, 240]).
  // Anti-vacuity: each head's stored codes change (its scale reached its own elements).
  const int L = 2, H = 4, D = 16, B = 16, n = 37, Hq = 8;
  long heads_moved = 0;
  for (HalfFormat hf : {HalfFormat::fp8_e4m3, HalfFormat::fp8_e5m2}) {
    const auto ks = gate_head_scales(L, H, KvHalf::K), vs = gate_head_scales(L, H, KvHalf::V);
    std::vector<float> ks2 = ks, vs2 = vs;
    for (std::size_t i = 0; i < ks.size(); ++i) {
      ks2[i] = std::ldexp(ks[i], static_cast<int>(i % 5) - 2);
      vs2[i] = std::ldexp(vs[i], 2 - static_cast<int>((i + 1) % 5));
    }
    const HeadScaledStore base = fill_head_scaled({hf, hf}, L, H, D, B, n, ks, vs, 5);
    StoreConfig c2 = base.store->config();
    c2.k_scale = ks2;
    c2.v_scale = vs2;
    PagedKvStore moved(c2);
    const SeqId s2 = moved.create_sequence();
    moved.extend(s2, n);
    Rng r(6);
    std::vector<float> q(static_cast<std::size_t>(2) * Hq * D);
    for (auto& x : q) x = r.normal();
    for (int l = 0; l < L; ++l) {
      moved.write(s2, l, 0, n, base.k[static_cast<std::size_t>(l)].data(), H * D, base.v[static_cast<std::size_t>(l)].data(), H * D);
      for (KvHalf kh : {KvHalf::K, KvHalf::V}) {
        INFO(name(hf) << " layer " << l << (kh == KvHalf::K ? " K" : " V"));
        std::vector<float> a(static_cast<std::size_t>(n) * H * D), b(a.size());
        base.store->read(base.seq, l, kh, 0, n, a.data());
        moved.read(s2, l, kh, 0, n, b.data());
        CHECK(bit_equal(a, b));
        const std::uint8_t* pa = base.store->page(l, kh, base.store->block_table(base.seq)[0]);
        const std::uint8_t* pb = moved.page(l, kh, moved.block_table(s2)[0]);
        for (int h = 0; h < H; ++h) {
          const float sa = base.store->head_scales(l, kh)[static_cast<std::size_t>(h)], sb = moved.head_scales(l, kh)[static_cast<std::size_t>(h)];
          if (sa == sb) continue;
          CHECK(std::memcmp(pa + h * D, pb + h * D, static_cast<std::size_t>(D)) != 0);  // slot 0, head h
          ++heads_moved;
        }
      }
      const AttentionArgs args{2, Hq, n - 2, 0};
      std::vector<float> o1(q.size()), o2(q.size());
      attention(*base.store, base.seq, l, args, q.data(), o1.data());
      attention(moved, s2, l, args, q.data(), o2.data());
      CHECK(bit_equal(o1, o2));
    }
  }
  CHECK(heads_moved >= 2 * L * 2 * (H - 1));
}
