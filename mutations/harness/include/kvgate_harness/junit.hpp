// JUnit XML (the Ant/Jenkins report that GitHub, GitLab and Jenkins render) for `kvgate gate --junit`
// and `kvgate mutate --junit`. The document has the shape mutations/schema/junit.xsd checks (written
// for this project to the structure of the common Jenkins junit-10.xsd, see mutations/schema/README.md):
// <testsuites> > <testsuite name tests failures errors skipped time> > <testcase name classname time>
// with at most one of <failure>, <error>, <skipped>, then an optional <system-out>.
#pragma once
#include <string>
#include <vector>

namespace kvgate::harness {

struct JUnitCase {
  enum class Result { passed, failure, error, skipped };
  std::string name, classname;
  double seconds = 0;
  Result result = Result::passed;
  std::string message;     // the failure / error / skipped element's message attribute
  std::string type;        // its type attribute ("failed", "survived", ...)
  std::string text;        // its body (the gate's output, the killing gates, ...)
  std::string system_out;  // <system-out> ("" : none)
};

// Text with &, <, >, " and ' escaped and characters XML 1.0 cannot hold (control characters other
// than tab, newline and carriage return) replaced by '?'.
std::string xml_escape(const std::string& s);

// One <testsuites> holding one <testsuite name=suite> with every case; the counts are computed.
std::string junit_xml(const std::string& suite, const std::vector<JUnitCase>& cases);

}  // namespace kvgate::harness
