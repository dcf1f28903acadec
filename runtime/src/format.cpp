#include "kvgate/format.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "kvgate/blocks.hpp"
#include "kvgate/limits.hpp"
#include "kvgate/numeric.hpp"
#include "cpu_avx2.hpp"

namespace kvgate {

namespace {

#if defined(__x86_64__) && defined(__GNUC__)
// The codes of quantize_absmax127's loop, 8 elements at a time: clamp(round_half_even(x / s),
// -127, 127), and 0 for a NaN element (the new row of an int8 cache is quantized once per token,
// layer and half, and the loop's out-of-line round_half_even per element was most of that). The
// same binary32 division; the quotient is clamped before it is rounded, which gives the same code
// (rounding is monotonic and -127, 127 are integers; +-inf clamps too; a NaN quotient becomes 127
// in min_ps, but its lane is zeroed by the ordered-compare mask); on |q| <= 127 adding then
// subtracting 1.5 * 2^23 rounds q to an integer in the default rounding mode, ties to even, as
// std::nearbyint in round_half_even; the conversions are exact (integers in [-127, 127], so the
// saturating packs never saturate).
__attribute__((target("avx2"))) void absmax127_codes_avx2(const float* x, float s, std::int8_t* codes, int n8) {
  const __m256 sv = _mm256_set1_ps(s), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
  const __m256 magic = _mm256_set1_ps(0x1.8p23f);
  for (int i = 0; i < n8; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 q = _mm256_max_ps(_mm256_min_ps(_mm256_div_ps(v, sv), hi), lo);
    const __m256 r = _mm256_sub_ps(_mm256_add_ps(q, magic), magic);  // round to nearest, ties to even
    const __m256i c = _mm256_cvttps_epi32(_mm256_and_ps(r, _mm256_cmp_ps(v, v, _CMP_ORD_Q)));  // NaN: 0
    const __m128i c16 = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm_packs_epi16(c16, c16));
  }
}
#endif

// Per-cell int8 quantization (and the q8_0 block body): docs/FORMATS.md "int8".
void quantize_absmax127(const float* x, int n, std::int8_t* codes, std::uint16_t* scale_out) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0.0f) {
    *scale_out = 0;
    std::memset(codes, 0, static_cast<std::size_t>(n));
    return;
  }
  const std::uint16_t s16 = f16_scale_round_up(amax, 127);
  const float s = f16_to_f32(s16);
  int i0 = 0;  // elements [0, i0) coded by the AVX2 kernel (the same codes), the rest below
#if defined(__x86_64__) && defined(__GNUC__)
  if (kHaveAvx2) {
    i0 = n / 8 * 8;
    absmax127_codes_avx2(x, s, codes, i0);
  }
#endif
  for (int i = i0; i < n; ++i) {
    // NaN elements take code 0 (docs/FORMATS.md); they were already ignored by amax.
    codes[i] = std::isnan(x[i]) ? std::int8_t{0}
                                : static_cast<std::int8_t>(std::clamp(round_half_even(x[i] / s), -127, 127));
  }
  *scale_out = s16;
}

void quantize_q4_0_block(const float* x, block_q4_0* b) {
  float m = 0.0f;
  float amax = 0.0f;
  for (int i = 0; i < kQBlock; ++i) {
    if (std::fabs(x[i]) > amax) {  // strict: the lowest index wins a tie
      amax = std::fabs(x[i]);
      m = x[i];
    }
  }
  std::uint8_t codes[kQBlock];
  if (amax == 0.0f) {
    b->d = 0;
    std::fill(codes, codes + kQBlock, std::uint8_t{8});
  } else {
    const std::uint16_t mag = f16_scale_round_up(amax, 8);
    const std::uint16_t d16 = m > 0.0f ? static_cast<std::uint16_t>(mag | 0x8000u) : mag;  // d = -sign(m)|d|
    const float d = f16_to_f32(d16);
    for (int i = 0; i < kQBlock; ++i) {
      codes[i] = std::isnan(x[i]) ? std::uint8_t{8}
                                  : static_cast<std::uint8_t>(std::clamp(round_half_even(x[i] / d) + 8, 0, 15));
    }
    b->d = d16;
  }
  for (int j = 0; j < kQBlock / 2; ++j) b->qs[j] = static_cast<std::uint8_t>(codes[j] | (codes[j + 16] << 4));
}

void dequantize_q4_0_block(const block_q4_0* b, float* y) {
  const float d = f16_to_f32(b->d);
  for (int j = 0; j < kQBlock / 2; ++j) {
    y[j] = static_cast<float>((b->qs[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((b->qs[j] >> 4) - 8) * d;
  }
}


// ---- The page writer and reader of each half format (one token row, docs/FORMATS.md) ---------

void store_f32(const PageGeometry& g, int slot, const float* row, const float*, std::uint8_t* page) {
  const int HD = g.row_elems();
  const std::size_t t = static_cast<std::size_t>(slot);
  std::memcpy(page + t * HD * 4, row, static_cast<std::size_t>(HD) * 4);
}
void load_f32(const PageGeometry& g, int slot, const std::uint8_t* page, const float*, float* row) {
  const int HD = g.row_elems();
  const std::size_t t = static_cast<std::size_t>(slot);
  std::memcpy(row, page + t * HD * 4, static_cast<std::size_t>(HD) * 4);
}

void store_f16(const PageGeometry& g, int slot, const float* row, const float*, std::uint8_t* page) {
  const int HD = g.row_elems();
  auto* out = reinterpret_cast<std::uint16_t*>(page) + static_cast<std::size_t>(slot) * HD;
  for (int i = 0; i < HD; ++i) out[i] = f32_to_f16_rne(row[i]);
}
void load_f16(const PageGeometry& g, int slot, const std::uint8_t* page, const float*, float* row) {
  const int HD = g.row_elems();
  const auto* in = reinterpret_cast<const std::uint16_t*>(page) + static_cast<std::size_t>(slot) * HD;
  for (int i = 0; i < HD; ++i) row[i] = f16_to_f32(in[i]);
}

void store_bf16(const PageGeometry& g, int slot, const float* row, const float*, std::uint8_t* page) {
  const int HD = g.row_elems();
  auto* out = reinterpret_cast<std::uint16_t*>(page) + static_cast<std::size_t>(slot) * HD;
  for (int i = 0; i < HD; ++i) out[i] = f32_to_bf16_rne(row[i]);
}
void load_bf16(const PageGeometry& g, int slot, const std::uint8_t* page, const float*, float* row) {
  const int HD = g.row_elems();
  const auto* in = reinterpret_cast<const std::uint16_t*>(page) + static_cast<std::size_t>(slot) * HD;
  for (int i = 0; i < HD; ++i) row[i] = bf16_to_f32(in[i]);
}

// int8: the codes run (B x H x D) then the scales run (B x H binary16), docs/FORMATS.md "int8".
void store_int8(const PageGeometry& g, int slot, const float* row, const float*, std::uint8_t* page) {
  const int HD = g.row_elems();
  const std::size_t t = static_cast<std::size_t>(slot);
  auto* codes = reinterpret_cast<std::int8_t*>(page) + t * HD;
  auto* scales = reinterpret_cast<std::uint16_t*>(page + static_cast<std::size_t>(g.block_size) * HD) +
                 t * g.n_kv_heads;
  for (int h = 0; h < g.n_kv_heads; ++h)
    quantize_absmax127(row + h * g.head_dim, g.head_dim, codes + h * g.head_dim, scales + h);
}
void load_int8(const PageGeometry& g, int slot, const std::uint8_t* page, const float*, float* row) {
  const int HD = g.row_elems();
  const std::size_t t = static_cast<std::size_t>(slot);
  const auto* codes = reinterpret_cast<const std::int8_t*>(page) + t * HD;
  const auto* scales = reinterpret_cast<const std::uint16_t*>(page + static_cast<std::size_t>(g.block_size) * HD) +
                       t * g.n_kv_heads;
  for (int h = 0; h < g.n_kv_heads; ++h) {
    const float s = f16_to_f32(scales[h]);
    for (int i = 0; i < g.head_dim; ++i)
      row[h * g.head_dim + i] = static_cast<float>(codes[h * g.head_dim + i]) * s;
  }
}

// fp8: one code per element of x / s, s the element's KV head's scale (per tensor: every head holds
// the layer's one scale), saturating; docs/FORMATS.md "fp8".
template <bool E4>
void store_fp8(const PageGeometry& g, int slot, const float* row, const float* head_scale, std::uint8_t* page) {
  const int HD = g.row_elems(), D = g.head_dim;
  auto* out = page + static_cast<std::size_t>(slot) * HD;
  for (int h = 0; h < g.n_kv_heads; ++h) {
    const float s = head_scale[h];
    for (int i = h * D; i < (h + 1) * D; ++i) {
      const float y = row[i] / s;
      out[i] = E4 ? f32_to_fp8_e4m3(y) : f32_to_fp8_e5m2(y);
    }
  }
}
template <bool E4>
void load_fp8(const PageGeometry& g, int slot, const std::uint8_t* page, const float* head_scale, float* row) {
  const int HD = g.row_elems(), D = g.head_dim;
  const auto* in = page + static_cast<std::size_t>(slot) * HD;
  for (int h = 0; h < g.n_kv_heads; ++h) {
    const float s = head_scale[h];
    for (int i = h * D; i < (h + 1) * D; ++i) row[i] = (E4 ? fp8_e4m3_to_f32(in[i]) : fp8_e5m2_to_f32(in[i])) * s;
  }
}

// q8_0: the token row in 32-element blocks (llama.cpp layout), docs/FORMATS.md "q8_0".
void store_q8_0(const PageGeometry& g, int slot, const float* row, const float*, std::uint8_t* page) {
  const int HD = g.row_elems();
  auto* blocks = reinterpret_cast<block_q8_0*>(page) + static_cast<std::size_t>(slot) * (HD / kQBlock);
  for (int b = 0; b < HD / kQBlock; ++b) quantize_absmax127(row + b * kQBlock, kQBlock, blocks[b].qs, &blocks[b].d);
}
void load_q8_0(const PageGeometry& g, int slot, const std::uint8_t* page, const float*, float* row) {
  const int HD = g.row_elems();
  const auto* blocks = reinterpret_cast<const block_q8_0*>(page) + static_cast<std::size_t>(slot) * (HD / kQBlock);
  for (int b = 0; b < HD / kQBlock; ++b) {
    const float d = f16_to_f32(blocks[b].d);
    for (int i = 0; i < kQBlock; ++i) row[b * kQBlock + i] = static_cast<float>(blocks[b].qs[i]) * d;
  }
}

// q4_0 and q4_0_rot (q4_0 of the per-head Walsh-Hadamard rotated row), docs/FORMATS.md.
template <bool Rot>
void store_q4_0(const PageGeometry& g, int slot, const float* row, const float*, std::uint8_t* page) {
  const int HD = g.row_elems();
  auto* blocks = reinterpret_cast<block_q4_0*>(page) + static_cast<std::size_t>(slot) * (HD / kQBlock);
  const float* src = row;
  std::vector<float> rotated;
  if (Rot) {
    rotated.assign(row, row + HD);
    for (int h = 0; h < g.n_kv_heads; ++h) hadamard_normalized(rotated.data() + h * g.head_dim, g.head_dim);
    src = rotated.data();
  }
  for (int b = 0; b < HD / kQBlock; ++b) quantize_q4_0_block(src + b * kQBlock, &blocks[b]);
}
template <bool Rot>
void load_q4_0(const PageGeometry& g, int slot, const std::uint8_t* page, const float*, float* row) {
  const int HD = g.row_elems();
  const auto* blocks = reinterpret_cast<const block_q4_0*>(page) + static_cast<std::size_t>(slot) * (HD / kQBlock);
  for (int b = 0; b < HD / kQBlock; ++b) dequantize_q4_0_block(&blocks[b], row + b * kQBlock);
  if (Rot)
    for (int h = 0; h < g.n_kv_heads; ++h) hadamard_normalized(row + h * g.head_dim, g.head_dim);
}


// ---- MX (OCP Microscaling v1.0): a UE8M0 power-of-two scale per 32-block, docs/FORMATS.md "mxfp8, mxfp4"

// E2M1 magnitude code (0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6) of a >= 0, RNE: a midpoint goes to the code
// with the even mantissa bit (the even code). Beyond 6 the next binade (8) is saturated to 6.
std::uint8_t e2m1_magnitude(float a) {
  int mag;
  if (a <= 0.25f) mag = 0;        // 0.25: tie 0 | 0.5  -> 0
  else if (a < 0.75f) mag = 1;    // 0.75: tie 0.5 | 1  -> 1
  else if (a <= 1.25f) mag = 2;   // 1.25: tie 1 | 1.5  -> 1
  else if (a < 1.75f) mag = 3;    // 1.75: tie 1.5 | 2  -> 2
  else if (a <= 2.5f) mag = 4;    // 2.5:  tie 2 | 3    -> 2
  else if (a < 3.5f) mag = 5;     // 3.5:  tie 3 | 4    -> 4
  else if (a <= 5.0f) mag = 6;    // 5:    tie 4 | 6    -> 4
  else if (a < 7.0f) mag = 7;     // 7:    tie 6 | 8    -> 8
  else mag = 8;                   // 8 and beyond (and +inf)
  mag = std::min(mag, 7);  // saturation: the element format's max normal, 6
  return static_cast<std::uint8_t>(mag);
}
// E2M1 code of y: sign in bit 3 (kept for zero); NaN -> +0 (E2M1 has no NaN).
std::uint8_t f32_to_e2m1(float y) {
  if (std::isnan(y)) return 0;
  return static_cast<std::uint8_t>((std::signbit(y) ? 0x8 : 0x0) | e2m1_magnitude(std::fabs(y)));
}
constexpr float kE2m1Value[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
float e2m1_to_f32(std::uint8_t c) { return (c & 0x8) ? -kE2m1Value[c & 0x7] : kE2m1Value[c & 0x7]; }

constexpr int kE8m0Bias = 127;
constexpr std::uint8_t kE8m0Nan = 0xFF;
// The UE8M0 scale X = 2^(code - 127); code 0xFF is NaN.
float e8m0_to_f32(std::uint8_t c) {
  return c == kE8m0Nan ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, int(c) - kE8m0Bias);
}

// The shared exponent of one block: floor(log2 amax) - emax_elem, clamped below at -127 (an all-zero
// or tiny block stores code 0); +inf amax gives the NaN scale. NaN elements are ignored.
template <int kEmax>
std::uint8_t mx_scale_code(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]);
  if (std::isinf(amax)) return kE8m0Nan;
  if (amax == 0.0f) return 0;
  const int e = std::max(std::ilogb(amax) - kEmax, -kE8m0Bias);
  return static_cast<std::uint8_t>(e + kE8m0Bias);
}

// mxfp8 (E4M3 elements, emax 8) and mxfp4 (E2M1 elements, emax 2). Page: the codes run [B][H*D]
// (mxfp8) or [B][H*D/2] (mxfp4: element 2j in the low nibble, 2j+1 in the high one), then the scales
// run [B][H*D/32] of UE8M0 codes. Element = RNE(x / X), saturated to the element format's max.
template <bool E4>
void store_mx(const PageGeometry& g, int slot, const float* row, const float*, std::uint8_t* page) {
  const HalfFormatInfo& fi = info(E4 ? HalfFormat::mxfp8 : HalfFormat::mxfp4);
  const int HD = g.row_elems(), blk = fi.block_elems, nb = HD / blk;
  const std::size_t t = static_cast<std::size_t>(slot);
  std::uint8_t* codes = page + t * nb * fi.block_bytes;
  std::uint8_t* scales = page + static_cast<std::size_t>(g.block_size) * nb * fi.block_bytes + t * nb;
  if (!E4) std::memset(codes, 0, static_cast<std::size_t>(nb) * fi.block_bytes);
  for (int b = 0; b < nb; ++b) {
    const float* x = row + b * blk;
    const std::uint8_t sc = mx_scale_code<E4 ? 8 : 2>(x, blk);
    scales[b] = sc;
    const float X = e8m0_to_f32(sc);
    for (int i = 0; i < blk; ++i) {
      const int e = b * blk + i;
      if (E4) {
        const float y = x[i] / X;
        codes[e] = sc == kE8m0Nan ? std::uint8_t{0} : f32_to_fp8_e4m3(y);
      } else {
        const std::uint8_t c = sc == kE8m0Nan ? std::uint8_t{0} : f32_to_e2m1(x[i] / X);
        codes[e / 2] = static_cast<std::uint8_t>(codes[e / 2] | (e % 2 ? c << 4 : c));
      }
    }
  }
}
template <bool E4>
void load_mx(const PageGeometry& g, int slot, const std::uint8_t* page, const float*, float* row) {
  const HalfFormatInfo& fi = info(E4 ? HalfFormat::mxfp8 : HalfFormat::mxfp4);
  const int HD = g.row_elems(), blk = fi.block_elems, nb = HD / blk;
  const std::size_t t = static_cast<std::size_t>(slot);
  const std::uint8_t* codes = page + t * nb * fi.block_bytes;
  const std::uint8_t* scales = page + static_cast<std::size_t>(g.block_size) * nb * fi.block_bytes + t * nb;
  for (int e = 0; e < HD; ++e) {
    const float X = e8m0_to_f32(scales[e / blk]);
    const float v = E4 ? fp8_e4m3_to_f32(codes[e]) : e2m1_to_f32(static_cast<std::uint8_t>((codes[e / 2] >> (4 * (e % 2))) & 0xF));
    row[e] = v * X;
  }
}


// ---- nvfp4: E2M1 codes, an E4M3 scale per 16-block, the FP32 global scale per (layer, K|V) ------
// docs/FORMATS.md "nvfp4". Page: the codes run [B][H*D/2] (element 2j low nibble, 2j+1 high), then
// the scales run [B][H*D/16] of E4M3 block-scale codes. Block scale sb = e4m3((amax / 6) / global),
// effective scale S = e4m3(sb) * global (binary32), element = e2m1(x / S); S == 0: every code 0.
// The global scale is one per (layer, K|V): the store refuses per-head scales for an nvfp4 half, so
// every head holds the same value and head 0's is read.
void store_nvfp4(const PageGeometry& g, int slot, const float* row, const float* head_scale, std::uint8_t* page) {
  const float global = head_scale[0];
  const HalfFormatInfo& fi = info(HalfFormat::nvfp4);
  const int HD = g.row_elems(), blk = fi.block_elems, nb = HD / blk;
  const std::size_t t = static_cast<std::size_t>(slot);
  std::uint8_t* codes = page + t * nb * fi.block_bytes;
  std::uint8_t* scales = page + static_cast<std::size_t>(g.block_size) * nb * fi.block_bytes + t * nb;
  std::memset(codes, 0, static_cast<std::size_t>(nb) * fi.block_bytes);
  for (int b = 0; b < nb; ++b) {
    const float* x = row + b * blk;
    float amax = 0.0f;
    for (int i = 0; i < blk; ++i)
      if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]);  // NaN elements are ignored
    const std::uint8_t sb = f32_to_fp8_e4m3(amax / 6.0f / global);
    scales[b] = sb;
    const float S = fp8_e4m3_to_f32(sb) * global;
    for (int i = 0; i < blk; ++i) {
      const int e = b * blk + i;
      const std::uint8_t c = S == 0.0f ? std::uint8_t{0} : f32_to_e2m1(x[i] / S);
      codes[e / 2] = static_cast<std::uint8_t>(codes[e / 2] | (e % 2 ? c << 4 : c));
    }
  }
}
void load_nvfp4(const PageGeometry& g, int slot, const std::uint8_t* page, const float* head_scale, float* row) {
  const float global = head_scale[0];
  const HalfFormatInfo& fi = info(HalfFormat::nvfp4);
  const int HD = g.row_elems(), blk = fi.block_elems, nb = HD / blk;
  const std::size_t t = static_cast<std::size_t>(slot);
  const std::uint8_t* codes = page + t * nb * fi.block_bytes;
  const std::uint8_t* scales = page + static_cast<std::size_t>(g.block_size) * nb * fi.block_bytes + t * nb;
  for (int e = 0; e < HD; ++e) {
    const float S = fp8_e4m3_to_f32(scales[e / blk]) * global;
    row[e] = e2m1_to_f32(static_cast<std::uint8_t>((codes[e / 2] >> (4 * (e % 2))) & 0xF)) * S;
  }
}

// ---- Dynamic per-(token, KV head) FP32 scales: fp8_per_token_head, int8_per_token_head ----------
// docs/FORMATS.md "fp8_per_token_head and int8_per_token_head". Page: the codes run [B][H][D] (one
// byte per element), then the scales run [B][H] of binary32 scales. Per cell: amax over the finite
// elements (NaN and +-inf ignored), s = amax / qmax in binary32 (qmax 448 or 127); a quotient that is
// zero (all-zero cell, or amax so small that amax/qmax underflows) stores s = 1.0.
template <bool Fp8>
float per_token_head_scale(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i)
    if (std::isfinite(x[i]) && std::fabs(x[i]) > amax) amax = std::fabs(x[i]);
  const float s = amax / (Fp8 ? 448.0f : 127.0f);
  return s == 0.0f ? 1.0f : s;
}
// int8 code of y = x / s: round to nearest, ties to even, clamped to [-127, 127] (+-inf clamp too);
// NaN -> 0.
std::int8_t int8_pth_code(float y) {
  if (std::isnan(y)) return 0;
  const float c = std::clamp(y, -127.0f, 127.0f);
  return static_cast<std::int8_t>(round_half_even(c));
}
template <bool Fp8>
void store_per_token_head(const PageGeometry& g, int slot, const float* row, const float*, std::uint8_t* page) {
  const int HD = g.row_elems(), D = g.head_dim;
  const std::size_t t = static_cast<std::size_t>(slot);
  std::uint8_t* codes = page + t * HD;
  std::uint8_t* scales = page + static_cast<std::size_t>(g.block_size) * HD + t * g.n_kv_heads * sizeof(float);
  for (int h = 0; h < g.n_kv_heads; ++h) {
    const float* x = row + h * D;
    const float s = per_token_head_scale<Fp8>(x, D);
    std::memcpy(scales + h * sizeof(float), &s, sizeof(float));
    for (int i = 0; i < D; ++i) {
      const float y = x[i] / s;
      codes[h * D + i] = Fp8 ? f32_to_fp8_e4m3(y) : static_cast<std::uint8_t>(int8_pth_code(y));
    }
  }
}
template <bool Fp8>
void load_per_token_head(const PageGeometry& g, int slot, const std::uint8_t* page, const float*, float* row) {
  const int HD = g.row_elems(), D = g.head_dim;
  const std::size_t t = static_cast<std::size_t>(slot);
  const std::uint8_t* codes = page + t * HD;
  const std::uint8_t* scales = page + static_cast<std::size_t>(g.block_size) * HD + t * g.n_kv_heads * sizeof(float);
  for (int h = 0; h < g.n_kv_heads; ++h) {
    float s;
    std::memcpy(&s, scales + h * sizeof(float), sizeof(float));
    for (int i = 0; i < D; ++i) {
      const std::uint8_t c = codes[h * D + i];
      const float code_value = Fp8 ? fp8_e4m3_to_f32(c) : static_cast<float>(static_cast<std::int8_t>(c));
      row[h * D + i] = code_value * s;
    }
  }
}

// ---- fp8_block128: E4M3 codes, a dynamic binary32 scale per 128-element tile of the token row ----
// docs/FORMATS.md "fp8_block128". Page: the codes run [B][H*D] (one e4m3fn byte per element), then
// the scales run [B][H*D/128] of binary32 scales. Per tile: the fp8_per_token_head rule over the
// tile's 128 elements instead of a cell (amax over the finite elements, s = amax / 448, s == 0 -> 1).
void store_fp8_block128(const PageGeometry& g, int slot, const float* row, const float*, std::uint8_t* page) {
  const int HD = g.row_elems(), nb = HD / kTileBlock;
  const std::size_t t = static_cast<std::size_t>(slot);
  std::uint8_t* codes = page + t * HD;
  std::uint8_t* scales = page + static_cast<std::size_t>(g.block_size) * HD + t * nb * sizeof(float);
  for (int b = 0; b < nb; ++b) {
    const float* x = row + b * kTileBlock;
    const float s = per_token_head_scale<true>(x, kTileBlock);
    std::memcpy(scales + b * sizeof(float), &s, sizeof(float));
    for (int i = 0; i < kTileBlock; ++i) codes[b * kTileBlock + i] = f32_to_fp8_e4m3(x[i] / s);
  }
}
void load_fp8_block128(const PageGeometry& g, int slot, const std::uint8_t* page, const float*, float* row) {
  const int HD = g.row_elems(), nb = HD / kTileBlock;
  const std::size_t t = static_cast<std::size_t>(slot);
  const std::uint8_t* codes = page + t * HD;
  const std::uint8_t* scales = page + static_cast<std::size_t>(g.block_size) * HD + t * nb * sizeof(float);
  for (int b = 0; b < nb; ++b) {
    float s;
    std::memcpy(&s, scales + b * sizeof(float), sizeof(float));
    for (int i = 0; i < kTileBlock; ++i) row[b * kTileBlock + i] = fp8_e4m3_to_f32(codes[b * kTileBlock + i]) * s;
  }
}

// ---- The traits table: one row per half format, in enum order (kvgate/format_list.hpp) ----------
// Envelope constants: docs/FORMATS.md per format; FP slack as in envelope_bound below. The
// absmax/127 formats (int8 per cell, q8_0 per block) share one envelope, as do q4_0 and q4_0_rot
// (the latter in the rotated domain).
constexpr EnvelopeConstants kEnvAbsmax127{.scale = 0.5, .scale_clamped = 0.5, .fp_slack = true};  // |x^-x| <= s/2
constexpr EnvelopeConstants kEnvQ4{.scale = 0.5, .scale_clamped = 1.0, .fp_slack = true};  // s/2; clamped: s
// MX: X is a power of two, so x/X and code*X are exact (no FP slack). mxfp8: half an E4M3 ulp
// (2^-4|x|, subnormals 2^-10 X); saturated elements (448X < |x| < 512X) err by |x| - 448X < 2^-4|x| + 32X.
// mxfp4: half an E2M1 ulp (2^-2|x|, subnormal 2^-2 X), and |x| - 6X <= 2^-2|x| for |x| < 8X.
constexpr EnvelopeConstants kEnvMxfp8{.rel = 0x1p-4, .scale = 0x1p-10, .scale_clamped = 32.0};
constexpr EnvelopeConstants kEnvMxfp4{.rel = 0x1p-2, .scale = 0x1p-2, .scale_clamped = 0x1p-2};
// nvfp4 with S the stored effective scale: half an E2M1 ulp, 2^-2|x| + 2^-2 S, + FP slack (x/S and
// code*S are rounded in binary32). The elements a rounded-down block scale saturates err by up to
// 2^-4 amax + 6*2^-10 g, a term of the block's amax the constants cannot carry (gates/common/bounds.hpp).
constexpr EnvelopeConstants kEnvNvfp4{.rel = 0x1p-2, .scale = 0x1p-2, .scale_clamped = 0x1p-2, .fp_slack = true};

// fp8_per_token_head: the fp8_e4m3 envelope with the cell's s = amax/448 (half an E4M3 ulp, 2^-4|x|,
// subnormal codes 2^-10 s) + FP slack; a normal s keeps |x/s| < 449, so nothing saturates (a binary32
// subnormal s adds at most 448*2^-150 absolute, gates/common/bounds.hpp). int8_per_token_head: round
// to nearest even, |x^-x| <= s/2 (truncation would make it s) + FP slack, as int8.
constexpr EnvelopeConstants kEnvFp8Pth{.rel = 0x1p-4, .scale = 0x1p-10, .scale_clamped = 0x1p-10, .fp_slack = true};
constexpr EnvelopeConstants kEnvInt8Pth{.scale = 0.5, .scale_clamped = 0.5, .fp_slack = true};

constexpr std::array<HalfFormatInfo, kHalfFormatCount> kInfo{{
    {.id = HalfFormat::f32, .block_elems = 1, .block_bytes = 4, .cell_scale_bytes = 0, .rotated = false,
     .name = "f32", .code_type = "f32", .scale_granularity = "none", .scale_dtype = "-", .rotation = "none",
     .storage_precision = "f32", .transfer_precision = "f32", .execution_precision = "f32", .envelope = "exact",
     .per_token_scales = false, .per_tensor_scale = false, .env = {},
     .quantize_token = store_f32, .dequantize_token = load_f32},
    {.id = HalfFormat::f16, .block_elems = 1, .block_bytes = 2, .cell_scale_bytes = 0, .rotated = false,
     .name = "f16", .code_type = "f16", .scale_granularity = "none", .scale_dtype = "-", .rotation = "none",
     .storage_precision = "f16", .transfer_precision = "f16", .execution_precision = "f32",
     .envelope = "|x^-x| <= 2^-11|x| (normal range), RNE", .per_token_scales = false, .per_tensor_scale = false,
     .env = {.rel = 0x1p-11, .floor = 0x1p-25},  // half ulp; subnormal spacing 2^-24
     .quantize_token = store_f16, .dequantize_token = load_f16},
    {.id = HalfFormat::bf16, .block_elems = 1, .block_bytes = 2, .cell_scale_bytes = 0, .rotated = false,
     .name = "bf16", .code_type = "bf16", .scale_granularity = "none", .scale_dtype = "-", .rotation = "none",
     .storage_precision = "bf16", .transfer_precision = "bf16", .execution_precision = "f32",
     .envelope = "|x^-x| <= 2^-8|x|, RNE", .per_token_scales = false, .per_tensor_scale = false,
     .env = {.rel = 0x1p-8},
     .quantize_token = store_bf16, .dequantize_token = load_bf16},
    {.id = HalfFormat::int8, .block_elems = 1, .block_bytes = 1, .cell_scale_bytes = sizeof(std::uint16_t), .rotated = false,
     .name = "int8", .code_type = "int8 [-127,127]", .scale_granularity = "per cell (token x kv head)",
     .scale_dtype = "f16", .rotation = "none", .storage_precision = "int8 + f16 scale",
     .transfer_precision = "int8 + f16 scale", .execution_precision = "f32",
     .envelope = "|x^-x| <= s/2, s = absmax/127 rounded up to f16", .per_token_scales = true,
     .per_tensor_scale = false, .env = kEnvAbsmax127,
     .quantize_token = store_int8, .dequantize_token = load_int8},
    {.id = HalfFormat::fp8_e4m3, .block_elems = 1, .block_bytes = 1, .cell_scale_bytes = 0, .rotated = false,
     .name = "fp8_e4m3", .code_type = "e4m3fn (sat. +-448)", .scale_granularity = "per tensor (layer, K|V)",
     .scale_dtype = "f32", .rotation = "none", .storage_precision = "e4m3fn", .transfer_precision = "e4m3fn",
     .execution_precision = "f32", .envelope = "|x^-x| <= 2^-4|x| + 2^-10 s", .per_token_scales = false,
     .per_tensor_scale = true, .env = {.rel = 0x1p-4, .scale = 0x1p-10, .scale_clamped = 0x1p-10, .fp_slack = true},
     .quantize_token = store_fp8<true>, .dequantize_token = load_fp8<true>},
    {.id = HalfFormat::fp8_e5m2, .block_elems = 1, .block_bytes = 1, .cell_scale_bytes = 0, .rotated = false,
     .name = "fp8_e5m2", .code_type = "e5m2 (sat. +-57344)", .scale_granularity = "per tensor (layer, K|V)",
     .scale_dtype = "f32", .rotation = "none", .storage_precision = "e5m2", .transfer_precision = "e5m2",
     .execution_precision = "f32", .envelope = "|x^-x| <= 2^-3|x| + 2^-17 s", .per_token_scales = false,
     .per_tensor_scale = true, .env = {.rel = 0x1p-3, .scale = 0x1p-17, .scale_clamped = 0x1p-17, .fp_slack = true},
     .quantize_token = store_fp8<false>, .dequantize_token = load_fp8<false>},
    {.id = HalfFormat::q8_0, .block_elems = kQBlock, .block_bytes = sizeof(block_q8_0), .cell_scale_bytes = 0, .rotated = false,
     .name = "q8_0", .code_type = "int8 [-127,127]", .scale_granularity = "per 32-block of the token row",
     .scale_dtype = "f16", .rotation = "none", .storage_precision = "q8_0 blocks", .transfer_precision = "q8_0 blocks",
     .execution_precision = "f32", .envelope = "|x^-x| <= |d|/2, d = absmax/127 rounded up to f16",
     .per_token_scales = true, .per_tensor_scale = false, .env = kEnvAbsmax127,
     .quantize_token = store_q8_0, .dequantize_token = load_q8_0},
    {.id = HalfFormat::q4_0, .block_elems = kQBlock, .block_bytes = sizeof(block_q4_0), .cell_scale_bytes = 0, .rotated = false,
     .name = "q4_0", .code_type = "uint4 (code-8)", .scale_granularity = "per 32-block of the token row",
     .scale_dtype = "f16", .rotation = "none", .storage_precision = "q4_0 blocks", .transfer_precision = "q4_0 blocks",
     .execution_precision = "f32",
     .envelope = "|x^-x| <= |d|/2; opposite-side elements beyond 7.5|d| clamp: <= |d|", .per_token_scales = true,
     .per_tensor_scale = false, .env = kEnvQ4,
     .quantize_token = store_q4_0<false>, .dequantize_token = load_q4_0<false>},
    {.id = HalfFormat::q4_0_rot, .block_elems = kQBlock, .block_bytes = sizeof(block_q4_0), .cell_scale_bytes = 0, .rotated = true,
     .name = "q4_0_rot", .code_type = "uint4 (code-8)", .scale_granularity = "per 32-block of the rotated token row",
     .scale_dtype = "f16", .rotation = "walsh-hadamard per head", .storage_precision = "q4_0 blocks (rotated)",
     .transfer_precision = "q4_0 blocks (rotated)", .execution_precision = "f32",
     .envelope = "q4_0 envelope in the rotated domain; L2 per head in the original domain", .per_token_scales = true,
     .per_tensor_scale = false, .env = kEnvQ4,
     .quantize_token = store_q4_0<true>, .dequantize_token = load_q4_0<true>},
    {.id = HalfFormat::mxfp8, .block_elems = kQBlock, .block_bytes = kQBlock, .cell_scale_bytes = 0, .block_scale_bytes = 1,
     .rotated = false, .name = "mxfp8", .code_type = "e4m3fn (sat. +-448)", .scale_granularity = "per 32-block of the token row",
     .scale_dtype = "ue8m0", .rotation = "none", .storage_precision = "mxfp8 (e4m3 + ue8m0 per 32)",
     .transfer_precision = "mxfp8 (e4m3 + ue8m0 per 32)", .execution_precision = "f32",
     .envelope = "|x^-x| <= 2^-4|x| + 2^-10 X, X = 2^(floor(log2 amax)-8); saturated (|x| > 448X): < 2^-3|x|",
     .per_token_scales = true, .per_tensor_scale = false, .env = kEnvMxfp8,
     .quantize_token = store_mx<true>, .dequantize_token = load_mx<true>},
    {.id = HalfFormat::mxfp4, .block_elems = kQBlock, .block_bytes = kQBlock / 2, .cell_scale_bytes = 0, .block_scale_bytes = 1,
     .rotated = false, .name = "mxfp4", .code_type = "e2m1 (sat. +-6)", .scale_granularity = "per 32-block of the token row",
     .scale_dtype = "ue8m0", .rotation = "none", .storage_precision = "mxfp4 (e2m1 + ue8m0 per 32)",
     .transfer_precision = "mxfp4 (e2m1 + ue8m0 per 32)", .execution_precision = "f32",
     .envelope = "|x^-x| <= 2^-2|x| + 2^-2 X, X = 2^(floor(log2 amax)-2) (saturation included)",
     .per_token_scales = true, .per_tensor_scale = false, .env = kEnvMxfp4,
     .quantize_token = store_mx<false>, .dequantize_token = load_mx<false>},
    {.id = HalfFormat::nvfp4, .block_elems = kQBlock / 2, .block_bytes = kQBlock / 4, .cell_scale_bytes = 0, .block_scale_bytes = 1,
     .rotated = false, .name = "nvfp4", .code_type = "e2m1 (sat. +-6)",
     .scale_granularity = "per 16-block of the token row (e4m3) x per tensor (layer, K|V; f32 global)",
     .scale_dtype = "e4m3 x f32", .rotation = "none", .storage_precision = "nvfp4 (e2m1 + e4m3 per 16, f32 global)",
     .transfer_precision = "nvfp4 (e2m1 + e4m3 per 16, f32 global)", .execution_precision = "f32",
     .envelope = "|x^-x| <= max(2^-2|x| + 2^-2 S, 2^-4 amax + 6*2^-10 g), S = e4m3(amax/6/g)*g",
     .per_token_scales = true, .per_tensor_scale = true, .env = kEnvNvfp4,
     .quantize_token = store_nvfp4, .dequantize_token = load_nvfp4},
    {.id = HalfFormat::fp8_per_token_head, .block_elems = 1, .block_bytes = 1, .cell_scale_bytes = sizeof(float), .block_scale_bytes = 0,
     .rotated = false, .name = "fp8_per_token_head", .code_type = "e4m3fn (sat. +-448)",
     .scale_granularity = "per cell (token x kv head)", .scale_dtype = "f32", .rotation = "none",
     .storage_precision = "e4m3fn + f32 scale", .transfer_precision = "e4m3fn + f32 scale", .execution_precision = "f32",
     .envelope = "|x^-x| <= 2^-4|x| + 2^-10 s, s = absmax/448 (f32)", .per_token_scales = true,
     .per_tensor_scale = false, .env = kEnvFp8Pth,
     .quantize_token = store_per_token_head<true>, .dequantize_token = load_per_token_head<true>},
    {.id = HalfFormat::int8_per_token_head, .block_elems = 1, .block_bytes = 1, .cell_scale_bytes = sizeof(float), .block_scale_bytes = 0,
     .rotated = false, .name = "int8_per_token_head", .code_type = "int8 [-127,127]",
     .scale_granularity = "per cell (token x kv head)", .scale_dtype = "f32", .rotation = "none",
     .storage_precision = "int8 + f32 scale", .transfer_precision = "int8 + f32 scale", .execution_precision = "f32",
     .envelope = "|x^-x| <= s/2, s = absmax/127 (f32), round to nearest even", .per_token_scales = true,
     .per_tensor_scale = false, .env = kEnvInt8Pth,
     .quantize_token = store_per_token_head<false>, .dequantize_token = load_per_token_head<false>},
    {.id = HalfFormat::fp8_block128, .block_elems = kTileBlock, .block_bytes = kTileBlock, .cell_scale_bytes = 0,
     .block_scale_bytes = sizeof(float), .rotated = false, .name = "fp8_block128", .code_type = "e4m3fn (sat. +-448)",
     .scale_granularity = "per 128-element tile of the token row", .scale_dtype = "f32", .rotation = "none",
     .storage_precision = "e4m3fn + f32 scale per 128", .transfer_precision = "e4m3fn + f32 scale per 128",
     .execution_precision = "f32", .envelope = "|x^-x| <= 2^-4|x| + 2^-10 s, s = tile absmax/448 (f32)",
     .per_token_scales = true, .per_tensor_scale = false, .env = kEnvFp8Pth,
     .quantize_token = store_fp8_block128, .dequantize_token = load_fp8_block128},
}};

// The table is the list: row i is enumerator i. A row's structure is checked here (block size,
// scale flags, codecs present); its byte counts are not, on purpose: those are what the STO.bytes
// gates prove against docs/FORMATS.md, and the ACCT mutants change them in this table.
constexpr bool table_in_enum_order() {
  for (std::size_t i = 0; i < kInfo.size(); ++i)
    if (static_cast<std::size_t>(kInfo[i].id) != i) return false;
  return true;
}
static_assert(table_in_enum_order(), "kInfo rows must follow the HalfFormat enum (kvgate/format_list.hpp)");
constexpr bool table_rows_consistent() {
  for (const auto& i : kInfo) {
    if (i.block_elems != 1 && i.block_elems != kQBlock && i.block_elems != kQBlock / 2 && i.block_elems != kTileBlock)
      return false;
    if (i.block_bytes == 0) return false;
    if ((i.cell_scale_bytes != 0 || i.block_elems > 1) != i.per_token_scales) return false;
    if (i.block_scale_bytes != 0 && i.block_elems == 1) return false;
    if (i.per_tensor_scale && i.per_token_scales && i.block_scale_bytes == 0) return false;  // nvfp4: both levels
    if (i.quantize_token == nullptr || i.dequantize_token == nullptr) return false;
  }
  return true;
}
static_assert(table_rows_consistent(), "a kInfo row's block size, scale flags or codecs disagree");
static_assert(sizeof(block_q8_0) == 2 + kQBlock && sizeof(block_q4_0) == 2 + kQBlock / 2,
              "32-block structs: a binary16 scale then the codes, no padding");

#define KVGATE_PRESET_TABLE_ROW(A, name, k, v, slot, kind) {#name, {HalfFormat::k, HalfFormat::v}},
constexpr std::array<Preset, kPresetCount> kPresets{{KVGATE_PRESETS(KVGATE_PRESET_TABLE_ROW, _)}};
#undef KVGATE_PRESET_TABLE_ROW

#define KVGATE_PRESET_SLOT_ROW(A, name, k, v, slot, kind) slot,
constexpr std::array<int, kPresetCount> kPresetSlots{KVGATE_PRESETS(KVGATE_PRESET_SLOT_ROW, _)};
#undef KVGATE_PRESET_SLOT_ROW
constexpr bool preset_slots_unique() {
  for (std::size_t i = 0; i < kPresetSlots.size(); ++i)
    for (std::size_t j = i + 1; j < kPresetSlots.size(); ++j)
      if (kPresetSlots[i] == kPresetSlots[j]) return false;
  return true;
}
static_assert(preset_slots_unique(), "two presets share a slot (kvgate/format_list.hpp): the gates' seeds would collide");

constexpr std::array<HalfFormat, kHalfFormatCount> kAll = [] {
  std::array<HalfFormat, kHalfFormatCount> a{};
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = kInfo[i].id;
  return a;
}();

}  // namespace

const HalfFormatInfo& info(HalfFormat f) { return kInfo[static_cast<std::size_t>(f)]; }
std::string_view name(HalfFormat f) { return info(f).name; }
std::span<const HalfFormat> all_half_formats() { return kAll; }

std::optional<HalfFormat> parse_half(std::string_view s) {
  if (s == "fp8") return HalfFormat::fp8_e4m3;
  for (const auto& i : kInfo)
    if (i.name == s) return i.id;
  return std::nullopt;
}

Capability supports(HalfFormat f, const PageGeometry& g) {
  if (g.block_size < 1 || g.n_kv_heads < 1 || g.head_dim < 1)
    return {false, "invalid_geometry", "block_size, n_kv_heads and head_dim must all be >= 1"};
  // Products of the geometry are taken in int elsewhere (row_elems, page sizes): refuse a geometry
  // whose row or page would overflow, before any product is formed (kvgate/limits.hpp).
  if (static_cast<std::uint64_t>(g.n_kv_heads) * static_cast<std::uint64_t>(g.head_dim) >
          limits::max_of(limits::kKvRow) ||
      static_cast<std::uint64_t>(g.block_size) > limits::max_of(limits::kBlockSize))
    return {false, "geometry_too_large",
            "n_kv_heads*head_dim = " + std::to_string(static_cast<std::uint64_t>(g.n_kv_heads) *
                                                      static_cast<std::uint64_t>(g.head_dim)) +
                " (limit " + std::to_string(limits::max_of(limits::kKvRow)) + ", " +
                limits::override_hint(limits::kKvRow) + ") or block_size = " + std::to_string(g.block_size) +
                " (limit " + std::to_string(limits::max_of(limits::kBlockSize)) + ", " +
                limits::override_hint(limits::kBlockSize) + ") is beyond the limits"};
  const HalfFormatInfo& i = info(f);
  if (i.block_elems > 1 && g.row_elems() % i.block_elems != 0)
    return {false, "row_not_multiple_of_" + std::to_string(i.block_elems),
            std::string(name(f)) + " quantizes the token row (n_kv_heads*head_dim = " + std::to_string(g.row_elems()) +
                ") in " + std::to_string(i.block_elems) + "-element blocks; the row length must be a multiple of " +
                std::to_string(i.block_elems)};
  if (i.rotated && (g.head_dim & (g.head_dim - 1)) != 0)
    return {false, "head_dim_not_power_of_two",
            std::string(i.name) + " applies a Walsh-Hadamard rotation over head_dim, which must be a power of two (got " +
                std::to_string(g.head_dim) + ")"};
  return {};
}

std::size_t page_bytes(HalfFormat f, const PageGeometry& g) {
  std::size_t total = 0;
  for (const auto& r : page_runs(f, g)) total += r.bytes;
  return total;
}

std::vector<ByteRun> page_runs(HalfFormat f, const PageGeometry& g) {
  const HalfFormatInfo& i = info(f);
  const std::size_t B = static_cast<std::size_t>(g.block_size);
  const std::size_t H = static_cast<std::size_t>(g.n_kv_heads);
  const std::size_t D = static_cast<std::size_t>(g.head_dim);
  const std::size_t codes = B * (H * D / static_cast<std::size_t>(i.block_elems)) * i.block_bytes;
  if (i.block_scale_bytes != 0)
    return {{"codes", 0, codes}, {"scales", codes, B * (H * D / static_cast<std::size_t>(i.block_elems)) * i.block_scale_bytes}};
  if (i.block_elems > 1) return {{"blocks", 0, codes}};
  if (i.cell_scale_bytes != 0) return {{"codes", 0, codes}, {"scales", codes, B * H * i.cell_scale_bytes}};
  return {{"codes", 0, codes}};
}

double bytes_per_cell(HalfFormat f, const PageGeometry& g) {
  return static_cast<double>(page_bytes(f, g)) / (static_cast<double>(g.block_size) * g.n_kv_heads);
}

std::vector<ByteRun> token_ranges(HalfFormat f, const PageGeometry& g, int slot) {
  const HalfFormatInfo& i = info(f);
  const std::size_t t = static_cast<std::size_t>(slot);
  const std::size_t HD = static_cast<std::size_t>(g.row_elems());
  const std::size_t row = (HD / static_cast<std::size_t>(i.block_elems)) * i.block_bytes;
  if (i.block_scale_bytes != 0) {
    const std::size_t sc = (HD / static_cast<std::size_t>(i.block_elems)) * i.block_scale_bytes;
    return {{"codes", t * row, row}, {"scales", static_cast<std::size_t>(g.block_size) * row + t * sc, sc}};
  }
  if (i.block_elems > 1) return {{"blocks", t * row, row}};
  std::vector<ByteRun> r{{"codes", t * row, row}};
  if (i.cell_scale_bytes != 0) {
    const std::size_t sc = static_cast<std::size_t>(g.n_kv_heads) * i.cell_scale_bytes;
    r.push_back({"scales", static_cast<std::size_t>(g.block_size) * row + t * sc, sc});
  }
  return r;
}

std::string head_slice_refusal(HalfFormat f, const PageGeometry& full, int head0, int n_heads) {
  const HalfFormatInfo& i = info(f);
  if (const Capability c = supports(f, full); !c.ok) return c.detail;
  if (head0 < 0 || n_heads < 1 || head0 + n_heads > full.n_kv_heads)
    return "heads [" + std::to_string(head0) + ", " + std::to_string(head0 + n_heads) + ") are not heads of a page of " +
           std::to_string(full.n_kv_heads);
  const long long e0 = static_cast<long long>(head0) * full.head_dim, ne = static_cast<long long>(n_heads) * full.head_dim;
  if (e0 % i.block_elems != 0 || ne % i.block_elems != 0)
    return std::string(i.name) + " quantizes the token row in " + std::to_string(i.block_elems) +
           "-element blocks; heads [" + std::to_string(head0) + ", " + std::to_string(head0 + n_heads) + ") of " +
           std::to_string(full.head_dim) + " elements are not whole blocks";
  // The layout argument covers these regions only: a format with another region is not cut.
  for (const ByteRun& r : page_runs(f, full))
    if (r.name != "codes" && r.name != "blocks" && r.name != "scales")
      return std::string(i.name) + " has a page region '" + r.name + "' that is not cut by heads";
  return "";
}

namespace {

// One region of the head-major token rows: full-page offset and row bytes, slice offset in a row and
// slice bytes; the rank page's region starts at rank_offset with rows of slice bytes.
struct SliceRegion {
  std::size_t full_offset, full_row, slice_at, slice_bytes, rank_offset;
};

std::vector<SliceRegion> slice_regions(HalfFormat f, const PageGeometry& full, int head0, int n_heads) {
  if (const std::string why = head_slice_refusal(f, full, head0, n_heads); !why.empty())
    throw std::invalid_argument("head slice: " + why);
  const HalfFormatInfo& i = info(f);
  const std::size_t B = static_cast<std::size_t>(full.block_size), H = static_cast<std::size_t>(full.n_kv_heads);
  const std::size_t D = static_cast<std::size_t>(full.head_dim), be = static_cast<std::size_t>(i.block_elems);
  const std::size_t h0 = static_cast<std::size_t>(head0), n = static_cast<std::size_t>(n_heads);
  const std::size_t codes_row = H * D / be * i.block_bytes, rank_codes_row = n * D / be * i.block_bytes;
  std::vector<SliceRegion> out{{0, codes_row, h0 * D / be * i.block_bytes, rank_codes_row, 0}};
  if (i.block_scale_bytes != 0)
    out.push_back({B * codes_row, H * D / be * i.block_scale_bytes, h0 * D / be * i.block_scale_bytes,
                   n * D / be * i.block_scale_bytes, B * rank_codes_row});
  else if (i.cell_scale_bytes != 0)
    out.push_back({B * codes_row, H * i.cell_scale_bytes, h0 * i.cell_scale_bytes, n * i.cell_scale_bytes,
                   B * rank_codes_row});
  // The regions must tile both pages exactly (page_runs is the layout's one definition).
  std::size_t full_total = 0, rank_total = 0;
  for (const SliceRegion& r : out) full_total += B * r.full_row, rank_total += B * r.slice_bytes;
  const PageGeometry rank{full.block_size, n_heads, full.head_dim};
  if (full_total != page_bytes(f, full) || rank_total != page_bytes(f, rank) ||
      out.size() != page_runs(f, full).size())
    throw std::logic_error("head slice: the regions of " + std::string(i.name) + " do not tile its page");
  return out;
}

}  // namespace

void copy_head_slice(HalfFormat f, const PageGeometry& full, int head0, int n_heads, const std::uint8_t* full_page,
                     std::uint8_t* rank_page) {
  const std::size_t B = static_cast<std::size_t>(full.block_size);
  for (const SliceRegion& r : slice_regions(f, full, head0, n_heads))
    for (std::size_t t = 0; t < B; ++t)
      std::memcpy(rank_page + r.rank_offset + t * r.slice_bytes, full_page + r.full_offset + t * r.full_row + r.slice_at,
                  r.slice_bytes);
}

void place_head_slice(HalfFormat f, const PageGeometry& full, int head0, int n_heads, const std::uint8_t* rank_page,
                      std::uint8_t* full_page) {
  const std::size_t B = static_cast<std::size_t>(full.block_size);
  for (const SliceRegion& r : slice_regions(f, full, head0, n_heads))
    for (std::size_t t = 0; t < B; ++t)
      std::memcpy(full_page + r.full_offset + t * r.full_row + r.slice_at, rank_page + r.rank_offset + t * r.slice_bytes,
                  r.slice_bytes);
}

std::string KvFormat::name() const {
  for (const auto& p : kPresets)
    if (p.fmt == *this) return std::string(p.name);
  return "k=" + std::string(kvgate::name(k)) + ",v=" + std::string(kvgate::name(v));
}

std::span<const Preset> presets() { return kPresets; }

std::optional<KvFormat> parse_kv_format(std::string_view s) {
  for (const auto& p : kPresets)
    if (p.name == s) return p.fmt;
  if (s == "fp8_e4m3") return KvFormat{HalfFormat::fp8_e4m3, HalfFormat::fp8_e4m3};
  if (s.starts_with("k=")) {
    const auto comma = s.find(",v=");
    if (comma == std::string_view::npos) return std::nullopt;
    const auto k = parse_half(s.substr(2, comma - 2));
    const auto v = parse_half(s.substr(comma + 3));
    if (k && v) return KvFormat{*k, *v};
  }
  return std::nullopt;
}

std::string known_formats_text() {
  std::string s = "presets:";
  for (const auto& p : kPresets) s += " " + std::string(p.name);
  s += "; halves (for k=<K>,v=<V> or --kv-k/--kv-v):";
  for (const auto& i : kInfo) s += " " + std::string(i.name);
  return s;
}

void hadamard_normalized(float* x, int n) {
  for (int len = 1; len < n; len <<= 1) {
    for (int i = 0; i < n; ++i) {
      if (i & len) continue;
      const float a = x[i];
      const float b = x[i + len];
      x[i] = a + b;
      x[i + len] = a - b;
    }
  }
  const float c = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (int i = 0; i < n; ++i) x[i] *= c;
}

void quantize_token(HalfFormat f, const PageGeometry& g, int slot, const float* row, std::span<const float> head_scales,
                    std::uint8_t* page) {
  if (static_cast<int>(head_scales.size()) != g.n_kv_heads)
    throw std::invalid_argument("quantize_token: " + std::to_string(head_scales.size()) + " head scales for " +
                                std::to_string(g.n_kv_heads) + " KV heads");
  info(f).quantize_token(g, slot, row, head_scales.data(), page);
}

void dequantize_token(HalfFormat f, const PageGeometry& g, int slot, const std::uint8_t* page,
                      std::span<const float> head_scales, float* row) {
  if (static_cast<int>(head_scales.size()) != g.n_kv_heads)
    throw std::invalid_argument("dequantize_token: " + std::to_string(head_scales.size()) + " head scales for " +
                                std::to_string(g.n_kv_heads) + " KV heads");
  info(f).dequantize_token(g, slot, page, head_scales.data(), row);
}

void quantize_token(HalfFormat f, const PageGeometry& g, int slot, const float* row, float tensor_scale,
                    std::uint8_t* page) {
  const std::vector<float> hs(static_cast<std::size_t>(std::max(g.n_kv_heads, 1)), tensor_scale);
  info(f).quantize_token(g, slot, row, hs.data(), page);
}

void dequantize_token(HalfFormat f, const PageGeometry& g, int slot, const std::uint8_t* page, float tensor_scale,
                      float* row) {
  const std::vector<float> hs(static_cast<std::size_t>(std::max(g.n_kv_heads, 1)), tensor_scale);
  info(f).dequantize_token(g, slot, page, hs.data(), row);
}

double envelope_bound(HalfFormat f, float x, float scale, bool clamped) {
  const EnvelopeConstants& e = info(f).env;
  const double ax = std::fabs(static_cast<double>(x));
  const double s = std::fabs(static_cast<double>(scale));
  // FP slack: one binary32 rounding of the quotient x/s (<= 2^-24 * 127 code units) and one of the
  // product code*s (<= 2^-24 |x^|): 2^-20 * (s + |x|) covers both with margin.
  const double slack = e.fp_slack ? 0x1p-20 * (s + ax) : 0.0;
  return std::max(e.rel * ax + (clamped ? e.scale_clamped : e.scale) * s, e.floor) + slack;
}

}  // namespace kvgate
