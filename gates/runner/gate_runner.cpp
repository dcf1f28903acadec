#include "gate_runner.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <cstring>
#include <stdexcept>

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

namespace {

std::string unescape(std::string s) {
  const std::pair<const char*, const char*> ents[] = {{"&quot;", "\""}, {"&apos;", "'"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&amp;", "&"}};
  for (const auto& [from, to] : ents)
    for (std::size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + 1)) s.replace(p, std::strlen(from), to);
  return s;
}

std::string attr(const std::string& tag, const std::string& key) {
  const std::regex re(key + "=\"([^\"]*)\"");
  std::smatch m;
  return std::regex_search(tag, m, re) ? unescape(m[1].str()) : std::string{};
}

}  // namespace

std::vector<GateResult> parse_catch_xml(const std::string& xml, const std::string& executable) {
  std::vector<GateResult> out;
  std::size_t pos = 0;
  while ((pos = xml.find("<TestCase ", pos)) != std::string::npos) {
    const std::size_t head_end = xml.find('>', pos);
    const std::size_t end = xml.find("</TestCase>", pos);
    if (head_end == std::string::npos || end == std::string::npos) break;
    const std::string head = xml.substr(pos, head_end - pos);
    const std::string body = xml.substr(head_end, end - head_end);
    GateResult r;
    r.name = attr(head, "name");
    r.id = r.name.substr(0, r.name.find(' '));
    r.executable = fs::path(executable).filename().string();
    const std::string tags = attr(head, "tags");
    static const std::regex tag_re("\\[(gate|fmt):([^\\]]+)\\]");
    for (auto it = std::sregex_iterator(tags.begin(), tags.end(), tag_re); it != std::sregex_iterator(); ++it) {
      if ((*it)[1] == "gate") r.family = (*it)[2];
      else r.formats.push_back((*it)[2]);
    }
    const std::size_t res = body.find("<OverallResult ");
    const std::string res_tag = res == std::string::npos ? "" : body.substr(res, body.find('>', res) - res);
    const bool ok = attr(res_tag, "success") == "true";
    const std::string dur = attr(res_tag, "durationInSeconds");
    r.seconds = dur.empty() ? 0 : std::stod(dur);
    // A gate that needs a device reports "SKIPPED: <reason>" as a warning and returns early.
    const std::size_t skip = body.find("SKIPPED:");
    if (ok && skip != std::string::npos) {
      r.status = "skipped";
      r.message = body.substr(skip, body.find('\n', skip) - skip);
    } else {
      r.status = ok ? "passed" : "failed";
      if (!ok) {
        const std::size_t f = body.find("<Original>");
        if (f != std::string::npos) r.message = unescape(body.substr(f + 10, body.find("</Original>", f) - f - 10));
        r.message.erase(0, r.message.find_first_not_of(" \n"));
        r.message.erase(r.message.find_last_not_of(" \n") + 1);
      }
    }
    out.push_back(std::move(r));
    pos = end;
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
    gates.push_back({{"id", r.id}, {"name", r.name}, {"family", r.family}, {"formats", r.formats},
                     {"executable", r.executable}, {"status", r.status}, {"message", r.message}, {"seconds", r.seconds}});
  }
  return {{"totals", totals}, {"per_format", per_format}, {"gates", gates}};
}

}  // namespace kvgate::gates
