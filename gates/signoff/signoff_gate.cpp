// SGN gates: the sign-off rules (reports/signoff, kvgate::signoff) that turn gate results, mutation
// outcomes and measured quality into the two verdicts per format, their roll-up and the exit code.
// Table-driven: every rule has rows whose expected verdict is written out by hand from the rule's
// statement (README "Sign-off"), never from a run. No model, no clock, no file but the shipped
// default policy. Tagged with every preset: each format's sign-off runs them (its verdict is only as
// good as these rules).
//
// Bounds: the verdicts are discrete, compared exactly. The quality fixtures are built from
// distributions whose KL / TV / perplexity have closed forms (derivations beside each row); they are
// compared within 1e-9 relative, far above double rounding over a vocabulary of 4 (~1e-15) and far
// below the differences between rows.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kvgate/build_paths.hpp"
#include "catch_compat.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate/model.hpp"
#include "kvgate/signoff.hpp"
#include "kvgate/signoff_coverage.hpp"
#include "kvgate/signoff_probes.hpp"
#include "kvgate/signoff_proof.hpp"
#include "kvgate/verdict_record.hpp"

using namespace kvgate::signoff;
using nlohmann::json;

// Tagged with every preset (kvgate/format_list.hpp).
#define SGN_TAGS "[gate:SGN]" KVGATE_PRESETS(KVGATE_PRESET_TAG_ROW, _)

namespace {

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const PolicyError& e) {
    return e.what();
  }
  return "<accepted>";
}

json budget(const char* bound_key, double bound, const char* unit) {
  return {{bound_key, bound}, {"unit", unit}, {"source", "gate fixture"}};
}

// A complete policy with round numbers (each row below overrides what it tests).
json base_policy() {
  return {{"schema", "kvgate.policy/1"},
          {"baseline", "auto"},
          {"budgets",
           {{"kl_mean", budget("max", 0.05, "nats")},
            {"kl_p99", budget("max", 0.5, "nats")},
            {"top1", budget("min", 0.9, "fraction")},
            {"one_minus_tv", budget("min", 0.9, "fraction")},
            {"ppl_delta", budget("max", 0.02, "fraction")},
            {"probe_parity", budget("max", 0, "cases")},
            {"kv_saving", budget("min", 0.25, "fraction")},
            {"decode_speedup", {{"min", 1.0}, {"unit", "ratio"}, {"devices", {"cuda"}}, {"source", "gate fixture"}}}}}};
}

Policy policy(const json& j) { return parse_policy(j, "fixture.json"); }

// A QualityReport whose every bucket and the whole equal `s` (buckets all non-empty).
QualityReport flat_quality(const QualityStats& s) {
  QualityReport q;
  q.all = s;
  for (const auto& b : default_buckets()) q.buckets.push_back({b, s});
  return q;
}

QualityStats stats(double kl_mean, double kl_p99, double top1, double omtv, double ppl_delta) {
  QualityStats s;
  s.positions = s.ppl_positions = 1000;
  s.kl_mean = kl_mean;
  s.kl_p99 = s.kl_max = kl_p99;
  s.top1 = top1;
  s.one_minus_tv = omtv;
  s.ppl_base = 10;
  s.ppl_fmt = 10 * (1 + ppl_delta);
  s.ppl_delta = ppl_delta;
  return s;
}

FitInput good_input(const std::string& fmt) {
  FitInput in;
  in.format = fmt;
  in.device = "cpu";
  in.quality = flat_quality(stats(0.001, 0.01, 0.99, 0.99, 0.001));
  in.probe_regressions = 0;
  in.kv_saving = 0.5;
  in.decode_speedup = std::nullopt;  // CPU: the cuda-only line does not apply
  return in;
}

ConformanceInput conforming() {
  ConformanceInput c;
  c.gates.passed = 10;
  c.mutation.status = "run";
  c.mutation.mutants = {"M1", "M2"};
  c.mutation.killed = {"M1", "M2"};
  return c;
}

const LineResult* line_for(const FitVerdict& v, const std::string& metric, const std::string& scope) {
  for (const auto& l : v.lines)
    if (info(l.budget.budget.metric).key == metric && l.scope == scope) return &l;
  return nullptr;
}

}  // namespace

TEST_CASE("SGN.rollup PASS only when the format conforms and fits; the exit code is the most severe verdict", SGN_TAGS) {
  struct Row {
    Conformance c;
    Fit f;
    Overall want;
    int exit;
  };
  const Row rows[] = {
      {Conformance::conforms, Fit::fits, Overall::pass, 0},
      {Conformance::conforms, Fit::over_budget, Overall::over_budget, 3},
      {Conformance::conforms, Fit::not_measured, Overall::not_measured, 4},
      {Conformance::does_not_conform, Fit::fits, Overall::does_not_conform, 2},
      {Conformance::does_not_conform, Fit::over_budget, Overall::does_not_conform, 2},
      {Conformance::does_not_conform, Fit::not_measured, Overall::does_not_conform, 2},
      {Conformance::not_validated, Fit::fits, Overall::not_validated, 4},
      {Conformance::not_validated, Fit::over_budget, Overall::over_budget, 3},  // a measured miss is decisive
      {Conformance::not_validated, Fit::not_measured, Overall::not_validated, 4},
  };
  for (const auto& r : rows) {
    INFO(to_string(r.c) << " + " << to_string(r.f));
    CHECK(roll_up(r.c, r.f) == r.want);
    CHECK(exit_code(roll_up(r.c, r.f)) == r.exit);
  }
  CHECK(to_string(Overall::pass) == "PASS");
  CHECK(to_string(Overall::over_budget) == "OVER-BUDGET");
  // Distinct codes per class, and the most severe verdict over the formats decides.
  CHECK(kExitPass == 0);
  CHECK(kExitError == 1);
  CHECK(kExitDoesNotConform != kExitOverBudget);
  CHECK(kExitOverBudget != kExitNotDecided);
  CHECK(exit_code(std::vector<Overall>{}) == 0);
  CHECK(exit_code({Overall::pass, Overall::pass}) == 0);
  CHECK(exit_code({Overall::pass, Overall::over_budget, Overall::not_validated}) == kExitOverBudget);
  CHECK(exit_code({Overall::not_measured, Overall::pass}) == kExitNotDecided);
  CHECK(exit_code({Overall::over_budget, Overall::does_not_conform, Overall::pass}) == kExitDoesNotConform);
  CHECK(exit_code({Overall::not_validated, Overall::over_budget}) == kExitOverBudget);
}

TEST_CASE("SGN.conformance failing gates or surviving mutants do not conform; anything not run is not validated", SGN_TAGS) {
  CHECK(conformance_verdict(conforming()).verdict == Conformance::conforms);
  CHECK(conformance_verdict(conforming()).reasons.empty());
  {
    auto c = conforming();
    c.gates.failed = 1;
    c.gates.failing = {"ENV.int8"};
    const auto v = conformance_verdict(c);
    CHECK(v.verdict == Conformance::does_not_conform);
    REQUIRE_FALSE(v.reasons.empty());
    CHECK(has(v.reasons.front(), "ENV.int8"));
  }
  {
    auto c = conforming();
    c.mutation.killed = {"M1"};
    c.mutation.survived = {"M2"};
    const auto v = conformance_verdict(c);
    CHECK(v.verdict == Conformance::does_not_conform);
    REQUIRE_FALSE(v.reasons.empty());
    CHECK(has(v.reasons.front(), "M2"));
  }
  {  // a survivor is decisive even when something else was not validated
    auto c = conforming();
    c.mutation.survived = {"M2"};
    c.fallback_reason = "head_dim";
    CHECK(conformance_verdict(c).verdict == Conformance::does_not_conform);
  }
  struct Row {
    const char* what;
    void (*edit)(ConformanceInput&);
  };
  const Row nv[] = {
      {"mutation proof not run", [](ConformanceInput& c) { c.mutation.status = "not_run"; c.mutation.killed.clear(); }},
      {"no mutant", [](ConformanceInput& c) { c.mutation.mutants.clear(); c.mutation.killed.clear(); }},
      {"no gate ran", [](ConformanceInput& c) { c.gates.passed = 0; }},
      {"gates not run", [](ConformanceInput& c) { c.gate_error = "no gate programs"; }},
      {"mutant missing", [](ConformanceInput& c) { c.mutation.missing = {"M3"}; }},
      {"mutant undecided", [](ConformanceInput& c) { c.mutation.undecided = {"M3 (timeout)"}; }},
      {"baseline red", [](ConformanceInput& c) { c.mutation.baseline_green = false; }},
      {"fallback", [](ConformanceInput& c) { c.fallback_reason = "head_dim 8"; c.fallback_effective = "f16"; }},
      {"no device", [](ConformanceInput& c) { c.not_validated.push_back("no CUDA device"); }},
  };
  for (const auto& r : nv) {
    INFO(r.what);
    auto c = conforming();
    r.edit(c);
    const auto v = conformance_verdict(c);
    CHECK(v.verdict == Conformance::not_validated);
    CHECK_FALSE(v.reasons.empty());
  }
}

TEST_CASE("SGN.fit.direction each metric is compared the way its budget says (<= max, >= min), bound included", SGN_TAGS) {
  const Policy p = policy(base_policy());
  struct Row {
    const char* metric;
    double value;
    LineStatus want;
  };
  const Row rows[] = {
      {"kl_mean", 0.04, LineStatus::within},       {"kl_mean", 0.05, LineStatus::within},
      {"kl_mean", 0.06, LineStatus::over},         {"kl_p99", 0.6, LineStatus::over},
      {"kl_p99", 0.4, LineStatus::within},         {"top1", 0.95, LineStatus::within},
      {"top1", 0.90, LineStatus::within},          {"top1", 0.54, LineStatus::over},
      {"one_minus_tv", 0.89, LineStatus::over},    {"one_minus_tv", 0.91, LineStatus::within},
      {"ppl_delta", 0.03, LineStatus::over},       {"ppl_delta", -0.01, LineStatus::within},
      {"probe_parity", 0, LineStatus::within},     {"probe_parity", 1, LineStatus::over},
      {"kv_saving", 0.1, LineStatus::over},        {"kv_saving", 0.5, LineStatus::within},
  };
  const auto bs = budgets_for(p, "int8");
  for (const auto& r : rows) {
    INFO(r.metric << " = " << r.value);
    const EffectiveBudget* b = nullptr;
    for (const auto& x : bs)
      if (info(x.budget.metric).key == std::string(r.metric)) b = &x;
    REQUIRE(b != nullptr);
    const auto l = judge_line(*b, r.value, std::nullopt, "cpu", "all");
    CHECK(l.status == r.want);
    CHECK((l.margin < 0) == (r.want == LineStatus::over));
  }
  // decode speed-up: budgeted on cuda only; on cpu the line does not apply (never a miss).
  const EffectiveBudget* sp = nullptr;
  for (const auto& x : bs)
    if (x.budget.metric == Metric::decode_speedup) sp = &x;
  REQUIRE(sp != nullptr);
  CHECK(judge_line(*sp, 0.5, std::nullopt, "cuda", "").status == LineStatus::over);
  CHECK(judge_line(*sp, 1.5, std::nullopt, "cuda", "").status == LineStatus::within);
  CHECK(judge_line(*sp, 0.5, std::nullopt, "cpu", "").status == LineStatus::not_applicable);
  CHECK(judge_line(*sp, std::nullopt, std::nullopt, "cuda", "").status == LineStatus::not_measured);
}

TEST_CASE("SGN.fit.verdict a miss is OVER-BUDGET, else anything unmeasured is NOT-MEASURED; the deciding line is named", SGN_TAGS) {
  const Policy p = policy(base_policy());
  {
    const auto v = fit_verdict(p, good_input("int8"));
    CHECK(v.verdict == Fit::fits);
    REQUIRE(v.deciding >= 0);
    CHECK(v.lines[static_cast<std::size_t>(v.deciding)].status == LineStatus::within);
    // 4 buckets + all for each of the 5 quality metrics, plus 3 unbucketed lines.
    CHECK(v.lines.size() == 5 * 5 + 3);
  }
  {  // q4_0-like quality: top-1 54%, KL 1.11 -> OVER-BUDGET, decided by the worst miss
    auto in = good_input("q4_0");
    // Relative misses: kl_mean (0.05-1.11)/0.05 = -21.2, kl_p99 (0.5-5)/0.5 = -9, top1 -0.4, 1-TV -0.33.
    in.quality = flat_quality(stats(1.11, 5.0, 0.54, 0.6, 0.01));
    const auto v = fit_verdict(p, in);
    CHECK(v.verdict == Fit::over_budget);
    REQUIRE(v.deciding >= 0);
    CHECK(v.lines[static_cast<std::size_t>(v.deciding)].status == LineStatus::over);
    CHECK(info(v.lines[static_cast<std::size_t>(v.deciding)].budget.budget.metric).key == std::string("kl_mean"));
    CHECK_FALSE(v.reasons.empty());
    FormatVerdict fv = decide("q4_0", conforming(), p, in);
    CHECK(fv.overall == Overall::over_budget);
    CHECK(fv.conformance.verdict == Conformance::conforms);
    CHECK(has(deciding_line(fv), "budgets.kl_mean"));
  }
  {  // over beats not measured
    auto in = good_input("q4_0");
    in.quality = flat_quality(stats(0.001, 0.01, 0.5, 0.99, 0.001));
    in.probe_regressions = std::nullopt;
    CHECK(fit_verdict(p, in).verdict == Fit::over_budget);
  }
  {  // nothing over, probes not measured -> NOT-MEASURED, deciding line is that one
    auto in = good_input("int8");
    in.probe_regressions = std::nullopt;
    const auto v = fit_verdict(p, in);
    CHECK(v.verdict == Fit::not_measured);
    REQUIRE(v.deciding >= 0);
    CHECK(v.lines[static_cast<std::size_t>(v.deciding)].budget.budget.metric == Metric::probe_parity);
  }
  {  // quality not measured at all
    auto in = good_input("int8");
    in.quality = std::nullopt;
    in.not_measured_reason = "no corpus";
    const auto v = fit_verdict(p, in);
    CHECK(v.verdict == Fit::not_measured);
    CHECK(has(v.reasons.front(), "no corpus"));
  }
  {  // a miss in one depth bucket only is a miss
    auto in = good_input("int8");
    in.quality->buckets[2].stats = stats(0.2, 0.3, 0.95, 0.95, 0.001);
    const auto v = fit_verdict(p, in);
    CHECK(v.verdict == Fit::over_budget);
    CHECK(v.lines[static_cast<std::size_t>(v.deciding)].scope == "4K-16K");
  }
  {  // the same quality on cuda needs the decode speed-up
    auto in = good_input("int8");
    in.device = "cuda";
    CHECK(fit_verdict(p, in).verdict == Fit::not_measured);
    in.decode_speedup = 0.8;
    CHECK(fit_verdict(p, in).verdict == Fit::over_budget);
    in.decode_speedup = 1.7;
    CHECK(fit_verdict(p, in).verdict == Fit::fits);
  }
}

TEST_CASE("SGN.noise a budget tighter than the measured noise floor is refused with that reason, not judged", SGN_TAGS) {
  json j = base_policy();
  j["budgets"]["kl_mean"] = budget("max", 1e-4, "nats");
  j["budgets"]["top1"] = budget("min", 0.999, "fraction");
  const Policy p = policy(j);
  auto in = good_input("int8");
  in.quality = flat_quality(stats(1e-5, 0.01, 0.9995, 0.99, 0.001));
  {  // no noise floor measured: judged as written
    const auto v = fit_verdict(p, in);
    CHECK(v.verdict == Fit::fits);
  }
  NoiseRun run;
  run.name = "f32 vs f16";
  run.quality = flat_quality(stats(3e-4, 0.002, 0.998, 0.999, -0.0005));
  in.noise.runs.push_back(run);
  REQUIRE(in.noise.worst(Metric::kl_mean).has_value());
  CHECK(*in.noise.worst(Metric::kl_mean) == 3e-4);
  CHECK(*in.noise.worst(Metric::top1) == 0.998);
  CHECK(*in.noise.worst(Metric::ppl_delta) == 0.0005);  // by magnitude
  // A second run: the worst over the runs (largest KL, smallest top-1).
  NoiseRun run2 = run;
  run2.name = "f16 chunk 1 vs 128";
  run2.quality = flat_quality(stats(1e-4, 0.004, 0.997, 0.9995, 0.0));
  in.noise.runs.push_back(run2);
  CHECK(*in.noise.worst(Metric::kl_mean) == 3e-4);
  CHECK(*in.noise.worst(Metric::kl_p99) == 0.004);
  CHECK(*in.noise.worst(Metric::top1) == 0.997);
  const auto v = fit_verdict(p, in);
  CHECK(v.verdict == Fit::not_measured);
  const auto* kl = line_for(v, "kl_mean", "all");
  REQUIRE(kl != nullptr);
  CHECK(kl->status == LineStatus::refused);
  CHECK(has(kl->reason, "noise floor"));
  const auto* t1 = line_for(v, "top1", "0-1K");
  REQUIRE(t1 != nullptr);
  CHECK(t1->status == LineStatus::refused);
  // Budgets at or above the floor are judged (the floor is reported beside the value).
  const auto* p99 = line_for(v, "kl_p99", "all");
  REQUIRE(p99 != nullptr);
  CHECK(p99->status == LineStatus::within);
  REQUIRE(p99->noise.has_value());
  CHECK(*p99->noise == 0.004);
  // Even a format that would miss the refused budget is not called OVER-BUDGET on it.
  auto bad = in;
  bad.quality = flat_quality(stats(0.01, 0.01, 0.99, 0.99, 0.001));
  CHECK(fit_verdict(p, bad).verdict == Fit::not_measured);
}

TEST_CASE("SGN.buckets every depth bucket is reported, empty ones as empty; positions land by depth", SGN_TAGS) {
  const auto b = default_buckets();
  REQUIRE(b.size() == 4);
  CHECK(b[0].name == "0-1K");
  CHECK(b[3].name == "16K+");
  CHECK(b[0].contains(0));
  CHECK(b[0].contains(1023));
  CHECK_FALSE(b[0].contains(1024));
  CHECK(b[1].contains(1024));
  CHECK(b[2].contains(16383));
  CHECK(b[3].contains(16384));
  CHECK(b[3].contains(1 << 30));
  // Positions at depths 0, 5, 2000, 2001: KL 0.1, 0.3, 1.0, 3.0; top-1 agree on the first three.
  std::vector<PositionMetrics> pm(4);
  const std::int64_t depth[] = {0, 5, 2000, 2001};
  const double kl[] = {0.1, 0.3, 1.0, 3.0};
  for (int i = 0; i < 4; ++i) {
    pm[static_cast<std::size_t>(i)].depth = depth[i];
    pm[static_cast<std::size_t>(i)].kl = kl[i];
    pm[static_cast<std::size_t>(i)].tv = 0.1 * (i + 1);
    pm[static_cast<std::size_t>(i)].top1_agree = i < 3;
  }
  const auto q = bucket_quality(pm, b);
  REQUIRE(q.buckets.size() == 4);
  CHECK(q.all.positions == 4);
  CHECK(std::abs(q.all.kl_mean - 1.1) < 1e-12);
  CHECK(q.buckets[0].bucket.name == "0-1K");
  CHECK(q.buckets[0].stats.positions == 2);
  CHECK(std::abs(q.buckets[0].stats.kl_mean - 0.2) < 1e-12);
  CHECK(q.buckets[0].stats.top1 == 1.0);
  CHECK(q.buckets[1].stats.positions == 2);
  CHECK(std::abs(q.buckets[1].stats.kl_mean - 2.0) < 1e-12);
  CHECK(q.buckets[1].stats.top1 == 0.5);
  CHECK(std::abs(q.buckets[1].stats.one_minus_tv - 0.65) < 1e-12);
  CHECK(q.buckets[2].stats.empty());
  CHECK(q.buckets[3].bucket.name == "16K+");
  CHECK(q.buckets[3].stats.empty());
  // The record keeps the empty buckets, marked empty.
  const json jq = to_json(q);
  REQUIRE(jq["buckets"].size() == 4);
  CHECK(jq["buckets"][2]["empty"] == true);
  CHECK(jq["buckets"][3]["bucket"] == "16K+");
  // The fit lines of an empty bucket say so and do not decide.
  const Policy p = policy(base_policy());
  FitInput in = good_input("int8");
  in.quality = bucket_quality(std::vector<PositionMetrics>(pm.begin(), pm.begin() + 2), b);
  const auto v = fit_verdict(p, in);
  const auto* e = line_for(v, "kl_mean", "4K-16K");
  REQUIRE(e != nullptr);
  CHECK(e->status == LineStatus::not_applicable);
  CHECK(has(e->reason, "empty"));
  CHECK(line_for(v, "kl_mean", "16K+") != nullptr);
}

TEST_CASE("SGN.buckets per-position KL, TV, top-1 and perplexity have their closed forms", SGN_TAGS) {
  // p = softmax(log[0.5, 0.25, 0.125, 0.125]), q = uniform: KL(p||q) = sum p log(p/q) =
  // 0.5 ln 2 + 0 + 2 * 0.125 ln 0.5 = 0.25 ln 2; TV = 0.5 (0.25 + 0 + 0.125 + 0.125) = 0.25.
  const float base[4] = {std::log(0.5f), std::log(0.25f), std::log(0.125f), std::log(0.125f)};
  const float got[4] = {0, 0, 0, 0};
  const auto m = compare_position(base, got, 4, 1, 7);
  CHECK(m.depth == 7);
  CHECK(std::abs(m.kl - 0.25 * std::log(2.0)) < 1e-6);
  CHECK(std::abs(m.tv - 0.25) < 1e-6);
  CHECK(m.top1_agree);  // argmax 0 vs the uniform row's argmax, the lowest id on ties: 0
  CHECK(m.has_target);
  CHECK(std::abs(m.nll_base - std::log(4.0)) < 1e-6);  // -ln 0.25
  CHECK(std::abs(m.nll_fmt - std::log(4.0)) < 1e-6);   // uniform
  const auto same = compare_position(base, base, 4, -1, 0);
  CHECK(same.kl == 0);
  CHECK(same.tv < 1e-12);
  CHECK(same.top1_agree);
  CHECK_FALSE(same.has_target);
  // Two sequences of 3 and 2 positions: depths restart per sequence, the last position has no target.
  std::vector<std::vector<float>> L = {std::vector<float>(12, 0.f), std::vector<float>(8, 0.f)};
  const auto pm = compare_sequences(L, L, {{1, 2, 3}, {0, 1}}, 4);
  REQUIRE(pm.size() == 5);
  CHECK(pm[2].depth == 2);
  CHECK_FALSE(pm[2].has_target);
  CHECK(pm[3].depth == 0);
  const auto s = summarize(pm);
  CHECK(s.ppl_positions == 3);
  CHECK(std::abs(s.ppl_base - 4.0) < 1e-9);
  CHECK(std::abs(s.ppl_delta) < 1e-12);
}

TEST_CASE("SGN.policy.override a per-format override replaces the default for that format only", SGN_TAGS) {
  json j = base_policy();
  j["formats"] = {{"q8_0", {{"kl_mean", budget("max", 0.01, "nats")}}},
                  {"f16", {{"kv_saving", {{"not_budgeted", "float reference"}}}}}};
  const Policy p = policy(j);
  auto kl_of = [&](const std::string& f) {
    for (const auto& b : budgets_for(p, f))
      if (b.budget.metric == Metric::kl_mean) return b;
    return EffectiveBudget{};
  };
  CHECK(kl_of("q8_0").budget.bound == 0.01);
  CHECK(kl_of("q8_0").origin == "formats.q8_0.kl_mean");
  CHECK(kl_of("int8").budget.bound == 0.05);
  CHECK(kl_of("int8").origin == "budgets.kl_mean");
  CHECK(budgets_for(p, "q8_0").size() == metrics().size());
  // q8_0 at KL 0.02: within the default, over its override.
  auto in = good_input("q8_0");
  in.quality = flat_quality(stats(0.02, 0.1, 0.98, 0.98, 0.001));
  const auto v = fit_verdict(p, in);
  CHECK(v.verdict == Fit::over_budget);
  CHECK(v.lines[static_cast<std::size_t>(v.deciding)].budget.origin == "formats.q8_0.kl_mean");
  in.format = "int8";
  CHECK(fit_verdict(p, in).verdict == Fit::fits);
  // f16 saves nothing against an f16 baseline: not budgeted there, a miss for a quantized format.
  auto f16 = good_input("f16");
  f16.kv_saving = 0.0;
  CHECK(fit_verdict(p, f16).verdict == Fit::fits);
  f16.format = "int8";
  CHECK(fit_verdict(p, f16).verdict == Fit::over_budget);
}

TEST_CASE("SGN.policy.refusals a policy with an unknown metric, a wrong sign, unit or direction, or a bad baseline is refused naming the field", SGN_TAGS) {
  CHECK(refusal([] { policy(base_policy()); }) == "<accepted>");
  struct Row {
    const char* what;
    void (*edit)(json&);
    const char* field;
  };
  const Row rows[] = {
      {"unknown metric", [](json& j) { j["budgets"]["bleu"] = budget("min", 0.5, "fraction"); }, "budgets.bleu"},
      {"unknown metric in an override", [](json& j) { j["formats"] = {{"int8", {{"klmean", budget("max", 0.1, "nats")}}}}; },
       "formats.int8.klmean"},
      {"unknown format", [](json& j) { j["formats"] = {{"int7", {{"kl_mean", budget("max", 0.1, "nats")}}}}; }, "formats.int7"},
      {"missing metric", [](json& j) { j["budgets"].erase("kl_p99"); }, "budgets.kl_p99"},
      {"negative KL", [](json& j) { j["budgets"]["kl_mean"] = budget("max", -0.1, "nats"); }, "budgets.kl_mean.max"},
      {"top-1 in percent", [](json& j) { j["budgets"]["top1"] = budget("min", 90, "fraction"); }, "budgets.top1.min"},
      {"wrong unit", [](json& j) { j["budgets"]["kl_mean"] = budget("max", 0.05, "bits"); }, "budgets.kl_mean.unit"},
      {"percent unit", [](json& j) { j["budgets"]["top1"] = budget("min", 90, "percent"); }, "budgets.top1"},
      {"missing unit", [](json& j) { j["budgets"]["kl_mean"].erase("unit"); }, "budgets.kl_mean.unit"},
      {"wrong direction", [](json& j) { j["budgets"]["top1"] = budget("max", 0.9, "fraction"); }, "budgets.top1.max"},
      {"wrong direction KL", [](json& j) { j["budgets"]["kl_mean"] = budget("min", 0.05, "nats"); }, "budgets.kl_mean.min"},
      {"missing source", [](json& j) { j["budgets"]["kl_mean"].erase("source"); }, "budgets.kl_mean.source"},
      {"baseline not a preset", [](json& j) { j["baseline"] = "fp16"; }, "baseline"},
      {"quantized baseline", [](json& j) { j["baseline"] = "int8"; }, "baseline"},
      {"unknown top-level field", [](json& j) { j["budget"] = json::object(); }, "budget"},
      {"wrong schema", [](json& j) { j["schema"] = "kvgate.policy/0"; }, "schema"},
      {"bad device", [](json& j) { j["budgets"]["decode_speedup"]["devices"] = {"tpu"}; }, "budgets.decode_speedup.devices"},
      {"zero speed-up", [](json& j) { j["budgets"]["decode_speedup"]["min"] = 0.0; }, "budgets.decode_speedup.min"},
  };
  for (const auto& r : rows) {
    INFO(r.what);
    json j = base_policy();
    r.edit(j);
    const std::string e = refusal([&] { policy(j); });
    CHECK(e != "<accepted>");
    CHECK(has(e, "fixture.json"));
    CHECK(has(e, std::string("field '") + r.field));
    CHECK(has(e, "fix:"));
  }
  // --baseline: f16 / bf16 / f32 only; auto is the 16-bit KV the engine would run.
  CHECK(resolve_baseline("", "auto", "cpu") == "f16");
  CHECK(resolve_baseline("", "auto", "cuda") == "bf16");
  CHECK(resolve_baseline("", "f32", "cuda") == "f32");
  CHECK(resolve_baseline("bf16", "f32", "cpu") == "bf16");
  CHECK(has(refusal([] { resolve_baseline("fp16", "auto", "cpu"); }), "not a preset"));
  CHECK(has(refusal([] { resolve_baseline("q4_0", "auto", "cpu"); }), "fix:"));
}

TEST_CASE("SGN.policy.refusals the shipped default policy parses and says where every number comes from", SGN_TAGS) {
  const char* env = std::getenv("KVGATE_SOURCE_DIR");
  const std::filesystem::path src = env ? env : KVGATE_SOURCE_DIR_DEFAULT;
  const Policy p = load_policy_file((src / "reports" / "policy" / "default.json").string());
  CHECK(p.defaults.size() == metrics().size());
  for (const auto& b : p.defaults) {
    INFO(info(b.metric).key);
    CHECK(b.source.size() > 20);
  }
  for (const auto& [f, set] : p.overrides)
    for (const auto& b : set) CHECK_FALSE(b.source.empty());
  CHECK(has(refusal([] { load_policy_file("/nonexistent/policy.json"); }), "/nonexistent/policy.json"));
}

TEST_CASE("SGN.corpus an empty corpus or one outside the model's vocabulary is refused naming the file and the field", SGN_TAGS) {
  kvgate::Model m;
  m.path = "fixture-model.bin";
  m.config.vocab_size = 512;
  const auto dir = std::filesystem::temp_directory_path() / ("kvgate_sgn_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& body) {
    const auto p = (dir / name).string();
    FILE* f = std::fopen(p.c_str(), "wb");
    REQUIRE(f != nullptr);
    std::fwrite(body.data(), 1, body.size(), f);
    std::fclose(f);
    return p;
  };
  const auto ids = write("ids.txt", "1 20 30\n40,50\n\n1 7 8 9\n");
  const auto seqs = load_corpus_file(ids, m, 3);
  // Two sequences (blank line), the first (5 ids) split at max_context 3, the second (4) too.
  REQUIRE(seqs.size() == 4);
  CHECK(seqs[0] == std::vector<int>{1, 20, 30});
  CHECK(seqs[1] == std::vector<int>{40, 50});
  CHECK(seqs[2] == std::vector<int>{1, 7, 8});
  const auto oov = write("oov.txt", "1 2 3 512 4\n");
  const std::string e1 = refusal([&] { load_corpus_file(oov, m, 100); });
  CHECK(has(e1, oov));
  CHECK(has(e1, "token 3"));
  CHECK(has(e1, "512"));
  CHECK(has(e1, "fix:"));
  const auto empty = write("empty.json", "{\"sequences\": []}");
  CHECK(has(refusal([&] { load_corpus_file(empty, m, 100); }), "no token"));
  const auto js = write("bad.json", "{\"sequences\": [{\"tokens\": [1, 2, 900]}]}");
  CHECK(has(refusal([&] { load_corpus_file(js, m, 100); }), "900"));
  const auto txt = write("text.txt", "Once upon a time");
  CHECK(has(refusal([&] { load_corpus_file(txt, m, 100); }), "no tokenizer"));
  CHECK(has(refusal([&] { load_corpus_file((dir / "missing.txt").string(), m, 100); }), "cannot be read"));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// ---- probe sensitivity (judge_sensitivity, to_json) ------------------------------------------------
// Rows written from the rule: a rung is red when a case the undamaged baseline passed fails under it;
// a family's sensitivity is its smallest red size; a probe is vacuous when no family has one, or when
// the baseline passed no case (nothing can turn red). Sizes are exact binary fractions, compared
// exactly.

TEST_CASE("SGN.sensitivity the smallest red damage per family is the sensitivity; a probe no damage turns red is vacuous",
          SGN_TAGS) {
  const std::vector<DamageStep> steps = {
      {"v_noise", 0.25, 2, 2}, {"v_noise", 1, 2, 2}, {"v_noise", 4, 2, 1},  // red at 4 (one of two cases failed)
      {"v_repeat", 0.015625, 2, 2}, {"v_repeat", 0.25, 2, 0},               // red at 0.25
      {"k_noise_payload", 0.05, 2, 2}, {"k_noise_payload", 4, 2, 2}};       // never red
  const ProbeSensitivity p = judge_sensitivity("needle", 3, 2, steps);
  REQUIRE(p.families.size() == 3);
  CHECK_FALSE(p.vacuous);
  CHECK(p.families[0].family == "v_noise");
  REQUIRE(p.families[0].smallest_red);
  CHECK(*p.families[0].smallest_red == 4.0);
  REQUIRE(p.families[1].smallest_red);
  CHECK(*p.families[1].smallest_red == 0.25);
  CHECK_FALSE(p.families[2].smallest_red);
  CHECK(has(p.reason, "v_noise at 4"));
  CHECK(has(p.reason, "v_repeat at 0.25"));
  CHECK_FALSE(has(p.reason, "k_noise_payload"));
  // A smaller red rung listed after a larger one still decides (the minimum, not the first seen).
  const ProbeSensitivity q = judge_sensitivity("echo", 2, 2, {{"v_noise", 16, 2, 0}, {"v_noise", 4, 2, 1}});
  REQUIRE(q.families.size() == 1);
  REQUIRE(q.families[0].smallest_red);
  CHECK(*q.families[0].smallest_red == 4.0);
  // Vacuous: every rung green.
  const ProbeSensitivity v = judge_sensitivity("counting", 2, 2, {{"v_noise", 1024, 2, 2}, {"v_repeat", 1, 2, 2}});
  CHECK(v.vacuous);
  CHECK(has(v.reason, "vacuous"));
  for (const auto& f : v.families) CHECK_FALSE(f.smallest_red);
  // Vacuous: the baseline passes nothing; a rung with no case run is never red.
  const ProbeSensitivity b = judge_sensitivity("needle", 4, 0, {});
  CHECK(b.vacuous);
  CHECK(has(b.reason, "passes none"));
  CHECK_FALSE(DamageStep{"v_noise", 1, 0, 0}.red());
  CHECK(DamageStep{"v_noise", 1, 3, 2}.red());
}

TEST_CASE("SGN.sensitivity.record the sensitivity and the vacuous verdict reach the record, per family", SGN_TAGS) {
  const ProbeSensitivity p = judge_sensitivity("needle", 2, 2, {{"v_noise", 1, 2, 2}, {"v_noise", 4, 2, 0}, {"v_repeat", 1, 2, 2}});
  const json j = to_json(p);
  CHECK(j.at("probe") == "needle");
  CHECK(j.at("vacuous") == false);
  CHECK(j.at("baseline_passed") == 2);
  REQUIRE(j.at("families").size() == 2);
  CHECK(j["families"][0].at("family") == "v_noise");
  CHECK(j["families"][0].at("smallest_red") == 4.0);
  REQUIRE(j["families"][0].at("steps").size() == 2);
  CHECK(j["families"][0]["steps"][1].at("red") == true);
  CHECK(j["families"][1].at("smallest_red").is_null());
  const json v = to_json(judge_sensitivity("echo", 2, 2, {{"v_noise", 4, 2, 2}}));
  CHECK(v.at("vacuous") == true);
  CHECK(v["families"][0].at("smallest_red").is_null());
}

// ---- the windowed quality measurement over a scripted engine ---------------------------------------
// A LogitsEngine whose logits are a closed form of the absolute position: the baseline's row at
// position p is [0, 0, 0, 0]; the damaged format's adds +ln 3 to logit 1 from position 1024 on
// (q = (1/6, 3/6, 1/6, 1/6) vs the uniform baseline p: KL(p || q) = sum 1/4 ln((1/4) / q_i)
// = 1/4 ln(1/2) + 3/4 ln(3/2) = 0.1308..., and top-1 differs: id 1 against the baseline's tie-broken
// id 0), else the baseline's row. Positions below 1024 must land in 0-1K with KL 0, those above in
// 1K-4K with that KL, whatever the window. ln 3 is rounded to binary32 (relative 2^-24), so the KL is
// compared within 1e-6 relative.
namespace {
class ScriptedEngine final : public LogitsEngine {
 public:
  explicit ScriptedEngine(bool damaged) : damaged_(damaged) {}
  void reset() override { pos_ = 0; }
  std::vector<float> append(std::span<const int> t) override {
    std::vector<float> out(t.size() * 4, 0.0f);
    for (std::size_t i = 0; i < t.size(); ++i, ++pos_)
      if (damaged_ && pos_ >= 1024) out[i * 4 + 1] = static_cast<float>(std::log(3.0));
    return out;
  }
  int max_context() const override { return 1 << 20; }
  std::string effective() const override { return damaged_ ? "q4_0" : "f16"; }

 private:
  bool damaged_;
  int pos_ = 0;
};
}  // namespace

TEST_CASE("SGN.quality.depth positions land in their depth bucket across windows; every engine sees every window", SGN_TAGS) {
  const EngineFactory make = [](const std::string& f, QualityPath) { return std::make_unique<ScriptedEngine>(f == "q4_0"); };
  const std::vector<std::vector<int>> corpus = {std::vector<int>(2000, 1), std::vector<int>(700, 2)};
  const double kl = 0.25 * std::log(0.5) + 0.75 * std::log(1.5);
  for (int window : {512, 300, 2000}) {
    INFO("window " << window);
    QualityOptions qo;
    qo.window = window;
    const QualityRun r = measure_quality(make, {"q4_0", "f32"}, "f16", corpus, default_buckets(), qo);
    CHECK(r.positions == 2700);
    CHECK(r.sequences == 2);
    const QualityReport& q = r.by_format.at("q4_0");
    REQUIRE(q.buckets.size() == 4);
    CHECK(q.buckets[0].stats.positions == 1024 + 700);
    CHECK(q.buckets[0].stats.kl_max == 0.0);
    CHECK(q.buckets[0].stats.top1 == 1.0);
    CHECK(q.buckets[1].stats.positions == 2000 - 1024);
    CHECK(std::abs(q.buckets[1].stats.kl_mean - kl) <= 1e-6 * kl);
    CHECK(q.buckets[1].stats.top1 == 0.0);
    CHECK(q.buckets[2].stats.empty());
    CHECK(r.by_format.at("f32").all.kl_max == 0.0);
    // The decode-path noise run covers every position unless told otherwise.
    CHECK(r.decode_path_positions == 2700);
    QualityOptions cut = qo;
    cut.decode_path_tokens = 100;
    cut.max_tokens = 1500;
    const QualityRun c = measure_quality(make, {"q4_0"}, "f16", corpus, default_buckets(), cut);
    CHECK(c.positions == 1500 + 700);
    CHECK(c.decode_path_positions == 200);
    CHECK(c.noise.runs.at(1).quality.all.positions == 200);
    CHECK(c.by_format.at("q4_0").buckets[1].stats.positions == 1500 - 1024);
  }
}

// The conformance rule's counts at their edges: a format whose tagged gates all skipped (e.g. CUDA
// gates without a device) ran no gate, so it is NOT-VALIDATED, not CONFORMS; one pass among skips
// is enough to conform (skips alone never decide). Rows written from the rule (README "Sign-off").
TEST_CASE("SGN.conformance.counts all gates skipped is not validated; one pass among skips conforms", SGN_TAGS) {
  struct Row {
    int passed, failed, skipped;
    Conformance want;
  };
  const Row rows[] = {
      {0, 0, 5, Conformance::not_validated},     // every tagged gate skipped: none ran
      {0, 0, 0, Conformance::not_validated},     // no tagged gate at all
      {1, 0, 5, Conformance::conforms},          // one ran and passed
      {0, 1, 5, Conformance::does_not_conform},  // one ran and failed (a count without names still fails)
  };
  for (const Row& r : rows) {
    INFO("passed " << r.passed << " failed " << r.failed << " skipped " << r.skipped);
    auto c = conforming();
    c.gates.passed = r.passed;
    c.gates.failed = r.failed;
    c.gates.skipped = r.skipped;
    const auto v = conformance_verdict(c);
    CHECK(v.verdict == r.want);
    if (r.want == Conformance::not_validated) {
      REQUIRE_FALSE(v.reasons.empty());
      CHECK(has(v.reasons.front(), "no gate tagged with the format ran"));
    }
  }
}

// The verdict as signoff.json holds it goes through one field table (kvgate/verdict_record.hpp): the
// writer puts the conformance reasons, then the fit reasons, into "reasons"; a line's margin and
// bound are null exactly when its value is unmeasured / its metric unbudgeted; the reader reads back
// what the writer wrote, and refuses a verdict without "fit" naming that field. Bound: exact (strings,
// integers and the same doubles copied, no arithmetic).
TEST_CASE("SGN.record.verdict the verdict record carries both verdicts' reasons and reads back what it wrote", SGN_TAGS) {
  namespace rec = kvgate::records;
  const Policy p = policy(base_policy());
  auto c = conforming();
  c.mutation.killed = {"M1"};
  c.mutation.survived = {"M2"};
  auto in = good_input("q4_0");
  in.quality = flat_quality(stats(1.11, 5.0, 0.54, 0.6, 0.01));  // over budget: fit reasons too
  FormatVerdict v = decide("q4_0", c, p, in);
  v.notes = {"a note"};
  // Anti-vacuity: both verdicts give reasons, and the lines hold measured and unmeasured values.
  REQUIRE_FALSE(v.conformance.reasons.empty());
  REQUIRE_FALSE(v.fit.reasons.empty());
  std::vector<std::string> want = v.conformance.reasons;
  for (const auto& r : v.fit.reasons) want.push_back(r);
  const json j = rec::to_json(to_record(v));
  CHECK(j.at("format") == "q4_0");
  CHECK(j.at("verdict") == "DOES-NOT-CONFORM");
  CHECK(j.at("conformance").at("verdict") == "DOES-NOT-CONFORM");
  CHECK(j.at("fit").at("verdict") == "OVER-BUDGET");
  CHECK(j.at("deciding_line") == deciding_line(v));
  CHECK(j.at("reasons").get<std::vector<std::string>>() == want);
  CHECK(j.at("notes").get<std::vector<std::string>>() == v.notes);
  REQUIRE(j.at("fit").at("lines").size() == v.fit.lines.size());
  int measured = 0, unmeasured = 0;
  for (std::size_t i = 0; i < v.fit.lines.size(); ++i) {
    const auto& l = v.fit.lines[i];
    const json& jl = j["fit"]["lines"][i];
    INFO("line " << i << " " << jl.dump());
    CHECK(jl.at("value").is_null() == !l.value.has_value());
    CHECK(jl.at("margin").is_null() == !l.value.has_value());
    CHECK(jl.at("bound").is_null() == l.budget.budget.disabled);
    if (l.value) {
      ++measured;
      CHECK(jl.at("value").get<double>() == *l.value);
      CHECK(jl.at("margin").get<double>() == l.margin);
    } else {
      ++unmeasured;
    }
  }
  CHECK(measured > 0);
  CHECK(unmeasured > 0);
  // The reader reads back what the writer wrote.
  const auto back = rec::from_json<rec::FormatVerdictRecord>(j, "signoff.json", "write it with kvgate signoff");
  CHECK(rec::to_json(back) == j);
  // A verdict without "fit" is refused naming the field.
  json bad = j;
  bad.erase("fit");
  std::string what = "<accepted>";
  try {
    (void)rec::from_json<rec::FormatVerdictRecord>(bad, "signoff.json", "write it with kvgate signoff");
  } catch (const rec::RecordError& e) {
    what = e.what();
    CHECK(e.pointer() == "/fit");
  }
  CHECK(has(what, "signoff.json: field /fit is missing"));
}

// ---- probe parity from the matrix's probe records (kvgate/signoff_probes.hpp) ---------------------------

namespace {

// A probe record: {"cases_detail": [{"id", "status", "passed"}]} from (id, status, passed) triples.
json probe(std::initializer_list<std::tuple<const char*, const char*, bool>> cases) {
  json d = json::array();
  for (const auto& [id, status, passed] : cases) d.push_back({{"id", id}, {"status", status}, {"passed", passed}});
  return {{"cases_detail", d}};
}

}  // namespace

TEST_CASE("SGN.probes.incomplete a probe case the baseline passed but the format lacks or skipped is NOT-MEASURED, never PASS",
          SGN_TAGS) {
  // The rule (README: NOT-MEASURED when "something a verdict needs did not run"): probe parity counts the cases
  // the baseline ran and passed and the format ran and failed; when such a case is missing from the
  // format's results or did not run there, or a whole probe is missing, the count is not measured.
  // The class it closes: a comparison that skips what it cannot compare, so a partial probe run
  // reads as parity. Expected values by hand per row; the verdict rows go through fit_verdict/decide.
  const json base = {{"probes",
                      {{"needle", probe({{"n1", "ran", true}, {"n2", "ran", true}, {"n3", "ran", false}, {"n4", "skipped", false}})},
                       {"echo", probe({{"e1", "ran", true}})}}}};
  struct Row {
    const char* what;
    json fmt;
    std::optional<int> want;
  };
  const json echo_ok = probe({{"e1", "ran", true}});
  const Row rows[] = {
      {"every case ran and passed", {{"probes", {{"needle", probe({{"n1", "ran", true}, {"n2", "ran", true}})}, {"echo", echo_ok}}}}, 0},
      {"one regression (n2 failed), the case the baseline failed is not counted",
       {{"probes", {{"needle", probe({{"n1", "ran", true}, {"n2", "ran", false}, {"n3", "ran", false}})}, {"echo", echo_ok}}}}, 1},
      {"two regressions across probes",
       {{"probes", {{"needle", probe({{"n1", "ran", false}, {"n2", "ran", true}})}, {"echo", probe({{"e1", "ran", false}})}}}}, 2},
      {"a baseline-passed case missing from the format (n2)",
       {{"probes", {{"needle", probe({{"n1", "ran", true}})}, {"echo", echo_ok}}}}, std::nullopt},
      {"the missing case comes first, a regression after it",
       {{"probes", {{"needle", probe({{"n2", "ran", false}})}, {"echo", echo_ok}}}}, std::nullopt},
      {"a baseline-passed case skipped by the format",
       {{"probes", {{"needle", probe({{"n1", "ran", true}, {"n2", "skipped", false}})}, {"echo", echo_ok}}}}, std::nullopt},
      {"a whole probe missing (echo)", {{"probes", {{"needle", probe({{"n1", "ran", true}, {"n2", "ran", true}})}}}}, std::nullopt},
      {"no probe records at all", {{"probes", json::object()}}, std::nullopt},
      {"the baseline's skipped and failed cases may be absent",
       {{"probes", {{"needle", probe({{"n1", "ran", true}, {"n2", "ran", true}})}, {"echo", echo_ok}}}}, 0},
  };
  const Policy p = policy(base_policy());
  int incomplete = 0;
  for (const Row& r : rows) {
    INFO("row: " << r.what);
    const std::optional<int> got = probe_regressions(base, r.fmt);
    CHECK(got.has_value() == r.want.has_value());
    if (got && r.want) CHECK(*got == *r.want);
    // The sign-off of an otherwise perfect format: PASS only with complete, regression-free probes.
    FitInput in = good_input("int8");
    in.probe_regressions = got;
    const FormatVerdict fv = decide("int8", conforming(), p, in);
    const Overall want = !r.want ? Overall::not_measured : *r.want == 0 ? Overall::pass : Overall::over_budget;
    CHECK(fv.overall == want);
    incomplete += !r.want.has_value();
  }
  CHECK(incomplete == 5);  // anti-vacuity: missing case (twice), skipped case, missing probe, no records
  CHECK_FALSE(probe_regressions(json(nullptr), rows[0].fmt).has_value());
}

TEST_CASE("SGN.quality.p99 the KL p99 is the nearest-rank order statistic: the ceil(0.99 n)-th smallest of n positions",
          SGN_TAGS) {
  // The definition (the matrix's compare_logits and NIST's nearest-rank percentile): sort the n
  // per-position KLs ascending and take the ceil(0.99 n)-th (1-based). With KL_i = i / 1000 for
  // i = 1..n, fed in a scrambled order, the p99 is ceil(0.99 n) / 1000; the values by hand:
  //   n = 1: 1, 2: 2 (ceil 1.98), 99: 99 (ceil 98.01), 100: 99, 101: 100 (ceil 99.99), 150: 149
  //   (ceil 148.5), 200: 198, 1000: 990.
  // The class it closes: a 0-based/1-based rank slip, which the clamp to the maximum hides below 100
  // positions. Bound: exact (the value is one of the inputs, and 0.99 n rounds to the integer or
  // above it in binary64 for these n). Anti-vacuity: at every n >= 100 the p99 is below the maximum,
  // so the clamp no longer hides a rank slip.
  const std::pair<int, int> rows[] = {{1, 1}, {2, 2}, {99, 99}, {100, 99}, {101, 100}, {150, 149}, {200, 198}, {1000, 990}};
  for (const auto& [n, want] : rows) {
    INFO("n = " << n);
    std::vector<PositionMetrics> pm(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      const int v = (i * 37) % n + 1;  // 37 is coprime with every n here: a permutation of 1..n
      pm[static_cast<std::size_t>(i)].kl = v / 1000.0;
      pm[static_cast<std::size_t>(i)].depth = i;
    }
    const QualityStats s = summarize(pm);
    CHECK(s.kl_p99 == want / 1000.0);
    CHECK(s.kl_max == n / 1000.0);
    if (n >= 100) CHECK(s.kl_p99 != s.kl_max);
  }
}

// --- coverage of the shipped code (kvgate signoff --coverage; kvgate/signoff_coverage.hpp) ----------
namespace {
json coverage_file(const std::string& name, long long lc, long long lt, long long bc, long long bt) {
  return {{"filename", name}, {"line_covered", lc}, {"line_total", lt}, {"branch_covered", bc}, {"branch_total", bt}};
}
}  // namespace

TEST_CASE("SGN.coverage.bar the runtime/ line bar is met at exactly 95% of lines and missed one line below", SGN_TAGS) {
  // The bar (issue "gates a stranger cannot get past", README "Coverage"): at least 95% of runtime/
  // lines reached, inclusive. Rows by hand: 1900/2000 = 95.0% met; 1899/2000 = 94.95% missed;
  // 19/20 = 95% met (a small part rounds nothing); 2000/2000 met; 0/2000 missed; no line: not
  // measured (never "met" on nothing). Bound: exact (integer comparison 100 * covered >= 95 * total).
  struct Row {
    long long covered, total;
    const char* want;
  } rows[] = {{1900, 2000, "met"}, {1899, 2000, "missed"}, {19, 20, "met"}, {18, 20, "missed"},
              {2000, 2000, "met"}, {0, 2000, "missed"}, {0, 0, "not measured"}};
  for (const auto& r : rows) {
    INFO(r.covered << "/" << r.total);
    CoverageCounts c;
    c.lines_covered = r.covered;
    c.lines_total = r.total;
    CHECK(coverage_bar_status(c, kCoverageRuntimeLineBar) == r.want);
  }
  CHECK(kCoverageRuntimeLineBar == 95.0);
}

TEST_CASE("SGN.coverage.parts every file counts in its own part and the total; runtime files below 100% are listed with their lines",
          SGN_TAGS) {
  // A gcovr summary written by hand with distinct counts per file, so a file counted in the wrong
  // part, counted twice, or a lines/branches swap changes a sum. By hand:
  //   runtime/: a.cpp 90/100 lines 30/40 branches, b.cpp 50/50, 10/10, kvgate/c.hpp 7/10, 1/2
  //             -> 147/160 lines (91.875%: below the bar), 41/52 branches
  //   cli/: 20/25, 5/8; runtime_extra/x.cpp (not runtime/): 3/9, 0/0 -> total only
  //   total: 170/194 lines, 46/60 branches
  //   unreached runtime files, most unreached first: a.cpp (10), then c.hpp (3); b.cpp is whole
  const json doc = {{"files", json::array({coverage_file("runtime/src/a.cpp", 90, 100, 30, 40), coverage_file("runtime/src/b.cpp", 50, 50, 10, 10),
                                           coverage_file("runtime/include/kvgate/c.hpp", 7, 10, 1, 2), coverage_file("cli/main.cpp", 20, 25, 5, 8),
                                           coverage_file("runtime_extra/x.cpp", 3, 9, 0, 0)})}};
  // gcovr's text report: a long name alone on its line, its numbers on the next.
  const std::string summary =
      "File                                       Lines    Exec  Cover   Missing\n"
      "------------------------------------------------------------------------------\n"
      "runtime/src/a.cpp                            100      90    90%   3,7-15\n"
      "runtime/include/kvgate/c.hpp\n"
      "                                              10       7    70%   4-6\n"
      "runtime/src/b.cpp                             50      50   100%\n";
  const std::string scope = "commit: 0123abc\ntargets: all\ntests: all\n";
  const CoverageSummary c = parse_coverage(doc, "cov/coverage.json", summary, scope);
  CHECK(c.measured);
  CHECK(c.commit == "0123abc");
  CHECK(c.scope == "targets: all; tests: all");
  CHECK(c.total.lines_covered == 170);
  CHECK(c.total.lines_total == 194);
  CHECK(c.total.branches_covered == 46);
  CHECK(c.total.branches_total == 60);
  REQUIRE(c.parts.size() == 2);  // parts without files are left out
  CHECK(c.parts[0].part == "runtime/");
  CHECK(c.parts[0].files == 3);
  CHECK(c.parts[0].counts.lines_covered == 147);
  CHECK(c.parts[0].counts.lines_total == 160);
  CHECK(c.parts[0].counts.branches_covered == 41);
  CHECK(c.parts[0].counts.branches_total == 52);
  CHECK(c.parts[1].part == "cli/");
  CHECK(c.parts[1].counts.lines_covered == 20);
  CHECK(c.parts[1].counts.lines_total == 25);
  CHECK(c.bar_status == "missed");  // 147/160 = 91.9%
  REQUIRE(c.runtime_unreached.size() == 2);
  CHECK(c.runtime_unreached[0].file == "runtime/src/a.cpp");
  CHECK(c.runtime_unreached[0].missing == "3,7-15");
  CHECK(c.runtime_unreached[1].file == "runtime/include/kvgate/c.hpp");
  CHECK(c.runtime_unreached[1].missing == "4-6");
  const json j = to_json(c);
  CHECK(j["bar"]["status"] == "missed");
  CHECK(j["bar"]["bound_percent"] == 95.0);
  CHECK(j["parts"][0]["line_percent"] == 91.9);  // 91.875 rounded to one decimal
  CHECK(j["total"]["lines_total"] == 194);
  // anti-vacuity: one more reached runtime line per file that lacks them brings the part to the bar
  // only when the sum says so: 152/160 = 95% exactly -> met.
  json doc2 = doc;
  doc2["files"][0]["line_covered"] = 95;
  CHECK(parse_coverage(doc2, "cov/coverage.json", "", "").bar_status == "met");
  // no --coverage: not measured, never met
  CHECK(coverage_not_measured().bar_status == "not measured");
  CHECK_FALSE(to_json(coverage_not_measured())["measured"].get<bool>());
}

TEST_CASE("SGN.coverage.refusals a file that is not gcovr's summary is refused naming the file, the field and the fix", SGN_TAGS) {
  struct Row {
    json doc;
    const char* field;
  } rows[] = {
      {json::object(), "files"},
      {{{"files", json::object()}}, "files"},
      {{{"files", json::array({{{"line_covered", 1}}})}}, "files[0].filename"},
      {{{"files", json::array({coverage_file("runtime/a.cpp", -1, 5, 0, 0)})}}, "files[0].line_covered"},
      {{{"files", json::array({coverage_file("runtime/a.cpp", 1, 5, 0, 0), {{"filename", "b"}, {"line_covered", 1}, {"line_total", 2},
                                                                            {"branch_covered", 1}}})}},
       "files[1].branch_total"},
      {{{"files", json::array({coverage_file("runtime/a.cpp", 6, 5, 0, 0)})}}, "files[0]"},
      {{{"files", json::array({coverage_file("runtime/a.cpp", 1, 5, 3, 2)})}}, "files[0]"},
  };
  int refused = 0;
  for (const auto& r : rows) {
    INFO(r.doc.dump());
    try {
      (void)parse_coverage(r.doc, "out/coverage.json", "", "");
      FAIL("accepted");
    } catch (const CoverageError& e) {
      const std::string m = e.what();
      INFO(m);
      CHECK(m.find("out/coverage.json") != std::string::npos);
      CHECK(m.find(r.field) != std::string::npos);
      CHECK(m.find("scripts/coverage.sh") != std::string::npos);
      ++refused;
    }
  }
  CHECK(refused == 7);
  // anti-vacuity: the same shape with valid counts is read
  CHECK(parse_coverage({{"files", json::array({coverage_file("runtime/a.cpp", 5, 5, 2, 2)})}}, "out/coverage.json", "", "").measured);
}

namespace {
// A hand-written catalog: one mutant per case of the plan's rules.
json proof_catalog() {
  return json::parse(R"({"mutants": [
    {"id": "CANARY", "category": "canary", "expect_killed_by": ["ENV.int8"]},
    {"id": "M.int8", "category": "store", "expect_killed_by": ["ENV.int8"]},
    {"id": "M.both", "category": "store", "expect_killed_by": ["ENV.int8", "ENV.q4_0"]},
    {"id": "M.q4_0", "category": "store", "expect_killed_by": ["X.other", "ENV.q4_0"]},
    {"id": "M.gpu", "category": "cuda", "requires": ["cuda", "cuda-device"], "expect_killed_by": ["ENV.int8"]},
    {"id": "M.cuda_build", "category": "cuda", "requires": ["cuda"], "expect_killed_by": ["ENV.q4_0"]},
    {"id": "M.none", "category": "store", "expect_killed_by": ["X.other"]}
  ]})");
}
const std::map<std::string, std::set<std::string>> kProofGates{{"int8", {"ENV.int8"}}, {"q4_0", {"ENV.q4_0"}}};
}  // namespace

TEST_CASE("SGN.proof.selection each format proves with the mutants its gates expect to kill; GPU-only and CUDA-build mutants are left out where they cannot run",
          SGN_TAGS) {
  // Rows by hand from the plan's rules (kvgate/signoff_proof.hpp): the canary is never selected; a
  // mutant belongs to every format one of whose gates it names; requires cuda-device is left out of
  // a sign-off that is not --device cuda, requires cuda out of a build without the CUDA backend.
  // Bound: exact (lists and counts).
  const json cat = proof_catalog();
  using V = std::vector<std::string>;
  {  // CPU sign-off, CPU build
    const ProofSelection s = select_proof_mutants(cat, kProofGates, "cpu", false);
    CHECK(s.mutants_of.at("int8") == V{"M.int8", "M.both"});
    CHECK(s.mutants_of.at("q4_0") == V{"M.both", "M.q4_0"});
    CHECK(s.all_ids == std::set<std::string>{"M.int8", "M.both", "M.q4_0"});
    CHECK(s.gpu_only_left_out.at("int8") == 1);
    CHECK(s.gpu_only_left_out.count("q4_0") == 0);
    CHECK(s.cuda_build_left_out.at("q4_0") == 1);
    CHECK(s.cuda_build_left_out.count("int8") == 0);
  }
  {  // CPU sign-off on a CUDA build: the CUDA-build mutant runs (its code is in this build); the GPU-only one does not
    const ProofSelection s = select_proof_mutants(cat, kProofGates, "cpu", true);
    CHECK(s.mutants_of.at("q4_0") == V{"M.both", "M.q4_0", "M.cuda_build"});
    CHECK(s.cuda_build_left_out.empty());
    CHECK(s.gpu_only_left_out.at("int8") == 1);
    CHECK(s.all_ids.count("M.gpu") == 0);
  }
  {  // --device cuda on a CUDA build: everything its gates name
    const ProofSelection s = select_proof_mutants(cat, kProofGates, "cuda", true);
    CHECK(s.mutants_of.at("int8") == V{"M.int8", "M.both", "M.gpu"});
    CHECK(s.gpu_only_left_out.empty());
    CHECK(s.cuda_build_left_out.empty());
    CHECK(s.all_ids.size() == 5);
    CHECK(s.all_ids.count("CANARY") == 0);
    CHECK(s.all_ids.count("M.none") == 0);
  }
  {  // --device cuda on a build without the backend: a cuda-device mutant also requires cuda; left out as GPU-only only when not --device cuda
    const ProofSelection s = select_proof_mutants(cat, kProofGates, "cuda", false);
    CHECK(s.cuda_build_left_out.at("int8") == 1);
    CHECK(s.cuda_build_left_out.at("q4_0") == 1);
    CHECK(s.all_ids.size() == 3);
  }
  // Not a catalog: nothing selected (the sign-off then says the catalog was not found).
  CHECK(select_proof_mutants(json::array(), kProofGates, "cpu", false).all_ids.empty());
  CHECK(select_proof_mutants(json::object(), kProofGates, "cpu", false).mutants_of.empty());
}

TEST_CASE("SGN.proof.command the sign-off runs kvgate mutate --only the selected IDs with --bail, without it for the full matrix; a CUDA kvgate's scratch build has CUDA",
          SGN_TAGS) {
  // The command line by hand: single-quoted arguments (a quote inside one closes, escapes and
  // reopens it), the IDs comma-joined in set order, -j at least 1, --scratch only when given,
  // --bail unless the full kill matrix is asked for. Bound: exact strings.
  const std::set<std::string> ids{"B.two", "A.one"};
  ProofCommand c{"/opt/kv gate/kvgate", "/tmp/out/mutants", 2, "", false};
  CHECK(proof_mutate_command(c, ids) ==
        "'/opt/kv gate/kvgate' mutate --only 'A.one,B.two' --out '/tmp/out/mutants' -j 2 --bail");
  c.full_matrix = true;
  CHECK(proof_mutate_command(c, ids) == "'/opt/kv gate/kvgate' mutate --only 'A.one,B.two' --out '/tmp/out/mutants' -j 2");
  c.jobs = 0;
  c.scratch = "/s/it's";
  CHECK(proof_mutate_command(c, ids) ==
        "'/opt/kv gate/kvgate' mutate --only 'A.one,B.two' --out '/tmp/out/mutants' -j 1 --scratch '/s/it'\\''s'");
  // A kvgate with the CUDA backend: the scratch build gets it too, whether or not a device is
  // present (the requires: cuda mutants it selected must be built, not skipped).
  c.cuda_build = true;
  c.full_matrix = false;
  c.scratch.clear();
  CHECK(proof_mutate_command(c, ids) ==
        "'/opt/kv gate/kvgate' mutate --only 'A.one,B.two' --out '/tmp/out/mutants' -j 1 --cmake-arg -DKVGATE_CUDA=ON --bail");
}
