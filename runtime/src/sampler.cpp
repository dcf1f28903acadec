#include "kvgate/sampler.hpp"

#include <algorithm>
#include <cmath>

namespace kvgate {

std::uint32_t random_u32(std::uint64_t& state) {
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  return static_cast<std::uint32_t>((state * 0x2545F4914F6CDD1Dull) >> 32);
}

float random_f32(std::uint64_t& state) { return static_cast<float>(random_u32(state) >> 8) / 16777216.0f; }

int argmax(std::span<const float> v) {
  int best = 0;
  for (std::size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[static_cast<std::size_t>(best)]) best = static_cast<int>(i);
  return best;
}

Sampler::Sampler(int vocab_size, SamplerOptions opts)
    : opts_(opts), state_(opts.seed ? opts.seed : 0x9E3779B97F4A7C15ull) {
  probs_.resize(static_cast<std::size_t>(vocab_size));
  cand_.reserve(static_cast<std::size_t>(vocab_size));
}

int Sampler::sample(std::span<const float> logits) {
  if (opts_.greedy()) return argmax(logits);
  const std::size_t n = logits.size();
  probs_.resize(n);
  // softmax(logits / T), as run.c: subtract the max, exp, normalize.
  float mx = -INFINITY;
  for (std::size_t i = 0; i < n; ++i) {
    probs_[i] = logits[i] / opts_.temperature;
    mx = std::max(mx, probs_[i]);
  }
  float sum = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    probs_[i] = std::exp(probs_[i] - mx);
    sum += probs_[i];
  }
  for (std::size_t i = 0; i < n; ++i) probs_[i] /= sum;
  const float coin = random_f32(state_);
  const bool use_k = opts_.top_k > 0 && static_cast<std::size_t>(opts_.top_k) < n;
  const bool use_p = opts_.top_p > 0.0f && opts_.top_p < 1.0f;
  auto by_prob = [](const ProbIndex& a, const ProbIndex& b) { return a.prob > b.prob || (a.prob == b.prob && a.index < b.index); };
  if (!use_k && !use_p) {  // run.c sample_mult
    float cdf = 0.0f;
    for (std::size_t i = 0; i < n; ++i) {
      cdf += probs_[i];
      if (coin < cdf) return static_cast<int>(i);
    }
    return static_cast<int>(n) - 1;  // rounding
  }
  cand_.clear();
  if (use_k) {
    for (std::size_t i = 0; i < n; ++i) cand_.push_back({probs_[i], static_cast<int>(i)});
    std::partial_sort(cand_.begin(), cand_.begin() + opts_.top_k, cand_.end(), by_prob);
    cand_.resize(static_cast<std::size_t>(opts_.top_k));
    float ks = 0.0f;
    for (const auto& c : cand_) ks += c.prob;
    for (auto& c : cand_) c.prob /= ks;  // renormalize over the top k before top-p
  } else {
    // run.c sample_topp: tokens below (1 - p)/(n - 1) cannot be part of the nucleus.
    const float cutoff = (1.0f - opts_.top_p) / static_cast<float>(n - 1);
    for (std::size_t i = 0; i < n; ++i)
      if (probs_[i] >= cutoff) cand_.push_back({probs_[i], static_cast<int>(i)});
    // The pre-filter can keep nothing: on logits flatter than the cutoff (every probability 1/n
    // below (1 - p)/(n - 1), i.e. top_p < 1/n) the nucleus is still the most probable token, which
    // the full sort below finds (run.c reads past its empty candidate list there).
    if (cand_.empty())
      for (std::size_t i = 0; i < n; ++i) cand_.push_back({probs_[i], static_cast<int>(i)});
    std::sort(cand_.begin(), cand_.end(), by_prob);
  }
  std::size_t last = cand_.size() - 1;
  float cum = 0.0f;
  if (use_p) {
    for (std::size_t i = 0; i < cand_.size(); ++i) {
      cum += cand_[i].prob;
      if (cum > opts_.top_p) {
        last = i;
        break;
      }
    }
  } else {
    for (const auto& c : cand_) cum += c.prob;
  }
  const float r = coin * cum;
  float cdf = 0.0f;
  for (std::size_t i = 0; i <= last; ++i) {
    cdf += cand_[i].prob;
    if (r < cdf) return cand_[i].index;
  }
  return cand_[last].index;
}

}  // namespace kvgate
