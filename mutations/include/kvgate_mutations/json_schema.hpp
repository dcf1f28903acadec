// A small JSON Schema validator (draft-07 subset) for the mutant catalog and for Stryker's
// mutation-testing-report-schema. Supported keywords are listed in json_schema.cpp; any other
// keyword is reported as an error, so a schema the validator cannot fully check never passes
// silently.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvgate::mutate {

struct SchemaError {
  std::string instance_path;  // JSON pointer into the document, e.g. /mutants/3/anchor
  std::string message;
};

std::vector<SchemaError> validate_json(const nlohmann::json& doc, const nlohmann::json& schema);
std::string format_errors(const std::vector<SchemaError>& errs, std::size_t max_lines = 20);

}  // namespace kvgate::mutate
