// The typed records: one field table per record drives the JSON writer, the reader and the Markdown
// printer; outcomes.json is checked against mutations/schema/outcomes.schema.json on write and on
// read, and a corrupt or wrong-version file is refused naming the file and the field.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "kvgate/build_paths.hpp"
#include "catch_compat.hpp"
#include "kvgate/json_schema.hpp"
#include "kvgate/outcomes.hpp"
#include "kvgate/records.hpp"
#include "kvgate/verdict_record.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace kvgate::records;

namespace {

const fs::path kSchema = fs::path(KVGATE_RECORDS_TEST_SOURCE_DIR) / "mutations" / "schema" / "outcomes.schema.json";

json load(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

OutcomesRecord sample() {
  OutcomesRecord r;
  r.started_at = "2026-01-01T00:00:00Z";
  r.source_dir = "/src";
  r.scratch_dir = "/scratch";
  r.catalog = "/src/mutations/catalog.json";
  r.options.jobs = 2;
  r.options.min_timeout_s = 20;
  r.options.timeout_factor = 5;
  r.variants = {{"default", {}}, {"no_avx2", {{"KVGATE_NO_AVX2", "1"}}}};
  r.baseline.green = true;
  r.baseline.executables = {{"gate_storage", "/b/gates/gate_storage", 1.5, {"STO.a"}, {"default", "no_avx2"}}};
  r.baseline.gates = {{"STO.a", "gate_storage", {"STO.a x"}, 0.7, false}};
  MutantRecord m;
  m.id = "STO.portable_reader";
  m.category = "storage";
  m.file = "runtime/src/page.cpp";
  m.description = "a | pipe";
  m.status = "killed";
  m.killed_by = {"STO.a"};
  m.expect_killed_by = {"STO.a"};
  m.killed_in = {{"STO.a", {"no_avx2"}}};
  m.gates["STO.a"] = GateCell{"failed", 0.2, "mutants/x/gates/no_avx2/gate_storage.log", "test case failed", "no_avx2"};
  r.mutants = {m};
  r.summary.run = 1;
  r.summary.killed = 1;
  r.kills_per_gate = {{"STO.a", 1}};
  return r;
}

fs::path temp_file(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("kvgate_records_" + std::to_string(getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p;
}

template <class R>
void check_table(const json& schema_obj, const std::string& where) {
  const auto diffs = table_vs_schema<R>(schema_obj, where);
  for (const auto& d : diffs) UNSCOPED_INFO(d);
  CHECK(diffs.empty());
}

}  // namespace

TEST_CASE("records: the outcomes field tables and outcomes.schema.json describe the same fields", "[records]") {
  const json s = load(kSchema);
  check_table<OutcomesRecord>(s, "outcomes");
  const json& d = s["$defs"];
  check_table<MutantRecord>(d["mutant"], "mutant");
  check_table<GateCell>(d["gate_cell"], "gate_cell");
  check_table<VariantRecord>(d["variant"], "variant");
  check_table<ExecutableRecord>(d["executable"], "executable");
  check_table<GateRecord>(d["gate"], "gate");
  check_table<BaselineRecord>(d["baseline"], "baseline");
  check_table<OptionsRecord>(d["options"], "options");
  check_table<SummaryRecord>(d["summary"], "summary");
  check_table<ShardRecord>(d["shard"], "shard");
  // Anti-vacuity: the comparison sees a field the schema lacks and a type that differs.
  json broken = d["gate_cell"];
  broken["properties"].erase("variant");
  broken["properties"]["seconds"]["type"] = "string";
  CHECK(table_vs_schema<GateCell>(broken, "gate_cell").size() == 2);
}

TEST_CASE("records: an outcomes record round-trips through the field table and validates", "[records]") {
  const OutcomesRecord r = sample();
  const json doc = outcomes_document(r, kSchema);
  CHECK(doc["format_version"] == kOutcomesFormatVersion);
  CHECK(doc["mutants"][0]["killed_in"]["STO.a"] == json::array({"no_avx2"}));
  CHECK(doc["canary"].is_null());
  const OutcomesRecord back = parse_outcomes(doc, "outcomes.json", kSchema);
  REQUIRE(back.mutants.size() == 1);
  CHECK(back.mutants[0].gates.at("STO.a").variant == "no_avx2");
  CHECK(back.mutants[0].killed_in.at("STO.a") == std::vector<std::string>{"no_avx2"});
  CHECK(back.variants.at(1).env.at("KVGATE_NO_AVX2") == "1");
  CHECK(back.baseline.executables.at(0).variants.size() == 2);
  CHECK(!back.canary.has_value());
  CHECK(to_json(back) == doc);
  REQUIRE(back.find("STO.portable_reader") != nullptr);
  CHECK(back.find("nope") == nullptr);
}

TEST_CASE("records: the writer refuses a record that breaks its own schema", "[records]") {
  OutcomesRecord r = sample();
  r.mutants[0].status = "half-killed";
  CHECK_THROWS_AS(outcomes_document(r, kSchema), std::logic_error);
  try {
    outcomes_document(r, kSchema);
  } catch (const std::logic_error& e) {
    CHECK(std::string(e.what()).find("/mutants/0/status") != std::string::npos);
  }
}

TEST_CASE("records: a corrupt or wrong-version outcomes.json is refused naming the file and the field", "[records]") {
  const json good = outcomes_document(sample(), kSchema);
  struct Case {
    const char* name;
    std::string text;
    std::string pointer;
  };
  json v1 = good;
  v1["format_version"] = 1;
  json bad_status = good;
  bad_status["mutants"][0]["status"] = "maybe";
  json bad_type = good;
  bad_type["summary"]["killed"] = "1";
  json missing = good;
  missing["mutants"][0].erase("killed_by");
  json not_mutate = good;
  not_mutate["tool"] = "kvgate bench";
  const std::vector<Case> cases{
      {"truncated", good.dump().substr(0, 40), ""},
      {"v1", v1.dump(), "/format_version"},
      {"status", bad_status.dump(), "/mutants/0/status"},
      {"type", bad_type.dump(), "/summary/killed"},
      {"missing", missing.dump(), "/mutants/0"},
      {"tool", not_mutate.dump(), "/tool"},
      {"array", "[]", ""},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    const fs::path p = temp_file(c.name, c.text);
    bool refused = false;
    try {
      read_outcomes(p, kSchema);
    } catch (const RecordError& e) {
      refused = true;
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find(p.string()) != std::string::npos);
      CHECK(e.pointer() == c.pointer);
      CHECK(what.find("fix:") != std::string::npos);
    }
    CHECK(refused);
    fs::remove(p);
  }
  // The good file reads (the refusals above are not the reader refusing everything).
  const fs::path p = temp_file("good", good.dump(2));
  CHECK(read_outcomes(p, kSchema).mutants.size() == 1);
  fs::remove(p);
  // A missing file names itself.
  CHECK_THROWS_AS(read_outcomes(fs::temp_directory_path() / "kvgate_records_no_such_file.json", kSchema), RecordError);
}

TEST_CASE("records: the Markdown printer reads the same field table", "[records]") {
  const OutcomesRecord r = sample();
  const std::string t = markdown_table(r.mutants, {"id", "status", "killed_by", "killed_in", "description"});
  CHECK(t.find("| id | status | killed_by | killed_in | description |") == 0);
  CHECK(t.find("| STO.portable_reader | killed | STO.a | STO.a: no_avx2 | a \\| pipe |") != std::string::npos);
  CHECK_THROWS_AS(markdown_table(r.mutants, {"no_such_field"}), std::invalid_argument);
  const std::string all = markdown_table(r.baseline.gates);
  CHECK(all.find("| id | exe | cases | seconds | skipped |") == 0);
  CHECK(all.find("| --:|") == std::string::npos);
  CHECK(all.find("| STO.a | gate_storage | STO.a x | 0.7 | no |") != std::string::npos);
  const std::string doc = markdown_fields<GateCell>("gate cell");
  CHECK(doc.find("| `variant` | string | no |") != std::string::npos);
}

TEST_CASE("records: the verdict record's field tables agree with signoff.schema.json", "[records]") {
  const json s = load(fs::path(KVGATE_RECORDS_TEST_SOURCE_DIR) / "reports" / "schema" / "signoff.schema.json");
  const json& item = s.at("properties").at("verdicts").at("items");
  std::vector<std::string> diffs = table_vs_schema<FormatVerdictRecord>(item, "verdicts[]");
  for (const auto& d : {table_vs_schema<ConformanceRecord>(item.at("properties").at("conformance"), "conformance"),
                        table_vs_schema<FitRecord>(item.at("properties").at("fit"), "fit"),
                        table_vs_schema<GateCountsRecord>(item.at("properties").at("gates"), "gates"),
                        table_vs_schema<MutationProofRecord>(item.at("properties").at("mutation"), "mutation"),
                        table_vs_schema<VerdictLineRecord>(s.at("$defs").at("line"), "line")})
    diffs.insert(diffs.end(), d.begin(), d.end());
  for (const auto& d : diffs) INFO(d);
  CHECK(diffs.empty());
  // Not vacuous: a field the schema lacks is reported.
  json trimmed = item;
  trimmed["properties"].erase("notes");
  CHECK(table_vs_schema<FormatVerdictRecord>(trimmed, "verdicts[]").size() == 1);
}

TEST_CASE("records: a verdict reads back through its table and prints as Markdown", "[records]") {
  FormatVerdictRecord v;
  v.format = "int8";
  v.verdict = "PASS";
  v.conformance = {"CONFORMS", {}};
  VerdictLineRecord l;
  l.metric = "kl_mean";
  l.bound = 0.05;
  l.value = 0.01;
  l.margin = 0.8;
  l.status = "within";
  v.fit = {"FITS", {}, 0, {l, VerdictLineRecord{}}};
  v.deciding_line = "budgets.kl_mean <= 0.05 nats";
  v.matrix = {{"kv_bytes", 123}};
  const json j = to_json(v);
  CHECK(j.at("quality").is_null());
  CHECK(j.at("fit").at("lines").at(1).at("margin").is_null());
  CHECK(j.at("matrix").at("kv_bytes") == 123);
  const FormatVerdictRecord back = from_json<FormatVerdictRecord>(j, "signoff.json", "fix: rerun");
  CHECK(to_json(back) == j);
  CHECK(back.fit.lines.at(0).margin == 0.8);
  json bad = j;
  bad["fit"]["lines"][0]["bound"] = "tight";
  try {
    (void)from_json<FormatVerdictRecord>(bad, "signoff.json", "fix: rerun");
    FAIL("accepted a string bound");
  } catch (const RecordError& e) {
    CHECK(e.pointer() == "/fit/lines/0/bound");
  }
  const std::string t = markdown_table(std::vector<FormatVerdictRecord>{v}, {"format", "verdict", "deciding_line"});
  CHECK(t.find("| format | verdict | deciding_line |") == 0);
  CHECK(t.find("| int8 | PASS | budgets.kl_mean <= 0.05 nats |") != std::string::npos);
  CHECK(markdown_fields<FormatVerdictRecord>("verdict").find("| `fit` | object | yes |") != std::string::npos);
}
