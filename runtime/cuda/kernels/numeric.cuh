// Device-side scalar conversions of docs/FORMATS.md, written to give the SAME BITS as the CPU
// reference (runtime/src/numeric.cpp) for every input, NaN and out-of-domain values included.
// Every rounding is explicit (__fdiv_rn, __fadd_rn, ...): the store kernels' bytes must not depend
// on -fmad or fast-math settings.
#pragma once
#include <cstdint>

namespace kvgate::cuda::dev {

__device__ __forceinline__ std::uint16_t f32_to_f16_rne(float x) {
  const std::uint32_t u = __float_as_uint(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t exp = (u >> 23) & 0xFFu;
  std::uint32_t mant = u & 0x7FFFFFu;
  if (exp == 0xFF) return static_cast<std::uint16_t>(sign | 0x7C00u | (mant ? (0x200u | (mant >> 13)) : 0u));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1F) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

// Exact widening (subnormals kept; the scales compared below are finite).
__device__ __forceinline__ float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    if (mant == 0) return __uint_as_float(sign);
    const float v = __fmul_rn(static_cast<float>(mant), 0x1p-24f);
    return sign ? -v : v;
  }
  if (exp == 0x1F) return __uint_as_float(sign | 0x7F800000u | (mant << 13));
  return __uint_as_float(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

__device__ __forceinline__ std::uint16_t f32_to_bf16_rne(float x) {
  const std::uint32_t u = __float_as_uint(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>(((u >> 16) & 0x8000u) | 0x7FC0u);
  const std::uint32_t lsb = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7FFFu + lsb) >> 16);
}

// Generic small-float RNE encoder (E exponent bits, M mantissa bits), saturating, sign of zero kept.
// Same decomposition as the CPU reference: q = a / 2^quantum in binary64 (exact), rint ties-to-even.
template <int E, int M, int Bias>
__device__ __forceinline__ std::uint8_t encode_small_float(float y, std::uint8_t max_code, std::uint8_t nan_code) {
  const std::uint32_t u = __float_as_uint(y);
  const std::uint8_t sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  if (isnan(y)) return static_cast<std::uint8_t>(sign | nan_code);
  const float a = fabsf(y);
  if (isinf(a)) return static_cast<std::uint8_t>(sign | max_code);
  if (a == 0.0f) return sign;
  constexpr int min_exp = 1 - Bias;
  int ex = 0;
  (void)frexpf(a, &ex);
  int unbiased = ex - 1;
  if (unbiased < min_exp) unbiased = min_exp;
  const int quantum_exp = unbiased - M;
  const double q = ldexp(static_cast<double>(a), -quantum_exp);
  const double r = rint(q);  // binary64 round-to-nearest-even
  long long ri = static_cast<long long>(r);
  int e_field;
  long long m_field;
  if (unbiased == min_exp && ri < (1LL << M)) {
    e_field = 0;
    m_field = ri;
  } else {
    int ub = unbiased;
    if (ri >= (2LL << M)) {
      ri >>= 1;
      ++ub;
    }
    e_field = ub + Bias;
    m_field = ri - (1LL << M);
  }
  const long long code = (static_cast<long long>(e_field) << M) | m_field;
  if (e_field >= (1 << E) || code > max_code) return static_cast<std::uint8_t>(sign | max_code);
  return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(code));
}

__device__ __forceinline__ std::uint8_t f32_to_fp8_e4m3(float y) { return encode_small_float<4, 3, 7>(y, 0x7E, 0x7F); }
__device__ __forceinline__ std::uint8_t f32_to_fp8_e5m2(float y) { return encode_small_float<5, 2, 15>(y, 0x7B, 0x7E); }

// Smallest positive finite binary16 s with levels*s >= amax, compared exactly in binary64.
__device__ __forceinline__ std::uint16_t f16_scale_round_up(float amax, int levels) {
  const double target = static_cast<double>(amax);
  std::uint16_t s = f32_to_f16_rne(__fdiv_rn(amax, static_cast<float>(levels)));
  if ((s & 0x7FFFu) >= 0x7C00u) return 0x7BFFu;
  if (s == 0) s = 1;
  while (s > 1 && static_cast<double>(levels) * static_cast<double>(f16_to_f32(static_cast<std::uint16_t>(s - 1))) >= target)
    --s;
  while (static_cast<double>(levels) * static_cast<double>(f16_to_f32(s)) < target) {
    if (s >= 0x7BFFu) return 0x7BFFu;
    ++s;
  }
  return s;
}

// clamp(rint(q), lo, hi) for a non-NaN binary32 q, ties to even, +-inf and huge values clamp
// (docs/FORMATS.md). The caller maps NaN inputs to the format's zero code first.
__device__ __forceinline__ int rint_clamp(float q, int lo, int hi) {
  const float r = rintf(q);
  if (r <= static_cast<float>(lo)) return lo;
  if (r >= static_cast<float>(hi)) return hi;
  return static_cast<int>(r);
}

// E4M3 (fn) code -> its exact binary32 value; 0x7F / 0xFF are NaN.
__device__ __forceinline__ float fp8_e4m3_to_f32(std::uint8_t c) {
  const std::uint32_t sign = static_cast<std::uint32_t>(c & 0x80u) << 24;
  const std::uint32_t e = (c >> 3) & 0xFu, m = c & 7u;
  if (e == 0xFu && m == 7u) return __uint_as_float(sign | 0x7FC00000u);
  if (e == 0u) return __uint_as_float(sign | __float_as_uint(__fmul_rn(static_cast<float>(m), 0x1p-9f)));
  return __uint_as_float(sign | ((e - 7u + 127u) << 23) | (m << 20));
}

// E2M1 code of y (sign in bit 3, kept for zero; NaN -> +0, E2M1 has no NaN): round to nearest, ties
// to the even code, saturated to 6. The CPU reference's comparisons, in its order (format.cpp).
__device__ __forceinline__ std::uint8_t f32_to_e2m1(float y) {
  if (isnan(y)) return 0;
  const float a = fabsf(y);
  int mag;
  if (a <= 0.25f) mag = 0;
  else if (a < 0.75f) mag = 1;
  else if (a <= 1.25f) mag = 2;
  else if (a < 1.75f) mag = 3;
  else if (a <= 2.5f) mag = 4;
  else if (a < 3.5f) mag = 5;
  else if (a <= 5.0f) mag = 6;
  else mag = 7;  // 7 and beyond (and +inf) saturate to 6
  return static_cast<std::uint8_t>((signbit(y) ? 0x8 : 0x0) | mag);
}

// The UE8M0 scale code of one MX block whose amax (NaN elements ignored) is given: floor(log2 amax)
// - emax of the element format, clamped below at -127 (an all-zero block stores code 0); +inf amax
// gives the NaN code 0xFF. ilogbf is exact for subnormals too.
template <int kEmax>
__device__ __forceinline__ std::uint8_t mx_scale_code(float amax) {
  if (isinf(amax)) return 0xFF;
  if (amax == 0.0f) return 0;
  const int e = max(ilogbf(amax) - kEmax, -127);
  return static_cast<std::uint8_t>(e + 127);
}
// 2^(code - 127) exactly (code 0: the subnormal 2^-127); the NaN code is not passed here.
__device__ __forceinline__ float e8m0_to_f32(std::uint8_t c) {
  return c == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(static_cast<std::uint32_t>(c) << 23);
}

}  // namespace kvgate::cuda::dev
