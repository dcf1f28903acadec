// Split-K flash-decoding over the paged quantized store (docs/CUDA.md has the design).
//
// One CTA = (KV head, query-head chunk of <= 4 heads of its GQA group, split of the context,
// sequence). Each K/V cell is read once per CTA and serves every query head of the chunk, so for
// group sizes <= 4 every KV byte crosses DRAM once. Four warps stream their own tokens through a
// private 3-stage cp.async ring (no CTA-wide barriers in the main loop); codes are dequantized in
// registers, dot products and the P.V accumulation run in FP32 on the CUDA cores with an online
// softmax (base 2). A second tiny kernel merges the splits, applies the per-tensor V scale and, for
// a rotated V, the inverse Walsh-Hadamard transform of the output (H is symmetric and involutory,
// so rotating q once and the output once replaces rotating every K/V row).
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "decode_params.cuh"

namespace kvgate::cuda::detail {

// ---- small device helpers -----------------------------------------------------------------

template <int N>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_size = valid ? N : 0;  // 0: zero-fill, nothing read
  if constexpr (N == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_size));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(gmem), "n"(N), "r"(src_size));
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Programmatic dependent launch (Hopper): the split-K combine is launched as the decode grid's
// programmatic dependent (decode_combine.cu), so once every CTA of a decode grid has executed this,
// the combine's CTAs may be scheduled beside its last ones; they wait (griddepcontrol.wait) for the
// decode grid's completion and memory before reading its partials. Every decode kernel issues it
// first thing; without a programmatic dependent it does nothing.
__device__ __forceinline__ void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }

// ldmatrix of four 8x8 16-bit matrices (rows 16-byte aligned in shared memory; lane l gives the
// address of row l % 8 of matrix l / 8, and receives row l / 4, columns 2 (l % 4), +1 of each):
// the tensor-core decode kernels (byte formats) and the tensor-core prefill (every operand).
__device__ __forceinline__ void ldsm_x4(const void* p, std::uint32_t (&r)[4]) {
  const unsigned sa = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sa));
}
__device__ __forceinline__ void ldsm_x4_t(const void* p, std::uint32_t (&r)[4]) {
  const unsigned sa = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sa));
}
__device__ __forceinline__ float h2f(std::uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Attention-logit soft-cap (Gemma 2's attn_logit_softcapping: s -> cap tanh(s / cap), after the
// scale, before the mask) in the kernels' base-2 score units: with c2 = cap log2(e) the base-2
// score s2 = log2(e) s becomes c2 tanh(s2 / c2). IEEE division, tanhf (<= 2 ulp), one multiply.
__device__ __forceinline__ float softcap2(float s2, float c2) { return c2 * tanhf(s2 / c2); }

// int8 code in byte k of w (two's complement) -> exact float, without I2F: bias to unsigned, place
// under the exponent of 2^23, subtract 2^23 + 128.
__device__ __forceinline__ float i8_at(std::uint32_t w_biased, int k) {
  return __uint_as_float(__byte_perm(w_biased, 0x4B000000u, 0x7440u | static_cast<unsigned>(k))) - 8388736.0f;
}
// nibble n -> n - 8, exactly.
__device__ __forceinline__ float q4_val(std::uint32_t n) { return __uint_as_float(0x4B000000u | n) - 8388616.0f; }

__device__ __forceinline__ void fp8x2_to_f2(std::uint16_t v, bool e4m3, float& a, float& b) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), e4m3 ? __NV_E4M3 : __NV_E5M2);
  const float2 f = __half22float2(__half2(r));
  a = f.x;
  b = f.y;
}

// E4M3 code -> its exact value (NaN codes give NaN), through the f16 conversion of fp8x2_to_f2.
__device__ __forceinline__ float e4m3_val(std::uint8_t c) {
  float a, b;
  fp8x2_to_f2(c, true, a, b);
  return a;
}
// E2M1 nibble (sign in bit 3) -> 0, 0.5, 1, 1.5, 2, 3, 4, 6 with its sign, exactly: magnitude code
// m >= 2 is (2 + (m & 1)) * 2^((m >> 1) - 2), m < 2 is m / 2 (docs/FORMATS.md "mxfp8, mxfp4").
__device__ __forceinline__ float e2m1_val(std::uint32_t n) {
  const std::uint32_t m = n & 7u;
  const float mag = m < 2u ? 0.5f * static_cast<float>(m)
                           : static_cast<float>(2u + (m & 1u)) * __uint_as_float((127u + (m >> 1) - 2u) << 23);
  return (n & 8u) ? -mag : mag;
}
// UE8M0 scale code -> 2^(code - 127) exactly (code 0: the subnormal 2^-127); 0xFF is NaN.
__device__ __forceinline__ float e8m0_val(std::uint32_t c) {
  if (c == 0xFFu) return __uint_as_float(0x7FC00000u);
  return c == 0u ? __uint_as_float(0x00400000u) : __uint_as_float(c << 23);
}

// ---- slices of a cell held by one lane (fast path, D in {64, 128, 256}) ------------------------
// A cell (one token, one KV head, D elements) is read by L = D/16 lanes; lane j holds 16 elements.
// dim(j, e) says which element of the head vector slot e of lane j is; load() returns the code
// values (exact floats) and the scale that multiplies the slice (block d, or 1).

template <HF F, int D>
struct Slice {
  static constexpr int L = D / 16;
  __device__ static constexpr int dim(int j, int e) {
    if constexpr (F == HF::f32) return 4 * ((e / 4) * L + j) + e % 4;
    else if constexpr (F == HF::f16 || F == HF::bf16) return 8 * ((e / 8) * L + j) + e % 8;
    else if constexpr (F == HF::q8_0) return 32 * (j / 2) + 16 * (j % 2) + e;
    else if constexpr (is_q4(F)) return 32 * (j / 2) + (e < 8 ? 8 * (j % 2) + e : 16 + 8 * (j % 2) + (e - 8));
    else return 16 * j + e;  // int8, fp8
  }
  __device__ static void load(const std::uint8_t* cell, int j, float (&x)[16], float& sc) {
    sc = 1.0f;
    if constexpr (F == HF::f32) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float4 v = *reinterpret_cast<const float4*>(cell + 16 * (c * L + j));
        x[4 * c] = v.x;
        x[4 * c + 1] = v.y;
        x[4 * c + 2] = v.z;
        x[4 * c + 3] = v.w;
      }
    } else if constexpr (F == HF::f16 || F == HF::bf16) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const uint4 v = *reinterpret_cast<const uint4*>(cell + 16 * (c * L + j));
        const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if constexpr (F == HF::bf16) {
            x[8 * c + 2 * k] = __uint_as_float(w[k] << 16);
            x[8 * c + 2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
          } else {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
            x[8 * c + 2 * k] = f.x;
            x[8 * c + 2 * k + 1] = f.y;
          }
        }
      }
    } else if constexpr (F == HF::int8) {
      const uint4 v = *reinterpret_cast<const uint4*>(cell + 16 * j);
      const std::uint32_t w[4] = {v.x ^ 0x80808080u, v.y ^ 0x80808080u, v.z ^ 0x80808080u, v.w ^ 0x80808080u};
#pragma unroll
      for (int k = 0; k < 16; ++k) x[k] = i8_at(w[k / 4], k % 4);
    } else if constexpr (is_fp8(F)) {
      const uint4 v = *reinterpret_cast<const uint4*>(cell + 16 * j);
      const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const std::uint16_t pair = static_cast<std::uint16_t>(w[k / 2] >> (16 * (k % 2)));
        fp8x2_to_f2(pair, F == HF::fp8_e4m3, x[2 * k], x[2 * k + 1]);
      }
    } else if constexpr (F == HF::q8_0) {
      const std::uint8_t* blk = cell + 34 * (j / 2);
      sc = h2f(*reinterpret_cast<const std::uint16_t*>(blk));
      const std::uint16_t* c16 = reinterpret_cast<const std::uint16_t*>(blk + 2 + 16 * (j % 2));
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const std::uint32_t w = (static_cast<std::uint32_t>(c16[2 * k]) | (static_cast<std::uint32_t>(c16[2 * k + 1]) << 16)) ^ 0x80808080u;
#pragma unroll
        for (int b = 0; b < 4; ++b) x[4 * k + b] = i8_at(w, b);
      }
    } else {  // q4_0, q4_0_rot (rotated domain)
      const std::uint8_t* blk = cell + 18 * (j / 2);
      sc = h2f(*reinterpret_cast<const std::uint16_t*>(blk));
      const std::uint16_t* c16 = reinterpret_cast<const std::uint16_t*>(blk + 2 + 8 * (j % 2));
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const std::uint32_t w = static_cast<std::uint32_t>(c16[2 * k]) | (static_cast<std::uint32_t>(c16[2 * k + 1]) << 16);
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          x[4 * k + b] = q4_val((w >> (8 * b)) & 0xFu);
          x[8 + 4 * k + b] = q4_val((w >> (8 * b + 4)) & 0xFu);
        }
      }
    }
  }
};

// ---- element accessor (generic path: any D <= 256, blocks may span heads when D < 32) ----------
template <HF F>
__device__ __forceinline__ float load_elem(const std::uint8_t* page, int B, int H, int D, int slot, int h, int i,
                                           float& sc) {
  const std::size_t HD = static_cast<std::size_t>(H) * D;
  const std::size_t r = static_cast<std::size_t>(slot) * HD + static_cast<std::size_t>(h) * D + i;
  sc = 1.0f;
  if constexpr (F == HF::f32) return reinterpret_cast<const float*>(page)[r];
  else if constexpr (F == HF::f16) return h2f(reinterpret_cast<const std::uint16_t*>(page)[r]);
  else if constexpr (F == HF::bf16) return __uint_as_float(static_cast<std::uint32_t>(reinterpret_cast<const std::uint16_t*>(page)[r]) << 16);
  else if constexpr (F == HF::int8) {
    sc = h2f(reinterpret_cast<const std::uint16_t*>(page + static_cast<std::size_t>(B) * HD)[static_cast<std::size_t>(slot) * H + h]);
    return static_cast<float>(reinterpret_cast<const std::int8_t*>(page)[r]);
  } else if constexpr (is_fp8(F)) {
    float a, b;
    fp8x2_to_f2(page[r], F == HF::fp8_e4m3, a, b);
    return a;
  } else if constexpr (F == HF::mxfp8 || F == HF::mxfp4 || F == HF::nvfp4) {
    // docs/FORMATS.md page layout: codes [B][row code bytes], then one scale byte per block
    // [B][HD / blk]; blocks of the token row (they span heads when D < blk).
    constexpr int blk = F == HF::nvfp4 ? 16 : 32;
    const std::size_t e = static_cast<std::size_t>(h) * D + i;  // element of the token row
    const std::size_t row_code_bytes = F == HF::mxfp8 ? HD : HD / 2;
    const std::uint8_t s8 = page[static_cast<std::size_t>(B) * row_code_bytes + static_cast<std::size_t>(slot) * (HD / blk) + e / blk];
    sc = F == HF::nvfp4 ? e4m3_val(s8) : e8m0_val(s8);  // nvfp4: x its global scale, folded by the caller
    if constexpr (F == HF::mxfp8) return e4m3_val(page[r]);
    else return e2m1_val((page[static_cast<std::size_t>(slot) * row_code_bytes + e / 2] >> (4 * (e % 2))) & 0xFu);
  } else if constexpr (F == HF::fp8_per_token_head || F == HF::int8_per_token_head) {
    // codes [B][H][D] bytes, then the cells' binary32 scales [B][H] (read bytewise: the region's
    // offset B*H*D need not be a multiple of 4).
    const std::uint8_t* s4 = page + static_cast<std::size_t>(B) * HD + (static_cast<std::size_t>(slot) * H + h) * 4;
    sc = __uint_as_float(static_cast<std::uint32_t>(s4[0]) | (static_cast<std::uint32_t>(s4[1]) << 8) |
                         (static_cast<std::uint32_t>(s4[2]) << 16) | (static_cast<std::uint32_t>(s4[3]) << 24));
    if constexpr (F == HF::fp8_per_token_head) return e4m3_val(page[r]);
    else return static_cast<float>(static_cast<std::int8_t>(page[r]));
  } else if constexpr (F == HF::fp8_block128) {
    // codes [B][H*D] bytes, then the 128-tiles' binary32 scales [B][H*D/128] (read bytewise).
    const std::size_t e = static_cast<std::size_t>(h) * D + i;  // element of the token row
    const std::uint8_t* s4 = page + static_cast<std::size_t>(B) * HD + (static_cast<std::size_t>(slot) * (HD / 128) + e / 128) * 4;
    sc = __uint_as_float(static_cast<std::uint32_t>(s4[0]) | (static_cast<std::uint32_t>(s4[1]) << 8) |
                         (static_cast<std::uint32_t>(s4[2]) << 16) | (static_cast<std::uint32_t>(s4[3]) << 24));
    return e4m3_val(page[r]);
  } else {
    const std::size_t e = static_cast<std::size_t>(h) * D + i;  // element of the token row
    const std::size_t blk = static_cast<std::size_t>(slot) * (HD / 32) + e / 32;
    const int w = static_cast<int>(e % 32);
    if constexpr (F == HF::q8_0) {
      const std::uint8_t* p = page + blk * 34;
      sc = h2f(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
      return static_cast<float>(static_cast<std::int8_t>(p[2 + w]));
    } else {
      const std::uint8_t* p = page + blk * 18;
      sc = h2f(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
      const int code = w < 16 ? (p[2 + w] & 0x0F) : (p[2 + w - 16] >> 4);
      return static_cast<float>(code - 8);
    }
  }
}

// ---- shared prologue / epilogue --------------------------------------------------------------

// q of the CTA's heads (of KV head kvh) -> smem, times the head's q_mul, rotated when K is stored
// rotated (q.(H y) = (H q).y).
template <bool Rot>
__device__ void load_q(const DecodeLaunch& a, int b, int kvh, int hq0, int nh, float* q_s) {
  const int D = a.head_dim;
  const float q_mul = head_q_mul(a.q_mul, a.sm_scale, a.k_heads, kvh);
  for (int i = threadIdx.x; i < kHeadsPerCta * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    q_s[i] = g < nh ? a.q[(static_cast<std::size_t>(b) * a.n_heads + hq0 + g) * D + d] * q_mul : 0.0f;
  }
  __syncthreads();
  if constexpr (Rot) {
    const int half = D / 2;
    for (int len = 1; len < D; len <<= 1) {
      for (int p = threadIdx.x; p < kHeadsPerCta * half; p += blockDim.x) {
        const int g = p / half, k = p % half;
        const int i = (k / len) * 2 * len + (k % len);
        float* c = q_s + g * D;
        const float x = c[i], y = c[i + len];
        c[i] = x + y;
        c[i + len] = x - y;
      }
      __syncthreads();
    }
    for (int i = threadIdx.x; i < kHeadsPerCta * D; i += blockDim.x) q_s[i] *= a.had_c;
    __syncthreads();
  }
}

// q of one warp's heads (of KV head kvh) -> q_w[4][D], times the head's q_mul, rotated for a rotated
// K (warp-synchronous).
template <bool Rot>
__device__ void load_q_warp(const DecodeLaunch& a, int b, int kvh, int hq0, int nh, float* q_w, int lane) {
  const int D = a.head_dim;
  const float q_mul = head_q_mul(a.q_mul, a.sm_scale, a.k_heads, kvh);
  for (int i = lane; i < kHeadsPerCta * D; i += 32) {
    const int g = i / D, d = i % D;
    q_w[i] = g < nh ? a.q[(static_cast<std::size_t>(b) * a.n_heads + hq0 + g) * D + d] * q_mul : 0.0f;
  }
  __syncwarp();
  if constexpr (Rot) {
    const int half = D / 2;
    for (int len = 1; len < D; len <<= 1) {
      for (int p = lane; p < kHeadsPerCta * half; p += 32) {
        const int g = p / half, k = p % half;
        const int i = (k / len) * 2 * len + (k % len);
        float* c = q_w + g * D;
        const float x = c[i], y = c[i + len];
        c[i] = x + y;
        c[i + len] = x - y;
      }
      __syncwarp();
    }
    for (int i = lane; i < kHeadsPerCta * D; i += 32) q_w[i] *= a.had_c;
    __syncwarp();
  }
}

__device__ __forceinline__ float safe_exp2_diff(float m, float M) { return m == -INFINITY ? 0.0f : exp2f(m - M); }

// Writes one split's partial state: ep holds [warps][4][D] accumulators, epml [warps][4][2].
__device__ inline void write_partials(const DecodeLaunch& a, int b, int split, int hq0, int nh, const float* ep,
                               const float* epml, int nwarps) {
  const int D = a.head_dim;
  for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float M = -INFINITY;
    for (int w = 0; w < nwarps; ++w) M = fmaxf(M, epml[(w * kHeadsPerCta + g) * 2]);
    float o = 0.0f, l = 0.0f;
    for (int w = 0; w < nwarps; ++w) {
      const float f = safe_exp2_diff(epml[(w * kHeadsPerCta + g) * 2], M);
      o += ep[(w * kHeadsPerCta + g) * D + d] * f;
      l += epml[(w * kHeadsPerCta + g) * 2 + 1] * f;
    }
    const std::size_t row = (static_cast<std::size_t>(b) * a.splits + split) * a.n_heads + hq0 + g;
    a.part_o[row * D + d] = o;
    if (d == 0) {
      a.part_ml[row * 2] = M;
      a.part_ml[row * 2 + 1] = l;
    }
  }
}

// Bytes-moved accounting (DecodeLaunch::bytes_read, docs/CUDA.md "What a decode step reads on the
// GPU"): `cells` (token x KV head) that a warp's loop read from the pool, times the formats' bytes of
// one cell, added once by the calling lane after the loop. Off (null, the default): one uniform branch.
__device__ __forceinline__ void count_read(const DecodeLaunch& a, unsigned cells) {
  if (a.bytes_read != nullptr && cells != 0u)
    atomicAdd(a.bytes_read, static_cast<unsigned long long>(cells) * a.cell_bytes);
}

// ---- the per-warp staging pipeline of the fast and tensor-core kernels ---------------------------
// Warp w of a CTA streams the cells of its own KV head through a private STAGES-deep cp.async ring
// (no CTA-wide barrier in the main loop). A stage holds TOK tokens: K cells (stride SK), V cells
// (stride SV), the int8 scale words (8 B per token: the aligned 4-byte word holding the cell's K
// scale, then V's) and one parity byte per token saying which 16-bit half of that word is the
// cell's. LPT lanes copy one token; the page lookup of a step is prefetched one step ahead.
// Two ways to find a step's cells (PAGED, a template argument so that each way gets its own
// registers; the fast and tensor-core kernels pick one per CTA by page_tiles_apply and
// DecodeLaunch::page_tiles, which KVGATE_CUDA_PAGE_TILES=0 turns off):
//   page tiles (PAGED): the block size is a power of two >= TOK and the range starts on a multiple
//     of TOK, so a step's TOK tokens lie in one page: one table entry per step (the same address in
//     every lane, one broadcast load), and a chunk's source is the page's base plus an offset that
//     depends on the lane alone; no shuffles. Every preset's 16-token pages with the planner's
//     splits (multiples of 16 tokens) take this way (TOK: 16 on the tensor-core kernel, 2 to 16
//     on the fast one, FastCfg::TGC).
//   token lookups: any other block size (1, 3, 7, 8) or range start: each token's page looked up
//     by its copy lanes and moved to the chunk's lane by shuffles.
// Cfg provides TOK, STAGES, LPT, SK, SV, CBK, CBV, CGK, CGV, STAGE_AL.
template <HF KF, HF VF, int D, class Cfg, bool PAGED = false>
struct WarpKvPipe {
  static constexpr bool page_tiles = PAGED;
  // Whether a warp's range [t_begin, ...) may take page tiles (uniform across the CTA).
  __device__ static bool page_tiles_apply(const DecodeLaunch& a, int t_begin) {
    const int B = a.block_size;
    return (B & (B - 1)) == 0 && B >= Cfg::TOK && t_begin % Cfg::TOK == 0;
  }
  const DecodeLaunch& a;
  const int* table;
  std::uint8_t* wpipe;  // this warp's STAGES * STAGE_AL bytes
  int kvh, t_begin, t_end, n_steps, ctau, csub;
  int bshift;              // log2(block_size) for a power-of-two block size, else -1 (a division)
  int nxt_page, nxt_slot;  // lookup of the next step to issue

  __device__ WarpKvPipe(const DecodeLaunch& a_, const int* table_, std::uint8_t* wpipe_, int kvh_, int t_begin_,
                        int t_end_, int lane)
      : a(a_), table(table_), wpipe(wpipe_), kvh(kvh_), t_begin(t_begin_), t_end(t_end_) {
    const int n_tok = max(0, t_end - t_begin);
    n_steps = (n_tok + Cfg::TOK - 1) / Cfg::TOK;
    ctau = lane / Cfg::LPT;  // copy role of this lane: token ctau of the stage, sub-lane csub
    csub = lane % Cfg::LPT;
    const int B = a.block_size;
    bshift = (B & (B - 1)) == 0 ? __ffs(B) - 1 : -1;
  }
  // Page and slot of this lane's copy token of step st (page -1: past the range, zero-filled); with
  // page tiles, the step's page and the slot of its first token, the same in every lane (page -1:
  // past the last step). The page-tile load does not wait for the sequence length: its index is
  // clamped into the table row ([0, table_stride), none for an empty row) and the entry read
  // whatever n_steps turns out to be, so at a CTA's start the table load and the length load are
  // in flight together (an entry past the sequence is read, never used).
  __device__ __forceinline__ void lookup(int st, int& page, int& slot) const {
    if constexpr (page_tiles) {
      const int tk0 = t_begin + st * Cfg::TOK;
      const int idx = min(tk0 >> bshift, a.table_stride - 1);
      const int entry = idx >= 0 ? __ldg(table + idx) : -1;
      page = st < n_steps ? entry : -1;
      slot = tk0 & (a.block_size - 1);
      return;
    }
    const int tk = t_begin + st * Cfg::TOK + ctau;
    if (st < n_steps && tk < t_end) {
      // A power-of-two block size (every preset's 16) shifts and masks instead of the ~20
      // instructions of an integer division by a runtime divisor; the branch is uniform.
      const int blk = bshift >= 0 ? tk >> bshift : tk / a.block_size;
      page = __ldg(table + blk);
      slot = tk - blk * a.block_size;
    } else {
      page = -1;
      slot = 0;
    }
  }
  // The copies of one half (K or V) of a stage, coalesced: chunk idx = lane + 32 i of the stage's
  // TOK x NCH chunks (NCH = CB / CG per cell) is chunk idx % NCH of token idx / NCH, so one warp
  // instruction moves whole consecutive cells (int8 at D = 128: 4 cells of 128 B, 4 cache lines)
  // instead of 32 B of each of 16 cells (16 lines): the L1 handles a quarter of the wavefronts for
  // the same bytes. Where a chunk's token is:
  //   token lookups: the token's lookup lives in its copy lanes (token tau: lane tau * LPT) and
  //     reaches the chunk's lane by shuffles (page -1: zero-filled);
  //   page tiles: `page` and `slot` are the step's (slot of its first token), the same in every
  //     lane; tokens are n_kv_heads cells apart, so the warp's cell of token slot + tau is at
  //     ((slot + tau) * n_kv_heads + kvh) * CB; the step's first n_valid tokens are copied, the
  //     rest zero-filled.
  template <int CB, int CG, int S>
  __device__ __forceinline__ void copy_half(std::uint8_t* dst, const std::uint8_t* pool, std::size_t page_stride, int page,
                                            int slot, int n_valid) const {
    constexpr int NCH = CB / CG, TOTAL = Cfg::TOK * NCH;
    const int lane = ctau * Cfg::LPT + csub;
    const std::size_t cell_base = static_cast<std::size_t>(kvh) * CB;
    const int token_bytes = a.n_kv_heads * CB;
    const std::uint8_t* base =  // page tiles: the warp's cell of the step's first token
        pool + (page >= 0 ? static_cast<std::size_t>(page) * page_stride + static_cast<std::size_t>(slot * a.n_kv_heads + kvh) * CB
                          : 0);
#pragma unroll
    for (int i = 0; i < (TOTAL + 31) / 32; ++i) {
      const int idx = lane + 32 * i;
      const int tau = min(idx / NCH, Cfg::TOK - 1), c = idx - (idx / NCH) * NCH;
      if constexpr (page_tiles) {
        if (TOTAL % 32 == 0 || idx < TOTAL) cp_async<CG>(dst + tau * S + c * CG, base + tau * token_bytes + c * CG, tau < n_valid);
      } else {
        const int pg = __shfl_sync(0xffffffffu, page, tau * Cfg::LPT);
        const int sl = __shfl_sync(0xffffffffu, slot, tau * Cfg::LPT);
        const bool valid = pg >= 0;
        const std::uint8_t* src =
            pool + (valid ? static_cast<std::size_t>(pg) * page_stride + static_cast<std::size_t>(sl) * a.n_kv_heads * CB +
                                cell_base + c * CG
                          : 0);
        if (TOTAL % 32 == 0 || idx < TOTAL) cp_async<CG>(dst + tau * S + c * CG, src, valid);
      }
    }
  }
  // Tokens of step st (page from lookup) that are in the range: the step's first n; with token
  // lookups every looked-up token is (page -1 past it).
  __device__ __forceinline__ int step_tokens(int st, int page) const {
    return page < 0 ? 0 : min(Cfg::TOK, t_end - (t_begin + st * Cfg::TOK));
  }
  __device__ __forceinline__ void issue(int st, int page, int slot) const {
    const int H = a.n_kv_heads, B = a.block_size;
    std::uint8_t* sb = wpipe + (st % Cfg::STAGES) * Cfg::STAGE_AL;
    const int n_valid = page_tiles ? step_tokens(st, page) : 0;  // page tiles: the step's tokens in the range
    copy_half<Cfg::CBK, Cfg::CGK, Cfg::SK>(sb, a.k_pool, a.k_page_stride, page, slot, n_valid);
    copy_half<Cfg::CBV, Cfg::CGV, Cfg::SV>(sb + Cfg::TOK * Cfg::SK, a.v_pool, a.v_page_stride, page, slot, n_valid);
    // This lane's copy token ctau: its slot and whether it is in the range (its scales copied).
    if constexpr (page_tiles) slot += ctau;
    const bool valid = page_tiles ? ctau < n_valid : page >= 0;
    const std::size_t cell = static_cast<std::size_t>(slot) * H + kvh;
    if (csub == 0) {
      std::uint8_t* scw = sb + Cfg::TOK * (Cfg::SK + Cfg::SV);
      std::uint8_t* par = scw + Cfg::TOK * 8;
      const std::size_t codes = static_cast<std::size_t>(B) * H * D;
      if constexpr (KF == HF::int8) {
        const std::uint8_t* src = a.k_pool + (valid ? static_cast<std::size_t>(page) * a.k_page_stride + codes + ((cell * 2) & ~std::size_t{3}) : 0);
        cp_async<4>(scw + ctau * 8, src, valid);
      }
      if constexpr (VF == HF::int8) {
        const std::uint8_t* src = a.v_pool + (valid ? static_cast<std::size_t>(page) * a.v_page_stride + codes + ((cell * 2) & ~std::size_t{3}) : 0);
        cp_async<4>(scw + ctau * 8 + 4, src, valid);
      }
      if constexpr (mma_only_half(KF)) copy_cell_scales<KF, Cfg::CBK, Cfg::SK>(sb, a.k_pool, a.k_page_stride, page, cell, valid);
      if constexpr (mma_only_half(VF))
        copy_cell_scales<VF, Cfg::CBV, Cfg::SV>(sb + Cfg::TOK * Cfg::SK, a.v_pool, a.v_page_stride, page, cell, valid);
      par[ctau] = static_cast<std::uint8_t>(cell & 1);
    }
  }
  // The scales of this lane's token (the caller: its copy lane csub 0; valid: the token is in the
  // range, else zero-filled) for a half that keeps them in a run after its codes (the 2026 halves, docs/FORMATS.md "Geometry": B x H cells of CB code bytes,
  // then cell_scale_bytes per cell in cell order), staged after the cell's codes in its stage row
  // (half_stage + token * S + CB, 16-byte aligned). The run starts at B*H*CB, a multiple of 32 at
  // D >= 64, in a 256-byte aligned page, so 4, 8 or 16 scale bytes are naturally aligned for one
  // cp.async; 2 (mxfp8 / mxfp4 at D = 64) copy the aligned 4-byte word holding them, and the parity
  // byte (cell & 1) says which half is the cell's, as for int8. A page's padding to its 256-byte
  // stride covers the word's other half past the run's end.
  template <HF F, int CB, int S>
  __device__ __forceinline__ void copy_cell_scales(std::uint8_t* half_stage, const std::uint8_t* pool,
                                                   std::size_t page_stride, int page, std::size_t cell, bool valid) const {
    constexpr int SB = cell_scale_bytes(F, D), CP = SB < 4 ? 4 : SB;
    static_assert(CP == 4 || CP == 8 || CP == 16, "cp.async copies 4, 8 or 16 bytes");
    const std::size_t run = static_cast<std::size_t>(a.block_size) * a.n_kv_heads * CB;
    const std::uint8_t* src =
        pool + (valid ? static_cast<std::size_t>(page) * page_stride + run + ((cell * SB) & ~static_cast<std::size_t>(CP - 1)) : 0);
    cp_async<CP>(half_stage + ctau * S + CB, src, valid);
  }
  // Steps 0 .. STAGES-2 in flight, the lookup of step STAGES-1 done.
  __device__ __forceinline__ void prologue() {
#pragma unroll
    for (int s = 0; s < Cfg::STAGES - 1; ++s) {
      int pg, sl;
      lookup(s, pg, sl);
      issue(s, pg, sl);
      cp_async_commit();
    }
    lookup(Cfg::STAGES - 1, nxt_page, nxt_slot);
  }
  // Issues step st + STAGES - 1, waits for step st's copies and returns its stage.
  __device__ __forceinline__ const std::uint8_t* acquire(int st) {
    issue(st + Cfg::STAGES - 1, nxt_page, nxt_slot);
    cp_async_commit();
    lookup(st + Cfg::STAGES, nxt_page, nxt_slot);
    cp_async_wait<Cfg::STAGES - 1>();
    __syncwarp();
    return wpipe + (st % Cfg::STAGES) * Cfg::STAGE_AL;
  }
  // After the step's last read of its stage (the stage is refilled STAGES - 1 steps later).
  __device__ __forceinline__ void release() const { __syncwarp(); }
  __device__ __forceinline__ void drain() const { cp_async_wait<0>(); }
  // Bytes-moved accounting after the loop, every lane of the warp (off: one uniform branch; the loop
  // carries nothing for it). `steps` is the number of steps the caller's loop acquired: prologue()
  // and acquire() issued the copies of steps 0 .. steps + STAGES - 2, each token's through lookup()
  // (and, with page tiles, step_tokens), the one test that decides what is copied (a token in the
  // range: its K and V cells; else zero-filled, nothing read). Those lookups are replayed here, the
  // tokens in the range counted once (by their first copy lane) and added by lane 0. A loop that runs more steps, a range that reaches
  // past the split or the sequence, a lookup that admits more tokens: each raises the count.
  __device__ __forceinline__ void count_read(int steps) const {
    if (a.bytes_read == nullptr) return;
    unsigned tokens = 0;
    for (int st = 0; st < steps + Cfg::STAGES - 1; ++st) {
      int pg, sl;
      lookup(st, pg, sl);
      const bool in_range = page_tiles ? ctau < step_tokens(st, pg) : pg >= 0;
      tokens += __popc(__ballot_sync(0xffffffffu, csub == 0 && in_range));
    }
    if (ctau == 0 && csub == 0) detail::count_read(a, tokens);
  }
  // The ring's last stage, which prologue() leaves unwritten: scratch for the caller until its
  // first acquire() (which issues the copies of step STAGES - 1 into it) after a __syncwarp().
  __device__ __forceinline__ std::uint8_t* spare_stage() const { return wpipe + (Cfg::STAGES - 1) * Cfg::STAGE_AL; }
  // Views of a stage.
  __device__ static const std::uint8_t* k_cells(const std::uint8_t* sb) { return sb; }
  __device__ static const std::uint8_t* v_cells(const std::uint8_t* sb) { return sb + Cfg::TOK * Cfg::SK; }
  __device__ static const std::uint8_t* scale_words(const std::uint8_t* sb) { return sb + Cfg::TOK * (Cfg::SK + Cfg::SV); }
  __device__ static const std::uint8_t* parity(const std::uint8_t* sb) { return scale_words(sb) + Cfg::TOK * 8; }
};
// The int8 cell scale of token u of a stage (h = 0: K, 1: V): the scale word and the parity byte
// are two independent shared loads (the parity selects the half by a shift, not an address).
__device__ __forceinline__ float stage_int8_scale(const std::uint8_t* scw, const std::uint8_t* par, int u, int h) {
  const std::uint32_t w = *reinterpret_cast<const std::uint32_t*>(scw + u * 8 + 4 * h);
  return h2f(static_cast<std::uint16_t>(w >> (16 * par[u])));
}

// The start of the fast and tensor-core kernels: warp w of a CTA serves KV head kvh0 + w over the
// CTA's whole token range (the warps read the adjacent cells of the same tokens, so DRAM sees them
// contiguous per token instead of one cell strided by n_kv_heads cells); an idle warp leaves (no
// CTA-wide barrier follows). run(paged, lane, warp, kvh, split, b, hq0, nh, t_begin, t_end) is the
// warp's work, with paged a std::bool_constant: page tiles where DecodeLaunch::page_tiles allows
// them and Pipe (the kernel's WarpKvPipe) can take them for this range.
template <class Pipe, class Run>
__device__ __forceinline__ void decode_warp_start(const DecodeLaunch& a, Run&& run) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kvh = (blockIdx.x / a.n_hchunks) * kDecodeWarps + warp, hc = blockIdx.x % a.n_hchunks;
  const int split = blockIdx.y, b = blockIdx.z;
  if (kvh >= a.n_kv_heads) return;
  const int hq0 = kvh * a.group + hc * kHeadsPerCta;
  const int nh = min(kHeadsPerCta, a.group - hc * kHeadsPerCta);
  const int t_begin = split * a.tokens_per_split;
  const int t_end = min(t_begin + a.tokens_per_split, a.seq_lens[b]);
  if (a.page_tiles && Pipe::page_tiles_apply(a, t_begin))
    run(std::true_type{}, lane, warp, kvh, split, b, hq0, nh, t_begin, t_end);
  else
    run(std::false_type{}, lane, warp, kvh, split, b, hq0, nh, t_begin, t_end);
}

// ---- fast path ----------------------------------------------------------------------------------

// One warp's work over its split (the kernel below): PAGED picks the staging pipeline's way to find
// cells (WarpKvPipe: page tiles or token lookups), a template argument so that each way gets its
// own registers, as in the tensor-core kernel (decode_mma.cuh decode_mma_warp).
template <HF KF, HF VF, int D, bool PAGED>
__device__ __forceinline__ void decode_fast_warp(const DecodeLaunch& a, std::uint8_t* smem, int lane, int warp, int kvh,
                                                 int split, int b, int hq0, int nh, int t_begin, int t_end) {
  using Cfg = FastCfg<KF, VF, D>;
  using KS = Slice<KF, D>;
  using VS = Slice<VF, D>;
  constexpr int E = Cfg::E, L = Cfg::L, TG = Cfg::TG, C = Cfg::C, TGC = Cfg::TGC;
  float* q_s = reinterpret_cast<float*>(smem);
  std::uint8_t* pipe = smem + Cfg::Q_SMEM;
  const int j = lane % L, r = lane / L;
  const int* table = a.block_tables + static_cast<std::size_t>(b) * a.table_stride;

  q_s += warp * kHeadsPerCta * D;
  load_q_warp<is_rot(KF)>(a, b, kvh, hq0, nh, q_s, lane);
  float qr[kHeadsPerCta][E];
#pragma unroll
  for (int g = 0; g < kHeadsPerCta; ++g)
#pragma unroll
    for (int e = 0; e < E; ++e) qr[g][e] = q_s[g * D + KS::dim(j, e)];

  float acc[kHeadsPerCta][E];
  float m[kHeadsPerCta], l[kHeadsPerCta];
#pragma unroll
  for (int g = 0; g < kHeadsPerCta; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[g][e] = 0.0f;
  }

  WarpKvPipe<KF, VF, D, Cfg, PAGED> kv(a, table, pipe + warp * Cfg::WARP_SMEM, kvh, t_begin, t_end, lane);
  kv.prologue();
  int st = 0;  // after the loop: the steps it ran (count_read)
  for (; st < kv.n_steps; ++st) {
    const std::uint8_t* sb = kv.acquire(st);
    const std::uint8_t* scw = kv.scale_words(sb);
    const std::uint8_t* par = kv.parity(sb);
    const int tbase = t_begin + st * TGC;

    float s[C][kHeadsPerCta];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int tau = c * TG + r;
      float x[E], sc;
      KS::load(sb + tau * Cfg::SK, j, x, sc);
      if constexpr (KF == HF::int8) sc = stage_int8_scale(scw, par, tau, 0);
      float part[kHeadsPerCta];
#pragma unroll
      for (int g = 0; g < kHeadsPerCta; ++g) {
        float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e += 2) {
          p0 = fmaf(qr[g][e], x[e], p0);
          p1 = fmaf(qr[g][e + 1], x[e + 1], p1);
        }
        part[g] = (p0 + p1) * sc;
      }
#pragma unroll
      for (int off = L / 2; off > 0; off >>= 1)
#pragma unroll
        for (int g = 0; g < kHeadsPerCta; ++g) part[g] += __shfl_xor_sync(0xffffffffu, part[g], off);
      if (a.softcap2 > 0.0f) {
#pragma unroll
        for (int g = 0; g < kHeadsPerCta; ++g) part[g] = softcap2(part[g], a.softcap2);
      }
      const bool valid = tbase + tau < t_end;
#pragma unroll
      for (int g = 0; g < kHeadsPerCta; ++g) s[c][g] = valid ? part[g] : -INFINITY;
    }

    float p[C][kHeadsPerCta];
#pragma unroll
    for (int g = 0; g < kHeadsPerCta; ++g) {
      float mx = s[0][g];
#pragma unroll
      for (int c = 1; c < C; ++c) mx = fmaxf(mx, s[c][g]);
      if (mx > m[g]) {  // lazy rescale: only when the running max grows
        const float corr = safe_exp2_diff(m[g], mx);
        l[g] *= corr;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] *= corr;
        m[g] = mx;
      }
      float ls = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        p[c][g] = m[g] == -INFINITY ? 0.0f : exp2f(s[c][g] - m[g]);
        ls += p[c][g];
      }
      l[g] += ls;
    }

#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int tau = c * TG + r;
      float x[E], sc;
      VS::load(kv.v_cells(sb) + tau * Cfg::SV, j, x, sc);
      if constexpr (VF == HF::int8) sc = stage_int8_scale(scw, par, tau, 1);
#pragma unroll
      for (int g = 0; g < kHeadsPerCta; ++g) {
        const float pv = p[c][g] * sc;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] = fmaf(pv, x[e], acc[g][e]);
      }
    }
    kv.release();
  }
  kv.drain();
  kv.count_read(st);

  // Merge the token groups of the warp (lanes that differ above the slice bits).
#pragma unroll
  for (int off = L; off < 32; off <<= 1) {
#pragma unroll
    for (int g = 0; g < kHeadsPerCta; ++g) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[g], off);
      const float lo = __shfl_xor_sync(0xffffffffu, l[g], off);
      const float M = fmaxf(m[g], mo);
      const float fa = safe_exp2_diff(m[g], M), fb = safe_exp2_diff(mo, M);
      l[g] = l[g] * fa + lo * fb;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float ao = __shfl_xor_sync(0xffffffffu, acc[g][e], off);
        acc[g][e] = acc[g][e] * fa + ao * fb;
      }
      m[g] = M;
    }
  }
  // The warp covered the whole split for its heads: lanes 0..L-1 hold every dim; write directly.
  if (lane < L) {
#pragma unroll
    for (int g = 0; g < kHeadsPerCta; ++g) {
      if (g < nh) {
        const std::size_t row = (static_cast<std::size_t>(b) * a.splits + split) * a.n_heads + hq0 + g;
#pragma unroll
        for (int e = 0; e < E; ++e) a.part_o[row * D + VS::dim(j, e)] = acc[g][e];
        if (lane == 0) {
          a.part_ml[row * 2] = m[g];
          a.part_ml[row * 2 + 1] = l[g];
        }
      }
    }
  }
}

template <HF KF, HF VF, int D>
__global__ void __launch_bounds__(kDecodeWarps * 32, 2) decode_fast_kernel(DecodeLaunch a) {
  allow_dependent_launch();
  extern __shared__ __align__(16) std::uint8_t smem[];
  decode_warp_start<WarpKvPipe<KF, VF, D, FastCfg<KF, VF, D>, true>>(
      a, [&](auto paged, int lane, int warp, int kvh, int split, int b, int hq0, int nh, int t_begin, int t_end) {
        decode_fast_warp<KF, VF, D, decltype(paged)::value>(a, smem, lane, warp, kvh, split, b, hq0, nh, t_begin, t_end);
      });
}

// ---- generic path: any head_dim <= 256; one token per warp step, lanes over the head vector -----


template <HF KF, HF VF>
__global__ void __launch_bounds__(kDecodeWarps * 32) decode_generic_kernel(DecodeLaunch a) {
  allow_dependent_launch();
  extern __shared__ __align__(16) std::uint8_t smem[];
  const int D = a.head_dim;
  float* q_s = reinterpret_cast<float*>(smem);
  float* ep = q_s + kHeadsPerCta * D;
  float* epml = ep + kDecodeWarps * kHeadsPerCta * D;

  const int kvh = blockIdx.x / a.n_hchunks, hc = blockIdx.x % a.n_hchunks;
  const int split = blockIdx.y, b = blockIdx.z;
  const int hq0 = kvh * a.group + hc * kHeadsPerCta;
  const int nh = min(kHeadsPerCta, a.group - hc * kHeadsPerCta);
  const int seq_len = a.seq_lens[b];
  // Sliding window (this kernel only: decode_attention routes every windowed call here, so the
  // fast and tensor-core kernels of the plain path are untouched): the splits cover keys
  // [seq_len - window, seq_len) (transformers' mask: the query at seq_len - 1 sees q - window + 1 .. q).
  const int t_lo = a.window > 0 ? max(0, seq_len - a.window) : 0;
  const int t_begin = t_lo + split * a.tokens_per_split;
  const int t_end = min(t_begin + a.tokens_per_split, seq_len);
  const int H = a.n_kv_heads, B = a.block_size;
  const int* table = a.block_tables + static_cast<std::size_t>(b) * a.table_stride;
  load_q<is_rot(KF)>(a, b, kvh, hq0, nh, q_s);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float acc[kHeadsPerCta][kGenericMaxPerLane];
  float m[kHeadsPerCta], l[kHeadsPerCta];
#pragma unroll
  for (int g = 0; g < kHeadsPerCta; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int k = 0; k < kGenericMaxPerLane; ++k) acc[g][k] = 0.0f;
  }
  int t = t_begin + warp;  // after the loop: one step of kDecodeWarps per token visited (count_read)
  for (; t < t_end; t += kDecodeWarps) {
    const int page = __ldg(table + t / B), slot = t % B;
    const std::uint8_t* kp = a.k_pool + static_cast<std::size_t>(page) * a.k_page_stride;
    const std::uint8_t* vp = a.v_pool + static_cast<std::size_t>(page) * a.v_page_stride;
    float part[kHeadsPerCta] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < kGenericMaxPerLane; ++k) {
      const int i = lane + 32 * k;
      if (i < D) {
        float sc;
        const float x = load_elem<KF>(kp, B, H, D, slot, kvh, i, sc) * sc;
#pragma unroll
        for (int g = 0; g < kHeadsPerCta; ++g) part[g] = fmaf(q_s[g * D + i], x, part[g]);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
#pragma unroll
      for (int g = 0; g < kHeadsPerCta; ++g) part[g] += __shfl_xor_sync(0xffffffffu, part[g], off);
    if (a.softcap2 > 0.0f) {
#pragma unroll
      for (int g = 0; g < kHeadsPerCta; ++g) part[g] = softcap2(part[g], a.softcap2);
    }
    float p[kHeadsPerCta];
#pragma unroll
    for (int g = 0; g < kHeadsPerCta; ++g) {
      if (part[g] > m[g]) {
        const float corr = safe_exp2_diff(m[g], part[g]);
        l[g] *= corr;
#pragma unroll
        for (int k = 0; k < kGenericMaxPerLane; ++k) acc[g][k] *= corr;
        m[g] = part[g];
      }
      p[g] = m[g] == -INFINITY ? 0.0f : exp2f(part[g] - m[g]);
      l[g] += p[g];
    }
#pragma unroll
    for (int k = 0; k < kGenericMaxPerLane; ++k) {
      const int i = lane + 32 * k;
      if (i < D) {
        float sc;
        const float x = load_elem<VF>(vp, B, H, D, slot, kvh, i, sc) * sc;
#pragma unroll
        for (int g = 0; g < kHeadsPerCta; ++g) acc[g][k] = fmaf(p[g], x, acc[g][k]);
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kHeadsPerCta; ++g) {
#pragma unroll
    for (int k = 0; k < kGenericMaxPerLane; ++k) {
      const int i = lane + 32 * k;
      if (i < D) ep[(warp * kHeadsPerCta + g) * D + i] = acc[g][k];
    }
    if (lane == 0) {
      epml[(warp * kHeadsPerCta + g) * 2] = m[g];
      epml[(warp * kHeadsPerCta + g) * 2 + 1] = l[g];
    }
  }
  // Bytes-moved accounting: the tokens this warp's loop visited, each reading its K and V cells.
  if (lane == 0 && t > t_begin + warp) count_read(a, static_cast<unsigned>((t - t_begin - warp) / kDecodeWarps));
  __syncthreads();
  write_partials(a, b, split, hq0, nh, ep, epml, kDecodeWarps);
}


}  // namespace kvgate::cuda::detail
