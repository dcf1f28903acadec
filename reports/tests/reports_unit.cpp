// Unit tests of the report layer: the schema checker can say yes and no, the committed fixtures
// validate, the renderers produce every section and plot. No clock, no model.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "catch_compat.hpp"
#include "kvgate/reports.hpp"

using nlohmann::json;
using namespace kvgate::reports;

namespace {
std::string src() {
  const char* s = std::getenv("KVGATE_SOURCE_DIR");
  return s ? s : ".";
}
json fixture(const std::string& name) {
  std::ifstream f(std::filesystem::path(src()) / "reports" / "tests" / "fixtures" / name);
  REQUIRE(f.good());
  return json::parse(f);
}
SchemaSet schemas() { return SchemaSet((std::filesystem::path(src()) / "reports" / "schema").string()); }
}  // namespace

TEST_CASE("every published schema is valid JSON and names itself") {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(src()) / "reports" / "schema")) {
    std::ifstream f(e.path());
    const auto j = json::parse(f);
    CHECK(j.value("$id", "") == e.path().filename().string());
    ++n;
  }
  CHECK(n == 6);
}

TEST_CASE("the committed fixtures validate against their schemas") {
  const auto s = schemas();
  const auto m = fixture("matrix.json");
  CHECK(schema_file_for(m) == "matrix.schema.json");
  const auto e1 = s.validate(m, "matrix.schema.json");
  for (const auto& e : e1) UNSCOPED_INFO(e);
  CHECK(e1.empty());
  const auto g = fixture("gates.json");
  CHECK(schema_file_for(g) == "gate.schema.json");
  CHECK(s.validate(g, "gate.schema.json").empty());
}

TEST_CASE("the schema checker rejects what the schemas forbid") {
  const auto s = schemas();
  auto m = fixture("matrix.json");
  m.erase("rows");
  CHECK_FALSE(s.validate(m, "matrix.schema.json").empty());
  m = fixture("matrix.json");
  m["rows"][0]["status"] = "fine";  // not in the enum
  CHECK_FALSE(s.validate(m, "matrix.schema.json").empty());
  m = fixture("matrix.json");
  m["formats"][0]["top1"] = 1.5;  // > maximum
  CHECK_FALSE(s.validate(m, "matrix.schema.json").empty());
  m = fixture("matrix.json");
  m["provenance"]["cpu_cores"] = "two";  // wrong type, through a cross-file $ref
  const auto e = s.validate(m, "matrix.schema.json");
  REQUIRE_FALSE(e.empty());
  CHECK(e.front().find("/provenance/cpu_cores") != std::string::npos);
  m = fixture("matrix.json");
  m["rows"][0]["provenance"].erase("model_sha256");  // every row carries provenance
  CHECK_FALSE(s.validate(m, "matrix.schema.json").empty());
  auto g = fixture("gates.json");
  g["gates"][0]["status"] = "green";
  CHECK_FALSE(s.validate(g, "gate.schema.json").empty());
  json signoff = {{"schema", "kvgate.signoff/1"}, {"kind", "signoff"}};
  CHECK_FALSE(s.validate(signoff, "signoff.schema.json").empty());
}

TEST_CASE("renderers: index, per-format pages, every plot") {
  ReportInputs in;
  in.matrix = fixture("matrix.json");
  in.gates = fixture("gates.json");
  in.mutants = fixture("outcomes.json");
  const auto specs = plot_specs(in);
  std::vector<std::string> names;
  for (const auto& [n, s] : specs) names.push_back(n);
  CHECK(names == std::vector<std::string>{"decode", "needle", "quality", "bytes", "kills"});
  const std::string idx = index_markdown(in);
  CHECK_THAT(idx, kvgate_catch::contains("[int8](int8.md)"));
  CHECK_THAT(idx, kvgate_catch::contains("stories260K"));
  const std::string fm = format_markdown(in, "int8");
  CHECK_THAT(fm, kvgate_catch::contains("## Against the f32 baseline"));
  CHECK_THAT(fm, kvgate_catch::contains("## Gates"));
  CHECK_THAT(fm, kvgate_catch::contains("STO.bytes.int8"));
  const std::string html = html_page(in, "/nonexistent");  // no bundles: tables only, still a page
  CHECK_THAT(html, kvgate_catch::contains("id=\"plot-kills\""));
  CHECK_THAT(html, kvgate_catch::contains("</html>"));
  CHECK(file_name_for("k=q8_0,v=q4_0") == "k-q8_0_v-q4_0");
}
