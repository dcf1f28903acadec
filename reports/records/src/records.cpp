#include "kvgate/records.hpp"

#include <cstdio>

namespace kvgate::records {

const char* schema_type(FieldType t) {
  switch (t) {
    case FieldType::string: return "string";
    case FieldType::integer: return "integer";
    case FieldType::number: return "number";
    case FieldType::boolean: return "boolean";
    case FieldType::array: return "array";
    case FieldType::object: return "object";
  }
  return "?";
}

RecordError::RecordError(std::string file, std::string pointer, std::string problem, std::string fix)
    : std::runtime_error(file + ": field " + (pointer.empty() ? std::string("/") : pointer) + " " + problem +
                         (fix.empty() ? std::string() : "; " + fix)),
      file_(std::move(file)),
      pointer_(std::move(pointer)) {}

std::string markdown_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '|') r += "\\|";
    else if (c == '\n') r += ' ';
    else r += c;
  }
  return r;
}

std::string markdown_cell(const json& v) {
  if (v.is_null()) return "–";
  if (v.is_string()) return markdown_escape(v.get<std::string>());
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_number_integer()) return std::to_string(v.get<long long>());
  if (v.is_number()) {
    char b[32];
    std::snprintf(b, sizeof b, "%.4g", v.get<double>());
    return b;
  }
  if (v.is_array()) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + markdown_cell(x);
    return s;
  }
  std::string s;
  for (const auto& [k, x] : v.items()) s += (s.empty() ? "" : "; ") + markdown_escape(k) + ": " + markdown_cell(x);
  return s;
}

}  // namespace kvgate::records
