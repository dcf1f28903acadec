// Teacher-forced quality per position and its depth buckets.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kvgate/signoff.hpp"

namespace kvgate::signoff {

namespace {

int argmax_row(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

void log_softmax(const float* x, int n, std::vector<double>& out) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) mx = std::max(mx, double(x[i]));
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(double(x[i]) - mx);
  const double ls = std::log(s) + mx;
  out.resize(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = double(x[i]) - ls;
}

}  // namespace

PositionMetrics compare_position(const float* base, const float* got, int vocab, int target, std::int64_t depth) {
  thread_local std::vector<double> lp, lq;
  log_softmax(base, vocab, lp);
  log_softmax(got, vocab, lq);
  PositionMetrics m;
  m.depth = depth;
  double kl = 0, tv = 0;
  for (int i = 0; i < vocab; ++i) {
    const double p = std::exp(lp[static_cast<std::size_t>(i)]), q = std::exp(lq[static_cast<std::size_t>(i)]);
    kl += p * (lp[static_cast<std::size_t>(i)] - lq[static_cast<std::size_t>(i)]);
    tv += std::abs(p - q);
  }
  m.kl = std::max(0.0, kl);
  m.tv = std::min(1.0, 0.5 * tv);
  m.top1_agree = argmax_row(base, vocab) == argmax_row(got, vocab);
  if (target >= 0 && target < vocab) {
    m.has_target = true;
    m.nll_base = -lp[static_cast<std::size_t>(target)];
    m.nll_fmt = -lq[static_cast<std::size_t>(target)];
  }
  return m;
}

std::vector<PositionMetrics> compare_sequences(const std::vector<std::vector<float>>& base,
                                               const std::vector<std::vector<float>>& got,
                                               const std::vector<std::vector<int>>& tokens, int vocab) {
  std::vector<PositionMetrics> out;
  const std::size_t V = static_cast<std::size_t>(vocab);
  for (std::size_t s = 0; s < base.size() && s < got.size() && s < tokens.size(); ++s) {
    const std::size_t n = std::min({base[s].size() / V, got[s].size() / V, tokens[s].size()});
    for (std::size_t t = 0; t < n; ++t) {
      const int target = t + 1 < tokens[s].size() ? tokens[s][t + 1] : -1;
      out.push_back(compare_position(base[s].data() + t * V, got[s].data() + t * V, vocab, target,
                                     static_cast<std::int64_t>(t)));
    }
  }
  return out;
}

std::vector<DepthBucket> default_buckets() {
  return {{"0-1K", 0, 1024}, {"1K-4K", 1024, 4096}, {"4K-16K", 4096, 16384}, {"16K+", 16384, -1}};
}

QualityStats summarize(const std::vector<PositionMetrics>& pm) {
  QualityStats s;
  if (pm.empty()) return s;
  std::vector<double> kls;
  kls.reserve(pm.size());
  double kl_sum = 0, tv_sum = 0, nll_b = 0, nll_f = 0;
  std::int64_t agree = 0, np = 0;
  for (const auto& m : pm) {
    kls.push_back(m.kl);
    kl_sum += m.kl;
    tv_sum += m.tv;
    agree += m.top1_agree ? 1 : 0;
    if (m.has_target) {
      ++np;
      nll_b += m.nll_base;
      nll_f += m.nll_fmt;
    }
  }
  const double n = static_cast<double>(pm.size());
  s.positions = static_cast<std::int64_t>(pm.size());
  s.ppl_positions = np;
  s.kl_mean = kl_sum / n;
  std::sort(kls.begin(), kls.end());
  // Nearest-rank p99 (the matrix's definition).
  const std::size_t rank = static_cast<std::size_t>(std::ceil(0.99 * static_cast<double>(kls.size())));
  s.kl_p99 = kls[std::min(kls.size() - 1, rank == 0 ? 0 : rank - 1)];
  s.kl_max = kls.back();
  s.top1 = static_cast<double>(agree) / n;
  s.one_minus_tv = 1.0 - tv_sum / n;
  if (np > 0) {
    s.ppl_base = std::exp(nll_b / static_cast<double>(np));
    s.ppl_fmt = std::exp(nll_f / static_cast<double>(np));
    s.ppl_delta = s.ppl_fmt / s.ppl_base - 1.0;
  }
  return s;
}

QualityReport bucket_quality(const std::vector<PositionMetrics>& pm, const std::vector<DepthBucket>& buckets) {
  QualityReport r;
  r.all = summarize(pm);
  for (const auto& b : buckets) {
    std::vector<PositionMetrics> in;
    for (const auto& m : pm)
      if (b.contains(m.depth)) in.push_back(m);
    r.buckets.push_back({b, summarize(in)});
  }
  return r;
}

std::optional<double> value_of(const QualityStats& s, Metric m) {
  if (s.empty()) return std::nullopt;
  switch (m) {
    case Metric::kl_mean: return s.kl_mean;
    case Metric::kl_p99: return s.kl_p99;
    case Metric::top1: return s.top1;
    case Metric::one_minus_tv: return s.one_minus_tv;
    case Metric::ppl_delta:
      if (s.ppl_positions == 0) return std::nullopt;
      return s.ppl_delta;
    default: return std::nullopt;
  }
}

std::optional<double> NoiseFloor::worst(Metric m) const {
  std::optional<double> w;
  const Direction d = info(m).direction;
  for (const auto& r : runs) {
    const auto v = value_of(r.quality.all, m);
    if (!v) continue;
    // The worst noise is the value farthest on the failing side: largest for at_most metrics
    // (KL; the perplexity delta by its magnitude: two runs that should agree may differ either
    // way), smallest for at_least metrics (top-1, 1 - TV).
    const double x = m == Metric::ppl_delta ? std::abs(*v) : *v;
    if (!w || (d == Direction::at_most ? x > *w : x < *w)) w = x;
  }
  return w;
}

}  // namespace kvgate::signoff
