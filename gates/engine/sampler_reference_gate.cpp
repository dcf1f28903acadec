// MOD.sampler.reference: every draw of the sampler equals the draw of a reference written from the
// sampling rule (README "Sampling", run.c), for a matrix of temperature x top-k x top-p x logits,
// top-k and top-p combined included. The class it closes: the sampler draws from the wrong
// distribution (temperature applied wrongly, top-k not renormalized before the top-p cut, the
// nucleus cut inclusive, the coin not scaled to the nucleus mass, top_k == vocab taken as a cut).
//
// The rule, as the reference below computes it in double precision:
//   p_i = softmax(logits / T);
//   no cut (top_k <= 0 or >= vocab, and top_p <= 0 or >= 1): the first id i (in id order) with
//     coin < cdf_i;
//   else the candidates are sorted by probability (ties: lower id first); top-k keeps the first k
//     and renormalizes them to sum 1; top-p (without top-k: only ids with p >= (1 - p)/(n - 1)) keeps
//     the shortest prefix whose cumulative mass is > top_p (strictly); the draw is the first
//     candidate with coin * mass(prefix) < cdf.
// The coin is the sampler's own xorshift stream (random_f32 from the seed), one coin per draw.
//
// Bound: the draw is an id, compared exactly. The sampler computes in binary32 and the reference in
// binary64, so they may disagree only when the scaled coin lies within the binary32 error of a cdf
// boundary: n additions of terms <= 1 give |cdf32 - cdf64| <= n * 2^-24 (n <= 64 here, so
// <= 2^-18 ~ 3.8e-6); the softmax itself adds a few ulps per term. A draw whose scaled coin is within
// 1e-4 of a reference boundary (26x that) is not compared; exact-boundary fixtures (dyadic
// probabilities, where binary32 is exact) are compared on every draw. Anti-vacuity: at least 90% of
// the draws of every random row are compared, every row admits more than one id, and every cut
// row differs from the uncut distribution on at least one draw.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/sampler.hpp"
#include "populations.hpp"

using namespace kvgate;

namespace {

struct RefDraw {
  int id = -1;
  double margin = 1;  // distance of the scaled coin to the nearest cdf boundary
  int admitted = 0;   // ids the rule can draw (candidates after the cuts)
};

RefDraw reference_draw(const std::vector<float>& logits, const SamplerOptions& o, double coin) {
  const int n = static_cast<int>(logits.size());
  std::vector<double> p(static_cast<std::size_t>(n));
  double mx = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]) / o.temperature);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += p[i] = std::exp(static_cast<double>(logits[i]) / o.temperature - mx);
  for (double& v : p) v /= sum;
  const bool use_k = o.top_k > 0 && o.top_k < n;
  const bool use_p = o.top_p > 0.0f && o.top_p < 1.0f;
  struct C {
    double p;
    int id;
  };
  std::vector<C> cand;
  if (!use_k && !use_p) {
    for (int i = 0; i < n; ++i) cand.push_back({p[i], i});  // id order
  } else {
    for (int i = 0; i < n; ++i)
      if (use_k || p[i] >= (1.0 - o.top_p) / (n - 1)) cand.push_back({p[i], i});
    std::sort(cand.begin(), cand.end(), [](const C& a, const C& b) { return a.p > b.p || (a.p == b.p && a.id < b.id); });
    if (use_k) {
      cand.resize(static_cast<std::size_t>(o.top_k));
      double ks = 0;
      for (const C& c : cand) ks += c.p;
      for (C& c : cand) c.p /= ks;
    }
    if (use_p) {
      double cum = 0;
      for (std::size_t i = 0; i < cand.size(); ++i) {
        cum += cand[i].p;
        if (cum > o.top_p) {
          cand.resize(i + 1);
          break;
        }
      }
    }
  }
  double mass = 0;
  for (const C& c : cand) mass += c.p;
  const double r = coin * mass;
  RefDraw d;
  d.admitted = static_cast<int>(cand.size());
  double cdf = 0;
  for (const C& c : cand) {
    const double lo = cdf;
    cdf += c.p;
    d.margin = std::min({d.margin, std::fabs(r - lo), std::fabs(r - cdf)});
    if (d.id < 0 && r < cdf) d.id = c.id;
  }
  if (d.id < 0) d.id = cand.back().id;
  return d;
}

struct Row {
  std::string name;
  std::vector<float> logits;
  SamplerOptions o;
  bool exact;  // dyadic probabilities: every draw compared, no margin
};

// Compares `draws` draws of the sampler with the reference; returns the set of ids drawn.
std::set<int> check_row(const Row& row, int draws, int* compared_out, int* admitted_out = nullptr) {
  Sampler s(static_cast<int>(row.logits.size()), row.o);
  std::uint64_t state = row.o.seed ? row.o.seed : 0x9E3779B97F4A7C15ull;  // the sampler's own stream
  std::set<int> seen;
  int compared = 0, mismatches = 0;
  for (int i = 0; i < draws; ++i) {
    const double coin = random_f32(state);
    const int got = s.sample(row.logits);
    seen.insert(got);
    const RefDraw want = reference_draw(row.logits, row.o, coin);
    if (admitted_out) *admitted_out = want.admitted;
    if (!row.exact && want.margin < 1e-4) continue;
    ++compared;
    if (got != want.id && mismatches++ < 3) {
      INFO(row.name << " draw " << i << " coin " << coin << ": sampler " << got << ", rule " << want.id);
      CHECK(got == want.id);
    }
  }
  INFO(row.name << ": " << mismatches << " of " << compared << " compared draws differ from the rule");
  CHECK(mismatches == 0);
  *compared_out = compared;
  return seen;
}

std::vector<float> gaussian_logits(int n, float scale, std::uint64_t seed) {
  kvgate::gates::Rng r(seed);
  std::vector<float> l(static_cast<std::size_t>(n));
  for (float& v : l) v = r.normal() * scale;
  return l;
}

SamplerOptions so(float t, int k, float p, std::uint64_t seed) {
  SamplerOptions o;
  o.temperature = t;
  o.top_k = k;
  o.top_p = p;
  o.seed = seed;
  return o;
}

}  // namespace

TEST_CASE("MOD.sampler.reference every draw equals the sampling rule (temperature x top-k x top-p, combined)",
          "[gate:MOD]") {
  constexpr int kDraws = 400;
  std::vector<Row> rows;
  // Random logits over the option matrix: temperatures below, at and above 1; top-k off, small,
  // vocab - 1, == vocab (off), > vocab (off); top-p off, tight, loose; combined.
  const int n = 48;
  const float temps[] = {0.5f, 1.0f, 1.7f};
  const int ks[] = {0, 5, n - 1, n, n + 3};
  const float ps[] = {1.0f, 0.35f, 0.9f};
  std::uint64_t seed = 11;
  for (float t : temps)
    for (int k : ks)
      for (float p : ps) {
        Row r;
        r.name = "gaussian n=48 T=" + std::to_string(t) + " top_k=" + std::to_string(k) + " top_p=" + std::to_string(p);
        r.logits = gaussian_logits(n, 1.0f, seed);
        r.o = so(t, k, p, seed * 7919 + 1);
        r.exact = false;
        rows.push_back(r);
        ++seed;
      }
  int multi = 0;
  for (const Row& r : rows) {
    int compared = 0, admitted = 0;
    const std::set<int> seen = check_row(r, kDraws, &compared, &admitted);
    INFO(r.name << ": the rule admits " << admitted << " ids, " << seen.size() << " drawn");
    CHECK(compared >= kDraws * 9 / 10);  // anti-vacuity: the margin skips few draws
    if (admitted > 1) {
      ++multi;
      CHECK(seen.size() > 1);  // anti-vacuity: not greedy where the rule is not
    }
  }
  CHECK(multi >= static_cast<int>(rows.size()) - 3);  // anti-vacuity: nearly every row draws from several ids
}

TEST_CASE("MOD.sampler.reference exact nucleus edges: top-p cut strictly above p, top-k renormalized before it",
          "[gate:MOD]") {
  // Dyadic fixtures: equal logits give probabilities 1/2^j exactly in binary32 (exp(0) = 1, the sum
  // is a power of two, the division is exact), so every cumulative sum is exact and the cut rule is
  // tested at equality, where binary32 and the reference agree bit for bit.
  const float lo = -1e30f;  // exp underflows to exactly 0
  auto equal_top = [&](int n, int top) {
    std::vector<float> l(static_cast<std::size_t>(n), lo);
    for (int i = 0; i < top; ++i) l[static_cast<std::size_t>(i * (n / top))] = 0.0f;
    return l;
  };
  struct Exp {
    Row row;
    int admitted;  // ids the rule admits (derivation in the name)
  };
  std::vector<Exp> rows = {
      // 4 ids of 1/4: top_p = 0.5 reaches cum 0.5 after two, not > 0.5, so the nucleus is three ids.
      {{"4 x 1/4, top_p=0.5 (cum == p after 2: nucleus of 3)", equal_top(16, 4), so(1.0f, 0, 0.5f, 5), true}, 3},
      // 8 ids of 1/8, top_k = 4 renormalizes them to 1/4 each; top_p = 0.6: 0.25, 0.5, 0.75 > 0.6 -> 3
      // ids. Without the renormalization the cum never passes 0.6 (0.5 max) and all 4 stay.
      {{"8 x 1/8, top_k=4, top_p=0.6 (renormalized 1/4: nucleus of 3)", equal_top(32, 8), so(1.0f, 4, 0.6f, 6), true}, 3},
      // top_k = 2 of 8 renormalized to 1/2, top_p = 0.5: cum 0.5 is not > 0.5, the second id is in.
      {{"8 x 1/8, top_k=2, top_p=0.5 (cum == p: both)", equal_top(32, 8), so(1.0f, 2, 0.5f, 7), true}, 2},
      // T = 2 on logits {0 x 4}: equal still (T must not change equal logits); top_p = 0.25: 1 id? cum
      // 0.25 is not > 0.25, so two ids.
      {{"4 x 1/4, T=2, top_p=0.25 (cum == p after 1: nucleus of 2)", equal_top(16, 4), so(2.0f, 0, 0.25f, 8), true}, 2},
      // top_k == vocab is no cut: plain sampling in id order over all 16 ids of 1/16.
      {{"16 x 1/16, top_k=16=vocab (no cut)", equal_top(16, 16), so(1.0f, 16, 1.0f, 9), true}, 16},
  };
  for (const Exp& e : rows) {
    int compared = 0;
    const std::set<int> seen = check_row(e.row, 800, &compared);
    INFO(e.row.name);
    CHECK(compared == 800);
    // 800 draws over <= 16 equally likely ids: the chance that an admitted id never appears is
    // <= 16 * (15/16)^800 < 1e-20, so the admitted set is observed exactly.
    CHECK(static_cast<int>(seen.size()) == e.admitted);
  }
}

TEST_CASE("MOD.sampler.reference temperature divides the logits (T != 1 changes the draws, T = 1 does not)",
          "[gate:MOD]") {
  // Two ids with logits 0 and -ln 3 (probabilities 3/4 and 1/4 at T = 1); at T = 0.5 they are
  // 9/10 and 1/10; at T = 2, sqrt(3)/(1+sqrt(3)) = 0.634. Over 4000 draws the share of id 0 is
  // within 0.03 of its probability (4.4 standard deviations at p = 0.634, n = 4000; the chance of a
  // correct sampler missing it is < 2e-5 per row, seeds fixed so the run is deterministic), and the
  // three rows' shares are 0.03 further apart than the tolerance: a sampler that multiplies by T
  // swaps the T = 0.5 and T = 2 rows.
  const std::vector<float> l = {0.0f, -std::log(3.0f)};
  const struct {
    float t;
    double p0;
  } rows[] = {{0.5f, 0.9}, {1.0f, 0.75}, {2.0f, std::sqrt(3.0) / (1 + std::sqrt(3.0))}};
  for (const auto& r : rows) {
    Sampler s(2, so(r.t, 0, 1.0f, 31));
    int zero = 0;
    for (int i = 0; i < 4000; ++i) zero += s.sample(l) == 0;
    const double share = zero / 4000.0;
    INFO("T=" << r.t << ": share of id 0 " << share << ", rule " << r.p0);
    CHECK(std::fabs(share - r.p0) < 0.03);
  }
}
