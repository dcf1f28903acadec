// The one reader of what a Catch2 gate program reports with `-r xml -d yes` (Catch2 2.13 and 3.x),
// shared by `kvgate gate`, `kvgate signoff` (through gate_runner.hpp) and `kvgate mutate`.
// One entry per TestCase: its name, tags, OverallResult and first failure. A TestCase that was
// started but has no OverallResult (the process crashed or was killed inside it) is reported with
// has_result false.
//
// Start tags end at the first '>' outside a quoted attribute value: Catch2 escapes '<' and '&' in
// attributes but not '>', so a case named "STO.resolve.precedence.values FP8 -> fp8" carries a bare
// '>' inside its name (harness_unit has that case).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace kvgate::harness {

struct CaseResult {
  std::string name;
  std::string tags;         // the raw tags attribute, e.g. "[fmt:int8][gate:ENV]"
  bool has_result = false;
  bool success = false;
  bool skipped = false;     // Catch2 3 SKIP(), or a passing case that WARNs "SKIPPED: <reason>"
  std::string skip_reason;  // the text after "SKIPPED: " (empty for SKIP())
  std::string failure;      // first failing expression (its Original text), or the first
                            // Failure / Exception / FatalErrorCondition text; empty if none
  // A failed case's report: each failing expression ("file:line: Original  with expansion:
  // Expanded"), each Failure / Exception / FatalErrorCondition text, then what the case printed
  // (StdOut, StdErr); at most 8000 characters. Empty for a passing case.
  std::string output;
  double seconds = 0;
};

std::vector<CaseResult> parse_catch_xml(std::string_view xml);

// Gate ID = the first whitespace-separated token of the TEST_CASE name.
std::string gate_id_of(std::string_view case_name);

// A Catch2 test spec that selects exactly the test cases of one gate ID ("<ID> *" or "<ID>").
std::string catch_spec_for_gate(std::string_view gate_id);

}  // namespace kvgate::harness
