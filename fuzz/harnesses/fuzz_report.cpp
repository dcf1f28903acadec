// libFuzzer harness: report records (matrix.json, gates.json, outcomes.json, signoff.json): the
// schema check of reports/schema/, then every renderer (Markdown per format, the index, the HTML
// page and its plot specs) on the record, valid or not.
#include <exception>

#include "fuzz_common.hpp"
#include "kvgate/json_limits.hpp"
#include "kvgate/format.hpp"
#include "kvgate/reports.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const kvgate::reports::SchemaSet schemas(kvgate::fuzz::source_file("reports/schema").string());
  nlohmann::json doc;
  try {
    doc = kvgate::limits::parse_json(kvgate::fuzz::as_text(data, size), "fuzz-report.json");
  } catch (const std::exception&) {
    return 0;
  }
  try {
    const std::string sf = kvgate::reports::schema_file_for(doc);
    if (!sf.empty()) (void)schemas.validate(doc, sf);
  } catch (const std::exception&) {
  }
  kvgate::reports::ReportInputs in;
  const std::string schema = doc.is_object() ? doc.value("schema", std::string()) : std::string();
  if (schema == "kvgate.signoff/2") in.signoff = doc;
  else if (doc.is_object() && doc.contains("mutants")) in.mutants = doc;
  else if (doc.is_object() && doc.contains("totals")) in.gates = doc;
  else in.matrix = doc;
  try {
    (void)kvgate::reports::index_markdown(in);
    for (const auto& pr : kvgate::presets()) (void)kvgate::reports::format_markdown(in, std::string(pr.name));
    (void)kvgate::reports::plot_specs(in);
    std::string warning;
    (void)kvgate::reports::html_page(in, "/nonexistent-web-dir", &warning);
  } catch (const std::exception&) {
  }
  return 0;
}
