// A small JSON Schema checker for the keywords reports/schema/*.schema.json use.
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "kvgate/reports.hpp"

#ifndef KVGATE_SOURCE_DIR_DEFAULT
#define KVGATE_SOURCE_DIR_DEFAULT "."
#endif

namespace kvgate::reports {

namespace {
bool type_is(const nlohmann::json& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<long long>(v.get<double>())));
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  return false;
}
std::string esc(const std::string& k) {
  std::string o;
  for (char c : k) o += c == '/' ? std::string("~1") : c == '~' ? std::string("~0") : std::string(1, c);
  return o;
}
}  // namespace

SchemaSet::SchemaSet(std::string dir) : dir_(std::move(dir)) {}

const nlohmann::json& SchemaSet::load(const std::string& file) const {
  for (const auto& [f, j] : cache_)
    if (f == file) return j;
  const auto path = std::filesystem::path(dir_) / file;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("schema '" + path.string() + "' not found");
  cache_.emplace_back(file, nlohmann::json::parse(in));
  return cache_.back().second;
}

std::vector<std::string> SchemaSet::validate(const nlohmann::json& doc, const std::string& schema_file) const {
  std::vector<std::string> errors;
  const nlohmann::json schema = load(schema_file);  // copy: cache_ may grow while checking
  check(doc, schema, schema_file, "", errors, 0);
  return errors;
}

void SchemaSet::check(const nlohmann::json& v, const nlohmann::json& s, const std::string& file, const std::string& ptr,
                      std::vector<std::string>& errors, int depth) const {
  const std::string at = ptr.empty() ? "/" : ptr;
  if (depth > 64) {
    errors.push_back(at + ": schema recursion too deep");
    return;
  }
  if (s.is_boolean()) {
    if (!s.get<bool>()) errors.push_back(at + ": no value allowed here");
    return;
  }
  if (!s.is_object()) return;
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"].get<std::string>();
    const auto hash = ref.find('#');
    const std::string target_file = hash == 0 ? file : ref.substr(0, hash);
    const std::string pointer = hash == std::string::npos ? "" : ref.substr(hash + 1);
    const nlohmann::json target_doc = load(target_file);
    const nlohmann::json target = pointer.empty() ? target_doc : target_doc.at(nlohmann::json::json_pointer(pointer));
    check(v, target, target_file, ptr, errors, depth + 1);
  }
  if (s.contains("type")) {
    bool ok = false;
    std::string names;
    if (s["type"].is_string()) {
      ok = type_is(v, s["type"].get<std::string>());
      names = s["type"].get<std::string>();
    } else {
      for (const auto& t : s["type"]) {
        ok = ok || type_is(v, t.get<std::string>());
        names += (names.empty() ? "" : "|") + t.get<std::string>();
      }
    }
    if (!ok) {
      errors.push_back(at + ": expected " + names + ", got " + v.type_name());
      return;
    }
  }
  if (s.contains("const") && v != s["const"]) errors.push_back(at + ": must be " + s["const"].dump());
  if (s.contains("enum")) {
    bool ok = false;
    for (const auto& e : s["enum"]) ok = ok || e == v;
    if (!ok) errors.push_back(at + ": " + v.dump() + " is not one of " + s["enum"].dump());
  }
  if (v.is_number()) {
    if (s.contains("minimum") && v.get<double>() < s["minimum"].get<double>())
      errors.push_back(at + ": " + v.dump() + " < minimum " + s["minimum"].dump());
    if (s.contains("maximum") && v.get<double>() > s["maximum"].get<double>())
      errors.push_back(at + ": " + v.dump() + " > maximum " + s["maximum"].dump());
  }
  if (s.contains("anyOf")) {
    bool any = false;
    for (const auto& alt : s["anyOf"]) {
      std::vector<std::string> e;
      check(v, alt, file, ptr, e, depth + 1);
      any = any || e.empty();
    }
    if (!any) errors.push_back(at + ": matches none of anyOf");
  }
  if (v.is_object()) {
    if (s.contains("required"))
      for (const auto& r : s["required"])
        if (!v.contains(r.get<std::string>())) errors.push_back(at + ": missing required '" + r.get<std::string>() + "'");
    const nlohmann::json props = s.value("properties", nlohmann::json::object());
    for (const auto& [k, val] : v.items()) {
      if (props.contains(k)) check(val, props[k], file, ptr + "/" + esc(k), errors, depth + 1);
      else if (s.contains("additionalProperties")) check(val, s["additionalProperties"], file, ptr + "/" + esc(k), errors, depth + 1);
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<std::size_t>())
      errors.push_back(at + ": fewer than " + s["minItems"].dump() + " items");
    if (s.contains("items"))
      for (std::size_t i = 0; i < v.size(); ++i) check(v[i], s["items"], file, ptr + "/" + std::to_string(i), errors, depth + 1);
  }
}

std::string schema_file_for(const nlohmann::json& doc) {
  if (!doc.is_object()) return {};
  const std::string s = doc.value("schema", "");
  if (s == "kvgate.matrix/1") return "matrix.schema.json";
  if (s == "kvgate.run/1") return "run.schema.json";
  if (s == "kvgate.signoff/2") return "signoff.schema.json";
  if (s == "kvgate.policy/1") return "policy.schema.json";
  if (s == "kvgate.field-report/1") return "field-report.schema.json";
  if (doc.contains("totals") && doc.contains("per_format") && doc.contains("gates")) return "gate.schema.json";
  return {};
}

std::string default_schema_dir() {
  if (const char* d = std::getenv("KVGATE_SCHEMA_DIR"); d && *d) return d;
  return (std::filesystem::path(KVGATE_SOURCE_DIR_DEFAULT) / "reports" / "schema").string();
}

std::string default_web_dir() {
  if (const char* d = std::getenv("KVGATE_WEB_DIR"); d && *d) return d;
  return (std::filesystem::path(KVGATE_SOURCE_DIR_DEFAULT) / "reports" / "web").string();
}

}  // namespace kvgate::reports
