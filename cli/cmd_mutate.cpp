// `kvgate mutate`: the mutation driver (mutations/, docs/MUTATIONS.md).
#include <filesystem>
#include <algorithm>
#include <iostream>
#include <memory>
#include <thread>

#include "commands.hpp"
#include "kvgate_mutations/driver.hpp"
#include "kvgate_mutations/process.hpp"

namespace kvgate::cli {

namespace {
struct MutateCli {
  std::string catalog, out = "mutants.out", since, build_dir, source_dir, scratch, web_dist, only, gate_targets,
      only_requires;
  // Both cores by default: the gate executables run side by side (the longest starts first).
  int jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool list = false, no_canary = false, expected_gates_only = false, restore_objects = false, skip_red_gates = false;
  double min_timeout = 20;
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
  o.catalog = c.catalog;
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
  o.gate_targets = split(c.gate_targets);
  o.only_requires = split(c.only_requires);
  o.expected_gates_only = c.expected_gates_only;
  o.restore_objects = c.restore_objects;
  o.skip_red_gates = c.skip_red_gates;
  return mutate::run_mutate(o, std::cerr);
}
}  // namespace

void register_mutate(CLI::App& app) {
  auto c = std::make_shared<MutateCli>();
  auto* sub = app.add_subcommand(
      "mutate",
      "Mutation testing: patch the runtime with each catalog mutant in a scratch copy, rebuild, run every gate, "
      "and prove every gate can go red (docs/MUTATIONS.md). Exit 0 all killed, 2 survived, 3 timeout, "
      "4 baseline red / canary not red, 5 stale catalog, 6 unviable or noop, 7 expectation mismatch, "
      "130 interrupted");
  sub->add_option("--catalog", c->catalog, "catalog JSON (default <source>/mutations/catalog.json)");
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
                  "comma-separated requirement kinds (cuda, cuda-device): run only the mutants that require one of "
                  "them (partial run)");
  sub->add_flag("--expected-gates-only", c->expected_gates_only,
                "run only the gates each mutant names in expect_killed_by (baseline and canary: their union); for "
                "device runs with slow gate programs (partial run)");
  sub->add_flag("--restore-objects", c->restore_objects,
                "keep a copy of the baseline objects and put them back after each mutant instead of recompiling "
                "(machines without ccache)");
  sub->add_flag("--skip-red-gates", c->skip_red_gates,
                "with --expected-gates-only: gates red in the baseline are left out instead of stopping the run; "
                "mutants that expect only them are skipped; exit 4 at the end");
  sub->add_option("--min-timeout", c->min_timeout, "floor of the per-gate timeout in seconds")->capture_default_str();
  sub->add_option("--cmake-arg", c->cmake_args, "extra argument for configuring the scratch build (repeatable)");
  sub->add_flag("--no-canary", c->no_canary, "skip the canary (debugging only: the run then proves less)");
  on_run(sub, [c] { return run_mutate_cmd(*c); });
}

}  // namespace kvgate::cli
