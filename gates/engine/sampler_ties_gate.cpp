// MOD.sampler.ties: every selection the sampler makes by order takes the LOWEST id among exactly
// tied values: greedy argmax (temperature <= 0, and the exported argmax() the CLI and the matrix
// call), and the deterministic cuts that keep one candidate (top-k = 1, a top-p below the largest
// probability), whose candidates are sorted by probability with ties in id order.
// The class it closes: a max scan or a sort that resolves exact ties by the last or an arbitrary
// index ('>=' for '>', a reversed tie-break); it is invisible on untied logits and shows on
// quantized, saturated (+inf) or synthetic logits.
//
// Outside reference: numpy.argmax and torch.argmax ("in case of multiple occurrences of the maximum
// values, the indices corresponding to the first occurrence are returned"), which transformers'
// greedy search applies to the next-token logits; llama2.c run.c sample_argmax (strict '>' scan).
// The expected id of every row is written by hand below (the first index of the maximum), not
// computed by a scan that could share the bug.
//
// Bound: ids are compared exactly. Anti-vacuity: every row has at least two tied maxima and its
// expected id is not the last of them, so a last-occurrence rule gives another id on every row;
// rows put the ties at the first and last index, adjacent and far apart, among -inf, with +inf,
// with -0 == +0, and at vocab sizes 2 to 512 (the argmax is not vectorized today, so the size only
// guards a future one).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/sampler.hpp"

using namespace kvgate;

namespace {

struct TieRow {
  std::string name;
  std::vector<float> logits;
  int first;  // the lowest id of the maximum, by hand
  int last;   // the highest id of the maximum (anti-vacuity: != first)
};

// n logits of a descending ramp below `top` (so no accidental ties), then `top` at the given ids.
TieRow ramp_with_ties(const std::string& name, int n, std::vector<int> at, float top = 4.0f) {
  TieRow r{name, std::vector<float>(static_cast<std::size_t>(n)), at.front(), at.back()};
  for (int i = 0; i < n; ++i) r.logits[static_cast<std::size_t>(i)] = -1.0f - 0.001f * static_cast<float>(i);
  for (int i : at) r.logits[static_cast<std::size_t>(i)] = top;
  return r;
}

std::vector<TieRow> tie_rows() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<TieRow> rows;
  rows.push_back({"two equal logits", {1.5f, 1.5f}, 0, 1});
  rows.push_back({"-0 and +0 are equal", {-0.0f, 0.0f, -2.0f}, 0, 1});
  rows.push_back({"+0 then -0", {-3.0f, 0.0f, -0.0f}, 1, 2});
  rows.push_back({"all equal (7)", std::vector<float>(7, 0.25f), 0, 6});
  rows.push_back({"tie among -inf", {-inf, 2.0f, -inf, 2.0f, -inf}, 1, 3});
  rows.push_back({"+inf twice", {1.0f, inf, 3.0f, inf}, 1, 3});
  rows.push_back({"max tie after a larger-looking prefix", {0.5f, 0.75f, 0.75f, 0.5f, 0.75f}, 1, 4});
  rows.push_back(ramp_with_ties("first and last of 32", 32, {0, 31}));
  rows.push_back(ramp_with_ties("adjacent in the middle of 33", 33, {16, 17}));
  rows.push_back(ramp_with_ties("three, far apart, of 512", 512, {5, 300, 511}));
  rows.push_back(ramp_with_ties("at 8-lane edges of 512", 512, {7, 8, 255, 256}));
  rows.push_back(ramp_with_ties("negative maximum, 64", 64, {40, 63}, -0.5f));
  return rows;
}

}  // namespace

TEST_CASE("MOD.sampler.ties greedy and one-candidate cuts take the lowest id of exactly tied logits (numpy/torch argmax)",
          "[gate:MOD]") {
  const std::vector<TieRow> rows = tie_rows();
  REQUIRE(rows.size() == 12);
  for (const TieRow& r : rows) {
    INFO("row '" << r.name << "': expected id " << r.first);
    REQUIRE(r.first != r.last);  // anti-vacuity: the last-occurrence rule differs
    REQUIRE(r.logits[static_cast<std::size_t>(r.first)] == r.logits[static_cast<std::size_t>(r.last)]);
    CHECK(argmax(r.logits) == r.first);
    // Greedy sampling (temperature 0 and a negative temperature both mean greedy).
    for (float t : {0.0f, -1.0f}) {
      SamplerOptions o;
      o.temperature = t;
      Sampler s(static_cast<int>(r.logits.size()), o);
      for (int draw = 0; draw < 3; ++draw) CHECK(s.sample(r.logits) == r.first);
    }
  }
}

TEST_CASE("MOD.sampler.ties top-k = 1 and a top-p under the largest probability keep the lowest tied id",
          "[gate:MOD]") {
  // With temperature > 0 the tied maxima have exactly equal probabilities (the same binary32 exp of
  // the same argument); a cut that keeps one candidate keeps the first in (probability desc, id asc)
  // order, whatever the coin. Rows whose maximum is +inf are left out (softmax is undefined there).
  // top-p: run.c's pre-filter keeps only ids with p >= (1 - top_p) / (n - 1), so the row is used
  // only where the largest probability passes it and exceeds top_p (one candidate in the nucleus).
  constexpr float kTopP = 0.2f, kTemp = 0.05f;
  int k_rows = 0, p_rows = 0;
  for (const TieRow& r : tie_rows()) {
    bool finite = true;
    for (float x : r.logits) finite = finite && x < std::numeric_limits<float>::infinity();
    if (!finite) continue;
    ++k_rows;
    INFO("row '" << r.name << "': expected id " << r.first);
    const int n = static_cast<int>(r.logits.size());
    double mx = -std::numeric_limits<double>::infinity(), sum = 0;
    for (float x : r.logits) mx = std::max(mx, static_cast<double>(x) / kTemp);
    for (float x : r.logits) sum += std::exp(static_cast<double>(x) / kTemp - mx);
    const double p_max = 1.0 / sum;
    const bool nucleus_of_one = p_max > kTopP * 1.01 && p_max >= (1.0 - kTopP) / (n - 1) * 1.01;
    p_rows += nucleus_of_one;
    for (std::uint64_t seed : {1ull, 7ull, 12345ull}) {
      SamplerOptions k1;
      k1.temperature = kTemp;
      k1.top_k = 1;
      k1.seed = seed;
      Sampler sk(n, k1);
      for (int draw = 0; draw < 8; ++draw) CHECK(sk.sample(r.logits) == r.first);
      if (!nucleus_of_one) continue;
      SamplerOptions p1 = k1;
      p1.top_k = 0;
      p1.top_p = kTopP;
      Sampler sp(n, p1);
      for (int draw = 0; draw < 8; ++draw) CHECK(sp.sample(r.logits) == r.first);
    }
  }
  CHECK(k_rows == 11);  // anti-vacuity: every finite row ran
  CHECK(p_rows == 9);   // all but the two-logit row and the seven-way tie
}

// MOD.sampler.nucleus_floor: a top-p below 1/n on flat logits. run.c's pre-filter keeps only tokens
// with probability >= (1 - p)/(n - 1); with n equal logits every probability is 1/n, which is below
// that cutoff exactly when p < 1/n, so the filter keeps nothing (run.c then reads past its empty
// candidate list). The nucleus is never empty: it is the smallest prefix of the tokens sorted by
// probability (ties in id order, as MOD.sampler.ties) whose mass exceeds p, here the first token
// alone, so every draw returns id 0. Bound: exact ids. Anti-vacuity: the same logits with p = 0.999
// (above the cutoff case) draw more than one id over the seeds, so the check sees a real sampler.
TEST_CASE("MOD.sampler.nucleus_floor top-p below 1/n on flat logits keeps the most probable token",
          "[gate:MOD][fmt:none]") {
  for (int n : {2, 7, 64, 512}) {
    const std::vector<float> flat(static_cast<std::size_t>(n), 0.25f);
    for (float p : {0.5f / static_cast<float>(n), 0.9f / static_cast<float>(n)}) {
      SamplerOptions o;
      o.temperature = 1.0f;
      o.top_p = p;
      for (std::uint64_t seed : {1ull, 2ull, 99ull}) {
        o.seed = seed;
        Sampler s(n, o);
        INFO("n=" << n << " top_p=" << p << " seed=" << seed);
        for (int draw = 0; draw < 8; ++draw) CHECK(s.sample(flat) == 0);
      }
    }
    SamplerOptions wide;
    wide.temperature = 1.0f;
    wide.top_p = 0.999f;
    wide.seed = 5;
    Sampler s(n, wide);
    int other = 0;
    for (int draw = 0; draw < 64; ++draw) other += s.sample(flat) != 0;
    INFO("n=" << n);
    CHECK(other > 0);
  }
}
