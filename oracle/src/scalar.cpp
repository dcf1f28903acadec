#include "kvgate_oracle/scalar.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace kvgate_oracle {

static uint32_t bits_of(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
static float float_of(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }

// Round the non-negative integer m / 2^s to nearest, ties to even (s may exceed 31).
static uint64_t shift_rne(uint64_t m, int s) {
    if (s <= 0) return m << (-s);
    if (s >= 64) return 0;
    uint64_t q = m >> s, rem = m & ((uint64_t(1) << s) - 1), half = uint64_t(1) << (s - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    return q;
}

uint16_t to_f16(float x) {
    uint32_t u = bits_of(x);
    uint16_t sign = uint16_t((u >> 16) & 0x8000);
    int exp = int((u >> 23) & 0xFF);
    uint32_t mant = u & 0x7FFFFF;
    if (exp == 0xFF) return mant ? uint16_t(sign | 0x7E00 | (mant >> 13)) : uint16_t(sign | 0x7C00);
    if (exp == 0) return sign;  // binary32 subnormals are < 2^-126, far below half of 2^-24
    // |x| = m · 2^(e-23) with m the 24-bit significand. In units of the f16 quantum of its
    // binade (2^(e-10) for normals, 2^-24 for subnormals) RNE is one integer shift; a carry out
    // of the mantissa bumps the exponent field naturally, up to 0x7C00 = inf.
    uint64_t m = mant | 0x800000u;
    int e = exp - 127;
    if (e > 15) return uint16_t(sign | 0x7C00);
    if (e >= -14) {
        uint64_t q = shift_rne(m, 13);  // 11-bit significand, maybe 2^11 after carry
        uint32_t h = (uint32_t(e + 15) << 10) + uint32_t(q - 0x400);
        return uint16_t(sign | (h >= 0x7C00 ? 0x7C00 : h));
    }
    uint64_t q = shift_rne(m, -(e + 1));  // |x| / 2^-24 = m · 2^(e+1); may reach 0x400 (min normal)
    return uint16_t(sign | q);
}

float from_f16(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    if (exp == 0x1F) return float_of(sign | 0x7F800000u | (mant << 13));
    if (exp == 0) {
        float v = std::ldexp(float(mant), -24);  // exact
        return sign ? -v : v;
    }
    return float_of(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t to_bf16(float x) {
    uint32_t u = bits_of(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t(((u >> 16) & 0x8000) | 0x7FC0);
    u += 0x7FFFu + ((u >> 16) & 1);  // RNE on the low 16 bits; carries into exponent (-> inf)
    return uint16_t(u >> 16);
}

float from_bf16(uint16_t h) { return float_of(uint32_t(h) << 16); }

// Generic small float: 1 sign, E exponent bits (bias), M mantissa bits; max_code = largest
// finite magnitude code. Value RNE on the exact binary32 |y|, then saturation.
static uint8_t to_fp8(float y, int M, int bias, uint8_t max_code, uint8_t nan_code) {
    uint32_t u = bits_of(y);
    uint8_t sign = uint8_t((u >> 24) & 0x80);
    if (std::isnan(y)) return uint8_t(nan_code | sign);
    if (std::isinf(y)) return uint8_t(max_code | sign);
    int exp = int((u >> 23) & 0xFF);
    uint32_t mant = u & 0x7FFFFF;
    if (exp == 0 && mant == 0) return sign;
    // |y| = m · 2^(e-23) exactly (binary32 subnormals: e = -126 without the hidden bit).
    uint64_t m = exp ? (mant | 0x800000u) : mant;
    int e = exp ? exp - 127 : -126;
    int emin = 1 - bias;
    // Quantum of the target binade: 2^(max(e, emin) - M). Count quanta, RNE.
    int qexp = (e < emin ? emin : e) - M;
    int shift = qexp - (e - 23);  // |y| / 2^qexp = m / 2^shift
    uint64_t q = shift_rne(m, shift);
    // Encode magnitude q · 2^qexp (q < 2^(M+1), or exactly 2^(M+1) after a carry).
    uint32_t code;
    if (e < emin) {
        code = uint32_t(q);  // subnormal (q == 2^M is the smallest normal, encoded the same way)
    } else {
        int be = e + bias;
        if (q >> (M + 1)) { q >>= 1; ++be; }
        code = (uint32_t(be) << M) | uint32_t(q & ((1u << M) - 1));
    }
    if (code > max_code) code = max_code;  // saturation (incl. what would be NaN/inf codes)
    return uint8_t(sign | code);
}

static float from_fp8(uint8_t c, int M, int bias) {
    int exp = (c & 0x7F) >> M, mant = c & ((1 << M) - 1);
    double v = exp ? std::ldexp(double((1 << M) | mant), exp - bias - M)
                   : std::ldexp(double(mant), 1 - bias - M);
    return float((c & 0x80) ? -v : v);  // exact
}

uint8_t to_e4m3(float y) { return to_fp8(y, 3, 7, 0x7E, 0x7F); }
float from_e4m3(uint8_t c) {
    if ((c & 0x7F) == 0x7F) return (c & 0x80) ? -std::numeric_limits<float>::quiet_NaN()
                                              : std::numeric_limits<float>::quiet_NaN();
    return from_fp8(c, 3, 7);
}

uint8_t to_e5m2(float y) { return to_fp8(y, 2, 15, 0x7B, 0x7E); }
float from_e5m2(uint8_t c) {
    if ((c & 0x7C) == 0x7C) {
        float v = (c & 0x03) ? std::numeric_limits<float>::quiet_NaN()
                             : std::numeric_limits<float>::infinity();
        return (c & 0x80) ? -v : v;
    }
    return from_fp8(c, 2, 15);
}

uint8_t to_e2m1(float y) {
    if (std::isnan(y)) return 0x0;                       // no NaN code: the zero code
    const uint8_t c = to_fp8(y, 1, 1, 0x07, 0x00);       // magnitude in bits 0..2, sign in bit 7
    return uint8_t(((c & 0x80) ? 0x8 : 0x0) | (c & 0x07));
}
float from_e2m1(uint8_t c) {
    const uint8_t m = uint8_t(c & 0x7);
    const double v = (m >> 1) ? std::ldexp(double(2 | (m & 1)), (m >> 1) - 2) : 0.5 * double(m & 1);
    return float((c & 0x8) ? -v : v);
}
double from_e8m0(uint8_t c) {
    return c == 0xFF ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, int(c) - 127);
}

uint16_t f16_min_scale(float amax, int qmax) {
    if (amax == 0.0f) return 0x0000;
    if (double(amax) > double(qmax) * 65504.0) return 0x7BFF;  // outside the domain: codes clamp
    uint16_t s = to_f16(amax / float(qmax));                   // binary32 division, then f16 RNE
    while (double(qmax) * double(from_f16(s)) < double(amax)) ++s;  // +1 on bits = one ulp up
    return s;
}

}  // namespace kvgate_oracle
