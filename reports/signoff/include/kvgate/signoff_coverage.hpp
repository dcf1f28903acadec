// Coverage of the shipped code by the gate suite, as the sign-off report shows it (`kvgate signoff
// --coverage DIR`). scripts/coverage.sh measures it (gcov through gcovr, every ctest test on CPU)
// and writes DIR/coverage.json (gcovr's JSON summary: per file line_covered / line_total /
// branch_covered / branch_total), DIR/summary.txt (per file, the unreached line numbers) and
// DIR/scope.txt (the commit, the targets and tests that ran). The sign-off reads them, sums the
// files into the shipped parts (runtime/, the CLI, the harness libraries), lists the runtime files
// with unreached lines and judges the project's bar: at least 95% of runtime/ lines reached on CPU.
//
// The bar is informative: it is shown beside the verdicts and never changes one (the gates and the
// mutation proof decide conformance). CUDA device code is not measured by the script; the record
// says so instead of counting it as reached or unreached.
#pragma once
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvgate::signoff {

// The bar on runtime/ lines reached by the CPU gate suite, in percent; reached when
// 100 * covered >= bar * total (inclusive: exactly 95.0% meets it).
inline constexpr double kCoverageRuntimeLineBar = 95.0;

struct CoverageCounts {
  long long lines_covered = 0, lines_total = 0, branches_covered = 0, branches_total = 0;
  // Percent of lines / branches reached; nullopt when the part has no line (no branch).
  std::optional<double> line_percent() const;
  std::optional<double> branch_percent() const;
};

struct CoverageFile {
  std::string file;          // relative to the source root, as gcovr names it
  CoverageCounts counts;
  std::string missing;       // the unreached line numbers ("34,58,66-68"), from summary.txt; "" if unknown
};

struct CoveragePart {
  std::string part;          // the folder prefix, e.g. "runtime/"
  std::string name;          // what it is, e.g. "runtime (the KV store, formats, engines)"
  CoverageCounts counts;
  int files = 0;
};

struct CoverageSummary {
  bool measured = false;
  std::string source;                 // the file read, or why nothing was
  std::string commit;                 // scope.txt's commit ("" when the scope file has none)
  std::string scope;                  // scope.txt's targets/tests lines, joined
  CoverageCounts total;               // every file of the summary
  std::vector<CoveragePart> parts;    // in the order of coverage_parts(); a part without files is left out
  std::vector<CoverageFile> runtime_unreached;  // runtime/ files below 100% of lines, most unreached first
  std::string bar_status;             // "met" | "missed" | "not measured"
  std::string note;                   // what the figure does not cover (CUDA device code)
};

// The shipped parts, by folder prefix, in report order.
const std::vector<std::pair<std::string, std::string>>& coverage_parts();

class CoverageError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Pure: gcovr's JSON summary (`doc`, read from `path`), the text of summary.txt ("" if absent) and of
// scope.txt ("" if absent). A document that is not gcovr's summary (no `files` array, a file entry
// without `filename` or a count that is not a non-negative integer, covered > total) is refused
// (CoverageError naming the file, the field and the fix).
CoverageSummary parse_coverage(const nlohmann::json& doc, const std::string& path, const std::string& summary_txt,
                               const std::string& scope_txt);
// `path`: the folder scripts/coverage.sh wrote, or its coverage.json. Unreadable or not JSON ->
// CoverageError.
CoverageSummary load_coverage(const std::string& path);
// No --coverage: the record says it was not measured and how to measure it.
CoverageSummary coverage_not_measured();

// "met" when 100 * covered >= bar * total, "missed" below, "not measured" for an empty part.
std::string coverage_bar_status(const CoverageCounts& runtime, double bar_percent);

// signoff.json's `coverage` object (reports/schema/signoff.schema.json#/properties/coverage).
nlohmann::json to_json(const CoverageSummary& c);

}  // namespace kvgate::signoff
