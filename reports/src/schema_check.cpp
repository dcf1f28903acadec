// The record schemas (reports/schema/) checked with kvgate's one JSON Schema validator
// (reports/json_schema), and where the schemas and the web bundles live.
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "kvgate/build_paths.hpp"
#include "kvgate/json_schema.hpp"
#include "kvgate/reports.hpp"

#ifndef KVGATE_SOURCE_DIR_DEFAULT
#define KVGATE_SOURCE_DIR_DEFAULT "."
#endif

namespace kvgate::reports {

SchemaSet::SchemaSet(std::string dir) : dir_(std::move(dir)) {}

const nlohmann::json& SchemaSet::load(const std::string& file) const {
  if (auto it = cache_.find(file); it != cache_.end()) return it->second;
  const auto path = std::filesystem::path(dir_) / file;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("schema '" + path.string() + "' not found");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("schema '" + path.string() + "' is not valid JSON: " + e.what());
  }
  return cache_.emplace(file, std::move(doc)).first->second;  // std::map: references stay valid
}

std::vector<std::string> SchemaSet::validate(const nlohmann::json& doc, const std::string& schema_file) const {
  const auto errs = json_schema::validate_json(doc, load(schema_file),
                                               [this](const std::string& f) -> const nlohmann::json& { return load(f); });
  std::vector<std::string> out;
  for (const auto& e : errs) out.push_back((e.instance_path.empty() ? "/" : e.instance_path) + ": " + e.message);
  return out;
}

std::string schema_file_for(const nlohmann::json& doc) {
  if (!doc.is_object()) return {};
  const std::string s = doc.value("schema", "");
  if (s == "kvgate.matrix/1") return "matrix.schema.json";
  if (s == "kvgate.run/1") return "run.schema.json";
  if (s == "kvgate.signoff/2") return "signoff.schema.json";
  if (s == "kvgate.policy/1") return "policy.schema.json";
  if (s == "kvgate.field-report/1") return "field-report.schema.json";
  if (s == "kvgate.kv-scales/1") return "kv-scales.schema.json";
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
