#include "kvgate_mutations/shard.hpp"

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <set>

#include "kvgate/limits.hpp"
#include "kvgate/outcomes.hpp"
#include "kvgate_mutations/ci.hpp"
#include "kvgate_mutations/driver.hpp"
#include "kvgate_mutations/process.hpp"
#include "kvgate_mutations/report.hpp"
#include "kvgate_mutations/scratch.hpp"

namespace kvgate::mutate {

namespace fs = std::filesystem;
using records::RecordError;

std::optional<ShardSpec> parse_shard(const std::string& text, std::string* error) {
  auto fail = [&](const std::string& why) -> std::optional<ShardSpec> {
    if (error)
      *error = "--shard '" + text + "': " + why +
               "; fix: pass k/n with 0 <= k < n, e.g. --shard 0/4 ... --shard 3/4 for four shards";
    return std::nullopt;
  };
  const auto slash = text.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == text.size()) return fail("not of the form k/n");
  const std::string a = text.substr(0, slash), b = text.substr(slash + 1);
  auto digits = [](const std::string& s) {
    return s.size() <= 6 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(a) || !digits(b)) return fail("k and n must be whole numbers");
  ShardSpec s{std::stoi(a), std::stoi(b)};
  if (s.count < 1) return fail("n must be at least 1");
  if (s.index >= s.count) return fail("the shard index k is out of range (k counts from 0 to n-1)");
  return s;
}

std::vector<const Mutant*> shard_of(const std::vector<const Mutant*>& selection, ShardSpec s) {
  std::vector<const Mutant*> out;
  for (std::size_t i = 0; i < selection.size(); ++i)
    if (static_cast<int>(i % static_cast<std::size_t>(s.count)) == s.index) out.push_back(selection[i]);
  return out;
}

std::string file_digest(const fs::path& file) {
  if (!fs::is_regular_file(file)) throw std::runtime_error("cannot read " + file.string() + " (missing?)");
  std::uint64_t h = hash_file(file);
  static const char* hex = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) s[static_cast<std::size_t>(i)] = hex[h & 15];
  return s;
}

SourceCommit source_commit(const fs::path& dir) {
  SourceCommit sc;
  const auto [rc, head] = capture_output({"git", "-C", dir.string(), "rev-parse", "HEAD"});
  if (rc != 0) return sc;
  sc.commit = head.substr(0, head.find_first_of("\r\n"));
  const auto [rc2, st] = capture_output({"git", "-C", dir.string(), "status", "--porcelain", "--untracked-files=no"});
  sc.dirty = rc2 == 0 && st.find_first_not_of(" \r\n") != std::string::npos;
  return sc;
}

namespace {

struct Shard {
  fs::path dir, file;
  records::OutcomesRecord rec;
};

// A refusal: the file, the field (JSON pointer), the problem and the fix.
struct Refusal {
  std::string file, field, problem, fix;
  std::string whole;  // a reader's own complete message (records::RecordError: file, field, fix)
  Refusal(std::string f, std::string at, std::string p, std::string x, std::string w = {})
      : file(std::move(f)), field(std::move(at)), problem(std::move(p)), fix(std::move(x)), whole(std::move(w)) {}
};

template <class E>
E enum_of(const std::string& s, std::initializer_list<E> all, const Refusal& bad) {
  for (const E e : all)
    if (s == to_string(e)) return e;
  throw bad;
}

GateStatus gate_status(const std::string& s, const std::string& file, const std::string& at) {
  using G = GateStatus;
  return enum_of<G>(s, {G::passed, G::failed, G::crashed, G::timeout, G::not_run, G::skipped},
                    Refusal{file, at, "is '" + s + "', not a gate status", "rerun that shard with this kvgate"});
}

// A mutant's record back into the driver's outcome; its file paths rebased from the shard's folder
// to the merged output folder.
MutantOutcome outcome_of(const records::MutantRecord& m, const Mutant* cat, const Shard& sh, const fs::path& out,
                         const std::string& at) {
  using M = MutantStatus;
  MutantOutcome mo;
  mo.mutant = cat;
  mo.status = enum_of<M>(m.status, {M::killed, M::survived, M::timeout, M::unviable, M::noop, M::skipped, M::interrupted},
                         Refusal{sh.file.string(), at + "/status", "is '" + m.status + "', not a mutant status",
                          "rerun that shard with this kvgate"});
  mo.reason = m.reason;
  mo.build_s = m.build_s;
  mo.test_s = m.test_s;
  mo.wall_s = m.wall_s;
  mo.killed_by = m.killed_by;
  mo.killed_in = m.killed_in;
  mo.expected_not_killing = m.expected_not_killing;
  mo.expected_unknown = m.expected_unknown;
  mo.changed_objects = m.changed_objects;
  mo.path = m.path;
  mo.path_reason = m.path_reason;
  auto rebase = [&](const std::string& p) {
    return p.empty() ? p : fs::relative(fs::absolute(sh.dir / p), out).lexically_normal().generic_string();
  };
  mo.diff_path = rebase(m.diff);
  mo.build_log = rebase(m.build_log);
  for (const auto& [id, g] : m.gates) {
    GateOutcome go;
    go.status = gate_status(g.status, sh.file.string(), at + "/gates/" + id + "/status");
    go.seconds = g.seconds;
    go.log = rebase(g.log);
    go.detail = g.detail;
    go.variant = g.variant.empty() ? "default" : g.variant;
    if (const auto it = m.killed_in.find(id); it != m.killed_in.end()) go.kill_variants = it->second;
    mo.gates[id] = go;
  }
  return mo;
}

std::vector<std::string> gate_ids(const records::OutcomesRecord& r) {
  std::vector<std::string> v;
  for (const auto& g : r.baseline.gates) v.push_back(g.id);
  std::sort(v.begin(), v.end());
  return v;
}

// Every check, then the merged run (nothing is written here).
RunResult merged_run(const MergeOptions& o, std::vector<Shard>& shards, Catalog& cat, fs::path& catalog_path,
                     fs::path& source_dir, std::set<std::string>& red, const fs::path& out) {
  if (shards.empty())
    throw Refusal{"(command line)", "DIR", "no shard folder given", "pass the output folders of every kvgate mutate --shard k/n"};
  for (auto& sh : shards) {
    const fs::path in = fs::absolute(sh.dir).lexically_normal();
    if (in == out || (in / "").string().rfind((out / "").string(), 0) == 0 || (out / "").string().rfind((in / "").string(), 0) == 0)
      throw Refusal{sh.file.string(), "--out", "the output folder " + out.string() + " overlaps this shard's folder",
                    "pass a new --out folder outside every shard folder"};
    try {
      sh.rec = records::read_outcomes(sh.file);
    } catch (const RecordError& e) {
      throw Refusal{e.file(), e.pointer(), "", "", e.what()};
    } catch (const limits::LimitError& e) {  // a size or record count over its limit
      throw Refusal{sh.file.string(), "", "", "", e.what()};
    }
    if (!sh.rec.shard)
      throw Refusal{sh.file.string(), "/shard", "is missing: the run recorded no catalog digest, commit or shard",
                    "rerun that shard with this kvgate (kvgate mutate --shard k/n)"};
    if (sh.rec.shard->merged_shards > 0)
      throw Refusal{sh.file.string(), "/shard/merged_shards",
                    "is " + std::to_string(sh.rec.shard->merged_shards) + ": this is already a merged output",
                    "merge the shard folders themselves"};
    if (sh.rec.interrupted)
      throw Refusal{sh.file.string(), "/interrupted", "is true: the shard was stopped before its last mutant", "rerun that shard"};
  }
  const Shard& first = shards.front();
  const records::ShardRecord& s0 = *first.rec.shard;
  std::map<int, const Shard*> by_index;
  for (const auto& sh : shards) {
    const records::ShardRecord& s = *sh.rec.shard;
    auto same = [&](bool ok, const char* field, const std::string& mine, const std::string& theirs, const char* fix) {
      if (!ok)
        throw Refusal{sh.file.string(), field[0] == '/' ? std::string(field) : std::string("/shard/") + field,
                      "is " + mine + " but " + first.file.string() + " has " + theirs + ": not shards of one run", fix};
    };
    same(s.count == s0.count, "count", std::to_string(s.count), std::to_string(s0.count),
         "pass the shards of one run (the same n in --shard k/n)");
    same(s.catalog_digest == s0.catalog_digest, "catalog_digest", s.catalog_digest, s0.catalog_digest,
         "run every shard with the same catalog file");
    same(s.commit == s0.commit, "commit", "'" + s.commit + "'", "'" + s0.commit + "'",
         "run every shard on the same commit of the source tree");
    same(s.dirty == s0.dirty, "dirty", s.dirty ? "true" : "false", s0.dirty ? "true" : "false",
         "run every shard on the same (committed) source tree");
    same(s.selection == s0.selection, "selection", std::to_string(s.selection.size()) + " mutant ID(s)",
         "another selection of " + std::to_string(s0.selection.size()),
         "run every shard with the same --only / --since / --only-requires");
    same(gate_ids(sh.rec) == gate_ids(first.rec), "/baseline/gates", "one gate set", "another",
         "build every shard from the same tree and options (--gate-targets)");
    if (s.index < 0 || s.index >= s.count)
      throw Refusal{sh.file.string(), "/shard/index", "is " + std::to_string(s.index) + ", outside 0.." + std::to_string(s.count - 1),
                    "rerun that shard with a valid --shard k/n"};
    if (const auto it = by_index.find(s.index); it != by_index.end())
      throw Refusal{sh.file.string(), "/shard/index",
                    "is " + std::to_string(s.index) + ", and so is " + it->second->file.string() + ": the shard is doubled",
                    "pass each shard's folder once"};
    by_index[s.index] = &sh;
  }
  for (int k = 0; k < s0.count; ++k)
    if (!by_index.count(k))
      throw Refusal{"(command line)", "DIR", "shard " + std::to_string(k) + "/" + std::to_string(s0.count) + " is missing",
                    "run kvgate mutate --shard " + std::to_string(k) + "/" + std::to_string(s0.count) + " and pass its output folder"};
  // The catalog: the one the shards recorded unless --catalog names it; its digest must match.
  catalog_path = o.catalog.empty() ? fs::path(first.rec.catalog) : fs::absolute(o.catalog);
  std::string digest;
  try {
    digest = file_digest(catalog_path);
  } catch (const std::exception& ex) {
    throw Refusal{catalog_path.string(), "", "cannot be read (" + std::string(ex.what()) + ")",
                  "pass the catalog the shards ran with (--catalog FILE)"};
  }
  if (digest != s0.catalog_digest)
    throw Refusal{catalog_path.string(), "/shard/catalog_digest",
                  "has digest " + digest + " but the shards ran a catalog of digest " + s0.catalog_digest,
                  "pass the catalog the shards ran with (--catalog FILE)"};
  fs::path schema = catalog_path.parent_path() / "catalog.schema.json";
  if (!fs::exists(schema)) schema = fs::path(default_source_dir()) / "mutations" / "catalog.schema.json";
  try {
    cat = load_catalog(catalog_path, schema);
  } catch (const std::exception& ex) {
    throw Refusal{catalog_path.string(), "", ex.what(), "pass the catalog the shards ran with (--catalog FILE)"};
  }
  source_dir = o.source_dir.empty() ? fs::path(first.rec.source_dir) : fs::absolute(o.source_dir);

  // Every mutant of the selection exactly once, in the shard the partition puts it in.
  RunResult r;
  std::map<std::string, std::pair<const Shard*, std::size_t>> where;
  for (const auto& [k, sh] : by_index) {
    for (std::size_t i = 0; i < sh->rec.mutants.size(); ++i) {
      const std::string& id = sh->rec.mutants[i].id;
      const std::string at = "/mutants/" + std::to_string(i);
      if (const auto it = where.find(id); it != where.end())
        throw Refusal{sh->file.string(), at + "/id",
                      "is " + id + ", which " + it->second.first->file.string() + " holds too: a mutant counted twice",
                      "pass the shards of one run, each once"};
      where[id] = {sh, i};
    }
  }
  for (std::size_t i = 0; i < s0.selection.size(); ++i) {
    const std::string& id = s0.selection[i];
    const int k = static_cast<int>(i % static_cast<std::size_t>(s0.count));
    const auto it = where.find(id);
    if (it == where.end())
      throw Refusal{by_index[k]->file.string(), "/mutants",
                    "has no outcome for " + id + " (shard " + std::to_string(k) + " stopped early: exit_code " +
                        std::to_string(by_index[k]->rec.exit_code) + ")",
                    "rerun kvgate mutate --shard " + std::to_string(k) + "/" + std::to_string(s0.count) + " to the end"};
    if (it->second.first != by_index[k])
      throw Refusal{it->second.first->file.string(), "/mutants/" + std::to_string(it->second.second) + "/id",
                    "is " + id + ", which the partition puts in shard " + std::to_string(k),
                    "run every shard with this kvgate's --shard partition"};
    if (!cat.find(id))
      throw Refusal{catalog_path.string(), "/mutants", "has no mutant " + id, "pass the catalog the shards ran with"};
  }
  if (where.size() != s0.selection.size()) {
    for (const auto& [id, w] : where)
      if (std::find(s0.selection.begin(), s0.selection.end(), id) == s0.selection.end())
        throw Refusal{w.first->file.string(), "/mutants/" + std::to_string(w.second) + "/id",
                      "is " + id + ", which is not in the run's selection", "rerun that shard with this kvgate"};
  }

  r.started_at = first.rec.started_at;
  for (const auto& v : first.rec.variants) r.variants.push_back({v.name, {v.env.begin(), v.env.end()}});
  for (const auto& x : first.rec.baseline.executables) {
    GateExe e;
    e.target = x.target;
    e.path = x.path;
    e.gate_ids = x.gates;
    e.baseline_s = x.seconds;
    e.variants = x.variants;
    r.exes.push_back(e);
  }
  for (const auto& g : first.rec.baseline.gates) r.gates.push_back({g.id, g.exe, g.cases, g.seconds, g.skipped, {}});
  r.baseline_build_s = first.rec.baseline.build_s;
  r.baseline_test_s = first.rec.baseline.test_s;
  r.baseline_green = true;
  std::set<std::string> gate_set;
  for (const auto& g : r.gates) gate_set.insert(g.id);
  for (const auto& [k, sh] : by_index) {
    r.baseline_green = r.baseline_green && sh->rec.baseline.green;
    for (const auto& id : sh->rec.baseline.red)
      if (std::find(r.baseline_red.begin(), r.baseline_red.end(), id) == r.baseline_red.end()) {
        r.baseline_red.push_back(id);
        if (gate_set.count(id)) red.insert(id);
      }
    for (const auto& id : sh->rec.canary_survivors)
      if (std::find(r.canary_survivors.begin(), r.canary_survivors.end(), id) == r.canary_survivors.end())
        r.canary_survivors.push_back(id);
    r.setup_s += sh->rec.summary.setup_s;
    r.mutation_s += sh->rec.summary.mutation_s;
  }
  if (first.rec.canary) {
    r.canary_ran = true;
    r.canary = outcome_of(*first.rec.canary, cat.find(first.rec.canary->id), first, out, "/canary");
    if (!r.canary.mutant)
      throw Refusal{catalog_path.string(), "/mutants", "has no canary " + first.rec.canary->id, "pass the catalog the shards ran with"};
  }
  for (std::size_t i = 0; i < s0.selection.size(); ++i) {
    const auto& [sh, at] = where.at(s0.selection[i]);
    MutantOutcome mo = outcome_of(sh->rec.mutants[at], cat.find(s0.selection[i]), *sh, out, "/mutants/" + std::to_string(at));
    count(r.summary, mo.status);
    r.outcomes.push_back(std::move(mo));
  }
  // A shard that ran partially (--bail, --expected-gates-only) makes the merged run partial too.
  r.full_run = s0.full_selection &&
               std::all_of(shards.begin(), shards.end(), [](const Shard& sh) { return sh.rec.full_run; });
  r.shard = s0;
  r.shard.index = 0;
  r.shard.merged_shards = s0.count;
  classify_run(r, red);
  return r;
}

}  // namespace

int merge_outcomes(const MergeOptions& o, std::ostream& log) {
  if (o.out_dir.empty()) {
    log << "kvgate mutate merge: no output folder; fix: pass --out DIR\n";
    return kExitError;
  }
  const fs::path out = fs::absolute(o.out_dir).lexically_normal();
  std::vector<Shard> shards;
  for (const auto& p : o.inputs) {
    Shard sh;
    sh.file = fs::is_directory(p) ? p / "outcomes.json" : p;
    sh.dir = sh.file.parent_path().empty() ? fs::path(".") : sh.file.parent_path();
    shards.push_back(std::move(sh));
  }
  Catalog cat;
  fs::path catalog_path, source_dir;
  std::set<std::string> red;
  RunResult r;
  try {
    r = merged_run(o, shards, cat, catalog_path, source_dir, red, out);
  } catch (const Refusal& f) {
    if (!f.whole.empty())
      log << "kvgate mutate merge: " << f.whole << "\n";
    else
      log << "kvgate mutate merge: " << f.file << ": " << (f.field.empty() ? "" : "field " + f.field + " ") << f.problem
          << "; fix: " << f.fix << "\n";
    log << "kvgate mutate merge: nothing written\n";
    return kExitError;
  }
  MutateOptions mo;
  const records::OptionsRecord& opt = shards.front().rec.options;
  mo.source_dir = source_dir;
  mo.catalog = catalog_path;
  mo.out_dir = out;
  mo.only = opt.only;
  mo.gate_targets = opt.gate_targets;
  mo.since = opt.since;
  mo.jobs = opt.jobs;
  mo.min_timeout_s = opt.min_timeout_s;
  mo.timeout_factor = opt.timeout_factor;
  mo.canary = opt.canary;
  mo.web_dist = o.web_dist;
  mo.report_schema = source_dir / "mutations" / "schema" / "mutation-testing-report-schema.json";
  if (!fs::exists(mo.report_schema))
    mo.report_schema = fs::path(default_source_dir()) / "mutations" / "schema" / "mutation-testing-report-schema.json";
  mo.junit = o.junit;
  mo.format = o.format;
  mo.shard_count = r.shard.count;
  const ReportContext ctx{source_dir, source_dir, out, catalog_path.string(), mo};
  try {
    write_reports(r, ctx, log);
  } catch (const std::exception& ex) {
    log << "kvgate mutate merge: error writing the merged reports in " << out.string() << ": " << ex.what() << "\n";
    return kExitError;
  }
  write_ci_outputs(r, ctx, std::cout, log);
  log << "kvgate mutate merge: " << shards.size() << " shard(s), " << r.outcomes.size() << " mutant(s): killed "
      << r.summary.killed << ", survived " << r.summary.survived << ", timeout " << r.summary.timeout << ", unviable "
      << r.summary.unviable << ", noop " << r.summary.noop << ", skipped " << r.summary.skipped << "\n";
  for (const auto& f : r.check_failures) log << "  check failed: " << f << "\n";
  log << "kvgate mutate merge: outputs in " << out.string() << " (outcomes.json, kill_matrix.md, index.html); exit "
      << r.exit_code << "\n";
  return r.exit_code;
}

}  // namespace kvgate::mutate
