// RPT gates: the report layer the sign-off publishes (reports/: the Markdown index, the HTML gate
// table, the JSON Schema checker every record passes). The class they close: a report that renders
// a number or a verdict other than the record's (columns swapped, a ratio inverted, a fraction
// printed as a percentage, a streamed row taken for a resident one, a mixed gate family shown as
// PASS, a schema bound moved by one). Each fixture is written by hand with distinct values in every
// column, so a swap or a wrong pick changes the text; the expected text is derived beside each row.
//
// Bounds: rendered text is compared exactly (the renderers print with fixed printf formats:
// "%.3f" ratios, "%.0f%%" percentages, "%.2f" decode ratios); every fixture value is chosen so
// that the exact decimal is representable or rounds away from a tie.
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/format.hpp"
#include "kvgate/json_schema.hpp"
#include "kvgate/reports.hpp"

using nlohmann::json;
using namespace kvgate::reports;

#define RPT_TAGS "[gate:RPT][fmt:f32][fmt:f16][fmt:bf16][fmt:int8][fmt:fp8][fmt:fp8_e5m2][fmt:q8_0][fmt:q4_0][fmt:k8v4]"

namespace {

std::vector<std::string> split_cells(const std::string& line) {
  std::vector<std::string> cells;
  // "| a | b | c |" -> {"a", "b", "c"}
  std::size_t i = 0;
  while (i < line.size()) {
    const std::size_t j = line.find(" | ", i);
    if (j == std::string::npos) break;
    cells.push_back(line.substr(i, j - i));
    i = j + 3;
  }
  if (i < line.size()) cells.push_back(line.substr(i, line.size() - i - (line.back() == '|' ? 2 : 0)));
  if (!cells.empty() && cells.front().rfind("| ", 0) == 0) cells.front() = cells.front().substr(2);
  return cells;
}

std::string row_of(const std::string& md, const std::string& prefix) {
  std::istringstream in(md);
  std::string line, found;
  int n = 0;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) found = line, ++n;
  INFO("rows starting with '" << prefix << "': " << n);
  REQUIRE(n == 1);
  return found;
}

ReportInputs fixture() {
  ReportInputs in;
  // Two formats, every count distinct so that a column swap shows.
  // (provenance: the renderers read it from every record they are given, as the CLI always writes it)
  in.signoff = json{{"provenance", {{"kvgate_version", "test"}}},
                    {"verdicts",
                     json::array({json{{"format", "int8"},
                                       {"verdict", "FAIL"},
                                       {"gates", {{"passed", 7}, {"failed", 2}, {"skipped", 1}}},
                                       {"mutation", {{"killed", {"a", "b", "c"}}, {"survived", {"d"}}, {"not_run", json::array()}}},
                                       {"reasons", {"failing gates: ENV.int8"}}},
                                  json{{"format", "f32"},
                                       {"verdict", "PASS"},
                                       {"gates", {{"passed", 11}, {"failed", 0}, {"skipped", 3}}},
                                       {"mutation", {{"killed", {"a"}}, {"survived", json::array()}, {"not_run", json::array()}}},
                                       {"reasons", json::array()}}})}};
  in.matrix = json{{"provenance", {{"kvgate_version", "test"}}},
                   {"formats", json::array({json{{"format", "f32"}, {"kv_bytes_per_token", 256}, {"kl_mean", 0}, {"top1", 1.0}},
                                            json{{"format", "int8"}, {"kv_bytes_per_token", 64}, {"kl_mean", 0.0123}, {"top1", 0.97}}})},
                   {"rows", json::array({
                                // resident rows at 512 and 1024 tokens, and a streamed (window 256) row at 4096:
                                // the index shows the resident row with the largest context (1024 -> 0.80).
                                json{{"format", "int8"}, {"window", 0}, {"status", "ok"}, {"context", 512}, {"decode_vs_f32", 0.9}},
                                json{{"format", "int8"}, {"window", 0}, {"status", "ok"}, {"context", 1024}, {"decode_vs_f32", 0.8}},
                                json{{"format", "int8"}, {"window", 256}, {"status", "ok"}, {"context", 4096}, {"decode_vs_f32", 0.3}},
                            })}};
  return in;
}

// The fixtures name real presets of the runtime's format table (the reports render the formats the
// runtime ships; this also links the format table, so the mutation driver's canary reaches the gate).
void require_presets(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    INFO("fixture format " << n);
    REQUIRE(kvgate::parse_kv_format(n).has_value());
  }
}

}  // namespace

TEST_CASE("RPT.index.columns every index column shows its own record value", RPT_TAGS) {
  require_presets({"int8", "f32"});
  const std::string md = index_markdown(fixture());
  INFO(md);
  const auto c = split_cells(row_of(md, "| [int8]("));
  REQUIRE(c.size() == 10);
  CHECK(c[1] == "**FAIL**");
  CHECK(c[2] == "7/2/1");  // gates passed/failed/skipped, in the header's order
  CHECK(c[3] == "3/1/0");  // mutants killed/survived/not run
  CHECK(c[4] == "64");
  CHECK(c[5] == "0.250");  // B/token vs f32 = 64 / 256 (format over f32: < 1 for a smaller format)
  CHECK(c[6] == "0.0123");
  CHECK(c[7] == "97%");    // top-1 0.97 as a percentage
  CHECK(c[8] == "0.80");   // decode vs f32 at the largest resident context (1024), not the streamed 4096 row
  CHECK(c[9] == "failing gates: ENV.int8");
  const auto f = split_cells(row_of(md, "| [f32]("));
  REQUIRE(f.size() == 10);
  CHECK(f[2] == "11/0/3");
  CHECK(f[5] == "1.000");
  CHECK(f[7] == "100%");
  // Anti-vacuity: the header states the order the cells are checked in.
  CHECK(md.find("| format | verdict | gates passed/failed/skipped | mutants killed/survived/not run | B/token | vs f32 |") !=
        std::string::npos);
}

TEST_CASE("RPT.provenance.no_git the reports render a provenance whose commit and dirty flag are null", RPT_TAGS) {
  // A kvgate run outside a git work tree records git_commit and git_dirty as null; the renderers read
  // git_dirty as a bool and `kvgate signoff` / `kvgate report` died with a bare JSON type error.
  // Bound: exact text. Anti-vacuity: the same record with a commit renders it, dirty or not.
  ReportInputs in = fixture();
  in.signoff["provenance"] = json{{"kvgate_version", "test"}, {"git_commit", nullptr}, {"git_dirty", nullptr}};
  std::string md;
  REQUIRE_NOTHROW(md = index_markdown(in));
  CHECK(md.find("no commit (not a git work tree)") != std::string::npos);
  in.signoff["provenance"]["git_commit"] = "0123456789abcdef";
  in.signoff["provenance"]["git_dirty"] = true;
  CHECK(index_markdown(in).find("commit `0123456789ab` (dirty)") != std::string::npos);
  in.signoff["provenance"]["git_dirty"] = false;
  const std::string clean = index_markdown(in);
  CHECK(clean.find("commit `0123456789ab`") != std::string::npos);
  CHECK(clean.find("(dirty)") == std::string::npos);
}

TEST_CASE("RPT.html.gate_cells a family with any failure is FAIL, all passes PASS, none NOT-VALIDATED", RPT_TAGS) {
  require_presets({"int8"});
  ReportInputs in;
  in.gates = json{{"per_format",
                   {{"int8",
                     {{"ENV", {{"passed", 5}, {"failed", 1}, {"skipped", 0}}},   // mixed -> FAIL 1/6
                      {"ORA", {{"passed", 4}, {"failed", 0}, {"skipped", 0}}},   // -> ok 4
                      {"PAR", {{"passed", 0}, {"failed", 0}, {"skipped", 2}}}}}}}, // -> skip 2
                  {"gates", json::array()},
                  {"totals", {{"passed", 9}, {"failed", 1}, {"skipped", 2}}}};
  std::string warning;
  const std::string html = html_page(in, "/nonexistent-web-dir", &warning);
  CHECK(html.find("<td class=\"FAIL\">FAIL 1/6</td>") != std::string::npos);
  CHECK(html.find("<td class=\"PASS\">ok 4</td>") != std::string::npos);
  CHECK(html.find("<td class=\"NOT-VALIDATED\">skip 2</td>") != std::string::npos);
  CHECK(html.find("<td class=\"PASS\">FAIL") == std::string::npos);  // a failing cell is never coloured PASS
}

TEST_CASE("RPT.schema.bounds minimum and maximum are inclusive, the exclusive ones are not", RPT_TAGS) {
  require_presets({"f32"});  // (links the runtime's format table: see require_presets)
  using kvgate::json_schema::validate_json;
  const json s = json::parse(R"({"type":"object","properties":{
      "n":{"type":"integer","minimum":0,"maximum":10},
      "x":{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1}}})");
  // Values on the inclusive bounds pass; one past them fails (JSON Schema 2020-12, 6.2.2-6.2.5).
  CHECK(validate_json(json{{"n", 0}}, s).empty());
  CHECK(validate_json(json{{"n", 10}}, s).empty());
  CHECK(validate_json(json{{"n", -1}}, s).size() == 1);
  CHECK(validate_json(json{{"n", 11}}, s).size() == 1);
  // Exclusive bounds refuse the bound itself and accept the inside.
  CHECK(validate_json(json{{"x", 0}}, s).size() == 1);
  CHECK(validate_json(json{{"x", 1}}, s).size() == 1);
  CHECK(validate_json(json{{"x", 0.5}}, s).empty());
}

TEST_CASE("RPT.coverage.section the coverage section shows the record's parts, bar status and unreached files in Markdown and HTML",
          RPT_TAGS) {
  // signoff.json's coverage object (kvgate signoff --coverage), written by hand with distinct values
  // per cell: runtime/ 960/1000 lines (96.0%), 700/1000 branches (70.0%); cli/ 80/100 (80.0%), 30/60
  // (50.0%); total 1040/1100 (94.5%), 730/1060 (68.9%). The bar status is the record's ("missed",
  // deliberately disagreeing with the figure: the renderer must print the record, not recompute it).
  ReportInputs in = fixture();
  const json counts_rt = {{"lines_covered", 960}, {"lines_total", 1000}, {"line_percent", 96.0},
                          {"branches_covered", 700}, {"branches_total", 1000}, {"branch_percent", 70.0}};
  json rt = counts_rt;
  rt["part"] = "runtime/";
  rt["name"] = "runtime";
  rt["files"] = 12;
  json cli = {{"lines_covered", 80}, {"lines_total", 100}, {"line_percent", 80.0}, {"branches_covered", 30}, {"branches_total", 60},
              {"branch_percent", 50.0}, {"part", "cli/"}, {"name", "CLI"}, {"files", 3}};
  json unreached = counts_rt;
  unreached["file"] = "runtime/src/kv_file.cpp";
  unreached["lines_covered"] = 961;
  unreached["missing"] = "104,115,159-161";
  in.signoff["coverage"] = {
      {"measured", true},
      {"source", "cov/coverage.json"},
      {"commit", "abc123"},
      {"scope", "targets: all; tests: all"},
      {"total", {{"lines_covered", 1040}, {"lines_total", 1100}, {"line_percent", 94.5}, {"branches_covered", 730}, {"branches_total", 1060},
                 {"branch_percent", 68.9}}},
      {"parts", json::array({rt, cli})},
      {"runtime_unreached", json::array({unreached})},
      {"bar", {{"metric", "runtime/ lines reached"}, {"bound_percent", 95.0}, {"status", "missed"}}},
      {"note", "CUDA device code is not measured"}};
  const std::string md = index_markdown(in);
  INFO(md);
  CHECK(md.find("## Coverage of the shipped code by the gate suite") != std::string::npos);
  CHECK(md.find("Bar: at least 95% of runtime/ lines reached by the gate suite: missed (96.0%).") != std::string::npos);
  const auto r = split_cells(row_of(md, "| runtime/ |"));
  REQUIRE(r.size() == 6);
  CHECK(r[2] == "12");
  CHECK(r[3] == "960/1000");
  CHECK(r[4] == "96.0%");
  CHECK(r[5] == "70.0%");
  const auto c = split_cells(row_of(md, "| cli/ |"));
  REQUIRE(c.size() == 6);
  CHECK(c[3] == "80/100");
  CHECK(c[4] == "80.0%");
  CHECK(c[5] == "50.0%");
  const auto t = split_cells(row_of(md, "| all shipped code |"));
  REQUIRE(t.size() == 6);
  CHECK(t[3] == "1040/1100");
  CHECK(t[4] == "94.5%");
  CHECK(t[5] == "68.9%");
  const auto u = split_cells(row_of(md, "| runtime/src/kv_file.cpp |"));
  REQUIRE(u.size() == 4);
  CHECK(u[1] == "39");  // 1000 - 961 unreached lines
  CHECK(u[3] == "104,115,159-161");
  CHECK(md.find("Commit: abc123.") != std::string::npos);
  CHECK(md.find("CUDA device code is not measured") != std::string::npos);
  std::string warning;
  const std::string html = html_page(in, "/nonexistent-web-dir", &warning);
  CHECK(html.find("<h2>Coverage of the shipped code by the gate suite</h2>") != std::string::npos);
  CHECK(html.find("<td>runtime/</td><td>runtime</td><td>12</td><td>960/1000</td><td>96.0%</td><td>70.0%</td>") != std::string::npos);
  CHECK(html.find("<td>runtime/src/kv_file.cpp</td><td>39</td>") != std::string::npos);
  // Not measured: the section says so and shows no figure; no coverage object: no section.
  in.signoff["coverage"] = {{"measured", false}, {"source", "not given: run scripts/coverage.sh OUT"}, {"parts", json::array()},
                            {"runtime_unreached", json::array()}, {"bar", {{"status", "not measured"}}}, {"note", "none"}};
  const std::string md2 = index_markdown(in);
  CHECK(md2.find("Not measured: not given: run scripts/coverage.sh OUT.") != std::string::npos);
  CHECK(md2.find("| runtime/ |") == std::string::npos);
  in.signoff.erase("coverage");
  CHECK(index_markdown(in).find("## Coverage") == std::string::npos);
}
