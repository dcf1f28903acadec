#include "kvgate_harness/junit.hpp"

#include <cstdio>

namespace kvgate::harness {

std::string xml_escape(const std::string& s) {
  std::string r;
  r.reserve(s.size());
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '&': r += "&amp;"; break;
      case '<': r += "&lt;"; break;
      case '>': r += "&gt;"; break;
      case '"': r += "&quot;"; break;
      case '\'': r += "&apos;"; break;
      default: r += (c < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') ? '?' : ch;
    }
  }
  return r;
}

namespace {
std::string seconds_attr(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", s < 0 ? 0.0 : s);
  return buf;
}
const char* element_of(JUnitCase::Result r) {
  switch (r) {
    case JUnitCase::Result::failure: return "failure";
    case JUnitCase::Result::error: return "error";
    case JUnitCase::Result::skipped: return "skipped";
    case JUnitCase::Result::passed: return "";
  }
  return "";
}
}  // namespace

std::string junit_xml(const std::string& suite, const std::vector<JUnitCase>& cases) {
  int failures = 0, errors = 0, skipped = 0;
  double total = 0;
  for (const auto& c : cases) {
    failures += c.result == JUnitCase::Result::failure;
    errors += c.result == JUnitCase::Result::error;
    skipped += c.result == JUnitCase::Result::skipped;
    total += c.seconds;
  }
  const std::string counts = " tests=\"" + std::to_string(cases.size()) + "\" failures=\"" + std::to_string(failures) +
                             "\" errors=\"" + std::to_string(errors) + "\"";
  std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"" + xml_escape(suite) + "\"" + counts +
                  " time=\"" + seconds_attr(total) + "\">\n";
  x += "  <testsuite name=\"" + xml_escape(suite) + "\"" + counts + " skipped=\"" + std::to_string(skipped) +
       "\" time=\"" + seconds_attr(total) + "\">\n";
  for (const auto& c : cases) {
    x += "    <testcase name=\"" + xml_escape(c.name) + "\" classname=\"" + xml_escape(c.classname) + "\" time=\"" +
         seconds_attr(c.seconds) + "\"";
    if (c.result == JUnitCase::Result::passed && c.system_out.empty()) {
      x += "/>\n";
      continue;
    }
    x += ">\n";
    if (c.result != JUnitCase::Result::passed) {
      const std::string el = element_of(c.result);
      x += "      <" + el + " message=\"" + xml_escape(c.message) + "\"" +
           (c.type.empty() ? std::string() : " type=\"" + xml_escape(c.type) + "\"") + ">" + xml_escape(c.text) + "</" +
           el + ">\n";
    }
    if (!c.system_out.empty()) x += "      <system-out>" + xml_escape(c.system_out) + "</system-out>\n";
    x += "    </testcase>\n";
  }
  x += "  </testsuite>\n</testsuites>\n";
  return x;
}

}  // namespace kvgate::harness
