// ORA.bytes_edge: the runtime's page bytes equal the oracle's for inputs placed on every edge a
// half format has, not only for random data: ±inf, NaN of both signs, ±0, binary16 subnormals,
// ±FLT_MAX, values past the f16 and fp8 saturation points, and exact rounding ties (binary16,
// bfloat16, the int8/q8_0 grid, the q4_0 grid, the e4m3 and e5m2 grids, the E2M1 and E4M3 grids
// under a fixed MX block scale, the e4m3 grid under a per-(token, head) scale amax/448 that is a power
// of two, which is also fp8_block128's per-tile scale; the int8/q8_0 row's cells also fix
// int8_per_token_head's amax/127 at 2^-4). Random inputs almost never
// land on a tie, so a quantizer that rounds half away from zero, or casts a non-finite quotient to
// int before clamping, passes every other byte gate.
//
// Bound: none. The runtime and the oracle implement the same normative semantics
// (docs/FORMATS.md), so every byte of every page must be equal.
// Anti-vacuity: each edge value is present in the K and the V inputs, the fp8 scales are powers of
// two (so x / scale is exact and a tie in x is a tie in the code domain), and for every lossy half
// the oracle's bytes change when the tie elements are nudged by one ulp: the ties really sit on a
// rounding boundary of that format (q4_0_rot excepted: see run_edge_gate).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <sstream>

#include "catch_compat.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate/kv_store.hpp"
#include "kvgate_oracle/formats.hpp"
#include "oracle_fixtures.hpp"
#include "populations.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace ko = kvgate_oracle;

namespace {

constexpr int kH = 2, kD = 64, kBlock = 4, kTokens = 12;
constexpr int kHD = kH * kD;
// Powers of two, non-unit, K != V (see the header comment).
constexpr float kEdgeKScale = 0.5f, kEdgeVScale = 0.25f;

// Rows of tokens whose elements are chosen (the rest gaussian). `scale` is the fp8 per-tensor
// scale of the half the rows are for, so the fp8 ties are ties of x / scale.
struct EdgeRows {
  std::vector<float> x;          // [kTokens][kHD]
  std::vector<int> tie_tokens;   // tokens whose elements sit on rounding boundaries
};

EdgeRows make_edge_rows(float scale, float magnitude, std::uint64_t seed) {
  EdgeRows e;
  e.x.assign(static_cast<std::size_t>(kTokens) * kHD, 0.0f);
  Rng r(seed);
  for (auto& v : e.x) v = r.normal() * magnitude;
  auto row = [&](int t) { return e.x.data() + static_cast<std::size_t>(t) * kHD; };
  // t0: infinities inside otherwise normal cells (head 0 +inf, head 1 -inf), and a 32-block holding
  // both (+inf is its extreme, so -inf lands on the opposite side: q4_0 code 15, not 0).
  row(0)[3] = INFINITY;
  row(0)[20] = -INFINITY;
  row(0)[kD + 5] = -INFINITY;
  // t1: NaNs of both signs, one per head.
  row(1)[7] = std::nanf("");
  row(1)[kD + 9] = -std::nanf("");
  // t2: signed zeros, and one whole cell of -0.
  row(2)[1] = -0.0f;
  row(2)[2] = 0.0f;
  for (int i = 0; i < kD; ++i) row(2)[kD + i] = -0.0f;
  // t3: the largest finite binary32 of both signs.
  row(3)[11] = FLT_MAX;
  row(3)[kD + 13] = -FLT_MAX;
  // t4: binary16 subnormals and their ties (2^-25 ties to 0, 3*2^-25 to 2^-23), a whole cell of them.
  for (int i = 0; i < kD; ++i) {
    const float s[] = {0x1p-24f, 0x1p-25f, 0x3p-25f, 0x1p-20f, -0x1p-24f, -0x3p-25f, 0x5p-25f, 0x1p-15f};
    row(4)[i] = s[i % 8];
  }
  // t5: the int8 / q8_0 grid with d = 2^-4: one element of every 32-block is 127 * 2^-4 (so the
  // stored f16 scale is exactly 2^-4) and the others are (k + 1/2) * 2^-4, exact ties.
  for (int i = 0; i < kHD; ++i) {
    const int k = (i * 37) % 253 - 126;  // k + 1/2 in [-125.5, 126.5]
    row(5)[i] = i % 32 == 0 ? 127.0f / 16.0f : (static_cast<float>(k) + 0.5f) / 16.0f;
  }
  // t6: the q4_0 grid: every 32-block's extreme is -8 * 2^-4 (so d = +2^-4 exactly), the others
  // (k + 1/2) * 2^-4 for k in [-8, 6], exact ties.
  for (int i = 0; i < kHD; ++i) {
    const int k = (i * 5) % 15 - 8;
    row(6)[i] = i % 32 == 0 ? -0.5f : (static_cast<float>(k) + 0.5f) / 16.0f;
  }
  // t7: fp8 grids: e4m3 ties (1 + 1/16, 2 + 1/8, ...), e5m2 ties (1 + 1/8, ...), e4m3 subnormal
  // ties (2^-10 = half of the smallest subnormal 2^-9), and the saturation points of both.
  {
    const float y[] = {1.0625f, 1.1875f, 2.125f, 1.125f, 1.375f, 3.5f, 0x1p-10f, 0x3p-10f,
                       449.0f, 464.0f, 500.0f, 57344.0f, 61440.0f, -1.0625f, -1.125f, 0x1p-17f};
    for (int i = 0; i < kHD; ++i) row(7)[i] = y[i % 16] * scale;
  }
  // t8: binary16 ties (1 + 2^-11 -> 1, 1 + 3*2^-11 -> 1 + 2^-9), bfloat16 ties (1 + 2^-8 -> 1,
  // 1 + 3*2^-8 -> 1 + 2^-6), and the f16 overflow point (65520 ties to inf, 65519 stays finite).
  {
    const float y[] = {1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f,
                       65519.0f, 65520.0f, -(1.0f + 0x1p-11f), -(1.0f + 0x3p-8f)};
    for (int i = 0; i < kHD; ++i) row(8)[i] = y[i % 8];
  }
  // t9: the MX grids: every 32-block's element 0 is 6 (amax 6, so X = 2^(2-2) = 1 for mxfp4 and
  // 2^(2-8) = 2^-6 for mxfp8, exactly); elements 1..15 are E2M1 midpoints of x / 1, elements 16..31
  // E4M3 midpoints of x / 2^-6 (normal and subnormal), all below the block's amax.
  {
    const float e2m1_ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.25f,
                               -0.75f, -1.25f, -1.75f, -2.5f, -3.5f, -5.0f, 0.75f};
    const float e4m3_ties[] = {1.0625f, 1.1875f, 2.125f, 1.3125f, 3.625f, 0x1p-10f, 0x3p-10f, 200.0f,
                               368.0f, -1.0625f, -2.125f, -0x1p-10f, 17.0f, 38.0f, 0x5p-10f, 1.4375f};
    for (int i = 0; i < kHD; ++i) {
      const int j = i % 32;
      row(9)[i] = j == 0 ? 6.0f : j < 16 ? e2m1_ties[j - 1] : e4m3_ties[j - 16] * 0x1p-6f;
    }
  }
  // t10: an ordinary gaussian row after the edges (the page keeps its layout past them), but for its
  // first 16-block: amax = 8.4 * 2^-9 * scale, so nvfp4's block scale (amax/6)/scale = 1.4 * 2^-9 is an
  // E4M3 subnormal that rounds down to 2^-9 and the extreme is 8.4 S: past 7, the only place where
  // nvfp4's E2M1 saturation (and not its rounding) decides the code.
  row(10)[0] = 8.4f * 0x1p-9f * scale;
  for (int i = 1; i < 16; ++i) row(10)[i] = 0.1f * static_cast<float>(i % 7 - 3) * 0x1p-9f * scale;
  // t11: fp8_per_token_head's grid: every cell's element 0 is 448 * 2^-4 (so s = amax/448 = 2^-4
  // exactly, and x / s is exact), the others E4M3 midpoints (normal and subnormal) times 2^-4, all
  // below the cell's amax. The same row is fp8_block128's grid: its 128-tile (both cells) has the
  // same amax, so the tile's s is 2^-4 as well.
  {
    const float e4m3_ties[] = {1.0625f, 1.1875f, 2.125f, 1.3125f, 3.625f, 0x1p-10f, 0x3p-10f, 200.0f,
                               368.0f, -1.0625f, -2.125f, -0x1p-10f, 17.0f, 38.0f, 0x5p-10f, 1.4375f};
    for (int i = 0; i < kHD; ++i) row(11)[i] = i % kD == 0 ? 28.0f : e4m3_ties[i % 16] * 0x1p-4f;
  }
  e.tie_tokens = {4, 5, 6, 7, 8, 9, 11};
  return e;
}

// Moves every tie element (not the block/cell extremes that fix the scales) one ulp towards +inf.
std::vector<float> nudged(const EdgeRows& e) {
  std::vector<float> x = e.x;
  for (int t : e.tie_tokens)
    for (int i = 0; i < kHD; ++i) {
      float& v = x[static_cast<std::size_t>(t) * kHD + i];
      if (i % 32 == 0 && (t == 5 || t == 6 || t == 9 || t == 11)) continue;
      v = std::nextafter(v, INFINITY);
    }
  return x;
}

int count_if_value(const std::vector<float>& x, bool (*pred)(float)) {
  return static_cast<int>(std::count_if(x.begin(), x.end(), pred));
}

void run_edge_gate(const KvFormat& fmt, std::uint64_t seed) {
  INFO("format " << fmt.name() << " block_size=" << kBlock << " kv_heads=" << kH << " head_dim=" << kD
                 << " tokens=" << kTokens << " seed=" << seed << " k_scale=" << kEdgeKScale
                 << " v_scale=" << kEdgeVScale);
  const EdgeRows k = make_edge_rows(kEdgeKScale, 1.0f, seed), v = make_edge_rows(kEdgeVScale, 0.05f, seed + 1);

  // Anti-vacuity (1): every edge value is in both inputs.
  for (const EdgeRows* e : {&k, &v}) {
    CHECK(count_if_value(e->x, [](float a) { return std::isinf(a) && a > 0; }) >= 1);
    CHECK(count_if_value(e->x, [](float a) { return std::isinf(a) && a < 0; }) >= 1);
    CHECK(count_if_value(e->x, [](float a) { return std::isnan(a) && std::signbit(a); }) >= 1);
    CHECK(count_if_value(e->x, [](float a) { return std::isnan(a) && !std::signbit(a); }) >= 1);
    CHECK(count_if_value(e->x, [](float a) { return a == 0.0f && std::signbit(a); }) >= kD);
    CHECK(count_if_value(e->x, [](float a) { return std::fabs(a) == FLT_MAX; }) >= 2);
    CHECK(count_if_value(e->x, [](float a) { return a != 0.0f && std::fabs(a) < 0x1p-14f; }) >= kD / 2);
  }

  StoreCase sc{kBlock, kH, kD, kTokens, Pattern::gaussian, seed, 0};
  PagedKvStore store(case_config(fmt, sc, kEdgeKScale, kEdgeVScale));
  const SeqId s = store.create_sequence();
  write_case(store, s, sc, k.x, v.x);
  REQUIRE(store.check_guards().empty());
  const ko::PageShape shape{kBlock, kH, kD};
  const auto table = store.block_table(s);
  long pages = 0;
  for (int half = 0; half < 2; ++half) {
    const KvHalf kh = half == 0 ? KvHalf::K : KvHalf::V;
    const EdgeRows& e = half == 0 ? k : v;
    const float tscale = half == 0 ? kEdgeKScale : kEdgeVScale;
    const HalfFormat hf = store.half_format(kh);
    const ko::Half oh = oracle_half(hf);
    REQUIRE(ko::page_bytes(oh, shape) == store.page_bytes(kh));
    const std::vector<float> x_nudged = nudged(e);
    bool nudge_changed = false;
    for (std::size_t p = 0; p < table.size(); ++p) {
      const int t0 = static_cast<int>(p) * kBlock;
      const int n = std::min(kBlock, kTokens - t0);
      const float* in = e.x.data() + static_cast<std::size_t>(t0) * kHD;
      const auto expect = ko::quantize_page(oh, shape, in, n, tscale);
      const std::uint8_t* got = store.page(0, kh, table[p]);
      INFO((half == 0 ? "K" : "V") << " half " << name(hf) << " page " << p << " (tokens " << t0 << ".."
                                   << t0 + n - 1 << "): " << first_diff(got, expect.data(), expect.size()));
      CHECK(std::equal(expect.begin(), expect.end(), got));
      const auto moved = ko::quantize_page(oh, shape, x_nudged.data() + static_cast<std::size_t>(t0) * kHD, n, tscale);
      nudge_changed = nudge_changed || moved != expect;
      ++pages;
    }
    // Anti-vacuity (2): the tie elements sit on rounding boundaries of this half format.
    // q4_0_rot quantizes the Hadamard-rotated cell, whose elements are not exact ties in binary32;
    // its rotated-domain edges are the q4_0 ones.
    if (hf != HalfFormat::f32 && hf != HalfFormat::q4_0_rot) {
      INFO("half " << name(hf) << ": one-ulp nudge of the tie elements changes the oracle's bytes");
      CHECK(nudge_changed);
    }
  }
  CHECK(pages == 2 * static_cast<long>((kTokens + kBlock - 1) / kBlock));
}

}  // namespace

#define ORA_EDGE(id, preset, seed)                                                                        \
  TEST_CASE("ORA.bytes_edge." id " page bytes == oracle bytes at inf/NaN/subnormal/saturation/tie inputs", \
            "[gate:ORA][fmt:" preset "]") {                                                               \
    const auto f = parse_kv_format(preset);                                                               \
    REQUIRE(f.has_value());                                                                               \
    run_edge_gate(*f, seed);                                                                              \
  }

#define ORA_EDGE_ROW(A, name, k, v, slot, kind) ORA_EDGE(#name, #name, (5000 + 100 * slot))
KVGATE_PRESETS(ORA_EDGE_ROW, _)  // one row per preset: kvgate/format_list.hpp
ORA_EDGE("mixed", "k=q8_0,v=fp8_e5m2", 6000)
