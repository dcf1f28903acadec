// Unit tests of the harness library (mutations/harness): the one Catch2 XML reader and the gate
// runner's view of it (kvgate gate, kvgate signoff and kvgate mutate all read gate results here).
#include <string>

#include "catch_compat.hpp"
#include "kvgate_harness/catch_xml.hpp"
#include "kvgate_harness/gate_runner.hpp"

namespace {

// What a gate program prints with `-r xml -d yes` (Catch2 2.13 layout). Catch2 escapes '<' and
// '&' in attribute values but not '>', so a test case named "... FP8 -> fp8" carries a bare '>'
// inside its name attribute.
const char* kArrowXml = R"xml(<?xml version="1.0" encoding="UTF-8"?>
<Catch name="gate_resolve">
  <Group name="gate_resolve">
    <TestCase name="STO.resolve.precedence.values FP8 -> fp8, INT8 -> int8" tags="[fmt:fp8][fmt:int8][gate:STO]" filename="a.cpp" line="3">
      <Expression success="false" type="CHECK" filename="a.cpp" line="9">
        <Original>
          resolve("FP8") == "fp8"
        </Original>
        <Expanded>
          "f16" == "fp8"
        </Expanded>
      </Expression>
      <OverallResult success="false" durationInSeconds="0.125"/>
    </TestCase>
    <TestCase name="ENV.int8 every element &lt;= s/2 (a > b)" tags="[fmt:int8][gate:ENV]" filename="a.cpp" line="1">
      <OverallResult success="true" durationInSeconds="0.5"/>
    </TestCase>
  </Group>
  <OverallResults successes="1" failures="1" expectedFailures="0"/>
</Catch>
)xml";

}  // namespace

TEST_CASE("gate runner: a quoted '>' in a test-case name keeps its ID, tags and result") {
  const auto r = kvgate::gates::parse_catch_xml(kArrowXml, "/x/build/gates/gate_resolve");
  REQUIRE(r.size() == 2);
  CHECK(r[0].name == "STO.resolve.precedence.values FP8 -> fp8, INT8 -> int8");
  CHECK(r[0].id == "STO.resolve.precedence.values");
  CHECK(r[0].family == "STO");
  CHECK(r[0].formats == std::vector<std::string>{"fp8", "int8"});
  CHECK(r[0].status == "failed");  // the failure is credited to fp8 and int8, not lost
  CHECK(r[0].message == "resolve(\"FP8\") == \"fp8\"");
  CHECK(r[0].seconds == 0.125);
  CHECK(r[0].executable == "gate_resolve");
  CHECK(r[1].name == "ENV.int8 every element <= s/2 (a > b)");
  CHECK(r[1].id == "ENV.int8");
  CHECK(r[1].family == "ENV");
  CHECK(r[1].formats == std::vector<std::string>{"int8"});
  CHECK(r[1].status == "passed");
  auto s = kvgate::gates::summarize(r);
  CHECK(s["per_format"]["fp8"]["STO"]["failed"] == 1);
  CHECK(s["per_format"]["int8"]["STO"]["failed"] == 1);
  CHECK(s["per_format"]["int8"]["ENV"]["passed"] == 1);
  CHECK_FALSE(s["per_format"].contains("(any)"));
}

TEST_CASE("gate runner: skipped, crashed and FAIL()ed cases") {
  // Catch2 3: SKIP() is a passing OverallResult with skips="1"; Catch2 2: a passing case that WARNs
  // "SKIPPED: <reason>". A case with no OverallResult is where the program died. FAIL() reports a
  // Failure element, not an Expression.
  const char* xml = R"xml(<Catch2TestRun name="gate_cuda">
<TestCase name="ORA.cuda.store.f16 bytes" tags="[fmt:f16][gate:ORA][cuda]" filename="a" line="1">
<OverallResult success="true" skips="1" durationInSeconds="0.001"/></TestCase>
<TestCase name="ORA.cuda.store.int8 bytes" tags="[fmt:int8][gate:ORA][cuda]" filename="a" line="2">
  <Warning>
    SKIPPED: no CUDA device
  </Warning>
  <OverallResult success="true" durationInSeconds="0.001"/>
</TestCase>
<TestCase name="ENV.q4_0 fail" tags="[fmt:q4_0][gate:ENV]" filename="a" line="3">
  <Expression success="true" type="CHECK"><Original>fine()</Original></Expression>
  <Failure filename="a" line="4">
    bound 0.5 &lt; error 0.75
  </Failure>
  <OverallResult success="false" durationInSeconds="0.001"/>
</TestCase>
<TestCase name="ENV.fp8 dies" tags="[fmt:fp8][gate:ENV]" filename="a" line="5">
  <Expression success="true" type="CHECK"><Original>a</Original></Expression>
)xml";
  const auto r = kvgate::gates::parse_catch_xml(xml, "gate_cuda");
  REQUIRE(r.size() == 4);
  CHECK(r[0].status == "skipped");
  CHECK(r[0].family == "ORA");
  CHECK(r[1].status == "skipped");
  CHECK(r[1].message == "SKIPPED: no CUDA device");
  CHECK(r[2].status == "failed");
  CHECK(r[2].message == "bound 0.5 < error 0.75");
  CHECK(r[3].id == "ENV.fp8");
  CHECK(r[3].status == "failed");  // died inside the case: red, credited to fp8
  CHECK(r[3].formats == std::vector<std::string>{"fp8"});
  // The same reader, as `kvgate mutate` sees it.
  const auto c = kvgate::harness::parse_catch_xml(xml);
  REQUIRE(c.size() == 4);
  CHECK(c[2].failure == "bound 0.5 < error 0.75");
  CHECK_FALSE(c[3].has_result);
  CHECK(c[0].tags == "[fmt:f16][gate:ORA][cuda]");
}

TEST_CASE("gate runner: a failed gate's whole report reaches its JUnit <failure>, escaped") {
  auto r = kvgate::gates::parse_catch_xml(kArrowXml, "/x/build/gates/gate_resolve");
  REQUIRE(r.size() == 2);
  CHECK(r[0].output == "a.cpp:9: CHECK( resolve(\"FP8\") == \"fp8\" )  with expansion: \"f16\" == \"fp8\"");
  CHECK(r[1].output.empty());  // a passing case reports nothing
  r.push_back(r[1]);
  r.back().status = "skipped";
  r.back().message = "SKIPPED: no CUDA device";
  const std::string x = kvgate::gates::junit_of_gates(r);
  CHECK(x.find("<testsuites name=\"kvgate gate\" tests=\"3\" failures=\"1\" errors=\"0\"") != std::string::npos);
  CHECK(x.find("skipped=\"1\"") != std::string::npos);
  CHECK(x.find("classname=\"gate_resolve\"") != std::string::npos);
  // The expansion, with its quotes escaped, is the failure's text; '>' and '<' in the name are escaped.
  CHECK(x.find("with expansion: &quot;f16&quot; == &quot;fp8&quot;</failure>") != std::string::npos);
  CHECK(x.find("name=\"ENV.int8 every element &lt;= s/2 (a &gt; b)\"") != std::string::npos);
  CHECK(x.find("<skipped message=\"SKIPPED: no CUDA device\">") != std::string::npos);
  CHECK(x.find("<failure") == x.rfind("<failure"));  // one failure element: the passing cases have none
}

TEST_CASE("catch_xml: a report cut inside a failed expression (the program died) is read, not looped over") {
  // A heap-corrupting mutant killed gate_storage while Catch2 wrote an <Expression>: the reader's
  // scan wrapped from the end of the text to its start and the mutation driver spun forever.
  const std::string xml =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Catch name=\"g\">\n  <Group name=\"g\">\n"
      "    <TestCase name=\"STO.errors impossible requests fail\" tags=\"[gate:STO]\" filename=\"s.cpp\" line=\"1\">\n"
      "      <Expression success=\"false\" type=\"CHECK\" filename=\"s.cpp\" line=\"2\">\n"
      "        <Original>\n          a == 10\n        </Original>\n";
  const auto cases = kvgate::harness::parse_catch_xml(xml);
  REQUIRE(cases.size() == 1);
  CHECK(cases[0].name == "STO.errors impossible requests fail");
  CHECK_FALSE(cases[0].has_result);  // no OverallResult: the driver calls it a crash
  CHECK(cases[0].output.find("a == 10") != std::string::npos);
}
