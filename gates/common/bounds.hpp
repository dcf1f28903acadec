// Every numeric bound a gate uses, in one place, each with its derivation. Bounds come from the
// format definitions (docs/FORMATS.md) and IEEE-754 error analysis, never from a measurement.
#pragma once
#include <algorithm>
#include <cmath>

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

// ORA attention sensitivity: the derived FP32 bound must stay below this fraction of the output's
// RMS, so any read-side error of that size (a wrong scale, page or head is O(1)) goes red.
inline constexpr double kOraSensitivity = 0.10;

}  // namespace kvgate::gates

// ---- model level (gates/model_level: ORA.model, MOD) ------------------------------------------
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
// population, q4_0_rot the same in the rotated domain; fp8 2^-4|x| + 2^-10 s (e4m3),
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

}  // namespace kvgate::gates
