#include "kvgate/numeric.hpp"

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // as attention.cpp: clang builds (the fuzzers) take the portable code
#include <immintrin.h>
#endif

#include "cpu_avx2.hpp"
#include "kvgate/parallel.hpp"

namespace kvgate {

std::uint16_t f32_to_f16_rne(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t exp = (u >> 23) & 0xFFu;
  std::uint32_t mant = u & 0x7FFFFFu;
  if (exp == 0xFF) {  // inf / NaN
    return static_cast<std::uint16_t>(sign | 0x7C00u | (mant ? (0x200u | (mant >> 13)) : 0u));
  }
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1F) return static_cast<std::uint16_t>(sign | 0x7C00u);  // overflow -> inf
  if (e <= 0) {
    // Subnormal or zero in binary16: value = mant_with_hidden * 2^(e-1-10-13) ...
    if (e < -10) return static_cast<std::uint16_t>(sign);  // rounds to zero (below half the min subnormal)
    mant |= 0x800000u;
    const int shift = 14 - e;  // 13 + (1 - e)
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into exponent / to inf: correct
  return static_cast<std::uint16_t>(sign | h);
}

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    // subnormal: mant * 2^-24
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

std::uint16_t f32_to_bf16_rne(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | 0x7FC0u);
  const std::uint32_t lsb = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7FFFu + lsb) >> 16);
}

float bf16_to_f32(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

void half_to_f32_bulk(const void* src, bool bf16, float* dst, std::size_t n, int threads) {
  const auto* p = static_cast<const unsigned char*>(src);
  parallel_ranges(n, std::size_t{1} << 20, threads, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      std::uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      dst[i] = bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  });
}

namespace {

// Generic RNE encoder for small floats with E exponent bits, M mantissa bits and the given bias,
// saturating to max_code (the largest finite magnitude code). Zero keeps its sign.
template <int E, int M, int Bias>
std::uint8_t encode_small_float(float y, std::uint8_t max_code, std::uint8_t nan_code) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(y);
  const std::uint8_t sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  if (std::isnan(y)) return static_cast<std::uint8_t>(sign | nan_code);
  const float a = std::fabs(y);
  if (std::isinf(a)) return static_cast<std::uint8_t>(sign | max_code);
  // Exact decomposition: a = m * 2^k with the target grid spacing for a's binade.
  constexpr int min_exp = 1 - Bias;  // exponent of the smallest normal
  int ex = 0;
  (void)std::frexp(a, &ex);          // a = f * 2^ex, f in [0.5, 1)
  int unbiased = ex - 1;             // a in [2^unbiased, 2^(unbiased+1))
  if (a == 0.0f) return sign;
  if (unbiased < min_exp) unbiased = min_exp;  // subnormal grid
  const int quantum_exp = unbiased - M;         // grid spacing 2^quantum_exp
  // q = a / 2^quantum_exp, exact in binary64 (a has 24 bits, shift keeps it exact)
  const double q = std::ldexp(static_cast<double>(a), -quantum_exp);
  double r = std::nearbyint(q);  // default rounding mode: ties to even
  // r is an integer in [0, 2^(M+1)]; encode (may carry into the next binade)
  long ri = static_cast<long>(r);
  int e_field;
  long m_field;
  if (unbiased == min_exp && ri < (1L << M)) {
    e_field = 0;
    m_field = ri;
  } else {
    int ub = unbiased;
    if (ri >= (2L << M)) {  // carry
      ri >>= 1;
      ++ub;
    }
    e_field = ub + Bias;
    m_field = ri - (1L << M);
  }
  const long code = (static_cast<long>(e_field) << M) | m_field;
  if (e_field >= (1 << E) || code > max_code) return static_cast<std::uint8_t>(sign | max_code);
  return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(code));
}

template <int M, int Bias>
float decode_small_float(std::uint8_t c, int exp_bits) {
  const bool neg = (c & 0x80u) != 0;
  const int e = (c >> M) & ((1 << exp_bits) - 1);
  const int m = c & ((1 << M) - 1);
  float v;
  if (e == 0) {
    v = std::ldexp(static_cast<float>(m), 1 - Bias - M);
  } else {
    v = std::ldexp(static_cast<float>((1 << M) | m), e - Bias - M);
  }
  return neg ? -v : v;
}

}  // namespace

std::uint8_t f32_to_fp8_e4m3(float y) { return encode_small_float<4, 3, 7>(y, 0x7E, 0x7F); }

float fp8_e4m3_to_f32(std::uint8_t c) {
  if ((c & 0x7Fu) == 0x7Fu) return std::numeric_limits<float>::quiet_NaN();
  return decode_small_float<3, 7>(c, 4);
}

std::uint8_t f32_to_fp8_e5m2(float y) { return encode_small_float<5, 2, 15>(y, 0x7B, 0x7E); }

float fp8_e5m2_to_f32(std::uint8_t c) {
  const int e = (c >> 2) & 0x1F;
  if (e == 0x1F) {
    if ((c & 3u) == 0) return (c & 0x80u) ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
    return std::numeric_limits<float>::quiet_NaN();
  }
  return decode_small_float<2, 15>(c, 5);
}

namespace {

// f16_scale_round_up's search, over a pair of binary16 conversions (ToHalf: RNE with overflow to
// inf, ToFloat: exact).
template <std::uint16_t (*ToHalf)(float), float (*ToFloat)(std::uint16_t)>
std::uint16_t scale_round_up(float amax, int levels) {
  const double target = static_cast<double>(amax);
  std::uint16_t s = ToHalf(amax / static_cast<float>(levels));
  if ((s & 0x7FFFu) >= 0x7C00u) return 0x7BFFu;  // overflowed to inf: out of domain, saturate
  if (s == 0) s = 1;                              // smallest subnormal
  // f16(amax/levels) can land one ulp either side of the answer: walk down, then up.
  while (s > 1 && static_cast<double>(levels) * static_cast<double>(ToFloat(static_cast<std::uint16_t>(s - 1))) >= target) --s;
  while (static_cast<double>(levels) * static_cast<double>(ToFloat(s)) < target) {
    if (s >= 0x7BFFu) return 0x7BFFu;
    ++s;  // positive binary16 values are ordered like their bit patterns
  }
  return s;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// The hardware's binary16 conversions (F16C), the same results as f32_to_f16_rne and f16_to_f32
// wherever the search calls them: RNE with overflow to inf, and an exact widening of a non-NaN
// code (the search widens codes 0 .. 0x7BFF only, and any NaN quotient takes the saturation
// branch on its exponent bits either way). About 2 instructions where the portable ones take
// 20-40; the int8 store calls the search once per cell and token.
__attribute__((target("f16c"))) std::uint16_t f32_to_f16_f16c(float x) {
  return static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("f16c"))) float f16_to_f32_f16c(std::uint16_t h) { return _cvtsh_ss(h); }
const bool kHaveF16c = kHaveAvx2 && __builtin_cpu_supports("f16c");  // KVGATE_NO_AVX2 turns it off too
#endif

}  // namespace

std::uint16_t f16_scale_round_up(float amax, int levels) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (kHaveF16c) return scale_round_up<f32_to_f16_f16c, f16_to_f32_f16c>(amax, levels);
#endif
  return scale_round_up<f32_to_f16_rne, f16_to_f32>(amax, levels);
}

// Saturates before the cast: a float-to-int conversion of a value out of int's range (±inf from
// an infinite element over a finite scale, or a huge quotient) is undefined behaviour, and on x86 it
// gives INT_MIN whatever the sign (+inf would become code -127). ±2^30 keeps headroom for the
// callers' "+ 8" before they clamp to the code range. NaN maps to 0 (callers give NaN elements
// their zero code before this is reached).
int round_half_even(float x) {
  const float r = std::nearbyint(x);  // default rounding mode: ties to even
  if (std::isnan(r)) return 0;
  if (r >= 0x1p30f) return 1 << 30;
  if (r <= -0x1p30f) return -(1 << 30);
  return static_cast<int>(r);
}

}  // namespace kvgate
