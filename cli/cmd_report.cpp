// `kvgate report`: renders Markdown (index + one page per format) and the offline HTML page from
// the JSON records (matrix.json, gates.json, outcomes.json, signoff.json); `--validate` checks
// records against the published schemas (reports/schema/).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "commands.hpp"
#include "kvgate/json_limits.hpp"
#include "kvgate/reports.hpp"

namespace kvgate::cli {

namespace {

struct ReportOpts {
  std::string matrix, gates, mutants, signoff, out = "kvgate.out/report", title = "kvgate report", schema_dir, web_dir;
  std::vector<std::string> validate;
};

nlohmann::json read_json(const std::string& path) {
  if (path.empty()) return nullptr;
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "outcomes.json";
  std::ifstream f(p);
  if (!f) throw std::runtime_error("cannot read '" + p.string() + "'");
  try {
    nlohmann::json doc = limits::parse_json(f, p.string());
    limits::check_records(doc, p.string());  // before a renderer walks the records
    return doc;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("'" + p.string() + "': not valid JSON (" + e.what() + ")");
  }
}

int run_report(const ReportOpts& o) {
  if (!o.validate.empty()) {
    reports::SchemaSet schemas(o.schema_dir.empty() ? reports::default_schema_dir() : o.schema_dir);
    int bad = 0;
    for (const auto& path : o.validate) {
      const auto doc = read_json(path);
      const std::string schema = reports::schema_file_for(doc);
      if (schema.empty()) {
        std::printf("UNKNOWN %s: no kvgate schema field\n", path.c_str());
        ++bad;
        continue;
      }
      const auto errors = schemas.validate(doc, schema);
      std::printf("%s %s (%s)\n", errors.empty() ? "VALID  " : "INVALID", path.c_str(), schema.c_str());
      for (std::size_t i = 0; i < errors.size() && i < 20; ++i) std::printf("  %s\n", errors[i].c_str());
      bad += !errors.empty();
    }
    return bad ? 1 : 0;
  }
  reports::ReportInputs in;
  in.matrix = read_json(o.matrix);
  in.gates = read_json(o.gates);
  in.mutants = read_json(o.mutants);
  in.signoff = read_json(o.signoff);
  in.title = o.title;
  if (in.matrix.is_null() && in.signoff.is_null() && in.gates.is_null())
    throw std::invalid_argument("nothing to render: give --matrix, --gates and/or --signoff");
  std::string warning;
  const auto files = reports::write_report(in, o.out, o.web_dir.empty() ? reports::default_web_dir() : o.web_dir, &warning);
  if (!warning.empty()) std::fprintf(stderr, "kvgate report: %s\n", warning.c_str());
  for (const auto& f : files) std::printf("wrote %s\n", f.c_str());
  return 0;
}

}  // namespace

void register_report(CLI::App& app) {
  auto o = std::make_shared<ReportOpts>();
  auto* sub = app.add_subcommand("report", "Render Markdown + offline HTML from kvgate records, or --validate them against reports/schema");
  sub->add_option("--matrix", o->matrix, "matrix.json from kvgate bench");
  sub->add_option("--gates", o->gates, "gates.json from kvgate gate --json");
  sub->add_option("--mutants", o->mutants, "outcomes.json (or its folder) from kvgate mutate");
  sub->add_option("--signoff", o->signoff, "signoff.json from kvgate signoff");
  sub->add_option("--title", o->title, "page title")->capture_default_str();
  sub->add_option("--out", o->out, "output folder")->capture_default_str();
  sub->add_option("--web-dir", o->web_dir, "folder whose node_modules hold vega, vega-lite, vega-embed (default reports/web)");
  sub->add_option("--schema-dir", o->schema_dir, "schema folder (default reports/schema)");
  sub->add_option("--validate", o->validate, "validate these JSON records (exit 1 on any violation)");
  on_run(sub, [o] { return run_report(*o); });
}

}  // namespace kvgate::cli
