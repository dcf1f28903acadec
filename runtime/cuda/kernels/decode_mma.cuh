// Tensor-core decode path for the narrow half formats (int8, fp8_e4m3, fp8_e5m2, q8_0, q4_0,
// q4_0_rot) at head_dim 64/128/256 (docs/CUDA.md). Per warp and 16-token tile:
//   S^T[16 tok x 8 heads] = K[16 x D] . Q^T[D x 8]      (mma.sync m16n8k16, f16 in, f32 accumulate)
//   O^T[D x 8 heads]     += V^T[D x 16 tok] . P^T[16 x 8]
// Codes convert to f16 exactly (int8, q8_0, q4_0-8, e4m3, e5m2 all fit); q and the softmax weights
// are split hi + lo in f16 (two MMAs; |x - hi - lo| <= 2^-22 |x|, or 2^-25 absolute below the f16
// normal range), so products are exact and every sum is FP32: the numerics of the CUDA-core path.
// Per-token / per-block scales: K scales multiply the FP32 scores (one accumulator per 32-block for
// q8_0/q4_0); V scales multiply P before the split, normalised by the tile's largest scale so the
// f16 operands stay in [0, 1], and the tile's MMA result is added to O times that scale.
// The 4 query heads of a GQA chunk are the N columns 0..3 (4..7 are zero padding).
#pragma once
#include "decode.cuh"

namespace kvgate::cuda::detail {

__device__ __forceinline__ void mma16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
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
__device__ __forceinline__ std::uint16_t lds16(const std::uint8_t* p) { return *reinterpret_cast<const std::uint16_t*>(p); }
__device__ __forceinline__ std::uint32_t lds32(const std::uint8_t* p) { return *reinterpret_cast<const std::uint32_t*>(p); }

inline constexpr std::uint32_t kMagic = 0x64646464u;  // f16 0x64xx = 1024 + xx
inline constexpr std::uint32_t kI8Off = 0x64806480u;  // 1152 = 1024 + 128 (int8 biased by 128)
inline constexpr std::uint32_t kQ4Off = 0x64086408u;  // 1032 = 1024 + 8   (q4 code - 8)

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
  } else {  // q4_0 / q4_0_rot: qs[j] holds dims j (low nibble) and j+16 (high nibble)
    const int off = 18 * blk + 2 + 4 * t;
#pragma unroll
    for (int row = 0; row < 2; ++row) {
      const std::uint8_t* r = row == 0 ? r0 : r1;
#pragma unroll
      for (int pr = 0; pr < 2; ++pr) {  // pr 0: dims 4t,4t+1 (+16); pr 1: dims 4t+2,4t+3 (+16)
        const std::uint32_t y = prmt(lds16(r + off + 2 * pr), kMagic, 0x4140);
        const std::uint32_t lo = hsub2u(y & 0xFF0FFF0Fu, kQ4Off);
        const std::uint32_t hi = hsub2u(((y >> 4) & 0x000F000Fu) | 0x64006400u, kQ4Off);
        A0[row + 2 * pr] = lo;  // a[0]/a[2]: row g; a[1]/a[3]: row g+8
        A1[row + 2 * pr] = hi;
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
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // tokens (2t, 2t+1) -> a[0], a[1]; (2t+8, 2t+9) -> a[2], a[3]
    const std::uint8_t* va = v[2 * half];
    const std::uint8_t* vb = v[2 * half + 1];
    if constexpr (is_q4(F)) {
      const int off = 18 * blk + 2 + 2 * g;
      const std::uint32_t x = prmt(lds16(va + off), lds16(vb + off), 0x5410);
      A0[2 * half] = hsub2u((x & 0x000F000Fu) | 0x64006400u, kQ4Off);
      A0[2 * half + 1] = hsub2u(((x >> 8) & 0x000F000Fu) | 0x64006400u, kQ4Off);
      A1[2 * half] = hsub2u(((x >> 4) & 0x000F000Fu) | 0x64006400u, kQ4Off);
      A1[2 * half + 1] = hsub2u(((x >> 12) & 0x000F000Fu) | 0x64006400u, kQ4Off);
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

template <HF KF, HF VF, int D>
__global__ void __launch_bounds__(kDecodeWarps * 32, 3) decode_mma_kernel(DecodeLaunch a) {
  using Cfg = MmaCfg<KF, VF, D>;
  constexpr int TOK = Cfg::TOK, LPT = Cfg::LPT, NBLK = Cfg::NBLK, MT = Cfg::MTILES;
  constexpr bool k_blockscaled = is_block32(KF), v_blockscaled = is_block32(VF);
  extern __shared__ __align__(16) std::uint8_t smem[];
  float* q_s = reinterpret_cast<float*>(smem);
  std::uint8_t* pipe = smem + Cfg::Q_SMEM;

  const int kvh = blockIdx.x / a.n_hchunks, hc = blockIdx.x % a.n_hchunks;
  const int split = blockIdx.y, b = blockIdx.z;
  const int hq0 = kvh * a.group + hc * kHeadsPerCta;
  const int nh = min(kHeadsPerCta, a.group - hc * kHeadsPerCta);
  const int seq_len = a.seq_lens[b];
  const int t_begin = split * a.tokens_per_split;
  const int t_end = min(t_begin + a.tokens_per_split, seq_len);
  const int H = a.n_kv_heads, B = a.block_size;
  const int* table = a.block_tables + static_cast<std::size_t>(b) * a.table_stride;

  load_q<is_rot(KF)>(a, b, hq0, nh, q_s);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;

  // Q^T fragments (column n = head g; zero for the padding columns 4..7), hi and lo.
  std::uint32_t qh[Cfg::KSTEPS][2], ql[Cfg::KSTEPS][2];
#pragma unroll
  for (int j = 0; j < Cfg::KSTEPS; ++j)
#pragma unroll
    for (int pr = 0; pr < 2; ++pr) {
      const int d0 = 16 * j + 4 * t + 2 * pr;
      const float x0 = g < kHeadsPerCta ? q_s[g * D + d0] : 0.0f;
      const float x1 = g < kHeadsPerCta ? q_s[g * D + d0 + 1] : 0.0f;
      split_h2(x0, x1, qh[j][pr], ql[j][pr]);
    }

  float o[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // heads 2t, 2t+1

  std::uint8_t* wpipe = pipe + warp * Cfg::WARP_SMEM;
  const int n_tok = max(0, t_end - t_begin);
  const int n_steps = (n_tok + kDecodeWarps * TOK - 1) / (kDecodeWarps * TOK);
  const int ctau = lane / LPT, csub = lane % LPT;

  auto lookup = [&](int st, int& page, int& slot) {
    const int tk = t_begin + (st * kDecodeWarps + warp) * TOK + ctau;
    if (st < n_steps && tk < t_end) {
      page = __ldg(table + tk / B);
      slot = tk % B;
    } else {
      page = -1;
      slot = 0;
    }
  };
  auto issue = [&](int st, int page, int slot) {
    std::uint8_t* sb = wpipe + (st % kStages) * Cfg::STAGE_AL;
    const bool valid = page >= 0;
    const std::size_t cell = static_cast<std::size_t>(slot) * H + kvh;
    const std::uint8_t* kc = a.k_pool + (valid ? static_cast<std::size_t>(page) * a.k_page_stride + cell * Cfg::CBK : 0);
    const std::uint8_t* vc = a.v_pool + (valid ? static_cast<std::size_t>(page) * a.v_page_stride + cell * Cfg::CBV : 0);
    std::uint8_t* kd = sb + ctau * Cfg::SK;
    std::uint8_t* vd = sb + TOK * Cfg::SK + ctau * Cfg::SV;
#pragma unroll
    for (int u = csub; u < Cfg::CBK / Cfg::CGK; u += LPT) cp_async<Cfg::CGK>(kd + u * Cfg::CGK, kc + u * Cfg::CGK, valid);
#pragma unroll
    for (int u = csub; u < Cfg::CBV / Cfg::CGV; u += LPT) cp_async<Cfg::CGV>(vd + u * Cfg::CGV, vc + u * Cfg::CGV, valid);
    if (csub == 0) {
      std::uint8_t* scw = sb + TOK * (Cfg::SK + Cfg::SV);
      std::uint8_t* par = scw + TOK * 8;
      const std::size_t codes = static_cast<std::size_t>(B) * H * D;
      if constexpr (KF == HF::int8) {
        const std::uint8_t* src = a.k_pool + (valid ? static_cast<std::size_t>(page) * a.k_page_stride + codes + ((cell * 2) & ~std::size_t{3}) : 0);
        cp_async<4>(scw + ctau * 8, src, valid);
      }
      if constexpr (VF == HF::int8) {
        const std::uint8_t* src = a.v_pool + (valid ? static_cast<std::size_t>(page) * a.v_page_stride + codes + ((cell * 2) & ~std::size_t{3}) : 0);
        cp_async<4>(scw + ctau * 8 + 4, src, valid);
      }
      par[ctau] = static_cast<std::uint8_t>(cell & 1);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    int pg, sl;
    lookup(s, pg, sl);
    issue(s, pg, sl);
    cp_async_commit();
  }
  int nxt_page, nxt_slot;
  lookup(kStages - 1, nxt_page, nxt_slot);

  for (int st = 0; st < n_steps; ++st) {
    issue(st + kStages - 1, nxt_page, nxt_slot);
    cp_async_commit();
    lookup(st + kStages, nxt_page, nxt_slot);
    cp_async_wait<kStages - 1>();
    __syncwarp();

    const std::uint8_t* sb = wpipe + (st % kStages) * Cfg::STAGE_AL;
    const std::uint8_t* kcell = sb;
    const std::uint8_t* vcell = sb + TOK * Cfg::SK;
    const std::uint8_t* scw = sb + TOK * (Cfg::SK + Cfg::SV);
    const std::uint8_t* par = scw + TOK * 8;
    const int tbase = t_begin + (st * kDecodeWarps + warp) * TOK;

    // ---- S^T = K Q^T ----------------------------------------------------------------------
    const std::uint8_t* r0 = kcell + g * Cfg::SK;
    const std::uint8_t* r1 = kcell + (g + 8) * Cfg::SK;
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int blk = 0; blk < NBLK; ++blk) {
      std::uint32_t A0[4], A1[4];
      k_frag32<KF>(r0, r1, blk, t, A0, A1);
      if constexpr (k_blockscaled) {
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma16816(c, A0, qh[2 * blk][0], qh[2 * blk][1]);
        mma16816(c, A0, ql[2 * blk][0], ql[2 * blk][1]);
        mma16816(c, A1, qh[2 * blk + 1][0], qh[2 * blk + 1][1]);
        mma16816(c, A1, ql[2 * blk + 1][0], ql[2 * blk + 1][1]);
        const int bb = block_bytes(KF);
        const float d0 = h2f(lds16(r0 + bb * blk)), d1 = h2f(lds16(r1 + bb * blk));
        s[0] = fmaf(c[0], d0, s[0]);
        s[1] = fmaf(c[1], d0, s[1]);
        s[2] = fmaf(c[2], d1, s[2]);
        s[3] = fmaf(c[3], d1, s[3]);
      } else {
        mma16816(s, A0, qh[2 * blk][0], qh[2 * blk][1]);
        mma16816(s, A0, ql[2 * blk][0], ql[2 * blk][1]);
        mma16816(s, A1, qh[2 * blk + 1][0], qh[2 * blk + 1][1]);
        mma16816(s, A1, ql[2 * blk + 1][0], ql[2 * blk + 1][1]);
      }
    }
    if constexpr (KF == HF::int8) {
      const float k0 = h2f(reinterpret_cast<const std::uint16_t*>(scw + g * 8)[par[g]]);
      const float k1 = h2f(reinterpret_cast<const std::uint16_t*>(scw + (g + 8) * 8)[par[g + 8]]);
      s[0] *= k0;
      s[1] *= k0;
      s[2] *= k1;
      s[3] *= k1;
    }
    if (tbase + g >= t_end) s[0] = s[1] = -INFINITY;
    if (tbase + g + 8 >= t_end) s[2] = s[3] = -INFINITY;

    // ---- online softmax (heads 2t, 2t+1; the 8 lanes with the same t hold the tile's 16 tokens)
    float p[4];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = fmaxf(s[hh], s[2 + hh]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      if (mx > m[hh]) {
        const float corr = safe_exp2_diff(m[hh], mx);
        l[hh] *= corr;
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          o[i][hh] *= corr;
          o[i][2 + hh] *= corr;
        }
        m[hh] = mx;
      }
      p[hh] = m[hh] == -INFINITY ? 0.0f : exp2f(s[hh] - m[hh]);
      p[2 + hh] = m[hh] == -INFINITY ? 0.0f : exp2f(s[2 + hh] - m[hh]);
      l[hh] += p[hh] + p[2 + hh];
    }

    // ---- P^T fragments: lane (g, t) needs head g at tokens 2t, 2t+1, 2t+8, 2t+9 -----------------
    const int srcA = 8 * t + (g >> 1), srcB = srcA + 4;
    float pa[4], pb[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      pa[k] = __shfl_sync(0xffffffffu, p[k], srcA);
      pb[k] = __shfl_sync(0xffffffffu, p[k], srcB);
    }
    const bool odd = g & 1;
    float bt[4] = {odd ? pa[1] : pa[0], odd ? pb[1] : pb[0], odd ? pa[3] : pa[2], odd ? pb[3] : pb[2]};
    if (g >= kHeadsPerCta) bt[0] = bt[1] = bt[2] = bt[3] = 0.0f;
    const int tk[4] = {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};
    const std::uint8_t* const vr[4] = {vcell + tk[0] * Cfg::SV, vcell + tk[1] * Cfg::SV, vcell + tk[2] * Cfg::SV,
                                       vcell + tk[3] * Cfg::SV};

    // ---- O^T += V^T P^T ---------------------------------------------------------------------
    std::uint32_t bh0 = 0, bh1 = 0, bl0 = 0, bl1 = 0;
    float vscale = 1.0f;
    if constexpr (VF == HF::int8) {
      float sv[4], mx = 0.0f;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        sv[k] = h2f(reinterpret_cast<const std::uint16_t*>(scw + tk[k] * 8 + 4)[par[tk[k]]]);
        mx = fmaxf(mx, sv[k]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      vscale = mx > 0.0f ? mx : 1.0f;
      const float inv = 1.0f / vscale;
      split_h2(bt[0] * (sv[0] * inv), bt[1] * (sv[1] * inv), bh0, bl0);
      split_h2(bt[2] * (sv[2] * inv), bt[3] * (sv[3] * inv), bh1, bl1);
    } else if constexpr (!v_blockscaled) {  // fp8: per-tensor scale applied after the merge
      split_h2(bt[0], bt[1], bh0, bl0);
      split_h2(bt[2], bt[3], bh1, bl1);
    }
#pragma unroll
    for (int blk = 0; blk < NBLK; ++blk) {
      std::uint32_t A0[4], A1[4];
      v_frag32<VF>(vr, blk, g, A0, A1);
      if constexpr (v_blockscaled) {
        const int bb = block_bytes(VF);
        float dv[4], mx = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          dv[k] = h2f(lds16(vr[k] + bb * blk));
          mx = fmaxf(mx, fabsf(dv[k]));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        vscale = mx > 0.0f ? mx : 1.0f;
        const float inv = 1.0f / vscale;
        // the sign of d travels with the weight (q4_0 d is negative for positive extremes)
#pragma unroll
        for (int k = 0; k < 4; ++k) dv[k] *= inv;
        split_h2(bt[0] * dv[0], bt[1] * dv[1], bh0, bl0);
        split_h2(bt[2] * dv[2], bt[3] * dv[3], bh1, bl1);
      }
      if constexpr (VF == HF::int8 || v_blockscaled) {
        float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma16816(c0, A0, bh0, bh1);
        mma16816(c0, A0, bl0, bl1);
        mma16816(c1, A1, bh0, bh1);
        mma16816(c1, A1, bl0, bl1);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          o[2 * blk][k] = fmaf(c0[k], vscale, o[2 * blk][k]);
          o[2 * blk + 1][k] = fmaf(c1[k], vscale, o[2 * blk + 1][k]);
        }
      } else {
        mma16816(o[2 * blk], A0, bh0, bh1);
        mma16816(o[2 * blk], A0, bl0, bl1);
        mma16816(o[2 * blk + 1], A1, bh0, bh1);
        mma16816(o[2 * blk + 1], A1, bl0, bl1);
      }
    }
    __syncwarp();
  }
  cp_async_wait<0>();

  // l: sum over the 8 lanes with the same t (m is already uniform across them).
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 4);
    l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 8);
    l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 16);
  }
  __syncthreads();
  float* ep = reinterpret_cast<float*>(pipe);
  float* epml = ep + kDecodeWarps * kHeadsPerCta * D;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int head = 2 * t + hh;
    if (head < kHeadsPerCta) {
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        ep[(warp * kHeadsPerCta + head) * D + 16 * i + 2 * g] = o[i][hh];
        ep[(warp * kHeadsPerCta + head) * D + 16 * i + 2 * g + 1] = o[i][2 + hh];
      }
      if (g == 0) {
        epml[(warp * kHeadsPerCta + head) * 2] = m[hh];
        epml[(warp * kHeadsPerCta + head) * 2 + 1] = l[hh];
      }
    }
  }
  __syncthreads();
  write_partials(a, b, split, hq0, nh, ep, epml, kDecodeWarps);
}

}  // namespace kvgate::cuda::detail
