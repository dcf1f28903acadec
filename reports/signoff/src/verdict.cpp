// The verdict rules: conformance, fit (each policy line against its measured value and the noise
// floor), the roll-up and the exit codes.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "kvgate/signoff.hpp"

namespace kvgate::signoff {

namespace {

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string o;
  for (const auto& x : v) o += (o.empty() ? "" : sep) + x;
  return o;
}

std::string num(double x) {
  std::ostringstream o;
  o.precision(4);
  o << x;
  return o.str();
}

int severity(Overall o) {
  switch (o) {
    case Overall::does_not_conform: return 3;
    case Overall::over_budget: return 2;
    case Overall::not_validated:
    case Overall::not_measured: return 1;
    case Overall::pass: return 0;
  }
  return 3;
}

}  // namespace

std::string to_string(Conformance c) {
  switch (c) {
    case Conformance::conforms: return "CONFORMS";
    case Conformance::does_not_conform: return "DOES-NOT-CONFORM";
    case Conformance::not_validated: return "NOT-VALIDATED";
  }
  return "?";
}
std::string to_string(Fit f) {
  switch (f) {
    case Fit::fits: return "FITS";
    case Fit::over_budget: return "OVER-BUDGET";
    case Fit::not_measured: return "NOT-MEASURED";
  }
  return "?";
}
std::string to_string(Overall o) {
  switch (o) {
    case Overall::pass: return "PASS";
    case Overall::does_not_conform: return "DOES-NOT-CONFORM";
    case Overall::over_budget: return "OVER-BUDGET";
    case Overall::not_validated: return "NOT-VALIDATED";
    case Overall::not_measured: return "NOT-MEASURED";
  }
  return "?";
}
std::string to_string(LineStatus s) {
  switch (s) {
    case LineStatus::within: return "within";
    case LineStatus::over: return "over";
    case LineStatus::not_measured: return "not_measured";
    case LineStatus::refused: return "refused";
    case LineStatus::not_applicable: return "not_applicable";
  }
  return "?";
}

const char* exit_codes_help() {
  return "exit codes: 0 PASS (every format conforms and fits); 2 DOES-NOT-CONFORM (a gate failed or a mutant "
         "survived); 3 OVER-BUDGET (a format's quality or cost misses the release policy); 4 NOT-VALIDATED or "
         "NOT-MEASURED (something needed for a verdict did not run: e.g. --quick skips the mutation proof); "
         "1 bad input (policy, corpus, baseline or flags refused; nothing is written). The most severe verdict "
         "over all formats decides: DOES-NOT-CONFORM > OVER-BUDGET > NOT-VALIDATED/NOT-MEASURED > PASS.";
}

Overall roll_up(Conformance c, Fit f) {
  if (c == Conformance::does_not_conform) return Overall::does_not_conform;
  if (f == Fit::over_budget) return Overall::over_budget;
  if (c == Conformance::not_validated) return Overall::not_validated;
  if (f == Fit::not_measured) return Overall::not_measured;
  return Overall::pass;
}

int exit_code(Overall o) {
  switch (o) {
    case Overall::pass: return kExitPass;
    case Overall::does_not_conform: return kExitDoesNotConform;
    case Overall::over_budget: return kExitOverBudget;
    case Overall::not_validated:
    case Overall::not_measured: return kExitNotDecided;
  }
  return kExitError;
}

int exit_code(const std::vector<Overall>& all) {
  Overall worst = Overall::pass;
  for (const auto o : all)
    if (severity(o) > severity(worst)) worst = o;
  return exit_code(worst);
}

ConformanceVerdict conformance_verdict(const ConformanceInput& in) {
  ConformanceVerdict v;
  std::vector<std::string> fail, nv;
  if (!in.gates.failing.empty() || in.gates.failed > 0)
    fail.push_back("failing gates: " + (in.gates.failing.empty() ? std::to_string(in.gates.failed) : join(in.gates.failing)));
  if (!in.mutation.survived.empty()) fail.push_back("survived mutants: " + join(in.mutation.survived));
  if (!in.gate_error.empty()) nv.push_back("gates not run: " + in.gate_error);
  else if (in.gates.passed + in.gates.failed == 0) nv.push_back("no gate tagged with the format ran");
  const auto& m = in.mutation;
  if (m.mutants.empty()) nv.push_back(m.not_run_reason.empty() ? "no catalog mutant targets a gate of the format" : m.not_run_reason);
  else if (m.status == "not_run" || m.status == "none") nv.push_back(m.not_run_reason.empty() ? "mutation proof not run" : m.not_run_reason);
  else {
    if (!m.missing.empty()) nv.push_back("mutants not in the outcomes: " + join(m.missing));
    if (!m.undecided.empty()) nv.push_back("mutants not decided: " + join(m.undecided));
    if (!m.baseline_green) nv.push_back(m.baseline_message.empty() ? "mutation baseline not green" : m.baseline_message);
  }
  if (!in.fallback_reason.empty())
    nv.push_back("falls back to " + in.fallback_effective + " on this model (" + in.fallback_reason +
                 "): the format itself was not measured");
  nv.insert(nv.end(), in.not_validated.begin(), in.not_validated.end());
  v.verdict = !fail.empty() ? Conformance::does_not_conform : !nv.empty() ? Conformance::not_validated : Conformance::conforms;
  v.reasons = fail;
  v.reasons.insert(v.reasons.end(), nv.begin(), nv.end());
  return v;
}

LineResult judge_line(const EffectiveBudget& b, std::optional<double> value, std::optional<double> noise,
                      const std::string& device, const std::string& scope) {
  LineResult r;
  r.budget = b;
  r.scope = scope;
  r.value = value;
  r.noise = noise;
  const MetricInfo& mi = info(b.budget.metric);
  if (b.budget.disabled) {
    r.status = LineStatus::not_applicable;
    r.reason = "not budgeted: " + b.budget.source;
    return r;
  }
  if (!b.budget.devices.empty() &&
      std::find(b.budget.devices.begin(), b.budget.devices.end(), device) == b.budget.devices.end()) {
    r.status = LineStatus::not_applicable;
    r.reason = "applies on " + join(b.budget.devices) + " only (this sign-off: " + device + ")";
    return r;
  }
  const bool at_most = mi.direction == Direction::at_most;
  // A budget tighter than the noise floor (what two float runs that should agree already differ
  // by) cannot be resolved by the metric: refused, with the floor it would need.
  if (noise && (at_most ? b.budget.bound < *noise : b.budget.bound > *noise)) {
    r.status = LineStatus::refused;
    r.reason = describe(b) + " is tighter than the measured noise floor " + num(*noise) + " " + mi.unit +
               " (two float runs that should agree differ by that much): the metric cannot resolve it; fix: a bound " +
               (at_most ? ">= " : "<= ") + num(*noise);
    return r;
  }
  if (!value) {
    r.status = LineStatus::not_measured;
    r.reason = std::string(mi.key) + " not measured";
    return r;
  }
  const bool within = at_most ? *value <= b.budget.bound : *value >= b.budget.bound;
  // Relative headroom; a zero bound (probe parity) met exactly has all its headroom (1), so that it
  // never hides the tightest measured line.
  const double denom = std::abs(b.budget.bound) > 0 ? std::abs(b.budget.bound) : 1.0;
  r.margin = (at_most ? b.budget.bound - *value : *value - b.budget.bound) / denom;
  if (b.budget.bound == 0 && within) r.margin = 1.0;
  r.status = within ? LineStatus::within : LineStatus::over;
  r.reason = std::string(mi.key) + (scope.empty() || scope == "all" ? "" : " at depth " + scope) + " = " + num(*value) + " " +
             mi.unit + (within ? " within " : " misses ") + describe(b);
  return r;
}

FitVerdict fit_verdict(const Policy& p, const FitInput& in) {
  FitVerdict v;
  for (const auto& b : budgets_for(p, in.format)) {
    const Metric m = b.budget.metric;
    const MetricInfo& mi = info(m);
    if (mi.quality) {
      const auto noise = in.noise.worst(m);
      if (!in.quality) {
        auto l = judge_line(b, std::nullopt, noise, in.device, "all");
        if (l.status == LineStatus::not_measured && !in.not_measured_reason.empty()) l.reason = in.not_measured_reason;
        v.lines.push_back(l);
        continue;
      }
      v.lines.push_back(judge_line(b, value_of(in.quality->all, m), noise, in.device, "all"));
      for (const auto& bq : in.quality->buckets) {
        auto l = judge_line(b, value_of(bq.stats, m), noise, in.device, bq.bucket.name);
        if (bq.stats.empty() && l.status == LineStatus::not_measured) {
          l.status = LineStatus::not_applicable;
          l.reason = "depth bucket " + bq.bucket.name + " is empty: no corpus position at that depth";
        }
        v.lines.push_back(l);
      }
      continue;
    }
    std::optional<double> value;
    if (m == Metric::probe_parity && in.probe_regressions) value = static_cast<double>(*in.probe_regressions);
    if (m == Metric::kv_saving) value = in.kv_saving;
    if (m == Metric::decode_speedup) value = in.decode_speedup;
    v.lines.push_back(judge_line(b, value, std::nullopt, in.device, ""));
  }
  if (!in.unmeasured_reason.empty())
    for (auto& l : v.lines)
      if (l.status == LineStatus::not_measured) l.reason = in.unmeasured_reason;
  int worst_over = -1, first_open = -1, tightest = -1;
  for (int i = 0; i < static_cast<int>(v.lines.size()); ++i) {
    const auto& l = v.lines[static_cast<std::size_t>(i)];
    if (l.status == LineStatus::over) {
      v.reasons.push_back(l.reason);
      if (worst_over < 0 || l.margin < v.lines[static_cast<std::size_t>(worst_over)].margin) worst_over = i;
    } else if (l.status == LineStatus::not_measured || l.status == LineStatus::refused) {
      if (first_open < 0) first_open = i;
    } else if (l.status == LineStatus::within) {
      if (tightest < 0 || l.margin < v.lines[static_cast<std::size_t>(tightest)].margin) tightest = i;
    }
  }
  if (worst_over >= 0) {
    v.verdict = Fit::over_budget;
    v.deciding = worst_over;
  } else if (first_open >= 0) {
    v.verdict = Fit::not_measured;
    v.deciding = first_open;
    for (const auto& l : v.lines)
      if (l.status == LineStatus::not_measured || l.status == LineStatus::refused)
        if (std::find(v.reasons.begin(), v.reasons.end(), l.reason) == v.reasons.end()) v.reasons.push_back(l.reason);
  } else if (tightest >= 0) {
    v.verdict = Fit::fits;
    v.deciding = tightest;
  } else {
    v.verdict = Fit::not_measured;
    v.reasons.push_back("no budget of the policy applies to " + in.format + " on " + in.device);
  }
  return v;
}

FormatVerdict decide(const std::string& format, const ConformanceInput& c, const Policy& p, const FitInput& f) {
  FormatVerdict v;
  v.format = format;
  v.conformance = conformance_verdict(c);
  v.fit = fit_verdict(p, f);
  v.overall = roll_up(v.conformance.verdict, v.fit.verdict);
  return v;
}

std::string deciding_line(const FormatVerdict& v) {
  if (v.fit.deciding < 0 || v.fit.deciding >= static_cast<int>(v.fit.lines.size()))
    return v.fit.reasons.empty() ? "–" : v.fit.reasons.front();
  const auto& l = v.fit.lines[static_cast<std::size_t>(v.fit.deciding)];
  const MetricInfo& mi = info(l.budget.budget.metric);
  std::string s = describe(l.budget);
  if (!l.scope.empty()) s += " [" + l.scope + "]";
  if (l.status == LineStatus::within || l.status == LineStatus::over)
    s += ": " + num(*l.value) + " " + mi.unit + (l.status == LineStatus::within ? " (tightest line)" : " (misses)");
  else
    s += ": " + l.reason;
  return s;
}

}  // namespace kvgate::signoff
