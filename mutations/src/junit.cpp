#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <ostream>

#include "kvgate_harness/junit.hpp"
#include "kvgate_mutations/ci.hpp"

namespace kvgate::mutate {

namespace fs = std::filesystem;
using harness::JUnitCase;

namespace {

std::string joined(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

JUnitCase case_of(const MutantOutcome& mo) {
  const Mutant& m = *mo.mutant;
  JUnitCase c;
  c.name = m.id;
  c.classname = m.file;
  c.seconds = mo.wall_s;
  const std::string expected = m.expect_killed_by.empty() ? "(none named)" : joined(m.expect_killed_by);
  switch (mo.status) {
    case MutantStatus::killed: {
      std::string kb;
      for (const auto& k : mo.killed_by) {
        const auto it = mo.killed_in.find(k);
        kb += (kb.empty() ? "" : ", ") + k;
        if (it != mo.killed_in.end() && !(it->second.size() == 1 && it->second[0] == "default"))
          kb += " [" + joined(it->second, ",") + "]";
      }
      c.system_out = "killed by: " + kb + "\n" + m.description;
      if (!mo.expected_not_killing.empty())
        c.system_out += "\nexpected killers that stayed green: " + joined(mo.expected_not_killing);
      break;
    }
    case MutantStatus::survived:
    case MutantStatus::timeout: {
      c.result = JUnitCase::Result::failure;
      c.type = to_string(mo.status);
      c.message = std::string(to_string(mo.status)) + ": " + mo.reason;
      std::vector<std::string> green, timed_out;
      for (const auto& [id, g] : mo.gates) {
        if (g.status == GateStatus::passed) green.push_back(id);
        if (g.status == GateStatus::timeout) timed_out.push_back(id);
      }
      c.text = m.id + " (" + m.file + "): " + m.description + "\nkilled by: none\nexpected killers: " + expected +
               "\ngates that stayed green: " + (green.empty() ? "none" : joined(green)) +
               (timed_out.empty() ? "" : "\ngates that timed out: " + joined(timed_out));
      break;
    }
    case MutantStatus::unviable:
    case MutantStatus::noop:
      c.result = JUnitCase::Result::error;
      c.type = to_string(mo.status);
      c.message = std::string(to_string(mo.status)) + ": " + mo.reason;
      c.text = m.id + " (" + m.file + "): " + m.description + "\n" + mo.reason +
               (mo.build_log.empty() ? "" : "\nbuild log: " + mo.build_log);
      break;
    case MutantStatus::skipped:
    case MutantStatus::interrupted:
      c.result = JUnitCase::Result::skipped;
      c.message = mo.status == MutantStatus::interrupted ? "interrupted" : mo.reason;
      break;
  }
  return c;
}

// GitHub's workflow-command escaping: % CR LF in the message, and also : , in properties.
std::string gh_escape(const std::string& s, bool property) {
  std::string r;
  for (const char c : s) {
    if (c == '%') r += "%25";
    else if (c == '\r') r += "%0D";
    else if (c == '\n') r += "%0A";
    else if (property && c == ':') r += "%3A";
    else if (property && c == ',') r += "%2C";
    else r += c;
  }
  return r;
}

// The first line of the mutant's anchor in the unmutated file (1 when it cannot be read).
int anchor_line(const Mutant& m, const ReportContext& ctx) {
  std::string src;
  for (const fs::path& root : {ctx.files_root, ctx.source_dir}) {
    if (root.empty() || !src.empty()) continue;
    try {
      src = read_text(root / m.file);
    } catch (...) {
    }
  }
  return std::max(1, anchor_span(src, m.anchor).start.line);
}

bool annotated(const MutantOutcome& mo) {
  return mo.status == MutantStatus::survived || mo.status == MutantStatus::timeout;
}

std::string counts(const RunResult& r) {
  return std::to_string(r.summary.run()) + " mutants: " + std::to_string(r.summary.killed) + " killed, " +
         std::to_string(r.summary.survived) + " survived, " + std::to_string(r.summary.timeout) + " timeout, " +
         std::to_string(r.summary.unviable) + " unviable, " + std::to_string(r.summary.noop) + " noop, " +
         std::to_string(r.summary.skipped) + " skipped; exit " + std::to_string(r.exit_code);
}

}  // namespace

std::string junit_of_mutants(const RunResult& r) {
  std::vector<JUnitCase> cases;
  if (r.canary_ran && r.canary.mutant) {
    JUnitCase c = case_of(r.canary);
    c.classname = "canary";
    if (!r.canary_survivors.empty()) {  // a canary must turn every gate red
      c.result = JUnitCase::Result::failure;
      c.type = "canary";
      c.message = "the canary left gates green: " + joined(r.canary_survivors);
      c.text = c.message + "\nthose gates do not run the code the driver mutates";
    }
    cases.push_back(std::move(c));
  }
  for (const auto& mo : r.outcomes) cases.push_back(case_of(mo));
  return harness::junit_xml("kvgate mutate", cases);
}

std::string github_annotations(const RunResult& r, const ReportContext& ctx) {
  std::string out;
  for (const auto& mo : r.outcomes) {
    if (!annotated(mo)) continue;
    const Mutant& m = *mo.mutant;
    const std::string title = "mutant " + m.id + " " + to_string(mo.status);
    const std::string msg = m.description + " -- no gate failed (" + mo.reason + "); expected killers: " +
                            (m.expect_killed_by.empty() ? std::string("none named") : joined(m.expect_killed_by));
    out += "::error file=" + gh_escape(m.file, true) + ",line=" + std::to_string(anchor_line(m, ctx)) + ",title=" +
           gh_escape(title, true) + "::" + gh_escape(msg, false) + "\n";
  }
  return out + "::notice title=kvgate mutate::" + gh_escape(counts(r), false) + "\n";
}

std::string github_step_summary(const RunResult& r, const ReportContext& ctx) {
  std::string md = "### kvgate mutate\n\n" + counts(r) + "\n";
  bool any = false;
  for (const auto& mo : r.outcomes) {
    if (!annotated(mo)) continue;
    if (!any) md += "\n| mutant | status | where | expected killers |\n|---|---|---|---|\n";
    any = true;
    const Mutant& m = *mo.mutant;
    md += "| `" + m.id + "` | " + to_string(mo.status) + " | `" + m.file + ":" + std::to_string(anchor_line(m, ctx)) +
          "` | " + (m.expect_killed_by.empty() ? std::string("none named") : joined(m.expect_killed_by)) + " |\n";
  }
  return md;
}

void write_ci_outputs(const RunResult& r, const ReportContext& ctx, std::ostream& out, std::ostream& log) {
  if (!ctx.opts.junit.empty()) {
    try {
      write_text(ctx.opts.junit, junit_of_mutants(r));
    } catch (const std::exception& ex) {
      log << "kvgate mutate: error writing the JUnit file: " << ex.what() << "\n";
    }
  }
  if (ctx.opts.format != "github") return;
  out << github_annotations(r, ctx) << std::flush;
  if (const char* summary = std::getenv("GITHUB_STEP_SUMMARY"); summary && *summary) {
    std::ofstream f(summary, std::ios::app);  // the runner's file: appended to, as every step does
    f << github_step_summary(r, ctx);
    if (!f) log << "kvgate mutate: warning: cannot append to GITHUB_STEP_SUMMARY=" << summary << "\n";
  }
}

}  // namespace kvgate::mutate
