// The release policy file (reports/policy/*.json, schema reports/schema/policy.schema.json) and the
// baseline rule. Every refusal names the file, the field and the fix.
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "kvgate/json_limits.hpp"
#include "kvgate/format.hpp"
#include "kvgate/signoff.hpp"

namespace kvgate::signoff {

namespace {

using json = nlohmann::json;

constexpr const char* kPolicySchema = "kvgate.policy/1";

[[noreturn]] void refuse(const std::string& path, const std::string& field, const std::string& problem,
                         const std::string& fix) {
  throw PolicyError("policy " + path + ": field '" + field + "': " + problem + "; fix: " + fix);
}

std::string known_metrics() {
  std::string s;
  for (const auto& m : metrics()) s += (s.empty() ? "" : ", ") + std::string(m.key);
  return s;
}

std::string fmt_num(double x) {
  std::ostringstream o;
  o << x;
  return o.str();
}

Budget parse_budget(const json& j, Metric metric, const std::string& path, const std::string& field) {
  const MetricInfo& mi = info(metric);
  Budget b;
  b.metric = metric;
  if (!j.is_object())
    refuse(path, field, "is " + std::string(j.type_name()) + ", not an object",
           std::string("write {\"") + mi.bound_key + "\": <number>, \"unit\": \"" + mi.unit + "\", \"source\": \"...\"}");
  if (j.contains("not_budgeted")) {
    if (!j["not_budgeted"].is_string() || j["not_budgeted"].get<std::string>().empty())
      refuse(path, field + ".not_budgeted", "must be a non-empty string", "say why this metric is not budgeted here");
    for (const auto& [k, v] : j.items())
      if (k != "not_budgeted")
        refuse(path, field + "." + k, "a budget that is not_budgeted has no other field", "remove '" + k + "'");
    b.disabled = true;
    b.source = j["not_budgeted"].get<std::string>();
    return b;
  }
  const std::string other = mi.direction == Direction::at_most ? "min" : "max";
  for (const auto& [k, v] : j.items()) {
    if (k == mi.bound_key || k == "unit" || k == "source" || k == "devices") continue;
    if (k == other)
      refuse(path, field + "." + k, std::string(mi.key) + " is compared the other way: the value must be " +
                                        (mi.direction == Direction::at_most ? "at most" : "at least") + " its bound",
             std::string("write \"") + mi.bound_key + "\" instead of \"" + other + "\"");
    refuse(path, field + "." + k, "unknown field",
           std::string("use only \"") + mi.bound_key + "\", \"unit\", \"source\", \"devices\" (or \"not_budgeted\")");
  }
  if (!j.contains(mi.bound_key) || !j[mi.bound_key].is_number())
    refuse(path, field + "." + mi.bound_key, "missing or not a number",
           std::string("give the bound as a number in ") + mi.unit);
  b.bound = j[mi.bound_key].get<double>();
  if (!std::isfinite(b.bound) || b.bound < mi.lo || b.bound > mi.hi)
    refuse(path, field + "." + mi.bound_key,
           fmt_num(b.bound) + " is outside [" + fmt_num(mi.lo) + ", " + fmt_num(mi.hi) + "] " + mi.unit +
               " (wrong sign or unit?)",
           std::string("give ") + mi.what + " in " + mi.unit + " within that range");
  if (!j.contains("unit") || !j["unit"].is_string())
    refuse(path, field + ".unit", "missing", std::string("add \"unit\": \"") + mi.unit + "\"");
  if (j["unit"].get<std::string>() != mi.unit)
    refuse(path, field + ".unit",
           "'" + j["unit"].get<std::string>() + "' is not the unit of " + mi.key + " (" + mi.unit + ")",
           std::string("convert the bound to ") + mi.unit + " and write \"unit\": \"" + mi.unit + "\"");
  if (!j.contains("source") || !j["source"].is_string() || j["source"].get<std::string>().empty())
    refuse(path, field + ".source", "missing", "say where the number comes from (a publication, or 'project choice: why')");
  b.source = j["source"].get<std::string>();
  if (j.contains("devices")) {
    if (!j["devices"].is_array() || j["devices"].empty())
      refuse(path, field + ".devices", "must be a non-empty array", "write e.g. [\"cuda\"], or drop the field for every device");
    for (const auto& d : j["devices"]) {
      if (!d.is_string() || (d != "cpu" && d != "cuda"))
        refuse(path, field + ".devices", "'" + d.dump() + "' is not a device", "use \"cpu\" and/or \"cuda\"");
      b.devices.push_back(d.get<std::string>());
    }
  }
  return b;
}

std::vector<Budget> parse_budget_set(const json& j, const std::string& path, const std::string& field, bool all_required) {
  if (!j.is_object()) refuse(path, field, "is not an object", "write {\"<metric>\": {...}, ...}");
  std::vector<Budget> out;
  std::set<Metric> seen;
  for (const auto& [k, v] : j.items()) {
    const auto m = parse_metric(k);
    if (!m) refuse(path, field + "." + k, "unknown metric", "use one of: " + known_metrics());
    out.push_back(parse_budget(v, *m, path, field + "." + k));
    seen.insert(*m);
  }
  if (all_required)
    for (const auto& mi : metrics())
      if (!seen.count(mi.metric))
        refuse(path, field + "." + mi.key, "missing: a policy budgets every metric",
               std::string("add it, or {\"not_budgeted\": \"why\"}"));
  return out;
}

}  // namespace

const std::vector<MetricInfo>& metrics() {
  static const std::vector<MetricInfo> m = {
      {Metric::kl_mean, "kl_mean", "nats", Direction::at_most, "max", 0, 100, true,
       "mean KL(baseline || format) of the next-token distribution"},
      {Metric::kl_p99, "kl_p99", "nats", Direction::at_most, "max", 0, 100, true, "99th percentile of the per-position KL"},
      {Metric::top1, "top1", "fraction", Direction::at_least, "min", 0, 1, true,
       "top-1 agreement with the baseline (0..1)"},
      {Metric::one_minus_tv, "one_minus_tv", "fraction", Direction::at_least, "min", 0, 1, true,
       "mean 1 - total variation (0..1): the expected speculative-decoding acceptance"},
      {Metric::ppl_delta, "ppl_delta", "fraction", Direction::at_most, "max", 0, 10, true,
       "relative perplexity increase, ppl(format) / ppl(baseline) - 1"},
      {Metric::probe_parity, "probe_parity", "cases", Direction::at_most, "max", 0, 1e9, false,
       "probe cases the baseline passes and the format fails"},
      {Metric::kv_saving, "kv_saving", "fraction", Direction::at_least, "min", -10, 1, false,
       "KV bytes saved against the baseline, 1 - bytes(format) / bytes(baseline)"},
      {Metric::decode_speedup, "decode_speedup", "ratio", Direction::at_least, "min", 1e-6, 1e6, false,
       "decode tok/s of the format over the baseline's on the device"},
  };
  return m;
}

const MetricInfo& info(Metric m) {
  for (const auto& x : metrics())
    if (x.metric == m) return x;
  throw std::logic_error("signoff: metric without info");
}

std::optional<Metric> parse_metric(const std::string& key) {
  for (const auto& x : metrics())
    if (key == x.key) return x.metric;
  return std::nullopt;
}

Policy parse_policy(const json& doc, const std::string& path) {
  if (!doc.is_object()) refuse(path, "(top level)", "is not a JSON object", "start from reports/policy/default.json");
  static const std::set<std::string> known = {"$schema", "schema", "name", "description", "baseline", "budgets", "formats"};
  for (const auto& [k, v] : doc.items())
    if (!known.count(k))
      refuse(path, k, "not a policy field", "use only schema, name, description, baseline, budgets, formats");
  if (!doc.contains("schema") || doc["schema"] != kPolicySchema)
    refuse(path, "schema", "missing or not \"" + std::string(kPolicySchema) + "\"",
           "write \"schema\": \"" + std::string(kPolicySchema) + "\"");
  Policy p;
  p.path = path;
  p.name = doc.value("name", "");
  p.description = doc.value("description", "");
  if (doc.contains("baseline")) {
    if (!doc["baseline"].is_string()) refuse(path, "baseline", "is not a string", "write \"auto\", \"f16\", \"bf16\" or \"f32\"");
    p.baseline = doc["baseline"].get<std::string>();
    if (p.baseline != "auto") {
      try {
        p.baseline = resolve_baseline(p.baseline, "auto", "cpu");
      } catch (const PolicyError& e) {
        refuse(path, "baseline", e.what(), "write \"auto\", \"f16\", \"bf16\" or \"f32\"");
      }
    }
  }
  if (!doc.contains("budgets")) refuse(path, "budgets", "missing", "add a budget for every metric: " + known_metrics());
  p.defaults = parse_budget_set(doc["budgets"], path, "budgets", true);
  if (doc.contains("formats")) {
    if (!doc["formats"].is_object()) refuse(path, "formats", "is not an object", "write {\"<format>\": {\"<metric>\": {...}}}");
    for (const auto& [f, set] : doc["formats"].items()) {
      const auto k = parse_kv_format(f);
      if (!k) refuse(path, "formats." + f, "unknown format", "use a preset or k=<half>,v=<half>: " + known_formats_text());
      p.overrides[k->name()] = parse_budget_set(set, path, "formats." + f, false);
    }
  }
  return p;
}

Policy load_policy_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw PolicyError("policy " + path + ": cannot be read; fix: give --policy an existing file (reports/policy/default.json)");
  json doc;
  try {
    doc = limits::parse_json(f, "policy " + path);
  } catch (const std::exception& e) {
    throw PolicyError("policy " + path + ": not valid JSON (" + e.what() + "); fix: start from reports/policy/default.json");
  }
  return parse_policy(doc, path);
}

std::vector<EffectiveBudget> budgets_for(const Policy& p, const std::string& format) {
  std::vector<EffectiveBudget> out;
  const auto k = parse_kv_format(format);
  const std::string name = k ? k->name() : format;
  const auto ov = p.overrides.find(name);
  for (const auto& d : p.defaults) {
    EffectiveBudget e{d, "budgets." + std::string(info(d.metric).key)};
    if (ov != p.overrides.end())
      for (const auto& o : ov->second)
        if (o.metric == d.metric) e = {o, "formats." + name + "." + info(o.metric).key};
    out.push_back(e);
  }
  return out;
}

std::string describe(const EffectiveBudget& b) {
  const MetricInfo& mi = info(b.budget.metric);
  if (b.budget.disabled) return b.origin + ": not budgeted (" + b.budget.source + ")";
  std::string s = b.origin + ": " + mi.key + (mi.direction == Direction::at_most ? " <= " : " >= ") + fmt_num(b.budget.bound) +
                  " " + mi.unit;
  if (!b.budget.devices.empty()) {
    s += " on ";
    for (std::size_t i = 0; i < b.budget.devices.size(); ++i) s += (i ? "," : "") + b.budget.devices[i];
  }
  return s;
}

std::string resolve_baseline(const std::string& flag, const std::string& policy_baseline, const std::string& device) {
  std::string b = !flag.empty() ? flag : (!policy_baseline.empty() && policy_baseline != "auto") ? policy_baseline : "";
  if (b.empty() || b == "auto") return device == "cuda" ? "bf16" : "f16";
  bool preset = false;
  for (const auto& p : presets()) preset = preset || p.name == b;
  if (!preset)
    throw PolicyError("baseline '" + b + "' is not a preset (known: " + known_formats_text() +
                      "); fix: --baseline f16, bf16 or f32");
  if (b != "f16" && b != "bf16" && b != "f32")
    throw PolicyError("baseline '" + b + "' is a quantized format, not a float KV a user's engine would run; fix: --baseline f16, bf16 or f32");
  return b;
}

}  // namespace kvgate::signoff
