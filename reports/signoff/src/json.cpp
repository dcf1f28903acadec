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

records::VerdictLineRecord to_record(const LineResult& l) {
  const MetricInfo& mi = info(l.budget.budget.metric);
  records::VerdictLineRecord r;
  r.metric = mi.key;
  r.origin = l.budget.origin;
  r.line = describe(l.budget);
  r.direction = mi.direction == Direction::at_most ? "at_most" : "at_least";
  if (!l.budget.budget.disabled) r.bound = l.budget.budget.bound;
  r.unit = mi.unit;
  r.source = l.budget.budget.source;
  r.scope = l.scope;
  r.value = l.value;
  r.noise_floor = l.noise;
  r.status = to_string(l.status);
  r.reason = l.reason;
  if (l.value) r.margin = l.margin;
  return r;
}

records::ConformanceRecord to_record(const ConformanceVerdict& c) { return {to_string(c.verdict), c.reasons}; }

records::FitRecord to_record(const FitVerdict& f) {
  records::FitRecord r{to_string(f.verdict), f.reasons, f.deciding, {}};
  for (const auto& l : f.lines) r.lines.push_back(to_record(l));
  return r;
}

records::GateCountsRecord to_record(const GateCounts& g) { return {g.passed, g.failed, g.skipped, g.failing, g.skipped_ids}; }

records::MutationProofRecord to_record(const MutationOutcome& m) {
  records::MutationProofRecord r{m.status, m.mutants, m.killed, m.survived, m.not_run};
  for (const auto& x : m.missing) r.not_run.push_back(x);
  for (const auto& x : m.undecided) r.not_run.push_back(x.substr(0, x.find(' ')));
  return r;
}

records::FormatVerdictRecord to_record(const FormatVerdict& v) {
  records::FormatVerdictRecord r;
  r.format = v.format;
  r.verdict = to_string(v.overall);
  r.conformance = to_record(v.conformance);
  r.fit = to_record(v.fit);
  r.deciding_line = deciding_line(v);
  r.reasons = v.conformance.reasons;
  r.reasons.insert(r.reasons.end(), v.fit.reasons.begin(), v.fit.reasons.end());
  r.notes = v.notes;
  return r;
}

json to_json(const LineResult& l) { return records::to_json(to_record(l)); }
json to_json(const ConformanceVerdict& c) { return records::to_json(to_record(c)); }
json to_json(const FitVerdict& f) { return records::to_json(to_record(f)); }
json to_json(const GateCounts& g) { return records::to_json(to_record(g)); }
json to_json(const MutationOutcome& m) { return records::to_json(to_record(m)); }

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

json to_json(const FormatVerdict& v) { return records::to_json(to_record(v)); }

}  // namespace kvgate::signoff
