// Every numeric bound a gate uses, in one place, each with its derivation. Bounds come from the
// format definitions (docs/FORMATS.md) and IEEE-754 error analysis, never from a measurement.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>

namespace kvgate::gates {

inline constexpr double kU32 = 0x1p-24;  // unit roundoff of binary32 (RNE)

// Scale rounded upward to binary16: s_f16 <= s_exact*(1 + 2^-10) for normal binary16 (10 mantissa
// bits), and s_f16 <= s_exact + 2^-24 in the subnormal range (spacing 2^-24). Both together:
inline double f16_up_hi(double s_exact) { return s_exact * (1.0 + 0x1p-10) + 0x1p-24; }

// FP slack of a quantizer: one binary32 rounding of x/s (<= u*|x/s| <= 127u code units) and one of
// code*s (<= u|x^|). 4u(|x| + 127 s) covers both with a factor 2 margin.
inline double quant_slack(double x, double s) { return 4 * kU32 * (std::fabs(x) + 127 * s); }

// int8 / q8_0: |x^ - x| <= s/2 with s = f16_up(amax/127)           (FORMATS.md int8, q8_0)
inline double absmax127_bound(double x, double amax) {
  const double s = f16_up_hi(amax / 127);
  return s / 2 + quant_slack(x, s);
}

// q4_0: |d| = f16_up(|m|/8). Elements that round inside the grid: <= |d|/2. Opposite-side elements
// beyond 7.5|d| clamp to code 15: error = |x| - 7|d| <= |m| - 7|d| <= |d|.     (FORMATS.md q4_0)
inline double q4_0_bound(double x, double m_abs, bool clamped) {
  const double d = f16_up_hi(m_abs / 8);
  return (clamped ? d : d / 2) + quant_slack(x, d);
}
// An element is in the clamped population when it lies opposite to the extreme m and beyond 7.5*|m|/8.
inline bool q4_0_clamped(double x, double m) { return (x * m < 0) && std::fabs(x) > 7.5 * std::fabs(m) / 8 * (1 - 1e-6); }
// q4_0_rot: the runtime rotates in binary32, so an element within 0.1|d| of the clamp threshold
// may land on either side; such elements get the clamp bound (|d| instead of |d|/2).
inline bool q4_0_clamped_near(double x, double m) { return (x * m < 0) && std::fabs(x) > 7.4 * std::fabs(m) / 8; }

// fp8 (y = x/s normal, unsaturated): half-ulp of a 3-bit (e4m3) / 2-bit (e5m2) mantissa is 2^-4 / 2^-3
// relative; subnormal spacing 2^-9 / 2^-16 gives 2^-10 s / 2^-17 s absolute; + slack for the binary32
// division and the multiply by s (2u relative each).
inline double fp8_e4m3_bound(double x, double s) { return 0x1p-4 * std::fabs(x) + 0x1p-10 * s + 4 * kU32 * std::fabs(x); }
inline double fp8_e5m2_bound(double x, double s) { return 0x1p-3 * std::fabs(x) + 0x1p-17 * s + 4 * kU32 * std::fabs(x); }
// MX (OCP Microscaling v1.0, FORMATS.md "mxfp8 and mxfp4"): the block scale is the power of two
// X = 2^(floor(log2 amax) - emax) (emax 8 for E4M3, 2 for E2M1), clamped below at 2^-127. X comes from
// amax with no rounding, and x/X, code*X are exact in binary32 (a power of two), so no FP slack:
// the only error is the element rounding. Since 2^floor(log2 amax) <= amax < 2^(floor(log2 amax)+1),
// amax*2^-(emax+1) < X <= amax*2^-emax, i.e. |x/X| < 2^(emax+1) for every element of the block:
//   E4M3 (3 mantissa bits): |x/X| in the normal range rounds with half-ulp <= 2^-4 |x/X|, subnormals
//     (spacing 2^-9) with <= 2^-10: |x^ - x| <= 2^-4|x| + 2^-10 X (<= 2^-4|x| + 2^-18 amax). RNE keeps
//     |x/X| <= 464 at 448; beyond it, up to the bound 512, the element saturates to 448 X and errs by
//     |x| - 448X < |x| - 448|x|/512 = 2^-3 |x| (the saturated population, counted apart).
//   E2M1 (1 mantissa bit): half-ulp 2^-2 |x/X| for |x/X| >= 1, 2^-2 below (spacing 0.5): |x^ - x| <=
//     2^-2|x| + 2^-2 X (<= 2^-2|x| + 2^-4 amax); a saturated element (6X < |x| < 8X) errs by
//     |x| - 6X <= |x|/4 since |x| <= 8X, so the one bound covers saturation.
inline double mx_scale(double amax, int emax) {
  if (!(amax > 0)) return 0x1p-127;
  int e2 = 0;
  std::frexp(amax, &e2);  // amax = f 2^e2, f in [0.5, 1)
  return std::ldexp(1.0, std::max(e2 - 1 - emax, -127));
}
inline constexpr int kMxfp8Emax = 8;
inline constexpr int kMxfp4Emax = 2;
inline bool mxfp8_saturated(double x, double amax) { return std::fabs(x) > 448.0 * mx_scale(amax, kMxfp8Emax); }
inline double mxfp8_bound(double x, double amax) {
  const double X = mx_scale(amax, kMxfp8Emax);
  return mxfp8_saturated(x, amax) ? 0x1p-3 * std::fabs(x) : 0x1p-4 * std::fabs(x) + 0x1p-10 * X;
}
inline double mxfp4_bound(double x, double amax) {
  return 0x1p-2 * std::fabs(x) + 0x1p-2 * mx_scale(amax, kMxfp4Emax);
}
inline bool mxfp4_saturated(double x, double amax) { return std::fabs(x) > 6.0 * mx_scale(amax, kMxfp4Emax); }

// nvfp4 (FORMATS.md "nvfp4"): two levels of rounding. t = (amax/6)/g in binary32 (2u relative), the
// block scale sb = e4m3(t): |sb - t| <= 2^-4 t (normal t: half an ulp of a 3-bit mantissa) or 2^-10
// (subnormal t: half the spacing 2^-9); S = sb*g in binary32 (u). Hence
//   S <= (amax/6 (1 + 2^-4) + 2^-10 g)(1 + 4u)                                  (nvfp4_scale_hi)
//   6S >= amax (1 - 2^-4)(1 - 3u) - 6*2^-10 g.
// An element with |x/S| < 7 rounds onto the E2M1 grid (saturating to 6 costs |x| - 6S <= |x|/4
// there): |e| <= 2^-2|x| + 2^-2 S <= 2^-2|x| + 2^-2 S_hi. An element beyond (possible only where the
// block scale was rounded down, amax/S > 6) saturates to 6S: |e| = |x| - 6S <= amax - 6S
// <= 2^-4 amax + 6*2^-10 g + 3u amax. The binary32 quotient x/S and product code*S add <= u|x/S|
// code units and u|x^|: 4u(|x| + 6 S_hi) + 4u amax covers all slack with margin. Domain: t <= 448
// (a calibrated global scale; the gates' scales follow the data).
inline double nvfp4_scale_hi(double amax, double g) {
  return (amax / 6 * (1 + 0x1p-4) + 0x1p-10 * g) * (1 + 4 * kU32);
}
inline double nvfp4_bound(double x, double amax, double g) {
  const double S = nvfp4_scale_hi(amax, g);
  const double grid = 0x1p-2 * std::fabs(x) + 0x1p-2 * S;
  const double sat = 0x1p-4 * amax + 6 * 0x1p-10 * g;
  return std::max(grid, sat) + 4 * kU32 * (std::fabs(x) + 6 * S + amax);
}

// fp8_per_token_head / int8_per_token_head (FORMATS.md): per cell (token, KV head), amax over the
// finite elements, s = fl(amax / qmax) in binary32 (qmax 448 / 127), s = 1 where that quotient rounds
// to 0 (amax/qmax <= 2^-150: an all-zero cell, or an underflow). fl() is RNE: a normal s has
// |s - amax/qmax| <= u amax/qmax, a subnormal one <= 2^-150 (half the spacing 2^-149); so
//   s <= amax/qmax (1 + u) + 2^-150                                              (pth_scale_hi)
// (amax/qmax is taken in binary64 here; the switch to s = 1 is taken with a margin of 1e-9, which
// only ever picks the larger of the two values.) The element: y = fl(x/s), |y - x/s| <= u|x/s|.
//   Normal s: s >= amax/qmax (1 - u), so |y| <= qmax (1 + u)^2 / (1 - u) < qmax + 1/2 (and < 464 for
//     448): nothing saturates or clamps beyond what rounding onto the grid already does.
//   Subnormal s: qmax s >= amax - qmax 2^-150, so an element past the grid errs by at most
//     amax - qmax s <= qmax 2^-150 beyond the grid term (an absolute term, 7*2^-144 / 127*2^-150).
//   s = 1: |x| <= amax <= qmax 2^-150, every code rounds to 0 (fp8: a subnormal code at most).
// fp8_per_token_head, e4m3 RNE onto the grid: |code - y| <= 2^-4 |y| (normal) or 2^-10 (subnormal
// codes), then x^ = fl(code s) (u):
//   |x^ - x| <= 2^-4|x| + 2^-10 s (1 + 4u) + 4u|x| + 448 2^-150.
// int8_per_token_head, rint (round half to even) onto the integers: |code - y| <= 1/2, so
//   |x^ - x| <= s/2 + quant_slack(x, s) + 127 2^-150.
// (Rounding by truncation toward zero, as vLLM's INT8 per-token-head store does, has |code - y| < 1:
// the bound would double to s. kvgate rounds to nearest even: FORMATS.md.)
inline double pth_scale_hi(double amax, double qmax) {
  const double q = amax / qmax;
  return q <= 0x1p-150 * (1 + 1e-9) ? 1.0 : q * (1 + kU32) + 0x1p-150;
}
inline double fp8_pth_bound(double x, double amax) {
  const double s = pth_scale_hi(amax, 448.0);
  return 0x1p-4 * std::fabs(x) + 0x1p-10 * s * (1 + 4 * kU32) + 4 * kU32 * std::fabs(x) + 448 * 0x1p-150;
}
inline double int8_pth_bound(double x, double amax) {
  const double s = pth_scale_hi(amax, 127.0);
  return s / 2 + quant_slack(x, s) + 127 * 0x1p-150;
}

inline constexpr double kE4m3Max = 448.0;
inline constexpr double kE5m2Max = 57344.0;
inline constexpr double kE4m3MinNormal = 0x1p-6;
inline constexpr double kE5m2MinNormal = 0x1p-14;

// f16 / bf16 RNE: half an ulp, 2^-11 / 2^-8 relative in the normal range; f16 subnormals have
// absolute spacing 2^-24 (half: 2^-25).
inline double f16_bound(double x) { return std::max(0x1p-11 * std::fabs(x), 0x1p-25); }
inline double bf16_bound(double x) { return 0x1p-8 * std::fabs(x); }

// Walsh-Hadamard in binary32: log2(n) butterfly levels, each adds <= u relative to the running L2
// norm, plus the final scaling: |y32 - y64| <= (log2 n + 2) u ||x||_2 per element.
inline double wht_slack(int n, double l2) { return (std::log2(static_cast<double>(n)) + 2) * kU32 * l2 * 2; }

// Anti-vacuity: over a case of random data with thousands of elements, a quantizer that really
// rounds to the declared grid reaches at least this fraction of its envelope somewhere (uniform
// rounding error on [-s/2, s/2]: P(|e| < 0.3 s/2) per element = 0.3, so over >= 256 elements the
// chance that none exceeds it is 0.3^256). A silent fallback to a finer format fails it.
inline constexpr double kMinEnvelopeUse = 0.3;

// Attention in binary32 vs binary64 over the same dequantized K/V (ORA): the score of each key
// has forward error <= gamma_D * L1 where L1 = scale * sum|q_i k_i| (gamma_n ~ n u); a score error
// e perturbs each softmax weight by a factor exp(+-2e), hence the output by <= 4e*vmax; the
// weighted sum over n_ctx keys and the normalisation add gamma_{n_ctx+2} * vmax. Factor 4 margin
// for the exp/division roundings.
inline double attn_f32_max_abs(int head_dim, int n_ctx, double max_l1_score, double vmax) {
  const double score_err = (head_dim + 2) * kU32 * max_l1_score;
  return 4 * (4 * score_err + (n_ctx + 8) * kU32) * vmax + 1e-30;
}

// Latent attention in the weight-absorbed form (runtime attention_mla.hpp) in binary32 vs the
// textbook expanded form in binary64 over the same dequantized latent (ORA.mla). The runtime's score
// of key t is q_lat . c_t + q_rope . r_t with q_lat = W_UK^T q_nope: a sum of the same products
// q_n W[n][j] c_j (and q_r r_r) as the expanded score, associated differently, through a chain of at
// most nope + kv_lora + rope + 4 binary32 roundings, so its error is <= gamma_(nope+kv_lora+rope+4) *
// L1 with L1 = scale * sum_(n,j) |q_n W[n][j] c_j| + scale * sum_r |q_r r_r| (the absolute sum of the
// expanded triple product). As attn_f32_max_abs, a score error e moves the output by <= 4 e vmax
// (vmax = max |W_UV c_t|, the expanded values). The value side: the latent accumulation
// o_lat = sum_t p_t c_t and the normalisation round by <= gamma_(n_ctx+8) cmax per element, and the
// W_UV dot product by <= gamma_(kv_lora+2) of its absolute sum, each carried by W_UV's row L1 norm
// (wl1 = max_v sum_j |W_UV[v][j]|). Factor 4 margin for the exp and division roundings, as there.
inline double mla_absorbed_f32_max_abs(int nope, int rope, int kv_lora, int n_ctx, double max_l1_score, double vmax,
                                       double wl1, double cmax) {
  const double score_err = (nope + kv_lora + rope + 4.0) * kU32 * max_l1_score;
  return 4 * (4 * score_err * vmax + (n_ctx + kv_lora + 10.0) * kU32 * wl1 * cmax) + 1e-30;
}

// The same over the CUDA latent kernel (runtime/cuda/kernels/mla_decode.cuh, ORA.cuda.mla): the score
// chain is the host's FP32 absorption (nope roundings per q_lat element), then the kernel's dot
// product, which each of 32 lanes sums as a fused chain of ceil(kv_lora / 32) + ceil(rope / 32)
// products before 5 butterfly levels: any association of those sums errs by <= gamma_depth of their
// absolute sum with depth = nope + ceil(kv_lora / 32) + ceil(rope / 32) + 5, plus 4 for the query
// multiplier and the per-element scalings as above. The value side is the CPU bound's (the kernel's
// o_lat chain of n_ctx + n_ctx / 16 + splits + 3 roundings lies within gamma_(n_ctx + kv_lora + 10)).
inline double mla_absorbed_gpu_max_abs(int nope, int rope, int kv_lora, int n_ctx, double max_l1_score, double vmax,
                                       double wl1, double cmax) {
  const double depth = nope + (kv_lora + 31) / 32 + (rope + 31) / 32 + 5 + 4.0;
  return 4 * (4 * depth * kU32 * max_l1_score * vmax + (n_ctx + kv_lora + 10.0) * kU32 * wl1 * cmax) + 1e-30;
}

// Tensor-core prefill (runtime/cuda/kernels/prefill_mma.cuh). Its declared arithmetic: the query
// is scaled in binary32 (and rotated for a rotated K), then rounded ONCE to the K operand type; K and
// V are dequantized to the operand type (f16: code x scale in binary32, exact, then one RNE to f16;
// f16/bf16 halves and fp8 codes are exact); P is rounded to the V operand type; products are exact
// and every sum is FP32. Two parts, each a bound of its own:
//
// (1) The operand rounding, derived from the formats: with relative roundings u_q (query), u_k (K
//     element), u_v (V element) a product q~ k~ = q k (1 + d), |d| <= (1 + u_q)(1 + u_k) - 1, so the
//     score moves by <= ((1+u_q)(1+u_k)-1) * L1 (L1 = scale * sum |q_i k_i|); a score error e moves
//     each softmax weight by a factor exp(+-2e), the output by <= 4 e vmax (x4 margin as
//     attn_f32_max_abs); a V element rounding moves the output by <= u_v vmax (x2). u = 2^-11 for an
//     f16 operand (11-bit significand, RNE), 2^-8 for bf16, 0 where the stored value is the operand;
//     u_q adds 8u (binary32 scaling) to the operand rounding. For bf16 (u_q = 2^-8), L1 ~ 15 and
//     vmax ~ 0.2 this is ~0.2 (!), i.e. above the output's RMS: it is what a 16-bit MMA costs against
//     FP64 attention over the *stored* values, checked (oracle vs oracle) but not used to judge the
//     kernel, because at that size it could not see a wrong page or scale.
inline double attn_operand_rounding_bound(double u_q, double u_k, double u_v, double max_l1_score, double vmax) {
  const double score_err = ((1 + u_q) * (1 + u_k) - 1) * max_l1_score;
  return 4 * 4 * score_err * vmax + 2 * u_v * vmax + 1e-30;
}
// (2) The kernel against FP64 attention over ITS operands (q~, K~, V~ reproduced bit for bit by the
//     gate: the same binary32 scaling, rotation order and RNE), per output element (row r, dim d):
//     - the scores: D exact products summed in FP32 by D/16 chained MMA steps; a step adds 16
//       exact products to the accumulator with at most 2 roundings that may truncate (2u each):
//       depth 4 * D/16 = D/4, +8 for the exp2 argument's subtraction and slack, i.e.
//       attn_f32_max_abs(head_dim = D/4 + 8) (its own "+2" on top); P.V and l: n_ctx/16 MMA steps
//       (4u each) plus one rescale per tile and the per-thread sums of l, all within the CUDA-core
//       kernel's n_ctx + ceil(n_ctx/32) + 4 terms, which are kept;
//     - P rounded to the V operand type after the FP32 exp2: |p~ - p| <= u_p p + 2^-25 (f16
//       subnormals below 2^-14; bf16 is normal far below), while l sums the unrounded p, so the
//       output moves by <= u_p * sum_j w_j |v_jd| + n_ctx 2^-25 vmax (l >= 1: the running max's own
//       key contributes 1); x2 margin. sum_j w_j |v_jd| = b_rd is computed by the reference;
//     - the epilogue's binary32 division and V-scale product: 4u |o_rd|.
inline double attn_mma_elem_bound(double f32_part, double u_p, double b_rd, int n_ctx, double vmax, double o_rd) {
  return f32_part + 2 * (u_p * b_rd + n_ctx * 0x1p-25 * vmax) + 4 * kU32 * std::fabs(o_rd) + 1e-30;
}
inline constexpr double kF16OperandU = 0x1p-11;
inline constexpr double kBf16OperandU = 0x1p-8;

// ORA attention sensitivity: the derived FP32 bound must stay below this fraction of the output's
// RMS, so any read-side error of that size (a wrong scale, page or head is O(1)) goes red.
inline constexpr double kOraSensitivity = 0.10;

}  // namespace kvgate::gates

// ---- model level (gates/model_vs_oracle: ORA.model, MOD) ------------------------------------------
namespace kvgate::gates {

// ORA.model — runtime binary32 forward vs the oracle's (independent code, binary32 and binary64).
// Forward error analysis: each binary32 rounding is a relative perturbation (1+d), |d| <= u. Along
// the longest chain of dependent roundings from the inputs to one logit there are N of them: per
// layer the attention RMSNorm (dim squares summed, rsqrt, scale: dim+3), the Q/K/V dot products (dim),
// RoPE (the angle pos*theta_i in binary32 carries <= 2*pos*u relative error; rotation 2), the score
// (head_dim + 1), softmax (exp 2, a sum over n_ctx = pos+1 keys, a division: n_ctx+3), P*V (n_ctx),
// Wo (q_dim) and the residual add (1), the FFN RMSNorm (dim+3), W1/W3 (dim), SiLU and the gate
// product (4), W2 (hidden) and its add (1); then the final RMSNorm (dim+3) and the classifier (dim).
// RoPE variants (rope.hpp) compute each inverse frequency with more binary32 operations than the
// plain 1/theta^(2i/d): `rope_freq_ops` roundings of relative size u each (plain 1; linear 2: the
// division by the factor; longrope 3: factor product and division; dynamic 4: the grown base;
// yarn 6: both frequencies, the ramp weights and the blend; llama3 8: the wavelength, the smooth
// factor and the blend), so the angle pos*freq carries <= (rope_freq_ops + 1)*pos*u, and an attention
// scaling on cos/sin (yarn, longrope) adds one rounding to the rotation (`rope_scaled`).
inline double forward_rounding_chain(int n_layers, int dim, int hidden, int head_dim, int q_dim, int pos,
                                     int rope_freq_ops = 1, bool rope_scaled = false) {
  const double n_ctx = pos + 1.0;
  const double rope = (rope_freq_ops + 1.0) * pos + (rope_scaled ? 3 : 2);
  const double per_layer = (dim + 3.0) + dim + rope + (head_dim + 1.0) + (n_ctx + 3) + n_ctx +
                           (q_dim + 1.0) + (dim + 3.0) + dim + 4 + (hidden + 1.0);
  return n_layers * per_layer + (dim + 3.0) + dim;
}
// With relative condition number <= 1 the computed logits then satisfy |z^ - z| <= gamma_N * max|z|
// (relative to the logit magnitude of that position), gamma_N = N u / (1 - N u). Worst-case gamma_N
// grows like N while random roundings grow like sqrt(N): the factor sqrt(N) (~90 for stories260K) is
// the margin for the network's conditioning. The assumption is checked, not trusted: the oracle's own
// binary32 forward must meet the same bound against its binary64 forward. Runtime vs oracle binary32:
// both within the bound of the exact value, hence within twice the bound of each other.
inline double forward_f32_logit_bound(double chain, double max_abs_logit) {
  const double nu = chain * kU32;
  return nu / (1 - nu) * max_abs_logit;
}
// Top-1 at one position may legitimately differ only where the exact top two logits are closer than
// the two evaluations' combined error (2 * bound).

// MOD — KL divergence and top-1 agreement of a KV format against f32 KV (same runtime, same tokens).
// Statistical model of the format's KV error: each stored K/V element's error is bounded by the
// format's envelope E_i (docs/FORMATS.md: int8/q8_0 s/2; q4_0 |d|/2, or |d| for the clamped
// population, q4_0_rot the same in the rotated domain; mxfp8 2^-4|x| + 2^-10 X (saturated: the excess
// |x| - 448X), mxfp4 2^-2|x| + 2^-2 X, nvfp4 2^-2|x| + 2^-2 S (saturated: the excess |x| - 6S);
// fp8 2^-4|x| + 2^-10 s (e4m3; fp8_per_token_head with the cell's s = amax/448), int8_per_token_head
// s/2 (s = amax/127),
// 2^-3|x| + 2^-17 s (e5m2); f16/bf16 half an ulp), and, as in the standard quantization-noise model,
// zero-mean and independent of the other errors and of the queries and weights, with
// E[e_i^2] <= E_i^2 / 3 (uniform over [-E_i, E_i]; formats whose ulp/2 is below E_i are lower still).
// Reference perturbation R_F: e_i = +-E_i with independent random signs on every K and V element of
// every layer (after RoPE, before attention, current token included), in the oracle's independent
// forward — the largest energy an envelope-respecting independent error can have, >= 3x the energy a
// correct format is expected to inject. KL ~ (1/2) dz^T F dz grows with the error energy (quadratic
// for small errors, saturating beyond) and top-1 flips grow with |dz|, so a correct format's expected
// metrics are at most R_F's, with a factor 3 (KL) / sqrt(3) (flips) to spare in the small-error
// regime. The thresholds are R_F's own metrics over the same positions:
//   mean KL <= mean KL(R_F),   p99 KL <= p99 KL(R_F),   top-1 disagreements <= mod_top1_allowed(n(R_F)).
// A format whose real error is worse than independent noise at its envelope (a biased rounding, a
// wrong scale, a read from the wrong head or page) exceeds them; the anti-vacuity cases construct one.
// The top-1 counts are Poisson-like; 3 sigma of both counts is allowed on top of the reference's.
inline double mod_top1_allowed(long n_reference_disagreements) {
  return double(n_reference_disagreements) + 3.0 * std::sqrt(double(n_reference_disagreements) + 1.0);
}
// The quantile used for the tail metric (nearest rank over all compared positions).
inline constexpr double kModKlQuantile = 0.99;

// STO.noop (gates/conformance/noop_gate.cpp) — a half really quantized on its declared grid. Each
// element's round-trip error r = (x^ - x) / step, in units of the declared grid's step at x (the ulp
// of a float code, the scale of an integer code), is a rounding residual: |r| <= 1/2, and for data
// whose position between grid points is spread (gaussian values, thousands of elements) r is
// uniform on [-1/2, 1/2], RMS 1/sqrt(12) = 0.2887 (the standard quantization-noise model). A grid
// one bit finer halves it (0.144), one bit coarser doubles it (0.577); not quantizing gives 0. The
// gate accepts the residual RMS within half a bit of the declared grid, a factor sqrt(2) either way.
// Sampling: over >= 4096 elements the RMS's relative spread is < 2%, far inside that factor; the
// few elements that saturate or clamp (errors up to 2 steps) move it by less.
inline constexpr double kNoopResidualRms = 0.28867513459481287;  // 1 / sqrt(12)
inline constexpr double kNoopResidualRmsLo = kNoopResidualRms / 1.4142135623730951;
inline constexpr double kNoopResidualRmsHi = kNoopResidualRms * 1.4142135623730951;
// The code symbols of a page of gaussian data take more values than a constant, a sign and zero:
// at least 4 (a page that is all zero, or one constant code per group, fails).
inline constexpr std::size_t kNoopMinDistinctCodes = 4;

}  // namespace kvgate::gates
