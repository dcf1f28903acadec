// The JSON Schema validator is kvgate's one (reports/json_schema, kvgate/json_schema.hpp); the
// driver uses it under its own namespace.
#pragma once
#include "kvgate/json_schema.hpp"

namespace kvgate::mutate {
using json_schema::format_errors;
using json_schema::SchemaError;
using json_schema::validate_json;
}  // namespace kvgate::mutate
