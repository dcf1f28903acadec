// Coverage of the shipped code for the sign-off report (kvgate/signoff_coverage.hpp).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "kvgate/signoff_coverage.hpp"

namespace kvgate::signoff {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* kFix = "run scripts/coverage.sh OUT and pass --coverage OUT (the folder it wrote)";

std::optional<double> percent(long long covered, long long total) {
  if (total <= 0) return std::nullopt;
  return 100.0 * static_cast<double>(covered) / static_cast<double>(total);
}

long long count_field(const json& e, const char* key, const std::string& where, const std::string& path) {
  const auto it = e.find(key);
  if (it == e.end() || !it->is_number_integer() || it->get<long long>() < 0)
    throw CoverageError(path + ": " + where + "." + key + " is " + (it == e.end() ? std::string("missing") : it->dump()) +
                        ", expected a non-negative integer (gcovr --json-summary); fix: " + kFix);
  return it->get<long long>();
}

CoverageCounts counts_of(const json& e, const std::string& where, const std::string& path) {
  CoverageCounts c;
  c.lines_covered = count_field(e, "line_covered", where, path);
  c.lines_total = count_field(e, "line_total", where, path);
  c.branches_covered = count_field(e, "branch_covered", where, path);
  c.branches_total = count_field(e, "branch_total", where, path);
  if (c.lines_covered > c.lines_total || c.branches_covered > c.branches_total)
    throw CoverageError(path + ": " + where + " counts more covered than total lines or branches (" +
                        std::to_string(c.lines_covered) + "/" + std::to_string(c.lines_total) + ", " +
                        std::to_string(c.branches_covered) + "/" + std::to_string(c.branches_total) + "); fix: " + kFix);
  return c;
}

void add(CoverageCounts& to, const CoverageCounts& c) {
  to.lines_covered += c.lines_covered;
  to.lines_total += c.lines_total;
  to.branches_covered += c.branches_covered;
  to.branches_total += c.branches_total;
}

bool is_count(const std::string& s) { return !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; }); }

// gcovr's text report: "FILE  LINES  EXEC  COVER%  [MISSING]"; a long file name stands alone on its
// line and its numbers follow on the next. Returns file -> the missing column.
std::map<std::string, std::string> missing_lines(const std::string& txt) {
  std::map<std::string, std::string> out;
  std::istringstream in(txt);
  std::string line, pending;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<std::string> tok;
    for (std::string t; ls >> t;) tok.push_back(t);
    if (tok.empty() || line.front() == '-') continue;
    // numbers first (the wrapped second line of a long name), else a name then numbers
    std::size_t at = 0;
    std::string file;
    if (!pending.empty() && tok.size() >= 3 && is_count(tok[0])) {
      file = pending;
    } else if (tok.size() >= 4 && is_count(tok[1]) && is_count(tok[2])) {
      file = tok[0];
      at = 1;
    } else {
      pending = tok.size() == 1 ? tok[0] : std::string();
      continue;
    }
    pending.clear();
    out[file] = tok.size() > at + 3 ? tok[at + 3] : std::string();
  }
  return out;
}

std::string scope_field(const std::string& scope_txt, const std::string& key) {
  std::istringstream in(scope_txt);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ": ", 0) == 0) return line.substr(key.size() + 2);
  return "";
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return "";
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

json counts_json(const CoverageCounts& c) {
  auto pct = [](std::optional<double> v) { return v ? json(std::round(*v * 10.0) / 10.0) : json(nullptr); };
  return {{"lines_covered", c.lines_covered},   {"lines_total", c.lines_total},       {"line_percent", pct(c.line_percent())},
          {"branches_covered", c.branches_covered}, {"branches_total", c.branches_total}, {"branch_percent", pct(c.branch_percent())}};
}

}  // namespace

std::optional<double> CoverageCounts::line_percent() const { return percent(lines_covered, lines_total); }
std::optional<double> CoverageCounts::branch_percent() const { return percent(branches_covered, branches_total); }

const std::vector<std::pair<std::string, std::string>>& coverage_parts() {
  static const std::vector<std::pair<std::string, std::string>> parts = {
      {"runtime/", "runtime (KV store, formats, loaders, tokenizers, CPU engine)"},
      {"cli/", "CLI (flag plumbing, commands)"},
      {"reports/", "reports and sign-off rules"},
      {"mutations/", "mutation driver and gate runner"},
      {"bench/matrix/", "A/B matrix"},
      {"datasets/probes/", "quality probes"},
  };
  return parts;
}

std::string coverage_bar_status(const CoverageCounts& runtime, double bar_percent) {
  if (runtime.lines_total <= 0) return "not measured";
  return 100.0 * static_cast<double>(runtime.lines_covered) >= bar_percent * static_cast<double>(runtime.lines_total) ? "met"
                                                                                                                      : "missed";
}

CoverageSummary parse_coverage(const json& doc, const std::string& path, const std::string& summary_txt, const std::string& scope_txt) {
  if (!doc.is_object() || !doc.contains("files") || !doc["files"].is_array())
    throw CoverageError(path + ": field files is missing or not an array: not gcovr's JSON summary; fix: " + std::string(kFix));
  CoverageSummary c;
  c.measured = true;
  c.source = path;
  c.commit = scope_field(scope_txt, "commit");
  const std::string targets = scope_field(scope_txt, "targets"), tests = scope_field(scope_txt, "tests");
  if (!targets.empty() || !tests.empty()) c.scope = "targets: " + (targets.empty() ? "?" : targets) + "; tests: " + (tests.empty() ? "?" : tests);
  const auto missing = missing_lines(summary_txt);
  std::vector<CoveragePart> parts;
  for (const auto& [prefix, name] : coverage_parts()) parts.push_back({prefix, name, {}, 0});
  const json& files = doc["files"];
  for (std::size_t i = 0; i < files.size(); ++i) {
    const json& e = files[i];
    const std::string where = "files[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("filename") || !e["filename"].is_string())
      throw CoverageError(path + ": " + where + ".filename is missing or not a string; fix: " + std::string(kFix));
    CoverageFile f{e["filename"].get<std::string>(), counts_of(e, where, path), ""};
    if (auto m = missing.find(f.file); m != missing.end()) f.missing = m->second;
    add(c.total, f.counts);
    for (auto& p : parts)
      if (f.file.rfind(p.part, 0) == 0) {
        add(p.counts, f.counts);
        ++p.files;
        break;
      }
    if (f.file.rfind("runtime/", 0) == 0 && f.counts.lines_covered < f.counts.lines_total) c.runtime_unreached.push_back(f);
  }
  std::stable_sort(c.runtime_unreached.begin(), c.runtime_unreached.end(), [](const CoverageFile& a, const CoverageFile& b) {
    return a.counts.lines_total - a.counts.lines_covered > b.counts.lines_total - b.counts.lines_covered;
  });
  CoverageCounts runtime;
  for (auto& p : parts)
    if (p.files > 0) {
      if (p.part == "runtime/") runtime = p.counts;
      c.parts.push_back(p);
    }
  c.bar_status = coverage_bar_status(runtime, kCoverageRuntimeLineBar);
  c.note = "CPU gate suite (scripts/coverage.sh: gcov through gcovr, every ctest test unless the scope says otherwise); "
           "CUDA device code is not measured";
  return c;
}

CoverageSummary load_coverage(const std::string& arg) {
  fs::path p(arg);
  if (fs::is_directory(p)) p /= "coverage.json";
  std::ifstream f(p, std::ios::binary);
  if (!f) throw CoverageError(p.string() + ": cannot read the coverage summary; fix: " + std::string(kFix));
  json doc;
  try {
    doc = json::parse(f);
  } catch (const json::exception& e) {
    throw CoverageError(p.string() + ": not JSON (" + std::string(e.what()) + "); fix: " + std::string(kFix));
  }
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  return parse_coverage(doc, p.string(), read_text(dir / "summary.txt"), read_text(dir / "scope.txt"));
}

CoverageSummary coverage_not_measured() {
  CoverageSummary c;
  c.source = std::string("not given: ") + kFix;
  c.bar_status = "not measured";
  c.note = "no coverage figure in this sign-off";
  return c;
}

json to_json(const CoverageSummary& c) {
  json parts = json::array();
  for (const auto& p : c.parts) {
    json j = counts_json(p.counts);
    j["part"] = p.part;
    j["name"] = p.name;
    j["files"] = p.files;
    parts.push_back(j);
  }
  json unreached = json::array();
  for (const auto& f : c.runtime_unreached) {
    json j = counts_json(f.counts);
    j["file"] = f.file;
    j["missing"] = f.missing;
    unreached.push_back(j);
  }
  return {{"measured", c.measured},
          {"source", c.source},
          {"commit", c.commit.empty() ? json(nullptr) : json(c.commit)},
          {"scope", c.scope},
          {"total", c.measured ? counts_json(c.total) : json(nullptr)},
          {"parts", parts},
          {"runtime_unreached", unreached},
          {"bar", {{"metric", "runtime/ lines reached"}, {"bound_percent", kCoverageRuntimeLineBar}, {"status", c.bar_status}}},
          {"note", c.note}};
}

}  // namespace kvgate::signoff
