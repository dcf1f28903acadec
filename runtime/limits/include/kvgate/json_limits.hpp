// JSON from untrusted files, parsed under the limits policy (kvgate/limits.hpp): the size and the
// nesting depth are refused before anything recursive (dump, comparison, copy, schema checks)
// walks the value, so a deeply nested document cannot overflow the stack. A brief, bounded
// rendering of a value for error messages (never a whole dump of it).
#pragma once
#include <algorithm>
#include <istream>
#include <iterator>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kvgate/limits.hpp"

namespace kvgate::limits {

// Parses `text` (from `where`, a file path) or throws LimitError / nlohmann::json::parse_error.
// Depth counts nested objects and arrays; the top level is depth 1.
inline nlohmann::json parse_json(std::string_view text, std::string_view where) {
  if (text.size() > max_of(kJsonBytes)) refuse(kJsonBytes, where, "size", std::to_string(text.size()) + " bytes");
  const std::uint64_t max_depth = max_of(kJsonDepth);
  std::uint64_t depth = 0;
  for (char ch : text) {  // a string's brackets count too: a conservative pre-scan, linear, no recursion
    if (ch == '[' || ch == '{') {
      if (++depth > max_depth) break;
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
  if (depth > max_depth) {
    // Exact check (brackets inside strings do not count) before refusing.
    std::uint64_t d = 0, worst = 0;
    bool in_str = false, esc = false;
    for (char ch : text) {
      if (in_str) {
        if (esc) esc = false;
        else if (ch == '\\') esc = true;
        else if (ch == '"') in_str = false;
        continue;
      }
      if (ch == '"') in_str = true;
      else if (ch == '[' || ch == '{') worst = std::max(worst, ++d);
      else if ((ch == ']' || ch == '}') && d > 0) --d;
    }
    if (worst > max_depth) refuse(kJsonDepth, where, "nesting depth", std::to_string(worst) + " or more");
  }
  return nlohmann::json::parse(text.begin(), text.end());
}

// The whole stream, then parse_json.
inline nlohmann::json parse_json(std::istream& in, std::string_view where) {
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_json(std::string_view(text), where);
}

// The records of a report document (matrix.json cells, gates.json gates, outcomes.json mutants,
// shard lists, ...): the document itself when it is an array, every array member of it and every
// array member of those (two levels, no recursion), each at most REPORT_RECORDS long. Called on a
// parsed document before any reader walks or copies its records.
inline void check_records(const nlohmann::json& doc, std::string_view where) {
  const std::uint64_t max = max_of(kReportRecords);
  auto one = [&](const nlohmann::json& a, const std::string& field) {
    if (a.is_array() && a.size() > max) refuse(kReportRecords, where, field, std::to_string(a.size()) + " records");
  };
  one(doc, "/");
  if (!doc.is_object()) return;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string field = "/" + it.key();
    one(*it, field);
    if (it->is_object())
      for (auto jt = it->begin(); jt != it->end(); ++jt) one(*jt, field + "/" + jt.key());
  }
}

// At most `max_chars` characters describing `v`: scalars as JSON, long strings cut, containers by
// their size only (no recursion into them).
inline std::string brief(const nlohmann::json& v, std::size_t max_chars = 80) {
  if (v.is_object()) return "an object of " + std::to_string(v.size()) + " keys";
  if (v.is_array()) return "an array of " + std::to_string(v.size()) + " items";
  std::string s = v.is_string() ? nlohmann::json(v.get_ref<const std::string&>().substr(0, max_chars)).dump(
                                      -1, ' ', false, nlohmann::json::error_handler_t::replace)
                                : v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (v.is_string() && v.get_ref<const std::string&>().size() > max_chars)
    s += " (" + std::to_string(v.get_ref<const std::string&>().size()) + " bytes, cut)";
  return s;
}

}  // namespace kvgate::limits
