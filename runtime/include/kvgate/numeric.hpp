// Scalar float conversions used by the KV formats (docs/FORMATS.md). Each is the *_ref the fast
// paths are checked against; they are exact bit-level definitions, not approximations.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvgate {

std::uint16_t f32_to_f16_rne(float x);      // IEEE binary16, RNE, overflow -> inf, NaN kept
float f16_to_f32(std::uint16_t h);
std::uint16_t f32_to_bf16_rne(float x);     // top 16 bits after RNE; NaN -> quiet NaN
float bf16_to_f32(std::uint16_t h);

// n stored binary16 (bf16 = false) or bfloat16 (bf16 = true) values, little-endian and of any
// alignment, to f32: element for element f16_to_f32 / bf16_to_f32, split over `threads` threads
// (0: all cores) in pieces of 2^20 elements (the loaders' weight conversion).
void half_to_f32_bulk(const void* src, bool bf16, float* dst, std::size_t n, int threads = 0);

std::uint8_t f32_to_fp8_e4m3(float y);      // e4m3fn, RNE, saturating at +-448, NaN -> 0x7F|sign
float fp8_e4m3_to_f32(std::uint8_t c);
std::uint8_t f32_to_fp8_e5m2(float y);      // e5m2, RNE, saturating at +-57344, NaN -> 0x7E|sign
float fp8_e5m2_to_f32(std::uint8_t c);

// Smallest positive finite binary16 s with levels*s >= amax (exact comparison); 65504 if none.
// amax must be > 0. This is the "scale rounded upward" rule of int8 / q8_0 / q4_0.
std::uint16_t f16_scale_round_up(float amax, int levels);

// Round to nearest integer, ties to even (the rint() of docs/FORMATS.md), saturating at ±2^30
// (so ±inf and huge quotients give a defined result that the callers clamp to their code range).
int round_half_even(float x);

}  // namespace kvgate
