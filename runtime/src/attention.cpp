// CPU attention over the paged store. Per (layer, page): the K and V pages are dequantized once
// (f32 pages are read in place) into tiles shared by every query and head; K is laid out
// [kv head][d][token] so that the scores of a head vectorize across the page's tokens. Online
// softmax across pages, FP32 accumulation. Scratch memory is per thread and reused.
#include "kvgate/attention.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kvgate/blocks.hpp"
#include "kvgate/numeric.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(KVGATE_NO_TARGET_CLONES)
#define KVGATE_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define KVGATE_MULTIVERSION
#endif

namespace kvgate {

namespace {

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

constexpr int kScaleChunk = 256;

// GCC vector types: lowered to AVX2 or SSE2 in the respective clone, same arithmetic in both.
typedef float v8f __attribute__((vector_size(32)));
typedef signed char v8c __attribute__((vector_size(8)));

// int8 cells: scales widened first (one vectorized pass), then code * scale per cell (exact
// conversion, one binary32 multiply, as dequantize_token).
template <int DC>
__attribute__((always_inline)) inline void dequant_int8_t(const std::int8_t* __restrict codes,
                                                          const std::uint16_t* __restrict scales,
                                                          float* __restrict out, int n_cells, int Drt) {
  const int D = DC ? DC : Drt;
  float sf[kScaleChunk];
  for (int c0 = 0; c0 < n_cells; c0 += kScaleChunk) {
    const int cn = std::min(kScaleChunk, n_cells - c0);
    for (int c = 0; c < cn; ++c) sf[c] = f16_bits_to_f32(scales[c0 + c]);
    for (int c = 0; c < cn; ++c) {
      const std::size_t cell = static_cast<std::size_t>(c0 + c);
      const std::int8_t* q = codes + cell * D;
      float* o = out + cell * D;
      if (D % 8 == 0) {
        const v8f sv = v8f{} + sf[c];
        for (int i = 0; i < D; i += 8) {
          v8c cv;
          std::memcpy(&cv, q + i, sizeof cv);
          const v8f f = __builtin_convertvector(cv, v8f) * sv;
          std::memcpy(o + i, &f, sizeof f);
        }
      } else {
        for (int i = 0; i < D; ++i) o[i] = static_cast<float>(q[i]) * sf[c];
      }
    }
  }
}

KVGATE_MULTIVERSION
void dequant_int8(const std::int8_t* codes, const std::uint16_t* scales, float* out, int n_cells, int D) {
  switch (D) {
    case 8: dequant_int8_t<8>(codes, scales, out, n_cells, D); return;
    case 16: dequant_int8_t<16>(codes, scales, out, n_cells, D); return;
    case 32: dequant_int8_t<32>(codes, scales, out, n_cells, D); return;
    case 64: dequant_int8_t<64>(codes, scales, out, n_cells, D); return;
    case 128: dequant_int8_t<128>(codes, scales, out, n_cells, D); return;
    default: dequant_int8_t<0>(codes, scales, out, n_cells, D); return;
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
  std::vector<float> m, l, acc, ktile, kt, vtile;
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
  return x < lo ? 0.0f : y;
}

constexpr int kW = 16;  // tokens per score chunk (fixed width, so the chunk loops vectorize)
static_assert(kW == 16, "the reductions below are written out for 16 lanes");

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
  for (int i = 0; i < a.n_q; ++i) {
    const int last = a.pos0 + i;  // causal: keys [0, last]
    if (t0 > last) continue;
    const int ntq = std::min(nt, last - t0 + 1);
    for (int hq = 0; hq < a.n_heads; ++hq) {
      const int hk = hq / group;
      const float* qv = q + (static_cast<std::size_t>(i) * a.n_heads + hq) * D;
      const std::size_t st = static_cast<std::size_t>(i) * a.n_heads + hq;
      const float* kh = kt + static_cast<std::size_t>(hk) * D * ks;
      float* ac = acc + st * D;
      for (int c0 = 0; c0 < ntq; c0 += kW) {
        const int cn = std::min(kW, ntq - c0);
        // s[t] = (sum_d q[d] k[t][d]) * scale, summed in d order; lanes past the causal end are -inf.
        float s[kW] = {};
        for (int d = 0; d < D; ++d) {
          const float qd = qv[d];
          const float* kd = kh + static_cast<std::size_t>(d) * ks + c0;
          for (int t = 0; t < kW; ++t) s[t] += qd * kd[t];
        }
        for (int t = 0; t < kW; ++t) s[t] = t < cn ? s[t] * scale : kNegInf;
        float r[kW / 2];
        for (int t = 0; t < 8; ++t) r[t] = s[t] > s[t + 8] ? s[t] : s[t + 8];
        for (int t = 0; t < 4; ++t) r[t] = r[t] > r[t + 4] ? r[t] : r[t + 4];
        for (int t = 0; t < 2; ++t) r[t] = r[t] > r[t + 2] ? r[t] : r[t + 2];
        const float cmax = r[0] > r[1] ? r[0] : r[1];
        const float mx = m[st] > cmax ? m[st] : cmax;
        const float corr = softmax_exp(m[st] - mx);  // 0 on the first chunk (m = -inf)
        for (int t = 0; t < kW; ++t) s[t] = softmax_exp(s[t] - mx);  // weights (0 past the end)
        for (int t = 0; t < 8; ++t) r[t] = s[t] + s[t + 8];
        for (int t = 0; t < 4; ++t) r[t] += r[t + 4];
        for (int t = 0; t < 2; ++t) r[t] += r[t + 2];
        l[st] = l[st] * corr + (r[0] + r[1]);
        m[st] = mx;
        for (int d = 0; d < D; ++d) ac[d] *= corr;
        const float* vv = vrows + static_cast<std::size_t>(c0) * HD + static_cast<std::size_t>(hk) * D;
        for (int t = 0; t < cn; ++t) {
          const float w = s[t];
          for (int d = 0; d < D; ++d) ac[d] += w * vv[static_cast<std::size_t>(t) * HD + d];
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

// kt[hd][t] = rows[t][hd] for t < nt (row stride hd_n, kt row stride ks).
KVGATE_MULTIVERSION
void transpose_rows(const float* __restrict rows, float* __restrict kt, int nt, int hd_n, int ks) {
  for (int hd = 0; hd < hd_n; ++hd)
    for (int t = 0; t < nt; ++t) kt[static_cast<std::size_t>(hd) * ks + t] = rows[static_cast<std::size_t>(t) * hd_n + hd];
}

}  // namespace

void dequantize_rows(HalfFormat f, const PageGeometry& g, int n, const std::uint8_t* page, float tensor_scale,
                     float* out) {
  const int HD = g.row_elems();
  const std::size_t cnt = static_cast<std::size_t>(n) * HD;
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
      for (std::size_t i = 0; i < cnt; ++i) out[i] = t[page[i]] * tensor_scale;
      return;
    }
    case HalfFormat::q8_0: dequant_q8_0(reinterpret_cast<const block_q8_0*>(page), out, cnt / kQBlock); return;
    case HalfFormat::q4_0:
    case HalfFormat::q4_0_rot:
      dequant_q4_0(reinterpret_cast<const block_q4_0*>(page), out, cnt / kQBlock);
      if (f == HalfFormat::q4_0_rot)
        for (std::size_t c = 0; c < static_cast<std::size_t>(n) * g.n_kv_heads; ++c)
          hadamard_normalized(out + c * g.head_dim, g.head_dim);
      return;
  }
}

void attention(const PagedKvStore& store, SeqId s, int layer, const AttentionArgs& a, const float* q, float* out) {
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
  const float ks = store.tensor_scale(layer, KvHalf::K), vs = store.tensor_scale(layer, KvHalf::V);

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

  // Pages no query can see (a chunk that starts late still attends from position 0) are all read.
  const int n_pages = (n_ctx + B - 1) / B;
  for (int p = 0; p < n_pages; ++p) {
    const int t0 = p * B;
    const int nt = std::min(B, n_ctx - t0);
    const std::uint8_t* kp = store.page(layer, KvHalf::K, table[static_cast<std::size_t>(p)]);
    const std::uint8_t* vp = store.page(layer, KvHalf::V, table[static_cast<std::size_t>(p)]);
    // K tile as [kv head][d][token]: transposed straight from the page for f32.
    if (kf == HalfFormat::f32) {
      transpose_rows(reinterpret_cast<const float*>(kp), kt, nt, HD, kstride);
    } else {
      dequantize_rows(kf, g, nt, kp, ks, ktile);
      transpose_rows(ktile, kt, nt, HD, kstride);
    }
    const float* vrows = vtile;
    if (vf == HalfFormat::f32) vrows = reinterpret_cast<const float*>(vp);
    else dequantize_rows(vf, g, nt, vp, vs, vtile);
    attend_page(a, D, HD, kstride, group, t0, nt, scale, q, kt, vrows, m, l, acc);
  }
  for (std::size_t st = 0; st < nqh; ++st) {
    const float inv = 1.0f / l[st];
    for (int d = 0; d < D; ++d) out[st * D + d] = acc[st * D + d] * inv;
  }
}

}  // namespace kvgate
