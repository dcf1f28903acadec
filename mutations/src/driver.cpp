#include "kvgate_mutations/driver.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <memory>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>

#include "kvgate/build_paths.hpp"
#include "kvgate/model_paths.hpp"
#include "kvgate_mutations/catch_xml.hpp"
#include "kvgate_mutations/ci.hpp"
#include "kvgate_mutations/compile_ahead.hpp"
#include "kvgate_mutations/gate_files.hpp"
#include "kvgate_mutations/process.hpp"
#include "kvgate_mutations/prove.hpp"
#include "kvgate_mutations/report.hpp"
#include "kvgate_mutations/schemata.hpp"
#include "kvgate_mutations/scratch.hpp"
#include "kvgate_mutations/shard.hpp"

namespace kvgate::mutate {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string device_gate_gap(const std::vector<std::string>& expect,
                            const std::function<std::optional<BaselineGate>(const std::string&)>& lookup,
                            const std::vector<std::string>& all_ran) {
  std::string why;
  bool names_a_gate = false;
  for (const auto& id : expect) {
    const std::optional<BaselineGate> g = lookup(id);
    if (g && g->ran) return {};
    names_a_gate = names_a_gate || g.has_value();
    why += (why.empty() ? "" : "; ") + id +
           (!g ? std::string(" is not a gate of this run") : " skipped in the baseline (" + g->skip_reason + ")");
  }
  if (!names_a_gate)
    for (const auto& id : all_ran)
      if (id.find(".cuda.") != std::string::npos) return {};
  return "requires a CUDA device: none of its gates ran here: " + why;
}

std::vector<std::vector<std::string>> split_gate_ids(const std::vector<std::string>& ids, std::size_t n,
                                                     const std::function<double(const std::string&)>& seconds) {
  n = std::min(n, ids.size());
  if (n < 2) return {ids};
  std::vector<std::string> order = ids;
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) { return seconds(a) > seconds(b); });
  std::vector<std::vector<std::string>> groups(n);
  std::vector<double> load(n, 0);
  for (std::size_t k = 0; k < order.size(); ++k) {
    const double t = seconds(order[k]);
    // Longest first onto the least loaded group; untimed IDs (the baseline) dealt round robin.
    const std::size_t g = t > 0 ? static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin()) : k % n;
    load[g] += t;
    groups[g].push_back(order[k]);
  }
  std::erase_if(groups, [](const auto& v) { return v.empty(); });
  return groups;
}

const char* to_string(GateStatus s) {
  switch (s) {
    case GateStatus::passed: return "passed";
    case GateStatus::failed: return "failed";
    case GateStatus::crashed: return "crashed";
    case GateStatus::timeout: return "timeout";
    case GateStatus::not_run: return "not_run";
    case GateStatus::skipped: return "skipped";
  }
  return "?";
}

const char* to_string(MutantStatus s) {
  switch (s) {
    case MutantStatus::killed: return "killed";
    case MutantStatus::survived: return "survived";
    case MutantStatus::timeout: return "timeout";
    case MutantStatus::unviable: return "unviable";
    case MutantStatus::noop: return "noop";
    case MutantStatus::skipped: return "skipped";
    case MutantStatus::interrupted: return "interrupted";
  }
  return "?";
}

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string fmt_s(double s) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(s < 10 ? 2 : 1) << s << "s";
  return o.str();
}

std::string fmt_eta(double s) {
  const long t = std::lround(s);
  std::ostringstream o;
  if (t >= 3600) o << t / 3600 << "h";
  o << std::setw(t >= 3600 ? 2 : 1) << std::setfill('0') << (t / 60) % 60 << "m" << std::setw(2) << std::setfill('0')
    << t % 60 << "s";
  return o.str();
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Status precedence when one gate ID has several test cases (or appears in several executables).
int rank(GateStatus s) {
  switch (s) {
    case GateStatus::failed: return 5;
    case GateStatus::crashed: return 4;
    case GateStatus::timeout: return 3;
    case GateStatus::passed: return 2;
    case GateStatus::skipped: return 1;
    case GateStatus::not_run: return 0;
  }
  return 0;
}
void merge_into(GateOutcome& into, const GateOutcome& g) {
  if (rank(g.status) > rank(into.status)) {
    into.status = g.status;
    into.detail = g.detail;
    into.log = g.log;
    into.variant = g.variant;
  }
  for (const auto& v : g.kill_variants)
    if (std::find(into.kill_variants.begin(), into.kill_variants.end(), v) == into.kill_variants.end())
      into.kill_variants.push_back(v);
  into.seconds += g.seconds;
}

fs::path common_ancestor(const fs::path& a, const fs::path& b) {
  fs::path r;
  auto ia = a.begin(), ib = b.begin();
  for (; ia != a.end() && ib != b.end() && *ia == *ib; ++ia, ++ib) r /= *ia;
  return r;
}

struct Env {
  MutateOptions o;
  fs::path out;      // absolute
  fs::path scratch;  // absolute
  fs::path build;    // absolute
  std::vector<std::pair<std::string, std::string>> build_env, gate_env;
  std::vector<GateExe> exes;
  std::map<std::string, Gate> gates;  // by ID
  std::vector<std::string> gate_order;
  std::vector<std::string> targets;
  ObjectSnapshot objects;
  bool cuda_build = false;
  bool device_probed = false, device_present = false;  // requires: cuda-device
  std::string device_how;
  std::vector<std::string> focus;          // --expected-gates-only: the gate IDs of this run
  std::vector<std::string> focus_dropped;  // executables without a focused gate (dropped)
  fs::path object_backup;                  // --restore-objects: baseline copies of every object
  std::set<std::string> red;               // --skip-red-gates: gate IDs red in the baseline
  std::map<std::string, std::string> red_why;  // red gate ID -> its baseline status, detail and log
  std::map<std::string, Variant> variants; // by name: the environments gate programs run in
  SchemaPlan schema;                       // the mutants compiled in as switches (--no-schemata: none)
  bool no_bail = false;                    // --bail off for this run of the gates (the canary)
  // Coverage from the baseline: run unit ("gate_model", "gate_model@no_avx2") -> the IDs of the
  // switches it evaluated. unit_filter, while set: only these units run (the others' gates are
  // "not reached").
  std::map<std::string, std::set<std::string>> reach;
  const std::set<std::string>* unit_filter = nullptr;
  // KVGATE_MUTANT for the gate runs of the moment: empty (no mutant on) except while a schema
  // mutant runs.
  std::vector<std::pair<std::string, std::string>> mutant_env{{"KVGATE_MUTANT", ""}};
  // --prove-gates: the gate IDs the mutant of the moment runs (the unproven ones it reaches).
  const std::vector<std::string>* prove_focus = nullptr;
  std::ostream* log = nullptr;
};

// Catch2 test spec selecting exactly these gate IDs.
std::string spec_for(const std::vector<std::string>& ids) {
  std::string s;
  for (const auto& id : ids) s += (s.empty() ? "" : ",") + catch_spec_for_gate(id);
  return s;
}

std::string rel_to(const fs::path& p, const fs::path& base) { return fs::relative(p, base).generic_string(); }

// The generated switch header lives in the scratch build (the mirror step keeps the build).
fs::path schema_header_path(const Env& e) { return e.build / "kvgate_mutant_schema.hpp"; }

bool run_build(Env& e, const fs::path& log_path, double* seconds, bool keep_going = false) {
  std::vector<std::string> argv{"ninja", "-C", e.build.string(), "-j", std::to_string(e.o.jobs)};
  if (keep_going) argv.insert(argv.end(), {"-k", "0"});  // every failing TU reports (schemata)
  for (const auto& t : e.targets) argv.push_back(t);
  const ProcResult r = run_process({argv, {}, e.build_env, log_path.string(), 0});
  if (seconds) *seconds = r.seconds;
  return r.ok();
}

// The variant's environment on top of the gates' common one.
std::vector<std::pair<std::string, std::string>> env_for(const Env& e, const std::string& variant) {
  auto env = e.gate_env;
  if (const auto it = e.variants.find(variant); it != e.variants.end())
    for (const auto& kv : it->second.env) env.push_back(kv);
  for (const auto& kv : e.mutant_env) env.push_back(kv);
  return env;
}

// File stem of one gate program's run in one variant ("gate_model", "gate_model@no_avx2").
std::string unit_stem(const GateExe& x, const std::string& variant) {
  return variant == "default" ? x.target : x.target + "@" + variant;
}

// --gate-shards PROGRAM=N: the gate IDs of one run of `x` split into groups (split_gate_ids), one
// process each. One group (no split) when the program has no shard count or `allowed` is false (a
// focused baseline, whose IDs are not known yet).
std::vector<std::vector<std::string>> shard_gate_ids(const Env& e, const GateExe& x, const std::vector<std::string>& ids,
                                                     bool allowed) {
  const auto it = e.o.gate_shards.find(x.target);
  if (!allowed || it == e.o.gate_shards.end()) return {ids};
  return split_gate_ids(ids, static_cast<std::size_t>(std::max(1, it->second)), [&](const std::string& id) {
    const auto g = e.gates.find(id);
    return g == e.gates.end() ? 0.0 : g->second.baseline_s;
  });
}

// The gate IDs of a Catch2 program, from its test list (before the baseline, so a sharded program
// is split there too): Catch2 2's --list-test-names-only, else Catch2 3's --list-tests --verbosity
// quiet (one name per line in both). Empty when neither answers (the baseline then runs it whole).
std::vector<std::string> list_gate_ids(const GateExe& x) {
  for (const auto& args : {std::vector<std::string>{"--list-test-names-only"},
                           std::vector<std::string>{"--list-tests", "--verbosity", "quiet"}}) {
    std::vector<std::string> argv{x.path.string()};
    argv.insert(argv.end(), args.begin(), args.end());
    // The exit code says nothing here: Catch2 2 exits with the number of tests listed (mod 256),
    // Catch2 3 with 1 on the option it does not know. A line counts only as a gate ID's test name
    // ("FAMILY.part... description"): a header, an error or a usage line has no such first word.
    const auto [rc, out] = capture_output(argv, x.path.parent_path().string());
    (void)rc;
    std::vector<std::string> ids;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (line.empty() || !std::isupper(static_cast<unsigned char>(line.front()))) continue;
      const std::string id = gate_id_of(line);
      const bool looks_like_id = id.find('.') != std::string::npos && id.back() != '.' &&
                                 std::all_of(id.begin(), id.end(), [](unsigned char ch) {
                                   return std::isalnum(ch) || ch == '.' || ch == '_' || ch == '-';
                                 });
      if (looks_like_id && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
    if (!ids.empty()) return ids;
  }
  return {};
}

// Runs the gate executables, each once per environment variant it has (and, after a crash or
// timeout, the unfinished gate IDs one by one in that variant). A gate's outcome is the worst over
// its variants; kill_variants names every variant in which it failed or crashed.
// `baseline` runs without timeouts and discovers the gate IDs from the XML.
// `focus` (--expected-gates-only): run only these gate IDs (a Catch2 test spec per executable);
// executables without one of them are not started. Null: every gate.
std::map<std::string, GateOutcome> run_gates(Env& e, const fs::path& dir, double timeout_scale, bool baseline,
                                             double* wall, const std::vector<std::string>* focus = nullptr) {
  fs::create_directories(dir);
  const auto t0 = Clock::now();
  const bool bail = e.o.bail && !baseline && !e.no_bail;
  struct Unit {
    std::size_t exe;      // index into e.exes
    std::string variant;
    std::string stem;     // its files' stem: unit_stem, plus "#k" for shard k (--gate-shards)
  };
  std::vector<ProcSpec> specs;
  std::vector<Unit> started;
  std::vector<std::vector<std::string>> wanted;  // per started unit: the gate IDs it must report
  std::map<std::string, GateOutcome> skipped_units;  // gates of units the coverage filter left out
  for (std::size_t i = 0; i < e.exes.size(); ++i) {
    const auto& x = e.exes[i];
    std::vector<std::string> ids = x.gate_ids;
    std::string filter;
    if (focus) {
      if (baseline) {
        ids.clear();  // not known yet: the baseline discovers them from the XML
        filter = spec_for(*focus);
      } else {
        ids.clear();
        for (const auto& id : x.gate_ids)
          if (std::find(focus->begin(), focus->end(), id) != focus->end()) ids.push_back(id);
        if (ids.empty()) continue;
        filter = spec_for(ids);
      }
    }
    // --gate-shards: a program whose gate IDs are known runs as several processes, each with a
    // Catch2 spec for its share (the outcomes are merged below as one program's).
    const auto groups = shard_gate_ids(e, x, ids, filter.empty() || !baseline);
    for (const auto& v : x.variants) {
      const std::string unit = unit_stem(x, v);
      if (e.unit_filter && !e.unit_filter->count(unit)) {
        for (const auto& id : ids)
          skipped_units.emplace(id, GateOutcome{GateStatus::not_run, 0, "", "not reached: " + unit +
                                                  " never evaluated the mutant's switch in the baseline", v, {}});
        continue;
      }
      for (std::size_t g = 0; g < groups.size(); ++g) {
        const std::string stem = groups.size() == 1 ? unit : unit + "#" + std::to_string(g);
        const std::string spec = groups.size() == 1 ? filter : spec_for(groups[g]);
        ProcSpec s;
        s.argv = {x.path.string(), "-r", "xml", "-d", "yes", "-o", (dir / (stem + ".xml")).string()};
        if (!spec.empty()) s.argv.insert(s.argv.begin() + 1, spec);
        s.cwd = x.path.parent_path().string();
        s.env = env_for(e, v);
        if (baseline && !e.schema.switched.empty()) {
          // Which switches this unit evaluates (appended at exit by every process it starts).
          fs::remove(dir / (stem + ".reach"));
          s.env.emplace_back("KVGATE_MUTANT_COVERAGE", (dir / (stem + ".reach")).string());
        }
        s.log_path = (dir / (stem + ".log")).string();
        s.timeout_s = baseline ? 0 : std::max(e.o.min_timeout_s, e.o.timeout_factor * x.baseline_s) * timeout_scale;
        if (bail) s.argv.insert(s.argv.begin() + 1, "--abort");  // Catch2: stop at the first failure
        fs::remove(dir / (stem + ".xml"));
        specs.push_back(std::move(s));
        started.push_back({i, v, stem});
        wanted.push_back(groups.size() == 1 ? ids : groups[g]);
      }
    }
  }
  StopWhen stop_when;
  if (bail) {
    // --bail: the quickest programs first, and the first kill (a failed case, a crash, a non-zero
    // exit: what the classification below counts as a kill) stops the others.
    std::vector<std::size_t> order(specs.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return e.exes[started[a].exe].baseline_s < e.exes[started[b].exe].baseline_s;
    });
    std::vector<ProcSpec> sp;
    std::vector<Unit> st;
    std::vector<std::vector<std::string>> wa;
    for (const std::size_t k : order) {
      sp.push_back(std::move(specs[k]));
      st.push_back(started[k]);
      wa.push_back(std::move(wanted[k]));
    }
    specs = std::move(sp);
    started = std::move(st);
    wanted = std::move(wa);
    stop_when = [](std::size_t, const ProcResult& pr) {
      return pr.term_signal != 0 || (pr.ended_normally() && pr.exit_code != 0);
    };
  }
  const auto res = run_processes(specs, e.o.jobs, stop_when);
  std::map<std::string, GateOutcome> out = skipped_units;
  struct Rerun {
    std::size_t exe;
    std::string variant;
    std::string id;
  };
  std::vector<Rerun> reruns;
  std::set<std::size_t> dropped, rebased;  // baseline: exes without a focused gate; exes whose times were reset
  for (std::size_t k = 0; k < started.size(); ++k) {
    const std::size_t i = started[k].exe;
    const std::string& variant = started[k].variant;
    GateExe& x = e.exes[i];
    const ProcResult& pr = res[k];
    const std::string& stem = started[k].stem;
    std::string xml;
    try {
      xml = read_text(dir / (stem + ".xml"));
    } catch (...) {
    }
    const auto cases = parse_catch_xml(xml);
    const std::string log_rel = rel_to(dir / (stem + ".log"), e.out);
    if (baseline && focus && cases.empty() && pr.ended_normally()) {
      // None of the focused gates lives in this executable (Catch2 3 exits 2 on an empty match).
      if (dropped.insert(i).second) e.focus_dropped.push_back(x.target);
      continue;
    }
    std::map<std::string, GateOutcome> mine;
    std::map<std::string, std::vector<std::string>> names;
    std::map<std::string, double> secs;
    for (const auto& c : cases) {
      const std::string id = gate_id_of(c.name);
      names[id].push_back(c.name);
      GateOutcome g;
      g.log = log_rel;
      g.seconds = c.seconds;
      g.variant = variant;
      secs[id] += c.seconds;
      if (c.has_result) {
        g.status = c.skipped && c.success ? GateStatus::skipped : c.success ? GateStatus::passed : GateStatus::failed;
        if (!c.success) g.detail = "test case failed: " + c.name;
        if (g.status == GateStatus::skipped) g.detail = "skipped: " + (c.skip_reason.empty() ? c.name : c.skip_reason);
      } else if (pr.stopped) {
        g.status = GateStatus::not_run;
        g.detail = "stopped by --bail during: " + c.name + " (another gate program had killed the mutant)";
      } else {
        g.status = pr.timed_out ? GateStatus::timeout : GateStatus::crashed;
        g.detail = pr.describe() + " during: " + c.name;
      }
      if (is_kill(g.status)) g.kill_variants = {variant};
      if (!mine.count(id)) mine[id] = g;
      else merge_into(mine[id], g);
    }
    if (baseline) {
      if (rebased.insert(i).second) {
        x.baseline_s = 0;
        x.gate_ids.clear();
      }
      x.baseline_s += pr.seconds;
      std::vector<std::string> found;
      for (const auto& [id, _] : mine) {
        found.push_back(id);
        if (std::find(x.gate_ids.begin(), x.gate_ids.end(), id) == x.gate_ids.end()) x.gate_ids.push_back(id);
        Gate& g = e.gates[id];
        if (g.id.empty()) {
          g.id = id;
          g.exe = x.target;
          e.gate_order.push_back(id);
        }
        if (variant == "default" || g.cases.empty()) {
          g.cases.insert(g.cases.end(), names[id].begin(), names[id].end());
          g.baseline_s += secs[id];
          g.skipped = mine[id].status == GateStatus::skipped;
          if (g.skipped) g.skip_reason = mine[id].detail.substr(std::string("skipped: ").size());
        }
      }
      wanted[k] = found;
    }
    if (pr.ended_normally() && pr.exit_code != 0) {
      // Catch reports failures through the exit code; a non-zero code with every case green means
      // the process itself went wrong (e.g. crashed after the last case): red for all its gates.
      bool any_failed = false;
      for (const auto& [id, g] : mine) any_failed = any_failed || g.status == GateStatus::failed;
      if (!any_failed)
        for (const auto& id : wanted[k]) {
          GateOutcome& g = mine[id];
          g.status = GateStatus::crashed;
          g.log = log_rel;
          g.variant = variant;
          g.kill_variants = {variant};
          g.detail = pr.describe() + " with no failed test case in its XML";
        }
    }
    for (const auto& id : wanted[k]) {
      if (mine.count(id)) continue;
      if (pr.ended_normally() || pr.interrupted || pr.stopped) {
        const char* why = pr.interrupted ? "interrupted"
                          : pr.stopped   ? "not run: stopped by --bail (another gate program had killed the mutant)"
                          : bail         ? "not in the XML report (--bail: the program stopped at its first failure)"
                                         : "not in the XML report";
        GateOutcome g{GateStatus::not_run, 0, log_rel, why, variant, {}};
        mine[id] = g;
      } else {
        reruns.push_back({i, variant, id});  // the executable died before reaching it: run it alone
      }
    }
    for (auto& [id, g] : mine) {
      if (!out.count(id)) out[id] = g;
      else merge_into(out[id], g);
    }
  }
  // --bail: a crash is already a kill; the gates it kept from running need no run of their own.
  const bool killed_already =
      bail && std::any_of(out.begin(), out.end(), [](const auto& kv) { return is_kill(kv.second.status); });
  if (!reruns.empty() && !interrupted() && !killed_already) {
    std::vector<ProcSpec> rs;
    for (const auto& r : reruns) {
      const GateExe& x = e.exes[r.exe];
      const std::string stem = unit_stem(x, r.variant) + "." + r.id;
      ProcSpec s;
      s.argv = {x.path.string(), catch_spec_for_gate(r.id), "-r", "xml", "-d", "yes", "-o", (dir / (stem + ".xml")).string()};
      s.cwd = x.path.parent_path().string();
      s.env = env_for(e, r.variant);
      s.log_path = (dir / (stem + ".log")).string();
      const double gb = e.gates.count(r.id) ? e.gates[r.id].baseline_s : x.baseline_s;
      s.timeout_s = baseline ? 0 : std::max(e.o.min_timeout_s, e.o.timeout_factor * gb) * timeout_scale;
      fs::remove(dir / (stem + ".xml"));
      rs.push_back(std::move(s));
    }
    const auto rr = run_processes(rs, e.o.jobs);
    for (std::size_t k = 0; k < reruns.size(); ++k) {
      const std::string stem = unit_stem(e.exes[reruns[k].exe], reruns[k].variant) + "." + reruns[k].id;
      std::string xml;
      try {
        xml = read_text(dir / (stem + ".xml"));
      } catch (...) {
      }
      GateOutcome g;
      g.log = rel_to(dir / (stem + ".log"), e.out);
      g.seconds = rr[k].seconds;
      g.variant = reruns[k].variant;
      const auto cases = parse_catch_xml(xml);
      if (rr[k].ended_normally() && !cases.empty()) {
        bool all_ok = true;
        for (const auto& c : cases) all_ok = all_ok && c.has_result && c.success;
        g.status = all_ok && rr[k].exit_code == 0 ? GateStatus::passed : GateStatus::failed;
        g.detail = "run alone: " + rr[k].describe();
      } else if (rr[k].timed_out) {
        g.status = GateStatus::timeout;
        g.detail = "run alone: timed out";
      } else if (rr[k].interrupted) {
        g.status = GateStatus::not_run;
        g.detail = "interrupted";
      } else {
        g.status = GateStatus::crashed;
        g.detail = "run alone: " + rr[k].describe();
      }
      if (is_kill(g.status)) g.kill_variants = {g.variant};
      if (!out.count(reruns[k].id)) out[reruns[k].id] = g;
      else merge_into(out[reruns[k].id], g);
    }
  }
  if (wall) *wall = since(t0);
  return out;
}

struct RevertGuard {
  fs::path path;
  std::string original;
  bool armed = false;
  void revert() {
    if (armed) {
      write_text(path, original);
      armed = false;
    }
  }
  ~RevertGuard() {
    try {
      revert();
    } catch (...) {
    }
  }
};

bool needs_device(const Mutant& m) {
  return std::find(m.requires_.begin(), m.requires_.end(), "cuda-device") != m.requires_.end();
}

// requires: avx512: the mutated kernel runs only where the CPU has AVX-512F (runtime/src/cpu_avx2.hpp
// kHaveAvx512); elsewhere no gate can reach it.
bool host_has_avx512() {
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// Why a mutant cannot run in this environment, or "" when it can. `built`: the scratch build and
// the baseline exist (before that, only the device probe can decide).
std::string requirement_gap(const Env& e, const Mutant& m, bool built) {
  if (needs_device(m) && e.device_probed && !e.device_present)
    return "requires a CUDA device: none found (" + e.device_how + ")";
  if (std::find(m.requires_.begin(), m.requires_.end(), "avx512") != m.requires_.end() && !host_has_avx512())
    return "requires a CPU with AVX-512F: this host has none, so the kernel it mutates never runs here";
  if (!built) return {};
  if (!e.red.empty() && !m.expect_killed_by.empty() &&
      std::all_of(m.expect_killed_by.begin(), m.expect_killed_by.end(), [&](const std::string& id) { return e.red.count(id) > 0; })) {
    std::string ids;
    for (const auto& id : m.expect_killed_by) ids += (ids.empty() ? "" : ", ") + id;
    return "every gate it expects is red in the baseline (--skip-red-gates): " + ids;
  }
  for (const auto& req : m.requires_)
    if ((req == "cuda" || req == "cuda-device") && !e.cuda_build)
      return "requires a CUDA build (configure the scratch build with --cmake-arg -DKVGATE_CUDA=ON)";
  if (needs_device(m)) {
    // Only a device-backed gate can kill it: one of its expected gates must have really run in the
    // baseline. A GPU gate skips (and passes) when the CUDA runtime cannot use the device even
    // though nvidia-smi lists it (e.g. a driver older than the runtime), so this is the last word.
    std::vector<std::string> ran;
    for (const auto& [id, g] : e.gates)
      if (!g.skipped) ran.push_back(id);
    return device_gate_gap(
        m.expect_killed_by,
        [&](const std::string& id) -> std::optional<BaselineGate> {
          const auto it = e.gates.find(id);
          if (it == e.gates.end()) return std::nullopt;
          return BaselineGate{!it->second.skipped, it->second.skip_reason};
        },
        ran);
  }
  return {};
}

// --restore-objects: after a revert, put the baseline bytes back into every object rebuilt since
// the snapshot, keeping the mtime that ninja recorded for it (build log and deps log: an output
// newer than its deps record counts as dirty), give the reverted source its original mtime (older
// than those records), and delete the archives and gate executables, which were linked from the
// mutated objects. The next build then relinks but compiles nothing the mutant touched. If a copy
// fails, the source keeps its new mtime and ninja recompiles as usual.
void restore_objects_after_revert(Env& e, const fs::path& file, fs::file_time_type orig_mtime) {
  if (e.object_backup.empty()) return;
  bool ok = true;
  int restored = 0;
  for (auto& [path, info] : e.objects) {
    std::error_code ec;
    auto mt = fs::last_write_time(path, ec);
    if (!ec && mt == info.mtime) continue;
    if (ec) mt = info.mtime;  // deleted by a failed compile: ninja still holds the baseline records
    const fs::path backup = e.object_backup / (fs::relative(path, e.build).string() + ".baseline");
    fs::copy_file(backup, path, fs::copy_options::overwrite_existing, ec);
    if (!ec) fs::last_write_time(path, mt, ec);
    if (ec) {
      ok = false;
      continue;
    }
    info.mtime = mt;
    ++restored;
  }
  std::error_code ec;
  if (ok) fs::last_write_time(file, orig_mtime, ec);
  if (restored == 0) return;
  std::vector<fs::path> linked;
  for (auto it = fs::recursive_directory_iterator(e.build, ec); it != fs::recursive_directory_iterator(); ++it)
    if (it->is_regular_file() && it->path().extension() == ".a") linked.push_back(it->path());
  for (const auto& x : e.exes) linked.push_back(x.path);
  for (const auto& p : linked) fs::remove(p, ec);
}

// Killed / timeout / survived from the gate outcomes, and the expected killers that did not kill.
void classify_mutant(const Env& e, const Mutant& m, MutantOutcome& mo) {
  bool any_timeout = false;
  for (const auto& [id, g] : mo.gates) {
    if (is_kill(g.status)) {
      mo.killed_by.push_back(id);
      mo.killed_in[id] = g.kill_variants.empty() ? std::vector<std::string>{g.variant} : g.kill_variants;
    }
    any_timeout = any_timeout || g.status == GateStatus::timeout;
  }
  if (!mo.killed_by.empty()) {
    mo.status = MutantStatus::killed;
  } else if (any_timeout) {
    mo.status = MutantStatus::timeout;
    mo.reason = "no gate failed and at least one timed out";
  } else {
    mo.status = MutantStatus::survived;
    mo.reason = "every gate stayed green";
  }
  for (const auto& id : m.expect_killed_by) {
    const auto g = mo.gates.find(id);
    if (!e.gates.count(id) || e.red.count(id)) {
      mo.expected_unknown.push_back(id);
    } else if (e.o.bail && !mo.killed_by.empty() && g != mo.gates.end() && g->second.status == GateStatus::not_run) {
      // --bail stopped it after another gate's kill: nothing is known of it
    } else if (std::find(mo.killed_by.begin(), mo.killed_by.end(), id) == mo.killed_by.end()) {
      mo.expected_not_killing.push_back(id);
    }
  }
}

// The gates a mutant runs: with --prove-gates the unproven gates it reaches; with
// --expected-gates-only its own expected gates (the canary, which names none: every focused gate),
// less the red ones; null: every gate.
const std::vector<std::string>* gates_for(const Env& e, const Mutant& m, std::vector<std::string>& wanted) {
  if (e.prove_focus) return e.prove_focus;
  if (!e.o.expected_gates_only) return nullptr;
  wanted = m.expect_killed_by.empty() ? e.focus : m.expect_killed_by;
  std::erase_if(wanted, [&](const std::string& id) { return e.red.count(id) > 0; });
  return &wanted;
}

// The gates one mutant runs. With --bail (not --expected-gates-only) and a mutant that names the
// gates that must kill it, those gate IDs run first, alone: a kill there ends the mutant as --bail
// ends it at any first kill, at the cost of the named gates instead of every reached program run
// quickest first. Without a kill there, every reached gate runs as usual (the named ones again).
std::map<std::string, GateOutcome> mutant_gates(Env& e, const Mutant& m, const fs::path& dir, double* test_s) {
  std::vector<std::string> wanted;
  const std::vector<std::string>* focus = gates_for(e, m, wanted);
  if (!focus && e.o.bail && !e.no_bail && !m.expect_killed_by.empty()) {
    std::vector<std::string> named = m.expect_killed_by;
    std::erase_if(named, [&](const std::string& id) { return e.red.count(id) > 0; });
    if (!named.empty()) {
      double first_s = 0;
      auto first = run_gates(e, dir / "gates", m.timeout_scale, false, &first_s, &named);
      if (interrupted() ||
          std::any_of(first.begin(), first.end(), [](const auto& kv) { return is_kill(kv.second.status); })) {
        // The other gates are marked as --bail marks the gates it stops (the run is partial).
        for (const auto& x : e.exes)
          for (const auto& id : x.gate_ids)
            if (!first.count(id))
              first[id] = GateOutcome{GateStatus::not_run, 0, "",
                                      "not run: stopped by --bail (a gate the mutant names had killed it)", "default", {}};
        *test_s = first_s;
        return first;
      }
      double rest_s = 0;
      auto rest = run_gates(e, dir / "gates", m.timeout_scale, false, &rest_s, nullptr);
      *test_s = first_s + rest_s;
      return rest;
    }
  }
  return run_gates(e, dir / "gates", m.timeout_scale, false, test_s, focus);
}

// A schema mutant: no patch, no build; the gates run with KVGATE_MUTANT=<id>. The switch creates
// `reached` the first time the mutated code runs: a survivor whose code no gate ran is a no-op of
// the gates (nothing exercises it), not an equivalent mutant.
MutantOutcome run_schema_mutant(Env& e, const Mutant& m, const fs::path& dir, Clock::time_point t0) {
  MutantOutcome mo;
  mo.mutant = &m;
  mo.path = "schema";
  const SchemaPlan::Entry* entry = e.schema.find(m.id);
  mo.path_reason = std::string(to_string(entry->candidates[entry->chosen].form)) + " switch";
  const std::string original = e.schema.originals.at(m.file);
  write_text(dir / "diff.patch", unified_diff(original, apply_mutant(original, m), m.file));
  mo.diff_path = rel_to(dir / "diff.patch", e.out);
  const fs::path reached = dir / "reached";
  std::set<std::string> units;  // coverage selection: the run units whose baseline evaluated the switch
  for (const auto& [stem, ids] : e.reach)
    if (ids.count(m.id)) units.insert(stem);
  const bool select = !e.o.all_gates && !e.reach.empty();
  if (select && units.empty()) {
    mo.status = MutantStatus::noop;
    mo.reason = "no gate program reaches the mutated code (none evaluated its switch in the baseline): not run";
    mo.wall_s = since(t0);
    return mo;
  }
  // --restore-objects deletes the archives and gate executables when a patch-and-rebuild mutant is
  // reverted (they were linked from its objects); the next build relinks them. A switch runs no
  // build of its own, so one after such a mutant relinks first (nothing compiles). Without this the
  // gate processes could not start (exit 127: round 18's GPU proof lost two runs so).
  if (std::any_of(e.exes.begin(), e.exes.end(), [](const GateExe& x) { return !fs::exists(x.path); })) {
    mo.build_log = rel_to(dir / "build.log", e.out);
    if (!run_build(e, dir / "build.log", &mo.build_s)) {
      mo.status = MutantStatus::unviable;
      mo.reason = "relinking the gate programs before the switch run failed (see " + mo.build_log + ")";
      mo.wall_s = since(t0);
      return mo;
    }
  }
  e.mutant_env = {{"KVGATE_MUTANT", m.id}, {"KVGATE_MUTANT_REACHED", reached.string()}};
  e.unit_filter = select ? &units : nullptr;
  mo.gates = mutant_gates(e, m, dir, &mo.test_s);
  e.mutant_env = {{"KVGATE_MUTANT", ""}};
  e.unit_filter = nullptr;
  if (interrupted()) {
    mo.status = MutantStatus::interrupted;
    mo.wall_s = since(t0);
    return mo;
  }
  classify_mutant(e, m, mo);
  if (mo.status == MutantStatus::survived && !fs::exists(reached)) {
    mo.status = MutantStatus::noop;
    mo.reason = "no gate reached the mutated code (its schema switch was never evaluated as on)";
  }
  mo.wall_s = since(t0);
  return mo;
}

// The patched text of a rebuild mutant's file, from the file's text in the scratch (`current`). In
// an instrumented file the anchor may sit inside another mutant's switch: then the patch goes onto
// the unmutated text (the other switches are off anyway) and the revert restores the switches.
std::string mutated_text(const Env& e, const Mutant& m, const std::string& current) {
  const auto orig_it = e.schema.originals.find(m.file);
  const bool on_original = orig_it != e.schema.originals.end() &&
                           count_occurrences(current, m.anchor) != static_cast<std::size_t>(m.occurrences);
  return apply_mutant(on_original ? orig_it->second : current, m);
}

MutantOutcome run_mutant(Env& e, const Mutant& m, const fs::path& dir) {
  MutantOutcome mo;
  mo.mutant = &m;
  const auto t0 = Clock::now();
  if (const std::string gap = requirement_gap(e, m, true); !gap.empty()) {
    mo.status = MutantStatus::skipped;
    mo.reason = gap;
    return mo;
  }
  fs::remove_all(dir);
  fs::create_directories(dir);
  if (e.schema.has(m.id)) return run_schema_mutant(e, m, dir, t0);
  if (const auto it = e.schema.fallback.find(m.id); it != e.schema.fallback.end()) mo.path_reason = it->second;
  const fs::path file = e.scratch / m.file;
  const auto orig_mtime = fs::last_write_time(file);
  RevertGuard guard{file, read_text(file), false};
  const std::string mutated = mutated_text(e, m, guard.original);
  write_text(dir / "diff.patch", unified_diff(guard.original, mutated, m.file));
  mo.diff_path = rel_to(dir / "diff.patch", e.out);
  guard.armed = true;
  write_text(file, mutated);

  mo.build_log = rel_to(dir / "build.log", e.out);
  const bool built = run_build(e, dir / "build.log", &mo.build_s);
  if (interrupted()) {
    mo.status = MutantStatus::interrupted;
    guard.revert();
    restore_objects_after_revert(e, file, orig_mtime);
    mo.wall_s = since(t0);
    return mo;
  }
  if (!built) {
    mo.status = MutantStatus::unviable;
    mo.reason = "the mutated tree does not build (see " + mo.build_log + ")";
    guard.revert();
    restore_objects_after_revert(e, file, orig_mtime);
    mo.wall_s = since(t0);
    return mo;
  }
  const ObjectChanges ch = compare_objects(e.build, e.objects);
  for (const auto& p : ch.different) mo.changed_objects.push_back(rel_to(p, e.build));
  // A .py file is one the gate programs run rather than compile (datasets/tools/hf_to_gguf.py, which
  // MOD.gguf.* execute from the source tree; a non-compiled source of their target, so the catalog
  // check counts it): no object can change, so the gates run on the mutated tree as it is.
  if (ch.different.empty() && fs::path(m.file).extension() != ".py") {
    mo.status = MutantStatus::noop;
    mo.reason = ch.rebuilt.empty() ? "no object of the gate targets is compiled from " + m.file
                                   : "the rebuilt objects are byte-identical to the baseline (dead code or an "
                                     "equivalent mutant)";
    guard.revert();
    restore_objects_after_revert(e, file, orig_mtime);
    mo.wall_s = since(t0);
    return mo;
  }
  mo.gates = mutant_gates(e, m, dir, &mo.test_s);
  guard.revert();
  restore_objects_after_revert(e, file, orig_mtime);
  if (interrupted()) {
    mo.status = MutantStatus::interrupted;
    mo.wall_s = since(t0);
    return mo;
  }
  classify_mutant(e, m, mo);
  mo.wall_s = since(t0);
  return mo;
}



// The mutants whose file no gate program of the build compiles (restricted to `gates` when given):
// they could only come back "noop", so the catalog check refuses them. A mutant that needs CUDA
// is checked only against a CUDA build (a CPU build compiles no CUDA file). `why`: one line each.
std::vector<std::string> ungated_mutants(const GateFiles& gf, const std::vector<const Mutant*>& ms,
                                         const std::vector<std::string>& gates, std::vector<std::string>* why) {
  std::vector<std::string> out;
  const auto programs = gf.gate_programs();
  const bool cuda_build = std::find(programs.begin(), programs.end(), "gate_cuda") != programs.end();
  for (const Mutant* m : ms) {
    const bool needs_cuda = std::any_of(m->requires_.begin(), m->requires_.end(),
                                        [](const std::string& r) { return r == "cuda" || r == "cuda-device"; });
    if (needs_cuda && !cuda_build) continue;
    if (!gf.gates_compiling(m->file, gates).empty()) continue;
    out.push_back(m->id);
    if (why)
      why->push_back("kvgate mutate: mutant " + m->id + ": no gate program" +
                     (gates.empty() ? std::string() : " of this run") + " compiles " + m->file +
                     ", so no gate can kill it (it would come back noop); fix: build it into a gate program "
                     "(its library in a gate's link closure), move the mutant to a file a gate compiles, or drop it");
  }
  return out;
}

void print_list(const Catalog& cat, const std::vector<AnchorCheck>& checks, const std::vector<std::string>& nogate,
                std::ostream& log) {
  int w = 4, wf = 6;
  for (const auto& m : cat.mutants) {
    w = std::max(w, static_cast<int>(m.id.size()) + 2);
    wf = std::max(wf, static_cast<int>(m.file.size()) + 2);
  }
  log << std::left << std::setw(w) << "ID" << std::setw(12) << "CATEGORY" << std::setw(wf) << "FILE"
      << std::setw(8) << "ANCHOR" << "EXPECT_KILLED_BY\n";
  for (std::size_t i = 0; i < cat.mutants.size(); ++i) {
    const Mutant& m = cat.mutants[i];
    std::string ek;
    for (const auto& g : m.expect_killed_by) ek += (ek.empty() ? "" : ",") + g;
    std::string st = !checks[i].ok() ? (checks[i].file_missing ? "NOFILE" : checks[i].applied ? "APPLIED" : "STALE")
                     : std::find(nogate.begin(), nogate.end(), m.id) != nogate.end() ? "NOGATE" : "ok";
    log << std::left << std::setw(w) << m.id << std::setw(12) << m.category << std::setw(wf) << m.file
        << std::setw(8) << st << ek << (m.requires_.empty() ? "" : "  (requires " + m.requires_.front() + ")")
        << "\n";
  }
}

void write_outputs(const RunResult& r, const Env& e, std::ostream& log) {
  ReportContext ctx{e.o.source_dir, e.scratch, e.out, e.o.catalog.string(), e.o};
  try {
    write_reports(r, ctx, log);
  } catch (const std::exception& ex) {
    log << "kvgate mutate: error writing reports: " << ex.what() << "\n";
  }
  write_ci_outputs(r, ctx, std::cout, log);  // --junit, --format github
}

using Stop = std::optional<int>;  // a step's exit code when the run ends there

// Everything one `kvgate mutate` run carries from step to step.
struct Run {
  Env e;
  RunResult r;
  Catalog cat;
  std::vector<AnchorCheck> checks;        // one per catalog mutant
  std::vector<const Mutant*> selected;    // the mutants to run (not the canary)
  std::vector<std::string> left_out;      // --prove-gates: "<id>: why" for mutants it cannot run
  Clock::time_point t_setup = Clock::now();
  bool want_cuda = false;                 // a selected mutant needs a device and one is present
  std::unique_ptr<ScratchLock> lock;      // held for the whole run
  std::optional<InterruptGuard> interrupt_guard;
  // The scratch copy leaves the run as the source is: the instrumented files go back to their text
  // (the next run instruments its own selection again).
  ~Run() {
    for (const auto& [file, text] : e.schema.originals) {
      try {
        const fs::path p = e.scratch / file;
        if (fs::exists(p) && read_text(p) != text) write_text(p, text);
      } catch (...) {
      }
    }
  }
};

// The run state under the short names every step uses, declared by one line at the top of each step.
// A macro of references rather than a structured binding: clang 14 (Debian 12's, which builds the
// fuzz and sanitizer trees) cannot capture a structured binding in a lambda.
#define KVGATE_RUN_NAMES(s)                                        \
  [[maybe_unused]] Env& e = (s).e;                                 \
  [[maybe_unused]] RunResult& r = (s).r;                           \
  [[maybe_unused]] MutateOptions& o = (s).e.o;                     \
  [[maybe_unused]] std::ostream& log = *(s).e.log;                 \
  [[maybe_unused]] Catalog& cat = (s).cat;                         \
  [[maybe_unused]] std::vector<AnchorCheck>& checks = (s).checks;  \
  [[maybe_unused]] std::vector<const Mutant*>& selected = (s).selected; \
  [[maybe_unused]] const fs::path bl = (s).e.out / "baseline"

// Fill in the defaults: absolute source, catalog and schema paths, jobs.
Stop resolve_options(Run& s) {
  KVGATE_RUN_NAMES(s);
  if (o.source_dir.empty()) {
    log << "kvgate mutate: no source directory (pass --source-dir)\n";
    return kExitError;
  }
  o.source_dir = fs::absolute(o.source_dir).lexically_normal();
  if (o.catalog.empty()) o.catalog = o.source_dir / "mutations" / "catalog.json";
  o.catalog = fs::absolute(o.catalog);
  if (o.schema.empty()) {
    // Next to the catalog, else the schema of the tree this driver was built from.
    o.schema = o.catalog.parent_path() / "catalog.schema.json";
    if (!fs::exists(o.schema)) o.schema = fs::path(default_source_dir()) / "mutations" / "catalog.schema.json";
  }
  if (o.report_schema.empty())
    o.report_schema = o.source_dir / "mutations" / "schema" / "mutation-testing-report-schema.json";
  if (o.jobs < 1) o.jobs = 1;
  if (!o.extra_catalogs.empty() && !o.prove_gates) {
    log << "kvgate mutate: --catalog is given " << o.extra_catalogs.size() + 1
        << " times; only --prove-gates joins catalogs (run one catalog at a time otherwise)\n";
    return kExitError;
  }
  if (o.prove_gates && o.bail) {
    log << "kvgate mutate: --prove-gates needs every unproven gate's result; it does not combine with --bail (drop it)\n";
    return kExitError;
  }
  if (o.prove_gates && (o.expected_gates_only || o.shard_count > 1)) {
    log << "kvgate mutate: --prove-gates runs every unproven gate a mutant reaches; it does not combine with "
        << (o.expected_gates_only ? "--expected-gates-only" : "--shard") << " (drop it)\n";
    return kExitError;
  }
  if (!o.prove_gates && (!o.prove_seeds.empty() || o.prove_rebuild || o.prove_deadline_s != 0)) {
    log << "kvgate mutate: --prove-seed, --prove-rebuild and --prove-deadline need --prove-gates\n";
    return kExitError;
  }
  if (!(o.prove_deadline_s >= 0)) {
    log << "kvgate mutate: --prove-deadline " << o.prove_deadline_s
        << ": must be seconds after the start, > 0 (or 0 for none)\n";
    return kExitError;
  }

  return std::nullopt;
}

// The catalog: schema, IDs, then every anchor checked in the source tree.
Stop load_and_check_catalog(Run& s) {
  KVGATE_RUN_NAMES(s);
  // --- catalog: schema, ids, anchors ------------------------------------------------------
  try {
    cat = load_catalog(o.catalog, o.schema);
    if (!o.extra_catalogs.empty()) {
      std::vector<Catalog> all{cat};
      for (const auto& c : o.extra_catalogs) all.push_back(load_catalog(fs::absolute(c), o.schema));
      cat = join_catalogs(all);
    }
  } catch (const std::exception& ex) {
    log << "kvgate mutate: " << ex.what() << "\n";
    return kExitStale;
  }
  for (const auto& m : cat.mutants) checks.push_back(check_anchor(m, o.source_dir));
  return std::nullopt;
}

// --list: the catalog with anchor status; runs nothing.
Stop list_catalog(Run& s) {
  KVGATE_RUN_NAMES(s);
  const fs::path bdir = !o.build_dir.empty() ? fs::path(o.build_dir) : o.list_build_dir;
  std::vector<std::string> nogate, why;
  bool gate_check = false;
  if (!bdir.empty()) {
    const GateFiles gf(bdir);
    // Another tree's build says nothing about this catalog's files (unless --build-dir names it).
    gate_check = gf.loaded() && (!o.build_dir.empty() || gf.root() == o.source_dir);
    if (gate_check) {
      std::vector<const Mutant*> all;
      for (const auto& m : cat.mutants) all.push_back(&m);
      nogate = ungated_mutants(gf, all, {}, &why);
    }
  }
  print_list(cat, checks, nogate, log);
  int stale = 0;
  for (const auto& c : checks) stale += c.ok() ? 0 : 1;
  log << cat.mutants.size() << " mutants (" << (cat.canary() ? "1 canary" : "no canary") << "), " << stale
      << " stale, " << nogate.size() << " in a file no gate program compiles"
      << (gate_check ? " (checked against " + (bdir / "gates" / "gate_closure.txt").string() + ")"
                     : " (not checked: no build of this tree with gates/gate_closure.txt; pass --build-dir)")
      << "\n";
  for (const auto& c : checks)
    if (!c.ok()) log << c.message() << "\n";
  for (const auto& w : why) log << w << "\n";
  return stale || !nogate.empty() ? kExitStale : kExitOk;
}

// --only, --only-requires, --expected-gates-only, --since: the mutants of this run.
Stop select_mutants(Run& s) {
  KVGATE_RUN_NAMES(s);
  // --- selection -------------------------------------------------------------------------
  if (!o.only.empty()) {
    r.full_run = false;
    for (const auto& id : o.only) {
      const Mutant* m = cat.find(id);
      if (!m) {
        log << "kvgate mutate: --only names unknown mutant '" << id << "' (kvgate mutate --list shows them)\n";
        return kExitError;
      }
      if (!m->is_canary()) selected.push_back(m);
    }
  } else {
    for (const auto& m : cat.mutants)
      if (!m.is_canary()) selected.push_back(&m);
  }
  if (!o.only_requires.empty()) {
    r.full_run = false;
    std::erase_if(selected, [&](const Mutant* m) {
      return std::none_of(o.only_requires.begin(), o.only_requires.end(), [&](const std::string& req) {
        return std::find(m->requires_.begin(), m->requires_.end(), req) != m->requires_.end();
      });
    });
    std::string kinds;
    for (const auto& k : o.only_requires) kinds += (kinds.empty() ? "" : ",") + k;
    log << "kvgate mutate: --only-requires " << kinds << ": " << selected.size() << " mutant(s)\n";
  }
  if (o.expected_gates_only || o.bail) r.full_run = false;
  if (!o.since.empty()) {
    r.full_run = false;
    const auto [rc, diff] = capture_output({"git", "-C", o.source_dir.string(), "diff", "--name-only", "--relative", o.since, "--"});
    const auto [rc2, untracked] =
        capture_output({"git", "-C", o.source_dir.string(), "ls-files", "--others", "--exclude-standard"});
    if (rc != 0) {
      log << "kvgate mutate: git diff --name-only " << o.since << " failed (is it a revision?)\n";
      return kExitError;
    }
    std::set<std::string> changed, new_files;
    std::istringstream a(diff);
    for (std::string line; std::getline(a, line);)
      if (!line.empty()) changed.insert(line);
    std::istringstream u(rc2 == 0 ? untracked : std::string());
    for (std::string line; std::getline(u, line);)
      if (!line.empty()) new_files.insert(line);
    // By line: a mutant runs when the lines its anchor spans (in the tree now) touch a changed line;
    // an untracked file counts whole.
    const auto [rc3, hunks_text] =
        capture_output({"git", "-C", o.source_dir.string(), "diff", "-U0", "--relative", o.since, "--"});
    const auto hunks = changed_lines(rc3 == 0 ? hunks_text : std::string());
    const bool have_hunks = rc3 == 0;  // (not the binding itself: clang 14 cannot capture one)
    std::size_t by_file = 0;
    std::erase_if(selected, [&](const Mutant* m) {
      if (new_files.count(m->file)) return false;
      if (!changed.count(m->file)) return true;
      ++by_file;
      const auto it = hunks.find(m->file);
      if (!have_hunks || it == hunks.end()) return false;  // no hunks to read: the file counts whole
      std::string text;
      try {
        text = read_text(o.source_dir / m->file);
      } catch (...) {
        return false;
      }
      const TextSpan sp = anchor_span(text, m->anchor);
      return std::none_of(it->second.begin(), it->second.end(),
                          [&](const auto& r) { return sp.start.line <= r.second && r.first <= sp.end.line; });
    });
    log << "kvgate mutate: --since " << o.since << ": " << selected.size() << " mutant(s) on changed lines (of "
        << by_file << " on changed files" << (new_files.empty() ? "" : ", untracked files whole") << ")\n";
  }

  return std::nullopt;
}

// --shard k/n: the catalog digest and commit of the run, then this shard's part of the selection.
Stop shard_mutants(Run& s) {
  KVGATE_RUN_NAMES(s);
  r.shard.index = o.shard_index;
  r.shard.count = o.shard_count;
  try {
    r.shard.catalog_digest = file_digest(o.catalog);
  } catch (const std::exception& ex) {
    log << "kvgate mutate: " << ex.what() << "\n";
    return kExitError;
  }
  const SourceCommit sc = source_commit(o.source_dir);
  r.shard.commit = sc.commit;
  r.shard.dirty = sc.dirty;
  r.shard.selection.clear();
  for (const Mutant* m : selected) r.shard.selection.push_back(m->id);
  r.shard.full_selection = r.full_run && o.gate_targets.empty();
  if (o.shard_count > 1) {
    r.full_run = false;  // one shard's "gates that killed no mutant" says nothing; the merge checks it
    const std::size_t all = selected.size();
    selected = shard_of(selected, {o.shard_index, o.shard_count});
    log << "kvgate mutate: --shard " << o.shard_index << "/" << o.shard_count << ": " << selected.size() << " of "
        << all << " mutant(s) (position mod " << o.shard_count << " == " << o.shard_index << "; catalog "
        << r.shard.catalog_digest << ", commit " << (sc.commit.empty() ? "none" : sc.commit.substr(0, 12))
        << (sc.dirty ? " + uncommitted changes" : "") << ")\n";
  }
  return std::nullopt;
}

// A stale anchor stops the run for a mutant that would run (and the canary); others warn.
Stop refuse_stale_anchors(Run& s) {
  KVGATE_RUN_NAMES(s);
  {
    // STALE is a hard error for every mutant that would run (and the canary); a partial run only
    // warns about the others (the unit test mutations_unit checks the whole catalog).
    int stale = 0;
    // A mutant applied in the source tree (APPLIED) would be built into the scratch baseline: that
    // stops every run, selected or not, proof or not.
    int applied = 0;
    for (std::size_t i = 0; i < cat.mutants.size(); ++i)
      if (checks[i].applied) {
        log << "kvgate mutate: " << checks[i].message() << "\n";
        ++applied;
      }
    if (applied) return kExitStale;
    for (std::size_t i = 0; i < cat.mutants.size(); ++i) {
      if (checks[i].ok()) continue;
      const Mutant* m = &cat.mutants[i];
      if (o.prove_gates && !m->is_canary() && std::erase(selected, m) > 0) {
        // The proof runs what it can: a stale mutant is left out by name (proof.md lists it).
        log << "kvgate mutate: --prove-gates: left out: " << checks[i].message() << "\n";
        s.left_out.push_back(m->id + ": stale anchor (" + checks[i].message() + ")");
        continue;
      }
      const bool runs = (m->is_canary() && o.canary) ||
                        std::find(selected.begin(), selected.end(), m) != selected.end();
      log << "kvgate mutate: " << (runs ? "" : "warning (not selected): ") << checks[i].message() << "\n";
      stale += runs ? 1 : 0;
    }
    if (stale) return kExitStale;
    if (o.prove_gates) {  // the stale mutants left out are not instrumented either
      r.shard.selection.clear();
      for (const Mutant* m : selected) r.shard.selection.push_back(m->id);
    }
  }

  return std::nullopt;
}

// Scratch, build and output folders; the scratch lock; Ctrl-C handling.
Stop prepare_scratch(Run& s) {
  KVGATE_RUN_NAMES(s);
  // --- scratch copy and build ---------------------------------------------------------------
  e.scratch = o.scratch_dir.empty() ? o.source_dir / ".scratch" / "mutants" : fs::absolute(o.scratch_dir);
  e.build = o.build_dir.empty() ? e.scratch / "build" : fs::absolute(o.build_dir);
  e.out = fs::absolute(o.out_dir);
  e.scratch = e.scratch.lexically_normal();
  e.build = e.build.lexically_normal();
  if (e.scratch == o.source_dir || (o.source_dir / "").string().rfind((e.scratch / "").string(), 0) == 0) {
    log << "kvgate mutate: the scratch directory must not be (or contain) the source tree\n";
    return kExitError;
  }
  try {
    s.lock = std::make_unique<ScratchLock>(fs::path(e.scratch.string() + ".lock"));
  } catch (const std::exception& ex) {
    log << "kvgate mutate: " << ex.what() << "\n";
    return kExitError;
  }
  s.interrupt_guard.emplace();
  fs::create_directories(e.out);
  for (const char* stale : {"baseline", "canary", "mutants", "prove"}) fs::remove_all(e.out / stale);
  fs::create_directories(e.out / "baseline");

  return std::nullopt;
}

// requires: cuda-device. Probed before building: with no device those mutants are skipped
// (with the reason) instead of surviving gates that skip; with one, the scratch build gets CUDA.
Stop probe_device(Run& s) {
  KVGATE_RUN_NAMES(s);
  // --- requires: cuda-device ----------------------------------------------------------------
  // Probed before building: without a device those mutants are skipped (with the reason) instead
  // of "surviving" gates that skip; with one, the scratch build gets CUDA.
  if (std::any_of(selected.begin(), selected.end(), [](const Mutant* m) { return needs_device(*m); })) {
    const DeviceProbe dp = probe_cuda_device(e.out / "baseline" / "device_probe.log");
    e.device_probed = true;
    e.device_present = dp.present;
    e.device_how = dp.how;
    log << "kvgate mutate: CUDA device " << (dp.present ? "found" : "not found") << " (" << dp.how << ")\n";
    s.want_cuda = dp.present;
    if (std::all_of(selected.begin(), selected.end(),
                    [&](const Mutant* m) { return !requirement_gap(e, *m, false).empty(); })) {
      // Nothing can run here: build nothing, report every selected mutant as skipped.
      for (const Mutant* m : selected) {
        MutantOutcome mo;
        mo.mutant = m;
        mo.status = MutantStatus::skipped;
        mo.reason = requirement_gap(e, *m, false);
        count(r.summary, mo.status);
        log << "  skipped: " << m->id << " -- " << mo.reason << "\n";
        r.outcomes.push_back(std::move(mo));
      }
      r.full_run = false;
      r.exit_code = kExitOk;
      write_outputs(r, e, log);
      log << "kvgate mutate: " << r.summary.skipped << " mutant(s) skipped, nothing built; outputs in "
          << e.out.string() << "; exit 0\n";
      return r.exit_code;
    }
  }

  return std::nullopt;
}

// Mirror the source into the scratch copy and check the anchors again there.
Stop sync_scratch(Run& s) {
  KVGATE_RUN_NAMES(s);
  const auto files = list_source_files(o.source_dir);
  const SyncStats ss = sync_tree(o.source_dir, e.scratch, files, {e.build});
  log << "kvgate mutate: scratch " << e.scratch.string() << ": " << ss.copied << " copied, " << ss.unchanged
      << " unchanged, " << ss.removed << " removed\n";
  // Anchors again, in the copy the mutants are applied to (the source may have moved meanwhile).
  for (const auto* m : selected) {
    const AnchorCheck c = check_anchor(*m, e.scratch);
    if (!c.ok()) {
      log << "kvgate mutate: " << c.message() << " (in the scratch copy)\n";
      return kExitStale;
    }
  }
  if (const Mutant* c = cat.canary(); c && o.canary && !check_anchor(*c, e.scratch).ok()) {
    log << "kvgate mutate: " << check_anchor(*c, e.scratch).message() << "\n";
    return kExitStale;
  }

  return std::nullopt;
}

// Mutant schemata: the selected mutants (not the canary, which proves the rebuild path) written
// into the scratch copy as run-time switches where they can be; the others are patched and rebuilt.
Stop instrument_scratch(Run& s) {
  KVGATE_RUN_NAMES(s);
  if (!o.schemata) return std::nullopt;
  // The whole selection before --shard: every shard of a run then compiles the same switches, so
  // shards run one after another on one machine share one scratch build.
  std::vector<const Mutant*> ms;
  for (const auto& id : r.shard.selection)
    if (const Mutant* m = cat.find(id); m && requirement_gap(e, *m, false).empty()) ms.push_back(m);
  try {
    e.schema = plan_schemata(e.scratch, ms);
    write_schemata(e.scratch, e.schema, schema_header_path(e));
  } catch (const std::exception& ex) {
    log << "kvgate mutate: schemata: " << ex.what() << "\n";
    return kExitError;
  }
  log << "kvgate mutate: schemata: " << e.schema.switched.size() << " of " << ms.size()
      << " mutant(s) compiled in as switches, " << e.schema.fallback.size() << " patched and rebuilt\n";
  return std::nullopt;
}

// The build's and the gates' environment (ccache base, source dir, models).
Stop set_environments(Run& s) {
  KVGATE_RUN_NAMES(s);
  e.build_env = {{"KVGATE_SOURCE_DIR", e.scratch.string()}};
  if (!std::getenv("CCACHE_BASEDIR")) {
    // Compile commands of the scratch build then hash like the user's own build (same relative
    // layout), so a fresh scratch build is mostly ccache hits.
    const fs::path base = common_ancestor(o.source_dir, e.scratch);
    if (base.has_relative_path()) e.build_env.emplace_back("CCACHE_BASEDIR", base.string());
  }
  e.gate_env = {{"KVGATE_SOURCE_DIR", e.scratch.string()}};
  // The shared test models (stories260K) are not in the repository: gates look for them in
  // $KVGATE_MODELS, else next to the source tree; the scratch copy sits elsewhere, so point the
  // gates at the source's models explicitly.
  if (!std::getenv("KVGATE_MODELS")) {
    const std::string models = kvgate::existing_model_dir(o.source_dir.string());
    if (!models.empty()) e.gate_env.emplace_back("KVGATE_MODELS", models);
  }

  return std::nullopt;
}

// Configure the scratch build once, else regenerate it when a CMakeLists.txt changed.
Stop configure_scratch_build(Run& s) {
  KVGATE_RUN_NAMES(s);
  if (!fs::exists(e.build / "build.ninja")) {
    std::vector<std::string> argv{"cmake", "-S", e.scratch.string(), "-B", e.build.string(), "-G", "Ninja",
                                  "-DKVGATE_CUDA=OFF", "-DKVGATE_BUILD_BENCH=OFF", "-DCMAKE_BUILD_TYPE=Release"};
    if (s.want_cuda) argv.push_back("-DKVGATE_CUDA=ON");  // a later -D wins
    for (const auto& a : o.cmake_args) argv.push_back(a);
    log << "kvgate mutate: configuring the scratch build " << e.build.string() << "\n";
    const ProcResult cr = run_process({argv, {}, e.build_env, (bl / "configure.log").string(), 0});
    if (!cr.ok()) {
      log << "kvgate mutate: configure failed (" << cr.describe() << "), see " << (bl / "configure.log").string()
          << "\n";
      return interrupted() ? kExitInterrupted : kExitError;
    }
  } else {
    // Re-run CMake when a CMakeLists.txt changed, so that the gate list is current.
    const ProcResult cr = run_process({{"ninja", "-C", e.build.string(), "build.ninja"}, {}, e.build_env,
                                       (bl / "configure.log").string(), 0});
    if (!cr.ok()) {
      log << "kvgate mutate: regenerating the scratch build failed, see " << (bl / "configure.log").string() << "\n";
      return interrupted() ? kExitInterrupted : kExitError;
    }
  }
  return std::nullopt;
}

// <build>/gates/gates.txt (mutations/CMakeLists.txt) -> the gate executables; CMakeCache.txt -> is
// it a CUDA build.
bool read_gate_list(Run& s) {
  KVGATE_RUN_NAMES(s);
  const fs::path gates_txt = e.build / "gates" / "gates.txt";
  e.exes.clear();
  e.targets.clear();
  e.cuda_build = false;
  const std::string cache = read_text(e.build / "CMakeCache.txt");
  const auto p = cache.find("CMAKE_CUDA_COMPILER:");
  if (p != std::string::npos) {
    const auto eq = cache.find('=', p), nl = cache.find('\n', p);
    e.cuda_build = eq != std::string::npos && eq + 1 < nl && cache.substr(eq + 1, nl - eq - 1).find("NOTFOUND") ==
                                                               std::string::npos;
  }
  if (!fs::exists(gates_txt)) {
    log << "kvgate mutate: " << gates_txt.string()
        << " is missing: the build lists its gates there (mutations/CMakeLists.txt)\n";
    return false;
  }
  std::istringstream in(read_text(gates_txt));
  for (std::string line; std::getline(in, line);) {
    const auto tab = line.find('\t');
    if (line.empty() || tab == std::string::npos) continue;
    GateExe x;
    x.target = line.substr(0, tab);
    x.path = line.substr(tab + 1);
    // A CUDA build lists the GPU gate program; CMakeCache.txt may not name the CUDA compiler
    // (found through check_language), so this is the reliable signal for `requires: cuda`.
    if (x.target == "gate_cuda") e.cuda_build = true;
    e.exes.push_back(x);
    e.targets.push_back(x.target);
  }
  return true;
}

// The gate programs of the scratch build (reconfigured with CUDA when a device mutant needs it).
Stop list_gate_programs(Run& s) {
  KVGATE_RUN_NAMES(s);
  if (!read_gate_list(s)) return kExitError;
  if (s.want_cuda && !e.cuda_build) {
    // An existing scratch build configured without CUDA: a device mutant needs gate_cuda.
    log << "kvgate mutate: reconfiguring the scratch build with -DKVGATE_CUDA=ON (a selected mutant requires "
           "a CUDA device)\n";
    const ProcResult cr = run_process({{"cmake", "-S", e.scratch.string(), "-B", e.build.string(), "-DKVGATE_CUDA=ON"},
                                       {}, e.build_env, (bl / "configure_cuda.log").string(), 0});
    if (!cr.ok()) {
      log << "kvgate mutate: configure with CUDA failed, see " << (bl / "configure_cuda.log").string() << "\n";
      return interrupted() ? kExitInterrupted : kExitError;
    }
    if (!read_gate_list(s)) return kExitError;
  }
  return std::nullopt;
}

// --gate-targets: only these gate programs.
Stop restrict_gate_targets(Run& s) {
  KVGATE_RUN_NAMES(s);
  if (!o.gate_targets.empty()) {
    r.full_run = false;
    for (const auto& t : o.gate_targets)
      if (std::none_of(e.exes.begin(), e.exes.end(), [&](const GateExe& x) { return x.target == t; })) {
        log << "kvgate mutate: --gate-targets names '" << t << "', which is not a gate executable of this build ("
            << (e.build / "gates" / "gates.txt").string() << ")\n";
        return kExitError;
      }
    std::erase_if(e.exes, [&](const GateExe& x) {
      return std::find(o.gate_targets.begin(), o.gate_targets.end(), x.target) == o.gate_targets.end();
    });
    e.targets = o.gate_targets;
  }
  if (e.exes.empty()) {
    log << "kvgate mutate: the build defines no gate executables (kvgate_add_gate)\n";
    return kExitError;
  }
  return std::nullopt;
}

// The baseline build with the schemata: while it fails, each switch the compiler's errors name
// moves to its next form or to patch-and-rebuild, and the build runs again (only the files whose
// switches changed recompile). Errors that name no switch are the tree's own: the build is red.
bool build_with_schemata(Run& s) {
  KVGATE_RUN_NAMES(s);
  for (int round = 1;; ++round) {
    double secs = 0;
    const fs::path lp = bl / (round == 1 ? "build.log" : "build." + std::to_string(round) + ".log");
    const bool ok = run_build(e, lp, &secs, !e.schema.switched.empty());
    r.baseline_build_s += secs;
    if (ok) {
      if (round > 1) fs::copy_file(lp, bl / "build.log", fs::copy_options::overwrite_existing);
      return true;
    }
    if (e.schema.switched.empty() || interrupted()) return false;
    const int moved = demote_on_errors(e.schema, error_locations(read_text(lp)), e.scratch, log);
    if (moved == 0) return false;
    write_schemata(e.scratch, e.schema, schema_header_path(e));
    log << "kvgate mutate: schemata: build round " << round << " failed (" << lp.filename().string() << "): " << moved
        << " switch(es) moved; " << e.schema.switched.size() << " left\n";
  }
}

// Build the unmutated gate programs; snapshot their objects (and copy them for --restore-objects).
Stop build_baseline(Run& s) {
  KVGATE_RUN_NAMES(s);
  log << "kvgate mutate: building " << e.exes.size() << " gate executable(s) in " << e.build.string() << "\n";
  if (!build_with_schemata(s)) {
    log << "kvgate mutate: the unmutated scratch tree does not build, see " << (bl / "build.log").string() << "\n";
    r.baseline_red.push_back("build");
    r.exit_code = interrupted() ? kExitInterrupted : kExitBaselineRed;
    write_outputs(r, e, log);
    return r.exit_code;
  }
  e.objects = snapshot_objects(e.build);
  if (o.restore_objects) {
    // Inside the build (the mirror step keeps it), named so that the *.o snapshot skips it.
    e.object_backup = e.build / ".kvgate-baseline-objects";
    std::error_code ec;
    fs::remove_all(e.object_backup, ec);
    for (const auto& [path, info] : e.objects) {
      const fs::path dst = e.object_backup / (fs::relative(path, e.build).string() + ".baseline");
      fs::create_directories(dst.parent_path());
      fs::copy_file(path, dst, fs::copy_options::overwrite_existing);
    }
    log << "kvgate mutate: --restore-objects: " << e.objects.size() << " baseline objects copied to "
        << e.object_backup.string() << "\n";
  }
  return std::nullopt;
}

// The catalog check against the scratch build: a mutant to run (or the canary) whose file no gate
// program of this run compiles is refused by name (exit 5) instead of being reported noop.
Stop refuse_ungated_mutants(Run& s) {
  Env& e = s.e;
  std::ostream& log = *e.log;
  const GateFiles gf(e.build);
  if (!gf.loaded()) {
    log << "kvgate mutate: warning: " << (e.build / "gates" / "gate_closure.txt").string()
        << " is missing: which files the gates compile is not checked\n";
    return std::nullopt;
  }
  std::vector<const Mutant*> ms = s.selected;
  if (const Mutant* c = s.cat.canary(); c && e.o.canary) ms.push_back(c);
  std::erase_if(ms, [&](const Mutant* m) { return !requirement_gap(e, *m, false).empty(); });
  std::vector<std::string> why;
  const auto bad = ungated_mutants(gf, ms, e.targets, &why);
  if (e.o.prove_gates && !e.o.gate_targets.empty()) {
    // A proof over some programs (--gate-targets): the mutants none of them compiles are no
    // candidates here, not an error (the canary must still be compiled by them).
    for (const auto& id : bad) {
      if (const Mutant* c = s.cat.canary(); c && c->id == id) continue;
      std::erase_if(s.selected, [&](const Mutant* m) { return m->id == id; });
      s.left_out.push_back(id + ": no gate program of --gate-targets compiles its file");
    }
    const Mutant* c = s.cat.canary();
    const bool canary_bad = c && std::find(bad.begin(), bad.end(), c->id) != bad.end();
    if (!bad.empty()) log << "kvgate mutate: --prove-gates: " << bad.size() - (canary_bad ? 1 : 0)
                          << " mutant(s) in files no gate program of --gate-targets compiles: left out\n";
    return canary_bad ? Stop{kExitStale} : Stop{};
  }
  for (const auto& w : why) log << w << "\n";
  return bad.empty() ? Stop{} : Stop{kExitStale};
}

// The environment matrix: every variant in which the build's ctest runs a gate program (read from
// `ctest --show-only=json-v1`: a test whose command is a gate executable, with its ENVIRONMENT
// less KVGATE_SOURCE_DIR, which the driver sets itself). A program runs in "default" and in each
// such variant: e.g. gate_model under KVGATE_NO_AVX2=1 (the portable page readers), so a mutant
// in code only that environment reaches is proven too. The variant is named after the test
// (gate_model_no_avx2 -> no_avx2).
Stop list_variants(Run& s) {
  [[maybe_unused]] Env& e = s.e;
  [[maybe_unused]] RunResult& r = s.r;
  [[maybe_unused]] std::ostream& log = *e.log;
  e.variants = {{"default", {"default", {}}}};
  for (auto& x : e.exes) x.variants = {"default"};
  const auto [rc, text] = capture_output({"ctest", "--test-dir", e.build.string(), "--show-only=json-v1"});
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (...) {
  }
  if (rc != 0 || !doc.is_object()) {
    log << "kvgate mutate: warning: `ctest --show-only=json-v1` gave no test list (exit " << rc
        << "): every gate program runs in its default environment only\n";
  }
  for (const auto& t : doc.value("tests", nlohmann::json::array())) {
    const std::string name = t.value("name", "");
    const auto cmd = t.value("command", nlohmann::json::array());
    std::vector<std::pair<std::string, std::string>> env;
    for (const auto& p : t.value("properties", nlohmann::json::array()))
      if (p.value("name", "") == "ENVIRONMENT")
        for (const auto& kv : p.value("value", nlohmann::json::array())) {
          const std::string a = kv.get<std::string>();
          const auto eq = a.find('=');
          if (eq == std::string::npos || a.substr(0, eq) == "KVGATE_SOURCE_DIR") continue;
          env.emplace_back(a.substr(0, eq), a.substr(eq + 1));
        }
    if (env.empty()) continue;
    for (auto& x : e.exes) {
      // The command names the program once it is built; the test name starts with its target.
      const bool same_exe = !cmd.empty() && cmd[0].is_string() && fs::path(cmd[0].get<std::string>()) == x.path;
      if (!same_exe || name.rfind(x.target + "_", 0) != 0) continue;
      if (cmd.size() > 1) {
        log << "kvgate mutate: warning: ctest " << name << " passes arguments to " << x.target
            << "; not a variant (the driver runs whole programs)\n";
        continue;
      }
      std::string v = name.substr(x.target.size() + 1);
      for (auto& c : v) c = std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::tolower(c)) : '_';
      if (e.variants.count(v) && e.variants[v].env != env) v += "_" + x.target;
      e.variants[v] = {v, env};
      if (std::find(x.variants.begin(), x.variants.end(), v) == x.variants.end()) x.variants.push_back(v);
    }
  }
  r.variants.clear();
  r.variants.push_back(e.variants["default"]);
  for (const auto& [n, v] : e.variants)
    if (n != "default") r.variants.push_back(v);
  for (const auto& x : e.exes)
    if (x.variants.size() > 1) {
      std::string vs;
      for (const auto& v : x.variants) {
        vs += " " + v;
        if (v != "default")
          for (const auto& [k, val] : e.variants[v].env) vs += " (" + k + "=" + val + ")";
      }
      log << "kvgate mutate: " << x.target << " runs in" << vs << "\n";
    }
  return std::nullopt;
}

// --expected-gates-only: the union of the selected mutants' expected gates.
Stop focus_gates(Run& s) {
  KVGATE_RUN_NAMES(s);
  if (o.expected_gates_only) {
    // Over the whole selection before --shard, so every shard runs the same baseline gates (the
    // merge requires one gate set).
    for (const auto& sid : r.shard.selection) {
      const Mutant* m = cat.find(sid);
      if (!m || !requirement_gap(e, *m, false).empty()) continue;
      for (const auto& id : m->expect_killed_by)
        if (std::find(e.focus.begin(), e.focus.end(), id) == e.focus.end()) e.focus.push_back(id);
    }
    std::string ids;
    for (const auto& id : e.focus) ids += " " + id;
    log << "kvgate mutate: --expected-gates-only: " << e.focus.size() << " gate(s):" << ids << "\n";
  }
  r.setup_s = since(s.t_setup);
  return std::nullopt;
}

// Every gate on the unmutated tree: it must be green (or, with --skip-red-gates, the red ones are left out).
Stop run_baseline(Run& s) {
  KVGATE_RUN_NAMES(s);
  // --- baseline --------------------------------------------------------------------------
  log << "kvgate mutate: baseline (build " << fmt_s(r.baseline_build_s) << ")...\n";
  if (!o.expected_gates_only)
    for (auto& x : e.exes)
      if (const auto it = o.gate_shards.find(x.target); it != o.gate_shards.end() && it->second > 1) {
        x.gate_ids = list_gate_ids(x);
        log << "kvgate mutate: --gate-shards " << x.target << "=" << it->second << ": "
            << (x.gate_ids.empty() ? std::string("its test list did not answer; the baseline runs it whole")
                                   : std::to_string(x.gate_ids.size()) + " gate IDs listed")
            << "\n";
      }
  const auto base =
      run_gates(e, bl / "gates", 1.0, true, &r.baseline_test_s, o.expected_gates_only ? &e.focus : nullptr);
  if (!e.focus_dropped.empty()) {
    for (const auto& t : e.focus_dropped) log << "kvgate mutate: " << t << " has none of the focused gates: not run\n";
    std::erase_if(e.exes, [&](const GateExe& x) {
      return std::find(e.focus_dropped.begin(), e.focus_dropped.end(), x.target) != e.focus_dropped.end();
    });
    std::erase_if(e.targets, [&](const std::string& t) {
      return std::find(e.focus_dropped.begin(), e.focus_dropped.end(), t) != e.focus_dropped.end();
    });
  }
  r.exes = e.exes;
  for (const auto& id : e.gate_order) r.gates.push_back(e.gates[id]);
  if (!e.schema.switched.empty() && !o.all_gates) {
    // Coverage: which switches each run unit evaluated.
    for (const auto& x : e.exes)
      for (const auto& v : x.variants) {
        const std::string stem = unit_stem(x, v);
        std::set<std::string>& ids = e.reach[stem];
        // The unit's own file, or its shards' (stem#k.reach, --gate-shards): their union.
        std::error_code ec;
        for (const auto& f : fs::directory_iterator(bl / "gates", ec)) {
          const std::string name = f.path().filename().string();
          if (name != stem + ".reach" && !(name.starts_with(stem + "#") && name.ends_with(".reach"))) continue;
          std::istringstream in(read_text(f.path()));
          for (std::string line; std::getline(in, line);)
            if (!line.empty()) ids.insert(line);
        }
      }
    std::size_t reached_any = 0;
    for (const auto& en : e.schema.switched)
      reached_any += std::any_of(e.reach.begin(), e.reach.end(), [&](const auto& kv) { return kv.second.count(en.mutant->id) > 0; });
    log << "kvgate mutate: coverage: " << reached_any << " of " << e.schema.switched.size()
        << " switches evaluated by some gate program in the baseline; a switched mutant runs only the programs that "
           "reach it (--all-gates: every program)\n";
  }
  // Longest first: with --jobs > 1 the slowest executable starts at once (shorter makespan).
  std::stable_sort(e.exes.begin(), e.exes.end(),
                   [](const GateExe& a, const GateExe& b) { return a.baseline_s > b.baseline_s; });
  for (const auto& id : e.gate_order) {
    const auto it = base.find(id);
    if (it == base.end() || (it->second.status != GateStatus::passed && it->second.status != GateStatus::skipped))
      r.baseline_red.push_back(id);
  }
  for (const auto& x : e.exes)
    if (x.gate_ids.empty()) {
      log << "kvgate mutate: gate executable " << x.target << " reported no test cases (see "
          << (bl / "gates" / (x.target + ".log")).string() << ")\n";
      r.baseline_red.push_back(x.target);
    }
  r.baseline_green = r.baseline_red.empty();
  {
    std::ostringstream o2;
    for (const auto& x : e.exes) o2 << " " << x.target << "=" << fmt_s(x.baseline_s);
    log << "kvgate mutate: baseline " << (r.baseline_green ? "green" : "RED") << ": " << e.gates.size()
        << " gates in " << e.exes.size() << " executables, " << fmt_s(r.baseline_test_s) << " (" << o2.str()
        << " )\n";
  }
  if (interrupted()) {
    r.interrupted = true;
    r.exit_code = kExitInterrupted;
    write_outputs(r, e, log);
    return r.exit_code;
  }
  if (!r.baseline_green) {
    for (const auto& id : r.baseline_red) {
      const auto it = base.find(id);
      const std::string why = it != base.end() ? std::string(to_string(it->second.status)) + ": " + it->second.detail +
                                                       ", log " + it->second.log
                                                 : std::string("no outcome");
      e.red_why[id] = why;
      log << "  not green: " << id << " (" << why << ")\n";
    }
    const bool only_gates = std::all_of(r.baseline_red.begin(), r.baseline_red.end(),
                                        [&](const std::string& id) { return e.gates.count(id) > 0; });
    if (o.skip_red_gates && (o.expected_gates_only || o.prove_gates) && only_gates) {
      // One device call is precious: leave the red gates out and run the mutants that do not need
      // them (their status and the exit code 4 still say the baseline was red).
      e.red.insert(r.baseline_red.begin(), r.baseline_red.end());
      log << "kvgate mutate: --skip-red-gates: " << e.red.size()
          << " red gate(s) left out; mutants that expect only those are skipped (exit 4 at the end)\n";
    } else {
      r.exit_code = kExitBaselineRed;
      write_outputs(r, e, log);
      return r.exit_code;
    }
  }

  return std::nullopt;
}

// The canary must turn every proven gate red: else a gate does not run the code the driver mutates.
Stop run_canary(Run& s) {
  KVGATE_RUN_NAMES(s);
  // --- canary ----------------------------------------------------------------------------
  if (const Mutant* c = cat.canary(); c && o.canary) {
    log << "kvgate mutate: canary " << c->id << "...\n";
    e.no_bail = true;  // the canary must turn every gate red: all of them run
    r.canary = run_mutant(e, *c, e.out / "canary" / c->id);
    e.no_bail = false;
    r.canary_ran = true;
    if (r.canary.status == MutantStatus::interrupted) {
      r.interrupted = true;
      r.exit_code = kExitInterrupted;
      write_outputs(r, e, log);
      return r.exit_code;
    }
    for (const auto& g : r.gates) {
      if (g.skipped || e.red.count(g.id)) continue;
      const auto it = r.canary.gates.find(g.id);
      if (it == r.canary.gates.end() || !is_kill(it->second.status)) r.canary_survivors.push_back(g.id);
    }
    if (r.canary.status == MutantStatus::unviable || r.canary.status == MutantStatus::noop) {
      log << "kvgate mutate: the canary is " << to_string(r.canary.status) << ": " << r.canary.reason << "\n";
      r.canary_survivors = {"(canary " + std::string(to_string(r.canary.status)) + ")"};
    }
    if (!r.canary_survivors.empty()) {
      log << "kvgate mutate: the canary left gates green, so they do not run the code the driver mutates:";
      for (const auto& id : r.canary_survivors) log << " " << id;
      log << "\n";
      r.exit_code = kExitBaselineRed;
      write_outputs(r, e, log);
      return r.exit_code;
    }
    log << "kvgate mutate: canary turned all " << r.gates.size() << " gates red (" << fmt_s(r.canary.wall_s)
        << ")\n";
  } else if (!cat.canary() && o.canary) {
    log << "kvgate mutate: warning: the catalog has no canary (category \"canary\")\n";
  }

  return std::nullopt;
}

// The canary's patch, reverted, is built away before the switches run, so they run in the baseline
// binaries.
Stop build_after_canary(Run& s) {
  KVGATE_RUN_NAMES(s);
  if (e.schema.switched.empty()) return std::nullopt;
  double secs = 0;
  if (!run_build(e, bl / "build.after_canary.log", &secs)) {
    log << "kvgate mutate: rebuilding the unmutated tree after the canary failed, see "
        << (bl / "build.after_canary.log").string() << "\n";
    r.exit_code = kExitError;
    write_outputs(r, e, log);
    return r.exit_code;
  }
  r.baseline_build_s += secs;
  return std::nullopt;
}

// --prove-gates: every gate ID shown able to go red (prove.hpp), in place of the mutant-by-mutant
// run. The candidates are the selected mutants the environment can run: a switch reaches the
// programs whose baseline evaluated it, a patched mutant the programs that compile its file.
Stop prove_every_gate(Run& s) {
  KVGATE_RUN_NAMES(s);
  if (Stop rc = build_after_canary(s)) return rc;
  const auto t0 = Clock::now();
  ProofRecord rec;
  rec.started_at = r.started_at;
  rec.commit = r.shard.commit;
  rec.dirty = r.shard.dirty;
  rec.catalogs.push_back(o.catalog.string());
  for (const auto& c : o.extra_catalogs) rec.catalogs.push_back(fs::absolute(c).string());
  rec.baseline_build_s = r.baseline_build_s;
  rec.baseline_test_s = r.baseline_test_s;
  rec.skipped_mutants = s.left_out;
  for (const auto& id : e.gate_order) {
    const Gate& g = e.gates[id];
    rec.gates.push_back({id, g.exe, g.baseline_s});
    if (g.skipped) rec.not_provable[id] = "skipped in the baseline: " + g.skip_reason;
    if (e.red.count(id))
      rec.not_provable[id] = "red in the baseline, left out by --skip-red-gates (" +
                             (e.red_why.count(id) ? e.red_why.at(id) : std::string("no outcome")) + ")";
  }
  for (const auto& seed : o.prove_seeds) {
    try {
      seed_proofs(rec, seed, log);
    } catch (const std::exception& ex) {
      log << "kvgate mutate: --prove-seed: " << ex.what() << "\n";
      return kExitError;
    }
  }
  const GateFiles gf(e.build);
  std::vector<ProofCandidate> cands;
  for (const Mutant* m : selected) {
    if (const std::string gap = requirement_gap(e, *m, true); !gap.empty()) {
      rec.skipped_mutants.push_back(m->id + ": " + gap);
      continue;
    }
    ProofCandidate c;
    c.mutant = m;
    c.rebuild = !e.schema.has(m->id);
    for (const auto& x : e.exes) {
      bool reaches = e.reach.empty();  // --all-gates (or no switches): no coverage, every program
      if (!c.rebuild)
        for (const auto& v : x.variants)
          if (const auto it = e.reach.find(unit_stem(x, v)); it != e.reach.end() && it->second.count(m->id)) reaches = true;
      if (c.rebuild) {
        const auto progs = gf.loaded() ? gf.gates_compiling(m->file, {x.target}) : std::vector<std::string>{x.target};
        reaches = !progs.empty() || fs::path(m->file).extension() == ".py";
      }
      if (reaches) c.programs.insert(x.target);
    }
    if (!c.programs.empty()) cands.push_back(std::move(c));
    else rec.skipped_mutants.push_back(m->id + ": no gate program reaches it (none evaluated its switch in the baseline)");
  }
  std::map<std::string, int> runs_of;  // per mutant: how many runs so far (a rerun alone gets its own folder)
  const ProofRunner runner = [&](const ProofCandidate& c, const std::vector<std::string>& gates) {
    const int k = runs_of[c.mutant->id]++;
    const fs::path dir = e.out / "prove" / (k == 0 ? c.mutant->id : c.mutant->id + ".alone." + gates.front());
    e.prove_focus = &gates;
    MutantOutcome mo;
    try {
      mo = run_mutant(e, *c.mutant, dir);
    } catch (...) {
      e.prove_focus = nullptr;
      throw;
    }
    e.prove_focus = nullptr;
    if (mo.status == MutantStatus::unviable || (mo.status == MutantStatus::noop && mo.gates.empty()))
      for (const auto& id : gates)
        mo.gates[id] = GateOutcome{GateStatus::not_run, 0, mo.build_log, std::string(to_string(mo.status)) + ": " + mo.reason, "default", {}};
    return mo.gates;
  };
  log << "kvgate mutate: --prove-gates: " << rec.gates.size() << " gates (" << rec.proven.size() << " seeded, "
      << rec.not_provable.size() << " skipped in the baseline), " << cands.size() << " candidate mutant(s)\n";
  rec.deadline_s = o.prove_deadline_s;
  if (o.prove_deadline_s > 0)
    log << "kvgate mutate: --prove-deadline " << fmt_s(o.prove_deadline_s) << ": " << fmt_s(since(s.t_setup))
        << " gone; no mutant run starts after it\n";
  ProofLoop loop;
  loop.rebuild = o.prove_rebuild;
  loop.first = o.prove_first;
  for (const auto& id : o.prove_first)
    if (std::none_of(cands.begin(), cands.end(), [&](const ProofCandidate& c) { return c.mutant->id == id; }))
      log << "kvgate mutate: --prove-first " << id << ": not a candidate here (unknown ID, a requirement unmet, or no "
             "gate program of this run compiles its file): left out\n";
  loop.stop = [] { return interrupted(); };
  if (o.prove_deadline_s > 0) loop.past_deadline = [&] { return since(s.t_setup) >= o.prove_deadline_s; };
  // proof.json / proof.md after every finished run: a process killed at a wall limit leaves them.
  loop.checkpoint = [&](const ProofRecord& now) {
    ProofRecord snap = now;
    snap.wall_s = since(t0);
    try {
      write_proof(snap, e.out);
    } catch (const std::exception& ex) {
      log << "kvgate mutate: warning: writing the proof checkpoint failed: " << ex.what() << "\n";
    }
  };
  try {
    prove_gates(rec, cands, runner, loop, log);
  } catch (const std::exception& ex) {
    log << "kvgate mutate: --prove-gates: " << ex.what() << "\n";
    return kExitError;
  }
  rec.wall_s = since(t0);
  int rc = kExitError;
  try {
    rc = write_proof(rec, e.out);
  } catch (const std::exception& ex) {
    log << "kvgate mutate: error writing the proof: " << ex.what() << "\n";
    return kExitError;
  }
  log << "kvgate mutate: --prove-gates: " << rec.proven.size() << " of " << rec.gates.size() << " gates proven, "
      << rec.unproven.size() << " unproven, " << rec.not_provable.size() << " not provable here; " << rec.runs
      << " mutant run(s) in " << fmt_s(rec.wall_s) << "\n";
  for (const auto& id : rec.unproven) log << "  unproven: " << id << "\n";
  if (!e.red.empty() && (rc == kExitOk || rc == kExitExpectation)) {
    log << "kvgate mutate: --skip-red-gates: " << e.red.size()
        << " gate(s) red in the baseline were left out of the proof (not provable here): exit 4\n";
    rc = kExitBaselineRed;
  }
  log << "kvgate mutate: outputs in " << e.out.string() << " (proof.md, proof.json); exit " << rc << "\n";
  return rc;
}

// The compile-ahead workers over the rebuild mutants of `order` that will run (not the switches,
// not those the build cannot run), or none (--no-compile-ahead, no such mutant, no copy possible;
// without ccache the workers say so and compile nothing).
std::unique_ptr<CompileAhead> start_compile_ahead(const Env& e, const std::vector<const Mutant*>& order) {
  if (!e.o.compile_ahead || interrupted()) return nullptr;
  std::vector<AheadJob> jobs;
  for (const Mutant* m : order) {
    if (e.schema.has(m->id) || !requirement_gap(e, *m, true).empty()) continue;
    const fs::path file = e.scratch / m->file;
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) continue;
    try {
      jobs.push_back({m->id, m->file, mutated_text(e, *m, read_text(file))});
    } catch (const std::exception&) {  // its own rebuild reports the problem
    }
  }
  if (jobs.empty()) return nullptr;
  try {
    return std::make_unique<CompileAhead>(e.scratch, e.build, e.build_env, std::move(jobs), std::max(1, e.o.jobs));
  } catch (const std::exception& ex) {  // the copy could not be made: each rebuild compiles in its turn
    *e.log << "kvgate mutate: compile-ahead not used: " << ex.what() << "\n";
    return nullptr;
  }
}

// Each selected mutant: apply, rebuild, run the gates, classify, revert.
Stop run_mutants(Run& s) {
  KVGATE_RUN_NAMES(s);
  // --- mutants ---------------------------------------------------------------------------
  const auto t_mut = Clock::now();
  const int N = static_cast<int>(selected.size());
  const std::vector<const Mutant*> selection_order = selected;
  if (!e.schema.switched.empty()) {
    // The switches first (no build between them), then the patched ones.
    std::stable_partition(selected.begin(), selected.end(), [&](const Mutant* m) { return e.schema.has(m->id); });
    if (Stop rc = build_after_canary(s)) return rc;
  }
  std::unique_ptr<CompileAhead> ahead = start_compile_ahead(e, selected);
  double done_wall = 0;
  int done = 0;
  auto last_write = Clock::now();
  for (const Mutant* m : selected) {
    if (interrupted()) break;
    ++done;
    log << "[" << done << "/" << N << "] " << m->id << " (" << m->file << ") ..." << std::flush;
    MutantOutcome mo;
    try {
      // Waiting for the mutant's own compile-ahead job is part of its build.
      const auto t_wait = Clock::now();
      const bool compiled_ahead = ahead && !e.schema.has(m->id) && ahead->reach(m->id);
      const double waited = since(t_wait);
      mo = run_mutant(e, *m, e.out / "mutants" / m->id);
      mo.compiled_ahead = compiled_ahead && mo.path == "rebuild" && mo.status != MutantStatus::skipped;
      if (mo.path == "rebuild" && mo.status != MutantStatus::skipped) {
        mo.build_s += waited;
        mo.wall_s += waited;
      }
    } catch (const std::exception& ex) {
      log << "\nkvgate mutate: error on " << m->id << ": " << ex.what() << "\n";
      r.exit_code = kExitError;
      write_outputs(r, e, log);
      return r.exit_code;
    }
    if (mo.status == MutantStatus::interrupted) {
      log << " interrupted\n";
      r.interrupted = true;
      break;
    }
    count(r.summary, mo.status);
    done_wall += mo.wall_s;
    std::string kb;
    for (const auto& k : mo.killed_by) kb += (kb.empty() ? "" : ",") + k;
    if (kb.size() > 60) kb = kb.substr(0, 57) + "...";
    const double eta = done ? done_wall / done * (N - done) : 0;
    if (mo.status == MutantStatus::skipped) {
      log << " skipped: " << mo.reason << "\n";
      r.outcomes.push_back(std::move(mo));
      continue;
    }
    log << " " << to_string(mo.status) << (kb.empty() ? "" : " by " + kb) << " [" << mo.path << ", build " << fmt_s(mo.build_s)
        << ", gates " << fmt_s(mo.test_s) << ", " << fmt_s(mo.wall_s) << "]  | killed " << r.summary.killed
        << " survived " << r.summary.survived << " timeout " << r.summary.timeout << " unviable "
        << r.summary.unviable << " noop " << r.summary.noop << (r.summary.skipped ? " skipped " : "")
        << (r.summary.skipped ? std::to_string(r.summary.skipped) : "") << " | ETA " << fmt_eta(eta) << "\n";
    if (!mo.expected_not_killing.empty()) {
      log << "    expected killers that stayed green:";
      for (const auto& g : mo.expected_not_killing) log << " " << g;
      log << "\n";
    }
    r.outcomes.push_back(std::move(mo));
    // Keep outcomes.json current, so a hard kill still leaves what was measured: at most every 2 s
    // (the file grows to a megabyte over a catalog, and most switches take a few hundredths of a
    // second). The complete file is written when the run ends.
    if (since(last_write) >= 2.0) {
      try {
        ReportContext ctx{o.source_dir, e.scratch, e.out, o.catalog.string(), o};
        write_text(e.out / "outcomes.json", outcomes_json(r, ctx).dump(2) + "\n");
      } catch (...) {
      }
      last_write = Clock::now();
    }
  }
  r.mutation_s = since(t_mut);
  if (ahead) {
    ahead->stop();
    const AheadStats st = ahead->stats();
    log << "kvgate mutate: compile-ahead: " << st.compiled << " of " << st.jobs << " rebuild mutant(s) compiled ahead ("
        << st.objects << " compile(s), " << fmt_s(st.seconds) << " at nice 10 beside the gate runs, "
        << (e.o.jobs > 1 ? std::to_string(e.o.jobs) + " at a time" : "one at a time") << "; the driver waited "
        << fmt_s(st.waited) << " for jobs under way; " << st.passed
        << " reached by the driver first, " << st.failed
        << " compile(s) failed: the mutant's own build says why)"
        << (st.disabled.empty() ? "" : "; " + st.disabled) << "\n";
  }
  if (interrupted()) r.interrupted = true;
  // The outcomes in selection order, whatever order the paths ran them in.
  std::map<const Mutant*, std::size_t> pos;
  for (std::size_t i = 0; i < selection_order.size(); ++i) pos[selection_order[i]] = i;
  std::stable_sort(r.outcomes.begin(), r.outcomes.end(),
                   [&](const MutantOutcome& a, const MutantOutcome& b) { return pos[a.mutant] < pos[b.mutant]; });

  return std::nullopt;
}

// The run's own checks (counts, expectations, gates killing none) and the exit code.
Stop check_run(Run& s) {
  classify_run(s.r, s.e.red);
  return std::nullopt;
}

// Outputs written; the summary, survivors and failed checks printed.
Stop print_summary(Run& s) {
  KVGATE_RUN_NAMES(s);
  write_outputs(r, e, log);
  std::vector<double> walls;
  for (const auto& mo : r.outcomes)
    if (mo.status != MutantStatus::skipped) walls.push_back(mo.wall_s);
  std::sort(walls.begin(), walls.end());
  const double median = walls.empty() ? 0 : walls[walls.size() / 2];
  log << "kvgate mutate: " << r.summary.run() << " mutants in " << fmt_s(r.mutation_s) << ": killed "
      << r.summary.killed << ", survived " << r.summary.survived << ", timeout " << r.summary.timeout
      << ", unviable " << r.summary.unviable << ", noop " << r.summary.noop << ", skipped " << r.summary.skipped
      << "; median " << fmt_s(median) << " per mutant"
      << (r.mutation_s > 0 ? ", " + std::to_string(r.summary.run() * 60.0 / r.mutation_s).substr(0, 5) + " mutants/min"
                           : std::string())
      << "\n";
  {
    // Per path: how many, and the median wall time per mutant (the schemata's speed-up).
    std::map<std::string, std::vector<double>> by_path;
    for (const auto& mo : r.outcomes)
      if (mo.status != MutantStatus::skipped) by_path[mo.path].push_back(mo.wall_s);
    for (auto& [path, w] : by_path) {
      std::sort(w.begin(), w.end());
      log << "  " << path << ": " << w.size() << " mutant(s), median " << fmt_s(w[w.size() / 2]) << "\n";
    }
    if (!e.schema.switched.empty() || !e.schema.fallback.empty())
      log << "  schemata: baseline build (with every switch) " << fmt_s(r.baseline_build_s) << "\n";
  }
  for (const auto& mo : r.outcomes)
    if (mo.status == MutantStatus::survived || mo.status == MutantStatus::timeout ||
        mo.status == MutantStatus::unviable || mo.status == MutantStatus::noop)
      log << "  " << to_string(mo.status) << ": " << mo.mutant->id << " -- " << mo.reason << "\n";
  for (const auto& mo : r.outcomes)
    if (!mo.expected_unknown.empty()) {
      log << "  note: " << mo.mutant->id << " expects gates not in this run:";
      for (const auto& g : mo.expected_unknown) log << " " << g;
      log << "\n";
    }
  if (!r.gates_killing_none.empty()) {
    if (r.full_run) {
      log << "  gates that killed no mutant:";
      for (const auto& g : r.gates_killing_none) log << " " << g;
      log << "\n";
    } else {
      log << "  " << r.gates_killing_none.size() << " of " << r.gates.size()
          << " gates killed none of the selected mutants (partial run: informational, listed in kill_matrix.md)\n";
    }
  }
  for (const auto& f : r.check_failures) log << "  check failed: " << f << "\n";
  log << "kvgate mutate: outputs in " << e.out.string() << " (kill_matrix.md, index.html); exit " << r.exit_code
      << "\n";
  return std::nullopt;
}

}  // namespace

// The whole run as a list of steps (each returns an exit code when the run ends there).
int run_mutate(const MutateOptions& in, std::ostream& log) {
  Run s;
  s.r.started_at = utc_now();
  s.e.o = in;
  s.e.log = &log;
  for (Stop (*step)(Run&) : {resolve_options, load_and_check_catalog}) if (Stop rc = step(s)) return *rc;
  if (s.e.o.list) return *list_catalog(s);
  for (Stop (*step)(Run&) : {select_mutants, shard_mutants, refuse_stale_anchors, prepare_scratch, probe_device, sync_scratch,
                             instrument_scratch, set_environments, configure_scratch_build, list_gate_programs, restrict_gate_targets,
                             build_baseline, refuse_ungated_mutants, list_variants, focus_gates, run_baseline, run_canary})
    if (Stop rc = step(s)) return *rc;
  if (s.e.o.prove_gates) return prove_every_gate(s).value_or(kExitOk);
  for (Stop (*step)(Run&) : {run_mutants, check_run})
    if (Stop rc = step(s)) return *rc;
  print_summary(s);
  return s.r.exit_code;
}

}  // namespace kvgate::mutate

namespace kvgate::mutate {

DeviceProbe probe_cuda_device(const std::filesystem::path& log_path) {
  DeviceProbe d;
  if (const char* f = std::getenv("KVGATE_MUTATE_CUDA_DEVICE"); f && *f) {
    d.present = std::string(f) != "0";
    d.how = std::string("KVGATE_MUTATE_CUDA_DEVICE=") + f;
    return d;
  }
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v) {
    const std::string s = v;
    if (s.empty() || s == "-1" || s == "NoDevFiles") {
      d.how = "CUDA_VISIBLE_DEVICES='" + s + "' hides every device";
      return d;
    }
  }
  // nvidia-smi talks to the driver: a listed GPU is a device the CUDA runtime can open, unless the
  // driver is older than the runtime -- the baseline's own GPU gates decide that case (a gate that
  // skips with "SKIPPED: no CUDA device" cannot kill anything; see requirement_gap).
  std::filesystem::create_directories(log_path.parent_path());
  const ProcResult pr = run_process({{"nvidia-smi", "-L"}, {}, {}, log_path.string(), 30});
  std::string out;
  try {
    out = read_text(log_path);
  } catch (...) {
  }
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("GPU ", 0) == 0 && line.find(':') != std::string::npos) {
      d.present = true;
      d.how = "nvidia-smi -L: " + line;
      return d;
    }
  }
  d.how = pr.ok() ? "nvidia-smi -L lists no GPU"
                  : "nvidia-smi -L: " + pr.describe() + (pr.exit_code == 127 ? " (not installed?)" : "");
  return d;
}

std::string default_source_dir() { return KVGATE_MUTATIONS_SOURCE_DIR; }

void classify_run(RunResult& r, const std::set<std::string>& red) {
  // --- checks ----------------------------------------------------------------------------
  std::map<std::string, int> kills;
  for (const auto& mo : r.outcomes)
    for (const auto& k : mo.killed_by) ++kills[k];
  for (const auto& g : r.gates)
    if (!g.skipped && !red.count(g.id) && !kills.count(g.id)) r.gates_killing_none.push_back(g.id);
  int ran = 0;
  for (const auto& mo : r.outcomes) ran += mo.status != MutantStatus::skipped ? 1 : 0;
  if (ran != r.summary.run())
    r.check_failures.push_back("outcome count " + std::to_string(r.summary.run()) + " != mutants run " +
                               std::to_string(ran));
  bool expectation_failed = false;
  for (const auto& mo : r.outcomes) {
    if (!mo.expected_not_killing.empty()) {
      expectation_failed = true;
      std::string s = mo.mutant->id + ": expected to be killed by";
      for (const auto& g : mo.expected_not_killing) s += " " + g;
      r.check_failures.push_back(s + ", which stayed green");
    }
  }
  if (r.full_run && !r.interrupted && !r.gates_killing_none.empty()) {
    expectation_failed = true;
    std::string s = "gates that killed no mutant:";
    for (const auto& g : r.gates_killing_none) s += " " + g;
    r.check_failures.push_back(s);
  }
  if (r.interrupted) r.exit_code = kExitInterrupted;
  else if (ran != r.summary.run()) r.exit_code = kExitError;
  else if (r.summary.survived) r.exit_code = kExitSurvived;
  else if (r.summary.timeout) r.exit_code = kExitTimeout;
  else if (r.summary.unviable || r.summary.noop) r.exit_code = kExitUnviable;
  else if (expectation_failed) r.exit_code = kExitExpectation;
  else r.exit_code = kExitOk;
  if (!red.empty() && (r.exit_code == kExitOk || r.exit_code == kExitExpectation)) r.exit_code = kExitBaselineRed;
}

void count(RunSummary& s, MutantStatus st) {
  switch (st) {
    case MutantStatus::killed: ++s.killed; break;
    case MutantStatus::survived: ++s.survived; break;
    case MutantStatus::timeout: ++s.timeout; break;
    case MutantStatus::unviable: ++s.unviable; break;
    case MutantStatus::noop: ++s.noop; break;
    case MutantStatus::skipped: ++s.skipped; break;
    case MutantStatus::interrupted: ++s.interrupted; break;
  }
}
}  // namespace kvgate::mutate
