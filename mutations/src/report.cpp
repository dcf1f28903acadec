#include "kvgate_mutations/report.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <ostream>
#include <sstream>

#include "kvgate_mutations/json_schema.hpp"

namespace kvgate::mutate {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double round3(double x) { return std::round(x * 1000.0) / 1000.0; }

records::GateCell gate_cell(const GateOutcome& g) {
  return {to_string(g.status), round3(g.seconds), g.log, g.detail, g.variant};
}

records::MutantRecord mutant_record(const MutantOutcome& mo) {
  const Mutant& m = *mo.mutant;
  records::MutantRecord r;
  r.id = m.id;
  r.category = m.category;
  r.file = m.file;
  r.description = m.description;
  r.status = to_string(mo.status);
  r.reason = mo.reason;
  r.killed_by = mo.killed_by;
  r.expect_killed_by = m.expect_killed_by;
  r.expected_not_killing = mo.expected_not_killing;
  r.expected_unknown = mo.expected_unknown;
  r.killed_in = mo.killed_in;
  r.build_s = round3(mo.build_s);
  r.test_s = round3(mo.test_s);
  r.wall_s = round3(mo.wall_s);
  r.diff = mo.diff_path;
  r.build_log = mo.build_log;
  r.changed_objects = mo.changed_objects;
  r.path = mo.path;
  r.path_reason = mo.path_reason;
  r.compiled_ahead = mo.compiled_ahead;
  for (const auto& [id, g] : mo.gates) r.gates[id] = gate_cell(g);
  return r;
}

double median_wall(const RunResult& r) {
  std::vector<double> w;
  for (const auto& mo : r.outcomes)
    if (mo.status != MutantStatus::skipped) w.push_back(mo.wall_s);
  std::sort(w.begin(), w.end());
  return w.empty() ? 0 : w[w.size() / 2];
}

std::map<std::string, int> kills_per_gate(const RunResult& r) {
  std::map<std::string, int> k;
  for (const auto& g : r.gates) k[g.id] = 0;
  for (const auto& mo : r.outcomes)
    for (const auto& id : mo.killed_by) ++k[id];
  return k;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string r = "\"";
  for (char c : s) {
    if (c == '"') r += '"';
    r += c;
  }
  return r + "\"";
}

std::string md_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '|') r += "\\|";
    else if (c == '\n') r += ' ';
    else r += c;
  }
  return r;
}

std::string fixed(double x, int prec) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(prec) << x;
  return o.str();
}

// " [no_avx2]" when the gate killed the mutant only in variants other than the default one.
std::string variant_note(const MutantOutcome& mo, const std::string& gate) {
  const auto it = mo.killed_in.find(gate);
  if (it == mo.killed_in.end() || it->second.empty() ||
      std::find(it->second.begin(), it->second.end(), "default") != it->second.end())
    return "";
  std::string v;
  for (const auto& x : it->second) v += (v.empty() ? "" : ",") + x;
  return " [" + v + "]";
}

const char* stryker_status(MutantStatus s) {
  switch (s) {
    case MutantStatus::killed: return "Killed";
    case MutantStatus::survived: return "Survived";
    case MutantStatus::timeout: return "Timeout";
    case MutantStatus::unviable: return "CompileError";
    case MutantStatus::noop: return "Ignored";
    case MutantStatus::skipped: return "Ignored";
    case MutantStatus::interrupted: return "Pending";
  }
  return "Pending";
}

char status_letter(MutantStatus s) {
  switch (s) {
    case MutantStatus::killed: return 'k';
    case MutantStatus::survived: return 'S';
    case MutantStatus::timeout: return 'T';
    case MutantStatus::unviable: return 'U';
    case MutantStatus::noop: return 'N';
    case MutantStatus::skipped: return '-';
    case MutantStatus::interrupted: return '?';
  }
  return '?';
}

}  // namespace

char matrix_cell(GateStatus s) {
  switch (s) {
    case GateStatus::passed: return '.';
    case GateStatus::failed: return 'K';
    case GateStatus::crashed: return 'C';
    case GateStatus::timeout: return 'T';
    case GateStatus::not_run: return '-';
    case GateStatus::skipped: return 's';
  }
  return '?';
}

records::OutcomesRecord outcomes_record(const RunResult& r, const ReportContext& ctx) {
  records::OutcomesRecord o;
  o.started_at = r.started_at;
  o.source_dir = ctx.source_dir.string();
  o.scratch_dir = ctx.files_root.string();
  o.catalog = ctx.catalog_path;
  o.options = {ctx.opts.only, ctx.opts.gate_targets, ctx.opts.since, std::max(1, ctx.opts.jobs),
               ctx.opts.min_timeout_s, ctx.opts.timeout_factor, ctx.opts.canary};
  o.full_run = r.full_run;
  o.interrupted = r.interrupted;
  o.exit_code = r.exit_code;
  for (const auto& v : r.variants) o.variants.push_back({v.name, {v.env.begin(), v.env.end()}});
  if (o.variants.empty()) o.variants.push_back({"default", {}});
  o.baseline.green = r.baseline_green;
  o.baseline.red = r.baseline_red;
  o.baseline.build_s = round3(r.baseline_build_s);
  o.baseline.test_s = round3(r.baseline_test_s);
  for (const auto& x : r.exes)
    o.baseline.executables.push_back({x.target, x.path.string(), round3(x.baseline_s), x.gate_ids,
                                      x.variants.empty() ? std::vector<std::string>{"default"} : x.variants});
  for (const auto& g : r.gates) o.baseline.gates.push_back({g.id, g.exe, g.cases, round3(g.baseline_s), g.skipped});
  if (r.canary_ran) o.canary = mutant_record(r.canary);
  o.canary_survivors = r.canary_survivors;
  const double mpm = r.mutation_s > 0 ? r.summary.run() * 60.0 / r.mutation_s : 0;
  o.summary = {r.summary.run(),   r.summary.killed,     r.summary.survived,        r.summary.timeout,
               r.summary.unviable, r.summary.noop,      r.summary.skipped,         round3(r.mutation_s),
               round3(r.setup_s), round3(median_wall(r)), round3(mpm)};
  for (const auto& mo : r.outcomes) o.mutants.push_back(mutant_record(mo));
  for (const auto& [id, n] : kills_per_gate(r)) o.kills_per_gate[id] = n;
  o.gates_killing_none = r.gates_killing_none;
  o.check_failures = r.check_failures;
  o.shard = r.shard;
  return o;
}

json outcomes_json(const RunResult& r, const ReportContext& ctx) {
  return records::outcomes_document(outcomes_record(r, ctx));
}

std::string kill_matrix_csv(const RunResult& r) {
  std::string s = "mutant,category,file,status,wall_s";
  for (const auto& g : r.gates) {
    s += ",";
    s += csv_field(g.id);
  }
  s += "\n";
  for (const auto& mo : r.outcomes) {
    s += csv_field(mo.mutant->id) + "," + csv_field(mo.mutant->category) + "," + csv_field(mo.mutant->file) + "," +
         to_string(mo.status) + "," + fixed(mo.wall_s, 2);
    for (const auto& g : r.gates) {
      const auto it = mo.gates.find(g.id);
      s += ",";
      s += it == mo.gates.end() ? '-' : matrix_cell(it->second.status);
    }
    s += "\n";
  }
  return s;
}

std::string kill_matrix_md(const RunResult& r) {
  std::ostringstream o;
  const auto kills = kills_per_gate(r);
  o << "# Kill matrix\n\n";
  o << "Run " << r.started_at << (r.full_run ? " (full catalog)" : " (partial: --only/--since/--expected-gates-only/--bail)")
    << (r.interrupted ? ", **interrupted**" : "") << ". Exit code **" << r.exit_code << "**.\n\n";
  o << "**" << r.summary.run() << " mutants**: " << r.summary.killed << " killed, " << r.summary.survived
    << " survived, " << r.summary.timeout << " timeout, " << r.summary.unviable << " unviable, " << r.summary.noop
    << " noop" << (r.summary.skipped ? ", " + std::to_string(r.summary.skipped) + " skipped" : "") << ". "
    << r.gates.size() << " gates. Median " << fixed(median_wall(r), 1) << " s per mutant (rebuild + all gates)";
  if (r.mutation_s > 0) o << ", " << fixed(r.summary.run() * 60.0 / r.mutation_s, 1) << " mutants/min";
  if (r.exes.empty() && r.baseline_red.empty() && r.summary.run() == 0)
    o << ". Baseline: not run (no selected mutant can run here, nothing was built).";
  else
    o << ". Baseline: build " << fixed(r.baseline_build_s, 1) << " s, gates " << fixed(r.baseline_test_s, 1)
      << " s" << (r.baseline_green ? "" : ", **RED**") << ".";
  if (r.canary_ran)
    o << " Canary `" << r.canary.mutant->id << "`: "
      << (r.canary_survivors.empty() ? "every gate red" : "left gates green") << ".";
  o << "\n\n";
  if (r.variants.size() > 1) {
    o << "Environment variants (each gate program runs in `default` and in every variant its ctest has): ";
    for (std::size_t i = 0; i < r.variants.size(); ++i) {
      o << (i ? "; " : "") << "`" << r.variants[i].name << "`";
      for (const auto& [k, v] : r.variants[i].env) o << " " << k << "=" << v;
      std::string progs;
      for (const auto& x : r.exes)
        if (std::find(x.variants.begin(), x.variants.end(), r.variants[i].name) != x.variants.end())
          progs += (progs.empty() ? "" : ", ") + x.target;
      if (r.variants[i].name != "default") o << " (" << progs << ")";
    }
    o << ". A kill in a variant other than `default` is marked `[variant]` in the Mutants table.\n\n";
  }
  o << "Cells: `K` killed (a test case of the gate failed), `C` killed by a crash, `T` timeout, `.` passed (the "
       "mutant survived this gate), `-` not run (the mutant was unviable, noop or skipped), `s` skipped. Mutant "
       "status: `k` killed, `S` survived, `T` timeout, `U` unviable, `N` noop, `-` skipped.\n\n";
  if (!r.check_failures.empty() || !r.canary_survivors.empty() || !r.baseline_red.empty()) {
    o << "## Problems\n\n";
    for (const auto& f : r.baseline_red) o << "- baseline not green: `" << f << "`\n";
    for (const auto& f : r.canary_survivors) o << "- the canary left `" << f << "` green\n";
    for (const auto& f : r.check_failures) o << "- " << md_escape(f) << "\n";
    for (const auto& mo : r.outcomes)
      if (mo.status != MutantStatus::killed && mo.status != MutantStatus::skipped)
        o << "- `" << mo.mutant->id << "` " << to_string(mo.status) << ": " << md_escape(mo.reason) << "\n";
    o << "\n";
  }
  {
    // Why mutants did not run (requires: a CUDA build, a CUDA device): not a problem, but say it.
    bool any = false;
    for (const auto& mo : r.outcomes)
      if (mo.status == MutantStatus::skipped) {
        if (!any) o << "## Skipped\n\n";
        any = true;
        o << "- `" << mo.mutant->id << "`: " << md_escape(mo.reason) << "\n";
      }
    if (any) o << "\n";
  }
  // Gates as rows, mutants as numbered columns (M1..Mn, named in the Mutants table): a catalog has
  // far fewer mutants than there are gate IDs, so this stays readable.
  o << "## Matrix\n\nRows are gate IDs, columns the mutants M1..M" << r.outcomes.size()
    << " of the table below; the last column counts the mutants each gate killed.\n\n| gate |";
  for (std::size_t i = 0; i < r.outcomes.size(); ++i) o << " M" << i + 1 << " |";
  o << " kills |\n|---|";
  for (std::size_t i = 0; i < r.outcomes.size(); ++i) o << ":-:|";
  o << "--:|\n| *mutant status* |";
  for (const auto& mo : r.outcomes) o << " " << status_letter(mo.status) << " |";
  o << " |\n";
  for (const auto& g : r.gates) {
    o << "| " << md_escape(g.id) << " |";
    for (const auto& mo : r.outcomes) {
      const auto it = mo.gates.find(g.id);
      o << " " << (it == mo.gates.end() ? '-' : matrix_cell(it->second.status)) << " |";
    }
    o << " " << (g.skipped ? std::string("skipped") : std::to_string(kills.at(g.id))) << " |\n";
  }
  o << "\n## Mutants\n\n| # | mutant | category | file | status | killed by | expected | build s | gates s | wall s |\n"
       "|---|---|---|---|---|---|---|--:|--:|--:|\n";
  int num = 0;
  for (const auto& mo : r.outcomes) {
    std::string kb, ex;
    for (const auto& k : mo.killed_by) kb += (kb.empty() ? "" : ", ") + k + variant_note(mo, k);
    for (const auto& k : mo.mutant->expect_killed_by) {
      const bool miss = std::find(mo.expected_not_killing.begin(), mo.expected_not_killing.end(), k) !=
                        mo.expected_not_killing.end();
      const bool unk =
          std::find(mo.expected_unknown.begin(), mo.expected_unknown.end(), k) != mo.expected_unknown.end();
      ex += (ex.empty() ? "" : ", ") + k + (miss ? " (**not killed**)" : unk ? " (not in run)" : "");
    }
    o << "| M" << ++num << " | `" << mo.mutant->id << "` | " << mo.mutant->category << " | `" << mo.mutant->file << "` | "
      << to_string(mo.status) << " | " << kb << " | " << ex << " | " << fixed(mo.build_s, 1) << " | "
      << fixed(mo.test_s, 1) << " | " << fixed(mo.wall_s, 1) << " |\n";
  }
  o << "\n## Gates\n\n| gate | executable | baseline s | mutants killed |\n|---|---|--:|--:|\n";
  for (const auto& g : r.gates)
    o << "| " << md_escape(g.id) << " | " << g.exe << " | " << fixed(g.baseline_s, 2) << " | "
      << (g.skipped ? std::string("skipped") : std::to_string(kills.at(g.id))) << " |\n";
  if (!r.gates_killing_none.empty()) {
    o << "\nGates that killed no mutant" << (r.full_run ? "" : " (partial run, informational)") << ": ";
    for (std::size_t i = 0; i < r.gates_killing_none.size(); ++i)
      o << (i ? ", " : "") << "`" << r.gates_killing_none[i] << "`";
    o << "\n";
  }
  return o.str();
}

json stryker_report(const RunResult& r, const ReportContext& ctx) {
  json files = json::object();
  std::vector<std::string> all_gates;
  for (const auto& g : r.gates) all_gates.push_back(g.id);
  for (const auto& mo : r.outcomes) {
    const Mutant& m = *mo.mutant;
    if (!files.contains(m.file)) {
      std::string src;
      try {
        src = read_text(ctx.files_root / m.file);
      } catch (...) {
        try {
          src = read_text(ctx.source_dir / m.file);
        } catch (...) {
        }
      }
      files[m.file] = {{"language", "cpp"}, {"source", src}, {"mutants", json::array()}};
    }
    const TextSpan sp = anchor_span(files[m.file]["source"].get<std::string>(), m.anchor);
    json mj{{"id", m.id},
            {"mutatorName", m.category},
            {"description", m.description},
            {"replacement", m.replacement},
            {"location",
             {{"start", {{"line", sp.start.line}, {"column", sp.start.column}}},
              {"end", {{"line", sp.end.line}, {"column", sp.end.column}}}}},
            {"status", stryker_status(mo.status)},
            {"duration", std::round(mo.wall_s * 1000.0)}};
    if (mo.status == MutantStatus::killed || mo.status == MutantStatus::survived ||
        mo.status == MutantStatus::timeout) {
      mj["killedBy"] = mo.killed_by;
      mj["coveredBy"] = all_gates;
      int completed = 0;
      for (const auto& [id, g] : mo.gates)
        completed += g.status == GateStatus::passed || g.status == GateStatus::failed ? 1 : 0;
      mj["testsCompleted"] = completed;
    }
    std::string reason = mo.reason;
    if (mo.status == MutantStatus::killed) {
      for (const auto& k : mo.killed_by) {
        const auto& g = mo.gates.at(k);
        reason += (reason.empty() ? "" : "; ") + k + ": " + (g.detail.empty() ? to_string(g.status) : g.detail);
      }
    }
    if (mo.status == MutantStatus::noop) reason = "noop: " + reason;
    if (!reason.empty()) mj["statusReason"] = reason;
    files[m.file]["mutants"].push_back(mj);
  }
  json test_files = json::object();
  for (const auto& x : r.exes) {
    json tests = json::array();
    for (const auto& id : x.gate_ids) {
      std::string name = id;
      for (const auto& g : r.gates)
        if (g.id == id && !g.cases.empty()) name = g.cases.front() + (g.cases.size() > 1 ? " (+" + std::to_string(g.cases.size() - 1) + " cases)" : "");
      tests.push_back({{"id", id}, {"name", name}});
    }
    test_files["gates/" + x.target] = {{"tests", tests}};
  }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return {{"schemaVersion", "2"},
          {"thresholds", {{"high", 100}, {"low", 95}}},
          {"projectRoot", ctx.source_dir.string()},
          {"files", files},
          {"testFiles", test_files},
          {"framework", {{"name", "kvgate mutate"}, {"version", "0.1.0"}}},
          {"performance",
           {{"setup", std::round(r.setup_s * 1000)},
            {"initialRun", std::round(r.baseline_test_s * 1000)},
            {"mutation", std::round(r.mutation_s * 1000)}}},
          {"system",
           {{"ci", std::getenv("CI") != nullptr},
            {"os", {{"platform", "linux"}}},
            {"cpu", {{"logicalCores", cores > 0 ? cores : 1}}}}},
          {"config",
           {{"catalog", ctx.catalog_path},
            {"only", ctx.opts.only},
            {"since", ctx.opts.since},
            {"exit_code", r.exit_code},
            {"full_run", r.full_run}}}};
}

std::string report_html(const json& stryker, const std::string& script) {
  std::string data = stryker.dump();
  // Inside <script>, "</" would end the element; "<\/" is the same JSON string.
  for (std::size_t p = data.find("</"); p != std::string::npos; p = data.find("</", p + 3)) data.replace(p, 2, "<\\/");
  std::string html =
      "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>kvgate mutation report</title>\n";
  if (script.empty()) {
    html +=
        "<!-- mutation-testing-elements was not vendored next to this page (see docs/MUTATIONS.md); loading it "
        "from unpkg -->\n<script "
        "src=\"https://www.unpkg.com/mutation-testing-elements@3.9.0/dist/mutation-test-elements.js\"></script>\n";
  } else {
    html += "<script src=\"" + script + "\"></script>\n";
  }
  html +=
      "</head>\n<body>\n"
      "<mutation-test-report-app title-postfix=\"kvgate\">\n"
      "<p>This page needs the <code>mutation-testing-elements</code> web component"
      " (kill_matrix.md has the same results as text).</p>\n"
      "</mutation-test-report-app>\n"
      "<script>\n"
      "const report = " +
      data +
      ";\n"
      "document.querySelector('mutation-test-report-app').report = report;\n"
      "</script>\n</body>\n</html>\n";
  return html;
}

std::vector<std::string> write_reports(const RunResult& r, const ReportContext& ctx, std::ostream& log) {
  std::vector<std::string> written;
  const fs::path& out = ctx.out_dir;
  fs::create_directories(out);
  write_text(out / "outcomes.json", outcomes_json(r, ctx).dump(2) + "\n");
  written.push_back("outcomes.json");
  write_text(out / "kill_matrix.csv", kill_matrix_csv(r));
  written.push_back("kill_matrix.csv");
  write_text(out / "kill_matrix.md", kill_matrix_md(r));
  written.push_back("kill_matrix.md");
  const json sr = stryker_report(r, ctx);
  write_text(out / "mutation-report.json", sr.dump(2) + "\n");
  written.push_back("mutation-report.json");
  // Validate what we wrote against the vendored Stryker schema.
  if (!ctx.opts.report_schema.empty() && fs::exists(ctx.opts.report_schema)) {
    const auto errs = validate_json(sr, json::parse(read_text(ctx.opts.report_schema)));
    if (!errs.empty())
      log << "kvgate mutate: warning: mutation-report.json does not match " << ctx.opts.report_schema.string()
          << ":\n"
          << format_errors(errs);
  }
  // The web component, vendored next to index.html so that the page works offline.
  // --web-dist, else the npm install under mutations/web of the tree being mutated, else of the
  // tree this driver was built from.
  const fs::path rel = fs::path("mutations") / "web" / "node_modules" / "mutation-testing-elements" / "dist" /
                       "mutation-test-elements.js";
  fs::path js = ctx.opts.web_dist;
  if (js.empty()) {
    js = ctx.source_dir / rel;
    if (!fs::exists(js) && fs::exists(fs::path(default_source_dir()) / rel)) js = fs::path(default_source_dir()) / rel;
  }
  std::string script;
  std::error_code ec;
  if (fs::is_regular_file(js)) {
    fs::copy_file(js, out / "mutation-test-elements.js", fs::copy_options::overwrite_existing, ec);
    if (!ec) {
      script = "mutation-test-elements.js";
      written.push_back("mutation-test-elements.js");
    }
  }
  if (script.empty())
    log << "kvgate mutate: note: " << js.string()
        << " not found, index.html loads the viewer from unpkg (offline: npm ci --prefix mutations/web)\n";
  write_text(out / "index.html", report_html(sr, script));
  written.push_back("index.html");
  return written;
}

}  // namespace kvgate::mutate
