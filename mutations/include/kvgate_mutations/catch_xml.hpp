// Reads what a Catch2 gate executable reported with `-r xml -d yes` (Catch2 2.13 and 3.x):
// one entry per TestCase with its name and OverallResult. A TestCase that was started but has
// no OverallResult (the process crashed or was killed inside it) is reported with has_result false.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace kvgate::mutate {

struct CaseResult {
  std::string name;
  bool has_result = false;
  bool success = false;
  bool skipped = false;  // Catch2 3 SKIP(), or a passing case that WARNs "SKIPPED: <reason>"
  std::string skip_reason;  // the text after "SKIPPED: " (empty for SKIP())
  double seconds = 0;
};

std::vector<CaseResult> parse_catch_xml(std::string_view xml);

// Gate ID = the first whitespace-separated token of the TEST_CASE name.
std::string gate_id_of(std::string_view case_name);

// A Catch2 test spec that selects exactly the test cases of one gate ID ("<ID> *" or "<ID>").
std::string catch_spec_for_gate(std::string_view gate_id);

}  // namespace kvgate::mutate
