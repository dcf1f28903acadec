// Self-test of the oracle against hand-computed values (FORMATS.md worked by hand) and
// brute-force nearest-value searches; where the compiler has _Float16, against the hardware
// conversion too. It never touches runtime/.
#include "catch_compat.hpp"

#include "kvgate_oracle/oracle.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

using namespace kvgate_oracle;

namespace {

float fbits(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();
bool close(double a, double b, double tol) { return std::fabs(a - b) <= tol; }

// Brute-force RNE onto a sorted table of non-negative finite values (index = code magnitude),
// ties to the even code; beyond the last value: saturate (fp8) or report overflow (-1).
int nearest_code(double ax, const std::vector<double>& table, double overflow_at, bool saturate) {
    if (ax >= overflow_at && !saturate) return -1;
    size_t n = table.size();
    if (ax >= table[n - 1]) {
        if (saturate) return int(n - 1);
        double mid = (table[n - 1] + overflow_at) / 2;  // the next binade's first value
        if (ax < mid) return int(n - 1);
        if (ax > mid) return -1;
        return ((n - 1) & 1) ? -1 : int(n - 1);  // tie: the overflow code n is even iff n-1 odd
    }
    size_t hi = size_t(std::upper_bound(table.begin(), table.end(), ax) - table.begin());
    size_t lo = hi - 1;
    double dl = ax - table[lo], dh = table[hi] - ax;
    if (dl < dh) return int(lo);
    if (dh < dl) return int(hi);
    return (lo & 1) ? int(hi) : int(lo);
}

std::vector<float> random_rows(std::mt19937& rng, size_t n, float scale) {
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> x(n);
    for (float& v : x) v = nd(rng);
    return x;
}

}  // namespace

// ---- f16 ----------------------------------------------------------------------------------

TEST_CASE("f16: hand-picked values, ties, subnormals, overflow, NaN", "[oracle][scalar]") {
    CHECK(to_f16(1.0f) == 0x3C00);
    CHECK(to_f16(-2.0f) == 0xC000);
    CHECK(to_f16(0.0f) == 0x0000);
    CHECK(to_f16(-0.0f) == 0x8000);
    CHECK(to_f16(65504.0f) == 0x7BFF);
    CHECK(to_f16(std::nextafter(65520.0f, 0.0f)) == 0x7BFF);
    CHECK(to_f16(65520.0f) == 0x7C00);  // tie between 65504 (odd) and 2^16 -> inf
    CHECK(to_f16(1e6f) == 0x7C00);
    CHECK(to_f16(-1e6f) == 0xFC00);
    CHECK(to_f16(kInf) == 0x7C00);
    CHECK(to_f16(-kInf) == 0xFC00);
    CHECK(to_f16(1.0f + 0x1p-11f) == 0x3C00);              // tie -> even
    CHECK(to_f16(1.0f + 3 * 0x1p-11f) == 0x3C02);          // tie -> even (up)
    CHECK(to_f16(1.0f + 0x1p-11f + 0x1p-23f) == 0x3C01);   // just above the tie
    CHECK(to_f16(0x1p-24f) == 0x0001);                     // smallest subnormal
    CHECK(to_f16(0x1p-25f) == 0x0000);                     // tie with 0 -> even
    CHECK(to_f16(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
    CHECK(to_f16(3 * 0x1p-25f) == 0x0002);                 // 1.5 quanta -> 2
    CHECK(to_f16(5 * 0x1p-25f) == 0x0002);                 // 2.5 quanta -> 2
    CHECK(to_f16(0x1p-14f) == 0x0400);                     // smallest normal
    CHECK(to_f16(1023.5f * 0x1p-24f) == 0x0400);           // subnormal rounds up into normals
    CHECK(to_f16(-3 * 0x1p-25f) == 0x8002);
    CHECK(to_f16(1e-40f) == 0x0000);                       // binary32 subnormal
    CHECK(to_f16(-1e-40f) == 0x8000);
    uint16_t n = to_f16(kNaN), nn = to_f16(-kNaN), sn = to_f16(fbits(0x7F800001));
    CHECK((n & 0x7C00) == 0x7C00);
    CHECK((n & 0x03FF) != 0);
    CHECK((nn & 0x8000) != 0);
    CHECK((sn & 0x7C00) == 0x7C00);
    CHECK((sn & 0x03FF) != 0);  // a NaN stays NaN even when its payload lives in the low bits
    CHECK(from_f16(0x0001) == 0x1p-24f);
    CHECK(from_f16(0x7BFF) == 65504.0f);
    CHECK(from_f16(0x3555) == 0x1.554p-2f);
    CHECK(from_f16(0x7C00) == kInf);
    CHECK(std::isnan(from_f16(0x7E00)));
    CHECK(std::signbit(from_f16(0x8000)));
}

TEST_CASE("f16: exhaustive round trip and random brute-force RNE", "[oracle][scalar]") {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;  // NaN
        REQUIRE(to_f16(from_f16(uint16_t(h))) == h);
    }
    std::vector<double> table;  // positive finite f16 values, code order
    for (uint32_t h = 0; h <= 0x7BFF; ++h) table.push_back(from_f16(uint16_t(h)));
    std::mt19937 rng(1234);
    std::uniform_int_distribution<uint32_t> exp(90, 145), mant(0, 0x7FFFFF), sgn(0, 1);
    for (int it = 0; it < 200000; ++it) {
        // Half the draws sit exactly on binary16 ties (low 12 mantissa bits 0x1000).
        uint32_t m = mant(rng);
        if (it & 1) m = (m & ~0x1FFFu) | 0x1000u;
        float x = fbits((sgn(rng) << 31) | (exp(rng) << 23) | m);
        int c = nearest_code(std::fabs(double(x)), table, 65536.0, false);
        uint16_t want = uint16_t((std::signbit(x) ? 0x8000 : 0) | (c < 0 ? 0x7C00 : c));
        REQUIRE(to_f16(x) == want);
#if defined(__FLT16_MAX__)
        _Float16 hw = (_Float16)x;  // independent: the compiler's conversion
        uint16_t hb; std::memcpy(&hb, &hw, 2);
        REQUIRE(to_f16(x) == hb);
#endif
    }
}

// ---- bf16 ---------------------------------------------------------------------------------

TEST_CASE("bf16: RNE, ties, overflow, NaN", "[oracle][scalar]") {
    CHECK(to_bf16(1.0f) == 0x3F80);
    CHECK(to_bf16(1.0f + 0x1p-8f) == 0x3F80);               // tie -> even
    CHECK(to_bf16(1.0f + 3 * 0x1p-8f) == 0x3F82);           // tie -> even (up)
    CHECK(to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3F81);
    CHECK(to_bf16(-0.0f) == 0x8000);
    CHECK(to_bf16(0x1p-149f) == 0x0000);
    CHECK(to_bf16(0x1p-133f) == 0x0001);                    // bf16 subnormals are kept
    CHECK(to_bf16(std::numeric_limits<float>::max()) == 0x7F80);  // rounds to inf
    CHECK(to_bf16(kInf) == 0x7F80);
    CHECK(to_bf16(-kInf) == 0xFF80);
    CHECK(to_bf16(kNaN) == 0x7FC0);
    CHECK(to_bf16(-kNaN) == 0xFFC0);
    CHECK(to_bf16(fbits(0x7F800001)) == 0x7FC0);            // signalling NaN -> quiet, never inf
    CHECK(to_bf16(fbits(0xFFFFFFFF)) == 0xFFC0);
    CHECK(from_bf16(0x3F80) == 1.0f);
    CHECK(from_bf16(0xC040) == -3.0f);
    for (uint32_t h = 0; h < 0x10000; ++h)
        if (!std::isnan(from_bf16(uint16_t(h)))) REQUIRE(to_bf16(from_bf16(uint16_t(h))) == h);
}

// ---- fp8 ----------------------------------------------------------------------------------

TEST_CASE("fp8 e4m3fn: hand-picked values, ties, subnormals, saturation, NaN", "[oracle][scalar]") {
    CHECK(to_e4m3(1.0f) == 0x38);
    CHECK(to_e4m3(-1.0f) == 0xB8);
    CHECK(to_e4m3(448.0f) == 0x7E);
    CHECK(to_e4m3(464.0f) == 0x7E);    // tie between 448 (even) and 480
    CHECK(to_e4m3(470.0f) == 0x7E);    // would round to 480: saturates
    CHECK(to_e4m3(1e6f) == 0x7E);
    CHECK(to_e4m3(-1e6f) == 0xFE);
    CHECK(to_e4m3(kInf) == 0x7E);
    CHECK(to_e4m3(-kInf) == 0xFE);
    CHECK(to_e4m3(kNaN) == 0x7F);
    CHECK(to_e4m3(-kNaN) == 0xFF);
    CHECK(to_e4m3(0x1p-9f) == 0x01);   // smallest subnormal
    CHECK(to_e4m3(0x1p-10f) == 0x00);  // tie with 0 -> even
    CHECK(to_e4m3(3 * 0x1p-10f) == 0x02);
    CHECK(to_e4m3(7 * 0x1p-9f) == 0x07);
    CHECK(to_e4m3(7.5f * 0x1p-9f) == 0x08);  // tie -> smallest normal (even)
    CHECK(to_e4m3(0x1p-6f) == 0x08);
    CHECK(to_e4m3(1.0625f) == 0x38);   // tie 1 / 1.125 -> 1
    CHECK(to_e4m3(1.1875f) == 0x3A);   // tie 1.125 / 1.25 -> 1.25
    CHECK(to_e4m3(-0.0f) == 0x80);
    CHECK(to_e4m3(-0x1p-11f) == 0x80);
    CHECK(to_e4m3(1e-45f) == 0x00);
    CHECK(from_e4m3(0x7E) == 448.0f);
    CHECK(from_e4m3(0xFE) == -448.0f);
    CHECK(from_e4m3(0x01) == 0x1p-9f);
    CHECK(from_e4m3(0x08) == 0x1p-6f);
    CHECK(from_e4m3(0x3A) == 1.25f);
    CHECK(std::isnan(from_e4m3(0x7F)));
    CHECK(std::isnan(from_e4m3(0xFF)));
    CHECK(std::signbit(from_e4m3(0x80)));
}

TEST_CASE("fp8 e5m2: hand-picked values, ties, subnormals, saturation, NaN", "[oracle][scalar]") {
    CHECK(to_e5m2(1.0f) == 0x3C);
    CHECK(to_e5m2(57344.0f) == 0x7B);
    CHECK(to_e5m2(61440.0f) == 0x7B);  // tie -> 65536 (even) -> saturates
    CHECK(to_e5m2(1e9f) == 0x7B);
    CHECK(to_e5m2(kInf) == 0x7B);
    CHECK(to_e5m2(-kInf) == 0xFB);
    CHECK(to_e5m2(kNaN) == 0x7E);
    CHECK(to_e5m2(-kNaN) == 0xFE);
    CHECK(to_e5m2(0x1p-16f) == 0x01);
    CHECK(to_e5m2(0x1p-17f) == 0x00);
    CHECK(to_e5m2(3 * 0x1p-17f) == 0x02);
    CHECK(to_e5m2(0x1p-14f) == 0x04);
    CHECK(to_e5m2(1.125f) == 0x3C);    // tie 1 / 1.25 -> 1
    CHECK(to_e5m2(1.375f) == 0x3E);    // tie 1.25 / 1.5 -> 1.5
    CHECK(to_e5m2(-0.0f) == 0x80);
    CHECK(from_e5m2(0x7B) == 57344.0f);
    CHECK(from_e5m2(0x01) == 0x1p-16f);
    CHECK(from_e5m2(0x7C) == kInf);
    CHECK(from_e5m2(0xFC) == -kInf);
    CHECK(std::isnan(from_e5m2(0x7D)));
    CHECK(std::isnan(from_e5m2(0xFF)));
}

TEST_CASE("fp8: exhaustive round trip and random brute-force RNE with saturation", "[oracle][scalar]") {
    struct F { uint8_t (*to)(float); float (*from)(uint8_t); uint8_t max_code; };
    for (F f : {F{to_e4m3, from_e4m3, 0x7E}, F{to_e5m2, from_e5m2, 0x7B}}) {
        std::vector<double> table;
        for (int c = 0; c <= f.max_code; ++c) table.push_back(f.from(uint8_t(c)));
        for (int c = 0; c < 256; ++c)
            if ((c & 0x7F) <= f.max_code) REQUIRE(f.to(f.from(uint8_t(c))) == c);
        std::mt19937 rng(99);
        std::uniform_int_distribution<uint32_t> exp(100, 150), mant(0, 0x7FFFFF), sgn(0, 1);
        for (int it = 0; it < 200000; ++it) {
            uint32_t m = mant(rng);
            if (it & 1) m &= ~0x7FFFFu;  // few mantissa bits: many exact ties
            float y = fbits((sgn(rng) << 31) | (exp(rng) << 23) | m);
            int c = nearest_code(std::fabs(double(y)), table, 0.0, true);
            REQUIRE(f.to(y) == uint8_t((std::signbit(y) ? 0x80 : 0) | c));
        }
    }
}

TEST_CASE("f16_min_scale: smallest f16 with qmax*s >= amax", "[oracle][scalar]") {
    CHECK(f16_min_scale(0.0f, 127) == 0x0000);
    CHECK(f16_min_scale(1.0f, 127) == 0x2009);    // f16(1/127) = 0x2008 is too small: step up
    CHECK(f16_min_scale(15.875f, 127) == 0x3000);  // 127·0.125 exactly
    CHECK(f16_min_scale(8.0f, 8) == 0x3C00);
    CHECK(f16_min_scale(127.0f * 65504.0f, 127) == 0x7BFF);
    CHECK(f16_min_scale(1e7f, 127) == 0x7BFF);    // beyond the domain
    CHECK(f16_min_scale(1e-30f, 127) == 0x0001);  // below the smallest subnormal
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> e(-20.0f, 20.0f);
    for (int it = 0; it < 100000; ++it) {
        float amax = std::exp2(e(rng));
        for (int q : {127, 8}) {
            if (double(amax) > q * 65504.0) continue;  // outside the domain (checked above)
            uint16_t s = f16_min_scale(amax, q);
            REQUIRE(double(q) * from_f16(s) >= double(amax));
            if (s > 1) REQUIRE(double(q) * from_f16(uint16_t(s - 1)) < double(amax));
        }
    }
}

// ---- geometry -----------------------------------------------------------------------------

TEST_CASE("page bytes, refusals, slot byte ranges partition the page", "[oracle][page]") {
    PageShape big{16, 8, 128};
    // The reference page (B=16, H=8, D=128) counts the K page + the V page: 33,280 B int8 vs 65,536 B f16.
    CHECK(2 * page_bytes(Half::int8, big) == 33280);
    CHECK(page_bytes(Half::int8, big) == 16 * 8 * 128 + 2 * 16 * 8);
    CHECK(2 * page_bytes(Half::f16, big) == 65536);
    CHECK(page_bytes(Half::bf16, big) == 32768);
    CHECK(page_bytes(Half::f32, big) == 65536);
    CHECK(page_bytes(Half::fp8_e4m3, big) == 16384);
    CHECK(page_bytes(Half::q8_0, big) == 16 * 32 * 34);
    CHECK(page_bytes(Half::q4_0, big) == 16 * 32 * 18);
    CHECK(page_bytes(Half::q4_0_rot, big) == 16 * 32 * 18);
    CHECK(bytes_per_cell(Half::q8_0, PageShape{4, 4, 8}) == 8.5);
    CHECK(refusal_reason(Half::q8_0, PageShape{4, 1, 8}) == std::optional<std::string>("row_not_multiple_of_32"));
    CHECK(refusal_reason(Half::q4_0_rot, PageShape{4, 4, 24}) == std::optional<std::string>("head_dim_not_power_of_two"));
    CHECK(!refusal_reason(Half::q4_0, PageShape{4, 4, 24}));
    CHECK(!refusal_reason(Half::int8, PageShape{4, 1, 8}));
    CHECK_THROWS_AS(page_bytes(Half::q4_0, PageShape{4, 1, 8}), std::invalid_argument);
    for (Half h : kAllHalves)
        for (PageShape s : {PageShape{16, 8, 128}, PageShape{3, 4, 8}, PageShape{2, 2, 64}}) {
            if (refusal_reason(h, s)) continue;  // fp8_block128 at rows of 32
            std::vector<int> owner(page_bytes(h, s), -1);
            for (int t = 0; t < s.block_size; ++t)
                for (auto [off, len] : slot_byte_ranges(h, s, t))
                    for (size_t b = off; b < off + len; ++b) {
                        REQUIRE(b < owner.size());
                        REQUIRE(owner[b] == -1);
                        owner[b] = t;
                    }
            REQUIRE(std::count(owner.begin(), owner.end(), -1) == 0);
        }
}

TEST_CASE("names and presets", "[oracle][names]") {
    for (Half h : kAllHalves) CHECK(parse_half(half_name(h)) == h);
    CHECK(parse_half("fp8") == Half::fp8_e4m3);
    CHECK(!parse_half("q5_0"));
    auto k8v4 = parse_preset("k8v4");
    REQUIRE(k8v4);
    CHECK((k8v4->k == Half::int8 && k8v4->v == Half::q4_0_rot));
    CHECK(pair_name(KvPair{Half::fp8_e4m3, Half::fp8_e4m3}) == "fp8");
    CHECK(pair_name(KvPair{Half::int8, Half::q4_0}) == "k=int8,v=q4_0");
}

// ---- int8 / q8_0 / q4_0 by hand --------------------------------------------------------------

TEST_CASE("int8: hand-computed page bytes", "[oracle][int8]") {
    PageShape s{2, 1, 4};
    float x[4] = {1.0f, -1.0f, 0.5f, 0.0f};  // scale 1033·2^-17 = f16 0x2009
    auto page = quantize_page(Half::int8, s, x, 1, 1.0f);
    std::vector<uint8_t> want = {0x7F, 0x81, 0x3F, 0x00, 0, 0, 0, 0, 0x09, 0x20, 0, 0};
    CHECK(page == want);
    CHECK(element_scale(Half::int8, s, page.data(), 0, 0, 2, 1.0f) == 1033 * 0x1p-17f);

    float t[4] = {15.875f, 0.3125f, 0.4375f, -0.3125f};  // s = 0.125; 2.5 -> 2, 3.5 -> 4
    int8_t codes[4]; uint16_t sc;
    quantize_cell_int8(t, 4, codes, &sc);
    CHECK(sc == 0x3000);
    CHECK((codes[0] == 127 && codes[1] == 2 && codes[2] == 4 && codes[3] == -2));

    float z[4] = {0, -0.0f, 0, 0};
    quantize_cell_int8(z, 4, codes, &sc);
    CHECK(sc == 0x0000);
    CHECK((codes[0] == 0 && codes[1] == 0));

    float big[4] = {1e7f, -1e7f, 65504.0f * 127.0f, 1.0f};  // outside the domain: clamp, never -128
    quantize_cell_int8(big, 4, codes, &sc);
    CHECK(sc == 0x7BFF);
    CHECK((codes[0] == 127 && codes[1] == -127 && codes[2] == 127 && codes[3] == 0));
}

TEST_CASE("q8_0: hand-computed block", "[oracle][q8_0]") {
    float x[32];
    for (int i = 0; i < 32; ++i) x[i] = float(i - 16) * 0.125f;  // amax 2 -> d = 1033·2^-16
    uint8_t blk[34];
    quantize_block_q8_0(x, blk);
    CHECK((blk[0] == 0x09 && blk[1] == 0x24));
    CHECK(int8_t(blk[2 + 0]) == -127);   // -126.88
    CHECK(int8_t(blk[2 + 1]) == -119);   // -118.95
    CHECK(int8_t(blk[2 + 16]) == 0);
    CHECK(int8_t(blk[2 + 17]) == 8);     // 7.93
    CHECK(int8_t(blk[2 + 31]) == 119);
    float r[32];
    dequantize_block_q8_0(blk, r);
    CHECK(r[0] == -127.0f * (1033 * 0x1p-16f));
}

TEST_CASE("q4_0: packing, tie on the extreme, clamp population", "[oracle][q4_0]") {
    // x = 8 - c with c = 0..15 (low half) and 15..0 (high half): m = x[0] = 8, d = -1.
    float x[32];
    for (int i = 0; i < 32; ++i) x[i] = 8.0f - float(i < 16 ? i : 31 - i);
    uint8_t blk[18];
    quantize_block_q4_0(x, blk);
    CHECK((blk[0] == 0x00 && blk[1] == 0xBC));  // d = -1
    for (int j = 0; j < 16; ++j) CHECK(blk[2 + j] == uint8_t(j | ((15 - j) << 4)));
    float r[32];
    dequantize_block_q4_0(blk, r);
    for (int i = 0; i < 32; ++i) CHECK(r[i] == x[i]);

    // -2 at index 3 before +2 at index 10: m = -2, d = +0.25; +2 clamps to code 15 (error |d|).
    float y[32] = {};
    y[3] = -2.0f; y[10] = 2.0f; y[5] = 0.125f; y[6] = 0.375f; y[20] = -0.125f;
    quantize_block_q4_0(y, blk);
    CHECK((blk[0] == 0x00 && blk[1] == 0x34));
    auto code = [&](int i) { return i < 16 ? (blk[2 + i] & 0xF) : (blk[2 + i - 16] >> 4); };
    CHECK(code(3) == 0);
    CHECK(code(10) == 15);
    CHECK(code(5) == 8);    // 0.5 -> 0 (even)
    CHECK(code(6) == 10);   // 1.5 -> 2
    CHECK(code(20) == 8);   // -0.5 -> -0
    CHECK(code(0) == 8);
    dequantize_block_q4_0(blk, r);
    CHECK(r[10] == 1.75f);
    CHECK(r[3] == -2.0f);

    y[3] = 2.0f; y[10] = -2.0f;  // mirrored: m = +2, d = -0.25
    quantize_block_q4_0(y, blk);
    CHECK((blk[0] == 0x00 && blk[1] == 0xB4));
    CHECK(code(3) == 0);
    CHECK(code(10) == 15);

    float z[32] = {};
    quantize_block_q4_0(z, blk);
    CHECK((blk[0] == 0 && blk[1] == 0));
    for (int j = 0; j < 16; ++j) CHECK(blk[2 + j] == 0x88);
}

TEST_CASE("tiny heads: 32-blocks span heads (H=8, D=8)", "[oracle][page]") {
    PageShape s{2, 8, 8};
    std::vector<float> x(2 * 64);
    for (size_t i = 0; i < x.size(); ++i) x[i] = (i < 32 ? 1.0f : 100.0f) * float(int(i % 7) - 3);
    auto page = quantize_page(Half::q8_0, s, x.data(), 2, 1.0f);
    // slot 0, heads 0..3 share block 0 (amax 3); heads 4..7 share block 1 (amax 300).
    float d0 = element_scale(Half::q8_0, s, page.data(), 0, 0, 0, 1.0f);
    CHECK(element_scale(Half::q8_0, s, page.data(), 0, 3, 7, 1.0f) == d0);
    CHECK(element_scale(Half::q8_0, s, page.data(), 0, 4, 0, 1.0f) == from_f16(f16_min_scale(300.0f, 127)));
    CHECK(d0 == from_f16(f16_min_scale(3.0f, 127)));
    auto q4 = quantize_page(Half::q4_0, s, x.data(), 2, 1.0f);
    CHECK(element_scale(Half::q4_0, s, q4.data(), 1, 5, 1, 1.0f) < 0);  // signed d
}

// ---- Hadamard -----------------------------------------------------------------------------

TEST_CASE("hadamard: known vectors, f64 matrix reference, involution", "[oracle][hadamard]") {
    float x[4] = {1, 2, 3, 4};
    hadamard(x, 4);
    CHECK((x[0] == 5 && x[1] == -1 && x[2] == -2 && x[3] == 0));
    double xd[4] = {1, 2, 3, 4};
    hadamard_f64(xd, 4);
    CHECK((xd[0] == 5 && xd[1] == -1 && xd[2] == -2 && xd[3] == 0));
    float e[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    hadamard(e, 8);
    for (float v : e) CHECK(v == float(1.0 / std::sqrt(8.0)));
    std::mt19937 rng(5);
    for (int n : {1, 2, 8, 32, 128, 256}) {
        auto v = random_rows(rng, size_t(n), 1.0f);
        std::vector<double> ref(v.begin(), v.end());
        auto w = v;
        hadamard(w.data(), n);
        hadamard_f64(ref.data(), n);
        for (int i = 0; i < n; ++i) REQUIRE(close(w[i], ref[i], 1e-5));
        hadamard(w.data(), n);
        for (int i = 0; i < n; ++i) REQUIRE(close(w[i], v[i], 1e-5));
    }
}

// ---- pages: round trips within the envelopes ----------------------------------------------

TEST_CASE("pages: dequant(quant(x)) within each format's envelope; slots beyond n stay zero",
          "[oracle][page]") {
    std::mt19937 rng(42);
    for (PageShape s : {PageShape{4, 2, 64}, PageShape{3, 8, 8}, PageShape{2, 1, 128}}) {
        const int n_tok = s.block_size - 1, H = s.n_kv_heads, D = s.head_dim;
        auto x = random_rows(rng, size_t(n_tok) * H * D, 3.0f);
        for (Half h : kAllHalves) {
            if (refusal_reason(h, s)) continue;  // fp8_block128 at rows of 64 (its own case below)
            const float ts = (h == Half::fp8_e4m3 || h == Half::fp8_e5m2 || h == Half::nvfp4) ? 0.0625f : 1.0f;
            auto page = quantize_page(h, s, x.data(), n_tok, ts);
            // Bytes of unused slots stay zero.
            for (auto [off, len] : slot_byte_ranges(h, s, s.block_size - 1))
                for (size_t b = off; b < off + len; ++b) REQUIRE(page[b] == 0);
            auto xr = dequantize_page(h, s, page.data(), n_tok, ts);
            REQUIRE(xr.size() == x.size());
            for (int t = 0; t < n_tok; ++t)
                for (int c = 0; c < H; ++c) {
                    double cell_err2 = 0, rot_err2 = 0;
                    std::vector<float> rot(x.begin() + (size_t(t) * H + c) * D, x.begin() + (size_t(t) * H + c + 1) * D);
                    if (h == Half::q4_0_rot) hadamard(rot.data(), D);
                    for (int i = 0; i < D; ++i) {
                        size_t k = (size_t(t) * H + c) * D + i;
                        double err = std::fabs(double(xr[k]) - double(x[k]));
                        double sc = std::fabs(element_scale(h, s, page.data(), t, c, i, ts));
                        const double slack = 1e-6 * (std::fabs(x[k]) + sc);
                        switch (h) {
                            case Half::f32: REQUIRE(xr[k] == x[k]); break;
                            case Half::f16: REQUIRE(xr[k] == from_f16(to_f16(x[k]))); break;
                            case Half::bf16: REQUIRE(xr[k] == from_bf16(to_bf16(x[k]))); break;
                            case Half::int8:
                            case Half::q8_0: REQUIRE(err <= sc / 2 + slack); break;
                            case Half::fp8_e4m3: REQUIRE(err <= std::ldexp(std::fabs(x[k]), -4) + std::ldexp(ts, -10) + slack); break;
                            case Half::fp8_e5m2: REQUIRE(err <= std::ldexp(std::fabs(x[k]), -3) + std::ldexp(ts, -17) + slack); break;
                            case Half::fp8_per_token_head:  // the cell's s = amax/448 (FORMATS.md)
                            case Half::fp8_block128:        // the tile's s = amax/448
                                REQUIRE(err <= std::ldexp(std::fabs(x[k]), -4) + std::ldexp(sc, -10) + slack);
                                break;
                            case Half::int8_per_token_head: REQUIRE(err <= sc / 2 + slack); break;  // RNE: s/2
                            case Half::q4_0:
                                // clamped population (opposite side beyond 7.5|d|) gets |d|
                                REQUIRE(err <= (x[k] / element_scale(h, s, page.data(), t, c, i, ts) > 7.5f ? sc : sc / 2) + slack);
                                break;
                            case Half::mxfp8:  // FORMATS.md envelope; saturated beyond 448 X: < 2^-3 |x|
                                REQUIRE(err <= (std::fabs(x[k]) > 448 * sc ? std::ldexp(std::fabs(x[k]), -3)
                                                                            : std::ldexp(std::fabs(x[k]), -4) + std::ldexp(sc, -10)));
                                break;
                            case Half::mxfp4: REQUIRE(err <= std::ldexp(std::fabs(x[k]) + sc, -2)); break;
                            case Half::nvfp4:  // grid 2^-2(|x| + S), or the excess over 6 S (FORMATS.md)
                                REQUIRE(err <= std::max(std::ldexp(std::fabs(x[k]) + sc, -2), std::fabs(x[k]) - 6 * sc) + slack);
                                break;
                            case Half::q4_0_rot: {
                                float d = element_scale(h, s, page.data(), t, c, i, ts);
                                double e_rot = rot[i] / d > 7.5f ? std::fabs(d) : std::fabs(d) / 2;
                                rot_err2 += e_rot * e_rot;
                                cell_err2 += err * err;
                                break;
                            }
                        }
                    }
                    if (h == Half::q4_0_rot) REQUIRE(std::sqrt(cell_err2) <= std::sqrt(rot_err2) * (1 + 1e-5) + 1e-6);
                }
        }
    }
}

TEST_CASE("e2m1 and ue8m0: every code, ties to even, saturation, NaN", "[oracle][scalar][mx]") {
    const float vals[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (uint8_t c = 0; c < 16; ++c) {
        CHECK(from_e2m1(c) == ((c & 8) ? -vals[c & 7] : vals[c & 7]));
        if ((c & 7) != 0 || c == 0) CHECK(to_e2m1(from_e2m1(c)) == c);
    }
    // Midpoints go to the even code (even mantissa bit).
    const float tie[7][2] = {{0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6}, {5.0f, 6}};
    for (auto& t : tie) {
        CHECK(to_e2m1(t[0]) == uint8_t(t[1]));
        CHECK(to_e2m1(-t[0]) == uint8_t(uint8_t(t[1]) | 8));
    }
    CHECK(to_e2m1(0.2500001f) == 1);
    CHECK(to_e2m1(6.9f) == 7);
    CHECK(to_e2m1(7.0f) == 7);  // tie 6 | 8 -> saturates to 6
    CHECK(to_e2m1(1e30f) == 7);
    CHECK(to_e2m1(-std::numeric_limits<float>::infinity()) == 15);
    CHECK(to_e2m1(-0.0f) == 8);
    CHECK(to_e2m1(std::numeric_limits<float>::quiet_NaN()) == 0);
    CHECK(from_e8m0(127) == 1.0);
    CHECK(from_e8m0(0) == std::ldexp(1.0, -127));
    CHECK(from_e8m0(254) == std::ldexp(1.0, 127));
    CHECK(std::isnan(from_e8m0(0xFF)));
}

TEST_CASE("mx blocks: hand-computed scale exponents, saturation, zero and inf blocks", "[oracle][mx]") {
    float x[32] = {};
    uint8_t c[32];
    // All zero: the smallest scale, code 0; codes zero.
    CHECK(quantize_block_mx(Half::mxfp8, x, c) == 0);
    for (int i = 0; i < 32; ++i) CHECK(c[i] == 0);
    // amax = 1: floor(log2 1) = 0; mxfp8 X = 2^-8 (code 119), mxfp4 X = 2^-2 (code 125).
    x[3] = 1.0f;
    x[5] = -0.3f;
    CHECK(quantize_block_mx(Half::mxfp8, x, c) == 119);
    CHECK(c[3] == to_e4m3(256.0f));
    CHECK(c[5] == to_e4m3(-76.8f));
    CHECK(quantize_block_mx(Half::mxfp4, x, c) == 125);
    CHECK(c[3] == 6);       // 1/2^-2 = 4
    CHECK(c[5] == (8 | 2)); // -0.3/0.25 = -1.2 -> -1
    // amax = 1.9 (significand above 1.75): mxfp8 y = 486.4 saturates to 448 (0x7E), mxfp4 y = 7.6 -> 6.
    x[3] = 1.9f;
    CHECK(quantize_block_mx(Half::mxfp8, x, c) == 119);
    CHECK(c[3] == 0x7E);
    CHECK(quantize_block_mx(Half::mxfp4, x, c) == 125);
    CHECK(c[3] == 7);
    // A tiny block clamps the exponent at -127 (code 0).
    float t[32] = {};
    t[0] = std::ldexp(1.0f, -130);
    CHECK(quantize_block_mx(Half::mxfp8, t, c) == 0);
    CHECK(c[0] == to_e4m3(0.125f));
    // An infinite element: the NaN scale; a NaN element is ignored for the scale.
    t[1] = std::numeric_limits<float>::infinity();
    CHECK(quantize_block_mx(Half::mxfp4, t, c) == 0xFF);
    t[1] = std::numeric_limits<float>::quiet_NaN();
    t[2] = 2.0f;
    CHECK(quantize_block_mx(Half::mxfp8, t, c) == 120);
    CHECK((c[1] & 0x7F) == 0x7F);
    CHECK(quantize_block_mx(Half::mxfp4, t, c) == 126);
    CHECK(c[1] == 0);
    // Page layout: codes run then the scales run; mxfp4 packs element 2j low, 2j+1 high.
    PageShape s{2, 1, 32};
    float row[32] = {};
    row[0] = 1.0f;   // code 6 (4 X)
    row[1] = -0.5f;  // code 8|4 (-2 X)
    auto page = quantize_page(Half::mxfp4, s, row, 1, 1.0f);
    REQUIRE(page.size() == 2 * 16 + 2 * 1);
    CHECK(page[0] == uint8_t(6 | (12 << 4)));
    CHECK(page[32] == 125);
    auto back = dequantize_page(Half::mxfp4, s, page.data(), 1, 1.0f);
    CHECK(back[0] == 1.0f);
    CHECK(back[1] == -0.5f);
}

TEST_CASE("nvfp4 blocks: hand-computed two-level scales, zero and saturated blocks", "[oracle][nvfp4]") {
    float x[16] = {};
    uint8_t c[16];
    CHECK(quantize_block_nvfp4(x, 1.0f, c) == 0);  // amax 0: sb = +0, every code 0
    for (int i = 0; i < 16; ++i) CHECK(c[i] == 0);
    // amax 3, g 0.5: t = (3/6)/0.5 = 1 -> sb = e4m3(1) = 0x38, S = 0.5; x/S on the E2M1 grid and ties.
    x[0] = 3.0f;      // 6 -> 7
    x[1] = -0.125f;   // -0.25: tie 0 | 0.5 -> -0 (8)
    x[2] = 0.625f;    // 1.25: tie 1 | 1.5 -> 1 (2)
    x[3] = 1.25f;     // 2.5: tie 2 | 3 -> 2 (4)
    x[4] = 2.5f;      // 5: tie 4 | 6 -> 4 (6)
    CHECK(quantize_block_nvfp4(x, 0.5f, c) == 0x38);
    CHECK(c[0] == 7);
    CHECK(c[1] == 8);
    CHECK(c[2] == 2);
    CHECK(c[3] == 4);
    CHECK(c[4] == 6);
    // amax 3.3, g 1: t = 0.55 lies in [0.5, 1), E4M3 step 1/16: rounds up to 0.5625.
    x[0] = 3.3f;
    const uint8_t sb = quantize_block_nvfp4(x, 1.0f, c);
    CHECK(from_e4m3(sb) == 0.5625f);
    CHECK(c[0] == 7);  // 3.3 / 0.5625 = 5.87 -> 6
    // A block scale rounded down saturates the extreme: amax 3.1, t = 0.51666 -> 0.5, 3.1/0.5 = 6.2 -> 6.
    x[0] = 3.1f;
    CHECK(from_e4m3(quantize_block_nvfp4(x, 1.0f, c)) == 0.5f);
    CHECK(c[0] == 7);
    // Page layout: codes run [B][H·D/2], then the scales run [B][H·D/16].
    PageShape s{2, 1, 16};
    auto page = quantize_page(Half::nvfp4, s, x, 1, 1.0f);
    REQUIRE(page.size() == 2 * 8 + 2 * 1);
    CHECK(page[16] == to_e4m3(3.1f / 6.0f));
    CHECK(refusal_reason(Half::nvfp4, PageShape{2, 1, 8}) == std::optional<std::string>("row_not_multiple_of_16"));
    CHECK_THROWS(quantize_page(Half::nvfp4, s, x, 1, 0.0f));
}

TEST_CASE("per-token-head cells: hand-computed f32 scales, ties, zero, NaN and inf elements", "[oracle][per_token_head]") {
    uint8_t c[4];
    // fp8: amax 896 -> s = 2 exactly; 17/2 = 8.5 ties 8 | 9 -> 8 (even mantissa), -896 -> -448 (0xFE).
    float x[4] = {896.0f, 17.0f, -896.0f, 0.0f};
    CHECK(quantize_cell_per_token_head(Half::fp8_per_token_head, x, 4, c) == 2.0f);
    CHECK(c[0] == 0x7E);
    CHECK(from_e4m3(c[1]) == 8.0f);
    CHECK(c[2] == 0xFE);
    CHECK(c[3] == 0x00);
    // int8: amax 254 -> s = 2; 5/2 = 2.5 -> 2, 7/2 = 3.5 -> 4 (ties to even), -254 -> -127.
    float y[4] = {254.0f, 5.0f, 7.0f, -254.0f};
    CHECK(quantize_cell_per_token_head(Half::int8_per_token_head, y, 4, c) == 2.0f);
    CHECK(int8_t(c[0]) == 127);
    CHECK(int8_t(c[1]) == 2);
    CHECK(int8_t(c[2]) == 4);
    CHECK(int8_t(c[3]) == -127);
    // A zero cell stores s = 1.0 and zero codes (signed zero kept by e4m3).
    float z[4] = {0.0f, -0.0f, 0.0f, 0.0f};
    CHECK(quantize_cell_per_token_head(Half::fp8_per_token_head, z, 4, c) == 1.0f);
    CHECK(c[1] == 0x80);
    CHECK(quantize_cell_per_token_head(Half::int8_per_token_head, z, 4, c) == 1.0f);
    CHECK(c[0] == 0);
    // NaN and +-inf are left out of amax: s from the finite 127; inf saturates, NaN is fp8 NaN / int8 0.
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    float w[4] = {127.0f, inf, -inf, nan};
    CHECK(quantize_cell_per_token_head(Half::int8_per_token_head, w, 4, c) == 1.0f);
    CHECK(int8_t(c[1]) == 127);
    CHECK(int8_t(c[2]) == -127);
    CHECK(c[3] == 0);
    CHECK(quantize_cell_per_token_head(Half::fp8_per_token_head, w, 4, c) == 127.0f / 448.0f);
    CHECK(c[1] == 0x7E);
    CHECK(c[2] == 0xFE);
    CHECK((c[3] & 0x7F) == 0x7F);
    // Page layout: codes [B][H][D], then the scales run [B][H] binary32 little-endian.
    PageShape s{2, 2, 2};
    float row[4] = {896.0f, 17.0f, 254.0f, 5.0f};
    auto page = quantize_page(Half::int8_per_token_head, s, row, 1, 1.0f);
    REQUIRE(page.size() == 2 * 4 + 2 * 2 * 4);
    const float s0 = 896.0f / 127.0f;
    uint8_t b0[4];
    std::memcpy(b0, &s0, 4);
    CHECK((page[8] == b0[0] && page[9] == b0[1] && page[10] == b0[2] && page[11] == b0[3]));
    CHECK(element_scale(Half::int8_per_token_head, s, page.data(), 0, 1, 0, 1.0f) == 2.0f);
    CHECK(page_bytes(Half::fp8_per_token_head, PageShape{16, 8, 128}) == 16 * 8 * 128 + 4 * 16 * 8);
}

TEST_CASE("fp8_block128 tiles: f32 scale per 128 elements of the row, ties, zero, NaN, inf, layout", "[oracle][fp8_block128]") {
    uint8_t c[128];
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    // amax 896 -> s = 2; 17/2 = 8.5 ties 8 | 9 -> 8; -896 -> -448 (0xFE); a tile spans heads.
    float x[128] = {};
    x[0] = 896.0f, x[1] = 17.0f, x[127] = -896.0f, x[5] = inf, x[6] = nan;
    CHECK(quantize_tile_fp8_block128(x, c) == 2.0f);
    CHECK(c[0] == 0x7E);
    CHECK(from_e4m3(c[1]) == 8.0f);
    CHECK(c[127] == 0xFE);
    CHECK(c[5] == 0x7E);          // +inf left out of amax, saturates
    CHECK((c[6] & 0x7F) == 0x7F);  // NaN -> NaN code
    float z[128] = {};
    z[3] = -0.0f;
    CHECK(quantize_tile_fp8_block128(z, c) == 1.0f);  // all-zero tile: s = 1
    CHECK(c[3] == 0x80);
    // Layout: codes [B][H·D], then scales [B][H·D/128] f32; a tile of 128 covers two heads of 64.
    PageShape s{2, 4, 64};
    std::mt19937 rng(5);
    auto row = random_rows(rng, 2 * 256, 2.0f);
    row[100] = 1000.0f;  // tile 0's amax; tile 1 keeps its own
    auto page = quantize_page(Half::fp8_block128, s, row.data(), 2, 1.0f);
    REQUIRE(page.size() == 2 * 256 + 2 * 2 * 4);
    REQUIRE(page_bytes(Half::fp8_block128, PageShape{16, 1, 512}) == 16 * 512 + 16 * 4 * 4);  // the MLA latent row
    const float s00 = 1000.0f / 448.0f;
    CHECK(element_scale(Half::fp8_block128, s, page.data(), 0, 1, 63, 1.0f) == s00);  // head 1 is in tile 0
    CHECK(element_scale(Half::fp8_block128, s, page.data(), 0, 2, 0, 1.0f) != s00);   // head 2 starts tile 1
    float got;
    std::memcpy(&got, page.data() + 2 * 256, 4);
    CHECK(got == s00);
    CHECK(refusal_reason(Half::fp8_block128, PageShape{2, 1, 64}) == std::optional<std::string>("row_not_multiple_of_128"));
    // Homogeneous under powers of two; the slot writes only its bytes.
    auto row4 = row;
    for (float& v : row4) v *= 4.0f;
    auto a = dequantize_page(Half::fp8_block128, s, page.data(), 2, 1.0f);
    auto b = dequantize_page(Half::fp8_block128, s, quantize_page(Half::fp8_block128, s, row4.data(), 2, 1.0f).data(), 2, 1.0f);
    for (size_t i = 0; i < a.size(); ++i) REQUIRE(b[i] == 4.0f * a[i]);
    auto p2 = page;
    quantize_slot(Half::fp8_block128, s, row4.data(), p2.data(), 1, 1.0f);
    std::vector<bool> in_slot(page.size(), false);
    for (auto [off, len] : slot_byte_ranges(Half::fp8_block128, s, 1))
        for (size_t i = off; i < off + len; ++i) in_slot[i] = true;
    for (size_t i = 0; i < page.size(); ++i)
        if (!in_slot[i]) REQUIRE(page[i] == p2[i]);
}

TEST_CASE("q4_0_rot = per-cell Hadamard then q4_0 over the row", "[oracle][q4_0_rot]") {
    std::mt19937 rng(3);
    PageShape s{2, 4, 16};
    auto x = random_rows(rng, 2 * 64, 1.0f);
    auto rot = x;
    for (int c = 0; c < 8; ++c) hadamard(rot.data() + c * 16, 16);
    CHECK(quantize_page(Half::q4_0_rot, s, x.data(), 2, 1.0f) == quantize_page(Half::q4_0, s, rot.data(), 2, 1.0f));
}

TEST_CASE("quantize_slot writes only the slot's bytes", "[oracle][page]") {
    std::mt19937 rng(11);
    PageShape s{4, 2, 32};
    auto x = random_rows(rng, 4 * 64, 1.0f);
    auto other = random_rows(rng, 64, 2.0f);
    for (Half h : kAllHalves) {
        if (refusal_reason(h, s)) continue;  // fp8_block128: rows of 64 (its own case checks its slot)
        auto page = quantize_page(h, s, x.data(), 4, 0.5f);
        auto p2 = page;
        quantize_slot(h, s, other.data(), p2.data(), 2, 0.5f);
        std::vector<bool> in_slot(page.size(), false);
        for (auto [off, len] : slot_byte_ranges(h, s, 2))
            for (size_t b = off; b < off + len; ++b) in_slot[b] = true;
        for (size_t b = 0; b < page.size(); ++b)
            if (!in_slot[b]) REQUIRE(page[b] == p2[b]);
    }
}

TEST_CASE("dynamic-scale formats are homogeneous under powers of two", "[oracle][page]") {
    std::mt19937 rng(21);
    PageShape s{2, 2, 32};
    auto x = random_rows(rng, 2 * 64, 1.0f);
    auto x4 = x;
    for (float& v : x4) v *= 4.0f;
    for (Half h : {Half::int8, Half::q8_0, Half::q4_0, Half::q4_0_rot, Half::fp8_per_token_head, Half::int8_per_token_head}) {
        auto a = dequantize_page(h, s, quantize_page(h, s, x.data(), 2, 1.0f).data(), 2, 1.0f);
        auto b = dequantize_page(h, s, quantize_page(h, s, x4.data(), 2, 1.0f).data(), 2, 1.0f);
        for (size_t i = 0; i < a.size(); ++i) REQUIRE(b[i] == 4.0f * a[i]);
    }
}

// ---- attention ----------------------------------------------------------------------------

TEST_CASE("sdpa: hand-computed causal GQA case", "[oracle][sdpa]") {
    const float L3 = std::log(3.0f);
    // Keys of kv head 0: k0 = 0, k1 = (ln 3, 0) -> with q = (1, 0): weights 1/4, 3/4.
    // kv head 1: equal keys -> uniform weights.
    // layout k[n_kv=2][n_kv_heads=2][D=2]
    float k[8] = {0, 0, 0, 0, /*t=1*/ L3, 0, 0, 0};
    float v[8] = {4, 0, 2, 2, /*t=1*/ 0, 8, 4, 6};
    float q[16];  // [n_q=2][4 heads][2]
    for (int i = 0; i < 8; ++i) { q[2 * i] = 1; q[2 * i + 1] = 0; }
    AttnShape a{2, 4, 2, 2, 2, 0, 1.0f};
    float out[16];
    double out64[16];
    sdpa_f32(a, q, k, v, out);
    sdpa_f64(a, q, k, v, out64);
    // query 0 sees key 0 only.
    const float want0[8] = {4, 0, 4, 0, 2, 2, 2, 2};
    const float want1[8] = {1, 6, 1, 6, 3, 4, 3, 4};
    for (int i = 0; i < 8; ++i) {
        CHECK(close(out[i], want0[i], 1e-6));
        CHECK(close(out[8 + i], want1[i], 1e-6));
        CHECK(close(out64[i], want0[i], 1e-12));
        CHECK(close(out64[8 + i], want1[i], 1e-6));  // ln 3 was rounded to binary32
    }
    // Query positions beyond the last key see every existing key.
    AttnShape late{1, 4, 2, 2, 2, 5, 1.0f};
    sdpa_f32(late, q, k, v, out);
    for (int i = 0; i < 8; ++i) CHECK(close(out[i], want1[i], 1e-6));
    // Default scale 1/sqrt(D): D = 4, q = (2,0,0,0) gives the same scores as above.
    float k4[8] = {0, 0, 0, 0, L3, 0, 0, 0}, v4[8] = {4, 0, 0, 0, 0, 8, 0, 0}, q4[4] = {2, 0, 0, 0};
    AttnShape d4{1, 1, 2, 1, 4, 1, 0.0f};
    float o4[4];
    sdpa_f32(d4, q4, k4, v4, o4);
    CHECK(close(o4[0], 1, 1e-6));
    CHECK(close(o4[1], 6, 1e-6));
}

TEST_CASE("sdpa: f32 matches f64 on random data", "[oracle][sdpa]") {
    std::mt19937 rng(8);
    AttnShape a{5, 8, 37, 2, 64, 32, 0.0f};
    auto q = random_rows(rng, size_t(a.n_q) * a.n_q_heads * a.head_dim, 1.0f);
    auto k = random_rows(rng, size_t(a.n_kv) * a.n_kv_heads * a.head_dim, 1.0f);
    auto v = random_rows(rng, size_t(a.n_kv) * a.n_kv_heads * a.head_dim, 1.0f);
    std::vector<float> o(q.size());
    std::vector<double> o64(q.size());
    sdpa_f32(a, q.data(), k.data(), v.data(), o.data());
    sdpa_f64(a, q.data(), k.data(), v.data(), o64.data());
    CHECK(count_nonfinite(o) == 0);
    CHECK(nmse(o64, o) < 1e-10);
    CHECK(max_abs_diff(o64, o) < 1e-5);
}

// ---- metrics ------------------------------------------------------------------------------

TEST_CASE("metrics: known values", "[oracle][metrics]") {
    std::vector<float> a{1, 2}, b{1, 2}, z{0, 0};
    std::vector<double> r{1, 0};
    std::vector<float> g{2, 0};
    CHECK(nmse(r, g) == 1.0);
    CHECK(nmse(a, b) == 0.0);
    CHECK(nmse(z, z) == 0.0);
    CHECK(std::isinf(nmse(z, a)));
    CHECK(max_abs_diff(r, g) == 1.0);
    CHECK(std::isnan(max_abs_diff(std::vector<float>{1, 2}, std::vector<float>{1, kNaN})));
    CHECK(cosine(std::vector<float>{1, 0}, std::vector<float>{0, 1}) == 0.0);
    CHECK(close(cosine(std::vector<float>{1, 1}, std::vector<float>{2, 2}), 1.0, 1e-15));
    CHECK(count_nonfinite(std::vector<float>{1, kNaN, kInf, -kInf}) == 3);
    CHECK(count_nonfinite(std::vector<double>{1, 2}) == 0);
    // P uniform over 2, Q = (1/4, 3/4): KL = ½ln 2 + ½ln(2/3) = ½ln(4/3).
    std::vector<float> pl{0, 0}, ql{0, std::log(3.0f)};
    CHECK(close(kl_divergence_from_logits(pl, ql), 0.5 * std::log(4.0 / 3.0), 1e-7));
    CHECK(kl_divergence_from_logits(ql, ql) == 0.0);
    CHECK(kl_divergence_from_logits(std::vector<float>{-1e4f, 0}, std::vector<float>{0, 0}) >= 0.0);
    CHECK(top1_agree(std::vector<float>{1, 3, 2}, std::vector<float>{0, 5, 1}));
    CHECK(!top1_agree(std::vector<float>{1, 3, 2}, std::vector<float>{0, 1, 5}));
    CHECK(argmax(std::vector<float>{2, 2, 1}) == 0);
}

// ---- full-model forward -------------------------------------------------------------------

namespace {

Transformer tiny_model(uint32_t seed, bool shared_cls) {
    ModelConfig c;
    c.dim = 16; c.hidden_dim = 24; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2;
    c.vocab_size = 32; c.seq_len = 64;
    std::mt19937 rng(seed);
    const size_t D = 16, F = 24, KV = 8, V = 32;
    Weights w;
    w.token_embedding = random_rows(rng, V * D, 1.0f);
    for (int l = 0; l < c.n_layers; ++l) {
        LayerWeights L;
        L.rms_att = random_rows(rng, D, 0.2f);
        for (float& g : L.rms_att) g += 1.0f;
        L.wq = random_rows(rng, D * D, 0.5f);
        L.wk = random_rows(rng, KV * D, 0.5f);
        L.wv = random_rows(rng, KV * D, 0.25f);
        L.wo = random_rows(rng, D * D, 0.25f);
        L.rms_ffn = L.rms_att;
        L.w1 = random_rows(rng, F * D, 0.25f);
        L.w2 = random_rows(rng, D * F, 0.2f);
        L.w3 = random_rows(rng, F * D, 0.25f);
        w.layers.push_back(std::move(L));
    }
    w.rms_final = random_rows(rng, D, 0.1f);
    for (float& g : w.rms_final) g += 1.0f;
    if (!shared_cls) w.wcls = random_rows(rng, V * D, 1.0f);
    return make_transformer(c, std::move(w));
}

}  // namespace

TEST_CASE("model: batched Eigen forward == token-at-a-time loops == binary64", "[oracle][model]") {
    const Transformer t = tiny_model(21, false);
    std::vector<int> toks;
    for (int i = 0; i < 40; ++i) toks.push_back((i * 7 + 3) % 32);
    const auto a = forward_all(t, toks), b = forward_all_naive(t, toks);
    const auto r = forward_all_f64(t, toks);
    REQUIRE(a.size() == toks.size() * 32);
    CHECK(count_nonfinite(a) == 0);
    CHECK(nmse(b, a) < 1e-10);
    CHECK(nmse(r, a) < 1e-10);
    CHECK(max_abs_diff(r, b) < 1e-4);
    // Causality: the logits of a prefix do not depend on what follows.
    const auto p = forward_all(t, std::span<const int>(toks).first(10));
    CHECK(max_abs_diff(std::span<const float>(a).first(p.size()), std::span<const float>(p)) < 1e-5);
    // The KV hook sees K/V of every token and perturbing V changes the output.
    int calls = 0;
    const auto h = forward_all(t, toks, [&](int layer, int n, float* k, float* v) {
        ++calls;
        CHECK(n == 40);
        (void)k;
        if (layer == 1) v[10 * 8 + 5] += 1.0f;  // token 10: positions 0..9 unchanged
    });
    CHECK(calls == 2);
    CHECK(max_abs_diff(std::span<const float>(a).first(320), std::span<const float>(h).first(320)) == 0.0);
    CHECK(max_abs_diff(a, h) > 1e-3);
    CHECK_THROWS_AS(forward_all(t, std::vector<int>{32}), std::invalid_argument);
}

TEST_CASE("model: llama2.c legacy reader round-trips a written checkpoint", "[oracle][model]") {
    for (bool shared : {true, false}) {
        const Transformer t = tiny_model(5, shared);
        const std::string path = "oracle_selftest_tiny_" + std::to_string(int(shared)) + ".bin";
        {
            std::ofstream f(path, std::ios::binary);
            const ModelConfig& c = t.config;
            int32_t h[7] = {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                            shared ? c.vocab_size : -c.vocab_size, c.seq_len};
            f.write(reinterpret_cast<const char*>(h), sizeof h);
            auto put = [&](const std::vector<float>& v) { f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4)); };
            put(t.weights.token_embedding);
            for (auto m : {&LayerWeights::rms_att, &LayerWeights::wq, &LayerWeights::wk, &LayerWeights::wv, &LayerWeights::wo,
                           &LayerWeights::rms_ffn, &LayerWeights::w1, &LayerWeights::w2, &LayerWeights::w3})
                for (const auto& L : t.weights.layers) put(L.*m);
            put(t.weights.rms_final);
            put(std::vector<float>(size_t(c.seq_len) * c.head_dim(), 0.0f));  // legacy freq_cis
            if (!shared) put(t.weights.wcls);
        }
        const Transformer u = load_llama2c(path);
        CHECK(u.weights.wcls.empty() == shared);
        std::vector<int> toks{1, 5, 9, 30};
        CHECK(max_abs_diff(forward_all(t, toks), forward_all(u, toks)) == 0.0);
        std::filesystem::resize_file(path, 100);
        CHECK_THROWS_AS(load_llama2c(path), std::runtime_error);
        std::filesystem::remove(path);
    }
}
