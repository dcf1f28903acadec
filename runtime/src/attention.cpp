// CPU attention over the paged store. Per (layer, page): the K and V pages are dequantized once
// (f32 pages are read in place) into tiles shared by every query and head; K is laid out
// [kv head][d][token] so that the scores of a head vectorize across the page's tokens. Online
// softmax across pages, FP32 accumulation. Scratch memory is per thread and reused.
#include "kvgate/attention.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "kvgate/blocks.hpp"
#include "kvgate/numeric.hpp"
#include "cpu_avx2.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(KVGATE_NO_TARGET_CLONES)
#define KVGATE_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#define KVGATE_X86_AVX2 1
#include <immintrin.h>
#else
#define KVGATE_MULTIVERSION
#define KVGATE_X86_AVX2 0
#endif

// v8f values never cross a non-inlined call boundary between differently compiled code.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace kvgate {

namespace {

// The scale of every element of a token row, [H*D]: element h*D + i takes head h's scale (what the
// fp8 readers multiply by), written into `buf`.
const float* head_scale_row(std::span<const float> head_scales, const PageGeometry& g, std::vector<float>& buf) {
  const std::size_t D = static_cast<std::size_t>(g.head_dim);
  buf.resize(head_scales.size() * D);
  for (std::size_t h = 0; h < head_scales.size(); ++h)
    std::fill_n(buf.begin() + static_cast<std::ptrdiff_t>(h * D), D, head_scales[h]);
  return buf.data();
}

// binary16 -> binary32, bit-identical to f16_to_f32 (numeric.cpp) and branch-free: the exponent
// is rebased by one exact multiply by 2^112 (subnormals included); inf/NaN keep their payload.
inline float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t em = static_cast<std::uint32_t>(h) & 0x7FFFu;
  const float mag = std::bit_cast<float>(em << 13) * 0x1p112f;
  const std::uint32_t special = 0x7F800000u | ((em & 0x3FFu) << 13);
  const std::uint32_t bits = em >= 0x7C00u ? special : std::bit_cast<std::uint32_t>(mag);
  return std::bit_cast<float>(bits | sign);
}

const std::array<float, 256>& fp8_table(HalfFormat f) {
  static const auto make = [](bool e4) {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c)
      t[static_cast<std::size_t>(c)] =
          e4 ? fp8_e4m3_to_f32(static_cast<std::uint8_t>(c)) : fp8_e5m2_to_f32(static_cast<std::uint8_t>(c));
    return t;
  };
  static const std::array<float, 256> e4 = make(true), e5 = make(false);
  return f == HalfFormat::fp8_e4m3 ? e4 : e5;
}

KVGATE_MULTIVERSION
void dequant_f16(const std::uint16_t* __restrict in, float* __restrict out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = f16_bits_to_f32(in[i]);
}

KVGATE_MULTIVERSION
void dequant_bf16(const std::uint16_t* __restrict in, float* __restrict out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(in[i]) << 16);
}

// MX (mxfp8, mxfp4) and nvfp4 pages (format.cpp: the codes [B][nb x block_bytes], then the block
// scale codes [B][nb]): table lookups and one scale per block, the same binary32 values and products
// as dequantize_token (e4m3 codes through fp8_table, E2M1 through its 16 values, UE8M0 2^(c-127)).
const std::array<float, 256>& e8m0_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int c = 0; c < 255; ++c) a[static_cast<std::size_t>(c)] = std::ldexp(1.0f, c - 127);
    a[255] = std::numeric_limits<float>::quiet_NaN();
    return a;
  }();
  return t;
}
constexpr std::array<float, 16> kE2m1 = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

void dequant_microscaled(HalfFormat f, const PageGeometry& g, int n, const std::uint8_t* page, float global, float* out) {
  const HalfFormatInfo& fi = info(f);
  const int HD = g.row_elems(), blk = fi.block_elems, nb = HD / blk;
  const std::size_t row_code_bytes = static_cast<std::size_t>(nb) * fi.block_bytes;
  const std::uint8_t* scales = page + static_cast<std::size_t>(g.block_size) * row_code_bytes;
  const auto& e4 = fp8_table(HalfFormat::fp8_e4m3);
  const auto& e8 = e8m0_table();
  for (int t = 0; t < n; ++t) {
    const std::uint8_t* codes = page + static_cast<std::size_t>(t) * row_code_bytes;
    const std::uint8_t* sc = scales + static_cast<std::size_t>(t) * nb;
    float* row = out + static_cast<std::size_t>(t) * HD;
    for (int b = 0; b < nb; ++b) {
      float* o = row + static_cast<std::size_t>(b) * blk;
      if (f == HalfFormat::mxfp8) {
        const float X = e8[sc[b]];
        const std::uint8_t* c = codes + static_cast<std::size_t>(b) * blk;
        for (int i = 0; i < blk; ++i) o[i] = e4[c[i]] * X;
        continue;
      }
      const float X = f == HalfFormat::nvfp4 ? e4[sc[b]] * global : e8[sc[b]];
      const std::uint8_t* c = codes + static_cast<std::size_t>(b) * (blk / 2);
      for (int i = 0; i < blk / 2; ++i) {
        o[2 * i] = kE2m1[c[i] & 0xF] * X;
        o[2 * i + 1] = kE2m1[c[i] >> 4] * X;
      }
    }
  }
}

constexpr int kScaleChunk = 256;

#if KVGATE_X86_AVX2
// Explicit AVX2 kernels (picked at run time; GCC 12 does not vectorize these shapes well).
__attribute__((target("avx2"), always_inline)) inline void cell8(const std::int8_t* q, float* o, __m256 sv) {
  const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
  _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_cvtepi32_ps(w), sv));  // exact widening, one RNE multiply
}

// Eight binary16 scales to binary32, the integer form of f16_bits_to_f32 (bit-identical).
__attribute__((target("avx2"), always_inline)) inline __m256 widen8(const std::uint16_t* p) {
  const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i em = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFF));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x8000)), 16);
  const __m256 mag = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(em, 13)), _mm256_set1_ps(0x1p112f));
  const __m256i special = _mm256_or_si256(_mm256_set1_epi32(0x7F800000),
                                          _mm256_slli_epi32(_mm256_and_si256(em, _mm256_set1_epi32(0x3FF)), 13));
  const __m256i is_special = _mm256_cmpgt_epi32(em, _mm256_set1_epi32(0x7BFF));
  const __m256i bits = _mm256_blendv_epi8(_mm256_castps_si256(mag), special, is_special);
  return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}

__attribute__((target("avx2"))) void widen_scales_avx2(const std::uint16_t* __restrict scales, float* __restrict sf,
                                                       int n) {
  int c = 0;
  for (; c + 8 <= n; c += 8) _mm256_storeu_ps(sf + c, widen8(scales + c));
  for (; c < n; ++c) sf[c] = f16_bits_to_f32(scales[c]);
}

// D == 8 cells straight from the page: scales widened eight at a time in registers.
__attribute__((target("avx2"))) void dequant_int8_d8_avx2(const std::int8_t* __restrict codes,
                                                          const std::uint16_t* __restrict scales,
                                                          float* __restrict out, int n_cells) {
  int c = 0;
  for (; c + 8 <= n_cells; c += 8) {
    const __m256 sv = widen8(scales + c);
    for (int i = 0; i < 8; ++i)
      cell8(codes + 8 * static_cast<std::size_t>(c + i), out + 8 * static_cast<std::size_t>(c + i),
            _mm256_permutevar8x32_ps(sv, _mm256_set1_epi32(i)));
  }
  for (; c < n_cells; ++c)
    cell8(codes + 8 * static_cast<std::size_t>(c), out + 8 * static_cast<std::size_t>(c),
          _mm256_set1_ps(f16_bits_to_f32(scales[c])));
}

// AVX-512 (kHaveAvx512) for the int8 read's hot loops. Scales here only ever multiply codes, so
// vcvtph2ps widens them: exact for every finite and infinite binary16, and a NaN scale makes a NaN
// product either way (an sNaN quieted by the conversion here, by the multiply in the exact integer
// form: the same bits; ORA.dequant_rows reads every scale code both ways).
// GCC 12's AVX-512 headers warn that their _mm512_undefined operands may be used uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) void widen_scales_avx512(const std::uint16_t* __restrict scales,
                                                           float* __restrict sf, int n) {
  int c = 0;
  for (; c + 16 <= n; c += 16)
    _mm512_storeu_ps(sf + c, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + c))));
  if (c < n) widen_scales_avx2(scales + c, sf + c, n - c);
}

// D == 8 cells, two per 512-bit register: cells c + 2i (lanes 0-7) and c + 2i + 1 (lanes 8-15) of
// a group of 16 take scales 2i and 2i + 1 of the group's widened scales; alone 2.5x faster
// than the AVX2 kernel (51.9 against 20.9 ns for a 64-cell page on the 2-core AMD EPYC development
// machine, bench/results/cpu_decode_round32.md). The group's tail goes to the AVX2 kernel.
__attribute__((target("avx512f"))) void dequant_int8_d8_avx512(const std::int8_t* __restrict codes,
                                                              const std::uint16_t* __restrict scales,
                                                              float* __restrict out, int n_cells) {
  int c = 0;
  for (; c + 16 <= n_cells; c += 16) {
    const __m512 sv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + c)));
    const __m512i pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const std::size_t e = 8 * static_cast<std::size_t>(c + 2 * i);
      const __m512i w = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + e)));
      const __m512 s2 = _mm512_permutexvar_ps(_mm512_add_epi32(pair, _mm512_set1_epi32(2 * i)), sv);
      _mm512_storeu_ps(out + e, _mm512_mul_ps(_mm512_cvtepi32_ps(w), s2));  // exact widening, one RNE multiply
    }
  }
  if (c < n_cells) dequant_int8_d8_avx2(codes + 8 * static_cast<std::size_t>(c), scales + c, out + 8 * static_cast<std::size_t>(c), n_cells - c);
}
#pragma GCC diagnostic pop

__attribute__((target("avx2"))) void dequant_int8_cells_avx2(const std::int8_t* __restrict codes,
                                                             const float* __restrict sf, float* __restrict out,
                                                             int n_cells, int D) {
  for (int c = 0; c < n_cells; ++c) {
    const __m256 sv = _mm256_set1_ps(sf[c]);
    const std::int8_t* q = codes + static_cast<std::size_t>(c) * D;
    float* o = out + static_cast<std::size_t>(c) * D;
    for (int i = 0; i < D; i += 8) cell8(q + i, o + i, sv);
  }
}

// Stores the transpose of the 8x8 block r (r[i] = token t0+i, columns hd0..hd0+7) into
// kt[hd0 + k][t0 .. t0 + 8).
__attribute__((target("avx2"), always_inline)) inline void store_transposed8x8(const __m256* r, float* kt, int ks,
                                                                              int t0, int hd0) {
  const __m256 a0 = _mm256_unpacklo_ps(r[0], r[1]), a1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 a2 = _mm256_unpacklo_ps(r[2], r[3]), a3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 a4 = _mm256_unpacklo_ps(r[4], r[5]), a5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 a6 = _mm256_unpacklo_ps(r[6], r[7]), a7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE);
  const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE);
  const __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xEE);
  const __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xEE);
  const __m256 c[8] = {_mm256_permute2f128_ps(b0, b4, 0x20), _mm256_permute2f128_ps(b1, b5, 0x20),
                       _mm256_permute2f128_ps(b2, b6, 0x20), _mm256_permute2f128_ps(b3, b7, 0x20),
                       _mm256_permute2f128_ps(b0, b4, 0x31), _mm256_permute2f128_ps(b1, b5, 0x31),
                       _mm256_permute2f128_ps(b2, b6, 0x31), _mm256_permute2f128_ps(b3, b7, 0x31)};
  for (int k = 0; k < 8; ++k) _mm256_storeu_ps(kt + static_cast<std::size_t>(hd0 + k) * ks + t0, c[k]);
}

// Loaders: the 8 dequantized values of token row t, elements [hd0, hd0 + 8), exactly as
// dequantize_token computes them (same conversions, one binary32 multiply by the stored scale).
struct LoadF32 {
  const float* p;
  int hd_n;
  __attribute__((target("avx2"), always_inline)) __m256 operator()(int t, int hd0) const {
    return _mm256_loadu_ps(p + static_cast<std::size_t>(t) * hd_n + hd0);
  }
};
struct LoadF16 {
  const std::uint16_t* p;
  int hd_n;
  __attribute__((target("avx2"), always_inline)) __m256 operator()(int t, int hd0) const {
    return widen8(p + static_cast<std::size_t>(t) * hd_n + hd0);
  }
};
struct LoadBF16 {
  const std::uint16_t* p;
  int hd_n;
  __attribute__((target("avx2"), always_inline)) __m256 operator()(int t, int hd0) const {
    const __m256i x = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + static_cast<std::size_t>(t) * hd_n + hd0)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
  }
};
struct LoadInt8 {  // sf: the page's cell scales, widened
  const std::int8_t* p;
  const float* sf;
  int hd_n, d, h;
  __attribute__((target("avx2"), always_inline)) __m256 operator()(int t, int hd0) const {
    const __m256i w = _mm256_cvtepi8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + static_cast<std::size_t>(t) * hd_n + hd0)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(w), _mm256_set1_ps(sf[t * h + hd0 / d]));
  }
};
struct LoadFp8 {  // the codes rebased by bit shifts, as f16_bits_to_f32 widens binary16 (no table gather)
  const std::uint8_t* p;
  bool e4;  // fp8_e4m3, else fp8_e5m2
  const float* srow;  // [hd_n]: element e's KV head's scale (head_scale_row)
  int hd_n;
  // fp8_e4m3_to_f32 / fp8_e5m2_to_f32 exactly: the exponent and mantissa bits moved into binary32
  // position and rebased by one exact multiply (2^120: bias 127 - 7; 2^112: 127 - 15), subnormals
  // included; e4m3's S.1111.111 and e5m2's exponent 31 with a mantissa are the positive quiet NaN,
  // e5m2's exponent 31 without one is +-inf; then one binary32 multiply by the element's head scale.
  __attribute__((target("avx2"), always_inline)) __m256 operator()(int t, int hd0) const {
    const __m256i c = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + static_cast<std::size_t>(t) * hd_n + hd0)));
    const __m256i em = _mm256_and_si256(c, _mm256_set1_epi32(0x7F));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
    const __m256i qnan = _mm256_set1_epi32(0x7FC00000);
    __m256i bits;
    if (e4) {
      const __m256 mag = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(em, 20)), _mm256_set1_ps(0x1p120f));
      bits = _mm256_or_si256(_mm256_castps_si256(mag), sign);
      bits = _mm256_blendv_epi8(bits, qnan, _mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7F)));
    } else {
      const __m256 mag = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(em, 21)), _mm256_set1_ps(0x1p112f));
      bits = _mm256_or_si256(_mm256_castps_si256(mag), sign);
      const __m256i inf = _mm256_or_si256(_mm256_set1_epi32(0x7F800000), sign);
      bits = _mm256_blendv_epi8(bits, inf, _mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7C)));
      bits = _mm256_blendv_epi8(bits, qnan, _mm256_cmpgt_epi32(em, _mm256_set1_epi32(0x7C)));
    }
    return _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_loadu_ps(srow + hd0));
  }
};
// Block formats: sfb holds every block's scale, widened once (blocks_per_row per token row).
struct LoadQ8_0 {
  const block_q8_0* p;
  const float* sfb;
  int blocks_per_row;
  __attribute__((target("avx2"), always_inline)) __m256 operator()(int t, int hd0) const {
    const std::size_t k = static_cast<std::size_t>(t) * blocks_per_row + hd0 / kQBlock;
    const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p[k].qs + hd0 % kQBlock)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(w), _mm256_set1_ps(sfb[k]));
  }
};
struct LoadQ4_0 {
  const block_q4_0* p;
  const float* sfb;
  int blocks_per_row;
  __attribute__((target("avx2"), always_inline)) __m256 operator()(int t, int hd0) const {
    const std::size_t k = static_cast<std::size_t>(t) * blocks_per_row + hd0 / kQBlock;
    const int j = hd0 % kQBlock;  // elements 0..15: low nibbles of qs[j]; 16..31: high nibbles of qs[j-16]
    __m256i c = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p[k].qs + (j < kQBlock / 2 ? j : j - kQBlock / 2))));
    c = j < kQBlock / 2 ? _mm256_and_si256(c, _mm256_set1_epi32(0x0F)) : _mm256_srli_epi32(c, 4);
    c = _mm256_sub_epi32(c, _mm256_set1_epi32(8));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(sfb[k]));
  }
};

template <class Block>
float* block_scales(const Block* b, std::size_t n) {
  thread_local std::vector<float> sfb;
  if (sfb.size() < n) sfb.resize(n);
  for (std::size_t k = 0; k < n; ++k) sfb[k] = f16_bits_to_f32(b[k].d);
  return sfb.data();
}

// Whole pages of blocks in row order: one scale conversion per block, four groups of 8.
__attribute__((target("avx2"))) void rows_q8_0_avx2(const block_q8_0* b, float* out, std::size_t n_blocks) {
  for (std::size_t k = 0; k < n_blocks; ++k) {
    const __m256 d = _mm256_set1_ps(f16_bits_to_f32(b[k].d));
    for (int j = 0; j < kQBlock; j += 8) {
      const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[k].qs + j)));
      _mm256_storeu_ps(out + k * kQBlock + j, _mm256_mul_ps(_mm256_cvtepi32_ps(w), d));
    }
  }
}
__attribute__((target("avx2"))) void rows_q4_0_avx2(const block_q4_0* b, float* out, std::size_t n_blocks) {
  const __m256i low = _mm256_set1_epi32(0x0F), eight = _mm256_set1_epi32(8);
  for (std::size_t k = 0; k < n_blocks; ++k) {
    const __m256 d = _mm256_set1_ps(f16_bits_to_f32(b[k].d));
    for (int j = 0; j < kQBlock / 2; j += 8) {
      const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[k].qs + j)));
      const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(c, low), eight);   // elements j..j+7
      const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(c, 4), eight);    // elements j+16..j+23
      _mm256_storeu_ps(out + k * kQBlock + j, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), d));
      _mm256_storeu_ps(out + k * kQBlock + j + kQBlock / 2, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), d));
    }
  }
}

// K tile [hd][token] for tokens [0, nt8) (nt8 a multiple of 8, at most the page's block size).
template <class L>
__attribute__((target("avx2"))) void transpose_load_avx2(const L& ld, float* kt, int ks, int nt8, int hd_n) {
  __m256 r[8];
  for (int t0 = 0; t0 < nt8; t0 += 8)
    for (int hd0 = 0; hd0 < hd_n; hd0 += 8) {
      for (int i = 0; i < 8; ++i) r[i] = ld(t0 + i, hd0);
      store_transposed8x8(r, kt, ks, t0, hd0);
    }
}

// Rows [0, n) in token-major order.
template <class L>
__attribute__((target("avx2"))) void rows_load_avx2(const L& ld, float* out, int n, int hd_n) {
  for (int t = 0; t < n; ++t)
    for (int hd0 = 0; hd0 < hd_n; hd0 += 8) _mm256_storeu_ps(out + static_cast<std::size_t>(t) * hd_n + hd0, ld(t, hd0));
}

#endif

// int8 cells: scales widened first (one vectorized pass), then code * scale per cell (exact
// conversion, one binary32 multiply, as dequantize_token).
KVGATE_MULTIVERSION
void widen_scales_generic(const std::uint16_t* __restrict scales, float* __restrict sf, int n) {
  for (int c = 0; c < n; ++c) sf[c] = f16_bits_to_f32(scales[c]);
}

void widen_scales(const std::uint16_t* scales, float* sf, int n) {
#if KVGATE_X86_AVX2
  if (kHaveAvx512) {
    widen_scales_avx512(scales, sf, n);
    return;
  }
  if (kHaveAvx2) {
    widen_scales_avx2(scales, sf, n);
    return;
  }
#endif
  widen_scales_generic(scales, sf, n);
}

void dequant_int8(const std::int8_t* codes, const std::uint16_t* scales, float* out, int n_cells, int D) {
#if KVGATE_X86_AVX2
  if (kHaveAvx512 && D == 8) {
    dequant_int8_d8_avx512(codes, scales, out, n_cells);
    return;
  }
  if (kHaveAvx2 && D == 8) {
    dequant_int8_d8_avx2(codes, scales, out, n_cells);
    return;
  }
#endif
  float sf[kScaleChunk];
  for (int c0 = 0; c0 < n_cells; c0 += kScaleChunk) {
    const int cn = std::min(kScaleChunk, n_cells - c0);
    widen_scales(scales + c0, sf, cn);
    const std::int8_t* q = codes + static_cast<std::size_t>(c0) * D;
    float* o = out + static_cast<std::size_t>(c0) * D;
#if KVGATE_X86_AVX2
    if (kHaveAvx2 && D % 8 == 0) {
      dequant_int8_cells_avx2(q, sf, o, cn, D);
      continue;
    }
#endif
    for (int c = 0; c < cn; ++c)
      for (int i = 0; i < D; ++i)
        o[static_cast<std::size_t>(c) * D + i] = static_cast<float>(q[static_cast<std::size_t>(c) * D + i]) * sf[c];
  }
}

KVGATE_MULTIVERSION
void dequant_q8_0(const block_q8_0* __restrict b, float* __restrict out, std::size_t n_blocks) {
  for (std::size_t k = 0; k < n_blocks; ++k) {
    const float d = f16_bits_to_f32(b[k].d);
    float* o = out + k * kQBlock;
    for (int i = 0; i < kQBlock; ++i) o[i] = static_cast<float>(b[k].qs[i]) * d;
  }
}

KVGATE_MULTIVERSION
void dequant_q4_0(const block_q4_0* __restrict b, float* __restrict out, std::size_t n_blocks) {
  for (std::size_t k = 0; k < n_blocks; ++k) {
    const float d = f16_bits_to_f32(b[k].d);
    float* o = out + k * kQBlock;
    for (int j = 0; j < kQBlock / 2; ++j) {
      o[j] = static_cast<float>((b[k].qs[j] & 0x0F) - 8) * d;
      o[j + kQBlock / 2] = static_cast<float>((b[k].qs[j] >> 4) - 8) * d;
    }
  }
}

struct Scratch {
  std::vector<float> m, l, acc, ktile, kt, vtile, kscales, k_srow;
  template <class V>
  static float* grow(V& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
};

// e^x for the softmax weights, vectorizable: Cody-Waite reduction x = n ln2 + r, Cephes' degree-6
// polynomial on |r| <= ln2/2 (about 1 ulp), scaled by 2^n through the exponent bits. x < -87.3
// gives 0 (below the smallest normal), -inf gives 0, NaN stays NaN. No FMA, so every build gives the
// same bits.
__attribute__((always_inline)) inline float softmax_exp(float x) {
  constexpr float lo = -87.3f, hi = 88.0f;
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  xc = xc == xc ? xc : 0.0f;  // NaN: the int conversion below would be undefined; NaN is returned below
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // rint via the 1.5*2^23 trick
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23;
  const float y = p * std::bit_cast<float>(bits);
  return x < lo ? 0.0f : (x == x ? y : x);
}

constexpr int kW = 16;  // tokens per score chunk: two 8-lane vectors

// GCC vector types: each clone lowers them to its own ISA (AVX2: one register; baseline: two SSE
// registers) with the same lane arithmetic, so every clone gives the same bits.
typedef float v8f __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));

__attribute__((always_inline)) inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
__attribute__((always_inline)) inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }
__attribute__((always_inline)) inline v8f splat8(float x) { return v8f{} + x; }
__attribute__((always_inline)) inline v8f vmax(v8f a, v8f b) { return a > b ? a : b; }
// Horizontal max / sum as a fixed tree: lanes (i, i+4), then (i, i+2), then (i, i+1).
__attribute__((always_inline)) inline float hmax8(v8f v) {
  v = vmax(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3));
  v = vmax(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5));
  v = vmax(v, __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6));
  return v[0];
}
__attribute__((always_inline)) inline float hsum8(v8f v) {
  v = v + __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
  v = v + __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5);
  v = v + __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
  return v[0];
}
// softmax_exp on 8 lanes, the same operations lane by lane.
__attribute__((always_inline)) inline v8f softmax_exp8(v8f x) {
  const v8f lo = splat8(-87.3f), hi = splat8(88.0f);
  v8f xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  xc = xc == xc ? xc : v8f{};  // NaN lanes: as in softmax_exp
  const v8f n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  v8f r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  v8f p = splat8(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
  const v8f y = p * std::bit_cast<v8f>(bits);
  return x < lo ? v8f{} : (x == x ? y : x);
}

// hadamard_normalized (format.cpp) on n_cells cells of D floats (D a power of two, >= 8), 8 lanes
// at a time: every butterfly level computes the same a + b and a - b of the same operands, then
// the same multiply by c, so the result is bit-identical.
template <int NV>  // vectors of 8 per cell: D = 8 * NV
__attribute__((always_inline)) inline void wht_cells_t(float* x, int n_cells) {
  constexpr int D = 8 * NV;
  const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
  const float c = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  for (int cell = 0; cell < n_cells; ++cell) {
    float* p = x + static_cast<std::size_t>(cell) * D;
    v8f v[NV];
    for (int j = 0; j < NV; ++j) {
      v8f y = load8(p + 8 * j);
      v8f sh = __builtin_shufflevector(y, y, 1, 0, 3, 2, 5, 4, 7, 6);  // len 1
      y = (lane & 1) == 0 ? y + sh : sh - y;
      sh = __builtin_shufflevector(y, y, 2, 3, 0, 1, 6, 7, 4, 5);  // len 2
      y = (lane & 2) == 0 ? y + sh : sh - y;
      sh = __builtin_shufflevector(y, y, 4, 5, 6, 7, 0, 1, 2, 3);  // len 4
      v[j] = (lane & 4) == 0 ? y + sh : sh - y;
    }
    for (int len = 1; len < NV; len <<= 1)  // len 8, 16, ... elements: whole vectors
      for (int j = 0; j < NV; ++j)
        if ((j & len) == 0) {
          const v8f a = v[j], b = v[j + len];
          v[j] = a + b;
          v[j + len] = a - b;
        }
    for (int j = 0; j < NV; ++j) store8(p + 8 * j, v[j] * c);
  }
}

// hadamard_normalized (format.cpp) on n_cells cells of D floats (D a power of two, 8..256), 8 lanes
// at a time: every butterfly level computes the same a + b and a - b of the same operands, then
// the same multiply by c, so the result is bit-identical.
KVGATE_MULTIVERSION
void wht_cells(float* x, int n_cells, int D) {
  switch (D) {
    case 8: wht_cells_t<1>(x, n_cells); return;
    case 16: wht_cells_t<2>(x, n_cells); return;
    case 32: wht_cells_t<4>(x, n_cells); return;
    case 64: wht_cells_t<8>(x, n_cells); return;
    case 128: wht_cells_t<16>(x, n_cells); return;
    case 256: wht_cells_t<32>(x, n_cells); return;
    default:
      for (int c = 0; c < n_cells; ++c) hadamard_normalized(x + static_cast<std::size_t>(c) * D, D);
  }
}

// Attention of every query and head over tokens [t0, t0 + nt) of one page: scores against the
// transposed K tile kt[kv head][d][ks], one online-softmax step per chunk of kW tokens, V
// accumulation from the row tile.
template <int DC>
__attribute__((always_inline)) inline void attend_page_t(const AttentionArgs& a, int Drt, int HD, int ks, int group,
                                                         int t0, int nt, float scale, const float* __restrict q,
                                                         const float* __restrict kt, const float* __restrict vrows,
                                                         float* __restrict m, float* __restrict l,
                                                         float* __restrict acc) {
  const int D = DC ? DC : Drt;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const v8i lane0 = {0, 1, 2, 3, 4, 5, 6, 7}, lane1 = lane0 + 8;
  for (int i = 0; i < a.n_q; ++i) {
    const int last = a.pos0 + i;  // causal: keys [0, last]
    if (t0 > last) continue;
    const int ntq = std::min(nt, last - t0 + 1);
    // Sliding window: keys [last - window + 1, last]; lo = the first visible slot of this page.
    const int lo = a.window > 0 ? std::max(0, last - a.window + 1 - t0) : 0;
    if (lo >= ntq) continue;
    const int c_first = lo / kW * kW;  // chunks stay aligned to the tile; lanes before lo are masked
    for (int hq = 0; hq < a.n_heads; ++hq) {
      const int hk = hq / group;
      const float* qv = q + (static_cast<std::size_t>(i) * a.n_heads + hq) * D;
      const std::size_t st = static_cast<std::size_t>(i) * a.n_heads + hq;
      const float* kh = kt + static_cast<std::size_t>(hk) * D * ks;
      float* ac = acc + st * D;
      for (int c0 = c_first; c0 < ntq; c0 += kW) {
        const int cn = std::min(kW, ntq - c0);
        const int cl = lo - c0;  // lanes below cl lie before the window (<= 0 past the first chunk)
        // s[t] = (sum_d q[d] k[t][d]) * scale, summed in d order; lanes past the causal end are -inf.
        v8f s0 = {}, s1 = {};
        for (int d = 0; d < D; ++d) {
          const v8f qd = splat8(qv[d]);
          const float* kd = kh + static_cast<std::size_t>(d) * ks + c0;
          s0 += qd * load8(kd);
          s1 += qd * load8(kd + 8);
        }
        s0 = s0 * scale;
        s1 = s1 * scale;
        if (a.softcap > 0) {  // Gemma 2: tanh(s / cap) * cap, before the mask
          for (int t = 0; t < 8; ++t) {
            s0[t] = std::tanh(s0[t] / a.softcap) * a.softcap;
            s1[t] = std::tanh(s1[t] / a.softcap) * a.softcap;
          }
        }
        s0 = ((lane0 < cn) & (lane0 >= cl)) ? s0 : splat8(kNegInf);
        s1 = ((lane1 < cn) & (lane1 >= cl)) ? s1 : splat8(kNegInf);
        const float cmax = hmax8(vmax(s0, s1));
        const float mx = m[st] > cmax ? m[st] : cmax;
        const float corr = softmax_exp(m[st] - mx);  // 0 on the first chunk (m = -inf)
        const v8f w0 = softmax_exp8(s0 - mx), w1 = softmax_exp8(s1 - mx);  // weights, 0 past the end
        l[st] = l[st] * corr + hsum8(w0 + w1);
        m[st] = mx;
        float w[kW];
        store8(w, w0);
        store8(w + 8, w1);
        for (int d = 0; d < D; ++d) ac[d] *= corr;
        const float* vv = vrows + static_cast<std::size_t>(c0) * HD + static_cast<std::size_t>(hk) * D;
        if constexpr (DC == 8) {
          // Head of 8: four partial sums over t mod 4 break the add latency chain.
          v8f p[4] = {};
          int t = 0;
          for (; t + 4 <= cn; t += 4)
            for (int j = 0; j < 4; ++j) p[j] += splat8(w[t + j]) * load8(vv + static_cast<std::size_t>(t + j) * HD);
          for (; t < cn; ++t) p[0] += splat8(w[t]) * load8(vv + static_cast<std::size_t>(t) * HD);
          store8(ac, load8(ac) + ((p[0] + p[1]) + (p[2] + p[3])));
        } else if constexpr (DC > 0 && DC % 8 == 0) {
          for (int t = 0; t < cn; ++t) {
            const v8f wt = splat8(w[t]);
            const float* vt = vv + static_cast<std::size_t>(t) * HD;
            for (int d = 0; d < DC; d += 8) store8(ac + d, load8(ac + d) + wt * load8(vt + d));
          }
        } else {
          for (int t = 0; t < cn; ++t)
            for (int d = 0; d < D; ++d) ac[d] += w[t] * vv[static_cast<std::size_t>(t) * HD + d];
        }
      }
    }
  }
}

KVGATE_MULTIVERSION
void attend_page(const AttentionArgs& a, int D, int HD, int ks, int group, int t0, int nt, float scale,
                 const float* q, const float* kt, const float* vrows, float* m, float* l, float* acc) {
  switch (D) {
    case 8: attend_page_t<8>(a, D, HD, ks, group, t0, nt, scale, q, kt, vrows, m, l, acc); return;
    case 16: attend_page_t<16>(a, D, HD, ks, group, t0, nt, scale, q, kt, vrows, m, l, acc); return;
    case 32: attend_page_t<32>(a, D, HD, ks, group, t0, nt, scale, q, kt, vrows, m, l, acc); return;
    case 64: attend_page_t<64>(a, D, HD, ks, group, t0, nt, scale, q, kt, vrows, m, l, acc); return;
    case 128: attend_page_t<128>(a, D, HD, ks, group, t0, nt, scale, q, kt, vrows, m, l, acc); return;
    default: attend_page_t<0>(a, D, HD, ks, group, t0, nt, scale, q, kt, vrows, m, l, acc); return;
  }
}

// kt[hd][t] = rows[t][hd] for t < nt (row stride hd_n, kt row stride ks). Whole 8x8 blocks may
// read rows up to the page's block size (they exist in the page or tile): `rows_avail` of them.
void transpose_rows(const float* __restrict rows, float* __restrict kt, int nt, int hd_n, int ks, int rows_avail) {
  int t_done = 0;
#if KVGATE_X86_AVX2
  if (kHaveAvx2 && hd_n % 8 == 0) {
    const int nt8 = std::min((nt + 7) / 8 * 8, rows_avail / 8 * 8);
    transpose_load_avx2(LoadF32{rows, hd_n}, kt, ks, nt8, hd_n);
    t_done = nt8;
  }
#endif
  for (int hd = 0; hd < hd_n; ++hd)
    for (int t = t_done; t < nt; ++t) kt[static_cast<std::size_t>(hd) * ks + t] = rows[static_cast<std::size_t>(t) * hd_n + hd];
}

}  // namespace

void dequantize_rows(HalfFormat f, const PageGeometry& g, int n, const std::uint8_t* page, float tensor_scale,
                     float* out) {
  const std::vector<float> hs(static_cast<std::size_t>(std::max(g.n_kv_heads, 1)), tensor_scale);
  dequantize_rows(f, g, n, page, std::span<const float>(hs), out);
}

void dequantize_rows(HalfFormat f, const PageGeometry& g, int n, const std::uint8_t* page,
                     std::span<const float> head_scales, float* out) {
  const int HD = g.row_elems();
  const std::size_t cnt = static_cast<std::size_t>(n) * HD;
  if (static_cast<int>(head_scales.size()) != g.n_kv_heads)
    throw KvStoreError("dequantize_rows: " + std::to_string(head_scales.size()) + " head scales for " +
                       std::to_string(g.n_kv_heads) + " KV heads");
  const bool fp8 = f == HalfFormat::fp8_e4m3 || f == HalfFormat::fp8_e5m2;
  thread_local std::vector<float> srow_buf;
  const float* srow = fp8 ? head_scale_row(head_scales, g, srow_buf) : nullptr;
#if KVGATE_X86_AVX2
  if (kHaveAvx2 && HD % 8 == 0) {
    switch (f) {
      case HalfFormat::f16: rows_load_avx2(LoadF16{reinterpret_cast<const std::uint16_t*>(page), HD}, out, n, HD); return;
      case HalfFormat::bf16: rows_load_avx2(LoadBF16{reinterpret_cast<const std::uint16_t*>(page), HD}, out, n, HD); return;
      case HalfFormat::fp8_e4m3:
      case HalfFormat::fp8_e5m2:
        rows_load_avx2(LoadFp8{page, f == HalfFormat::fp8_e4m3, srow, HD}, out, n, HD);
        return;
      case HalfFormat::q8_0: rows_q8_0_avx2(reinterpret_cast<const block_q8_0*>(page), out, cnt / kQBlock); return;
      case HalfFormat::q4_0: rows_q4_0_avx2(reinterpret_cast<const block_q4_0*>(page), out, cnt / kQBlock); return;
      case HalfFormat::q4_0_rot: {
        rows_q4_0_avx2(reinterpret_cast<const block_q4_0*>(page), out, cnt / kQBlock);
        if (g.head_dim >= 8 && g.head_dim <= 256) {
          wht_cells(out, n * g.n_kv_heads, g.head_dim);
          return;
        }
        for (std::size_t c = 0; c < static_cast<std::size_t>(n) * g.n_kv_heads; ++c)
          hadamard_normalized(out + c * g.head_dim, g.head_dim);
        return;
      }
      default: break;  // f32, int8: below
    }
  }
#endif
  switch (f) {
    case HalfFormat::f32: std::memcpy(out, page, cnt * sizeof(float)); return;
    case HalfFormat::f16: dequant_f16(reinterpret_cast<const std::uint16_t*>(page), out, cnt); return;
    case HalfFormat::bf16: dequant_bf16(reinterpret_cast<const std::uint16_t*>(page), out, cnt); return;
    case HalfFormat::int8:
      dequant_int8(reinterpret_cast<const std::int8_t*>(page),
                   reinterpret_cast<const std::uint16_t*>(page + static_cast<std::size_t>(g.block_size) * HD), out,
                   n * g.n_kv_heads, g.head_dim);
      return;
    case HalfFormat::fp8_e4m3:
    case HalfFormat::fp8_e5m2: {
      const auto& t = fp8_table(f);
      for (std::size_t i = 0; i < cnt; ++i) out[i] = t[page[i]] * srow[i % static_cast<std::size_t>(HD)];
      return;
    }
    case HalfFormat::q8_0: dequant_q8_0(reinterpret_cast<const block_q8_0*>(page), out, cnt / kQBlock); return;
    case HalfFormat::q4_0:
    case HalfFormat::q4_0_rot:
      dequant_q4_0(reinterpret_cast<const block_q4_0*>(page), out, cnt / kQBlock);
      if (f == HalfFormat::q4_0_rot) {
        if (g.head_dim >= 8 && g.head_dim <= 256)
          wht_cells(out, n * g.n_kv_heads, g.head_dim);  // head_dim is a power of two (capability)
        else
          for (std::size_t c = 0; c < static_cast<std::size_t>(n) * g.n_kv_heads; ++c)
            hadamard_normalized(out + c * g.head_dim, g.head_dim);
      }
      return;
    case HalfFormat::mxfp8:
    case HalfFormat::mxfp4:
    case HalfFormat::nvfp4: dequant_microscaled(f, g, n, page, head_scales[0], out); return;  // one global scale
    case HalfFormat::fp8_per_token_head:
    case HalfFormat::int8_per_token_head: {
      // Codes [n][H][D] bytes, then the scales run [B][H] binary32 (docs/FORMATS.md): one multiply
      // by the cell's scale, e4m3 codes through fp8_table.
      const auto& e4 = fp8_table(HalfFormat::fp8_e4m3);
      const bool is_fp8 = f == HalfFormat::fp8_per_token_head;
      const std::uint8_t* scales = page + static_cast<std::size_t>(g.block_size) * HD;
      for (int c = 0; c < n * g.n_kv_heads; ++c) {
        float s;
        std::memcpy(&s, scales + static_cast<std::size_t>(c) * sizeof(float), sizeof(float));
        const std::uint8_t* cc = page + static_cast<std::size_t>(c) * g.head_dim;
        float* o = out + static_cast<std::size_t>(c) * g.head_dim;
        for (int i = 0; i < g.head_dim; ++i)
          o[i] = (is_fp8 ? e4[cc[i]] : static_cast<float>(static_cast<std::int8_t>(cc[i]))) * s;
      }
      return;
    }
    case HalfFormat::fp8_block128: {
      // Codes [n][H*D] bytes, then the scales run [B][H*D/128] binary32 (docs/FORMATS.md): one
      // multiply by the tile's scale, e4m3 codes through fp8_table.
      const auto& e4 = fp8_table(HalfFormat::fp8_e4m3);
      const std::uint8_t* scales = page + static_cast<std::size_t>(g.block_size) * HD;
      for (std::size_t b = 0; b < cnt / kTileBlock; ++b) {
        float s;
        std::memcpy(&s, scales + b * sizeof(float), sizeof(float));
        const std::uint8_t* cc = page + b * kTileBlock;
        float* o = out + b * kTileBlock;
        for (int i = 0; i < kTileBlock; ++i) o[i] = e4[cc[i]] * s;
      }
      return;
    }
  }
}

namespace {

// The K tile of tokens [0, nt) of a page, read through the format's AVX2 loader and transposed in
// one pass (whole 8-token blocks: slots up to the block size are read, their lanes never used).
// False when no fused path applies (no AVX2, odd geometry, q4_0_rot which needs the rotation).
bool k_tile_fused(HalfFormat f, const PageGeometry& g, int nt, const std::uint8_t* page, const float* srow, float* kt,
                  int ks, Scratch& sc) {
#if KVGATE_X86_AVX2
  const int HD = g.row_elems(), B = g.block_size;
  if (!kHaveAvx2 || HD % 8 != 0 || B % 8 != 0) return false;
  const int nt8 = (nt + 7) / 8 * 8;
  switch (f) {
    case HalfFormat::f32: transpose_load_avx2(LoadF32{reinterpret_cast<const float*>(page), HD}, kt, ks, nt8, HD); return true;
    case HalfFormat::f16:
      transpose_load_avx2(LoadF16{reinterpret_cast<const std::uint16_t*>(page), HD}, kt, ks, nt8, HD);
      return true;
    case HalfFormat::bf16:
      transpose_load_avx2(LoadBF16{reinterpret_cast<const std::uint16_t*>(page), HD}, kt, ks, nt8, HD);
      return true;
    case HalfFormat::int8: {
      if (g.head_dim % 8 != 0) return false;
      float* sf = Scratch::grow(sc.kscales, static_cast<std::size_t>(B) * g.n_kv_heads);
      widen_scales(reinterpret_cast<const std::uint16_t*>(page + static_cast<std::size_t>(B) * HD), sf,
                   nt8 * g.n_kv_heads);
      transpose_load_avx2(LoadInt8{reinterpret_cast<const std::int8_t*>(page), sf, HD, g.head_dim, g.n_kv_heads}, kt,
                          ks, nt8, HD);
      return true;
    }
    case HalfFormat::fp8_e4m3:
    case HalfFormat::fp8_e5m2:
      transpose_load_avx2(LoadFp8{page, f == HalfFormat::fp8_e4m3, srow, HD}, kt, ks, nt8, HD);
      return true;
    case HalfFormat::q8_0: {
      const auto* b = reinterpret_cast<const block_q8_0*>(page);
      const std::size_t nb = static_cast<std::size_t>(nt8) * (HD / kQBlock);
      transpose_load_avx2(LoadQ8_0{b, block_scales(b, nb), HD / kQBlock}, kt, ks, nt8, HD);
      return true;
    }
    case HalfFormat::q4_0: {
      const auto* b = reinterpret_cast<const block_q4_0*>(page);
      const std::size_t nb = static_cast<std::size_t>(nt8) * (HD / kQBlock);
      transpose_load_avx2(LoadQ4_0{b, block_scales(b, nb), HD / kQBlock}, kt, ks, nt8, HD);
      return true;
    }
    case HalfFormat::q4_0_rot:
    case HalfFormat::mxfp8:
    case HalfFormat::mxfp4:
    case HalfFormat::nvfp4:
    case HalfFormat::fp8_per_token_head:
    case HalfFormat::int8_per_token_head:
    case HalfFormat::fp8_block128: return false;
  }
#endif
  (void)f, (void)g, (void)nt, (void)page, (void)srow, (void)kt, (void)ks, (void)sc;
  return false;
}

}  // namespace

void attention(const PagedKvStore& store, SeqId s, int layer, const AttentionArgs& a, const float* q, float* out) {
  if (store.layout() != KvLayout::kv_heads)
    throw KvStoreError(std::string("attention: the store's layout is ") + name(store.layout()) +
                       ", which is read by mla_latent_attention (attention_mla.hpp), not as K/V heads");
  const PageGeometry g = store.geometry();
  const int D = g.head_dim;
  const int H = g.n_kv_heads;
  const int B = g.block_size;
  const int HD = H * D;
  if (a.n_heads % H != 0)
    throw KvStoreError("attention: n_heads (" + std::to_string(a.n_heads) + ") must be a multiple of n_kv_heads (" +
                       std::to_string(H) + ")");
  const int group = a.n_heads / H;
  const int n_ctx = a.pos0 + a.n_q;
  if (n_ctx > store.length(s)) throw KvStoreError("attention: queries reach past the end of the sequence");
  const float scale = a.softmax_scale > 0 ? a.softmax_scale : 1.0f / std::sqrt(static_cast<float>(D));
  const auto table = store.block_table(s);
  const HalfFormat kf = store.half_format(KvHalf::K), vf = store.half_format(KvHalf::V);
  const std::span<const float> ks = store.head_scales(layer, KvHalf::K), vs = store.head_scales(layer, KvHalf::V);

  // Online-softmax state per (query, head), in per-thread scratch.
  thread_local Scratch sc;
  const std::size_t nqh = static_cast<std::size_t>(a.n_q) * a.n_heads;
  float* m = Scratch::grow(sc.m, nqh);
  float* l = Scratch::grow(sc.l, nqh);
  float* acc = Scratch::grow(sc.acc, nqh * D);
  std::fill(m, m + nqh, -std::numeric_limits<float>::infinity());
  std::fill(l, l + nqh, 0.0f);
  std::fill(acc, acc + nqh * D, 0.0f);
  float* ktile = Scratch::grow(sc.ktile, static_cast<std::size_t>(B) * HD);
  const int kstride = (B + kW - 1) / kW * kW;  // K tile row stride: whole chunks, padding never used
  float* kt = Scratch::grow(sc.kt, static_cast<std::size_t>(kstride) * HD);
  float* vtile = Scratch::grow(sc.vtile, static_cast<std::size_t>(B) * HD);
  const float* k_srow = head_scale_row(ks, g, sc.k_srow);  // K's per-element head scales (fused fp8 loader)

  // Pages no query can see are skipped: with a window, those wholly before the first query's
  // window (without one, a chunk that starts late still attends from position 0).
  const int n_pages = (n_ctx + B - 1) / B;
  const int first_key = a.window > 0 ? std::max(0, a.pos0 - a.window + 1) : 0;
  const KvReadHook* const hook = store.read_hook();
  for (int p = first_key / B; p < n_pages; ++p) {
    const int t0 = p * B;
    const int nt = std::min(B, n_ctx - t0);
    const std::uint8_t* kp = store.page(layer, KvHalf::K, table[static_cast<std::size_t>(p)]);
    const std::uint8_t* vp = store.page(layer, KvHalf::V, table[static_cast<std::size_t>(p)]);
    if (hook) [[unlikely]] {
      // Diagnostics (KvReadHook): the rows are dequantized into the tiles, handed to the hook, then used.
      dequantize_rows(kf, g, nt, kp, ks, ktile);
      hook->on_read(store.config().first_layer + layer, KvHalf::K, t0, nt, HD, ktile);
      transpose_rows(ktile, kt, nt, HD, kstride, B);
      dequantize_rows(vf, g, nt, vp, vs, vtile);
      hook->on_read(store.config().first_layer + layer, KvHalf::V, t0, nt, HD, vtile);
      attend_page(a, D, HD, kstride, group, t0, nt, scale, q, kt, vtile, m, l, acc);
      continue;
    }
    // K tile as [kv head][d][token]: read and transposed in one pass where the format has a loader.
    if (!k_tile_fused(kf, g, nt, kp, k_srow, kt, kstride, sc)) {
      if (kf == HalfFormat::f32) {
        transpose_rows(reinterpret_cast<const float*>(kp), kt, nt, HD, kstride, B);
      } else {
        dequantize_rows(kf, g, nt, kp, ks, ktile);
        transpose_rows(ktile, kt, nt, HD, kstride, B);
      }
    }
    const float* vrows = vtile;
    if (vf == HalfFormat::f32) vrows = reinterpret_cast<const float*>(vp);
    else if (vf == HalfFormat::int8)  // dequantize_rows' own case, called without its per-call checks
      dequant_int8(reinterpret_cast<const std::int8_t*>(vp),
                   reinterpret_cast<const std::uint16_t*>(vp + static_cast<std::size_t>(B) * HD), vtile, nt * H, D);
    else dequantize_rows(vf, g, nt, vp, vs, vtile);
    attend_page(a, D, HD, kstride, group, t0, nt, scale, q, kt, vrows, m, l, acc);
  }
  for (std::size_t st = 0; st < nqh; ++st) {
    const float inv = 1.0f / l[st];
    for (int d = 0; d < D; ++d) out[st * D + d] = acc[st * D + d] * inv;
  }
}

}  // namespace kvgate
