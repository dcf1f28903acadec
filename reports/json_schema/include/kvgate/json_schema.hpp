// The one JSON Schema validator of kvgate: every record schema (reports/schema/*.schema.json,
// 2020-12), the mutant catalog (mutations/catalog.schema.json) and Stryker's
// mutation-testing-report-schema (draft-07) are checked here. It implements a subset of the
// keywords (listed in json_schema.cpp); a schema that uses any other keyword -- a typo such as
// "requried", or a keyword the subset lacks -- is refused with an error at that place, so a schema
// the validator cannot fully check never passes silently.
//
// $ref: local ("#/$defs/x") or into another schema file ("common.schema.json#/$defs/x"), the
// latter through the caller's loader. Siblings of $ref are checked too (2020-12; the draft-07
// schemas here put only annotations next to $ref).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvgate::json_schema {

struct SchemaError {
  std::string instance_path;  // JSON pointer into the document, e.g. /mutants/3/anchor
  std::string message;
};

// Returns the schema document named by the file part of a cross-file $ref. The reference must stay
// valid for the whole validation (cache the documents in a node-based container).
using SchemaLoader = std::function<const nlohmann::json&(const std::string& file)>;

std::vector<SchemaError> validate_json(const nlohmann::json& doc, const nlohmann::json& schema,
                                       const SchemaLoader& load = nullptr);
std::string format_errors(const std::vector<SchemaError>& errs, std::size_t max_lines = 20);

}  // namespace kvgate::json_schema
