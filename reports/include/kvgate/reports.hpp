// Reports (reports/README.md): JSON Schema checks of every record kvgate writes (reports/schema/), Markdown per
// format and an index, and a self-contained offline HTML page with Vega-Lite plots.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvgate::reports {

// --- JSON Schema -----------------------------------------------------------------------------------
// The schemas of one folder, checked with kvgate's one validator (kvgate/json_schema.hpp): $ref may
// be local ("#/$defs/..") or name a file beside the schema ("<file>#/$defs/.."). A keyword the
// validator does not implement is an error, never silently ignored.
class SchemaSet {
 public:
  explicit SchemaSet(std::string dir);  // folder with *.schema.json
  // Every violation as "<json pointer>: <message>"; empty when `doc` validates against `schema_file`.
  std::vector<std::string> validate(const nlohmann::json& doc, const std::string& schema_file) const;
  const std::string& dir() const { return dir_; }

 private:
  const nlohmann::json& load(const std::string& file) const;
  std::string dir_;
  mutable std::map<std::string, nlohmann::json> cache_;
};

// Which schema a record follows: by its "schema" field (kvgate.matrix/1 -> matrix.schema.json, ...),
// a gate summary by its shape; empty when unknown.
std::string schema_file_for(const nlohmann::json& doc);
// The schema folder: $KVGATE_SCHEMA_DIR, else <source>/reports/schema.
std::string default_schema_dir();
std::string default_web_dir();  // <source>/reports/web (node_modules with the Vega bundles)

// --- renderers -------------------------------------------------------------------------------------
struct ReportInputs {
  nlohmann::json matrix;    // matrix.json (or null)
  nlohmann::json gates;     // gates.json (or null)
  nlohmann::json mutants;   // mutations' outcomes.json (or null)
  nlohmann::json signoff;   // signoff.json (or null)
  std::string title = "kvgate report";
};

std::string format_markdown(const ReportInputs& in, const std::string& format);
std::string index_markdown(const ReportInputs& in);
// The HTML page; Vega bundles inlined from `web_dir`/node_modules. When they are missing the page
// still renders its tables and says how to vendor the plots (`warning` says so too).
std::string html_page(const ReportInputs& in, const std::string& web_dir, std::string* warning = nullptr);
// Vega-Lite specs of the page (exposed for tests): name -> spec.
std::vector<std::pair<std::string, nlohmann::json>> plot_specs(const ReportInputs& in);

// Writes index.md, <format>.md per format and report.html into out_dir; returns the paths.
std::vector<std::string> write_report(const ReportInputs& in, const std::string& out_dir, const std::string& web_dir,
                                      std::string* warning = nullptr);
// A file-system-safe name for a format ("k=q8_0,v=q4_0" -> "k-q8_0_v-q4_0").
std::string file_name_for(const std::string& format);

}  // namespace kvgate::reports
