// Tensor-core causal prefill attention over the paged quantized store (docs/CUDA.md "Tensor-core
// prefill"). FlashAttention-2 structure with mma.sync.aligned.m16n8k16 (f16 or bf16 operands, FP32
// accumulate), online softmax in FP32 (base 2), templated on (K half, V half, head_dim).
//
// One CTA = 8 warps = 128 query rows (token x query head of one KV head's GQA group: up to 8 heads
// of the group, the rest consecutive tokens), one KV head: every K/V tile is loaded and
// dequantized once for 128 rows. Warp w owns rows 16w .. 16w+15; lane (g = lane/4,
// tig = lane%4) owns rows 16w+g and 16w+g+8 of S and O (the m16n8 C-fragment layout). Per KV tile of
// BN keys (64; 32 at D = 256):
//   load_tile      cp.async of the tile's raw K and V cells (page bytes as stored, block table
//                  lookup per key; keys past the CTA's last visible key zero-filled) into a
//                  double buffer;
//   dequant_tile   raw cells -> K[BN][D+8] and V^T[D][BN+8] in shared memory as the MMA operand
//                  type (bf16 for a bf16 half, stored bits; f16 otherwise: codes x scale in
//                  binary32, exact, then one RNE to f16; fp8 codes are exact in f16, the per-tensor
//                  scales are folded into the query multiplier / the epilogue as before);
//   compute_qk     S[16 x BN] = Q K^T per warp, Q fragments held in registers for the whole loop;
//   online_softmax_update  causal mask (key t visible to row r iff t <= n_past + token(r)), running
//                  max, P = exp2(S - m), the accumulator rescaled by exp2(m_old - m_new);
//   compute_pv     O[16 x D] += P V, P reused from the S C-fragments as A fragments (no shuffles);
//   run_tiles_dequant  the loop with a dequant pass, software-pipelined: tile j computed from one
//                  operand buffer while tile j+1 is dequantized into the other (half the warps
//                  dequantize first, half compute first) and tile j+2 is copied;
//   run_tiles_direct   DIRECT (PmmaCfg: both halves f16/bf16): no dequant_tile; the cells are copied
//                  into the operand layout and read in place by compute_qk / compute_pv.
//   write_out      O / l (x fp8 V scale) -> shared memory -> inverse rotation for a rotated V ->
//                  coalesced stores of the valid rows.
// Operand rounding (the kernel's declared arithmetic, reproduced by the gate's reference): the
// query is scaled in binary32 (q * q_mul, rotated for a rotated K like the CUDA-core kernel), then
// rounded once to the K operand type; P is rounded to the V operand type; everything else is FP32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "prefill_mma_params.cuh"

namespace kvgate::cuda::detail {

template <HF KF, HF VF, int D>
struct PmmaCfg {
  static constexpr int BN = D == 256 ? 32 : 64;  // keys per tile
  // DIRECT: both halves 16-bit (f16 / bf16), whose stored bits are the MMA operands: the cells are
  // copied straight into the operand layout (K [BN][KP], V [BN][KP], each stage its own pair) and
  // read by ldmatrix (V transposed by ldmatrix.trans); no dequant pass, no separate operand tiles.
  static constexpr bool DIRECT = (KF == HF::f16 || KF == HF::bf16) && (VF == HF::f16 || VF == HF::bf16);
  static constexpr int CBK = cell_bytes(KF, D), CBV = cell_bytes(VF, D);
  static constexpr int CGK = gcd_c(CBK, 16), CGV = gcd_c(CBV, 16);  // cp.async chunk (4, 8 or 16 B)
  static constexpr int KP = D + 8;                      // K tile row stride (halves): 4g+tig banks
  static constexpr int VP = BN + 8;                     // V^T tile row stride (halves)
  // raw cell strides (bytes): the operand row stride for a DIRECT stage
  static constexpr int SK = DIRECT ? KP * 2 : (CBK + 15) / 16 * 16, SV = DIRECT ? KP * 2 : (CBV + 15) / 16 * 16;
  static constexpr int RAW = BN * (SK + SV);            // one raw stage (K then V)
  static constexpr int QP = D + 4;                      // fp32 Q/O staging row stride
  static constexpr int QO_BYTES = kPmmaRows * QP * 4;
  static constexpr int REGION = (2 * RAW > QO_BYTES ? 2 * RAW : QO_BYTES);  // raw stages alias Q/O
  // Dequant pass: two operand buffers (tile j computed from one while tile j+1 is dequantized into
  // the other), each K [BN][KP] then V^T [D][VP]; the int8 cell scales per raw stage (K [BN], V [BN]).
  static constexpr int KOP = DIRECT ? 0 : BN * KP * 2;  // bytes of one K operand tile
  static constexpr int OPB = DIRECT ? 0 : KOP + D * VP * 2;
  static constexpr int K_OFF = REGION;
  static constexpr int SC_OFF = K_OFF + 2 * OPB;
  static constexpr int SC_N = 2 * BN;                   // scales per stage (K keys, then V keys)
  static constexpr int SMEM = SC_OFF + (DIRECT ? 0 : 2 * SC_N * 4);
  static constexpr int NT = BN / 8;                     // n-tiles of S per warp
  static constexpr int KD = D / 16;                     // k-steps of Q K^T
  static constexpr int ND = D / 8;                      // n-tiles of O per warp
  static constexpr int KC = BN / 16;                    // k-steps of P V
};


// ---- operand types --------------------------------------------------------------------------
template <HF F>
KVGATE_HD constexpr bool op_bf16() { return F == HF::bf16; }

template <bool BF>
__device__ __forceinline__ std::uint16_t to_op(float x) {
  if constexpr (BF) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  else return __half_as_ushort(__float2half_rn(x));
}
__device__ __forceinline__ std::uint32_t pack2(std::uint16_t lo, std::uint16_t hi) {
  return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
}

// d[4] += a[4] . b[2]: m16n8k16, row-major A, col-major B, FP32 accumulate.
template <bool BF>
__device__ __forceinline__ void mma16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  if constexpr (BF) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// ---- load_tile: cp.async of the raw cells of keys [t0, t0 + BN) of KV head kvh --------------
// Cell of (token t, head h) at page + (slot * H + h) * CB for every format with D >= 32 (codes;
// 32-blocks of the head; int8 codes — the int8 cell scales are fetched by fetch_tile_scale).
template <int CB, int CG, int S, int BN>
__device__ __forceinline__ void load_cells(const std::uint8_t* pool, std::size_t page_stride, const int* table, int B,
                                           int H, int kvh, int t0, int t_end, std::uint8_t* dst) {
  constexpr int PER = CB / CG;
  for (int i = threadIdx.x; i < BN * PER; i += kPmmaThreads) {
    const int tau = i / PER, c = i % PER, t = t0 + tau;
    const bool valid = t < t_end;
    const std::uint8_t* src = pool;  // not read when !valid (src-size 0: zero fill)
    if (valid)
      src = pool + static_cast<std::size_t>(__ldg(table + t / B)) * page_stride +
            static_cast<std::size_t>((t % B) * H + kvh) * CB + c * CG;
    cp_async<CG>(dst + tau * S + c * CG, src, valid);
  }
}

template <HF KF, HF VF, int D>
__device__ __forceinline__ void load_tile(const PrefillLaunch& a, int kvh, int t0, int t_end, std::uint8_t* raw) {
  using C = PmmaCfg<KF, VF, D>;
  load_cells<C::CBK, C::CGK, C::SK, C::BN>(a.k_pool, a.k_page_stride, a.block_table, a.block_size, a.n_kv_heads, kvh,
                                           t0, t_end, raw);
  load_cells<C::CBV, C::CGV, C::SV, C::BN>(a.v_pool, a.v_page_stride, a.block_table, a.block_size, a.n_kv_heads, kvh,
                                           t0, t_end, raw + C::BN * C::SK);
  cp_async_commit();
}

// ---- dequant_tile ---------------------------------------------------------------------------
// Elements 8c .. 8c+7 of one raw cell as operand bits. sc: the int8 cell scale (others: unused).
template <HF F, int D>
__device__ __forceinline__ void dequant8(const std::uint8_t* cell, int c, float sc, std::uint16_t (&o)[8]) {
  if constexpr (F == HF::f16 || F == HF::bf16) {
    const uint4 v = *reinterpret_cast<const uint4*>(cell + 16 * c);
    const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o[2 * k] = static_cast<std::uint16_t>(w[k] & 0xFFFFu);
      o[2 * k + 1] = static_cast<std::uint16_t>(w[k] >> 16);
    }
  } else if constexpr (F == HF::int8) {
    const uint2 v = *reinterpret_cast<const uint2*>(cell + 8 * c);
    const std::uint32_t w[2] = {v.x, v.y};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float code = static_cast<float>(static_cast<std::int8_t>((w[k / 4] >> (8 * (k % 4))) & 0xFFu));
      o[k] = to_op<false>(__fmul_rn(code, sc));  // exact product, one RNE to f16
    }
  } else if constexpr (is_fp8(F)) {
    const uint2 v = *reinterpret_cast<const uint2*>(cell + 8 * c);
    const std::uint32_t w[2] = {v.x, v.y};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const std::uint16_t pair = static_cast<std::uint16_t>(w[k / 2] >> (16 * (k % 2)));
      // e4m3 / e5m2 -> f16 is exact (every code is an f16 value)
      const __half2_raw r =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), F == HF::fp8_e4m3 ? __NV_E4M3 : __NV_E5M2);
      o[2 * k] = r.x;
      o[2 * k + 1] = r.y;
    }
  } else {  // q8_0, q4_0, q4_0_rot: element e = 8c + k of the cell is in block e / 32
    constexpr int BB = block_bytes(F);
    const int e0 = 8 * c, blk = e0 / 32, w0 = e0 % 32;
    const std::uint8_t* p = cell + blk * BB;
    const float d = h2f(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int w = w0 + k;
      float code;
      if constexpr (F == HF::q8_0) code = static_cast<float>(static_cast<std::int8_t>(p[2 + w]));
      else code = static_cast<float>((w < 16 ? (p[2 + w] & 0x0F) : (p[2 + w - 16] >> 4)) - 8);
      o[k] = to_op<false>(__fmul_rn(code, d));
    }
  }
}

// int8 cell scale of key t (0 past the end: the zero-filled codes stay 0).
__device__ __forceinline__ float int8_scale(const std::uint8_t* pool, std::size_t page_stride, const int* table, int B,
                                            int H, int D, int kvh, int t, int t_end) {
  if (t >= t_end) return 0.0f;
  const std::uint8_t* page = pool + static_cast<std::size_t>(__ldg(table + t / B)) * page_stride;
  const std::uint16_t* s = reinterpret_cast<const std::uint16_t*>(page + static_cast<std::size_t>(B) * H * D);
  return h2f(__ldg(s + (t % B) * H + kvh));
}

// int8 halves: the cell scale this thread fetches for the tile of keys [t0, t0 + BN): thread i < BN
// key t0 + i of K, BN <= i < 2 BN key t0 + i - BN of V (1 otherwise). A plain load (2-byte words: no
// cp.async), issued with the tile's copies and stored to the stage's scale slots (store_tile_scale)
// once this thread's work on the current tile is done, so its latency hides behind that work.
template <HF KF, HF VF, int D>
__device__ __forceinline__ float fetch_tile_scale(const PrefillLaunch& a, int kvh, int t0, int t_end) {
  using C = PmmaCfg<KF, VF, D>;
  static_assert(C::SC_N <= kPmmaThreads, "one scale per thread");
  const int i = threadIdx.x;
  float x = 1.0f;
  if constexpr (KF == HF::int8)
    if (i < C::BN) x = int8_scale(a.k_pool, a.k_page_stride, a.block_table, a.block_size, a.n_kv_heads, D, kvh, t0 + i, t_end);
  if constexpr (VF == HF::int8)
    if (i >= C::BN && i < C::SC_N)
      x = int8_scale(a.v_pool, a.v_page_stride, a.block_table, a.block_size, a.n_kv_heads, D, kvh, t0 + i - C::BN, t_end);
  return x;
}
template <HF KF, HF VF, int D>
__device__ __forceinline__ void store_tile_scale(float x, float* sc_stage) {
  if constexpr (KF == HF::int8 || VF == HF::int8)
    if (threadIdx.x < PmmaCfg<KF, VF, D>::SC_N) sc_stage[threadIdx.x] = x;
}

// The raw stage -> K [BN][KP] and V^T [D][VP] operand tiles; sc_s: the stage's int8 cell scales.
// No barrier inside: the caller orders it (see run_tiles_dequant).
template <HF KF, HF VF, int D>
__device__ __forceinline__ void dequant_tile(const std::uint8_t* raw, std::uint16_t* k_s, std::uint16_t* vt_s,
                                             const float* sc_s) {
  using C = PmmaCfg<KF, VF, D>;
  // K: one (key, 8-element chunk) per item, written as one 16-byte store into row key of K.
  for (int i = threadIdx.x; i < C::BN * (D / 8); i += kPmmaThreads) {
    const int tau = i / (D / 8), c = i % (D / 8);
    float sc = 1.0f;
    if constexpr (KF == HF::int8) sc = sc_s[tau];
    std::uint16_t o[8];
    dequant8<KF, D>(raw + tau * C::SK, c, sc, o);
    *reinterpret_cast<uint4*>(k_s + tau * C::KP + 8 * c) =
        make_uint4(pack2(o[0], o[1]), pack2(o[2], o[3]), pack2(o[4], o[5]), pack2(o[6], o[7]));
  }
  // V^T: one (key pair, 8-element chunk) per item: 8 words (keys 2j, 2j+1) into 8 rows of V^T.
  // The chunk is skewed by j (a bijection for each j), so the lanes' raw reads (cells 2 SV bytes
  // apart) fall on different 16-byte bank groups; the word writes (8 rows of V^T are 160 or 288
  // words, a multiple of 32, so row 8c+k, column j is bank (k VP/2 + j) mod 32) do not conflict within
  // one chunk.
  const std::uint8_t* rv = raw + C::BN * C::SK;
  for (int i = threadIdx.x; i < (C::BN / 2) * (D / 8); i += kPmmaThreads) {
    const int j = i % (C::BN / 2), c = (i / (C::BN / 2) + j) % (D / 8);
    float s0 = 1.0f, s1 = 1.0f;
    if constexpr (VF == HF::int8) {
      s0 = sc_s[C::BN + 2 * j];
      s1 = sc_s[C::BN + 2 * j + 1];
    }
    std::uint16_t o0[8], o1[8];
    dequant8<VF, D>(rv + (2 * j) * C::SV, c, s0, o0);
    dequant8<VF, D>(rv + (2 * j + 1) * C::SV, c, s1, o1);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      *reinterpret_cast<std::uint32_t*>(vt_s + (8 * c + k) * C::VP + 2 * j) = pack2(o0[k], o1[k]);
  }
}

// ---- compute_qk -----------------------------------------------------------------------------
// B fragments by ldmatrix.x4 from K[BN][KP]: lane l addresses row 8n + l % 8 (key), dims
// 16kd + 8 (l / 8): matrices 0..3 are b0, b1 of k-step kd and b0, b1 of kd + 1 (lane (g, tig) gets
// K[key 8n + g][dims 16kd + 8i + 2tig, +1]). Row strides of 4 words mod 32: conflict-free phases.
template <HF KF, HF VF, int D>
__device__ __forceinline__ void compute_qk(const std::uint32_t (&qf)[PmmaCfg<KF, VF, D>::KD][4], const std::uint16_t* k_s,
                                           int lane, float (&s)[PmmaCfg<KF, VF, D>::NT][4]) {
  using C = PmmaCfg<KF, VF, D>;
  const std::uint16_t* kl = k_s + (lane & 7) * C::KP + 8 * (lane >> 3);
#pragma unroll
  for (int n = 0; n < C::NT; ++n) {
    s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kd = 0; kd < C::KD; kd += 2) {
      std::uint32_t b[4];
      ldsm_x4(kl + 8 * n * C::KP + 16 * kd, b);
      mma16816<op_bf16<KF>()>(s[n], qf[kd], b[0], b[1]);
      mma16816<op_bf16<KF>()>(s[n], qf[kd + 1], b[2], b[3]);
    }
  }
}

// ---- online_softmax_update ------------------------------------------------------------------
// Rows g (h = 0) and g + 8 (h = 1) of the warp; lim[h]: last visible key; c2 > 0: the soft-cap
// (decode.cuh softcap2) before the mask. Leaves P in s (FP32), adds the thread's partial row sums
// to l, rescales the accumulator.
template <HF KF, HF VF, int D>
__device__ __forceinline__ void online_softmax_update(float (&s)[PmmaCfg<KF, VF, D>::NT][4], int t0, int tig,
                                                      const int (&lim)[2], float c2, float (&m)[2], float (&l)[2],
                                                      float (&acc)[PmmaCfg<KF, VF, D>::ND][4]) {
  using C = PmmaCfg<KF, VF, D>;
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < C::NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e / 2, t = t0 + 8 * n + 2 * tig + (e % 2);
      if (c2 > 0.0f) s[n][e] = softcap2(s[n][e], c2);
      if (t > lim[h]) s[n][e] = -INFINITY;  // causal mask (keys past the CTA's end included)
      mx[h] = fmaxf(mx[h], s[n][e]);
    }
  float corr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float m_new = fmaxf(m[h], mx[h]);  // finite: every row sees key 0 in the first tile
    corr[h] = exp2f(m[h] - m_new);           // m = -inf before the first tile: 0
    m[h] = m_new;
    l[h] *= corr[h];
  }
#pragma unroll
  for (int n = 0; n < C::NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e / 2;
      const float p = exp2f(s[n][e] - m[h]);  // masked: exp2(-inf) = 0
      s[n][e] = p;
      l[h] += p;
    }
#pragma unroll
  for (int n = 0; n < C::ND; ++n) {
    acc[n][0] *= corr[0];
    acc[n][1] *= corr[0];
    acc[n][2] *= corr[1];
    acc[n][3] *= corr[1];
  }
}

// ---- compute_pv -----------------------------------------------------------------------------
// A fragment of P for keys 16kc .. 16kc+15 from the C fragments of S n-tiles 2kc (s0) and 2kc+1 (s1),
// rounded to V's operand type (no shuffles: the m16n8 C layout is the m16k16 A layout's halves).
template <bool BF>
__device__ __forceinline__ void p_fragment(const float (&s0)[4], const float (&s1)[4], std::uint32_t (&pa)[4]) {
  pa[0] = pack2(to_op<BF>(s0[0]), to_op<BF>(s0[1]));
  pa[1] = pack2(to_op<BF>(s0[2]), to_op<BF>(s0[3]));
  pa[2] = pack2(to_op<BF>(s1[0]), to_op<BF>(s1[1]));
  pa[3] = pack2(to_op<BF>(s1[2]), to_op<BF>(s1[3]));
}

// B fragments by ldmatrix.x4, four 8x8 blocks per instruction: b0, b1 of n-tile n and b0, b1 of
// n + 1. From V^T[D][VP] (the dequant pass's tile): lane l addresses row 8 (n + l / 16) + l % 8
// (dim), keys 16kc + 8 ((l / 8) % 2). DIRECT, from V as stored [BN][KP] (key rows) by
// ldmatrix.trans: lane l addresses key 16kc + 8 ((l / 8) % 2) + l % 8, dims 8 (n + l / 16), and
// lane (g, tig) receives V[keys 16kc + 2tig, +1 (+8)][dim 8n + g]: the same words, the same MMAs.
template <HF KF, HF VF, int D>
__device__ __forceinline__ void compute_pv(const float (&p)[PmmaCfg<KF, VF, D>::NT][4], const std::uint16_t* v_s,
                                           int lane, float (&acc)[PmmaCfg<KF, VF, D>::ND][4]) {
  using C = PmmaCfg<KF, VF, D>;
  constexpr bool BF = op_bf16<VF>();
  const std::uint16_t* vl = C::DIRECT ? v_s + ((lane & 7) + 8 * ((lane >> 3) & 1)) * C::KP + 8 * (lane >> 4)
                                      : v_s + ((lane & 7) + 8 * (lane >> 4)) * C::VP + 8 * ((lane >> 3) & 1);
#pragma unroll
  for (int kc = 0; kc < C::KC; ++kc) {
    std::uint32_t pa[4];
    p_fragment<BF>(p[2 * kc], p[2 * kc + 1], pa);
#pragma unroll
    for (int n = 0; n < C::ND; n += 2) {
      std::uint32_t b[4];
      if constexpr (C::DIRECT) ldsm_x4_t(vl + 16 * kc * C::KP + 8 * n, b);
      else ldsm_x4(vl + 8 * n * C::VP + 16 * kc, b);
      mma16816<BF>(acc[n], pa, b[0], b[1]);
      mma16816<BF>(acc[n + 1], pa, b[2], b[3]);
    }
  }
}

// ---- the KV loop ----------------------------------------------------------------------------
// What one warp carries through the loop: Q fragments, its rows' causal limits, the online-softmax
// state and the O accumulator.
template <HF KF, HF VF, int D>
struct TileState {
  const std::uint32_t (&qf)[PmmaCfg<KF, VF, D>::KD][4];
  const int (&lim)[2];
  float c2;
  int lane, tig;
  float (&m)[2];
  float (&l)[2];
  float (&acc)[PmmaCfg<KF, VF, D>::ND][4];
};

// One KV tile from its operands (K rows, V as stored or V^T): S = Q K^T, softmax update, O += P V.
template <HF KF, HF VF, int D>
__device__ __forceinline__ void attend_tile(TileState<KF, VF, D>& st, const std::uint16_t* k_op, const std::uint16_t* v_op,
                                            int t0) {
  float s[PmmaCfg<KF, VF, D>::NT][4];
  compute_qk<KF, VF, D>(st.qf, k_op, st.lane, s);
  online_softmax_update<KF, VF, D>(s, t0, st.tig, st.lim, st.c2, st.m, st.l, st.acc);
  compute_pv<KF, VF, D>(s, v_op, st.lane, st.acc);
}

// DIRECT: tile j+1's copy in flight while tile j is read in place from its stage. Two barriers a
// tile: after the copy wait (tile j landed, for every thread) and at the end (every warp done
// reading the stage before tile j+2 is copied into it).
template <HF KF, HF VF, int D>
__device__ __forceinline__ void run_tiles_direct(const PrefillLaunch& a, int kvh, int t_end, int n_tiles,
                                                 std::uint8_t* raw_s, TileState<KF, VF, D>& st) {
  using C = PmmaCfg<KF, VF, D>;
  load_tile<KF, VF, D>(a, kvh, 0, t_end, raw_s);
  for (int j = 0; j < n_tiles; ++j) {
    if (j + 1 < n_tiles) load_tile<KF, VF, D>(a, kvh, (j + 1) * C::BN, t_end, raw_s + ((j + 1) & 1) * C::RAW);
    else cp_async_commit();  // empty group: "all but the newest group" is tile j below
    cp_async_wait<1>();
    __syncthreads();  // tile j's raw bytes visible to every thread
    const std::uint8_t* stage = raw_s + (j & 1) * C::RAW;
    attend_tile<KF, VF, D>(st, reinterpret_cast<const std::uint16_t*>(stage),
                           reinterpret_cast<const std::uint16_t*>(stage + C::BN * C::SK), j * C::BN);
    __syncthreads();  // every warp done reading the stage before tile j+2 is copied into it
  }
}

// Dequant pass, software-pipelined: while tile j is computed from operand buffer j & 1, tile j+1
// is dequantized from raw stage (j+1) & 1 into buffer (j+1) & 1, and tile j+2 is being copied into
// raw stage j & 1. One barrier a tile, at the top of iteration j; it orders
//   - tile j+1's copies (waited just before it) before its dequantization (every thread's reads);
//   - the dequantization of tile j (iteration j-1) before tile j's MMAs (operand buffer j & 1);
//   - the MMAs of tile j-1 (buffer (j+1) & 1) before tile j+1's dequantization overwrites it;
//   - tile j's dequantization (raw stage j & 1, its scales) before tile j+2's copy and scales.
// Warps 0-3 dequantize first and then compute, warps 4-7 the other way round: warps w and w + 4 are
// scheduled on the same SM sub-partition (warp id mod 4), so one of each pair issues the pass's
// integer and shared-memory work while the other keeps the tensor cores busy (one 256-thread CTA
// fills the SM at D >= 128: no other CTA would overlap the pass).
template <HF KF, HF VF, int D>
__device__ __forceinline__ void run_tiles_dequant(const PrefillLaunch& a, int kvh, int t_end, int n_tiles,
                                                  std::uint8_t* smem, int warp, TileState<KF, VF, D>& st) {
  using C = PmmaCfg<KF, VF, D>;
  std::uint8_t* raw_s = smem;
  float* sc_s = reinterpret_cast<float*>(smem + C::SC_OFF);
  auto k_buf = [&](int b) { return reinterpret_cast<std::uint16_t*>(smem + C::K_OFF + b * C::OPB); };
  auto v_buf = [&](int b) { return reinterpret_cast<std::uint16_t*>(smem + C::K_OFF + b * C::OPB + C::KOP); };
  auto dequant = [&](int t) {
    dequant_tile<KF, VF, D>(raw_s + (t & 1) * C::RAW, k_buf(t & 1), v_buf(t & 1), sc_s + (t & 1) * C::SC_N);
  };
  // prologue: tiles 0 and 1 copied, tile 0 dequantized
  load_tile<KF, VF, D>(a, kvh, 0, t_end, raw_s);
  store_tile_scale<KF, VF, D>(fetch_tile_scale<KF, VF, D>(a, kvh, 0, t_end), sc_s);
  if (n_tiles > 1) {
    load_tile<KF, VF, D>(a, kvh, C::BN, t_end, raw_s + C::RAW);
    store_tile_scale<KF, VF, D>(fetch_tile_scale<KF, VF, D>(a, kvh, C::BN, t_end), sc_s + C::SC_N);
  } else {
    cp_async_commit();  // empty group: "all but the newest group" is tile 0 below
  }
  cp_async_wait<1>();
  __syncthreads();  // tile 0's bytes and both tiles' scales visible
  dequant(0);
  const bool dequant_first = warp < kPmmaWarps / 2;
  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<0>();  // tile j+1's copies (this thread's)
    __syncthreads();
    const bool next = j + 1 < n_tiles, after = j + 2 < n_tiles;
    float sc = 1.0f;
    if (after) {
      load_tile<KF, VF, D>(a, kvh, (j + 2) * C::BN, t_end, raw_s + (j & 1) * C::RAW);
      sc = fetch_tile_scale<KF, VF, D>(a, kvh, (j + 2) * C::BN, t_end);
    }
    if (dequant_first && next) dequant(j + 1);
    attend_tile<KF, VF, D>(st, k_buf(j & 1), v_buf(j & 1), j * C::BN);
    if (!dequant_first && next) dequant(j + 1);
    if (after) store_tile_scale<KF, VF, D>(sc, sc_s + (j & 1) * C::SC_N);
  }
}

// ---- the kernel ------------------------------------------------------------------------------
template <HF KF, HF VF, int D>
__global__ void __launch_bounds__(kPmmaThreads) prefill_mma_kernel(PmmaLaunch L) {
  using C = PmmaCfg<KF, VF, D>;
  const PrefillLaunch& a = L.p;
  extern __shared__ __align__(16) std::uint8_t pm_smem[];
  float* qo_s = reinterpret_cast<float*>(pm_smem);  // [kPmmaRows][QP] fp32, aliased by the raw stages

  const int kvh = blockIdx.y / a.n_hchunks, hc = blockIdx.y % a.n_hchunks;
  const int GC = a.heads_per_cta, QT = a.tokens_per_cta;
  const int hq0 = kvh * a.group + hc * GC;
  const int nh = min(GC, a.group - hc * GC);
  const int qtile = L.n_qtiles - 1 - static_cast<int>(blockIdx.x);  // longest (last) query tiles first
  const int i0 = qtile * QT;
  const int i_last = min(i0 + QT, a.n_new) - 1;
  const int t_end = a.n_past + i_last + 1;  // keys visible to the CTA's last query
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;

  auto row_valid = [&](int r) { return r < QT * GC && r % GC < nh && i0 + r / GC < a.n_new; };
  // Q (times q_mul, binary32) -> shared memory, rotated for a rotated K, then one rounding to the
  // K operand type into register fragments.
  const float q_mul = head_q_mul(a.q_mul, a.sm_scale, a.k_heads, kvh);
  for (int idx = threadIdx.x; idx < kPmmaRows * D; idx += kPmmaThreads) {
    const int r = idx / D, d = idx % D;
    float x = 0.0f;
    if (row_valid(r))
      x = __fmul_rn(a.q[(static_cast<std::size_t>(i0 + r / GC) * a.n_heads + hq0 + r % GC) * D + d], q_mul);
    qo_s[r * C::QP + d] = x;
  }
  __syncthreads();
  if constexpr (is_rot(KF)) prefill_fwht_rows(qo_s, kPmmaRows, D, C::QP, a.had_c);
  const int r0 = 16 * warp + g, r1 = r0 + 8;
  std::uint32_t qf[C::KD][4];
  {
    constexpr bool BF = op_bf16<KF>();
    const float* q0 = qo_s + r0 * C::QP + 2 * tig;
    const float* q1 = qo_s + r1 * C::QP + 2 * tig;
#pragma unroll
    for (int kd = 0; kd < C::KD; ++kd) {
      qf[kd][0] = pack2(to_op<BF>(q0[16 * kd]), to_op<BF>(q0[16 * kd + 1]));
      qf[kd][1] = pack2(to_op<BF>(q1[16 * kd]), to_op<BF>(q1[16 * kd + 1]));
      qf[kd][2] = pack2(to_op<BF>(q0[16 * kd + 8]), to_op<BF>(q0[16 * kd + 9]));
      qf[kd][3] = pack2(to_op<BF>(q1[16 * kd + 8]), to_op<BF>(q1[16 * kd + 9]));
    }
  }
  int lim[2];  // last visible key of rows r0, r1 (padding rows: every loaded key; never written)
  lim[0] = row_valid(r0) ? a.n_past + i0 + r0 / GC : t_end - 1;
  lim[1] = row_valid(r1) ? a.n_past + i0 + r1 / GC : t_end - 1;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float acc[C::ND][4];
#pragma unroll
  for (int n = 0; n < C::ND; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  __syncthreads();  // Q staging done before the raw stages (aliased) are written

  const int n_tiles = (t_end + C::BN - 1) / C::BN;  // the last one may be partial
  TileState<KF, VF, D> st{qf, lim, a.softcap2, lane, tig, m, l, acc};
  if constexpr (C::DIRECT) run_tiles_direct<KF, VF, D>(a, kvh, t_end, n_tiles, pm_smem, st);
  else run_tiles_dequant<KF, VF, D>(a, kvh, t_end, n_tiles, pm_smem, warp, st);

  // write_out: O / l (x fp8 V scale) -> shared memory, inverse rotation, coalesced stores.
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  const float v_mul = head_v_mul(a.v_mul, a.v_heads, kvh);
  const float inv0 = v_mul / l[0], inv1 = v_mul / l[1];
#pragma unroll
  for (int n = 0; n < C::ND; ++n) {
    const int d = 8 * n + 2 * tig;
    qo_s[r0 * C::QP + d] = acc[n][0] * inv0;
    qo_s[r0 * C::QP + d + 1] = acc[n][1] * inv0;
    qo_s[r1 * C::QP + d] = acc[n][2] * inv1;
    qo_s[r1 * C::QP + d + 1] = acc[n][3] * inv1;
  }
  __syncthreads();
  if constexpr (is_rot(VF)) prefill_fwht_rows(qo_s, kPmmaRows, D, C::QP, a.had_c);
  for (int idx = threadIdx.x; idx < kPmmaRows * D; idx += kPmmaThreads) {
    const int r = idx / D, d = idx % D;
    if (row_valid(r))
      a.out[(static_cast<std::size_t>(i0 + r / GC) * a.n_heads + hq0 + r % GC) * D + d] = qo_s[r * C::QP + d];
  }
}

// Launcher (explicitly instantiated one K half format per file: prefill_mma_k_<fmt>.cu).
template <HF KF, HF VF, int D>
void launch_prefill_mma(const PmmaLaunch& L, cudaStream_t stream) {
  using C = PmmaCfg<KF, VF, D>;
  auto k = prefill_mma_kernel<KF, VF, D>;
  static bool smem_set = false;
  if (!smem_set) {
    KVGATE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
    smem_set = true;
  }
  const dim3 grid(L.n_qtiles, L.p.n_kv_heads * L.p.n_hchunks);
  k<<<grid, kPmmaThreads, C::SMEM, stream>>>(L);
  KVGATE_CUDA_CHECK(cudaGetLastError());
}

#define KVGATE_PMMA_INST_KV(KF, VF)                                                        \
  template void launch_prefill_mma<KF, VF, 64>(const PmmaLaunch&, cudaStream_t);           \
  template void launch_prefill_mma<KF, VF, 128>(const PmmaLaunch&, cudaStream_t);          \
  template void launch_prefill_mma<KF, VF, 256>(const PmmaLaunch&, cudaStream_t);
// Every V half format the kernel reads: the rows of KVGATE_HALF_FORMATS marked mma.
#define KVGATE_PMMA_INST_ROW(KF, name, prefill_mma) KVGATE_PMMA_INST_ROW_##prefill_mma(KF, name)
#define KVGATE_PMMA_INST_ROW_mma(KF, name) KVGATE_PMMA_INST_KV(KF, HF::name)
#define KVGATE_PMMA_INST_ROW_none(KF, name)
#define KVGATE_PMMA_INST_K(KF) KVGATE_HALF_FORMATS(KVGATE_PMMA_INST_ROW, KF)

}  // namespace kvgate::cuda::detail
