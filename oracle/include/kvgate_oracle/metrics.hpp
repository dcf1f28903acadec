// Comparison metrics in the style of llama.cpp test-backend-ops. All sums in binary64.
// Callers check count_nonfinite first: the other metrics propagate NaN rather than hide it.
#pragma once
#include <cstddef>
#include <span>

namespace kvgate_oracle {

size_t count_nonfinite(std::span<const float> x);
size_t count_nonfinite(std::span<const double> x);

// Σ(got−ref)² / Σref²  (0 when both are 0; +inf when only ref is 0). Sizes must match.
double nmse(std::span<const double> ref, std::span<const float> got);
double nmse(std::span<const float> ref, std::span<const float> got);

// max |got − ref| (NaN if any difference is NaN).
double max_abs_diff(std::span<const double> ref, std::span<const float> got);
double max_abs_diff(std::span<const float> ref, std::span<const float> got);
double max_abs_diff(std::span<const double> ref, std::span<const double> got);

// a·b / (‖a‖‖b‖); 1 when both are zero vectors, 0 when exactly one is.
double cosine(std::span<const double> a, std::span<const float> b);
double cosine(std::span<const float> a, std::span<const float> b);

// KL(P‖Q) with P = softmax(p_logits), Q = softmax(q_logits), log-sum-exp in binary64.
double kl_divergence_from_logits(std::span<const float> p_logits, std::span<const float> q_logits);

// argmax (first index on ties) of a equals argmax of b.
size_t argmax(std::span<const float> x);
bool top1_agree(std::span<const float> a, std::span<const float> b);

}  // namespace kvgate_oracle
