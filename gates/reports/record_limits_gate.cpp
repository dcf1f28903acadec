// RPT.limits.*: the record counts of the documents `kvgate report`, `kvgate bench merge` and
// `kvgate mutate merge` read (REPORT_RECORDS) and the mutants of a catalog (CATALOG_MUTANTS) are
// checked against runtime/limits before any reader walks them; the refusal names the file, the
// field, the count, the limit and the KVGATE_LIMIT_<NAME> override. Anti-vacuity: with the limit
// lowered (the override) to exactly what the committed file holds it is read; one below, refused.
// RPT.limits.pattern_subject: a string longer than PATTERN_SUBJECT is reported, not matched.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "kvgate/build_paths.hpp"
#include "catch_compat.hpp"
#include "kvgate/json_limits.hpp"
#include "kvgate/json_schema.hpp"
#include "limit_fixtures.hpp"
#include "kvgate/outcomes.hpp"
#include "kvgate_mutations/catalog.hpp"

namespace fs = std::filesystem;
using namespace kvgate;
using kvgate::gates::limit_refusal;
using kvgate::gates::ScopedLimit;

namespace {

const fs::path kSrc = KVGATE_RECORD_LIMITS_SOURCE_DIR;

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

nlohmann::json read_doc(const fs::path& p) {
  std::ifstream f(p);
  return limits::parse_json(f, p.string());
}

}  // namespace

TEST_CASE("RPT.limits.records report records over REPORT_RECORDS are refused naming the file and the array",
          "[gate:RPT][fmt:none]") {
  // Bound: REPORT_RECORDS of runtime/limits, lowered to the longest record list of each committed
  // fixture (outcomes.json: 3, matrix.json /rows: 24, gates.json /gates: 8).
  struct Case {
    const char* file;
    std::uint64_t longest;
  };
  for (const Case& c : {Case{"outcomes.json", 3}, Case{"matrix.json", 24}, Case{"gates.json", 8}}) {
    const fs::path p = kSrc / "reports" / "tests" / "fixtures" / c.file;
    INFO(p.string());
    const nlohmann::json doc = read_doc(p);
    CHECK(limit_refusal([&] { limits::check_records(doc, p.string()); }) == "<ok>");
    {
      const ScopedLimit at("REPORT_RECORDS", c.longest);
      CHECK(limit_refusal([&] { limits::check_records(doc, p.string()); }) == "<ok>");
    }
    const ScopedLimit below("REPORT_RECORDS", c.longest - 1);
    const std::string msg = limit_refusal([&] { limits::check_records(doc, p.string()); });
    INFO(msg);
    CHECK(has(msg, p.string()));
    CHECK(has(msg, "= " + std::to_string(c.longest) + " records"));
    CHECK(has(msg, "exceeds the limit " + std::to_string(c.longest - 1)));
    CHECK(has(msg, "KVGATE_LIMIT_REPORT_RECORDS"));
  }
  // The reader `kvgate mutate merge` uses checks it too.
  const fs::path out = kSrc / "reports" / "tests" / "fixtures" / "outcomes.json";
  const fs::path schema = kSrc / "mutations" / "schema" / "outcomes.schema.json";
  {
    const ScopedLimit at("REPORT_RECORDS", 3);
    CHECK(limit_refusal([&] { records::read_outcomes(out, schema); }) == "<ok>");
  }
  const ScopedLimit below("REPORT_RECORDS", 2);
  const std::string msg = limit_refusal([&] { records::read_outcomes(out, schema); });
  INFO(msg);
  CHECK(has(msg, out.string()));
  CHECK(has(msg, "KVGATE_LIMIT_REPORT_RECORDS"));
}

TEST_CASE("RPT.limits.catalog a catalog with more mutants than CATALOG_MUTANTS is refused before its schema check",
          "[gate:RPT][fmt:none]") {
  // Bound: CATALOG_MUTANTS of runtime/limits, lowered to the committed catalog's own count.
  const fs::path cat = kSrc / "mutations" / "catalog.json", schema = kSrc / "mutations" / "catalog.schema.json";
  const std::uint64_t n = read_doc(cat)["mutants"].size();
  REQUIRE(n > 1);
  {
    const ScopedLimit at("CATALOG_MUTANTS", n);
    CHECK(limit_refusal([&] { REQUIRE(mutate::load_catalog(cat, schema).mutants.size() == n); }) == "<ok>");
  }
  const ScopedLimit below("CATALOG_MUTANTS", n - 1);
  const std::string msg = limit_refusal([&] { mutate::load_catalog(cat, schema); });
  INFO(msg);
  CHECK(has(msg, cat.string()));
  CHECK(has(msg, "/mutants (entries) = " + std::to_string(n)));
  CHECK(has(msg, "exceeds the limit " + std::to_string(n - 1)));
  CHECK(has(msg, "KVGATE_LIMIT_CATALOG_MUTANTS"));
}

TEST_CASE("RPT.limits.pattern_subject a string over PATTERN_SUBJECT is reported by the schema check, not matched",
          "[gate:RPT][fmt:none]") {
  // Bound: PATTERN_SUBJECT of runtime/limits (std::regex recurses per character): lowered to 8, a
  // subject of 8 bytes is matched and one of 9 is reported with the limit and the override; at the
  // default (4096) a 40000-byte subject is reported (it overflowed the stack before the limit).
  using kvgate::json_schema::validate_json;
  const nlohmann::json schema = nlohmann::json::parse(R"({"type":"object","properties":{"s":{"type":"string","pattern":"^a+$"}}})");
  const auto doc = [](std::size_t n, char ch = 'a') { return nlohmann::json{{"s", std::string(n, ch)}}; };
  CHECK(validate_json(doc(4096), schema).empty());
  CHECK(validate_json(doc(5, 'b'), schema).size() == 1);  // anti-vacuity: the pattern is matched
  const auto big = validate_json(doc(40000), schema);  // the limit, then the failed match it stands for
  REQUIRE(big.size() == 2);
  CHECK(has(big[0].message, "string of 40000 bytes exceeds the limit 4096"));
  const ScopedLimit lim("PATTERN_SUBJECT", 8);
  CHECK(validate_json(doc(8), schema).empty());
  const auto over = validate_json(doc(9), schema);
  REQUIRE(over.size() == 2);
  CHECK(over[0].instance_path == "/s");
  CHECK(over[0].message == "string of 9 bytes exceeds the limit 8 on the bytes of a string matched against a schema "
                           "pattern (pattern ^a+$; set KVGATE_LIMIT_PATTERN_SUBJECT=N to allow more)");
}
