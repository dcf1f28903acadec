// Scalar number formats, written from docs/FORMATS.md (Notation; fp8 section).
// Every conversion is pure integer/bit arithmetic or exact binary64, so the result never
// depends on the FPU's rounding mode, FMA contraction or the compiler's _Float16 support.
#pragma once
#include <cstdint>

namespace kvgate_oracle {

// binary16, RNE; overflow -> ±inf; NaN -> quiet NaN, sign and top payload bits kept.
uint16_t to_f16(float x);
float from_f16(uint16_t h);  // exact widening

// bfloat16 = top 16 bits of binary32 after RNE; NaN -> 0x7FC0 | sign.
uint16_t to_bf16(float x);
float from_bf16(uint16_t h);  // exact widening

// fp8 e4m3fn: RNE on the exact binary32 value, saturating at ±448 (±inf too), NaN -> 0x7F|sign.
uint8_t to_e4m3(float y);
float from_e4m3(uint8_t c);  // 0x7F / 0xFF -> NaN
// fp8 e5m2: RNE, saturating at ±57344 (±inf too), NaN -> 0x7E|sign.
uint8_t to_e5m2(float y);
float from_e5m2(uint8_t c);  // exponent 31: ±inf (mantissa 0) or NaN

// fp4 e2m1 (MX element): sign in bit 3, 2 exponent bits (bias 1), 1 mantissa bit; values
// 0, 0.5, 1, 1.5, 2, 3, 4, 6. RNE on the exact binary32 value, saturating at ±6; NaN -> +0.
uint8_t to_e2m1(float y);
float from_e2m1(uint8_t c);  // low 4 bits
// UE8M0 (MX scale): 2^(c - 127); 0xFF -> NaN.
double from_e8m0(uint8_t c);

// The smallest positive finite binary16 s with qmax·s >= amax, compared exactly in binary64
// (FORMATS.md int8 step 3; q8_0 uses qmax = 127, q4_0 uses qmax = 8). Start from
// f16(amax/qmax) (binary32 division) and step up one ulp at a time. amax == 0 -> +0;
// amax > qmax·65504 -> 65504 (0x7BFF). Returns the f16 bits (always non-negative).
uint16_t f16_min_scale(float amax, int qmax);

}  // namespace kvgate_oracle
