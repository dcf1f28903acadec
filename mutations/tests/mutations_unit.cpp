// Unit tests of the mutation driver library: schema validation, catalog parsing and STALE
// detection, patch application and diffs, Catch XML parsing, process groups and timeouts,
// scratch mirroring, object snapshots, and the reports (Stryker schema v2).
#include <unistd.h>

#include <csignal>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "catch_compat.hpp"
#include "kvgate_mutations/catalog.hpp"
#include "kvgate_mutations/catch_xml.hpp"
#include "kvgate_mutations/prove.hpp"
#include "kvgate_mutations/driver.hpp"
#include "kvgate_mutations/json_schema.hpp"
#include "kvgate_mutations/process.hpp"
#include "kvgate_mutations/report.hpp"
#include "kvgate_mutations/schemata.hpp"
#include "kvgate_mutations/scratch.hpp"
#include "kvgate_mutations/ci.hpp"
#include "kvgate_mutations/compile_ahead.hpp"
#include "kvgate_mutations/shard.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace kvgate::mutate;

namespace {

const fs::path kDir = KVGATE_MUTATIONS_DIR;

json load(const fs::path& p) { return json::parse(read_text(p)); }

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kvgate_mut_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

json minimal_mutant() {
  return {{"id", "X.one"},
          {"category", "store"},
          {"file", "src/a.cpp"},
          {"anchor", "return 1;"},
          {"replacement", "return 2;"},
          {"description", "returns two instead of one"},
          {"rationale", "a rationale long enough"},
          {"expect_killed_by", {"ENV.int8"}}};
}

json catalog_with(const json& mutants) { return {{"format_version", 1}, {"mutants", mutants}}; }

}  // namespace

TEST_CASE("json_schema: the keywords the catalog and Stryker schemas use") {
  const json schema = json::parse(R"({
    "type": "object", "required": ["a"], "additionalProperties": false,
    "properties": {
      "a": {"type": "integer", "minimum": 1, "maximum": 3},
      "b": {"type": "string", "pattern": "^x+$", "minLength": 2},
      "c": {"type": "array", "items": {"$ref": "#/definitions/e"}, "uniqueItems": true, "minItems": 1},
      "d": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
      "f": {"type": "object", "additionalProperties": {"type": "number"}}
    },
    "definitions": {"e": {"enum": ["p", "q"]}}
  })");
  CHECK(validate_json(json::parse(R"({"a": 2})"), schema).empty());
  CHECK(validate_json(json::parse(R"({"a": 2.0})"), schema).empty());  // an integral number is an integer
  CHECK(validate_json(json::parse(R"({"a": 2, "b": "xx", "c": ["p", "q"], "d": ["s"], "f": {"k": 1.5}})"), schema)
            .empty());
  CHECK(validate_json(json::parse(R"({})"), schema).size() == 1);                // required
  CHECK(validate_json(json::parse(R"({"a": 4})"), schema).size() == 1);          // maximum
  CHECK(validate_json(json::parse(R"({"a": 1.5})"), schema).size() == 1);        // integer
  CHECK(validate_json(json::parse(R"({"a": 1, "z": 0})"), schema).size() == 1);  // additionalProperties
  CHECK(validate_json(json::parse(R"({"a": 1, "b": "xy"})"), schema).size() == 1);      // pattern
  CHECK(validate_json(json::parse(R"({"a": 1, "c": ["p", "p"]})"), schema).size() == 1);  // uniqueItems
  CHECK(validate_json(json::parse(R"({"a": 1, "c": ["r"]})"), schema).size() == 1);       // enum via $ref
  CHECK(validate_json(json::parse(R"({"a": 1, "c": []})"), schema).size() == 1);          // minItems
  CHECK(validate_json(json::parse(R"({"a": 1, "d": 3})"), schema).size() == 1);           // oneOf
  CHECK(validate_json(json::parse(R"({"a": 1, "f": {"k": "s"}})"), schema).size() == 1);  // additionalProperties schema
  const auto errs = validate_json(json::parse(R"({"a": 1, "c": ["r"]})"), schema);
  REQUIRE(errs.size() == 1);
  CHECK(errs[0].instance_path == "/c/0");
  // A keyword the validator does not implement is an error, never a silent pass.
  CHECK(!validate_json(json(1), json::parse(R"({"multipleOf": 2})")).empty());
  CHECK(!validate_json(json(1), json::parse(R"({"$ref": "#/nowhere"})")).empty());
}

TEST_CASE("json_schema: the vendored Stryker schema accepts a v2 report and rejects broken ones") {
  const json schema = load(kDir / "schema" / "mutation-testing-report-schema.json");
  json report = json::parse(R"({
    "schemaVersion": "2", "thresholds": {"high": 100, "low": 95},
    "files": {"a.cpp": {"language": "cpp", "source": "int f() { return 1; }\n", "mutants": [
      {"id": "M1", "mutatorName": "store", "replacement": "2", "status": "Killed", "killedBy": ["ENV.int8"],
       "location": {"start": {"line": 1, "column": 18}, "end": {"line": 1, "column": 19}}}]}},
    "testFiles": {"gates/gate_envelope": {"tests": [{"id": "ENV.int8", "name": "ENV.int8 envelope"}]}}
  })");
  CHECK(validate_json(report, schema).empty());
  json bad = report;
  bad["files"]["a.cpp"]["mutants"][0]["status"] = "Dead";
  CHECK(!validate_json(bad, schema).empty());
  bad = report;
  bad["files"]["a.cpp"]["mutants"][0]["location"]["start"]["line"] = 0;
  CHECK(!validate_json(bad, schema).empty());
  bad = report;
  bad.erase("thresholds");
  CHECK(!validate_json(bad, schema).empty());
  bad = report;
  bad["schemaVersion"] = "3";
  CHECK(!validate_json(bad, schema).empty());
}

TEST_CASE("catalog: records, array-of-lines text, defaults") {
  const json schema = load(kDir / "catalog.schema.json");
  json m = minimal_mutant();
  m["anchor"] = json::array({"int f() {", "  return 1;"});
  m["timeout_scale"] = 2.5;
  m["requires"] = json::array({"cuda"});
  const Catalog c = parse_catalog(catalog_with(json::array({m})), schema, "t.json");
  REQUIRE(c.mutants.size() == 1);
  CHECK(c.mutants[0].anchor == "int f() {\n  return 1;");
  CHECK(c.mutants[0].occurrences == 1);
  CHECK(c.mutants[0].timeout_scale == 2.5);
  CHECK(c.mutants[0].requires_ == std::vector<std::string>{"cuda"});
  CHECK(c.canary() == nullptr);
  m["requires"] = json::array({"cuda-device"});
  CHECK(parse_catalog(catalog_with(json::array({m})), schema, "t.json").mutants[0].requires_ ==
        std::vector<std::string>{"cuda-device"});
  m["requires"] = json::array({"gpu"});  // not a requirement kind
  CHECK_THROWS_AS(parse_catalog(catalog_with(json::array({m})), schema, "t.json"), CatalogError);
}

TEST_CASE("catalog: schema and semantic errors name the mutant") {
  const json schema = load(kDir / "catalog.schema.json");
  auto message = [&](const json& doc) {
    try {
      parse_catalog(doc, schema, "t.json");
    } catch (const CatalogError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  json m = minimal_mutant();
  m.erase("rationale");
  std::string msg = message(catalog_with(json::array({m})));
  CHECK(msg.find("X.one") != std::string::npos);
  CHECK(msg.find("rationale") != std::string::npos);
  m = minimal_mutant();
  m["category"] = "nonsense";
  CHECK(message(catalog_with(json::array({m}))).find("X.one") != std::string::npos);
  m = minimal_mutant();
  m["expect_killed_by"] = json::array({"not a gate"});
  CHECK(!message(catalog_with(json::array({m}))).empty());
  m = minimal_mutant();
  m["unknown_field"] = 1;
  CHECK(!message(catalog_with(json::array({m}))).empty());
  CHECK(message(catalog_with(json::array({minimal_mutant(), minimal_mutant()}))).find("duplicate") !=
        std::string::npos);
  m = minimal_mutant();
  m["expect_killed_by"] = json::array();
  CHECK(message(catalog_with(json::array({m}))).find("at least one gate") != std::string::npos);
  m = minimal_mutant();
  m["replacement"] = m["anchor"];
  CHECK(message(catalog_with(json::array({m}))).find("equals the anchor") != std::string::npos);
  m = minimal_mutant();
  m["file"] = "../outside.cpp";
  CHECK(!message(catalog_with(json::array({m}))).empty());
}

TEST_CASE("catalog: occurrences, STALE, apply, location") {
  CHECK(count_occurrences("aaaa", "aa") == 2);  // non-overlapping
  CHECK(count_occurrences("abc", "") == 0);
  Mutant m;
  m.id = "X.one";
  m.file = "a.cpp";
  m.anchor = "return 1;";
  m.replacement = "return 2;";
  const std::string src = "int f() {\n  return 1;\n}\nint g() {\n  return 1;\n}\n";
  CHECK_THROWS_AS(apply_mutant(src, m), CatalogError);  // two occurrences, one expected: STALE
  try {
    apply_mutant(src, m);
  } catch (const CatalogError& e) {
    CHECK(std::string(e.what()).find("STALE X.one") != std::string::npos);
  }
  m.occurrences = 2;
  CHECK(apply_mutant(src, m) == "int f() {\n  return 2;\n}\nint g() {\n  return 2;\n}\n");
  const TextSpan sp = anchor_span(src, m.anchor);
  CHECK(sp.start.line == 2);
  CHECK(sp.start.column == 3);
  CHECK(sp.end.line == 2);
  CHECK(sp.end.column == 12);
  const TextSpan ml = anchor_span(src, "{\n  return");
  CHECK(ml.start.line == 1);
  CHECK(ml.end.line == 2);
  CHECK(ml.end.column == 9);

  const fs::path d = temp_dir("anchor");
  write_text(d / "a.cpp", src);
  AnchorCheck c = check_anchor(m, d);
  CHECK(c.ok());
  m.occurrences = 1;
  c = check_anchor(m, d);
  CHECK(!c.ok());
  CHECK(c.message().find("STALE X.one") != std::string::npos);
  CHECK_FALSE(c.applied);  // two anchors, one expected: stale, not applied
  // A mutant patched into the tree by hand and not restored: its anchor is gone and its
  // replacement stands in its place. A run would build it into the baseline.
  write_text(d / "a.cpp", apply_mutant(src, [&] {
               Mutant two = m;
               two.occurrences = 2;
               return two;
             }()));
  m.occurrences = 2;
  c = check_anchor(m, d);
  CHECK(c.applied);
  CHECK(c.message().find("APPLIED X.one: a.cpp holds this mutant's replacement") != std::string::npos);
  CHECK(c.message().find("git checkout -- a.cpp") != std::string::npos);
  // Anchor refactored away and the replacement nowhere: stale, not applied.
  write_text(d / "a.cpp", "int f() { return 3; }\n");
  CHECK_FALSE(check_anchor(m, d).applied);
  // A replacement that is part of its anchor is not counted inside the anchors still there.
  Mutant cut = m;
  cut.anchor = "return 1; // x";
  cut.replacement = "return 1;";
  cut.occurrences = 2;
  write_text(d / "a.cpp", "return 1; // x\nint z;\n");
  CHECK_FALSE(check_anchor(cut, d).applied);  // one of two anchors left; "return 1;" only inside it
  write_text(d / "a.cpp", "return 1; // x\nreturn 1;\n");
  CHECK(check_anchor(cut, d).applied);  // the other one cut to the replacement
  m.file = "missing.cpp";
  CHECK(check_anchor(m, d).file_missing);
  fs::remove_all(d);
}

TEST_CASE("catalog: unified diff") {
  std::string a, b;
  for (int i = 1; i <= 20; ++i) a += "line " + std::to_string(i) + "\n";
  b = a;
  b.replace(b.find("line 10\n"), 8, "LINE 10\n");
  const std::string d = unified_diff(a, b, "x.cpp");
  CHECK(d.find("--- a/x.cpp\n+++ b/x.cpp\n@@ -7,7 +7,7 @@\n line 7\n line 8\n line 9\n-line 10\n+LINE 10\n line 11\n") ==
        0);
  CHECK(unified_diff(a, a, "x.cpp").empty());
  // Two distant changes make two hunks.
  b.replace(b.find("line 1\n"), 7, "LINE 1\n");
  b.replace(b.find("line 20\n"), 8, "LINE 20\n");
  const std::string d2 = unified_diff(a, b, "x.cpp");
  std::size_t hunks = 0;
  for (std::size_t p = d2.find("\n@@ "); p != std::string::npos; p = d2.find("\n@@ ", p + 1)) ++hunks;
  CHECK(hunks == 3);
}

TEST_CASE("the shipped catalog is valid, has a canary, and no STALE anchor") {
  const Catalog c = load_catalog(kDir / "catalog.json", kDir / "catalog.schema.json");
  CHECK(c.canary() != nullptr);
  CHECK(c.mutants.size() >= 25);
  const fs::path root = kDir.parent_path();
  for (const auto& m : c.mutants) {
    INFO(m.id);
    const AnchorCheck a = check_anchor(m, root);
    CHECK(a.message() == "ok " + m.id);
    CHECK_FALSE(a.applied);
  }
}

TEST_CASE("catch_xml: Catch2 2.13 and 3.x reports, crashed and skipped cases") {
  const std::string v2 = R"(<?xml version="1.0" encoding="UTF-8"?>
<Catch name="gate_x">
  <Group name="gate_x">
    <TestCase name="ENV.int8 every element &lt;= s/2" tags="[gate:ENV]" filename="a.cpp" line="1">
      <Section name="s"><OverallResults successes="1" failures="0" expectedFailures="0"/></Section>
      <OverallResult success="true" durationInSeconds="0.5"/>
    </TestCase>
    <TestCase name="ENV.int8 second case" tags="[gate:ENV]" filename="a.cpp" line="2">
      <Expression success="false" type="CHECK"><Original>a</Original></Expression>
      <OverallResult success="false" durationInSeconds="0.25"/>
    </TestCase>
    <TestCase name="STO.resolve.precedence.values FP8 -> fp8, INT8 -> int8" tags="[gate:STO]" filename="a.cpp" line="3">
      <OverallResult success="true" durationInSeconds="0.1"/>
    </TestCase>
    <TestCase name="ORA.bytes.q4_0 runtime bytes" tags="[gate:ORA]" filename="a.cpp" line="3">
      <Expression success="true" type="CHECK"><Original>a</Original></Expression>
)";
  const auto c = parse_catch_xml(v2);
  REQUIRE(c.size() == 4);
  CHECK(c[0].name == "ENV.int8 every element <= s/2");
  CHECK(c[2].name == "STO.resolve.precedence.values FP8 -> fp8, INT8 -> int8");  // '>' inside an attribute
  CHECK(c[2].has_result);
  CHECK(c[0].has_result);
  CHECK(c[0].success);
  CHECK(c[0].seconds == 0.5);
  CHECK(c[1].has_result);
  CHECK_FALSE(c[1].success);
  CHECK_FALSE(c[3].has_result);  // the process died inside this case
  const std::string v3 = R"(<Catch2TestRun name="g"><TestCase name="PAR.x y" tags="[cuda]" filename="a" line="1">
<OverallResult success="true" skips="1" durationInSeconds="0.001"/></TestCase></Catch2TestRun>)";
  const auto c3 = parse_catch_xml(v3);
  REQUIRE(c3.size() == 1);
  CHECK(c3[0].skipped);
  // Catch2 2 has no SKIP(): a passing case that WARNs "SKIPPED: <reason>" (the GPU gates without a
  // device) is skipped too; other warnings, and a failed case, are not.
  const std::string v4 = R"(<Catch name="gate_cuda"><Group name="gate_cuda">
<TestCase name="ORA.cuda.store.f16 bytes" tags="[cuda]" filename="a" line="1">
      <Warning>
        SKIPPED: no CUDA device: CUDA driver version is insufficient &amp; old
      </Warning>
      <OverallResult success="true" durationInSeconds="0.0002"/>
    </TestCase>
<TestCase name="STO.cuda.capability refusals" tags="[cuda]" filename="a" line="2">
      <Warning>device checks of STO.cuda.capability SKIPPED: no CUDA device</Warning>
      <OverallResult success="true" durationInSeconds="0.0001"/>
    </TestCase>
<TestCase name="ORA.cuda.decode.f16 attn" tags="[cuda]" filename="a" line="3">
      <Warning>SKIPPED: half way</Warning>
      <Expression success="false" type="CHECK"><Original>a</Original></Expression>
      <OverallResult success="false" durationInSeconds="0.0001"/>
    </TestCase>
</Group></Catch>)";
  const auto c4 = parse_catch_xml(v4);
  REQUIRE(c4.size() == 3);
  CHECK(c4[0].skipped);
  CHECK(c4[0].skip_reason == "no CUDA device: CUDA driver version is insufficient & old");
  CHECK_FALSE(c4[1].skipped);
  CHECK(c4[1].skip_reason.empty());
  CHECK_FALSE(c4[2].skipped);
  CHECK(gate_id_of("ENV.int8 every element") == "ENV.int8");
  CHECK(gate_id_of("  STO.budget") == "STO.budget");
  CHECK(gate_id_of("ID") == "ID");
  CHECK(catch_spec_for_gate("ENV.int8") == "ENV.int8 *,ENV.int8");
  CHECK(catch_spec_for_gate("A,B") == "A\\,B *,A\\,B");
}

TEST_CASE("process: exit codes, signals, timeouts kill the whole process group") {
  const fs::path d = temp_dir("proc");
  ProcResult r = run_process({{"sh", "-c", "echo hi; exit 3"}, {}, {}, (d / "a.log").string(), 0});
  CHECK(r.ended_normally());
  CHECK(r.exit_code == 3);
  CHECK(read_text(d / "a.log") == "hi\n");
  r = run_process({{"sh", "-c", "kill -SEGV $$"}, {}, {}, {}, 0});
  CHECK(r.term_signal == SIGSEGV);
  CHECK_FALSE(r.ended_normally());
  r = run_process({{"sh", "-c", "echo $KVGATE_X; pwd"}, d.string(), {{"KVGATE_X", "v"}}, (d / "b.log").string(), 0});
  CHECK(read_text(d / "b.log") == "v\n" + fs::canonical(d).string() + "\n");
  // A grandchild that would outlive its parent is in the same group and dies with it.
  const auto t0 = std::chrono::steady_clock::now();
  r = run_process({{"sh", "-c", "(sleep 30; echo late > " + (d / "late").string() + ") & sleep 30"}, {}, {}, {}, 0.5});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(r.timed_out);
  CHECK(took < 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK_FALSE(fs::exists(d / "late"));
  r = run_process({{"/nonexistent/binary"}, {}, {}, {}, 0});
  CHECK(r.exit_code == 127);
  // Parallel runs keep spec order.
  const auto rs = run_processes({{{"sh", "-c", "sleep 0.2; exit 1"}, {}, {}, {}, 0}, {{"sh", "-c", "exit 2"}, {}, {}, {}, 0}}, 2);
  CHECK(rs[0].exit_code == 1);
  CHECK(rs[1].exit_code == 2);
  const auto [rc, out] = capture_output({"sh", "-c", "printf 'a\\0b'"});
  CHECK(rc == 0);
  CHECK(out == std::string("a\0b", 3));
  fs::remove_all(d);
}

TEST_CASE("process: an interrupt kills the running child and skips the rest") {
  request_interrupt();
  const auto rs = run_processes({{{"sleep", "5"}, {}, {}, {}, 0}, {{"true"}, {}, {}, {}, 0}}, 1);
  clear_interrupt();
  CHECK(rs[0].interrupted);
  CHECK(rs[1].interrupted);
}

TEST_CASE("process: stop_when ends the run: the running child is killed, the rest never start") {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::size_t> seen;
  const auto rs = run_processes({{{"sh", "-c", "exit 3"}, {}, {}, {}, 0},
                                 {{"sleep", "20"}, {}, {}, {}, 0},
                                 {{"true"}, {}, {}, {}, 0}},
                                2, [&](std::size_t k, const ProcResult& r) {
                                  seen.push_back(k);
                                  return r.exit_code == 3;
                                });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(rs[0].exit_code == 3);
  CHECK_FALSE(rs[0].stopped);
  CHECK(rs[1].stopped);  // killed while it ran
  CHECK_FALSE(rs[1].ended_normally());
  CHECK(rs[1].term_signal == 0);  // our kill is not the child's crash
  CHECK(rs[2].stopped);           // never started
  CHECK(took < 10);
  CHECK(seen == std::vector<std::size_t>{0});  // asked once: a stopped child is not asked about
  // Without a stop: every process runs.
  const auto all = run_processes({{{"sh", "-c", "exit 3"}, {}, {}, {}, 0}, {{"true"}, {}, {}, {}, 0}}, 1,
                                 [](std::size_t, const ProcResult&) { return false; });
  CHECK(all[1].ok());
}

TEST_CASE("scratch: mirror copies changed files only, removes stale ones, keeps the build") {
  const fs::path d = temp_dir("scratch");
  const fs::path src = d / "src", dst = d / "dst";
  write_text(src / "a.txt", "A");
  write_text(src / "sub" / "b.txt", "B");
  write_text(dst / "stale.txt", "old");
  write_text(dst / "build" / "keep.o", "obj");
  SyncStats s = sync_tree(src, dst, {"a.txt", "sub/b.txt"}, {dst / "build"});
  CHECK(s.copied == 2);
  CHECK(s.removed == 1);
  CHECK(read_text(dst / "sub" / "b.txt") == "B");
  CHECK(fs::exists(dst / "build" / "keep.o"));
  CHECK_FALSE(fs::exists(dst / "stale.txt"));
  const auto mt = fs::last_write_time(dst / "a.txt");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  write_text(src / "sub" / "b.txt", "B2");
  s = sync_tree(src, dst, {"a.txt", "sub/b.txt"}, {dst / "build"});
  CHECK(s.copied == 1);
  CHECK(s.unchanged == 1);
  CHECK(fs::last_write_time(dst / "a.txt") == mt);  // untouched: the build stays incremental

  // Object snapshots: a rebuilt identical object is not a change, different bytes are.
  const fs::path b = d / "objs";
  write_text(b / "x.o", "same");
  write_text(b / "y.o", "one");
  ObjectSnapshot snap = snapshot_objects(b);
  CHECK(snap.size() == 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  write_text(b / "x.o", "same");
  ObjectChanges ch = compare_objects(b, snap);
  CHECK(ch.rebuilt.size() == 1);
  CHECK(ch.different.empty());
  write_text(b / "y.o", "two");
  ch = compare_objects(b, snap);
  CHECK(ch.different.size() == 1);
  {
    ScratchLock lock(d / "scratch.lock");
    CHECK_THROWS(ScratchLock(d / "scratch.lock"));
  }
  ScratchLock again(d / "scratch.lock");  // released
  fs::remove_all(d);
}

TEST_CASE("report: a synthetic run gives a Stryker v2 report, a matrix and an HTML page") {
  Mutant m1, m2;
  m1.id = "STORE.a";
  m1.category = "store";
  m1.file = "src/a.cpp";
  m1.anchor = "return 1;";
  m1.replacement = "return 2;";
  m1.description = "d1";
  m1.expect_killed_by = {"ENV.int8", "ORA.bytes.int8"};
  m2 = m1;
  m2.id = "READ.b";
  m2.category = "read";
  const fs::path d = temp_dir("report");
  write_text(d / "tree" / "src" / "a.cpp", "int f() {\n  return 1;\n}\n</script>\n");
  RunResult r;
  r.exes = {{"gate_envelope", "/x/gate_envelope", {"ENV.int8"}, 1.0}, {"gate_oracle", "/x/gate_oracle", {"ORA.bytes.int8"}, 1.0}};
  r.gates = {{"ENV.int8", "gate_envelope", {"ENV.int8 within s/2"}, 0.5, false, {}},
             {"ORA.bytes.int8", "gate_oracle", {"ORA.bytes.int8 bytes"}, 0.5, false, {}}};
  r.baseline_green = true;
  MutantOutcome o1;
  o1.mutant = &m1;
  o1.status = MutantStatus::killed;
  o1.gates = {{"ENV.int8", {GateStatus::failed, 0.4, "l", "test case failed: x", "default", {}}},
              {"ORA.bytes.int8", {GateStatus::passed, 0.4, "l", "", "default", {}}}};
  o1.killed_by = {"ENV.int8"};
  o1.expected_not_killing = {"ORA.bytes.int8"};
  MutantOutcome o2;
  o2.mutant = &m2;
  o2.status = MutantStatus::noop;
  o2.reason = "identical";
  r.outcomes = {o1, o2};
  r.summary.killed = 1;
  r.summary.noop = 1;
  r.exit_code = kExitUnviable;
  ReportContext ctx{d / "tree", d / "tree", d / "out", "catalog.json", {}};
  ctx.opts.report_schema = kDir / "schema" / "mutation-testing-report-schema.json";
  const json sr = stryker_report(r, ctx);
  CHECK(validate_json(sr, load(ctx.opts.report_schema)).empty());
  const auto& ms = sr["files"]["src/a.cpp"]["mutants"];
  REQUIRE(ms.size() == 2);
  CHECK(ms[0]["status"] == "Killed");
  CHECK(ms[0]["killedBy"] == json::array({"ENV.int8"}));
  CHECK(ms[0]["location"]["start"]["line"] == 2);
  CHECK(ms[1]["status"] == "Ignored");
  CHECK(sr["testFiles"]["gates/gate_envelope"]["tests"][0]["id"] == "ENV.int8");

  const std::string csv = kill_matrix_csv(r);
  CHECK(csv.find("mutant,category,file,status,wall_s,ENV.int8,ORA.bytes.int8\n") == 0);
  CHECK(csv.find("STORE.a,store,src/a.cpp,killed,0.00,K,.\n") != std::string::npos);
  CHECK(csv.find("READ.b,read,src/a.cpp,noop,0.00,-,-\n") != std::string::npos);
  const std::string md = kill_matrix_md(r);
  CHECK(md.find("| ENV.int8 | K | - | 1 |") != std::string::npos);
  CHECK(md.find("ORA.bytes.int8 (**not killed**)") != std::string::npos);

  const std::string html = report_html(sr, "mutation-test-elements.js");
  CHECK(html.find("<script src=\"mutation-test-elements.js\">") != std::string::npos);
  CHECK(html.find("<mutation-test-report-app") != std::string::npos);
  // The embedded source holds "</script>": it must not close the script element early.
  const std::size_t data = html.find("const report = ");
  REQUIRE(data != std::string::npos);
  CHECK(html.find("</script>", data) == html.rfind("</script>"));

  std::ostringstream log;
  const auto written = write_reports(r, ctx, log);
  CHECK(written.size() >= 5);
  CHECK(log.str().find("does not match") == std::string::npos);
  const json oc = load(d / "out" / "outcomes.json");
  CHECK(oc["mutants"].size() == 2);
  CHECK(oc["summary"]["killed"] == 1);
  fs::remove_all(d);
}

TEST_CASE("shard: k/n parsing, the position-mod-n partition, the catalog digest") {
  std::string err;
  const auto ok = parse_shard("2/5", &err);
  REQUIRE(ok.has_value());
  CHECK(ok->index == 2);
  CHECK(ok->count == 5);
  CHECK(parse_shard("0/1", &err).has_value());
  for (const char* bad : {"5/5", "7/3", "1", "/3", "1/", "a/3", "1/0", "-1/3", "1/3/4"}) {
    INFO(bad);
    err.clear();
    CHECK(!parse_shard(bad, &err).has_value());
    CHECK(err.find(std::string("--shard '") + bad + "'") == 0);
    CHECK(err.find("fix: ") != std::string::npos);
  }
  CHECK(err.find("not of the form k/n") == std::string::npos);  // "1/3/4": k and n must be numbers

  std::vector<Mutant> ms(7);
  std::vector<const Mutant*> sel;
  for (std::size_t i = 0; i < ms.size(); ++i) {
    ms[i].id = "M" + std::to_string(i);
    sel.push_back(&ms[i]);
  }
  std::vector<std::string> all;
  for (int k = 0; k < 3; ++k) {
    const auto part = shard_of(sel, {k, 3});
    CHECK(part.size() == (k == 0 ? 3u : 2u));
    for (const Mutant* m : part) all.push_back(m->id);
  }
  std::sort(all.begin(), all.end());
  CHECK(all == std::vector<std::string>{"M0", "M1", "M2", "M3", "M4", "M5", "M6"});  // each exactly once
  CHECK(shard_of(sel, {1, 3}).front()->id == "M1");
  CHECK(shard_of(sel, {1, 3}).back()->id == "M4");
  CHECK(shard_of(sel, {0, 1}).size() == 7);

  const fs::path d = temp_dir("digest");
  write_text(d / "a.json", "{}");
  write_text(d / "b.json", "{ }");
  CHECK(file_digest(d / "a.json") == file_digest(d / "a.json"));
  CHECK(file_digest(d / "a.json") != file_digest(d / "b.json"));
  write_text(d / "empty", "");
  CHECK(file_digest(d / "empty") == "cbf29ce484222325");  // FNV-1a 64 offset basis: the bytes, nothing else
  CHECK_THROWS(file_digest(d / "missing.json"));
  fs::remove_all(d);
}

TEST_CASE("ci: JUnit per mutant and GitHub annotations at the anchor line") {
  Mutant canary, a, b, c;
  canary.id = "CAN";
  canary.category = "canary";
  canary.file = "src/a.cpp";
  a.id = "A.killed";
  a.file = "src/a.cpp";
  a.anchor = "return 1;";
  a.description = "one <-> two & \"three\"";
  a.expect_killed_by = {"ENV.x"};
  b = a;
  b.id = "B.survived";
  b.anchor = "return 3;";
  b.expect_killed_by = {"ORA.y", "ENV.x"};
  c = a;
  c.id = "C.skipped";
  const fs::path d = temp_dir("ci");
  write_text(d / "src" / "a.cpp", "int f() {\n  return 1;\n}\nint g() {\n  return 3;\n}\n");
  RunResult r;
  r.canary_ran = true;
  r.canary.mutant = &canary;
  r.canary.status = MutantStatus::killed;
  r.canary.killed_by = {"ENV.x", "ORA.y"};
  MutantOutcome o1, o2, o3;
  o1.mutant = &a;
  o1.status = MutantStatus::killed;
  o1.killed_by = {"ENV.x"};
  o1.killed_in = {{"ENV.x", {"no_avx2"}}};
  o1.wall_s = 1.5;
  o2.mutant = &b;
  o2.status = MutantStatus::survived;
  o2.reason = "every gate stayed green";
  o2.gates = {{"ENV.x", {GateStatus::passed, 0.1, "l", "", "default", {}}},
              {"ORA.y", {GateStatus::passed, 0.1, "l", "", "default", {}}}};
  o3.mutant = &c;
  o3.status = MutantStatus::skipped;
  o3.reason = "requires a CUDA device";
  r.outcomes = {o1, o2, o3};
  r.summary.killed = 1;
  r.summary.survived = 1;
  r.summary.skipped = 1;
  r.exit_code = kExitSurvived;

  const std::string x = junit_of_mutants(r);
  CHECK(x.find("<testsuites name=\"kvgate mutate\" tests=\"4\" failures=\"1\" errors=\"0\"") != std::string::npos);
  CHECK(x.find("<testcase name=\"CAN\" classname=\"canary\"") != std::string::npos);
  CHECK(x.find("<testcase name=\"A.killed\" classname=\"src/a.cpp\" time=\"1.500\">") != std::string::npos);
  CHECK(x.find("killed by: ENV.x [no_avx2]") != std::string::npos);
  CHECK(x.find("one &lt;-&gt; two &amp; &quot;three&quot;") != std::string::npos);
  CHECK(x.find("<failure message=\"survived: every gate stayed green\" type=\"survived\">") != std::string::npos);
  CHECK(x.find("expected killers: ORA.y, ENV.x") != std::string::npos);
  CHECK(x.find("gates that stayed green: ENV.x, ORA.y") != std::string::npos);
  CHECK(x.find("<skipped message=\"requires a CUDA device\">") != std::string::npos);
  // A canary that left a gate green is a failure too.
  r.canary_survivors = {"ORA.y"};
  CHECK(junit_of_mutants(r).find("failures=\"2\"") != std::string::npos);

  ReportContext ctx{d, d, d / "out", "catalog.json", {}};
  const std::string gh = github_annotations(r, ctx);
  CHECK(gh.find("::error file=src/a.cpp,line=5,title=mutant B.survived survived::") == 0);  // "return 3;" is line 5
  CHECK(gh.find("A.killed") == std::string::npos);  // only survivors and timeouts
  CHECK(gh.find("::notice title=kvgate mutate::2 mutants: 1 killed, 1 survived") != std::string::npos);
  const std::string md = github_step_summary(r, ctx);
  CHECK(md.find("| `B.survived` | survived | `src/a.cpp:5` | ORA.y, ENV.x |") != std::string::npos);
  CHECK(md.find("A.killed") == std::string::npos);
  b.description = "50% off\nnext line";
  CHECK(github_annotations(r, ctx).find("50%25 off%0Anext line") != std::string::npos);
  fs::remove_all(d);
}

namespace {
Mutant text_mutant(const std::string& anchor, const std::string& replacement) {
  Mutant m;
  m.id = "X.sw";
  m.file = "a.cpp";
  m.anchor = anchor;
  m.replacement = replacement;
  return m;
}
int lines(const std::string& t) { return static_cast<int>(std::count(t.begin(), t.end(), '\n')); }
}  // namespace

namespace {
// The schemata tests' fixture program d/src/a.cpp (instrumented by write_schemata), compiled to
// d/a.out with the compiler log in d/cc.log, and its output with one mutant turned on.
ProcResult compile_fixture(const fs::path& d) {
  return run_process({{KVGATE_UNIT_CXX, "-std=c++20", "-o", (d / "a.out").string(), (d / "src" / "a.cpp").string()},
                      {}, {}, (d / "cc.log").string(), 120});
}
std::string run_fixture(const fs::path& d, const std::string& id) {
  run_process({{(d / "a.out").string()}, {}, {{"KVGATE_MUTANT", id}}, (d / "out.txt").string(), 30});
  return read_text(d / "out.txt");
}
}  // namespace

TEST_CASE("schemata: character classes (comments, literals, separators, raw strings, directives)") {
  const std::string t = "#define X 1 \\\n  2\nint a = 1'000; // c\nconst char* s = \"x;//\" R\"d(;)d\"; /* b */ char c = ';';\n";
  const auto c = classify_chars(t);
  auto at = [&](const std::string& needle, std::size_t from = 0) { return c[t.find(needle, from)]; };
  CHECK(at("define") == CharClass::directive);
  CHECK(at("  2") == CharClass::directive);  // the continuation line
  CHECK(at("int") == CharClass::code);
  CHECK(at("'000") == CharClass::code);       // a digit separator, not a character literal
  CHECK(at("// c") == CharClass::comment);
  CHECK(at("x;//") == CharClass::literal);
  CHECK(at("(;)d") == CharClass::literal);    // inside the raw string
  CHECK(at("b */") == CharClass::comment);
  CHECK(at("';'") == CharClass::literal);
  CHECK(at("char c") == CharClass::code);
}

TEST_CASE("schemata: the expression form keeps type, precedence and lines") {
  const std::string f = "int f(int a, int b) {\n  return 2 * a + b;  // sum\n}\n";
  std::string why;
  const auto c = switch_candidates(f, text_mutant("2 * a + b", "2 * a - b"), 7, &why);
  REQUIRE(!c.empty());
  CHECK(c[0].form == SwitchForm::expression);
  CHECK(c[0].text ==
        "(::kvgate_mutant_schema::on(7) ? static_cast<::kvgate_mutant_schema::same_t<decltype((2 * a + b))>>("
        "::kvgate_mutant_schema::typed<decltype((2 * a + b))>(2 * a - b)) : ( 2 * a + b))");
  CHECK(f.substr(c[0].begin, c[0].end - c[0].begin) == " 2 * a + b");  // after `return`, before `;`
  REQUIRE(c.size() == 2);
  CHECK(c[1].form == SwitchForm::statement);
  CHECK(c[1].first_line == 2);
  CHECK(c[1].last_line == 2);
  // A change inside a call argument: the slot is that argument, not the whole call.
  const std::string g = "void g() {\n  h(x, y + 1, z);\n}\n";
  const auto d = switch_candidates(g, text_mutant("y + 1", "y + 2"), 1, &why);
  REQUIRE(!d.empty());
  CHECK(g.substr(d[0].begin, d[0].end - d[0].begin) == " y + 1");
  // The instrumented text: same line count, the header included on a comment line at file scope.
  const std::string file = "// a file\n#include <x>\n\n" + f;
  const auto e = switch_candidates(file, text_mutant("2 * a + b", "2 * a - b"), 7, &why);
  REQUIRE(!e.empty());
  const std::string out = instrument_text(file, {e[0]}, "/tmp/h.hpp");
  CHECK(lines(out) == lines(file));
  CHECK(out.rfind("#include \"/tmp/h.hpp\"\n#include <x>\n", 0) == 0);
  CHECK(out.find("return(::kvgate_mutant_schema::on(7)") != std::string::npos);
}

TEST_CASE("schemata: the statement form, and the changes that cannot be a switch") {
  std::string why;
  // A deleted statement: if (on) { } else { <it> }.
  const std::string f = "void f(int* p) {\n  p[0] = 1;\n  p[1] = 2;\n}\n";
  const auto c = switch_candidates(f, text_mutant("  p[1] = 2;\n", ""), 3, &why);
  REQUIRE(!c.empty());
  CHECK(c.back().form == SwitchForm::statement);
  CHECK(c.back().text == "if (::kvgate_mutant_schema::on(3)) {  } else {   p[1] = 2; }");
  // Only a comment changes: the rebuild path decides (no-op).
  CHECK(switch_candidates(f + "// note\n", text_mutant("// note", "// other"), 1, &why).empty());
  CHECK(why.find("only comments") != std::string::npos);
  // The anchor occurs twice.
  CHECK(switch_candidates("int a = 1;\nint b = 1;\n", text_mutant("= 1;", "= 2;"), 1, &why).empty());
  CHECK(why.find("occurs 2 times") != std::string::npos);
  // A preprocessor line.
  CHECK(switch_candidates("#define N 4\n", text_mutant("N 4", "N 5"), 1, &why).empty());
  CHECK(why.find("preprocessor") != std::string::npos);
  // A keyword is not an expression: `return` -> `throw` has no expression slot, and a whole-line
  // change at file scope has no statement form.
  CHECK(switch_candidates("int x = 1;\n", text_mutant("int x = 1;", "long x = 1;"), 1, &why).empty());
}

TEST_CASE("schemata: compiler error locations move a switch to its next form, then to the rebuild") {
  const auto locs = error_locations(
      "../src/a.cpp:12:5: error: 'y' was not declared in this scope\n"
      "/x/src/b.hpp:3:1:   required from here\n"
      "/x/src/k.cu(40): error: calling a __host__ function from a __device__ function\n"
      "../src/a.cpp:14:2: warning: unused\n"
      "/x/src/c.cpp:5:148: note: in instantiation of function template specialization 'n::typed<const signed char &, "
      "unsigned char>' requested here\n"
      "/x/src/c.cpp:9:1: note: candidate function not viable\n"
      "/usr/lib/gcc/x86_64-linux-gnu/12/include/avx512fintrin.h:90:1: error: inlining failed in call to "
      "'always_inline' '__m512i _mm512_set_epi32(int, ...)': target specific option mismatch\n"
      "../src/d.cpp:193:92: note: called from here\n");
  REQUIRE(locs.size() == 6);
  CHECK(locs[0].file == "../src/a.cpp");
  CHECK(locs[0].line == 12);
  CHECK(locs[1].line == 3);
  CHECK(locs[2].file == "/x/src/k.cu");
  CHECK(locs[2].line == 40);
  CHECK(locs[3].file == "/x/src/c.cpp");  // clang: where the template was instantiated
  CHECK(locs[3].line == 5);
  CHECK(locs[5].file == "../src/d.cpp");  // gcc: where an intrinsic that could not be inlined was called
  CHECK(locs[5].line == 193);

  const fs::path d = temp_dir("schemata");
  fs::create_directories(d / "src");
  const std::string text = "// f\nint f(int a) {\n  int y = a + 1;\n  return y;\n}\n";
  write_text(d / "src" / "a.cpp", text);
  Mutant m = text_mutant("a + 1", "a + 2");
  m.file = "src/a.cpp";
  SchemaPlan plan = plan_schemata(d, {&m});
  REQUIRE(plan.switched.size() == 1);
  REQUIRE(plan.switched[0].candidates.size() == 3);
  write_schemata(d, plan, d / "h.hpp");
  CHECK(read_text(d / "src" / "a.cpp").find("on(1)") != std::string::npos);
  CHECK(read_text(d / "h.hpp").find("\"X.sw\"") != std::string::npos);
  std::ostringstream log;
  // An error on the switch's line: the declaration form next (`int y = ...` keeps `y` in scope) ...
  CHECK(demote_on_errors(plan, {{"../src/a.cpp", 3}}, d, log) == 1);
  REQUIRE(plan.switched.size() == 1);
  CHECK(plan.switched[0].candidates[plan.switched[0].chosen].form == SwitchForm::declaration);
  // ... then the statement form.
  CHECK(demote_on_errors(plan, {{"../src/a.cpp", 3}}, d, log) == 1);
  REQUIRE(plan.switched.size() == 1);
  CHECK(plan.switched[0].candidates[plan.switched[0].chosen].form == SwitchForm::statement);
  // An error after it (the statement form put `y` out of scope): charged to it, now the rebuild.
  CHECK(demote_on_errors(plan, {{d.string() + "/src/a.cpp", 4}}, d, log) == 1);
  CHECK(plan.switched.empty());
  CHECK(plan.fallback.at("X.sw").find("no switch form compiles") != std::string::npos);
  // An error in a file without switches is not the schema's.
  CHECK(demote_on_errors(plan, {{"../src/other.cpp", 1}}, d, log) == 0);
  write_schemata(d, plan, d / "h.hpp");
  CHECK(read_text(d / "src" / "a.cpp") == text);  // back to the original
  fs::remove_all(d);
}

TEST_CASE("schemata: an error on a line two switches share moves only the switch its column is in") {
  // `g(a) + g(b)`: two expression switches on one line. An error whose column lies in the second's
  // text moves the second only (before the column was read, the line's last switch in plan order was
  // moved, and a mutant sharing the line with a failing one was sent to the rebuild with it).
  const fs::path d = temp_dir("schemata_col");
  fs::create_directories(d / "src");
  const std::string text = "// f\nint g(int);\nint f(int a, int b) {\n  int r = g(a) + g(b);\n  return r;\n}\n";
  write_text(d / "src" / "a.cpp", text);
  Mutant m1 = text_mutant("g(a)", "g(a + 1)");
  m1.id = "X.a";
  m1.file = "src/a.cpp";
  Mutant m2 = text_mutant("g(b)", "g(b + 1)");
  m2.id = "X.b";
  m2.file = "src/a.cpp";
  SchemaPlan plan = plan_schemata(d, {&m1, &m2});
  REQUIRE(plan.switched.size() == 2);
  write_schemata(d, plan, d / "h.hpp");
  const std::string inst = read_text(d / "src" / "a.cpp");
  const std::size_t ls = inst.find("  int r =");
  REQUIRE(ls != std::string::npos);
  const std::string line = inst.substr(ls, inst.find('\n', ls) - ls);
  int n1 = 0, n2 = 0;
  for (const auto& e : plan.switched) (e.mutant->id == "X.a" ? n1 : n2) = e.number;
  const std::size_t at2 = line.find("::kvgate_mutant_schema::on(" + std::to_string(n2) + ")");
  const std::size_t at1 = line.find("::kvgate_mutant_schema::on(" + std::to_string(n1) + ")");
  REQUIRE(at1 != std::string::npos);
  REQUIRE(at2 != std::string::npos);
  const std::size_t later = std::max(at1, at2);
  const std::string later_id = later == at2 ? "X.b" : "X.a", other_id = later == at2 ? "X.a" : "X.b";
  std::ostringstream log;
  CHECK(demote_on_errors(plan, {{"../src/a.cpp", 4, static_cast<int>(later) + 30}}, d, log) == 1);
  REQUIRE(plan.switched.size() == 2);  // one moved to its next (declaration) form, none to the rebuild
  for (const auto& e : plan.switched) {
    INFO(e.mutant->id);
    CHECK(e.candidates[e.chosen].form == (e.mutant->id == later_id ? SwitchForm::declaration : SwitchForm::expression));
  }
  CHECK(log.str().find(other_id) == std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("schemata: the generated header turns exactly one mutant on") {
  const std::string h = schema_header({"", "A.one", "B.two"});
  CHECK(h.find("kCount = 2") != std::string::npos);
  CHECK(h.find("\"A.one\",") != std::string::npos);
  CHECK(h.find("std::getenv(\"KVGATE_MUTANT\")") != std::string::npos);
  CHECK(h.find("KVGATE_MUTANT_REACHED") != std::string::npos);
}

TEST_CASE("schemata: nested and multi-line switches compile, and each mutant alone changes the result") {
  // Three mutants of one function: two on the same expression (nested), one whose statement goes on
  // over a second line (the statement form grows to the whole statement), and a deleted line.
  const std::string src =
      "// generated by the unit test\n"
      "#include <cstdio>\n"
      "\n"
      "int f(int a, int b) {\n"
      "  int r = a + b;  // sum\n"
      "  r = r * 10 +\n"
      "      3;\n"
      "  r += 1000;\n"
      "  return r;\n"
      "}\n"
      "struct Lim { int v; };\n"
      "const Lim kA{1}, kB{2};\n"
      "const Lim& pick(bool a) {\n"
      "  if (a) return kA;\n"
      "  return kB;\n"
      "}\n"
      "int main(int argc, char**) { std::printf(\"%d %d\\n\", f(7 + argc - 1, 2), &pick(false) == &kB ? 1 : &pick(false) == &kA ? 2 : 0); }\n";
  Mutant m1 = text_mutant("a + b;", "a - b;");
  m1.id = "X.minus";
  Mutant m2 = text_mutant("a + b;", "a * b;");
  m2.id = "X.times";
  Mutant m3 = text_mutant("r * 10 +", "r * 100 +");
  m3.id = "X.hundred";
  Mutant m4 = text_mutant("  r += 1000;\n", "");
  m4.id = "X.no_thousand";
  // A function returning a reference: the switch, off, must return the object itself (a copy of
  // kB would dangle; this was a real baseline crash: a `const Limit&` returned through a switch).
  Mutant m5 = text_mutant("return kB;", "return kA;");
  m5.id = "X.other_ref";
  const fs::path d = temp_dir("schemata_cc");
  fs::create_directories(d / "src");
  write_text(d / "src" / "a.cpp", src);
  for (Mutant* m : {&m1, &m2, &m3, &m4, &m5}) m->file = "src/a.cpp";
  SchemaPlan plan = plan_schemata(d, {&m1, &m2, &m3, &m4, &m5});
  INFO("fallbacks: " << plan.fallback.size());
  REQUIRE(plan.switched.size() == 5);  // none sent to the rebuild path, the nested pair included
  write_schemata(d, plan, d / "kvgate_mutant_schema.hpp");
  const std::string inst = read_text(d / "src" / "a.cpp");
  CHECK(lines(inst) == lines(src));
  const ProcResult cc = compile_fixture(d);
  INFO(read_text(d / "cc.log"));
  INFO(inst);
  REQUIRE(cc.ok());
  auto run_with = [&](const std::string& id) { return run_fixture(d, id); };
  CHECK(run_with("") == "1093 1\n");          // (7 + 2) * 10 + 3 + 1000: the unmutated program
  CHECK(run_with("X.minus") == "1053 1\n");      // (7 - 2) * 10 + 3 + 1000
  CHECK(run_with("X.times") == "1143 1\n");      // (7 * 2) * 10 + 3 + 1000
  CHECK(run_with("X.hundred") == "1903 1\n");    // 9 * 100 + 3 + 1000
  CHECK(run_with("X.no_thousand") == "93 1\n");
  CHECK(run_with("X.other_ref") == "1093 2\n");  // on: the other object, by reference
  CHECK(run_with("X.unknown") == "1093 1\n");    // an ID the build does not hold turns nothing on
  fs::remove_all(d);
}

TEST_CASE("schemata: a mutant that changes its operand's type is compiled as written, not cast away") {
  // A code read as unsigned instead of signed. In the expression form the switch casts the mutated
  // operand to the unmutated one's type (signed char again), which would make the mutant run as the
  // original; the form's type check (typed<>) fails to compile instead, the error (gcc: "required
  // from here", clang: "in instantiation of ... requested here", at the switch's line) moves it to the
  // statement form, and there the change is compiled. CI runs this test with gcc and with clang.
  const std::string src =
      "// generated by the unit test\n"
      "#include <cstdio>\n"
      "\n"
      "float f(const signed char* q) {\n"
      "  return static_cast<float>(q[0]) * 2.0f;\n"
      "}\n"
      "int main() { const signed char q[1] = {-3}; std::printf(\"%g\\n\", f(q)); }\n";
  Mutant m = text_mutant("static_cast<float>(q[0])", "static_cast<float>(static_cast<unsigned char>(q[0]))");
  m.id = "X.unsigned";
  m.file = "src/a.cpp";
  const fs::path d = temp_dir("schemata_type");
  fs::create_directories(d / "src");
  write_text(d / "src" / "a.cpp", src);
  SchemaPlan plan = plan_schemata(d, {&m});
  REQUIRE(plan.switched.size() == 1);
  REQUIRE(plan.switched[0].candidates[plan.switched[0].chosen].form == SwitchForm::expression);
  auto compile = [&] {
    write_schemata(d, plan, d / "kvgate_mutant_schema.hpp");
    return compile_fixture(d);
  };
  CHECK_FALSE(compile().ok());
  const std::string log1 = read_text(d / "cc.log");
  INFO(log1);
  CHECK(log1.find("changes the type of the operand") != std::string::npos);
  std::ostringstream log;
  CHECK(demote_on_errors(plan, error_locations(log1), d, log) == 1);
  REQUIRE(plan.switched.size() == 1);
  CHECK(plan.switched[0].candidates[plan.switched[0].chosen].form == SwitchForm::statement);
  const ProcResult cc = compile();
  INFO(read_text(d / "cc.log"));
  REQUIRE(cc.ok());
  auto run_with = [&](const std::string& id) { return run_fixture(d, id); };
  CHECK(run_with("") == "-6\n");
  CHECK(run_with("X.unsigned") == "506\n");  // 253 * 2: the unsigned read, as the patched source
  fs::remove_all(d);
}

TEST_CASE("schemata: the declaration form keeps the declared name in scope when the expression form cannot compile") {
  // `blocks[b]` -> `blocks[0]`: the expression slot is `b` (std::size_t) and the mutated operand
  // `0` is an int, so typed<> refuses the expression form; the statement form would end `d`'s scope
  // at its brace. The declaration form compiles, and the mutant runs as the patched source would:
  // unmutated d = bl[1] = 7, e = 21, result 28; mutated d = bl[0] = 5, e = 15, result 20.
  const std::string src =
      "// generated by the unit test\n"
      "#include <cstdio>\n"
      "#include <cstddef>\n"
      "int g(const int* blocks, std::size_t b) {\n"
      "  const int d = blocks[b];  // the block's value\n"
      "  const auto e = static_cast<long>(d) *\n"
      "                 3;\n"
      "  return static_cast<int>(e) + d;\n"
      "}\n"
      "int main() { const int bl[2] = {5, 7}; std::printf(\"%d\\n\", g(bl, 1)); }\n";
  std::string why;
  Mutant m = text_mutant("blocks[b];", "blocks[0];");
  m.id = "X.block0";
  m.file = "src/a.cpp";
  const auto c = switch_candidates(src, m, 1, &why);
  REQUIRE(c.size() == 3);
  CHECK(c[0].form == SwitchForm::expression);
  CHECK(c[1].form == SwitchForm::declaration);
  CHECK(c[1].text == " [&]() { if (::kvgate_mutant_schema::on(1)) return blocks[0]; return  blocks[b]; }()");
  CHECK(c[2].form == SwitchForm::statement);
  // A multi-line initializer: the declaration spans both lines and keeps them.
  Mutant m2 = text_mutant("                 3;", "                 4;");
  m2.id = "X.times4";
  m2.file = "src/a.cpp";
  // Not a plain declaration: a reference (the lambda's copy would dangle), a static, an assignment.
  for (const std::string t : {"void h(int* p) {\n  const int& r = p[0];\n  (void)r;\n}\n",
                              "void h(int* p) {\n  static int r = p[0];\n  (void)r;\n}\n",
                              "void h(int* p) {\n  int r = 0;\n  r = p[0];\n  (void)r;\n}\n"}) {
    INFO(t);
    for (const auto& e : switch_candidates(t, text_mutant("p[0];", "p[1];"), 1, &why)) CHECK(e.form != SwitchForm::declaration);
  }
  const fs::path d = temp_dir("schemata_decl");
  fs::create_directories(d / "src");
  write_text(d / "src" / "a.cpp", src);
  SchemaPlan plan = plan_schemata(d, {&m, &m2});
  REQUIRE(plan.switched.size() == 2);
  auto compile = [&] {
    write_schemata(d, plan, d / "kvgate_mutant_schema.hpp");
    return compile_fixture(d);
  };
  // The driver's loop: build, move what the errors name to its next form, build again.
  std::ostringstream log;
  for (int round = 0; round < 4 && !compile().ok(); ++round) demote_on_errors(plan, error_locations(read_text(d / "cc.log")), d, log);
  INFO(read_text(d / "cc.log"));
  REQUIRE(compile().ok());
  REQUIRE(plan.switched.size() == 2);  // neither sent to the rebuild path
  for (const auto& e : plan.switched)
    if (e.mutant->id == "X.block0") CHECK(e.candidates[e.chosen].form == SwitchForm::declaration);
  CHECK(lines(read_text(d / "src" / "a.cpp")) == lines(src));
  auto run_with = [&](const std::string& id) { return run_fixture(d, id); };
  CHECK(run_with("") == "28\n");
  CHECK(run_with("X.block0") == "20\n");  // 5 * 3 + 5
  CHECK(run_with("X.times4") == "35\n");  // 7 * 4 + 7
  fs::remove_all(d);
}

TEST_CASE("schemata: the whole condition of an if or while is switched as a bool") {
  // `if (o)` -> `if (false && o)` with o a std::optional: the mutated operand is a bool where the
  // original is an optional, so typed<> would refuse the expression form and the line `if (o) {` is
  // no whole statement. Both sides of a condition are converted to bool as `if` converts them, so
  // the switch means exactly what each source means: unmutated 3 + 10 = 13, mutated 0 + 10 = 10.
  const std::string src =
      "// generated by the unit test\n"
      "#include <cstdio>\n"
      "#include <optional>\n"
      "int f(std::optional<int> o, int n) {\n"
      "  int r = 0;\n"
      "  if (o) {\n"
      "    r += *o;\n"
      "  }\n"
      "  while (n > 0) {\n"
      "    r += 2;\n"
      "    n -= 1;\n"
      "  }\n"
      "  return r;\n"
      "}\n"
      "int main() { std::printf(\"%d\\n\", f(3, 5)); }\n";
  std::string why;
  Mutant m = text_mutant("if (o) {", "if (false && o) {");
  m.id = "X.never";
  m.file = "src/a.cpp";
  Mutant m2 = text_mutant("while (n > 0)", "while (n > 1)");
  m2.id = "X.one_less";
  m2.file = "src/a.cpp";
  const auto c = switch_candidates(src, m, 1, &why);
  REQUIRE(!c.empty());
  CHECK(c[0].form == SwitchForm::expression);
  CHECK(c[0].text == "(::kvgate_mutant_schema::on(1) ? static_cast<bool>(false && o) : static_cast<bool>(o))");
  // Not a condition: an `if constexpr` keeps the typed form (and the compiler then refuses it).
  const auto k = switch_candidates("void g() {\n  if constexpr (A) {\n  }\n}\n", text_mutant("(A)", "(B)"), 1, &why);
  REQUIRE(!k.empty());
  CHECK(k[0].text.find("static_cast<bool>") == std::string::npos);
  const fs::path d = temp_dir("schemata_cond");
  fs::create_directories(d / "src");
  write_text(d / "src" / "a.cpp", src);
  SchemaPlan plan = plan_schemata(d, {&m, &m2});
  REQUIRE(plan.switched.size() == 2);
  write_schemata(d, plan, d / "kvgate_mutant_schema.hpp");
  const ProcResult cc = compile_fixture(d);
  INFO(read_text(d / "cc.log"));
  REQUIRE(cc.ok());
  CHECK(lines(read_text(d / "src" / "a.cpp")) == lines(src));
  auto run_with = [&](const std::string& id) { return run_fixture(d, id); };
  CHECK(run_with("") == "13\n");
  CHECK(run_with("X.never") == "10\n");
  CHECK(run_with("X.one_less") == "11\n");  // 3 + 4 * 2
  fs::remove_all(d);
}

TEST_CASE("schemata: whole lines deleted or inserted by an anchor that starts after the indentation") {
  // A catalog anchor usually starts at the code, not at the line: deleting "r += 5;\n" leaves its
  // indentation in front of the next line, and inserting "  --r;\n" after "r *= 2;\n" reads as a
  // change inside the next line's indentation. Both are whole lines at the line start, which the
  // statement form takes: unmutated (3 + 5) * 2 = 16; deleted 3 * 2 = 6; inserted 16 - 1 = 15.
  const std::string src =
      "// generated by the unit test\n"
      "#include <cstdio>\n"
      "int f(int a) {\n"
      "  int r = a;\n"
      "  r += 5;\n"
      "  r *= 2;\n"
      "  return r;\n"
      "}\n"
      "int main() { std::printf(\"%d\\n\", f(3)); }\n";
  std::string why;
  Mutant del = text_mutant("r += 5;\n", "");
  del.id = "X.del";
  del.file = "src/a.cpp";
  Mutant ins = text_mutant("r *= 2;\n", "r *= 2;\n  --r;\n");
  ins.id = "X.ins";
  ins.file = "src/a.cpp";
  const auto cd = switch_candidates(src, del, 1, &why);
  INFO(why);
  REQUIRE(!cd.empty());
  CHECK(cd.back().form == SwitchForm::statement);
  CHECK(cd.back().text == "if (::kvgate_mutant_schema::on(1)) {  } else {   r += 5; }");
  const auto ci = switch_candidates(src, ins, 2, &why);
  INFO(why);
  REQUIRE(!ci.empty());
  CHECK(ci.back().form == SwitchForm::statement);
  CHECK(ci.back().begin == ci.back().end);  // nothing of the original is replaced
  CHECK(ci.back().text == "if (::kvgate_mutant_schema::on(2)) { --r; } else {  }");
  const fs::path d = temp_dir("schemata_lines");
  fs::create_directories(d / "src");
  write_text(d / "src" / "a.cpp", src);
  SchemaPlan plan = plan_schemata(d, {&del, &ins});
  REQUIRE(plan.switched.size() == 2);
  write_schemata(d, plan, d / "kvgate_mutant_schema.hpp");
  const ProcResult cc = compile_fixture(d);
  INFO(read_text(d / "cc.log"));
  INFO(read_text(d / "src" / "a.cpp"));
  REQUIRE(cc.ok());
  CHECK(lines(read_text(d / "src" / "a.cpp")) == lines(src));
  auto run_with = [&](const std::string& id) { return run_fixture(d, id); };
  CHECK(run_with("") == "16\n");
  CHECK(run_with("X.del") == "6\n");
  CHECK(run_with("X.ins") == "15\n");
  fs::remove_all(d);
}

TEST_CASE("schemata: the statement form takes the else of an if with it") {
  // Wrapping `if (c) A;` alone in braces orphans the `else B;` on the next line; the region grows to
  // the whole if-else. Unmutated f(3) = 1, mutated 11; f(1) = 2 either way.
  const std::string src =
      "// generated by the unit test\n"
      "#include <cstdio>\n"
      "int f(int a) {\n"
      "  int r = 0;\n"
      "  if (a > 2) r = 1;\n"
      "  else r = 2;\n"
      "  return r;\n"
      "}\n"
      "int main() { std::printf(\"%d %d\\n\", f(3), f(1)); }\n";
  std::string why;
  Mutant m = text_mutant("if (a > 2) r = 1;", "if (a > 2) { r = 1; r += 10; }");
  m.id = "X.plus10";
  m.file = "src/a.cpp";
  const auto c = switch_candidates(src, m, 1, &why);
  INFO(why);
  REQUIRE(!c.empty());
  CHECK(c.back().form == SwitchForm::statement);
  CHECK(c.back().first_line == 5);
  CHECK(c.back().last_line == 6);  // the else line is inside the switch
  const fs::path d = temp_dir("schemata_else");
  fs::create_directories(d / "src");
  write_text(d / "src" / "a.cpp", src);
  SchemaPlan plan = plan_schemata(d, {&m});
  REQUIRE(plan.switched.size() == 1);
  write_schemata(d, plan, d / "kvgate_mutant_schema.hpp");
  const ProcResult cc = compile_fixture(d);
  INFO(read_text(d / "cc.log"));
  REQUIRE(cc.ok());
  auto run_with = [&](const std::string& id) { return run_fixture(d, id); };
  CHECK(run_with("") == "1 2\n");
  CHECK(run_with("X.plus10") == "11 2\n");
  fs::remove_all(d);
}

TEST_CASE("catalog: changed lines of a git diff -U0 (the --since selection)") {
  const auto ch = changed_lines(
      "diff --git a/src/a.cpp b/src/a.cpp\n--- a/src/a.cpp\n+++ b/src/a.cpp\n"
      "@@ -3 +3 @@ int f\n-x\n+y\n@@ -10,2 +10,3 @@\n-a\n-b\n+c\n+d\n+e\n@@ -20,2 +21,0 @@\n-g\n-h\n"
      "diff --git a/old.cpp b/old.cpp\n--- a/old.cpp\n+++ /dev/null\n@@ -1 +0,0 @@\n-z\n");
  REQUIRE(ch.count("src/a.cpp"));
  CHECK_FALSE(ch.count("old.cpp"));
  const auto& r = ch.at("src/a.cpp");
  REQUIRE(r.size() == 3);
  CHECK(r[0] == std::pair<int, int>{3, 3});
  CHECK(r[1] == std::pair<int, int>{10, 12});
  CHECK(r[2] == std::pair<int, int>{21, 22});  // a pure deletion touches the lines around the cut
}

TEST_CASE("prove: resemblance order, a gate proven by a mutant naming another, a crash outside the cases, each mutant once") {
  using namespace kvgate::mutate;
  auto mk = [](std::string id, std::string file, std::vector<std::string> expect) {
    Mutant m;
    m.id = std::move(id);
    m.file = std::move(file);
    m.expect_killed_by = std::move(expect);
    return m;
  };
  const Mutant far = mk("M.far", "b.cpp", {"OTHER.thing"});
  const Mutant sib = mk("M.sibling", "a.cpp", {"ENV.fp8"});
  const Mutant exitcrash = mk("M.exit_crash", "a.cpp", {"ZZZ.q"});
  // Resemblance: named 100; shared family 10 per component; same last component 15; same file 5.
  const std::map<std::string, std::set<std::string>> files{{"INV.int8", {"a.cpp"}}};
  CHECK(affinity(sib, "ENV.fp8", files) == 100);
  CHECK(affinity(sib, "ENV.int8", files) == 10);
  CHECK(affinity(sib, "INV.fp8", files) == 15);
  CHECK(affinity(sib, "INV.int8", files) == 5);
  CHECK(affinity(far, "INV.int8", files) == 0);
  // The backend: a CUDA gate and CUDA code (a file under runtime/cuda/, or a mutant needing CUDA) add 20.
  Mutant dev = mk("M.dev", "runtime/cuda/kernels/decode.cuh", {"ORA.cuda.decode.f32"});
  Mutant host = mk("M.host", "runtime/src/kv_file.cpp", {"PAR.layer_map.persist.f32"});
  Mutant needs = mk("M.needs", "reports/x.cpp", {"SGN.y"});
  needs.requires_ = {"cuda-device"};
  CHECK(affinity(dev, "ORA.cuda.decode.bf16", files) == 30 + 20);
  CHECK(affinity(dev, "MOD.cuda.hf.qwen2.logits", files) == 20);
  CHECK(affinity(dev, "ORA.attn.bf16", files) == 10);  // a CPU gate: no backend bonus
  CHECK(affinity(host, "PAR.cuda.persist.f32", files) == 10 + 15);
  CHECK(affinity(needs, "SGN.cuda.damage.zero", files) == 10 + 20);
  ProofRecord rec;
  rec.gates = {{"ENV.fp8", "P1"}, {"INV.fp8", "P1"}, {"INV.int8", "P1"}, {"X.exit", "P2"}, {"X.other", "P2"}, {"X.never", "P2"}};
  rec.not_provable["X.skip"] = "skipped in the baseline: no device";
  rec.gates.push_back({"X.skip", "P2"});
  const std::vector<ProofCandidate> cands{{&far, {"P1"}, false}, {&sib, {"P1"}, false}, {&exitcrash, {"P2"}, false}};
  std::vector<std::pair<std::string, std::vector<std::string>>> calls;
  const ProofRunner run = [&](const ProofCandidate& c, const std::vector<std::string>& gates) {
    calls.emplace_back(c.mutant->id, gates);
    std::map<std::string, GateOutcome> out;
    for (const auto& g : gates) out[g] = GateOutcome{GateStatus::passed, 0, "", "", "default", {}};
    if (c.mutant->id == "M.sibling") out["INV.fp8"] = GateOutcome{GateStatus::failed, 0, "l", "test case failed: INV.fp8 x", "default", {"default"}};
    if (c.mutant->id == "M.far") out["INV.int8"] = GateOutcome{GateStatus::crashed, 0, "l", "killed by signal 11 during: INV.int8 y", "default", {"default"}};
    if (c.mutant->id == "M.exit_crash") {
      // Every case green, the process died at exit: a proof of no gate, so each is run alone.
      for (const auto& g : gates)
        out[g] = GateOutcome{GateStatus::crashed, 0, "l", "killed by signal 6 with no failed test case in its XML", "default", {"default"}};
      if (gates.size() == 1 && gates[0] == "X.exit")
        out["X.exit"] = GateOutcome{GateStatus::failed, 0, "l", "run alone: exit 1", "default", {"default"}};
    }
    return out;
  };
  std::ostringstream log;
  prove_gates(rec, cands, run, false, [] { return false; }, log);
  INFO(log.str());
  // The sibling first (it names a P1 gate), then the far one on what is left of P1, then P2.
  REQUIRE(calls.size() >= 3);
  CHECK(calls[0].first == "M.sibling");
  CHECK(calls[0].second == std::vector<std::string>{"ENV.fp8", "INV.fp8", "INV.int8"});
  CHECK(calls[1].first == "M.far");
  CHECK(calls[1].second == std::vector<std::string>{"ENV.fp8", "INV.int8"});  // only the gates still open
  CHECK(calls[2].first == "M.exit_crash");
  CHECK(calls[2].second == std::vector<std::string>{"X.exit", "X.other", "X.never"});  // not the skipped one
  CHECK(calls.size() == 6);  // then each of the three alone
  CHECK(rec.proven.at("INV.fp8").mutant == "M.sibling");  // named ENV.fp8, proved its sibling
  CHECK(rec.proven.at("INV.int8").status == "crashed");
  CHECK(rec.proven.at("X.exit").detail == "run alone: exit 1");
  CHECK(rec.unproven == std::vector<std::string>{"ENV.fp8", "X.other", "X.never"});
  CHECK(rec.tried.at("X.never").size() == 1);
  CHECK(rec.tried.at("X.never")[0].status == "crashed outside its test cases");
  CHECK(rec.tried.at("ENV.fp8").size() == 2);  // both P1 mutants tried, each once
  CHECK(rec.runs == 3);
  const auto doc = proof_json(rec);
  CHECK(doc["summary"]["proven"] == 3);
  CHECK(doc["summary"]["unproven"] == 3);
  CHECK(doc["summary"]["not_provable"] == 1);
  CHECK(proof_md(rec).find("- **X.never** (P2): 1 mutant(s) tried: M.exit_crash (crashed outside its test cases)") !=
        std::string::npos);
  // A rebuild candidate is tried only when asked; then its build counts in its seconds.
  ProofRecord r2;
  r2.gates = {{"ENV.fp8", "P1"}};
  calls.clear();
  prove_gates(r2, {{&sib, {"P1"}, true}, {&far, {"P1"}, false}}, run, false, [] { return false; }, log);
  CHECK(calls.size() == 1);
  CHECK(r2.rebuild_not_tried == std::vector<std::string>{"M.sibling"});
  // On a cheap gate (1 s) a switch of the same resemblance goes before a rebuild (10 s more) ...
  const Mutant sw = mk("M.switch", "a.cpp", {"ENV.fp8"});
  calls.clear();
  ProofRecord r3;
  r3.gates = {{"ENV.fp8", "P1", 1.0}, {"ENV.int8", "P1", 1.0}};
  prove_gates(r3, {{&sib, {"P1"}, true}, {&sw, {"P1"}, false}}, run, true, [] { return false; }, log);
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].first == "M.switch");
  // ... but on a slow program (a GPU gate of 200 s) the rebuild that resembles the gate more goes
  // first, before a switch that only shares the family (round 16: the switch-first rule spent a
  // whole device call on host-code switches that could not reach the kernels).
  calls.clear();
  ProofRecord r6;
  r6.gates = {{"ORA.cuda.decode.bf16", "P1", 200.0}};
  prove_gates(r6, {{&dev, {"P1"}, true}, {&host, {"P1"}, false}}, run, true, [] { return false; }, log);
  REQUIRE(!calls.empty());
  CHECK(calls[0].first == "M.dev");
  // Per second: a mutant naming the gate that would also run a slow program waits for one that does not.
  ProofRecord r5;
  r5.gates = {{"ENV.int8", "P1", 0.1}, {"SLOW.gate", "P2", 100}};
  const Mutant wide = mk("M.wide", "a.cpp", {"ENV.int8"}), narrow = mk("M.narrow", "a.cpp", {"ENV.int8"});
  calls.clear();
  prove_gates(r5, {{&wide, {"P1", "P2"}, false}, {&narrow, {"P1"}, false}}, run, false, [] { return false; }, log);
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].first == "M.narrow");
  // --prove-first: the listed mutant runs first where the score prefers another; an ID that is no
  // candidate is passed over; then the score order goes on.
  ProofRecord r7;
  r7.gates = {{"ENV.int8", "P1", 0.1}, {"SLOW.gate", "P2", 100}};
  calls.clear();
  ProofLoop first_loop;
  first_loop.first = {"M.unknown", "M.wide"};
  std::ostringstream first_log;
  prove_gates(r7, {{&wide, {"P1", "P2"}, false}, {&narrow, {"P1"}, false}}, run, first_loop, first_log);
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].first == "M.wide");
  CHECK(calls[0].second == std::vector<std::string>{"ENV.int8", "SLOW.gate"});
  CHECK(calls[1].first == "M.narrow");
  CHECK(first_log.str().find("M.wide (schema, --prove-first)") != std::string::npos);
  // Interrupted after the first run: the open gates say how many candidates were never tried.
  ProofRecord r4;
  r4.gates = {{"ENV.int8", "P1"}};
  calls.clear();
  prove_gates(r4, {{&sib, {"P1"}, false}, {&far, {"P1"}, false}}, run, false, [&] { return !calls.empty(); }, log);
  CHECK(r4.interrupted);
  CHECK(r4.runs == 0);  // the interrupted run is not counted, and proves nothing
  CHECK(r4.unproven == std::vector<std::string>{"ENV.int8"});
  CHECK_FALSE(proves_gate(GateOutcome{GateStatus::crashed, 0, "", "interrupted during: ENV.int8 x", "default", {}}));
  CHECK(proves_gate(GateOutcome{GateStatus::crashed, 0, "", "killed by signal 11 (Segmentation fault) during: ENV.int8 x", "default", {}}));
  CHECK(r4.candidates_left.at("ENV.int8") == 2);
  CHECK(proof_json(r4)["unproven"][0]["candidates_left"] == 2);
}

TEST_CASE("prove: a checkpoint after every run, a deadline that starts no further run, a killed proof's record as a seed") {
  using namespace kvgate::mutate;
  Mutant a, b, c;
  a.id = "M.a";
  a.file = "a.cpp";
  a.expect_killed_by = {"G.one"};
  b = a;
  b.id = "M.b";
  b.expect_killed_by = {"G.two"};
  c = a;
  c.id = "M.c";
  c.expect_killed_by = {"G.three"};
  // Each mutant proves the gate it names.
  const ProofRunner run = [](const ProofCandidate& cand, const std::vector<std::string>& gates) {
    std::map<std::string, GateOutcome> out;
    for (const auto& g : gates) out[g] = GateOutcome{GateStatus::passed, 0, "", "", "default", {}};
    const std::string own = cand.mutant->expect_killed_by.front();
    if (out.count(own)) out[own] = GateOutcome{GateStatus::failed, 0, "l", "test case failed: " + own + " x", "default", {"default"}};
    return out;
  };
  const auto fresh = [] {
    ProofRecord r;
    r.gates = {{"G.one", "P1", 1}, {"G.two", "P1", 1}, {"G.three", "P1", 1}};
    return r;
  };
  const std::vector<ProofCandidate> cands{{&a, {"P1"}, false}, {&b, {"P1"}, false}, {&c, {"P1"}, false}};
  std::ostringstream log;

  // Checkpoints: one before the first run, one after each; each sees the runs finished so far, with
  // the derived lists current and the state "running".
  std::vector<ProofRecord> snaps;
  ProofLoop loop;
  loop.checkpoint = [&](const ProofRecord& r) { snaps.push_back(r); };
  ProofRecord full = fresh();
  prove_gates(full, cands, run, loop, log);
  INFO(log.str());
  REQUIRE(snaps.size() == 4);
  CHECK(snaps[0].runs == 0);
  CHECK(snaps[0].unproven.size() == 3);
  CHECK(snaps[0].candidates_left.at("G.three") == 3);
  CHECK(snaps[1].runs == 1);
  CHECK(snaps[1].proven.size() == 1);
  CHECK(snaps[1].unproven.size() == 2);
  CHECK(snaps[1].candidates_left.at("G.three") == 2);
  CHECK(snaps[3].proven.size() == 3);
  for (const auto& sn : snaps) CHECK(proof_state(sn) == "running");
  CHECK(proof_json(snaps[1])["summary"]["state"] == "running");
  CHECK(proof_md(snaps[1]).find("while the proof was still running") != std::string::npos);
  CHECK(proof_state(full) == "finished");
  CHECK(full.unproven.empty());

  // The deadline passes after the first run: no second run starts, the record says why, and the
  // open gates keep their candidates left (no finding). The exit code is 7, not 130.
  int runs_started = 0;
  const ProofRunner counting = [&](const ProofCandidate& cand, const std::vector<std::string>& gates) {
    ++runs_started;
    return run(cand, gates);
  };
  ProofLoop dl;
  dl.past_deadline = [&] { return runs_started >= 1; };
  dl.checkpoint = [&](const ProofRecord& r) { snaps.push_back(r); };
  snaps.clear();
  ProofRecord cut = fresh();
  cut.deadline_s = 480;
  prove_gates(cut, cands, counting, dl, log);
  CHECK(runs_started == 1);
  CHECK(cut.runs == 1);
  CHECK(cut.deadline_reached);
  CHECK_FALSE(cut.interrupted);
  CHECK(proof_state(cut) == "deadline");
  CHECK(cut.proven.size() == 1);
  CHECK(cut.unproven == std::vector<std::string>{"G.two", "G.three"});
  CHECK(cut.candidates_left.at("G.two") == 2);
  REQUIRE(snaps.size() == 2);
  CHECK(log.str().find("[prove] deadline: no run started after run 1; 2 gate(s) open") != std::string::npos);
  const auto doc = proof_json(cut);
  CHECK(doc["summary"]["state"] == "deadline");
  CHECK(doc["summary"]["deadline_reached"] == true);
  CHECK(doc["summary"]["deadline_s"] == 480);
  CHECK(proof_md(cut).find("Stopped at the deadline") != std::string::npos);
  // A gate no run reached before the deadline: its candidates are pending, not missing.
  CHECK(proof_md(snaps[0]).find("- **G.three** (P1): no mutant tried yet; **3 candidate(s) not tried** (running)") !=
        std::string::npos);
  const fs::path dir = fs::temp_directory_path() / ("kvgate_prove_deadline_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  CHECK(write_proof(cut, dir) == kExitExpectation);

  // The checkpoint written after run 1 of a proof killed there is the record on disk: it seeds the
  // next proof with the gate run 1 proved.
  REQUIRE(write_proof(snaps[1], dir) == kExitExpectation);
  ProofRecord next = fresh();
  CHECK(seed_proofs(next, dir / "proof.json", log) == 1);
  CHECK(next.proven.at("G.one").path == "seed");
  CHECK(next.proven.at("G.one").mutant == "M.a");
  // Run 1 (M.a) left G.two and G.three green: those tries are carried over, and the next proof runs
  // M.a on neither again; it runs M.b and M.c, each on the gates M.a left open.
  REQUIRE(next.tried.count("G.two"));
  CHECK(next.tried.at("G.two").size() == 1);
  CHECK(next.tried.at("G.two")[0].mutant == "M.a");
  CHECK(next.tried.at("G.two")[0].status == "passed (seed)");
  std::vector<std::pair<std::string, std::vector<std::string>>> resumed;
  const ProofRunner recording = [&](const ProofCandidate& cand, const std::vector<std::string>& gates) {
    resumed.emplace_back(cand.mutant->id, gates);
    return run(cand, gates);
  };
  prove_gates(next, cands, recording, ProofLoop{}, log);
  for (const auto& [m, gs] : resumed) CHECK(m != "M.a");
  CHECK(resumed.size() == 2);
  CHECK(next.unproven.empty());
  // Both carried tries are in the record of a gate that stays open: a proof whose only candidate
  // is the one already tried runs nothing and lists the try.
  ProofRecord again = fresh();
  CHECK(seed_proofs(again, dir / "proof.json", log) == 1);
  resumed.clear();
  prove_gates(again, {{&a, {"P1"}, false}}, recording, ProofLoop{}, log);
  CHECK(resumed.empty());
  CHECK(again.unproven == std::vector<std::string>{"G.two", "G.three"});
  CHECK(proof_md(again).find("1 mutant(s) tried: M.a") != std::string::npos);
  // A try that says nothing (a gate process that failed outside every case, e.g. one that could
  // not start) is not carried: the next proof runs that mutant on that gate again.
  ProofRecord crashed = snaps[1];
  REQUIRE(crashed.tried.count("G.three"));
  crashed.tried["G.three"][0].status = "crashed outside its test cases";
  REQUIRE(write_proof(crashed, dir) == kExitExpectation);
  ProofRecord after = fresh();
  CHECK(seed_proofs(after, dir / "proof.json", log) == 1);
  CHECK(after.tried.at("G.two").size() == 1);
  CHECK((after.tried.count("G.three") == 0 || after.tried.at("G.three").empty()));
  fs::remove_all(dir);
}

TEST_CASE("prove: joining catalogs keeps one canary and refuses an ID twice") {
  using namespace kvgate::mutate;
  Catalog a, b;
  a.path = "a.json";
  b.path = "b.json";
  Mutant canary;
  canary.id = "CANARY.x";
  canary.category = "canary";
  canary.file = "f.cpp";
  canary.anchor = "x";
  canary.replacement = "y";
  Mutant m1 = canary, m2 = canary;
  m1.id = "A.one";
  m1.category = "store";
  m2.id = "B.two";
  m2.category = "store";
  a.mutants = {canary, m1};
  b.mutants = {canary, m2};
  const Catalog j = join_catalogs({a, b});
  REQUIRE(j.mutants.size() == 3);
  CHECK(j.mutants[2].id == "B.two");
  b.mutants.push_back(m1);
  CHECK_THROWS_WITH(join_catalogs({a, b}), kvgate_catch::contains("mutant A.one is in a.json and in b.json"));
  Catalog c;
  c.path = "c.json";
  Mutant other = canary;
  other.replacement = "z";
  c.mutants = {other};
  CHECK_THROWS_WITH(join_catalogs({a, c}), kvgate_catch::contains("differs from"));
}

TEST_CASE("compile-ahead: the compile command moves to the copy only where the scratch path is a whole path") {
  using kvgate::mutate::CompileAhead;
  const std::string cmd =
      "/usr/bin/cmake -E env CCACHE_BASEDIR=/w/s /usr/bin/ccache /usr/bin/c++ -I/w/s/runtime/include "
      "-I/w/s2/include -DDIR=\\\"/w/s\\\" -o runtime/x.o -c /w/s/runtime/src/x.cpp";
  const std::string out = CompileAhead::retarget(cmd, "/w/s", "/w/s.ahead");
  CHECK(out.find("CCACHE_BASEDIR=/w/s.ahead ") != std::string::npos);   // followed by a space
  CHECK(out.find("-I/w/s.ahead/runtime/include") != std::string::npos);  // followed by '/'
  CHECK(out.find("-c /w/s.ahead/runtime/src/x.cpp") != std::string::npos);
  CHECK(out.find("-I/w/s2/include") != std::string::npos);  // another folder that starts alike: kept
  CHECK(out.find("/w/s.ahead\\") != std::string::npos);    // an escaped quote ends a path too
  CHECK(out.find("-o runtime/x.o") != std::string::npos);   // relative to the build folder: kept
  CHECK(CompileAhead::retarget("", "/w/s", "/x") == "");
  CHECK(CompileAhead::retarget("c++ -c /w/s", "/w/s", "/x") == "c++ -c /x");  // at the end
  CHECK(CompileAhead::retarget("c++ -c /w/s", "", "/x") == "c++ -c /w/s");
}

TEST_CASE("compile-ahead: a job with nothing to compile is not counted ahead; a build outside the scratch disables it; the copy stays unmutated") {
  using kvgate::mutate::AheadJob;
  using kvgate::mutate::CompileAhead;
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("kvgate_ahead_unit_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path scratch = root / "tree";
  fs::create_directories(scratch / "build");
  fs::create_directories(scratch / "src");
  kvgate::mutate::write_text(scratch / "src" / "a.cpp", "int a() { return 1; }\n");
  kvgate::mutate::write_text(scratch / "build" / "big.o", "not copied");
  {
    // No build.ninja: ninja's deps log names no object, so the job has nothing to compile.
    CompileAhead ahead(scratch, scratch / "build", {}, {AheadJob{"M.one", "src/a.cpp", "int a() { return 2; }\n"}}, 2);
    CHECK_FALSE(ahead.reach("M.one"));
    CHECK_FALSE(ahead.reach("M.unknown"));
    ahead.stop();
    const auto st = ahead.stats();
    CHECK(st.jobs == 1);
    CHECK(st.compiled == 0);
    CHECK(st.objects == 0);
    CHECK(kvgate::mutate::read_text(ahead.copy_dir(0) / "src" / "a.cpp") == "int a() { return 1; }\n");
    CHECK(kvgate::mutate::read_text(ahead.copy_dir(1) / "src" / "a.cpp") == "int a() { return 1; }\n");
    CHECK(ahead.copy_dir(0) == root / "tree.ahead");
    CHECK(ahead.copy_dir(1) == root / "tree.ahead1");
    CHECK_FALSE(fs::exists(ahead.copy_dir(0) / "build" / "big.o"));  // the build folder is not copied
  }
  {
    CompileAhead outside(scratch, root / "elsewhere", {}, {AheadJob{"M.one", "src/a.cpp", "x"}});
    CHECK(outside.stats().disabled.find("outside the scratch") != std::string::npos);
    CHECK_FALSE(outside.reach("M.one"));
  }
  {
    CompileAhead none(scratch, scratch / "build", {}, {});
    CHECK(none.stats().disabled.find("no patch-and-rebuild mutant") != std::string::npos);
  }
  fs::remove_all(root);
}

TEST_CASE("device mutants: one expected gate that ran is enough; a mutant written apart may be killed by any GPU gate that ran") {
  const std::map<std::string, BaselineGate> base{{"ORA.cuda.decode.int8", {true, ""}},
                                                 {"ORA.cuda.decode.f16", {false, "no CUDA device"}},
                                                 {"ENV.int8", {true, ""}}};
  auto lookup = [&](const std::string& id) -> std::optional<BaselineGate> {
    const auto it = base.find(id);
    return it == base.end() ? std::nullopt : std::optional<BaselineGate>(it->second);
  };
  std::vector<std::string> ran{"ORA.cuda.decode.int8", "ENV.int8"};
  CHECK(device_gate_gap({"ORA.cuda.decode.f16", "ORA.cuda.decode.int8"}, lookup, ran).empty());
  // Its only gate skipped: it cannot be killed here, and the reason names the skip.
  const std::string skipped = device_gate_gap({"ORA.cuda.decode.f16"}, lookup, ran);
  CHECK(skipped.find("ORA.cuda.decode.f16 skipped in the baseline (no CUDA device)") != std::string::npos);
  // A real gate named but not in this run (another program): still not runnable, even though GPU gates ran.
  CHECK_FALSE(device_gate_gap({"ORA.cuda.decode.f16", "SGN.cuda.damage.pages"}, lookup, ran).empty());
  // Written apart (a placeholder ID): any GPU gate that ran may kill it ...
  CHECK(device_gate_gap({"UNKNOWN.written_apart"}, lookup, ran).empty());
  CHECK(device_gate_gap({}, lookup, ran).empty());
  // ... but not a CPU gate alone.
  const std::string cpu_only = device_gate_gap({"UNKNOWN.written_apart"}, lookup, {"ENV.int8"});
  CHECK(cpu_only.find("UNKNOWN.written_apart is not a gate of this run") != std::string::npos);
}

TEST_CASE("gate shards: every ID in one group, balanced by baseline seconds") {
  const std::vector<std::string> ids{"A.1", "A.2", "A.3", "A.4", "A.5"};
  const std::map<std::string, double> t{{"A.1", 9}, {"A.2", 1}, {"A.3", 5}, {"A.4", 4}, {"A.5", 0.5}};
  const auto g = split_gate_ids(ids, 2, [&](const std::string& id) { return t.at(id); });
  REQUIRE(g.size() == 2);
  // Longest first onto the least loaded (a tie to the first): 9 | 5, 4 | then 1 onto 9 (tie), 0.5 onto 9.
  CHECK(g[0] == std::vector<std::string>{"A.1", "A.2"});
  CHECK(g[1] == std::vector<std::string>{"A.3", "A.4", "A.5"});
  // Untimed (the baseline, from the test list): round robin, in listing order.
  const auto r = split_gate_ids(ids, 3, [](const std::string&) { return 0.0; });
  REQUIRE(r.size() == 3);
  CHECK(r[0] == std::vector<std::string>{"A.1", "A.4"});
  CHECK(r[2] == std::vector<std::string>{"A.3"});
  // More shards than IDs: one ID each; one shard or one ID: no split.
  CHECK(split_gate_ids({"X", "Y"}, 8, [](const std::string&) { return 1.0; }).size() == 2);
  CHECK(split_gate_ids(ids, 1, [](const std::string&) { return 1.0; }) == std::vector<std::vector<std::string>>{ids});
  CHECK(split_gate_ids({"X"}, 4, [](const std::string&) { return 1.0; }).size() == 1);
}
