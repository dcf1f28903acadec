// Probe sensitivity: the smallest injected KV damage that turns a probe red, per damage family; a
// probe no damage turns red is vacuous.
#include <algorithm>
#include <cstdio>

#include "kvgate/signoff.hpp"

namespace kvgate::signoff {

namespace {
std::string g3(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", x);
  return b;
}
}  // namespace

ProbeSensitivity judge_sensitivity(const std::string& probe, int baseline_ran, int baseline_passed,
                                   const std::vector<DamageStep>& steps) {
  ProbeSensitivity p;
  p.probe = probe;
  p.baseline_ran = baseline_ran;
  p.baseline_passed = baseline_passed;
  for (const auto& s : steps) {
    auto it = std::find_if(p.families.begin(), p.families.end(), [&](const FamilySensitivity& f) { return f.family == s.family; });
    if (it == p.families.end()) {
      p.families.push_back({s.family, std::nullopt, {}});
      it = p.families.end() - 1;
    }
    it->steps.push_back(s);
    if (s.red() && (!it->smallest_red || s.size < *it->smallest_red)) it->smallest_red = s.size;
  }
  if (baseline_passed <= 0) {
    p.vacuous = true;
    p.reason = "vacuous: the undamaged baseline passes none of the " + std::to_string(baseline_ran) +
               " cases tried, so no damage can turn it red";
    for (auto& f : p.families) f.smallest_red.reset();
    return p;
  }
  std::string red;
  for (const auto& f : p.families)
    if (f.smallest_red) red += (red.empty() ? "" : ", ") + f.family + " at " + g3(*f.smallest_red);
  p.vacuous = red.empty();
  p.reason = p.vacuous ? "vacuous: no injected damage of any family or size turned it red"
                       : "red under " + red;
  return p;
}

nlohmann::json to_json(const ProbeSensitivity& p) {
  nlohmann::json fam = nlohmann::json::array();
  for (const auto& f : p.families) {
    nlohmann::json st = nlohmann::json::array();
    for (const auto& s : f.steps) st.push_back({{"size", s.size}, {"ran", s.ran}, {"passed", s.passed}, {"red", s.red()}});
    fam.push_back({{"family", f.family},
                   {"smallest_red", f.smallest_red ? nlohmann::json(*f.smallest_red) : nlohmann::json(nullptr)},
                   {"steps", st}});
  }
  return {{"probe", p.probe},   {"baseline_ran", p.baseline_ran}, {"baseline_passed", p.baseline_passed},
          {"vacuous", p.vacuous}, {"reason", p.reason},             {"engine", p.engine}, {"envelope_format", p.envelope_format},
          {"families", fam}};
}

}  // namespace kvgate::signoff
