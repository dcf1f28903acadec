// STO.noop.<preset>: no-op detection. A "quantized" cache that is never quantized, quantized in a
// finer or coarser format than its name, all zero, with scale 1.0, without its rotation, or whose one
// half silently keeps another format, fails. Per half (K and V apart), on the declared half format
// of the preset (kvgate/format_list.hpp rows; never the store's own view of its format):
//  1. the store's bytes are the format's bytes: the page holds the declared format's page bytes
//     (gates/common/format_bytes.hpp), its code symbols (parsed here from the docs/FORMATS.md layout,
//     not through the runtime's readers) take no more values than the format's code width allows and
//     more than a constant, and every stored scale is the one the format's rule gives for its group's
//     extreme (int8/q8_0: the smallest f16 with 127 s >= amax; q4_0: 8|d| >= |m|, d of the opposite
//     sign; MX: 2^(floor(log2 amax) - emax) exactly; nvfp4: e4m3((amax/6)/g) within its rounding);
//  2. the half really is quantized on its grid: the round trip's error, in units of the format's
//     own grid step at each element (its ulp for the float codes, the scale for the integer codes),
//     has the RMS of a rounding residual (bounds.hpp kNoopResidualRms*): a half kept in a format one
//     bit finer (or not quantized at all) is far under it, one a bit coarser far over; f32 and f16 /
//     bf16 on values they represent come back exactly;
//  3. a rotated half (q4_0_rot) really rotates: a cell holding one spike A stores the block scale
//     of the spread vector (A/sqrt(D), not A), a constant cell the scale of its concentrated first
//     element (a sqrt(D)) and zero blocks after it;
//  4. in the engine (stories260K): its store holds the declared halves' page bytes, and each half
//     changes the logits against the f16 and the f32 baselines exactly when it is another format
//     (a half that is a placebo, kept in the baseline's format, gives the baseline's logits).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bounds.hpp"
#include "catch_compat.hpp"
#include "conformance_fixtures.hpp"
#include "format_bytes.hpp"
#include "kvgate/blocks.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/model.hpp"
#include "models.hpp"
#include "populations.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;

namespace {

// --- the code values of docs/FORMATS.md, decoded here ------------------------------------------
double f16_value(std::uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}
double e4m3_value(std::uint8_t c) {
  const int e = (c >> 3) & 0xF, m = c & 7;
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (c & 0x80) ? -v : v;
}
constexpr double kE2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
std::uint16_t le16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }

// The normalized Walsh-Hadamard transform of FORMATS.md (q4_0_rot), in binary64 here.
void wht(std::vector<double>& y) {
  const std::size_t n = y.size();
  for (std::size_t len = 1; len < n; len <<= 1)
    for (std::size_t i = 0; i < n; ++i)
      if ((i & len) == 0) {
        const double a = y[i], b = y[i + len];
        y[i] = a + b;
        y[i + len] = a - b;
      }
  for (double& v : y) v /= std::sqrt(static_cast<double>(n));
}

// One half of a page, parsed: per element the code symbol; per scale group its stored scale
// (value) and the elements it covers.
struct Parsed {
  std::vector<std::uint32_t> code;  // [n_tokens][HD]
  int code_bits = 0;                // width of one code symbol
  int group = 0;                    // elements per scale group (0: no stored scale)
  std::vector<double> scale;        // [n_tokens][HD / group] decoded scales (signed for q4_0's d)
  std::vector<int> scale_code;      // the raw scale code (UE8M0 / E4M3) where the format has one
};

Parsed parse_page(HalfFormat f, const std::uint8_t* pg, int B, int H, int D, int n) {
  const int HD = H * D;
  Parsed p;
  auto codes = [&](int bits, std::size_t row_bytes) {
    p.code_bits = bits;
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < HD; ++i) {
        const std::uint8_t* r = pg + static_cast<std::size_t>(t) * row_bytes;
        std::uint32_t c = 0;
        if (bits == 32) std::memcpy(&c, r + 4 * i, 4);
        else if (bits == 16) c = le16(r + 2 * i);
        else if (bits == 8) c = r[i];
        else c = (r[i / 2] >> (4 * (i % 2))) & 0xF;
        p.code.push_back(c);
      }
  };
  switch (f) {
    case HalfFormat::f32: codes(32, 4 * HD); break;
    case HalfFormat::f16:
    case HalfFormat::bf16: codes(16, 2 * HD); break;
    case HalfFormat::fp8_e4m3:
    case HalfFormat::fp8_e5m2: codes(8, HD); break;
    case HalfFormat::int8:
      codes(8, HD);
      p.group = D;
      for (int c = 0; c < n * H; ++c) p.scale.push_back(f16_value(le16(pg + static_cast<std::size_t>(B) * HD + 2 * c)));
      break;
    case HalfFormat::fp8_per_token_head:
    case HalfFormat::int8_per_token_head:  // byte codes, then the cells' binary32 scales [B][H]
      codes(8, HD);
      p.group = D;
      for (int c = 0; c < n * H; ++c) {
        float sc;
        std::memcpy(&sc, pg + static_cast<std::size_t>(B) * HD + 4 * static_cast<std::size_t>(c), 4);
        p.scale.push_back(sc);
      }
      break;
    case HalfFormat::fp8_block128:  // byte codes, then the 128-tiles' binary32 scales [B][H*D/128]
      codes(8, HD);
      p.group = kTileBlock;
      for (int k = 0; k < n * HD / kTileBlock; ++k) {
        float sc;
        std::memcpy(&sc, pg + static_cast<std::size_t>(B) * HD + 4 * static_cast<std::size_t>(k), 4);
        p.scale.push_back(sc);
      }
      break;
    case HalfFormat::q8_0:
    case HalfFormat::q4_0:
    case HalfFormat::q4_0_rot: {
      const bool q8 = f == HalfFormat::q8_0;
      const std::size_t bb = q8 ? 34 : 18;
      p.code_bits = q8 ? 8 : 4;
      p.group = 32;
      for (int k = 0; k < n * HD / 32; ++k) {
        const std::uint8_t* b = pg + k * bb;
        p.scale.push_back(f16_value(le16(b)));
        for (int j = 0; j < 32; ++j)
          p.code.push_back(q8 ? b[2 + j] : j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4));
      }
      break;
    }
    case HalfFormat::mxfp8:
    case HalfFormat::mxfp4:
    case HalfFormat::nvfp4: {
      const bool fp8 = f == HalfFormat::mxfp8;
      const std::size_t row_bytes = fp8 ? HD : HD / 2;
      codes(fp8 ? 8 : 4, row_bytes);
      p.group = f == HalfFormat::nvfp4 ? 16 : 32;
      const std::uint8_t* sc = pg + static_cast<std::size_t>(B) * row_bytes;
      for (int t = 0; t < n; ++t)
        for (int b = 0; b < HD / p.group; ++b) {
          const int c = sc[t * (HD / p.group) + b];
          p.scale_code.push_back(c);
          p.scale.push_back(f == HalfFormat::nvfp4 ? e4m3_value(static_cast<std::uint8_t>(c)) : std::ldexp(1.0, c - 127));
        }
      break;
    }
  }
  return p;
}

// The grid step of the format at element value y (in the code domain, before any scale): an ulp for
// the float codes (subnormal spacing below the normal range), 1 for the integer codes.
double code_step(HalfFormat f, double y) {
  const double a = std::fabs(y);
  auto fl = [&](int mant, double min_normal, double sub) { return a >= min_normal ? std::ldexp(1.0, std::ilogb(a) - mant) : sub; };
  switch (f) {
    case HalfFormat::f16: return fl(10, 0x1p-14, 0x1p-24);
    case HalfFormat::bf16: return fl(7, 0x1p-126, 0x1p-133);
    case HalfFormat::fp8_e4m3:
    case HalfFormat::mxfp8:
    case HalfFormat::fp8_per_token_head:
    case HalfFormat::fp8_block128: return fl(3, 0x1p-6, 0x1p-9);
    case HalfFormat::fp8_e5m2: return fl(2, 0x1p-14, 0x1p-16);
    case HalfFormat::mxfp4:
    case HalfFormat::nvfp4: return a < 2 ? 0.5 : a < 4 ? 1.0 : 2.0;
    default: return 1.0;  // int8, q8_0, q4_0, q4_0_rot: integer codes
  }
}

struct HalfCase {
  HalfFormat f;
  float tensor_scale;
  std::vector<float> x;      // inputs [n][HD]
  std::vector<float> x_hat;  // the runtime's read [n][HD]
};

// 1 and 2 for one half.
void check_half(const HalfCase& hc, const std::uint8_t* page, std::size_t page_bytes, int B, int H, int D, int n) {
  const HalfFormat f = hc.f;
  const int HD = H * D;
  INFO("half format " << name(f) << ", B " << B << " H " << H << " D " << D << ", " << n << " tokens");
  CHECK(page_bytes == expected_page_bytes(f, B, H, D));
  const Parsed p = parse_page(f, page, B, H, D, n);
  REQUIRE(p.code.size() == static_cast<std::size_t>(n) * HD);

  // 1a. The code symbols: no more values than the code width holds (int8 codes never -128), more
  // than a constant, and a Shannon entropy under the width.
  const std::set<std::uint32_t> distinct(p.code.begin(), p.code.end());
  const bool int8_codes = f == HalfFormat::int8 || f == HalfFormat::q8_0 || f == HalfFormat::int8_per_token_head;
  const double max_values = int8_codes ? 255.0 : std::ldexp(1.0, p.code_bits);
  CHECK(static_cast<double>(distinct.size()) <= max_values);
  CHECK(distinct.size() >= kNoopMinDistinctCodes);
  if (int8_codes) CHECK(distinct.count(0x80) == 0);

  // Group extremes of the input (in the rotated domain for q4_0_rot: the values the codes hold).
  std::vector<double> y(hc.x.begin(), hc.x.end());
  if (f == HalfFormat::q4_0_rot)
    for (int c = 0; c < n * H; ++c) {
      std::vector<double> cell(y.begin() + c * D, y.begin() + (c + 1) * D);
      wht(cell);
      std::copy(cell.begin(), cell.end(), y.begin() + c * D);
    }

  // 1b. Every stored scale is the format's for its group.
  const double g = hc.tensor_scale;
  std::vector<double> elem_scale(y.size(), 1.0);  // the factor from code values to element values
  for (std::size_t k = 0; p.group > 0 && k < p.scale.size(); ++k) {
    double amax = 0, m = 0;
    for (int j = 0; j < p.group; ++j) {
      const double v = y[k * p.group + j];
      if (std::fabs(v) > amax) amax = std::fabs(v), m = v;
    }
    const double s = p.scale[k];
    INFO("scale group " << k << ": amax " << amax << ", stored scale " << s);
    REQUIRE(amax > 0);
    switch (f) {
      case HalfFormat::int8:
      case HalfFormat::q8_0:
        CHECK(127 * s >= amax);
        CHECK(s <= f16_up_hi(amax / 127));
        break;
      case HalfFormat::q4_0:
        CHECK(8 * std::fabs(s) >= std::fabs(m));
        CHECK(std::fabs(s) <= f16_up_hi(std::fabs(m) / 8));
        CHECK(s * m < 0);  // d = -sign(m)|d|: the extreme takes code 0
        break;
      case HalfFormat::q4_0_rot: {
        // The runtime rotates in binary32: the extreme may move by the rotation's slack.
        double l2 = 0;
        for (int j = 0; j < D; ++j) l2 += hc.x[(k * 32 / D) * D + j] * hc.x[(k * 32 / D) * D + j];
        const double slack = wht_slack(D, std::sqrt(l2));
        CHECK(8 * std::fabs(s) >= std::fabs(m) - slack);
        CHECK(std::fabs(s) <= f16_up_hi((std::fabs(m) + slack) / 8));
        break;
      }
      case HalfFormat::mxfp8:
      case HalfFormat::mxfp4:
        CHECK(p.scale_code[k] == std::ilogb(amax) - (f == HalfFormat::mxfp8 ? kMxfp8Emax : kMxfp4Emax) + 127);
        break;
      case HalfFormat::fp8_per_token_head:
      case HalfFormat::fp8_block128:
      case HalfFormat::int8_per_token_head: {
        // s = amax / qmax rounded once to binary32 (FORMATS.md): within u of the exact quotient.
        const double q = amax / (f == HalfFormat::int8_per_token_head ? 127.0 : 448.0);
        CHECK(std::fabs(s - q) <= kU32 * q);
        break;
      }
      case HalfFormat::nvfp4: {
        const double t = amax / 6 / g;
        CHECK(std::fabs(s - t) <= (t >= kE4m3MinNormal ? 0x1p-4 * t : 0x1p-10) * (1 + 4 * kU32));
        break;
      }
      default: break;
    }
    for (int j = 0; j < p.group; ++j) elem_scale[k * p.group + j] = f == HalfFormat::nvfp4 ? s * g : std::fabs(s);
  }
  if (f == HalfFormat::fp8_e4m3 || f == HalfFormat::fp8_e5m2) std::fill(elem_scale.begin(), elem_scale.end(), g);

  // 2. The round trip in units of the grid step. f32 is exact; the others leave rounding residuals
  // whose RMS is that of a residual on the declared grid.
  if (f == HalfFormat::f32) {
    CHECK(std::memcmp(hc.x.data(), hc.x_hat.data(), hc.x.size() * sizeof(float)) == 0);
    return;
  }
  std::vector<double> yh(hc.x_hat.begin(), hc.x_hat.end());
  if (f == HalfFormat::q4_0_rot)  // the read's values, rotated back onto the codes' grid
    for (int c = 0; c < n * H; ++c) {
      std::vector<double> cell(yh.begin() + c * D, yh.begin() + (c + 1) * D);
      wht(cell);
      std::copy(cell.begin(), cell.end(), yh.begin() + c * D);
    }
  double sq = 0;
  std::size_t differ = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double step = code_step(f, y[i] / elem_scale[i]) * elem_scale[i];
    const double r = (yh[i] - y[i]) / step;
    sq += r * r;
    differ += hc.x_hat[i] != hc.x[i];
  }
  const double rms = std::sqrt(sq / static_cast<double>(y.size()));
  INFO("round-trip residual RMS " << rms << " grid steps; " << differ << " of " << y.size() << " elements changed");
  CHECK(differ * 2 > y.size());  // lossy: most elements do not come back as they went in
  CHECK(rms >= kNoopResidualRmsLo);
  CHECK(rms <= kNoopResidualRmsHi);
}

std::uint64_t slot_seed(int slot) { return 7300 + 100 * static_cast<std::uint64_t>(slot); }

// Directed population: gaussian cells whose magnitude steps over binades token by token.
std::vector<float> population(int n, int HD, float magnitude, std::uint64_t seed) {
  Rng r(seed);
  std::vector<float> x(static_cast<std::size_t>(n) * HD);
  for (int t = 0; t < n; ++t) {
    const float m = magnitude * std::ldexp(1.0f + 0.37f * static_cast<float>(t % 3), t % 5 - 2);
    for (int i = 0; i < HD; ++i) x[static_cast<std::size_t>(t) * HD + i] = r.normal() * m;
  }
  return x;
}

StoreConfig one_layer(const KvFormat& f, int B, int H, int D, int n) {
  StoreConfig c;
  c.format = f;
  c.n_kv_heads = H;
  c.head_dim = D;
  c.block_size = B;
  c.n_blocks = (n + B - 1) / B + 1;
  c.k_scale = {kGateKScale};
  c.v_scale = {kGateVScale};
  return c;
}

void check_store(const KvFormat& f, int slot) {
  const int B = 32, H = 2, D = 64, n = 32, HD = H * D;  // one page of 32 tokens per half
  PagedKvStore st(one_layer(f, B, H, D, n));
  const SeqId s = st.create_sequence();
  st.extend(s, n);
  HalfCase k{f.k, kGateKScale, population(n, HD, kGateKMagnitude, slot_seed(slot)), {}};
  HalfCase v{f.v, kGateVScale, population(n, HD, kGateVMagnitude, slot_seed(slot) + 1), {}};
  st.write(s, 0, 0, n, k.x.data(), HD, v.x.data(), HD);
  for (HalfCase* hc : {&k, &v}) {
    const KvHalf h = hc == &k ? KvHalf::K : KvHalf::V;
    hc->x_hat.resize(hc->x.size());
    st.read(s, 0, h, 0, n, hc->x_hat.data());
    INFO((h == KvHalf::K ? "K" : "V") << " half of " << f.name());
    check_half(*hc, st.host_page(0, h, st.block_table(s)[0]), st.page_bytes(h), B, H, D, n);
  }
  // Exact where exact: a float half gives back the values it represents (f16 / bf16 values).
  for (KvHalf h : {KvHalf::K, KvHalf::V}) {
    const HalfFormat hf = h == KvHalf::K ? f.k : f.v;
    if (hf != HalfFormat::f16 && hf != HalfFormat::bf16) continue;
    std::vector<float> x = population(n, HD, 1.0f, slot_seed(slot) + 2), back(x.size());
    for (float& e : x) {  // cut to the representable grid: 11 (f16) / 8 (bf16) significant bits
      int ex = 0;
      const double fr = std::frexp(static_cast<double>(e), &ex);
      const int bits = hf == HalfFormat::f16 ? 11 : 8;
      e = static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(fr, bits)), ex - bits));
    }
    PagedKvStore ex(one_layer(f, B, H, D, n));
    const SeqId q = ex.create_sequence();
    ex.extend(q, n);
    ex.write(q, 0, 0, n, x.data(), HD, x.data(), HD);
    ex.read(q, 0, h, 0, n, back.data());
    INFO(name(hf) << " half on values it represents");
    CHECK(std::memcmp(x.data(), back.data(), x.size() * sizeof(float)) == 0);
  }
}

// 3. The rotation: a spike cell and a constant cell.
void check_rotation(const KvFormat& f) {
  const int B = 16, H = 2, D = 64, HD = H * D;
  PagedKvStore st(one_layer(f, B, H, D, 2));
  const SeqId s = st.create_sequence();
  st.extend(s, 2);
  const float A = 5.0f, a = 0.25f;
  std::vector<float> rows(2 * HD, 0.0f);
  for (int r = 0; r < 2; ++r) {
    rows[r * HD + 3] = A;                                      // head 0: one spike
    for (int i = 0; i < D; ++i) rows[r * HD + D + i] = a;      // head 1: constant
  }
  st.write(s, 0, 0, 2, rows.data(), HD, rows.data(), HD);
  for (KvHalf h : {KvHalf::K, KvHalf::V}) {
    if ((h == KvHalf::K ? f.k : f.v) != HalfFormat::q4_0_rot) continue;
    const Parsed p = parse_page(HalfFormat::q4_0_rot, st.host_page(0, h, st.block_table(s)[0]), B, H, D, 2);
    // Blocks of token 0: [head 0: 0, 1][head 1: 2, 3]. Spike: every rotated element is +-A/sqrt(D),
    // so |d| = f16_up(A/sqrt(D)/8) (unrotated: A/8); constant: (a sqrt(D), 0, ...), |d| of block 2 =
    // f16_up(a sqrt(D)/8) and block 3 all zero (unrotated: both a/8).
    const double spike = A / std::sqrt(double(D)), flat = a * std::sqrt(double(D));
    INFO("q4_0_rot block scales of a spike cell " << p.scale[0] << ", " << p.scale[1] << " and a constant cell "
                                                  << p.scale[2] << ", " << p.scale[3]);
    for (int b : {0, 1}) {
      CHECK(std::fabs(p.scale[b]) >= spike / 8 * (1 - 1e-6));
      CHECK(std::fabs(p.scale[b]) <= f16_up_hi(spike / 8 * (1 + 1e-6)));
    }
    CHECK(std::fabs(p.scale[2]) >= flat / 8 * (1 - 1e-6));
    CHECK(std::fabs(p.scale[2]) <= f16_up_hi(flat / 8 * (1 + 1e-6)));
    CHECK(p.scale[3] == 0.0);
  }
}

// 4. The engine: its store's page bytes, and each half's effect on the logits.
std::vector<float> logits_of(const KvFormat& f, std::size_t* k_page = nullptr, std::size_t* v_page = nullptr) {
  const std::vector<int>& ids = kStories260KGreedy64;
  std::vector<int> toks{1};
  toks.insert(toks.end(), ids.begin(), ids.begin() + 40);
  Engine e(stories260k(), engine_options_for(f, 1));
  std::vector<float> out = e.forward_all_logits(toks);
  if (k_page) *k_page = e.store().page_bytes(KvHalf::K);
  if (v_page) *v_page = e.store().page_bytes(KvHalf::V);
  return out;
}

void check_engine(const KvFormat& f) {
  const ModelConfig& c = stories260k().config;
  std::size_t kp = 0, vp = 0;
  logits_of(f, &kp, &vp);
  const std::size_t B = 16, H = static_cast<std::size_t>(c.n_kv_heads), D = static_cast<std::size_t>(c.head_dim);
  CHECK(kp == expected_page_bytes(f.k, B, H, D));
  CHECK(vp == expected_page_bytes(f.v, B, H, D));
  for (HalfFormat base : {HalfFormat::f16, HalfFormat::f32}) {
    const std::vector<float> ref = logits_of({base, base});
    const std::vector<float> k_only = logits_of({f.k, base}), v_only = logits_of({base, f.v});
    INFO("format " << f.name() << " against the all-" << name(base) << " engine");
    CHECK((k_only != ref) == (f.k != base));  // the K half alone moves the logits iff it is another format
    CHECK((v_only != ref) == (f.v != base));
  }
}

}  // namespace

#define STO_NOOP(id, preset, K, V, slot)                                                                              \
  TEST_CASE("STO.noop." id " the store holds the format's bytes and scales; each half quantized on its own grid", \
            "[gate:STO][fmt:" preset "]") {                                                                           \
    const KvFormat f{HalfFormat::K, HalfFormat::V};                                                                 \
    REQUIRE(parse_kv_format(preset) == f);                                                                          \
    check_store(f, slot);                                                                                           \
    check_rotation(f);                                                                                              \
    check_engine(f);                                                                                                \
  }
#define STO_NOOP_ROW(A, name, k, v, slot, kind) STO_NOOP(#name, #name, k, v, slot)
KVGATE_PRESETS(STO_NOOP_ROW, _)  // one row per preset: kvgate/format_list.hpp
