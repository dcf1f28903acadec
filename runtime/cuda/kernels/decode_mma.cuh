// Tensor-core decode path for the narrow half formats (int8, fp8_e4m3, fp8_e5m2, q8_0, q4_0,
// q4_0_rot, and the 2026 halves mxfp8, mxfp4, nvfp4, fp8_per_token_head, int8_per_token_head in the
// pairs of common.cuh has_pipelined_decode) at head_dim 64/128/256 (docs/CUDA.md). Per warp and
// 16-token tile:
//   S^T[16 tok x 8 heads] = K[16 x D] . Q^T[D x 8]      (mma.sync m16n8k16, f16 in, f32 accumulate)
//   O^T[D x 8 heads]     += V^T[D x 16 tok] . P^T[16 x 8]
// Codes convert to f16 exactly (int8, q8_0, q4_0-8, e4m3, e5m2, e2m1 all fit); q and the softmax
// weights are split hi + lo in f16 (two MMAs; |x - hi - lo| <= 2^-22 |x|, or 2^-25 absolute below the
// f16 normal range), so products are exact and every sum is FP32: the numerics of the CUDA-core path.
// Scales: K scales multiply the FP32 scores: per token (int8 f16, per-(token, head) binary32) after
// the K . q sum, per block through one FP32 accumulator per block (q8_0/q4_0 f16 d, mxfp8/mxfp4
// UE8M0 2^e per 32 dims, nvfp4 E4M3 per 16 dims = one k-step). V scales multiply P before the split,
// per token, or per token and block for the block formats (the scale varies along the output dims,
// so a block's m-tiles get their own P^T fragments: both m-tiles of a 32-block, one m-tile for
// nvfp4's 16-blocks), normalised by a running power-of-two reference per scale group (the tile's
// largest scale) so the f16 operands stay in [0, 1]; O accumulates in units of that reference and
// the epilogue multiplies it back (exact: powers of two). Every scale is exact in binary32 (f16,
// UE8M0, E4M3, binary32), so each product rounds once, as on the CUDA cores. nvfp4's global scale
// is the caller's (layer, K|V) FP32 tensor scale, folded into q and the output like fp8's.
// The 4 query heads of a GQA chunk are the N columns 0..3; when both halves are narrow (f16 terms),
// columns 4..7 carry the lo terms of the same 4 heads (q_lo for S, P_lo for O), so one MMA does the
// work of the hi and lo MMAs and the two partial sums meet in FP32 through one xor-2 shuffle (lanes
// t and t^2 hold a head's hi and lo columns). Column packing halves the MMAs per tile.
#pragma once
#include <cuda_bf16.h>

#include "decode.cuh"

namespace kvgate::cuda::detail {

__device__ __forceinline__ void mma16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816_bf16(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The MMA operand type a half is fed as: bf16 for bf16, f16 for everything else.
template <HF F>
__device__ __forceinline__ void mma_as(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  if constexpr (F == HF::bf16) mma16816_bf16(c, a, b0, b1);
  else mma16816(c, a, b0, b1);
}

__device__ __forceinline__ std::uint32_t prmt(std::uint32_t a, std::uint32_t b, std::uint32_t s) { return __byte_perm(a, b, s); }
__device__ __forceinline__ std::uint32_t hsub2u(std::uint32_t x, std::uint32_t c) {
  __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&x), *reinterpret_cast<const __half2*>(&c));
  return *reinterpret_cast<std::uint32_t*>(&r);
}
__device__ __forceinline__ std::uint32_t e4m3x2_to_h2(std::uint32_t v16) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v16 & 0xFFFFu), __NV_E4M3);
  return static_cast<std::uint32_t>(r.x) | (static_cast<std::uint32_t>(r.y) << 16);
}
// hi + lo split of two floats into two half2 (as u32).
__device__ __forceinline__ void split_h2(float x0, float x1, std::uint32_t& hi, std::uint32_t& lo) {
  const __half2 h = __floats2half2_rn(x0, x1);
  const float2 hf = __half22float2(h);
  const __half2 l = __floats2half2_rn(x0 - hf.x, x1 - hf.y);
  hi = *reinterpret_cast<const std::uint32_t*>(&h);
  lo = *reinterpret_cast<const std::uint32_t*>(&l);
}
// x0, x1 -> NTERMS pairs in F's MMA operand type: bf16 (3 terms, 24 bits) or f16 (2 terms, 22 bits).
template <HF F>
KVGATE_HD constexpr int split_terms() { return F == HF::bf16 ? 3 : 2; }
template <HF F>
__device__ __forceinline__ void split_terms_h2(float x0, float x1, std::uint32_t (&out)[split_terms<F>()]) {
  if constexpr (F == HF::bf16) {
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
      const float2 hf = __bfloat1622float2(h);
      out[k] = *reinterpret_cast<const std::uint32_t*>(&h);
      x0 -= hf.x;
      x1 -= hf.y;
    }
  } else {
    split_h2(x0, x1, out[0], out[1]);
  }
}
__device__ __forceinline__ std::uint16_t lds16(const std::uint8_t* p) { return *reinterpret_cast<const std::uint16_t*>(p); }
__device__ __forceinline__ std::uint32_t lds32(const std::uint8_t* p) { return *reinterpret_cast<const std::uint32_t*>(p); }

inline constexpr std::uint32_t kMagic = 0x64646464u;  // f16 0x64xx = 1024 + xx
inline constexpr std::uint32_t kI8Off = 0x64806480u;  // 1152 = 1024 + 128 (int8 biased by 128)
inline constexpr std::uint32_t kQ4Off = 0x64086408u;  // 1032 = 1024 + 8   (q4 code - 8)
// A q4 code left in its byte's high nibble: f16 0x64c0 = 1024 + 16 c; times 1/16 (0x2C00) plus -72
// (0xD480) is c - 8, exact (64 + c and c - 8 are f16 integers; one fma rounds once), so the
// high nibble needs no shift: one LOP3 and one HFMA2 per pair, like the low nibble's LOP3 + HSUB2.
inline constexpr std::uint32_t kQ4HiMul = 0x2C002C00u;  // 1/16
inline constexpr std::uint32_t kQ4HiOff = 0xD480D480u;  // -72 = -(1024 / 16 + 8)
__device__ __forceinline__ std::uint32_t q4_lo_h2(std::uint32_t x) {  // low nibbles of bytes 0, 2 -> code - 8
  return hsub2u((x & 0x000F000Fu) | 0x64006400u, kQ4Off);
}
__device__ __forceinline__ std::uint32_t q4_hi_h2(std::uint32_t x) {  // high nibbles of bytes 0, 2 -> code - 8
  const std::uint32_t h = (x & 0x00F000F0u) | 0x64006400u, mul = kQ4HiMul, off = kQ4HiOff;
  __half2 r = __hfma2(*reinterpret_cast<const __half2*>(&h), *reinterpret_cast<const __half2*>(&mul),
                      *reinterpret_cast<const __half2*>(&off));
  return *reinterpret_cast<std::uint32_t*>(&r);
}

// E2M1 -> f16, exactly: every E2M1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6) is an f16 whose low byte is
// 0, so a byte permute of this table by the 3 magnitude bits gives the f16's high byte; a second
// permute moves the sign (nibble bit 3) to bit 15. No arithmetic: the bits are the value's.
inline constexpr std::uint32_t kE2m1HiLo = 0x3E3C3800u;  // f16 high bytes of 0, 0.5, 1, 1.5
inline constexpr std::uint32_t kE2m1HiHi = 0x46444240u;  // of 2, 3, 4, 6
// The E2M1 codes in the high nibbles of bytes 0 and 1 of y -> f16 pair (byte 0's in the low half).
// Selector nibbles 1 and 3 are the magnitudes (nibbles 0 and 2 are 0: table byte 0, the zero low
// byte); the sign bits 7 and 15 go to 15 and 31 with their bytes.
__device__ __forceinline__ std::uint32_t e2m1_hi_nibbles_to_h2(std::uint32_t y) {
  return prmt(kE2m1HiLo, kE2m1HiHi, y & 0x7070u) | (prmt(y, 0u, 0x1404) & 0x80008000u);
}
// Four bytes of E2M1 codes (two per byte) -> four f16 pairs: h[0] the low nibbles of bytes 0 and 1,
// h[1] their high nibbles, h[2] and h[3] the same of bytes 2 and 3 (shifts bring each nibble pair to
// the high nibbles of the low two bytes).
__device__ __forceinline__ void e2m1x8_to_h2(std::uint32_t w, std::uint32_t (&h)[4]) {
  h[0] = e2m1_hi_nibbles_to_h2(w << 4);
  h[1] = e2m1_hi_nibbles_to_h2(w);
  h[2] = e2m1_hi_nibbles_to_h2(w >> 12);
  h[3] = e2m1_hi_nibbles_to_h2(w >> 16);
}

// The byte format whose code conversion a half shares: int8_per_token_head reads as int8, mxfp8 and
// fp8_per_token_head as fp8_e4m3 (their scales are applied elsewhere).
template <HF F>
KVGATE_HD constexpr HF code_half() {
  return F == HF::int8_per_token_head ? HF::int8 : (F == HF::mxfp8 || F == HF::fp8_per_token_head) ? HF::fp8_e4m3 : F;
}

// int8 (4 codes in w, dims +0..+3) -> (dims 0,1), (dims 2,3) as f16 pairs.
__device__ __forceinline__ void i8x4_to_h2(std::uint32_t w, std::uint32_t& lo, std::uint32_t& hi) {
  w ^= 0x80808080u;
  lo = hsub2u(prmt(w, kMagic, 0x4140), kI8Off);
  hi = hsub2u(prmt(w, kMagic, 0x4342), kI8Off);
}

// K fragments of one 32-dim block (k-steps 2*blk and 2*blk+1). k-slot mapping: k-step j covers
// dims 16j + 4t + r, r = 0..3 <-> k-slots (2t, 2t+1, 2t+8, 2t+9); rows g and g+8 are tokens.
template <HF F>
__device__ __forceinline__ void k_frag32(const std::uint8_t* r0, const std::uint8_t* r1, int blk, int t,
                                         std::uint32_t (&A0)[4], std::uint32_t (&A1)[4]) {
  if constexpr (F == HF::int8 || is_fp8(F)) {
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      std::uint32_t (&A)[4] = jj == 0 ? A0 : A1;
      const int off = 32 * blk + 16 * jj + 4 * t;
      const std::uint32_t w0 = lds32(r0 + off), w1 = lds32(r1 + off);
      if constexpr (F == HF::int8) {
        i8x4_to_h2(w0, A[0], A[2]);
        i8x4_to_h2(w1, A[1], A[3]);
      } else if constexpr (F == HF::fp8_e4m3) {
        A[0] = e4m3x2_to_h2(w0);
        A[2] = e4m3x2_to_h2(w0 >> 16);
        A[1] = e4m3x2_to_h2(w1);
        A[3] = e4m3x2_to_h2(w1 >> 16);
      } else {  // e5m2 = the top byte of an f16
        A[0] = prmt(w0, 0u, 0x1404);
        A[2] = prmt(w0, 0u, 0x3424);
        A[1] = prmt(w1, 0u, 0x1404);
        A[3] = prmt(w1, 0u, 0x3424);
      }
    }
  } else if constexpr (F == HF::q8_0) {
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      std::uint32_t (&A)[4] = jj == 0 ? A0 : A1;
      const int off = 34 * blk + 2 + 16 * jj + 4 * t;  // 2-byte aligned
      const std::uint32_t w0 = lds16(r0 + off) | (static_cast<std::uint32_t>(lds16(r0 + off + 2)) << 16);
      const std::uint32_t w1 = lds16(r1 + off) | (static_cast<std::uint32_t>(lds16(r1 + off + 2)) << 16);
      i8x4_to_h2(w0, A[0], A[2]);
      i8x4_to_h2(w1, A[1], A[3]);
    }
  } else if constexpr (is_e2m1(F)) {
    // mxfp4 / nvfp4: byte j holds dims 2j (low nibble), 2j+1 (high). k-step j covers dims 16j ..
    // 16j + 15 (one nvfp4 16-block); lane t reads bytes 8j + 2t, +1 (dims 16j + 4t .. +3) of rows g
    // and g+8, and its k-slots are 2t, 2t+1 <-> dims 4t, 4t+2 and 2t+8, 2t+9 <-> dims 4t+1, 4t+3
    // (e2m1x8_to_h2 pairs low nibbles and high nibbles; mma_q_fragments pairs q the same way).
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      std::uint32_t (&A)[4] = jj == 0 ? A0 : A1;
      const int off = 16 * blk + 8 * jj + 2 * t;  // 2-byte aligned
      std::uint32_t h[4];
      e2m1x8_to_h2(lds16(r0 + off) | (static_cast<std::uint32_t>(lds16(r1 + off)) << 16), h);
      A[0] = h[0];  // row g, k-slots 2t, 2t+1
      A[2] = h[1];  // row g, k-slots 2t+8, 2t+9
      A[1] = h[2];  // row g+8
      A[3] = h[3];
    }
  } else {  // q4_0 / q4_0_rot: qs[j] holds dims j (low nibble) and j+16 (high nibble)
    const int off = 18 * blk + 2 + 4 * t;
#pragma unroll
    for (int row = 0; row < 2; ++row) {
      const std::uint8_t* r = row == 0 ? r0 : r1;
#pragma unroll
      for (int pr = 0; pr < 2; ++pr) {  // pr 0: dims 4t,4t+1 (+16); pr 1: dims 4t+2,4t+3 (+16)
        const std::uint32_t y = prmt(lds16(r + off + 2 * pr), 0u, 0x5140);  // the two bytes to bytes 0 and 2
        A0[row + 2 * pr] = q4_lo_h2(y);  // a[0]/a[2]: row g; a[1]/a[3]: row g+8
        A1[row + 2 * pr] = q4_hi_h2(y);
      }
    }
  }
}

// v_frag32 (below) of q8_0, q4_0 / q4_0_rot and the byte formats (two tokens' codes per f16 pair).
template <HF F>
__device__ __forceinline__ void v_frag32_bytes(const std::uint8_t* const (&v)[4], int blk, int g, std::uint32_t (&A0)[4],
                                               std::uint32_t (&A1)[4]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // tokens (2t, 2t+1) -> a[0], a[1]; (2t+8, 2t+9) -> a[2], a[3]
    const std::uint8_t* va = v[2 * half];
    const std::uint8_t* vb = v[2 * half + 1];
    if constexpr (is_q4(F)) {
      const int off = 18 * blk + 2 + 2 * g;
      const std::uint32_t x = prmt(lds16(va + off), lds16(vb + off), 0x5410);  // token a's bytes 0, 1; b's 2, 3
      A0[2 * half] = q4_lo_h2(x);            // dim 2g: low nibbles of bytes 0, 2
      A0[2 * half + 1] = q4_lo_h2(x >> 8);   // dim 2g + 1: of bytes 1, 3
      A1[2 * half] = q4_hi_h2(x);            // dims + 16: the high nibbles
      A1[2 * half + 1] = q4_hi_h2(x >> 8);
    } else {
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        std::uint32_t (&A)[4] = jj == 0 ? A0 : A1;
        const int off = (F == HF::q8_0 ? 34 * blk + 2 : 32 * blk) + 16 * jj + 2 * g;
        const std::uint32_t wa = lds16(va + off), wb = lds16(vb + off);
        if constexpr (F == HF::int8 || F == HF::q8_0) {
          const std::uint32_t x = prmt(wa, wb, 0x5410) ^ 0x80808080u;
          A[2 * half] = hsub2u(prmt(x, kMagic, 0x4240), kI8Off);
          A[2 * half + 1] = hsub2u(prmt(x, kMagic, 0x4341), kI8Off);
        } else if constexpr (F == HF::fp8_e4m3) {
          const std::uint32_t y = prmt(wa, wb, 0x5140);
          A[2 * half] = e4m3x2_to_h2(y);
          A[2 * half + 1] = e4m3x2_to_h2(y >> 16);
        } else {  // e5m2
          A[2 * half] = prmt(wa, wb, 0x4202);
          A[2 * half + 1] = prmt(wa, wb, 0x5212);
        }
      }
    }
  }
}


// V^T fragments of one 32-dim block (m-tiles 2*blk, 2*blk+1): m-tile i row g <-> dim 16i + 2g,
// row g+8 <-> dim 16i + 2g + 1; k-slots are the tile's tokens (2t, 2t+1, 2t+8, 2t+9).
// v[k]: V cells of tokens 2t, 2t+1, 2t+8, 2t+9.
template <HF F>
__device__ __forceinline__ void v_frag32(const std::uint8_t* const (&v)[4], int blk, int g, std::uint32_t (&A0)[4],
                                         std::uint32_t (&A1)[4]) {
  if constexpr (is_e2m1(F)) {
    // mxfp4 / nvfp4: dims 16i + 2g, 16i + 2g + 1 are the low and high nibbles of byte 8i + g, so
    // m-tile i (one nvfp4 16-block) takes one byte per token: the four tokens' bytes side by side,
    // h[0] = low nibbles of tokens 2t, 2t+1 (a0: row g), h[1] their high nibbles (a1: row g+8),
    // h[2], h[3] those of tokens 2t+8, 2t+9 (a2, a3).
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      std::uint32_t (&A)[4] = jj == 0 ? A0 : A1;
      const int off = 16 * blk + 8 * jj + g;
      std::uint32_t h[4];
      e2m1x8_to_h2(static_cast<std::uint32_t>(v[0][off]) | (static_cast<std::uint32_t>(v[1][off]) << 8) |
                       (static_cast<std::uint32_t>(v[2][off]) << 16) | (static_cast<std::uint32_t>(v[3][off]) << 24),
                   h);
      A[0] = h[0];
      A[1] = h[1];
      A[2] = h[2];
      A[3] = h[3];
    }
  } else {
    v_frag32_bytes<F>(v, blk, g, A0, A1);
  }
}

// Exact power-of-two normalisation: scale = 2^ceil-ish(log2 mx) > mx, inv = 1/scale (both exact).
__device__ __forceinline__ void pow2_norm(float mx, float& scale, float& inv) {
  if (!(mx > 0.0f)) {
    scale = inv = 1.0f;
    return;
  }
  // E <= 252 for every scale a store writes: f16, E4M3, binary32 per-(token, head) scales (<= FLT_MAX / 127)
  // and UE8M0 codes (<= 2^125); a binary32 subnormal (E = 0: UE8M0 2^-127, a tiny per-token-head
  // scale) gets 2^-126 and 2^126, still exact.
  const unsigned E = (__float_as_uint(mx) >> 23) & 0xFFu;
  scale = __uint_as_float((E + 1u) << 23);
  inv = __uint_as_float((253u - E) << 23);
}

// Matrix mi = lane/8 of one 32-dim block of a 16-token tile: tokens 8*(mi&1) + lane%8, dims
// 16*(mi>>1) .. +16. Non-transposed, lane (g, t) gets token g (+8) dims 4t..4t+3 of the half:
// the K fragment words; transposed, it gets tokens 2t, 2t+1 of dims 2g, 2g+1: the V^T words.
__device__ __forceinline__ const std::uint8_t* ldsm_row(const std::uint8_t* tile, int stride, int blk, int lane) {
  const int mi = lane >> 3;
  return tile + (8 * (mi & 1) + (lane & 7)) * stride + 32 * blk + 16 * (mi >> 1);
}

// 16-bit V^T fragment of m-tile i (dims 16i..16i+15) of a 16-token tile: matrix mi = lane/8 holds
// tokens 8*(mi>>1) + lane%8, dims 16i + 8*(mi&1) .. +8; transposed, lane (g, t) gets a0..a7 of
// A = V^T (row = dim 16i + g (+8), k = tokens 2t, 2t+1 (+8)).
__device__ __forceinline__ const std::uint8_t* ldsm_row_v16(const std::uint8_t* tile, int stride, int i, int lane) {
  const int mi = lane >> 3;
  return tile + (8 * (mi >> 1) + (lane & 7)) * stride + 32 * i + 16 * (mi & 1);
}

template <HF F>
__device__ __forceinline__ void k_frag32_ldsm(const std::uint8_t* tile, int stride, int blk, int lane,
                                              std::uint32_t (&A0)[4], std::uint32_t (&A1)[4]) {
  constexpr HF C = code_half<F>();
  std::uint32_t w[4];
  ldsm_x4(ldsm_row(tile, stride, blk, lane), w);  // w0: (g, jj0) w1: (g+8, jj0) w2: (g, jj1) w3: (g+8, jj1)
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    std::uint32_t (&A)[4] = q < 2 ? A0 : A1;
    const int row = q & 1;
    if constexpr (C == HF::int8) {
      i8x4_to_h2(w[q], A[row], A[row + 2]);
    } else if constexpr (C == HF::fp8_e4m3) {
      A[row] = e4m3x2_to_h2(w[q]);
      A[row + 2] = e4m3x2_to_h2(w[q] >> 16);
    } else {
      A[row] = prmt(w[q], 0u, 0x1404);
      A[row + 2] = prmt(w[q], 0u, 0x3424);
    }
  }
}

template <HF F>
__device__ __forceinline__ void v_frag32_ldsm(const std::uint8_t* tile, int stride, int blk, int lane,
                                              std::uint32_t (&A0)[4], std::uint32_t (&A1)[4]) {
  constexpr HF C = code_half<F>();
  std::uint32_t x[4];
  ldsm_x4_t(ldsm_row(tile, stride, blk, lane), x);  // x = [v(2t,2g), v(2t,2g+1), v(2t+1,2g), v(2t+1,2g+1)]
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    std::uint32_t (&A)[4] = q < 2 ? A0 : A1;
    const int half = q & 1;  // tokens (2t, 2t+1) or (2t+8, 2t+9)
    if constexpr (C == HF::int8) {
      const std::uint32_t xb = x[q] ^ 0x80808080u;
      A[2 * half] = hsub2u(prmt(xb, kMagic, 0x4240), kI8Off);
      A[2 * half + 1] = hsub2u(prmt(xb, kMagic, 0x4341), kI8Off);
    } else if constexpr (C == HF::fp8_e4m3) {
      const std::uint32_t y = prmt(x[q], x[q], 0x3120);
      A[2 * half] = e4m3x2_to_h2(y);
      A[2 * half + 1] = e4m3x2_to_h2(y >> 16);
    } else {
      A[2 * half] = prmt(x[q], 0u, 0x2404);
      A[2 * half + 1] = prmt(x[q], 0u, 0x3414);
    }
  }
}

// One code byte per element, rows read by ldmatrix (the per-(token, head) halves and mxfp8 too:
// their scales sit after the codes, code_half converts).
template <HF F>
KVGATE_HD constexpr bool byte_half() {
  constexpr HF C = code_half<F>();
  return C == HF::int8 || C == HF::fp8_e4m3 || C == HF::fp8_e5m2;
}

// ---- the staged scales ---------------------------------------------------------------------------
// The scale of token u's cell (stage row `row`, h = 0: K, 1: V): int8's f16 from the stage's scale
// words; a per-(token, head) half's binary32, staged after its CB code bytes (4-byte aligned).
template <HF F, int CB>
__device__ __forceinline__ float staged_cell_scale(const std::uint8_t* row, const std::uint8_t* scw, const std::uint8_t* par,
                                                   int u, int h) {
  if constexpr (F == HF::int8) return stage_int8_scale(scw, par, u, h);
  else return *reinterpret_cast<const float*>(row + CB);
}
// The scale of block b of a staged cell row (`par`: the token's parity byte): q8_0 / q4_0 their
// 32-block's f16 d (embedded); mxfp8 / mxfp4 their 32-block's UE8M0 code, 2^(c - 127) exactly;
// nvfp4 its 16-block's E4M3 code, exactly (the global scale is folded into q and the output). The
// 2026 halves' codes are staged after the cell's codes, at byte 2 x parity of the staged word
// where a cell has 2 (mxfp8 / mxfp4 at D = 64; decode.cuh WarpKvPipe::copy_cell_scales).
template <HF F, int D>
__device__ __forceinline__ float staged_block_scale(const std::uint8_t* row, int par, int b) {
  if constexpr (is_block32(F)) {
    return h2f(lds16(row + block_bytes(F) * b));
  } else {
    const std::uint8_t c = row[cell_bytes(F, D) + (cell_scale_bytes(F, D) < 4 ? 2 * par : 0) + b];
    if constexpr (F == HF::nvfp4) return e4m3_val(c);
    else return e8m0_val(c);
  }
}

// ---- the kernel, assembled from named steps ----------------------------------------------------
// decode_mma_kernel = load_q_warp + mma_q_fragments, then per pipeline stage (WarpKvPipe):
//   mma_compute_qk          S^T = K Q^T of the stage's 16-token tile (dequant in registers, K
//                           scales, the length mask);
//   mma_update_local_state  online softmax of heads 2t, 2t+1 (running max, P = exp2(S - m), the
//                           rescale of l and O);
//   mma_p_fragments         P^T B fragments (shuffles from the S C-fragment layout);
//   mma_compute_pv          O^T += V^T P^T (V dequant in registers, V scales folded into P against a
//                           running power-of-two reference);
// and mma_write_partials (l summed across lanes, hi + lo columns merged, the split's partials).

// Compile-time choices of one (K, V, D) instantiation.
template <HF KF, HF VF, int D>
struct MmaTraits {
  using Cfg = MmaCfg<KF, VF, D>;
  static constexpr int NT = Cfg::NT, MT = Cfg::MTILES, NBLK = Cfg::NBLK, KSTEPS = Cfg::KSTEPS;
  // Q^T and P^T are split into NQ / NP terms of K's / V's MMA operand type.
  static constexpr int NQ = split_terms<KF>(), NP = split_terms<VF>();
  // Column packing (see the top of the file): both halves narrow, i.e. two f16 terms each.
  static constexpr bool kPack = !wide16_half<KF>() && !wide16_half<VF>();
  static_assert(!kPack || (NQ == 2 && NP == 2 && kHeadsPerCta == 4), "column packing needs 2 terms and 4 heads");
  // K scales: one FP32 score accumulator per 32-dim block (q8_0, q4_0, mxfp8, mxfp4) or per 16-dim
  // block (nvfp4: one k-step each), or one scale per token after the sum (int8, per-(token, head)).
  static constexpr bool k_blockscaled = is_block32(KF) || is_mx(KF), k_block16 = KF == HF::nvfp4;
  static constexpr bool k_cellscaled = KF == HF::int8 || is_per_token_head(KF);
  // V scales: per token and block (VG dims: 32, nvfp4 16), or per token.
  static constexpr bool v_blockscaled = is_block32(VF) || is_mx(VF) || VF == HF::nvfp4;
  static constexpr bool v_cellscaled = VF == HF::int8 || is_per_token_head(VF);
  static constexpr bool v_scaled = v_blockscaled || v_cellscaled;
  static constexpr int VG = VF == HF::nvfp4 ? 16 : 32;
  static constexpr int NVREF = v_blockscaled ? D / VG : 1;  // V scale references (per V scale group or one)
  // The V scale reference of m-tile i (output dims 16i .. 16i + 15, inside one scale group).
  KVGATE_HD static constexpr int vref_of(int i) { return v_blockscaled ? i * 16 / VG : 0; }
  using Pipe = WarpKvPipe<KF, VF, D, Cfg>;
  using QFrag = std::uint32_t[NQ][KSTEPS][2];
};

// Where a lane sits in the m16n8k16 fragments: g = lane / 4, t = lane % 4; the B column g carries
// head col_head, term col_term (0: hi, 1: lo) when columns are packed.
struct MmaLane {
  int lane, g, t, col_head, col_term;
};
template <HF KF, HF VF, int D>
__device__ __forceinline__ MmaLane mma_lane(int lane) {
  constexpr bool kPack = MmaTraits<KF, VF, D>::kPack;
  const int g = lane >> 2, t = lane & 3;
  return {lane, g, t, kPack ? (g & 3) : g, kPack ? (g >> 2) : 0};
}

// The running state of one warp: O^T accumulators (m-tile i, rows g / g + 8, heads 2t, 2t+1), the
// softmax max and sum of heads 2t, 2t+1, and the running power-of-two reference of the V scales
// (int8, per-(token, head): one; q8_0/q4_0/mxfp8/mxfp4: one per 32-dim block; nvfp4: one per 16-dim
// block, i.e. per m-tile): O accumulates sum p * (scale / vref) * code, rescaled exactly when vref
// grows, like the softmax max; the epilogue multiplies by vref.
template <HF KF, HF VF, int D>
struct MmaState {
  using T = MmaTraits<KF, VF, D>;
  float o[T::MT][4];
  float m[2], l[2];  // heads 2t, 2t+1
  float vref[T::NVREF];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int i = 0; i < T::MT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
#pragma unroll
    for (int k = 0; k < T::NVREF; ++k) vref[k] = 0.0f;
  }
  // Raises reference k to cover the tile's largest V scale (rescaling its O rows exactly) and
  // returns 1 / vref[k]. Each lane passes the largest scale of its own tokens (mx_lane); lanes
  // t = 0..3 of a row hold the tile's 16 tokens (every row alike). A vote skips the reduction
  // when no lane's scale exceeds the reference: then neither does the tile's maximum, so the
  // result is the one the reduction would give.
  __device__ __forceinline__ float raise_vref(int k, float mx_lane) {
    if (__any_sync(0xffffffffu, mx_lane > vref[k])) {
      float mx = fmaxf(mx_lane, __shfl_xor_sync(0xffffffffu, mx_lane, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      raise_vref_to(k, mx);
    }
    return vref_inverse(vref[k]);
  }
  // 1 / r for the references pow2_norm makes (0 before the first raise, a normal power of two
  // 2^e after, or -0 when an infinite scale overflowed the exponent), without a division: 2^-e
  // is the exponent field's complement to 254, exact; anything not > 0 gives 0, like 1 / r did.
  __device__ static __forceinline__ float vref_inverse(float r) {
    return r > 0.0f ? __uint_as_float((254u << 23) - __float_as_uint(r)) : 0.0f;
  }
  // Warp-uniform mx: the reference rises to a power of two above it, O rescaled exactly.
  __device__ __forceinline__ void raise_vref_to(int k, float mx) {
    if (mx > vref[k]) {
      float sc, iv;
      pow2_norm(mx, sc, iv);
      const float f = vref[k] * iv;  // exact: powers of two (0 on the first raise)
#pragma unroll
      for (int i = 0; i < T::MT; ++i)
        if (T::vref_of(i) == k) {
          o[i][0] *= f;
          o[i][1] *= f;
          o[i][2] *= f;
          o[i][3] *= f;
        }
      vref[k] = sc;
    }
  }
};

// Q^T fragments (column n = head g; zero for the padding columns 4..7), split into NQ terms of
// K's MMA operand type. k-slot mapping (pr 0: k-slots 2t, 2t+1; pr 1: 2t+8, 2t+9): natural for
// 16-bit K (ldmatrix); dims 16j + 4t + 2pr, +1 for byte and q8_0/q4_0 K; dims 16j + 4t + pr, +2 for
// E2M1 K (k_frag32 pairs the low nibbles, then the high ones).
template <HF KF, HF VF, int D>
__device__ __forceinline__ void mma_q_fragments(const float* q_s, const MmaLane& ln,
                                                typename MmaTraits<KF, VF, D>::QFrag& qf) {
  using T = MmaTraits<KF, VF, D>;
  constexpr int NQ = T::NQ;
#pragma unroll
  for (int j = 0; j < T::KSTEPS; ++j)
#pragma unroll
    for (int pr = 0; pr < 2; ++pr) {
      const int d0 = wide16_half<KF>() ? 16 * j + 2 * ln.t + 8 * pr
                     : is_e2m1(KF)     ? 16 * j + 4 * ln.t + pr
                                       : 16 * j + 4 * ln.t + 2 * pr;
      const int d1 = is_e2m1(KF) ? d0 + 2 : d0 + 1;
      const float x0 = ln.col_head < kHeadsPerCta ? q_s[ln.col_head * D + d0] : 0.0f;
      const float x1 = ln.col_head < kHeadsPerCta ? q_s[ln.col_head * D + d1] : 0.0f;
      std::uint32_t tmp[NQ];
      split_terms_h2<KF>(x0, x1, tmp);
      if constexpr (T::kPack) {
        qf[0][j][pr] = ln.col_term == 0 ? tmp[0] : tmp[1];
      } else {
#pragma unroll
        for (int q = 0; q < NQ; ++q) qf[q][j][pr] = tmp[q];
      }
    }
}

// S^T = K Q^T, one 16-token tile at a time (independent accumulator chains), times the K scales,
// soft-capped when c2 > 0 (decode.cuh softcap2); tokens at or past t_end get -inf.
template <HF KF, HF VF, int D>
__device__ __forceinline__ void mma_compute_qk(const std::uint8_t* sb, const typename MmaTraits<KF, VF, D>::QFrag& qf,
                                               const MmaLane& ln, int tbase, int t_end, float c2,
                                               float (&s)[MmaTraits<KF, VF, D>::NT][4]) {
  using T = MmaTraits<KF, VF, D>;
  using Cfg = typename T::Cfg;
  constexpr int NQ = T::NQ;
  constexpr bool kPack = T::kPack;
  const int lane = ln.lane, g = ln.g, t = ln.t;
  const std::uint8_t* kcell = T::Pipe::k_cells(sb);
  const std::uint8_t* scw = T::Pipe::scale_words(sb);
  const std::uint8_t* par = T::Pipe::parity(sb);
#pragma unroll
  for (int tl = 0; tl < T::NT; ++tl) {
    const std::uint8_t* r0 = kcell + (16 * tl + g) * Cfg::SK;
    const std::uint8_t* r1 = kcell + (16 * tl + g + 8) * Cfg::SK;
    float sh[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sl[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (wide16_half<KF>()) {
      float sm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < Cfg::KSTEPS; ++j) {
        std::uint32_t A[4];
        ldsm_x4(ldsm_row(kcell + 16 * tl * Cfg::SK, Cfg::SK, j, lane), A);
        mma_as<KF>(sh, A, qf[0][j][0], qf[0][j][1]);
        mma_as<KF>(sl, A, qf[NQ - 1][j][0], qf[NQ - 1][j][1]);
        if constexpr (NQ == 3) mma_as<KF>(sm, A, qf[1][j][0], qf[1][j][1]);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) sl[k] += sm[k];
    } else {
#pragma unroll
      for (int blk = 0; blk < T::NBLK; ++blk) {
        std::uint32_t A0[4], A1[4];
        if constexpr (byte_half<KF>()) k_frag32_ldsm<KF>(kcell + 16 * tl * Cfg::SK, Cfg::SK, blk, lane, A0, A1);
        else k_frag32<KF>(r0, r1, blk, t, A0, A1);
        if constexpr (T::k_blockscaled || T::k_block16) {
          float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cl[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          if constexpr (kPack) {  // hi or lo column per lane; two independent chains (the two 16-dim halves)
            mma16816(c, A0, qf[0][2 * blk][0], qf[0][2 * blk][1]);
            mma16816(cl, A1, qf[0][2 * blk + 1][0], qf[0][2 * blk + 1][1]);
          } else if constexpr (T::k_block16) {  // c: the first 16-dim block (hi + lo), cl: the second
            mma16816(c, A0, qf[0][2 * blk][0], qf[0][2 * blk][1]);
            mma16816(cl, A1, qf[0][2 * blk + 1][0], qf[0][2 * blk + 1][1]);
            mma16816(c, A0, qf[1][2 * blk][0], qf[1][2 * blk][1]);
            mma16816(cl, A1, qf[1][2 * blk + 1][0], qf[1][2 * blk + 1][1]);
          } else {
            mma16816(c, A0, qf[0][2 * blk][0], qf[0][2 * blk][1]);
            mma16816(cl, A0, qf[1][2 * blk][0], qf[1][2 * blk][1]);
            mma16816(c, A1, qf[0][2 * blk + 1][0], qf[0][2 * blk + 1][1]);
            mma16816(cl, A1, qf[1][2 * blk + 1][0], qf[1][2 * blk + 1][1]);
          }
          const int p0 = is_mx(KF) ? par[16 * tl + g] : 0, p1 = is_mx(KF) ? par[16 * tl + g + 8] : 0;  // rows g, g+8
          if constexpr (T::k_block16) {  // nvfp4: c and cl are the two 16-blocks, each its own scale
            const float a0 = staged_block_scale<KF, D>(r0, p0, 2 * blk), b0 = staged_block_scale<KF, D>(r0, p0, 2 * blk + 1);
            const float a1 = staged_block_scale<KF, D>(r1, p1, 2 * blk), b1 = staged_block_scale<KF, D>(r1, p1, 2 * blk + 1);
            sh[0] = fmaf(cl[0], b0, fmaf(c[0], a0, sh[0]));
            sh[1] = fmaf(cl[1], b0, fmaf(c[1], a0, sh[1]));
            sh[2] = fmaf(cl[2], b1, fmaf(c[2], a1, sh[2]));
            sh[3] = fmaf(cl[3], b1, fmaf(c[3], a1, sh[3]));
          } else {
            const float d0 = staged_block_scale<KF, D>(r0, p0, blk), d1 = staged_block_scale<KF, D>(r1, p1, blk);
            sh[0] = fmaf(c[0] + cl[0], d0, sh[0]);
            sh[1] = fmaf(c[1] + cl[1], d0, sh[1]);
            sh[2] = fmaf(c[2] + cl[2], d1, sh[2]);
            sh[3] = fmaf(c[3] + cl[3], d1, sh[3]);
          }
        } else if constexpr (kPack) {  // two independent chains (the two 16-dim halves of the block)
          mma16816(sh, A0, qf[0][2 * blk][0], qf[0][2 * blk][1]);
          mma16816(sl, A1, qf[0][2 * blk + 1][0], qf[0][2 * blk + 1][1]);
        } else {
          mma16816(sh, A0, qf[0][2 * blk][0], qf[0][2 * blk][1]);
          mma16816(sl, A0, qf[1][2 * blk][0], qf[1][2 * blk][1]);
          mma16816(sh, A1, qf[0][2 * blk + 1][0], qf[0][2 * blk + 1][1]);
          mma16816(sl, A1, qf[1][2 * blk + 1][0], qf[1][2 * blk + 1][1]);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) s[tl][k] = sh[k] + sl[k];
    if constexpr (kPack) {  // hi column (lane t < 2) + lo column (lane t + 2) of the same head
#pragma unroll
      for (int k = 0; k < 4; ++k) s[tl][k] += __shfl_xor_sync(0xffffffffu, s[tl][k], 2);
    }
    if constexpr (T::k_cellscaled) {  // int8, per-(token, head): the token's scale times its score
      const int u0 = 16 * tl + g, u1 = u0 + 8;
      const float k0 = staged_cell_scale<KF, Cfg::CBK>(r0, scw, par, u0, 0);
      const float k1 = staged_cell_scale<KF, Cfg::CBK>(r1, scw, par, u1, 0);
      s[tl][0] *= k0;
      s[tl][1] *= k0;
      s[tl][2] *= k1;
      s[tl][3] *= k1;
    }
    if (c2 > 0.0f) {
#pragma unroll
      for (int k = 0; k < 4; ++k) s[tl][k] = softcap2(s[tl][k], c2);
    }
    if (tbase + 16 * tl + g >= t_end) s[tl][0] = s[tl][1] = -INFINITY;
    if (tbase + 16 * tl + g + 8 >= t_end) s[tl][2] = s[tl][3] = -INFINITY;
  }
}

// Online softmax over the stage (heads 2t, 2t+1): the running max grows (l and O rescaled by
// exp2(m_old - m_new)), p = exp2(s - m), l += the lane's p.
template <HF KF, HF VF, int D>
__device__ __forceinline__ void mma_update_local_state(const float (&s)[MmaTraits<KF, VF, D>::NT][4],
                                                       MmaState<KF, VF, D>& st,
                                                       float (&p)[MmaTraits<KF, VF, D>::NT][4]) {
  using T = MmaTraits<KF, VF, D>;
  // The lane's own maximum per head; the tile's (over the 8 rows g) only when some lane's exceeds
  // the running max: otherwise no head's maximum grows and the reduction would change nothing
  // (the max rarely grows after the first tiles, so most tiles skip its three dependent shuffles).
  float mx[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    mx[hh] = -INFINITY;
#pragma unroll
    for (int tl = 0; tl < T::NT; ++tl) mx[hh] = fmaxf(mx[hh], fmaxf(s[tl][hh], s[tl][2 + hh]));
  }
  if (__any_sync(0xffffffffu, mx[0] > st.m[0] || mx[1] > st.m[1])) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 4));
      mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 8));
      mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 16));
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      if (mx[hh] > st.m[hh]) {
        const float corr = safe_exp2_diff(st.m[hh], mx[hh]);
        st.l[hh] *= corr;
#pragma unroll
        for (int i = 0; i < T::MT; ++i) {
          st.o[i][hh] *= corr;
          st.o[i][2 + hh] *= corr;
        }
        st.m[hh] = mx[hh];
      }
    }
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const bool live = st.m[hh] != -INFINITY;
#pragma unroll
    for (int tl = 0; tl < T::NT; ++tl) {
      p[tl][hh] = live ? exp2f(s[tl][hh] - st.m[hh]) : 0.0f;
      p[tl][2 + hh] = live ? exp2f(s[tl][2 + hh] - st.m[hh]) : 0.0f;
      st.l[hh] += p[tl][hh] + p[tl][2 + hh];
    }
  }
}

// P^T fragments: lane (g, t) needs head g at tile tokens 2t, 2t+1, 2t+8, 2t+9 (zero for padding columns).
template <HF KF, HF VF, int D>
__device__ __forceinline__ void mma_p_fragments(const float (&p)[MmaTraits<KF, VF, D>::NT][4], const MmaLane& ln,
                                                float (&bt)[MmaTraits<KF, VF, D>::NT][4]) {
  using T = MmaTraits<KF, VF, D>;
  const int srcA = 8 * ln.t + (ln.col_head >> 1), srcB = srcA + 4;
  const bool odd = ln.col_head & 1;
#pragma unroll
  for (int tl = 0; tl < T::NT; ++tl) {
    float pa[4], pb[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      pa[k] = __shfl_sync(0xffffffffu, p[tl][k], srcA);
      pb[k] = __shfl_sync(0xffffffffu, p[tl][k], srcB);
    }
    bt[tl][0] = odd ? pa[1] : pa[0];
    bt[tl][1] = odd ? pb[1] : pb[0];
    bt[tl][2] = odd ? pa[3] : pa[2];
    bt[tl][3] = odd ? pb[3] : pb[2];
    if (ln.col_head >= kHeadsPerCta) bt[tl][0] = bt[tl][1] = bt[tl][2] = bt[tl][3] = 0.0f;
  }
}

// O^T += V^T P^T over the stage: 16-bit V by ldmatrix as stored; narrow V dequantized per 32-dim
// block, its scales folded into P (normalised by the running reference vref): a token's scale once
// for the whole stage, a block format's per scale group (the m-tiles of that group's dims).
template <HF KF, HF VF, int D>
__device__ __forceinline__ void mma_compute_pv(const std::uint8_t* sb, const float (&bt)[MmaTraits<KF, VF, D>::NT][4],
                                               const MmaLane& ln, MmaState<KF, VF, D>& st) {
  using T = MmaTraits<KF, VF, D>;
  using Cfg = typename T::Cfg;
  constexpr int NT = T::NT, NP = T::NP;
  constexpr bool kPack = T::kPack;
  const int lane = ln.lane, g = ln.g, t = ln.t;
  const std::uint8_t* vcell = T::Pipe::v_cells(sb);
  const std::uint8_t* scw = T::Pipe::scale_words(sb);
  const std::uint8_t* par = T::Pipe::parity(sb);
  const int tk[4] = {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};

  std::uint32_t pf[NT][NP][2];  // P^T B fragments (k = tokens 2t,2t+1 | 2t+8,2t+9; n = head g), NP terms
  auto set_pf = [&](int tl, int pair, float x0, float x1) {
    std::uint32_t tmp[NP];
    split_terms_h2<VF>(x0, x1, tmp);
    if constexpr (kPack) {
      pf[tl][0][pair] = ln.col_term == 0 ? tmp[0] : tmp[1];
    } else {
#pragma unroll
      for (int q = 0; q < NP; ++q) pf[tl][q][pair] = tmp[q];
    }
  };
  if constexpr (T::v_cellscaled) {  // int8 (f16), per-(token, head) (binary32): scales >= 0
    float sv[NT][4], mx = 0.0f;
#pragma unroll
    for (int tl = 0; tl < NT; ++tl)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        sv[tl][k] = staged_cell_scale<VF, Cfg::CBV>(vcell + (16 * tl + tk[k]) * Cfg::SV, scw, par, 16 * tl + tk[k], 1);
        mx = fmaxf(mx, sv[tl][k]);
      }
    const float inv = st.raise_vref(0, mx);
#pragma unroll
    for (int tl = 0; tl < NT; ++tl) {
      set_pf(tl, 0, bt[tl][0] * (sv[tl][0] * inv), bt[tl][1] * (sv[tl][1] * inv));
      set_pf(tl, 1, bt[tl][2] * (sv[tl][2] * inv), bt[tl][3] * (sv[tl][3] * inv));
    }
  } else if constexpr (!T::v_blockscaled) {  // fp8 (scale after the merge), f16, bf16: P as is
#pragma unroll
    for (int tl = 0; tl < NT; ++tl) {
      set_pf(tl, 0, bt[tl][0], bt[tl][1]);
      set_pf(tl, 1, bt[tl][2], bt[tl][3]);
    }
  }
  if constexpr (wide16_half<VF>()) {
#pragma unroll
    for (int i = 0; i < T::MT; ++i)
#pragma unroll
      for (int tl = 0; tl < NT; ++tl) {
        std::uint32_t A[4];
        ldsm_x4_t(ldsm_row_v16(vcell + 16 * tl * Cfg::SV, Cfg::SV, i, lane), A);
#pragma unroll
        for (int q = NP - 1; q >= 0; --q) mma_as<VF>(st.o[i], A, pf[tl][q][0], pf[tl][q][1]);
      }
  } else {
#pragma unroll
    for (int blk = 0; blk < T::NBLK; ++blk) {
      std::uint32_t A0[NT][4], A1[NT][4];
#pragma unroll
      for (int tl = 0; tl < NT; ++tl) {
        if constexpr (byte_half<VF>()) {
          v_frag32_ldsm<VF>(vcell + 16 * tl * Cfg::SV, Cfg::SV, blk, lane, A0[tl], A1[tl]);
        } else {
          const std::uint8_t* const vr[4] = {vcell + (16 * tl + tk[0]) * Cfg::SV, vcell + (16 * tl + tk[1]) * Cfg::SV,
                                             vcell + (16 * tl + tk[2]) * Cfg::SV, vcell + (16 * tl + tk[3]) * Cfg::SV};
          v_frag32<VF>(vr, blk, g, A0[tl], A1[tl]);
        }
      }
      // The block's m-tiles 2 blk (A0) and 2 blk + 1 (A1) += V^T P^T with the current pf; for a
      // block-scaled V only the m-tiles of one scale group at a time (lo_tile / hi_tile).
      auto mma_block = [&](bool lo_tile, bool hi_tile) {
#pragma unroll
        for (int tl = 0; tl < NT; ++tl) {
          if constexpr (!kPack) {
            if (lo_tile) mma16816(st.o[2 * blk], A0[tl], pf[tl][1][0], pf[tl][1][1]);
            if (hi_tile) mma16816(st.o[2 * blk + 1], A1[tl], pf[tl][1][0], pf[tl][1][1]);
          }
          if (lo_tile) mma16816(st.o[2 * blk], A0[tl], pf[tl][0][0], pf[tl][0][1]);
          if (hi_tile) mma16816(st.o[2 * blk + 1], A1[tl], pf[tl][0][0], pf[tl][0][1]);
        }
      };
      if constexpr (T::v_blockscaled) {
        constexpr int NG = 32 / T::VG;  // scale groups per 32-dim block: 1, or 2 (nvfp4)
#pragma unroll
        for (int sg = 0; sg < NG; ++sg) {
          const int grp = NG * blk + sg;  // the group's block index (32-block, or nvfp4 16-block)
          float dv[NT][4], mx = 0.0f;
#pragma unroll
          for (int tl = 0; tl < NT; ++tl)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const int u = 16 * tl + tk[k];
              dv[tl][k] = staged_block_scale<VF, D>(vcell + u * Cfg::SV, is_mx(VF) ? par[u] : 0, grp);
              mx = fmaxf(mx, fabsf(dv[tl][k]));
            }
          const float inv = st.raise_vref(grp, mx);
          // the sign of d travels with the weight (q4_0 d is negative for positive extremes)
#pragma unroll
          for (int tl = 0; tl < NT; ++tl) {
            set_pf(tl, 0, bt[tl][0] * (dv[tl][0] * inv), bt[tl][1] * (dv[tl][1] * inv));
            set_pf(tl, 1, bt[tl][2] * (dv[tl][2] * inv), bt[tl][3] * (dv[tl][3] * inv));
          }
          mma_block(NG == 1 || sg == 0, NG == 1 || sg == 1);
        }
      } else {
        mma_block(true, true);
      }
    }
  }
}

// The warp covered the whole split for its heads: l summed over the 8 lanes with the same t (m is
// already uniform across them), O's hi + lo columns merged, the partials written directly.
template <HF KF, HF VF, int D>
__device__ __forceinline__ void mma_write_partials(const DecodeLaunch& a, MmaState<KF, VF, D>& st, const MmaLane& ln,
                                                   int b, int split, int hq0, int nh) {
  using T = MmaTraits<KF, VF, D>;
  constexpr bool kPack = T::kPack;
  const int g = ln.g, t = ln.t;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    st.l[hh] += __shfl_xor_sync(0xffffffffu, st.l[hh], 4);
    st.l[hh] += __shfl_xor_sync(0xffffffffu, st.l[hh], 8);
    st.l[hh] += __shfl_xor_sync(0xffffffffu, st.l[hh], 16);
  }
  if constexpr (kPack) {  // O's hi columns (lanes t < 2) + lo columns (lanes t + 2)
#pragma unroll
    for (int i = 0; i < T::MT; ++i)
#pragma unroll
      for (int k = 0; k < 4; ++k) st.o[i][k] += __shfl_xor_sync(0xffffffffu, st.o[i][k], 2);
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int head = 2 * t + hh;
    if (head < nh && (!kPack || t < 2)) {
      const std::size_t row = (static_cast<std::size_t>(b) * a.splits + split) * a.n_heads + hq0 + head;
      float* po = a.part_o + row * D;
#pragma unroll
      for (int i = 0; i < T::MT; ++i) {
        // rows g, g+8 of m-tile i: dims 16i + g, 16i + g + 8 (16-bit V) or 16i + 2g, 16i + 2g + 1
        const int d0 = wide16_half<VF>() ? 16 * i + g : 16 * i + 2 * g;
        const int d1 = wide16_half<VF>() ? d0 + 8 : d0 + 1;
        const float vr = T::v_scaled ? st.vref[T::vref_of(i)] : 1.0f;
        po[d0] = st.o[i][hh] * vr;
        po[d1] = st.o[i][2 + hh] * vr;
      }
      if (g == 0) {
        a.part_ml[row * 2] = st.m[hh];
        a.part_ml[row * 2 + 1] = st.l[hh];
      }
    }
  }
}

// One warp's work over its split (below): the staging pipeline's way to find cells (PAGED:
// page tiles, else token lookups; decode.cuh WarpKvPipe) is a template argument, so each way is
// compiled with its own registers.
template <HF KF, HF VF, int D, bool PAGED>
__device__ __forceinline__ void decode_mma_warp(const DecodeLaunch& a, std::uint8_t* smem, int lane, int warp, int kvh,
                                                int split, int b, int hq0, int nh, int t_begin, int t_end) {
  using T = MmaTraits<KF, VF, D>;
  using Cfg = typename T::Cfg;
  const MmaLane ln = mma_lane<KF, VF, D>(lane);

  // The first KV copies go out before q is read, so q's load hides behind them; q is staged in the
  // ring's spare stage, which the first acquire() refills only after the __syncwarp below.
  WarpKvPipe<KF, VF, D, Cfg, PAGED> kv(a, a.block_tables + static_cast<std::size_t>(b) * a.table_stride,
                                       smem + warp * Cfg::WARP_SMEM, kvh, t_begin, t_end, lane);
  kv.prologue();
  float* q_s = reinterpret_cast<float*>(kv.spare_stage());
  load_q_warp<is_rot(KF)>(a, b, kvh, hq0, nh, q_s, lane);
  typename T::QFrag qf;
  mma_q_fragments<KF, VF, D>(q_s, ln, qf);
  __syncwarp();  // every lane's reads of q_s before the copies of step STAGES - 1 overwrite it

  MmaState<KF, VF, D> st;
  st.init();
  int step = 0;  // after the loop: the steps it ran (count_read)
  for (; step < kv.n_steps; ++step) {
    const std::uint8_t* sb = kv.acquire(step);
    float s[T::NT][4], p[T::NT][4], bt[T::NT][4];
    mma_compute_qk<KF, VF, D>(sb, qf, ln, t_begin + step * Cfg::TOK, t_end, a.softcap2, s);
    mma_update_local_state<KF, VF, D>(s, st, p);
    mma_p_fragments<KF, VF, D>(p, ln, bt);
    mma_compute_pv<KF, VF, D>(sb, bt, ln, st);
    kv.release();
  }
  kv.drain();
  kv.count_read(step);
  mma_write_partials<KF, VF, D>(a, st, ln, b, split, hq0, nh);
}

template <HF KF, HF VF, int D>
__global__ void __launch_bounds__(kDecodeWarps * 32, MmaCfg<KF, VF, D>::MIN_CTAS) decode_mma_kernel(DecodeLaunch a) {
  allow_dependent_launch();
  extern __shared__ __align__(16) std::uint8_t smem[];
  // Four warps, four KV heads: DRAM sees 4 cells (512 B of int8 at D=128) contiguous per token.
  decode_warp_start<typename MmaTraits<KF, VF, D>::Pipe>(
      a, [&](auto paged, int lane, int warp, int kvh, int split, int b, int hq0, int nh, int t_begin, int t_end) {
        decode_mma_warp<KF, VF, D, decltype(paged)::value>(a, smem, lane, warp, kvh, split, b, hq0, nh, t_begin, t_end);
      });
}

}  // namespace kvgate::cuda::detail
