#include "kvgate_harness/gate_runner.hpp"
#include "kvgate_harness/junit.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <stdexcept>

#include "kvgate_harness/catch_xml.hpp"

namespace kvgate::gates {

namespace fs = std::filesystem;

std::vector<std::string> list_gate_executables(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto fn = e.path().filename().string();
    if (fn.rfind("gate_", 0) != 0 || !e.is_regular_file()) continue;
    if ((fs::status(e.path()).permissions() & fs::perms::owner_exec) == fs::perms::none) continue;
    out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<GateResult> parse_catch_xml(const std::string& xml, const std::string& executable) {
  std::vector<GateResult> out;
  static const std::regex tag_re("\\[(gate|fmt):([^\\]]+)\\]");
  for (const harness::CaseResult& c : harness::parse_catch_xml(xml)) {
    GateResult r;
    r.name = c.name;
    r.id = harness::gate_id_of(c.name);
    r.executable = fs::path(executable).filename().string();
    for (auto it = std::sregex_iterator(c.tags.begin(), c.tags.end(), tag_re); it != std::sregex_iterator(); ++it) {
      if ((*it)[1] == "gate") r.family = (*it)[2];
      else r.formats.push_back((*it)[2]);
    }
    r.seconds = c.seconds;
    if (!c.has_result) {
      r.status = "failed";
      r.message = "no result: the gate program died inside this test case";
      r.output = c.output;
    } else if (c.skipped) {
      r.status = "skipped";
      r.message = c.skip_reason.empty() ? "SKIPPED" : "SKIPPED: " + c.skip_reason;
    } else {
      r.status = c.success ? "passed" : "failed";
      if (!c.success) r.message = c.failure;
      r.output = c.output;
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<GateResult> run_gates(const GateRunOptions& opt, bool show_progress) {
  const auto exes = list_gate_executables(opt.gates_dir);
  if (exes.empty())
    throw std::runtime_error("no gate executables (gate_*) in '" + opt.gates_dir +
                             "': build the project first (cmake --build build) or pass --gates-dir");
  std::vector<GateResult> all;
  for (const auto& exe : exes) {
    if (show_progress) std::fprintf(stderr, "kvgate gate: running %s\n", fs::path(exe).filename().c_str());
    std::string cmd = "'" + exe + "' -r xml -d yes";
    if (!opt.tag_filter.empty()) cmd += " '" + opt.tag_filter + "'";
    cmd += " 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("cannot start " + exe);
    std::string xml;
    std::array<char, 65536> buf{};
    std::size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) xml.append(buf.data(), n);
    const int rc = pclose(p);
    auto results = parse_catch_xml(xml, exe);
    if (results.empty() && rc != 0 && xml.find("<TestCase") == std::string::npos && !opt.tag_filter.empty()) {
      continue;  // the filter matched nothing in this executable
    }
    if (rc != 0 && std::none_of(results.begin(), results.end(), [](const GateResult& r) { return r.status == "failed"; })) {
      // The program failed without a failing test case (crash, abort): count it as a failed gate.
      GateResult r;
      r.id = fs::path(exe).filename().string();
      r.name = r.id + " (process)";
      r.executable = r.id;
      r.status = "failed";
      r.message = "gate program exited with status " + std::to_string(rc) + " outside any test case (crash?)";
      results.push_back(r);
    }
    for (auto& r : results) {
      if (!opt.families.empty() && std::find(opt.families.begin(), opt.families.end(), r.family) == opt.families.end())
        continue;
      all.push_back(std::move(r));
    }
  }
  return all;
}

}  // namespace kvgate::gates

const std::vector<kvgate::records::Field<kvgate::gates::GateResult>>&
kvgate::records::FieldTable<kvgate::gates::GateResult>::fields() {
  using R = kvgate::gates::GateResult;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, id, string, true, "stable gate ID: the first token of the test-case name"),
      KVGATE_FIELD(R, name, string, true, "the full test-case name"),
      KVGATE_FIELD(R, family, string, true, "from the [gate:FAMILY] tag"),
      KVGATE_FIELD(R, formats, array, true, "from the [fmt:NAME] tags"),
      KVGATE_FIELD(R, executable, string, true, "the gate program that ran it"),
      KVGATE_FIELD(R, status, string, true, "passed, failed or skipped"),
      KVGATE_FIELD(R, message, string, true, "the first failure or the skip reason"),
      KVGATE_FIELD(R, seconds, number, true, "its duration"),
  };
  return f;
}

namespace kvgate::gates {

nlohmann::json summarize(const std::vector<GateResult>& results) {
  nlohmann::json per_format = nlohmann::json::object();
  nlohmann::json totals = {{"passed", 0}, {"failed", 0}, {"skipped", 0}};
  nlohmann::json gates = nlohmann::json::array();
  for (const auto& r : results) {
    totals[r.status] = totals[r.status].get<int>() + 1;
    std::vector<std::string> fmts = r.formats.empty() ? std::vector<std::string>{"(any)"} : r.formats;
    for (const auto& f : fmts) {
      auto& cell = per_format[f][r.family.empty() ? "?" : r.family];
      if (cell.is_null()) cell = {{"passed", 0}, {"failed", 0}, {"skipped", 0}};
      cell[r.status] = cell[r.status].get<int>() + 1;
    }
    gates.push_back(records::to_json(r));
  }
  return {{"totals", totals}, {"per_format", per_format}, {"gates", gates}};
}

std::string junit_of_gates(const std::vector<GateResult>& results) {
  std::vector<harness::JUnitCase> cases;
  for (const auto& r : results) {
    harness::JUnitCase c;
    c.name = r.name;
    c.classname = r.executable;
    c.seconds = r.seconds;
    if (r.status == "failed") {
      c.result = harness::JUnitCase::Result::failure;
      c.type = "failed";
      c.message = r.message.empty() ? "gate " + r.id + " failed" : r.message;
      c.text = "gate " + r.id + " (" + r.executable + ") failed: " + r.name + "\n" +
               (r.output.empty() ? r.message : r.output);
    } else if (r.status == "skipped") {
      c.result = harness::JUnitCase::Result::skipped;
      c.message = r.message;
    }
    cases.push_back(std::move(c));
  }
  return harness::junit_xml("kvgate gate", cases);
}

}  // namespace kvgate::gates
