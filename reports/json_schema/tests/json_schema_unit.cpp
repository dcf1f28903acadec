// Unit tests of kvgate's one JSON Schema validator (reports/json_schema): the rule on unknown
// keywords (refused, wherever they sit in the schema), cross-file $ref through a loader, $ref
// siblings, and every committed schema of the tree passing the keyword check.
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "kvgate/build_paths.hpp"
#include "catch_compat.hpp"
#include "kvgate/json_schema.hpp"

using nlohmann::json;
using kvgate::json_schema::validate_json;

namespace {

bool mentions(const std::vector<kvgate::json_schema::SchemaError>& errs, const std::string& text) {
  for (const auto& e : errs)
    if (e.message.find(text) != std::string::npos) return true;
  return false;
}

json read(const std::filesystem::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  return json::parse(in);
}

}  // namespace

TEST_CASE("json_schema: a keyword the validator does not implement refuses the schema") {
  // "requried" is a typo of "required": ignored, it would let every document without "a" pass.
  const json typo = json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "requried": ["a"]})");
  const auto e = validate_json(json::object(), typo);
  REQUIRE(e.size() == 1);
  CHECK(mentions(e, "keyword 'requried'"));
  CHECK(mentions(e, "does not implement"));
  // The same schema spelled right: the document without "a" fails, one with it passes.
  const json right = json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})");
  CHECK(validate_json(json::object(), right).size() == 1);
  CHECK(validate_json(json{{"a", 1}}, right).empty());
  // A typo in a branch the document never reaches is refused too (the schema is checked whole).
  const json deep = json::parse(R"({"type": "object", "properties": {"b": {"type": "array", "items": {"maximun": 3}}}})");
  const auto d = validate_json(json{{"a", 1}}, deep);
  REQUIRE(d.size() == 1);
  CHECK(mentions(d, "#/properties/b/items uses keyword 'maximun'"));
  // A real keyword outside the subset is refused the same way, not skipped.
  CHECK(mentions(validate_json(json(4), json::parse(R"({"multipleOf": 2})")), "keyword 'multipleOf'"));
  CHECK(mentions(validate_json(json(4), json::parse(R"({"$defs": {"x": {"if": {}}}})")), "keyword 'if'"));
  // Annotations carry no assertion and are accepted.
  CHECK(validate_json(json(4), json::parse(R"({"title": "t", "description": "d", "$comment": "c", "examples": [1],
                                               "default": 0, "$id": "x", "format": "uri", "type": "integer"})"))
            .empty());
}

TEST_CASE("json_schema: $ref into another file through the loader, local refs resolve in that file") {
  std::map<std::string, json> files;
  files["common.json"] = json::parse(R"({"$defs": {"count": {"$ref": "#/$defs/nonneg"}, "nonneg": {"type": "integer", "minimum": 0}}})");
  const auto load = [&](const std::string& f) -> const json& {
    auto it = files.find(f);
    if (it == files.end()) throw std::runtime_error("no schema file '" + f + "'");
    return it->second;
  };
  const json s = json::parse(R"({"type": "object", "properties": {"n": {"$ref": "common.json#/$defs/count"}}})");
  CHECK(validate_json(json{{"n", 3}}, s, load).empty());
  const auto e = validate_json(json{{"n", -1}}, s, load);
  REQUIRE(e.size() == 1);
  CHECK(e[0].instance_path == "/n");
  CHECK(mentions(validate_json(json{{"n", 3}}, s), "no loader"));
  CHECK(mentions(validate_json(json{{"n", 3}}, json::parse(R"({"properties": {"n": {"$ref": "gone.json#/x"}}})"), load),
                 "no schema file 'gone.json'"));
  // The loaded file is held to the keyword rule too.
  files["bad.json"] = json::parse(R"({"$defs": {"x": {"typ": "string"}}})");
  CHECK(mentions(validate_json(json{{"n", 3}}, json::parse(R"({"properties": {"n": {"$ref": "bad.json#/$defs/x"}}})"), load),
                 "schema bad.json#/$defs/x uses keyword 'typ'"));
  // Siblings of $ref are checked as well (2020-12).
  const json sib = json::parse(R"({"$defs": {"i": {"type": "integer"}}, "$ref": "#/$defs/i", "maximum": 5})");
  CHECK(validate_json(json(4), sib).empty());
  CHECK(validate_json(json(6), sib).size() == 1);
  CHECK(validate_json(json("x"), sib).size() == 1);
}

TEST_CASE("json_schema: every committed schema uses only keywords the validator implements") {
  const std::filesystem::path src = KVGATE_SCHEMA_TEST_SOURCE_DIR;
  std::vector<std::filesystem::path> schemas{src / "mutations" / "catalog.schema.json",
                                             src / "mutations" / "schema" / "mutation-testing-report-schema.json"};
  for (const auto& e : std::filesystem::directory_iterator(src / "reports" / "schema"))
    if (e.path().extension() == ".json") schemas.push_back(e.path());
  REQUIRE(schemas.size() >= 8);
  std::map<std::string, json> cache;  // by path: cross-file $refs name files beside the schema
  for (const auto& p : schemas) {
    INFO(p.string());
    const json schema = read(p);
    // The keyword check runs before the document is looked at: the errors of a bare string are
    // about the document only, never about the schema.
    const auto errs = validate_json(json("not a record"), schema, [&](const std::string& f) -> const json& {
      const std::string key = (p.parent_path() / f).string();
      auto it = cache.find(key);
      if (it == cache.end()) it = cache.emplace(key, read(key)).first;
      return it->second;
    });
    CHECK_FALSE(mentions(errs, "does not implement"));
    if (schema.contains("type") || schema.contains("$ref")) CHECK_FALSE(errs.empty());  // a record is an object
  }
}
