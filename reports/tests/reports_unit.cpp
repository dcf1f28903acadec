// Unit tests of the report layer: the schema checker can say yes and no, the committed fixtures
// validate, the renderers produce every section and plot. No clock, no model.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "catch_compat.hpp"
#include "kvgate/matrix.hpp"
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
  CHECK(n == 8);
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

TEST_CASE("the kv-scales schema accepts per-layer and per-head scales and rejects a scale <= 0 or a stray field") {
  const auto s = schemas();
  json doc = json::parse(R"({"schema": "kvgate.kv-scales/1",
                             "layers": [{"k": 0.0625, "v": [0.031, 0.027]}, {"k": [0.07, 0.06], "v": 0.03}]})");
  CHECK(schema_file_for(doc) == "kv-scales.schema.json");
  CHECK(s.validate(doc, "kv-scales.schema.json").empty());
  json neg = doc;
  neg["layers"][0]["v"][1] = -0.5;
  CHECK_FALSE(s.validate(neg, "kv-scales.schema.json").empty());
  json zero = doc;
  zero["layers"][1]["k"][0] = 0;
  CHECK_FALSE(s.validate(zero, "kv-scales.schema.json").empty());
  json stray = doc;
  stray["layers"][0]["q"] = 1.0;
  CHECK_FALSE(s.validate(stray, "kv-scales.schema.json").empty());
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

TEST_CASE("the shipped release policy validates; a sign-off record's first table shows both verdicts and the deciding line") {
  const auto s = schemas();
  std::ifstream pf(std::filesystem::path(src()) / "reports" / "policy" / "default.json");
  REQUIRE(pf.good());
  const json policy = json::parse(pf);
  CHECK(schema_file_for(policy) == "policy.schema.json");
  CHECK(s.validate(policy, "policy.schema.json").empty());
  json bad = policy;
  bad["budgets"]["kl_mean"]["unit"] = "bits";
  CHECK_FALSE(s.validate(bad, "policy.schema.json").empty());
  json bad2 = policy;
  bad2["budgets"]["top1"] = {{"max", 0.9}, {"unit", "fraction"}, {"source", "x"}};
  CHECK_FALSE(s.validate(bad2, "policy.schema.json").empty());

  const json line = {{"metric", "kl_mean"}, {"origin", "budgets.kl_mean"}, {"line", "budgets.kl_mean: kl_mean <= 0.05 nats"},
                     {"direction", "at_most"}, {"bound", 0.05}, {"unit", "nats"}, {"source", "llama.cpp PR #12557"},
                     {"scope", "all"}, {"value", 1.1}, {"noise_floor", 1e-6}, {"status", "over"}, {"reason", "misses"}, {"margin", -21.0}};
  const json stats = {{"positions", 2048}, {"empty", false}, {"kl_mean", 1.1}, {"kl_p99", 8.0}, {"top1", 0.54},
                      {"one_minus_tv", 0.57}, {"ppl_base", 3.0}, {"ppl_format", 10.0}, {"ppl_delta", 2.3}};
  json empty_bucket = {{"positions", 0}, {"empty", true}, {"bucket", "16K+"}};
  json b0 = stats;
  b0["bucket"] = "0-1K";
  json so = {{"schema", "kvgate.signoff/2"}, {"kind", "signoff"}, {"device", "cpu"}, {"quick", true},
             {"provenance", fixture("matrix.json")["provenance"]}, {"baseline", "f16"},
             {"policy", {{"path", "reports/policy/default.json"}, {"baseline", "auto"}, {"budgets", json::object()}, {"formats", json::object()}}},
             {"noise_floor", {{"runs", json::array({{{"name", "f32 vs f16"}, {"quality", {{"all", stats}, {"buckets", {b0}}}}}})},
                              {"worst", {{"kl_mean", 1e-6}}}}},
             {"quality_method", {{"path", "decode path"}, {"corpus", {"c.json"}}, {"sequences", 8}, {"positions", 2048}, {"buckets", {"0-1K", "16K+"}}}},
             {"exit_code", 3}, {"files", json::object()},
             {"verdicts", json::array({{{"format", "q4_0"}, {"verdict", "OVER-BUDGET"},
                                        {"conformance", {{"verdict", "CONFORMS"}, {"reasons", json::array()}}},
                                        {"fit", {{"verdict", "OVER-BUDGET"}, {"reasons", {"misses"}}, {"deciding", 0}, {"lines", {line}}}},
                                        {"deciding_line", "budgets.kl_mean: kl_mean <= 0.05 nats [all]: 1.1 nats (misses)"},
                                        {"reasons", {"misses"}}, {"notes", json::array()},
                                        {"gates", {{"passed", 3}, {"failed", 0}, {"skipped", 0}, {"failing", json::array()}, {"skipped_ids", json::array()}}},
                                        {"mutation", {{"status", "run"}, {"mutants", {"M"}}, {"killed", {"M"}}, {"survived", json::array()}, {"not_run", json::array()}}},
                                        {"matrix", json::object()},
                                        {"quality", {{"all", stats}, {"buckets", {b0, empty_bucket}}}}}})}};
  const auto errs = s.validate(so, "signoff.schema.json");
  for (const auto& e : errs) UNSCOPED_INFO(e);
  CHECK(errs.empty());
  ReportInputs in;
  in.signoff = so;
  const std::string idx = index_markdown(in);
  const auto first = idx.find("| format | verdict | conformance | fit | deciding policy line");
  REQUIRE(first != std::string::npos);
  CHECK(first < idx.find("| format | verdict | gates passed"));
  CHECK(idx.find("**OVER-BUDGET** | CONFORMS | OVER-BUDGET | budgets.kl_mean: kl_mean <= 0.05 nats") != std::string::npos);
  CHECK(idx.find("noise floor") != std::string::npos);
  const std::string page = format_markdown(in, "q4_0");
  CHECK(page.find("## Fit: OVER-BUDGET (conformance: CONFORMS)") != std::string::npos);
  CHECK(page.find("| 16K+ | 0 (empty) |") != std::string::npos);
  CHECK(page.find("llama.cpp PR #12557") != std::string::npos);
  const std::string html = html_page(in, "/nonexistent");
  CHECK(html.find("<th>conformance</th><th>fit</th><th>deciding policy line</th>") != std::string::npos);
  CHECK(html.find("budgets.kl_mean: kl_mean &lt;= 0.05 nats") != std::string::npos);
}

TEST_CASE("matrix rows have one Markdown renderer: matrix.md and the per-format pages print the same cells") {
  const json m = fixture("matrix.json");
  REQUIRE(!m["rows"].empty());
  const json& r0 = m["rows"][0];
  const std::string f = r0.value("format", "");
  // The whole table (bench's matrix.md) holds the renderer's output verbatim.
  const std::string all = kvgate::matrix::rows_markdown(m["rows"]);
  CHECK(kvgate::matrix::matrix_markdown(m).find(all) != std::string::npos);
  // A format page holds the same renderer's rows of that format, without the format column.
  const std::string mine = kvgate::matrix::rows_markdown(
      m["rows"], {{"device", "context", "window", "status", "ttft_cold_ms", "ttft_warm_ms", "prefill_tok_s", "decode_tok_s",
                   "decode_vs_f32"},
                  f});
  kvgate::reports::ReportInputs in;
  in.matrix = m;
  CHECK(kvgate::reports::format_markdown(in, f).find(mine) != std::string::npos);
  // Anti-vacuity: the format filter drops the other formats' rows, and every column has a header.
  std::size_t lines_all = 0, lines_mine = 0;
  for (char c : all) lines_all += c == '\n';
  for (char c : mine) lines_mine += c == '\n';
  std::size_t rows_f = 0;
  for (const auto& r : m["rows"]) rows_f += r.value("format", "") == f;
  CHECK(lines_mine == rows_f + 2);
  CHECK(lines_all == m["rows"].size() + 2);
  for (const auto& c : kvgate::matrix::row_columns()) CHECK(all.find(c.header) != std::string::npos);
  CHECK_THROWS_AS(kvgate::matrix::rows_markdown(m["rows"], {{"no_such_column"}, ""}), std::invalid_argument);
}

// Records may lack optional fields: the renderers read them as absent (an empty or "–" cell). A
// `const json::operator[]` on an absent key reads past the object (the ASan/UBSan job,
// scripts/sanitize.sh, reports it); this case strips every field but the names.
TEST_CASE("renderers: records lacking every optional field still render") {
  ReportInputs in;
  in.matrix = fixture("matrix.json");
  in.gates = fixture("gates.json");
  in.mutants = fixture("outcomes.json");
  REQUIRE(in.matrix.contains("formats"));
  REQUIRE(!in.matrix["formats"].empty());
  for (auto& f : in.matrix["formats"]) {
    const json name = f.at("format");
    f = json::object({{"format", name}});
  }
  in.matrix.erase("provenance");
  for (auto& mu : in.mutants["mutants"]) {
    for (const char* k : {"killedBy", "status", "coveredBy"}) mu.erase(k);
  }
  const std::string f0 = in.matrix["formats"][0]["format"].get<std::string>();
  std::string idx, fm, html;
  REQUIRE_NOTHROW(idx = index_markdown(in));
  REQUIRE_NOTHROW(fm = format_markdown(in, f0));
  REQUIRE_NOTHROW(html = html_page(in, "/nonexistent"));
  REQUIRE_NOTHROW(plot_specs(in));
  CHECK_THAT(idx, kvgate_catch::contains(f0));
  CHECK_THAT(fm, kvgate_catch::contains(f0));
  CHECK_THAT(html, kvgate_catch::contains("</html>"));
}
