// The mutant catalog (mutations/catalog.json, schema mutations/catalog.schema.json, documented in
// docs/MUTATIONS.md): one record per named mutant, an exact-text patch of one source file.
#pragma once
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvgate::mutate {

class CatalogError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Mutant {
  std::string id;           // stable name, e.g. STORE.kv_swapped
  std::string category;     // canary | store | read | paging | resolution | model | ...
  std::string file;         // path relative to the source root
  std::string anchor;       // exact text to replace (array-of-lines form joined with '\n')
  std::string replacement;  // text put in its place
  int occurrences = 1;      // how many times the anchor must occur (all are replaced)
  std::string description;
  std::string rationale;
  std::vector<std::string> expect_killed_by;  // gate IDs that must kill it
  std::vector<std::string> requires_;         // e.g. "cuda"
  double timeout_scale = 1.0;
  bool is_canary() const { return category == "canary"; }
};

struct Catalog {
  std::string path;
  std::vector<Mutant> mutants;  // in file order; the canary included
  const Mutant* find(std::string_view id) const;
  const Mutant* canary() const;
};

// Schema check (errors name the record), then semantic checks: unique ids, at most one canary,
// relative file paths, anchor != replacement. Throws CatalogError with every problem found.
Catalog parse_catalog(const nlohmann::json& doc, const nlohmann::json& schema, const std::string& path);
Catalog load_catalog(const std::filesystem::path& catalog, const std::filesystem::path& schema);

// Non-overlapping occurrences of needle in hay.
std::size_t count_occurrences(std::string_view hay, std::string_view needle);

struct AnchorCheck {
  std::string id, file;
  int expected = 1;
  std::size_t found = 0;
  bool file_missing = false;
  // The anchor is found fewer times than expected and the replacement is there in its place: the
  // mutant looks applied in the source tree (patched by hand and not restored). A run would copy
  // it into the scratch tree and build it into the baseline, which then comes back red.
  bool applied = false;
  bool ok() const { return !file_missing && found == static_cast<std::size_t>(expected); }
  std::string message() const;  // "STALE <id>: ..." / "APPLIED <id>: ..." when !ok()
};
AnchorCheck check_anchor(const Mutant& m, const std::filesystem::path& source_root);

// The mutated text; throws CatalogError (STALE) when the anchor count differs from occurrences.
std::string apply_mutant(std::string_view original, const Mutant& m);

struct TextPos {
  int line = 1, column = 1;  // 1-based
};
struct TextSpan {
  TextPos start, end;  // end exclusive
};
// Location of the first occurrence of the anchor (for reports).
TextSpan anchor_span(std::string_view original, std::string_view anchor);

// The lines of the new side that a `git diff -U0` touches, per file (1-based, inclusive ranges); a
// hunk that only deletes counts the lines on both sides of the cut.
std::map<std::string, std::vector<std::pair<int, int>>> changed_lines(std::string_view diff_u0);

// Unified diff (3 lines of context) between two texts, with ---/+++ labels a/<path>, b/<path>.
std::string unified_diff(std::string_view a, std::string_view b, const std::string& path, int context = 3);

std::string read_text(const std::filesystem::path& p);  // throws std::runtime_error naming the file
void write_text(const std::filesystem::path& p, std::string_view text);  // atomic (temp + rename); keeps permissions

}  // namespace kvgate::mutate
