// Outputs of a mutation run (docs/MUTATIONS.md "Outputs"): outcomes.json, kill_matrix.csv,
// kill_matrix.md, mutation-report.json (Stryker mutation-testing-report-schema v2) and index.html.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "kvgate/outcomes.hpp"
#include "kvgate_mutations/catalog.hpp"
#include "kvgate_mutations/driver.hpp"

namespace kvgate::mutate {

struct ReportContext {
  std::filesystem::path source_dir;  // the user's tree (shown in reports)
  std::filesystem::path files_root;  // where the unmutated files are read from (the scratch copy)
  std::filesystem::path out_dir;
  std::string catalog_path;
  MutateOptions opts;
};

// outcomes.json as its typed record (kvgate/outcomes.hpp), and as the document the file holds:
// checked against mutations/schema/outcomes.schema.json before it is returned (a record that breaks
// it is a driver bug: std::logic_error naming the field).
records::OutcomesRecord outcomes_record(const RunResult& r, const ReportContext& ctx);
nlohmann::json outcomes_json(const RunResult& r, const ReportContext& ctx);
std::string kill_matrix_csv(const RunResult& r);
std::string kill_matrix_md(const RunResult& r);
nlohmann::json stryker_report(const RunResult& r, const ReportContext& ctx);
// index.html embedding the report; `script` is the file name of the vendored web component
// next to it, or empty to load it from unpkg (prints how to vendor it).
std::string report_html(const nlohmann::json& stryker, const std::string& script);

// Writes every output into ctx.out_dir. Returns the names of the files written.
std::vector<std::string> write_reports(const RunResult& r, const ReportContext& ctx, std::ostream& log);

// One-line status letter per gate cell of the kill matrix.
char matrix_cell(GateStatus s);

}  // namespace kvgate::mutate
