// The docs' tables of formats against the one list (kvgate/format_list.hpp, read through
// kvgate::presets() / kvgate::all_half_formats()): a docs table cannot read C++, so this test fails
// when docs/FORMATS.md "Presets and pairs", its "Half formats" headings or the README's format
// list disagree with it. The fix is named in every failure.
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/format.hpp"

namespace {

std::string source_file(const std::string& rel) {
  const char* root = std::getenv("KVGATE_SOURCE_DIR");
  REQUIRE(root != nullptr);  // set by ctest (kvgate_add_test); run by hand: KVGATE_SOURCE_DIR=<repo>
  const std::string path = std::string(root) + "/" + rel;
  std::ifstream in(path);
  INFO("cannot read " << path);
  REQUIRE(in.good());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(' ');
  const auto e = s.find_last_not_of(' ');
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

struct Row {
  std::string name, k, v;
};

// The rows of the first Markdown table after `heading` (header and separator skipped).
std::vector<Row> table_after(const std::vector<std::string>& lines, const std::string& heading) {
  std::vector<Row> rows;
  std::size_t i = 0;
  while (i < lines.size() && lines[i] != heading) ++i;
  while (i < lines.size() && !lines[i].starts_with("|")) ++i;
  for (i += 2; i < lines.size() && lines[i].starts_with("|"); ++i) {
    std::vector<std::string> cells;
    std::stringstream ss(lines[i].substr(1));
    for (std::string c; std::getline(ss, c, '|');) cells.push_back(trim(c));
    if (cells.size() < 3) continue;
    // "fp8 (= fp8_e4m3)": the preset name is the first word.
    rows.push_back({cells[0].substr(0, cells[0].find(' ')), cells[1], cells[2]});
  }
  return rows;
}

bool has_word(const std::string& text, const std::string& word) {
  return std::regex_search(text, std::regex("(^|[^a-z0-9_])" + word + "([^a-z0-9_]|$)"));
}

}  // namespace

TEST_CASE("docs/FORMATS.md 'Presets and pairs' lists exactly the presets of the one list, in order") {
  const auto rows = table_after(lines_of(source_file("docs/FORMATS.md")), "## Presets and pairs");
  const auto presets = kvgate::presets();
  INFO("fix: make the table under '## Presets and pairs' in docs/FORMATS.md one row per row of "
       "KVGATE_PRESETS (runtime/include/kvgate/format_list.hpp): | name | K half | V half |");
  REQUIRE(rows.size() == presets.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    INFO("row " << i + 1 << ": docs say " << rows[i].name << " = " << rows[i].k << " / " << rows[i].v << ", the list "
                << presets[i].name << " = " << kvgate::name(presets[i].fmt.k) << " / "
                << kvgate::name(presets[i].fmt.v));
    CHECK(rows[i].name == presets[i].name);
    CHECK(rows[i].k == kvgate::name(presets[i].fmt.k));
    CHECK(rows[i].v == kvgate::name(presets[i].fmt.v));
  }
}

TEST_CASE("docs/FORMATS.md 'Half formats' has a section heading naming every half format") {
  const auto lines = lines_of(source_file("docs/FORMATS.md"));
  std::string headings;
  bool in_halves = false;
  for (const auto& l : lines) {
    if (l.starts_with("## ")) in_halves = l == "## Half formats";
    if (in_halves && l.starts_with("### ")) headings += l + "\n";
  }
  REQUIRE(!headings.empty());
  for (kvgate::HalfFormat f : kvgate::all_half_formats()) {
    INFO("fix: docs/FORMATS.md needs a '### " << kvgate::name(f)
                                              << " ...' section under '## Half formats' (its normative bits)");
    CHECK(has_word(headings, std::string(kvgate::name(f))));
  }
}

TEST_CASE("README.md's format list names exactly the presets of the one list, in order") {
  const std::string readme = source_file("README.md");
  const std::string lead = "every KV format — `";
  const auto b = readme.find(lead);
  INFO("fix: README.md must keep the sentence 'every KV format — `<presets>`' listing KVGATE_PRESETS in order");
  REQUIRE(b != std::string::npos);
  const auto e = readme.find('`', b + lead.size());
  REQUIRE(e != std::string::npos);
  std::vector<std::string> names;
  std::istringstream in(readme.substr(b + lead.size(), e - b - lead.size()));
  for (std::string w; in >> w;)
    if (!w.starts_with("(")) names.push_back(w);  // "(e4m3)" annotates the word before it
  std::vector<std::string> expected;
  for (const auto& p : kvgate::presets()) expected.emplace_back(p.name);
  CHECK(names == expected);
}
