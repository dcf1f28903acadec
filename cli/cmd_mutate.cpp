// `kvgate mutate`: the mutation driver (mutations/, docs/MUTATIONS.md).
#include <filesystem>
#include <algorithm>
#include <iostream>
#include <memory>
#include <thread>

#include "commands.hpp"
#include "kvgate_mutations/driver.hpp"
#include "kvgate_mutations/process.hpp"
#include "kvgate_mutations/shard.hpp"

namespace kvgate::cli {

namespace {
struct MutateCli {
  std::vector<std::string> catalogs, prove_seeds, gate_shards;
  std::string prove_first;
  std::string out = "mutants.out", since, build_dir, source_dir, scratch, web_dist, only, gate_targets,
      only_requires, shard, junit, format = "text";
  // Both cores by default: the gate executables run side by side (the longest starts first).
  int jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool list = false, no_canary = false, expected_gates_only = false, restore_objects = false, skip_red_gates = false,
       no_schemata = false, no_compile_ahead = false, all_gates = false, bail = false, prove_gates = false, prove_rebuild = false;
  double min_timeout = 20, prove_deadline = 0;
  std::vector<std::string> cmake_args;
};

std::string default_source_dir() {
  const auto [rc, out] = mutate::capture_output({"git", "rev-parse", "--show-toplevel"});
  if (rc == 0 && !out.empty()) {
    const std::string top = out.substr(0, out.find_last_not_of("\n\r") + 1);
    if (std::filesystem::exists(std::filesystem::path(top) / "mutations" / "catalog.json")) return top;
  }
  return mutate::default_source_dir();
}

int run_mutate_cmd(const MutateCli& c) {
  mutate::MutateOptions o;
  o.source_dir = c.source_dir.empty() ? default_source_dir() : c.source_dir;
  if (!c.catalogs.empty()) o.catalog = c.catalogs.front();
  for (std::size_t i = 1; i < c.catalogs.size(); ++i) o.extra_catalogs.emplace_back(c.catalogs[i]);
  o.prove_gates = c.prove_gates;
  o.prove_rebuild = c.prove_rebuild;
  o.prove_deadline_s = c.prove_deadline;
  for (const auto& g : c.gate_shards) {
    const auto eq = g.find('=');
    int n = 0;
    try {
      if (eq != std::string::npos && eq > 0) n = std::stoi(g.substr(eq + 1));
    } catch (...) {
    }
    if (n < 1 || n > 64) {
      std::cerr << "kvgate mutate: --gate-shards " << g << ": expected PROGRAM=N with N from 1 to 64 (e.g. gate_cuda=8)\n";
      return 2;
    }
    o.gate_shards[g.substr(0, eq)] = n;
  }
  for (const auto& f : c.prove_seeds) o.prove_seeds.emplace_back(f);
  o.out_dir = c.out;
  o.since = c.since;
  o.build_dir = c.build_dir;
  o.scratch_dir = c.scratch;
  o.web_dist = c.web_dist;
  o.jobs = c.jobs;
  o.list = c.list;
  {  // --list checks which gate program compiles each mutant's file in the build this kvgate lives in
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) o.list_build_dir = self.parent_path();
  }
  o.canary = !c.no_canary;
  o.min_timeout_s = c.min_timeout;
  o.cmake_args = c.cmake_args;
  auto split = [](const std::string& s) {
    std::vector<std::string> r;
    std::string cur;
    for (char ch : s + ",") {
      if (ch == ',') {
        if (!cur.empty()) r.push_back(cur);
        cur.clear();
      } else if (ch != ' ') {
        cur += ch;
      }
    }
    return r;
  };
  o.only = split(c.only);
  o.prove_first = split(c.prove_first);
  o.gate_targets = split(c.gate_targets);
  o.only_requires = split(c.only_requires);
  o.expected_gates_only = c.expected_gates_only;
  o.restore_objects = c.restore_objects;
  o.skip_red_gates = c.skip_red_gates;
  o.schemata = !c.no_schemata;
  o.compile_ahead = !c.no_compile_ahead;
  o.all_gates = c.all_gates;
  o.bail = c.bail;
  if (!c.shard.empty()) {
    std::string err;
    const auto sh = mutate::parse_shard(c.shard, &err);
    if (!sh) {
      std::cerr << "kvgate mutate: " << err << "\n";
      return mutate::kExitError;
    }
    o.shard_index = sh->index;
    o.shard_count = sh->count;
  }
  o.junit = c.junit;
  o.format = c.format;
  return mutate::run_mutate(o, std::cerr);
}

struct MergeCli {
  std::vector<std::string> inputs;
  std::string out, catalog, source_dir, web_dist, junit, format = "text";
};
}  // namespace

void register_mutate(CLI::App& app) {
  auto c = std::make_shared<MutateCli>();
  auto* sub = app.add_subcommand(
      "mutate",
      "Mutation testing: patch the runtime with each catalog mutant in a scratch copy, rebuild, run every gate, "
      "and prove every gate can go red (docs/MUTATIONS.md). Exit 0 all killed, 2 survived, 3 timeout, "
      "4 baseline red / canary not red, 5 stale catalog, 6 unviable or noop, 7 expectation mismatch, "
      "130 interrupted");
  sub->add_option("--catalog", c->catalogs,
                  "catalog JSON (default <source>/mutations/catalog.json); with --prove-gates repeatable: the catalogs "
                  "are joined (the canary once)");
  sub->add_option("--only", c->only, "comma-separated mutant IDs to run (the canary always runs)");
  sub->add_option("--jobs,-j", c->jobs, "parallel build jobs and gate processes")->capture_default_str();
  sub->add_option("--out", c->out, "output folder")->capture_default_str();
  sub->add_flag("--list", c->list, "list the catalog with each anchor's status; build nothing");
  sub->add_option("--since", c->since, "only mutants whose file changed since this git revision");
  sub->add_option("--build-dir", c->build_dir, "scratch build folder (default <scratch>/build)");
  sub->add_option("--source-dir", c->source_dir, "source tree to copy (default: the enclosing git work tree)");
  sub->add_option("--scratch", c->scratch, "scratch copy of the tree (default <source>/.scratch/mutants)");
  sub->add_option("--web-dist", c->web_dist,
                  "mutation-test-elements.js to vendor next to index.html (default "
                  "<source>/mutations/web/node_modules/mutation-testing-elements/dist/)");
  sub->add_option("--gate-targets", c->gate_targets,
                  "comma-separated gate executables to build and run instead of all (smoke tests; the run is then "
                  "partial)");
  sub->add_option("--only-requires", c->only_requires,
                  "comma-separated requirement kinds (cuda, cuda-device, avx512): run only the mutants that require one of "
                  "them (partial run)");
  sub->add_flag("--expected-gates-only", c->expected_gates_only,
                "run only the gates each mutant names in expect_killed_by (baseline and canary: their union); for "
                "device runs with slow gate programs (partial run)");
  sub->add_flag("--restore-objects", c->restore_objects,
                "keep a copy of the baseline objects and put them back after each mutant instead of recompiling "
                "(machines without ccache)");
  sub->add_flag("--skip-red-gates", c->skip_red_gates,
                "with --expected-gates-only or --prove-gates: gates red in the baseline are left out instead of stopping the "
                "run (a proof lists them as not provable); "
                "mutants that expect only them are skipped; exit 4 at the end");
  sub->add_flag("--no-schemata", c->no_schemata,
                "patch and rebuild every mutant (default: the mutants that can be a run-time switch are compiled "
                "into the scratch build once and turned on by KVGATE_MUTANT=<id>; docs/MUTATIONS.md, Schemata)");
  sub->add_flag("--no-compile-ahead", c->no_compile_ahead,
                "compile each patch-and-rebuild mutant in its turn (default: a worker compiles the coming ones into "
                "ccache on a copy of the scratch sources while other mutants run; docs/MUTATIONS.md, Compile-ahead)");
  sub->add_flag("--all-gates", c->all_gates,
                "with schemata: run every gate program for every switched mutant (default: only the programs whose "
                "baseline evaluated its switch; the others' gates are 'not reached')");
  sub->add_flag("--bail", c->bail,
                "per mutant, run the gate programs quickest first and stop at the first kill (each program at its "
                "first failed case): the same statuses, one killing gate each; a partial run (no 'every gate kills "
                "one' check)");
  sub->add_flag("--prove-gates", c->prove_gates,
                "prove every gate ID can go red: per gate program, run candidate mutants on exactly its gates not yet "
                "proven (a Catch2 filter) until none is left; writes proof.json and proof.md; exit 7 when a gate "
                "stays unproven (docs/MUTATIONS.md, Proving every gate)");
  sub->add_option("--prove-seed", c->prove_seeds,
                  "with --prove-gates: an earlier run's outcomes.json (or its folder), whose kills count as proven, or "
                  "an earlier proof.json (resume; join proofs run per program); repeatable");
  sub->add_flag("--prove-rebuild", c->prove_rebuild,
                "with --prove-gates: the patch-and-rebuild mutants are candidates too (their build counted in the order) on the gates still unproven "
                "(slow: one build each)");
  sub->add_option("--prove-deadline", c->prove_deadline,
                  "with --prove-gates: SECONDS after the start past which no further mutant run starts (the run under "
                  "way finishes); then proof.json/proof.md are written and the exit is 7 while a gate is open "
                  "(proof.json is also rewritten after every run, so a killed proof leaves its record)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--prove-first", c->prove_first,
                  "with --prove-gates: ID[,ID...] mutants tried first, in this order (each while it reaches an open "
                  "gate it has not tried), before the affinity order");
  sub->add_option("--gate-shards", c->gate_shards,
                  "PROGRAM=N: run that gate program as N processes side by side, each with a Catch2 spec for its "
                  "share of the gate IDs (listed before the baseline; balanced by baseline seconds after it); repeatable");
  sub->add_option("--min-timeout", c->min_timeout, "floor of the per-gate timeout in seconds")->capture_default_str();
  sub->add_option("--cmake-arg", c->cmake_args, "extra argument for configuring the scratch build (repeatable)");
  sub->add_flag("--no-canary", c->no_canary, "skip the canary (debugging only: the run then proves less)");
  sub->add_option("--shard", c->shard,
                  "k/n: run only the selected mutants at positions i with i mod n == k (0 <= k < n); the baseline "
                  "and the canary run on every shard; join the n output folders with `kvgate mutate merge`");
  sub->add_option("--junit", c->junit, "write JUnit XML to this file (atomically): one testcase per mutant, survived = failure");
  sub->add_option("--format", c->format, "text, or github: ::error annotations for survivors at the mutant's anchor line (stdout)")
      ->check(CLI::IsMember({"text", "github"}))
      ->capture_default_str();

  auto m = std::make_shared<MergeCli>();
  auto* merge = sub->add_subcommand(
      "merge", "Join the output folders of `kvgate mutate --shard k/n` (every k of one run) into one outcomes.json, kill "
               "matrix and Stryker report; refuses a missing or doubled shard, shards of other catalogs or commits, a "
               "corrupt outcomes.json (nothing is written then)");
  merge->add_option("DIR", m->inputs, "the shard output folders (or their outcomes.json)")->required();
  merge->add_option("--out", m->out, "the merged output folder")->required();
  merge->add_option("--catalog", m->catalog, "the catalog the shards ran (default: the path they recorded)");
  merge->add_option("--source-dir", m->source_dir, "the source tree, for the Stryker report's sources (default: the one they recorded)");
  merge->add_option("--web-dist", m->web_dist, "mutation-test-elements.js to vendor next to index.html");
  merge->add_option("--junit", m->junit, "write JUnit XML of the merged run to this file (atomically)");
  merge->add_option("--format", m->format, "text, or github: ::error annotations for survivors (stdout)")
      ->check(CLI::IsMember({"text", "github"}))
      ->capture_default_str();
  on_run(sub, [c, m, merge] {
    if (merge->parsed()) {
      mutate::MergeOptions mo;
      for (const auto& i : m->inputs) mo.inputs.emplace_back(i);
      mo.out_dir = m->out;
      mo.catalog = m->catalog;
      mo.source_dir = m->source_dir;
      mo.web_dist = m->web_dist;
      mo.junit = m->junit;
      mo.format = m->format;
      return mutate::merge_outcomes(mo, std::cerr);
    }
    return run_mutate_cmd(*c);
  });
}

}  // namespace kvgate::cli
