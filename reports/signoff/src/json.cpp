// The sign-off records as JSON (the edge: signoff.json, reports/schema/signoff.schema.json).
#include "kvgate/signoff.hpp"

namespace kvgate::signoff {

using json = nlohmann::json;

namespace {
json opt(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }
}  // namespace

json to_json(const QualityStats& s) {
  if (s.empty()) return {{"positions", 0}, {"empty", true}};
  return {{"positions", s.positions}, {"empty", false},      {"ppl_positions", s.ppl_positions},
          {"kl_mean", s.kl_mean},     {"kl_p99", s.kl_p99},   {"kl_max", s.kl_max},
          {"top1", s.top1},           {"one_minus_tv", s.one_minus_tv},
          {"ppl_base", s.ppl_base},   {"ppl_format", s.ppl_fmt}, {"ppl_delta", s.ppl_delta}};
}

json to_json(const QualityReport& q) {
  json b = json::array();
  for (const auto& x : q.buckets) {
    json e = to_json(x.stats);
    e["bucket"] = x.bucket.name;
    e["lo"] = x.bucket.lo;
    e["hi"] = x.bucket.hi < 0 ? json(nullptr) : json(x.bucket.hi);
    b.push_back(e);
  }
  return {{"all", to_json(q.all)}, {"buckets", b}};
}

json to_json(const NoiseFloor& n) {
  json runs = json::array();
  for (const auto& r : n.runs) runs.push_back({{"name", r.name}, {"quality", to_json(r.quality)}});
  json worst = json::object();
  for (const auto& m : metrics())
    if (m.quality) worst[m.key] = opt(n.worst(m.metric));
  return {{"runs", runs}, {"worst", worst}};
}

json to_json(const LineResult& l) {
  const MetricInfo& mi = info(l.budget.budget.metric);
  return {{"metric", mi.key},
          {"origin", l.budget.origin},
          {"line", describe(l.budget)},
          {"direction", mi.direction == Direction::at_most ? "at_most" : "at_least"},
          {"bound", l.budget.budget.disabled ? json(nullptr) : json(l.budget.budget.bound)},
          {"unit", mi.unit},
          {"source", l.budget.budget.source},
          {"scope", l.scope},
          {"value", opt(l.value)},
          {"noise_floor", opt(l.noise)},
          {"status", to_string(l.status)},
          {"reason", l.reason},
          {"margin", l.value ? json(l.margin) : json(nullptr)}};
}

json to_json(const ConformanceVerdict& c) { return {{"verdict", to_string(c.verdict)}, {"reasons", c.reasons}}; }

json to_json(const FitVerdict& f) {
  json lines = json::array();
  for (const auto& l : f.lines) lines.push_back(to_json(l));
  return {{"verdict", to_string(f.verdict)}, {"reasons", f.reasons}, {"deciding", f.deciding}, {"lines", lines}};
}

json to_json(const GateCounts& g) {
  return {{"passed", g.passed}, {"failed", g.failed}, {"skipped", g.skipped}, {"failing", g.failing}, {"skipped_ids", g.skipped_ids}};
}

json to_json(const MutationOutcome& m) {
  json nr = m.not_run;
  for (const auto& x : m.missing) nr.push_back(x);
  for (const auto& x : m.undecided) nr.push_back(x.substr(0, x.find(' ')));
  return {{"status", m.status}, {"mutants", m.mutants}, {"killed", m.killed}, {"survived", m.survived}, {"not_run", nr}};
}

json to_json(const Policy& p) {
  auto set = [](const std::vector<Budget>& v) {
    json o = json::object();
    for (const auto& b : v) {
      const MetricInfo& mi = info(b.metric);
      if (b.disabled) {
        o[mi.key] = {{"not_budgeted", b.source}};
        continue;
      }
      json e = {{mi.bound_key, b.bound}, {"unit", mi.unit}, {"source", b.source}};
      if (!b.devices.empty()) e["devices"] = b.devices;
      o[mi.key] = e;
    }
    return o;
  };
  json f = json::object();
  for (const auto& [k, v] : p.overrides) f[k] = set(v);
  return {{"path", p.path}, {"name", p.name}, {"baseline", p.baseline}, {"budgets", set(p.defaults)}, {"formats", f}};
}

json to_json(const FormatVerdict& v) {
  return {{"format", v.format},
          {"verdict", to_string(v.overall)},
          {"conformance", to_json(v.conformance)},
          {"fit", to_json(v.fit)},
          {"deciding_line", deciding_line(v)},
          {"notes", v.notes}};
}

}  // namespace kvgate::signoff
