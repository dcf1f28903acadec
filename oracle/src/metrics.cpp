#include "kvgate_oracle/metrics.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace kvgate_oracle {

static void same_size(size_t a, size_t b) {
    if (a != b) throw std::invalid_argument("metrics: size mismatch");
}

template <typename T>
static size_t nonfinite(std::span<const T> x) {
    size_t n = 0;
    for (T v : x) n += !std::isfinite(v);
    return n;
}
size_t count_nonfinite(std::span<const float> x) { return nonfinite(x); }
size_t count_nonfinite(std::span<const double> x) { return nonfinite(x); }

template <typename R>
static double nmse_impl(std::span<const R> ref, std::span<const float> got) {
    same_size(ref.size(), got.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        double d = double(got[i]) - double(ref[i]);
        num += d * d;
        den += double(ref[i]) * double(ref[i]);
    }
    if (den == 0) return num == 0 ? 0.0 : (std::isnan(num) ? num : std::numeric_limits<double>::infinity());
    return num / den;
}
double nmse(std::span<const double> ref, std::span<const float> got) { return nmse_impl(ref, got); }
double nmse(std::span<const float> ref, std::span<const float> got) { return nmse_impl(ref, got); }

template <typename R, typename G>
static double max_abs_impl(std::span<const R> ref, std::span<const G> got) {
    same_size(ref.size(), got.size());
    double m = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        double d = std::fabs(double(got[i]) - double(ref[i]));
        if (std::isnan(d)) return d;
        if (d > m) m = d;
    }
    return m;
}
double max_abs_diff(std::span<const double> ref, std::span<const float> got) { return max_abs_impl(ref, got); }
double max_abs_diff(std::span<const float> ref, std::span<const float> got) { return max_abs_impl(ref, got); }
double max_abs_diff(std::span<const double> ref, std::span<const double> got) { return max_abs_impl(ref, got); }

template <typename A>
static double cosine_impl(std::span<const A> a, std::span<const float> b) {
    same_size(a.size(), b.size());
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        ab += double(a[i]) * double(b[i]);
        aa += double(a[i]) * double(a[i]);
        bb += double(b[i]) * double(b[i]);
    }
    if (aa == 0 && bb == 0) return 1.0;
    if (aa == 0 || bb == 0) return 0.0;
    return ab / (std::sqrt(aa) * std::sqrt(bb));
}
double cosine(std::span<const double> a, std::span<const float> b) { return cosine_impl(a, b); }
double cosine(std::span<const float> a, std::span<const float> b) { return cosine_impl(a, b); }

// log softmax in binary64: x_i - max - log Σ exp(x_j - max).
static std::vector<double> log_softmax(std::span<const float> x) {
    double mx = -std::numeric_limits<double>::infinity();
    for (float v : x) mx = std::max(mx, double(v));
    double sum = 0;
    for (float v : x) sum += std::exp(double(v) - mx);
    double lse = mx + std::log(sum);
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = double(x[i]) - lse;
    return out;
}

double kl_divergence_from_logits(std::span<const float> p_logits, std::span<const float> q_logits) {
    same_size(p_logits.size(), q_logits.size());
    std::vector<double> lp = log_softmax(p_logits), lq = log_softmax(q_logits);
    double kl = 0;
    for (size_t i = 0; i < lp.size(); ++i) {
        double p = std::exp(lp[i]);
        if (p > 0) kl += p * (lp[i] - lq[i]);  // 0·log 0 = 0
    }
    return kl;
}

size_t argmax(std::span<const float> x) {
    size_t best = 0;
    for (size_t i = 1; i < x.size(); ++i) if (x[i] > x[best]) best = i;
    return best;
}

bool top1_agree(std::span<const float> a, std::span<const float> b) {
    same_size(a.size(), b.size());
    return !a.empty() && argmax(a) == argmax(b);
}

}  // namespace kvgate_oracle
