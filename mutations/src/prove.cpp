#include "kvgate_mutations/prove.hpp"

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "kvgate/outcomes.hpp"

namespace kvgate::mutate {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The marker run_gates writes when a process failed although every test case in its XML passed.
constexpr const char* kOutsideCases = "with no failed test case in its XML";

std::string fmt_score(double v) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << v;
  return o.str();
}

std::vector<std::string> components(const std::string& id) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : id) {
    if (c == '.') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string md_cell(std::string s) {
  for (auto& c : s)
    if (c == '|' || c == '\n') c = c == '|' ? '/' : ' ';
  return s;
}

}  // namespace

bool crash_outside_cases(const GateOutcome& g) {
  return g.status == GateStatus::crashed && g.detail.find(kOutsideCases) != std::string::npos;
}

// Ctrl-C kills the running gate process: the driver then sees a case without a result, which is
// no evidence about the mutant.
bool interrupted_kill(const GateOutcome& g) {
  return g.status == GateStatus::crashed && g.detail.rfind("interrupted", 0) == 0;
}

bool proves_gate(const GateOutcome& g) { return is_kill(g.status) && !crash_outside_cases(g) && !interrupted_kill(g); }

int affinity(const Mutant& m, const std::string& gate, const std::map<std::string, std::set<std::string>>& files_naming) {
  if (std::find(m.expect_killed_by.begin(), m.expect_killed_by.end(), gate) != m.expect_killed_by.end()) return 100;
  const auto gc = components(gate);
  int best = 0;
  for (const auto& e : m.expect_killed_by) {
    const auto ec = components(e);
    int common = 0;
    while (common < static_cast<int>(std::min(gc.size(), ec.size())) && gc[common] == ec[common]) ++common;
    const bool sibling = gc.size() > 1 && ec.size() > 1 && gc.back() == ec.back();
    best = std::max(best, 10 * common + (sibling ? 15 : 0));
  }
  if (const auto it = files_naming.find(gate); it != files_naming.end() && it->second.count(m.file)) best += 5;
  // The backend: a gate of the CUDA backend (an ID component "cuda") and a mutant of CUDA code (its
  // file under runtime/cuda/, or a mutant that needs a CUDA build). Host code of the CPU runtime
  // rarely reaches what such a gate checks (the device kernels and the CUDA engine).
  const bool cuda_gate = std::find(gc.begin(), gc.end(), "cuda") != gc.end();
  const bool cuda_mutant = m.file.rfind("runtime/cuda/", 0) == 0 ||
                           std::find(m.requires_.begin(), m.requires_.end(), "cuda-device") != m.requires_.end() ||
                           std::find(m.requires_.begin(), m.requires_.end(), "cuda") != m.requires_.end();
  if (cuda_gate && cuda_mutant) best += 20;
  return best;
}

void prove_gates(ProofRecord& rec, const std::vector<ProofCandidate>& candidates, const ProofRunner& run,
                 bool rebuild, const std::function<bool()>& stop, std::ostream& log) {
  ProofLoop loop;
  loop.rebuild = rebuild;
  loop.stop = stop;
  prove_gates(rec, candidates, run, loop, log);
}

std::string proof_state(const ProofRecord& rec) {
  if (rec.interrupted) return "interrupted";
  if (rec.deadline_reached) return "deadline";
  return rec.finished ? "finished" : "running";
}

void prove_gates(ProofRecord& rec, const std::vector<ProofCandidate>& candidates, const ProofRunner& run,
                 const ProofLoop& loop, std::ostream& log) {
  const bool rebuild = loop.rebuild;
  const auto stop = [&] { return loop.stop && loop.stop(); };
  rec.finished = false;
  std::map<std::string, std::string> program_of;
  std::map<std::string, double> cost;  // the gate's baseline seconds
  std::set<std::string> open;
  for (const auto& g : rec.gates) {
    program_of[g.id] = g.program;
    cost[g.id] = g.seconds;
    if (!rec.proven.count(g.id) && !rec.not_provable.count(g.id)) open.insert(g.id);
  }
  // Which files the mutants naming each gate patch (the "same file" resemblance).
  std::map<std::string, std::set<std::string>> files_naming;
  for (const auto& c : candidates)
    for (const auto& id : c.mutant->expect_killed_by) files_naming[id].insert(c.mutant->file);
  // Per candidate: every gate of the programs it reaches, with its affinity (baseline order).
  std::vector<std::vector<std::pair<std::string, int>>> reach(candidates.size());
  for (std::size_t i = 0; i < candidates.size(); ++i)
    for (const auto& g : rec.gates)
      if (candidates[i].programs.count(g.program))
        reach[i].emplace_back(g.id, affinity(*candidates[i].mutant, g.id, files_naming));
  std::vector<bool> done(candidates.size(), false);
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (candidates[i].rebuild && !rebuild) done[i] = true;
  // (gate, mutant) pairs already tried, here or in a seeded proof (its /unproven/*/tried): a mutant
  // is not run again for a gate it left green; a candidate whose every open gate it has tried is
  // not picked. Skipping never proves a gate: at worst a gate stays open.
  std::map<std::string, std::set<std::string>> tried_by;
  for (const auto& [id, ts] : rec.tried)
    for (const auto& t : ts) tried_by[id].insert(t.mutant);
  const auto untried = [&](const std::string& id, std::size_t i) {
    return open.count(id) && !tried_by[id].count(candidates[i].mutant->id);
  };
  // The record's derived lists (unproven, candidates left, rebuild mutants not tried) as of now.
  const auto settle = [&] {
    rec.unproven.clear();
    rec.candidates_left.clear();
    rec.rebuild_not_tried.clear();
    for (const auto& g : rec.gates)
      if (open.count(g.id)) rec.unproven.push_back(g.id);
    // Which unproven gates still have untried candidates (after an interrupt or a deadline, or in a
    // checkpoint: not a finding yet).
    for (std::size_t i = 0; i < candidates.size(); ++i)
      if (!done[i])
        for (const auto& [id, a] : reach[i])
          if (untried(id, i)) ++rec.candidates_left[id];
    for (std::size_t i = 0; i < candidates.size(); ++i)
      if (candidates[i].rebuild && !rebuild) rec.rebuild_not_tried.push_back(candidates[i].mutant->id);
  };
  const auto checkpoint = [&] {
    if (!loop.checkpoint) return;
    settle();
    loop.checkpoint(rec);
  };
  checkpoint();
  const auto t0 = std::chrono::steady_clock::now();
  while (!open.empty()) {
    if (stop()) {
      rec.interrupted = true;
      break;
    }
    if (loop.past_deadline && loop.past_deadline()) {
      rec.deadline_reached = true;
      break;
    }
    // The best candidate: the summed affinity per second of the run (the baseline seconds of the
    // gates it would run, plus one for the process starts, plus loop.rebuild_s for a patched
    // mutant's build), then catalog order. On cheap gate programs a switch beats a rebuild of equal
    // resemblance; on a program whose gates take minutes (a GPU program) the build is small beside
    // the run and resemblance decides.
    double best = -1;
    std::size_t pick = candidates.size();
    // --prove-first: the first listed candidate still runnable wins over the score.
    bool first_pick = false;
    for (const auto& want : loop.first) {
      std::size_t i = 0;
      while (i < candidates.size() && candidates[i].mutant->id != want) ++i;
      if (i == candidates.size() || done[i]) continue;
      if (std::none_of(reach[i].begin(), reach[i].end(), [&](const auto& ra) { return untried(ra.first, i); })) continue;
      pick = i;
      first_pick = true;
      break;
    }
    for (std::size_t i = 0; i < candidates.size() && !first_pick; ++i) {
      if (done[i]) continue;
      double aff = 0, secs = 1 + (candidates[i].rebuild ? loop.rebuild_s : 0.0);
      bool any = false;
      for (const auto& [id, a] : reach[i])
        if (untried(id, i)) {
          any = true;
          aff += a;
          secs += cost[id];
        }
      if (!any) continue;
      const double score = aff / secs;
      if (pick == candidates.size() || score > best) {
        pick = i;
        best = score;
      }
    }
    if (pick == candidates.size()) break;
    done[pick] = true;
    const ProofCandidate& c = candidates[pick];
    std::vector<std::string> focus;
    for (const auto& [id, a] : reach[pick])
      if (untried(id, pick)) focus.push_back(id);
    ++rec.runs;
    log << "[prove " << rec.runs << "] " << c.mutant->id << " (" << (c.rebuild ? "rebuild" : "schema") << ", "
        << (first_pick ? std::string("--prove-first") : "score " + fmt_score(best)) << "): " << focus.size() << " unproven gate(s) in " << join({c.programs.begin(), c.programs.end()}, ",")
        << " ..." << std::flush;
    auto res = run(c, focus);
    if (stop()) {  // an interrupted run proves nothing: its gates were killed by the interrupt
      --rec.runs;
      done[pick] = false;  // not tried: a resumed proof runs it again
      rec.interrupted = true;
      break;
    }
    // A process that failed with every case green names no gate: run such gates alone.
    if (focus.size() > 1)
      for (const auto& id : focus)
        if (const auto it = res.find(id); it != res.end() && crash_outside_cases(it->second) && !stop()) {
          auto alone = run(c, {id});
          if (alone.count(id)) res[id] = alone[id];
        }
    std::vector<std::string> now;
    for (const auto& id : focus) {
      const auto it = res.find(id);
      const GateOutcome g = it == res.end() ? GateOutcome{GateStatus::not_run, 0, "", "no outcome", "default", {}} : it->second;
      if (proves_gate(g)) {
        GateProof p;
        p.mutant = c.mutant->id;
        p.program = program_of[id];
        p.path = c.rebuild ? "rebuild" : "schema";
        p.status = to_string(g.status);
        p.variants = g.kill_variants.empty() ? std::vector<std::string>{g.variant} : g.kill_variants;
        p.detail = g.detail;
        p.log = g.log;
        rec.proven[id] = p;
        open.erase(id);
        rec.tried.erase(id);
        now.push_back(id);
      } else {
        std::string st = crash_outside_cases(g) ? std::string("crashed outside its test cases") : to_string(g.status);
        if (g.status == GateStatus::not_run && !g.detail.empty()) st += " (" + g.detail.substr(0, g.detail.find(':')) + ")";
        rec.tried[id].push_back({c.mutant->id, st, g.detail});
        tried_by[id].insert(c.mutant->id);
      }
    }
    log << " proved " << now.size() << (now.empty() ? "" : " (" + join(now, ",").substr(0, 120) + ")") << "; "
        << open.size() << " open, "
        << std::fixed << std::setprecision(0)
        << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << "s\n"
        << std::defaultfloat;
    checkpoint();
  }
  if (stop()) rec.interrupted = true;
  settle();
  if (rec.deadline_reached) {
    std::size_t left = 0;
    for (std::size_t i = 0; i < candidates.size(); ++i) left += done[i] ? 0 : 1;
    log << "[prove] deadline: no run started after run " << rec.runs << "; " << open.size() << " gate(s) open, "
        << rec.candidates_left.size() << " of them with untried candidates (" << left << " candidate(s) not run)\n";
  }
  rec.finished = true;
}

namespace {
// An earlier proof (proof.json): its proven gates start proven (a proof resumed, or one per program
// joined). Refuses a file that is not a proof record, naming the field.
int seed_from_proof(ProofRecord& rec, const fs::path& file, const json& doc,
                    const std::map<std::string, std::string>& program_of, std::ostream& log) {
  if (!doc.contains("proven") || !doc["proven"].is_array())
    throw CatalogError("--prove-seed " + file.string() +
                       ": /proven is missing or not an array; fix: pass the proof.json that kvgate mutate --prove-gates "
                       "wrote, unedited");
  rec.seeds.push_back(file.string() + " (commit " + doc.value("commit", std::string("unknown")).substr(0, 12) + ")");
  int n = 0;
  for (const auto& p : doc["proven"]) {
    const std::string id = p.value("gate", "");
    if (!program_of.count(id) || rec.proven.count(id) || rec.not_provable.count(id)) continue;
    GateOutcome o;
    o.status = p.value("status", "") == "failed" ? GateStatus::failed : GateStatus::crashed;
    o.detail = p.value("detail", "");
    if (!proves_gate(o)) continue;  // e.g. a gate an interrupt killed (a proof.json of an older driver)
    GateProof g;
    g.mutant = p.value("mutant", "");
    g.program = program_of.at(id);
    g.path = "seed";
    g.status = p.value("status", "");
    g.variants = p.value("variants", std::vector<std::string>{});
    g.detail = p.value("detail", "");
    g.log = p.value("log", "");
    g.seed_file = file.string();
    rec.proven[id] = g;
    ++n;
  }
  // The mutants the earlier proof tried on the gates it left open: carried over, so this proof does
  // not run them again on those gates (prove_gates), and its record lists them.
  int carried = 0;
  if (doc.contains("unproven") && doc["unproven"].is_array())
    for (const auto& u : doc["unproven"]) {
      const std::string id = u.is_object() ? u.value("gate", "") : std::string();
      if (!program_of.count(id) || rec.proven.count(id) || rec.not_provable.count(id) || !u.contains("tried") ||
          !u["tried"].is_array())
        continue;
      auto& ts = rec.tried[id];
      for (const auto& t : u["tried"]) {
        const std::string m = t.is_object() ? t.value("mutant", "") : std::string();
        if (m.empty() || std::any_of(ts.begin(), ts.end(), [&](const GateTry& x) { return x.mutant == m; })) continue;
        // Only a try that ran the gate to an answer is carried: it stayed green ("passed") or ran out
        // of time. A process that failed outside every case, or a gate not run, says nothing of the
        // mutant (round 18: gate processes that could not start were recorded so): tried again.
        const std::string st = t.value("status", "");
        if (!st.starts_with("passed") && !st.starts_with("timeout")) continue;
        ts.push_back({m, t.value("status", "") + " (seed)", t.value("detail", "")});
        ++carried;
      }
    }
  log << "kvgate mutate: --prove-seed " << file.string() << ": " << n << " gate(s) proven by the earlier proof, "
      << carried << " (gate, mutant) tr" << (carried == 1 ? "y" : "ies") << " of its open gates carried over\n";
  return n;
}
}  // namespace

int seed_proofs(ProofRecord& rec, const fs::path& outcomes, std::ostream& log) {
  std::map<std::string, std::string> program_of;
  for (const auto& g : rec.gates) program_of[g.id] = g.program;
  if (!fs::is_directory(outcomes)) {
    // A proof record (by its /tool), whatever the file is called; anything else must be an outcomes.json.
    json doc;
    try {
      doc = json::parse(read_text(outcomes));
    } catch (...) {
    }
    if (doc.is_object() && doc.value("tool", "") == "kvgate mutate --prove-gates")
      return seed_from_proof(rec, outcomes, doc, program_of, log);
  }
  const fs::path file = fs::is_directory(outcomes) ? outcomes / "outcomes.json" : outcomes;
  const records::OutcomesRecord oc = records::read_outcomes(file);
  const std::string commit = oc.shard ? oc.shard->commit : std::string();
  rec.seeds.push_back(file.string() + " (commit " + (commit.empty() ? "unknown" : commit.substr(0, 12)) +
                      (oc.shard && oc.shard->dirty ? " + uncommitted changes" : "") + ")");
  if (!rec.commit.empty() && commit != rec.commit)
    log << "kvgate mutate: --prove-seed " << file.string() << ": warning: it ran at commit "
        << (commit.empty() ? "unknown" : commit.substr(0, 12)) << ", this tree is " << rec.commit.substr(0, 12)
        << ": its kills are taken as they are\n";
  int n = 0;
  for (const auto& mr : oc.mutants)
    for (const auto& id : mr.killed_by) {
      if (!program_of.count(id) || rec.proven.count(id) || rec.not_provable.count(id)) continue;
      const auto cell = mr.gates.find(id);
      if (cell == mr.gates.end()) continue;
      GateOutcome g;
      g.status = cell->second.status == "failed" ? GateStatus::failed
                 : cell->second.status == "crashed" ? GateStatus::crashed
                                                    : GateStatus::passed;
      g.detail = cell->second.detail;
      if (!proves_gate(g)) continue;
      GateProof p;
      p.mutant = mr.id;
      p.program = program_of[id];
      p.path = "seed";
      p.status = cell->second.status;
      const auto kin = mr.killed_in.find(id);
      p.variants = kin != mr.killed_in.end() ? kin->second : std::vector<std::string>{cell->second.variant};
      p.detail = cell->second.detail;
      p.log = cell->second.log;
      p.seed_file = file.string();
      rec.proven[id] = p;
      ++n;
    }
  log << "kvgate mutate: --prove-seed " << file.string() << ": " << n << " gate(s) proven by its kills\n";
  return n;
}

json proof_json(const ProofRecord& rec) {
  int seeded = 0;
  for (const auto& [id, p] : rec.proven) seeded += p.path == "seed" ? 1 : 0;
  std::map<std::string, std::string> program_of;
  for (const auto& g : rec.gates) program_of[g.id] = g.program;
  json proven = json::array(), unproven = json::array(), np = json::array();
  for (const auto& g : rec.gates) {
    if (const auto it = rec.proven.find(g.id); it != rec.proven.end()) {
      const GateProof& p = it->second;
      json j{{"gate", g.id},       {"program", p.program}, {"mutant", p.mutant}, {"path", p.path},
             {"status", p.status}, {"variants", p.variants}, {"detail", p.detail}, {"log", p.log}};
      if (!p.seed_file.empty()) j["seed_file"] = p.seed_file;
      proven.push_back(j);
    }
    if (const auto it = rec.not_provable.find(g.id); it != rec.not_provable.end())
      np.push_back({{"gate", g.id}, {"program", g.program}, {"reason", it->second}});
  }
  for (const auto& id : rec.unproven) {
    json tried = json::array();
    if (const auto it = rec.tried.find(id); it != rec.tried.end())
      for (const auto& t : it->second) tried.push_back({{"mutant", t.mutant}, {"status", t.status}, {"detail", t.detail}});
    const auto left = rec.candidates_left.find(id);
    unproven.push_back({{"gate", id},
                        {"program", program_of[id]},
                        {"tried", tried},
                        {"candidates_left", left == rec.candidates_left.end() ? 0 : left->second}});
  }
  return json{{"tool", "kvgate mutate --prove-gates"},
              {"format_version", 1},
              {"started_at", rec.started_at},
              {"commit", rec.commit},
              {"dirty", rec.dirty},
              {"catalogs", rec.catalogs},
              {"seeds", rec.seeds},
              {"summary",
               {{"gates", rec.gates.size()},
                {"proven", rec.proven.size()},
                {"seeded", seeded},
                {"unproven", rec.unproven.size()},
                {"not_provable", rec.not_provable.size()},
                {"runs", rec.runs},
                {"wall_s", rec.wall_s},
                {"baseline_build_s", rec.baseline_build_s},
                {"baseline_test_s", rec.baseline_test_s},
                {"interrupted", rec.interrupted},
                {"deadline_reached", rec.deadline_reached},
                {"deadline_s", rec.deadline_s},
                {"state", proof_state(rec)}}},
              {"proven", proven},
              {"unproven", unproven},
              {"not_provable", np},
              {"rebuild_not_tried", rec.rebuild_not_tried},
              {"skipped_mutants", rec.skipped_mutants}};
}

std::string proof_md(const ProofRecord& rec) {
  std::map<std::string, std::string> program_of;
  for (const auto& g : rec.gates) program_of[g.id] = g.program;
  int seeded = 0;
  for (const auto& [id, p] : rec.proven) seeded += p.path == "seed" ? 1 : 0;
  std::ostringstream o;
  o << "# Gate proof: every gate shown able to go red\n\n"
    << "`kvgate mutate --prove-gates` (docs/MUTATIONS.md, \"Proving every gate\"), started " << rec.started_at
    << ", commit " << (rec.commit.empty() ? "none" : rec.commit.substr(0, 12)) << (rec.dirty ? " + uncommitted changes" : "")
    << ".\n\n"
    << "| | |\n|---|---:|\n"
    << "| gates | " << rec.gates.size() << " |\n"
    << "| proven | " << rec.proven.size() << " (" << seeded << " from the seed) |\n"
    << "| **unproven** | **" << rec.unproven.size() << "** |\n"
    << "| not provable here (skipped in the baseline, or red there with --skip-red-gates) | " << rec.not_provable.size() << " |\n"
    << "| mutant runs | " << rec.runs << " |\n"
    << "| proof wall time | " << std::fixed << std::setprecision(1) << rec.wall_s << " s |\n"
    << "| baseline build / gates | " << rec.baseline_build_s << " s / " << rec.baseline_test_s << " s |\n"
    << std::defaultfloat;
  if (rec.interrupted) o << "\n**Interrupted**: the gates still open when it stopped are listed as unproven.\n";
  if (rec.deadline_reached)
    o << "\n**Stopped at the deadline** (`--prove-deadline " << rec.deadline_s
      << "`): no run was started after it; the gates still open are listed as unproven.\n";
  if (proof_state(rec) == "running")
    o << "\n**Written after mutant run " << rec.runs
      << " while the proof was still running**: if this is the last record, the process ended before it could "
         "finish (e.g. killed at a wall limit); every run it lists had finished.\n";
  o << "\nCatalogs: " << join(rec.catalogs, ", ") << ".\n";
  if (!rec.seeds.empty()) o << "Seeded from: " << join(rec.seeds, ", ") << ".\n";
  o << "\n## Unproven gates (no mutant tried turned them red)\n\n";
  if (rec.unproven.empty()) o << "None.\n";
  for (const auto& id : rec.unproven) {
    o << "- **" << id << "** (" << program_of[id] << "): ";
    const auto it = rec.tried.find(id);
    if (it == rec.tried.end() || it->second.empty()) {
      if (const auto left = rec.candidates_left.find(id); left != rec.candidates_left.end())
        o << "no mutant tried yet; **" << left->second << " candidate(s) not tried** (" << proof_state(rec) << ")\n";
      else
        o << "no mutant reaches its program\n";
      continue;
    }
    std::vector<std::string> ts;
    for (const auto& t : it->second) ts.push_back(t.mutant + (t.status == "passed" ? "" : " (" + t.status + ")"));
    o << it->second.size() << " mutant(s) tried: " << join(ts, ", ");
    if (const auto left = rec.candidates_left.find(id); left != rec.candidates_left.end())
      o << "; **" << left->second << " candidate(s) not tried yet** ("
        << (proof_state(rec) == "finished" ? "left" : proof_state(rec)) << ")";
    o << "\n";
  }
  if (!rec.not_provable.empty()) {
    o << "\n## Not provable here\n\n";
    for (const auto& [id, why] : rec.not_provable) o << "- " << id << ": " << md_cell(why) << "\n";
  }
  if (!rec.rebuild_not_tried.empty())
    o << "\nRebuild-path mutants not tried (`--prove-rebuild` makes them candidates): "
      << join(rec.rebuild_not_tried, ", ") << ".\n";
  if (!rec.skipped_mutants.empty()) {
    o << "\nMutants left out:\n\n";
    for (const auto& s : rec.skipped_mutants) o << "- " << md_cell(s) << "\n";
  }
  o << "\n## Proven gates\n\n| gate | program | killed by | path | variants | how |\n|---|---|---|---|---|---|\n";
  for (const auto& g : rec.gates)
    if (const auto it = rec.proven.find(g.id); it != rec.proven.end())
      o << "| " << g.id << " | " << it->second.program << " | " << it->second.mutant << " | " << it->second.path << " | "
        << join(it->second.variants, ",") << " | " << md_cell(it->second.status + ": " + it->second.detail).substr(0, 160)
        << " |\n";
  return o.str();
}

int write_proof(const ProofRecord& rec, const fs::path& dir) {
  fs::create_directories(dir);
  write_text(dir / "proof.json", proof_json(rec).dump(2) + "\n");
  write_text(dir / "proof.md", proof_md(rec));
  if (rec.interrupted) return kExitInterrupted;
  return rec.unproven.empty() ? kExitOk : kExitExpectation;
}

Catalog join_catalogs(const std::vector<Catalog>& cats) {
  Catalog out;
  if (cats.empty()) return out;
  out.path = cats.front().path;
  std::map<std::string, std::string> from;  // id -> catalog file
  std::string errors;
  for (const auto& c : cats)
    for (const auto& m : c.mutants) {
      if (const Mutant* prev = out.find(m.id)) {
        const bool same_canary = m.is_canary() && prev->is_canary() && m.file == prev->file && m.anchor == prev->anchor &&
                                 m.replacement == prev->replacement;
        if (same_canary) continue;
        if (m.is_canary() && prev->is_canary()) {
          errors += "\n  " + c.path + ": canary " + m.id + " differs from the record in " + from[m.id] +
                    "; fix: one run has one canary (give every catalog the same record)";
          continue;
        }
        errors += "\n  mutant " + m.id + " is in " + from[m.id] + " and in " + c.path +
                  "; fix: rename one (IDs are unique across the catalogs of one run)";
        continue;
      }
      if (m.is_canary() && out.canary()) {
        errors += "\n  " + c.path + ": canary " + m.id + " differs from canary " + out.canary()->id + " of " +
                  from[out.canary()->id] + "; fix: one run has one canary (give every catalog the same record)";
        continue;
      }
      from[m.id] = c.path;
      out.mutants.push_back(m);
    }
  if (!errors.empty()) throw CatalogError("kvgate mutate: the catalogs cannot be joined:" + errors);
  return out;
}

}  // namespace kvgate::mutate
