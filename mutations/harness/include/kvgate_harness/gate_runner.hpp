// Runs gate executables with Catch's XML reporter and collects one result per gate (test case).
// Used by `kvgate gate`, `kvgate signoff` and `kvgate field-report`; the gates themselves never link
// this. The XML is read by the harness's one Catch2 reader (catch_xml.hpp), as `kvgate mutate` does.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvgate/records.hpp"

namespace kvgate::gates {

struct GateResult {
  std::string id;          // stable gate ID: first token of the test-case name, e.g. "ENV.int8"
  std::string name;        // full test-case name
  std::string family;      // from the [gate:<family>] tag
  std::vector<std::string> formats;  // from [fmt:<name>] tags
  std::string executable;  // which gate program ran it
  std::string status;      // "passed", "failed", "skipped"
  std::string message;     // first failure or the skip reason
  std::string output;      // a failed case's whole report (CaseResult::output); not in gates.json
  double seconds = 0;
};

}  // namespace kvgate::gates

// A gate result is a typed record (kvgate/records.hpp): one field table that gates.json's writer
// (summarize) and any reader or printer use.
template <>
struct kvgate::records::FieldTable<kvgate::gates::GateResult> {
  static const std::vector<kvgate::records::Field<kvgate::gates::GateResult>>& fields();
};

namespace kvgate::gates {

struct GateRunOptions {
  std::string gates_dir;     // folder holding gate_* executables
  std::string tag_filter;    // Catch tag expression, e.g. "[fmt:int8]" (empty = all)
  std::vector<std::string> families;  // keep only these families (empty = all)
};

// Lists gate executables (gate_* files that are executable) in a folder, sorted.
std::vector<std::string> list_gate_executables(const std::string& dir);
// Parses Catch2 XML reporter output (2.13 and 3.x) into gate results: ID, [gate:F] family,
// [fmt:N] formats, status (a case without a result -- the program died in it -- is "failed").
std::vector<GateResult> parse_catch_xml(const std::string& xml, const std::string& executable);
std::vector<GateResult> run_gates(const GateRunOptions& opt, bool show_progress);

// Per format, per family: passed / failed / skipped counts; plus totals.
nlohmann::json summarize(const std::vector<GateResult>& results);

// `kvgate gate --junit`: one JUnit testcase per gate result (classname: its program; a failed gate
// is a <failure> whose message and text are the gate's output, a skipped one <skipped>).
std::string junit_of_gates(const std::vector<GateResult>& results);

}  // namespace kvgate::gates
