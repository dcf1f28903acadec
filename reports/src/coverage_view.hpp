// The coverage section of a sign-off report (signoff.json's `coverage`, written by kvgate::signoff::
// to_json(CoverageSummary)) as text rows, so the Markdown and the HTML renderer print the same
// figures. Every field is read through field() (absent -> "–").
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "json_field.hpp"

namespace kvgate::reports {

struct CoverageView {
  bool present = false;              // the record has a coverage object
  std::string headline;              // the bar and its status, or why there is no figure
  std::vector<std::vector<std::string>> parts;      // part, what, files, lines covered/total, line %, branch %
  std::vector<std::vector<std::string>> unreached;  // runtime file, unreached lines count, line %, missing lines
  std::string provenance;            // source, commit, scope, note
};

inline std::string coverage_percent(const nlohmann::json& v) {
  if (!v.is_number()) return "–";
  char b[16];
  std::snprintf(b, sizeof b, "%.1f%%", v.get<double>());
  return b;
}

inline std::string coverage_text(const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : std::string("–"); }

inline CoverageView coverage_view(const nlohmann::json& signoff) {
  CoverageView cv;
  const nlohmann::json& c = field(signoff, "coverage");
  if (!c.is_object()) return cv;
  cv.present = true;
  const nlohmann::json& bar = field(c, "bar");
  const std::string status = coverage_text(field(bar, "status"));
  std::string runtime_pct = "–";
  for (const auto& p : field(c, "parts").is_array() ? field(c, "parts") : nlohmann::json::array()) {
    const std::string part = coverage_text(field(p, "part"));
    if (part == "runtime/") runtime_pct = coverage_percent(field(p, "line_percent"));
    cv.parts.push_back({part, coverage_text(field(p, "name")), std::to_string(int_field(p, "files")),
                        std::to_string(int_field(p, "lines_covered")) + "/" + std::to_string(int_field(p, "lines_total")),
                        coverage_percent(field(p, "line_percent")), coverage_percent(field(p, "branch_percent"))});
  }
  const nlohmann::json& total = field(c, "total");
  if (total.is_object())
    cv.parts.push_back({"all shipped code", "", "", std::to_string(int_field(total, "lines_covered")) + "/" + std::to_string(int_field(total, "lines_total")),
                        coverage_percent(field(total, "line_percent")), coverage_percent(field(total, "branch_percent"))});
  char bound[32];
  std::snprintf(bound, sizeof bound, "%g%%", field(bar, "bound_percent").is_number() ? field(bar, "bound_percent").get<double>() : 0.0);
  if (field(c, "measured").is_boolean() && field(c, "measured").get<bool>())
    cv.headline = "Bar: at least " + std::string(bound) + " of " + coverage_text(field(bar, "metric")) + " by the gate suite: " + status +
                  " (" + runtime_pct + ").";
  else
    cv.headline = "Not measured: " + coverage_text(field(c, "source")) + ".";
  for (const auto& f : field(c, "runtime_unreached").is_array() ? field(c, "runtime_unreached") : nlohmann::json::array())
    cv.unreached.push_back({coverage_text(field(f, "file")), std::to_string(int_field(f, "lines_total") - int_field(f, "lines_covered")),
                            coverage_percent(field(f, "line_percent")), coverage_text(field(f, "missing"))});
  cv.provenance = "Source: " + coverage_text(field(c, "source")) + ". Commit: " + coverage_text(field(c, "commit")) + ". Scope: " +
                  coverage_text(field(c, "scope")) + ". " + coverage_text(field(c, "note")) + ".";
  return cv;
}

}  // namespace kvgate::reports
