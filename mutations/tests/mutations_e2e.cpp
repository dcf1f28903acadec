// End-to-end tests of `kvgate mutate`, running the real kvgate binary:
//  [fixture] the driver on mutations/tests/fixture (a tiny project with one mutant per outcome):
//            every status, every exit code, Ctrl-C, and the outputs.
//  [real]    the driver on the kvgate tree itself with three fast mutants (--only) against the
//            fast gate executables (--gate-targets), then the Stryker report against the schema.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "catch_compat.hpp"
#include "kvgate_mutations/catalog.hpp"
#include "kvgate_mutations/json_schema.hpp"
#include "kvgate_mutations/process.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace kvgate::mutate;

namespace {

const fs::path kSource = KVGATE_E2E_SOURCE_DIR;
const fs::path kWork = KVGATE_E2E_WORK_DIR;
const std::string kKvgate = KVGATE_E2E_KVGATE;

struct Run {
  int rc = -1;
  std::string log;
  json outcomes;
};

Run mutate(const fs::path& work, const std::vector<std::string>& args,
           const std::vector<std::pair<std::string, std::string>>& env = {}) {
  std::vector<std::string> argv{kKvgate, "mutate", "--scratch", (work / "tree").string(), "--out",
                                (work / "out").string()};
  argv.insert(argv.end(), args.begin(), args.end());
  fs::create_directories(work);
  const ProcResult pr = run_process({argv, {}, env, (work / "driver.log").string(), 900});
  Run r;
  r.rc = pr.ended_normally() ? pr.exit_code : -1;
  r.log = read_text(work / "driver.log");
  if (fs::exists(work / "out" / "outcomes.json")) r.outcomes = json::parse(read_text(work / "out" / "outcomes.json"));
  return r;
}

// The element of array `list` whose `key` is `value` (a test failure when there is none).
const json& entry(const json& list, const char* key, const std::string& value) {
  for (const auto& m : list)
    if (m.at(key) == value) return m;
  FAIL("no entry with " << key << " = " << value);
  static json none;
  return none;
}

const json& mutant(const json& oc, const std::string& id) { return entry(oc.at("mutants"), "id", id); }

std::vector<std::string> fixture_args(const std::vector<std::string>& extra, const std::string& min_timeout = "2") {
  std::vector<std::string> a{"--source-dir", (kSource / "mutations" / "tests" / "fixture").string(), "--catalog",
                             (kSource / "mutations" / "tests" / "fixture" / "catalog.json").string(),
                             "--min-timeout", min_timeout};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// The fixture tree with another catalog.
std::vector<std::string> fixture_args_for(const fs::path& catalog, const std::vector<std::string>& extra) {
  std::vector<std::string> a = fixture_args(extra);
  a[3] = catalog.string();
  return a;
}

void check_report(const fs::path& out) {
  const json report = json::parse(read_text(out / "mutation-report.json"));
  const json schema = json::parse(read_text(kSource / "mutations" / "schema" / "mutation-testing-report-schema.json"));
  const auto errs = validate_json(report, schema);
  INFO(format_errors(errs));
  CHECK(errs.empty());
  CHECK(report.at("schemaVersion") == "2");
  CHECK(fs::exists(out / "kill_matrix.csv"));
  CHECK(fs::exists(out / "kill_matrix.md"));
  const std::string html = read_text(out / "index.html");
  CHECK(html.find("mutation-test-report-app") != std::string::npos);
}

}  // namespace

TEST_CASE("fixture: killed, crashed, survived, timeout, unviable, noop, mismatch, stale, red baseline",
          "[fixture]") {
  const fs::path w = kWork / "fixture";
  {
    INFO("killed + killed by a crash: exit 0");
    const Run r = mutate(w, fixture_args({"--only", "FIX.killed,FIX.crash"}));
    INFO(r.log);
    REQUIRE(r.rc == 0);
    CHECK(r.outcomes["canary"]["status"] == "killed");
    CHECK(r.outcomes["canary_survivors"].empty());
    const json& k = mutant(r.outcomes, "FIX.killed");
    CHECK(k["status"] == "killed");
    CHECK(k["killed_by"] == json::array({"FIX.add"}));
    CHECK(k["gates"]["FIX.add"]["status"] == "failed");
    CHECK(k["gates"]["FIX.mul"]["status"] == "passed");
    const json& c = mutant(r.outcomes, "FIX.crash");
    CHECK(c["status"] == "killed");
    CHECK(c["gates"]["FIX.mul"]["status"] == "crashed");
    CHECK(c["gates"]["FIX.twice"]["status"] == "passed");  // after the crash, run alone
    CHECK(c["gates"]["FIX.add"]["status"] == "passed");
    CHECK(r.outcomes["summary"]["run"] == 2);
    check_report(w / "out");
    const std::string csv = read_text(w / "out" / "kill_matrix.csv");
    CHECK(csv.find("FIX.crash,store,src/lib.cpp,killed,") != std::string::npos);
    CHECK(fs::exists(w / "out" / "mutants" / "FIX.killed" / "diff.patch"));
    CHECK(read_text(w / "out" / "mutants" / "FIX.killed" / "diff.patch").find("+int add(int a, int b) { return a - b; }") !=
          std::string::npos);
    // The scratch copy is restored.
    CHECK(read_text(w / "tree" / "src" / "lib.cpp") ==
          read_text(kSource / "mutations" / "tests" / "fixture" / "src" / "lib.cpp"));
  }
  {
    INFO("survived: exit 2");
    const Run r = mutate(w, fixture_args({"--only", "FIX.survived"}));
    INFO(r.log);
    CHECK(r.rc == 2);
    CHECK(mutant(r.outcomes, "FIX.survived")["status"] == "survived");
    CHECK(r.outcomes["exit_code"] == 2);
  }
  {
    INFO("timeout: exit 3, the process group is killed");
    const auto t0 = std::chrono::steady_clock::now();
    const Run r = mutate(w, fixture_args({"--only", "FIX.timeout"}));
    INFO(r.log);
    CHECK(r.rc == 3);
    const json& m = mutant(r.outcomes, "FIX.timeout");
    CHECK(m["status"] == "timeout");
    CHECK(m["gates"]["FIX.identity"]["status"] == "timeout");
    CHECK(m["gates"]["FIX.never"]["status"] == "passed");
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 100);
  }
  {
    INFO("unviable and noop: exit 6");
    const Run r = mutate(w, fixture_args({"--only", "FIX.unviable,FIX.noop"}));
    INFO(r.log);
    CHECK(r.rc == 6);
    CHECK(mutant(r.outcomes, "FIX.unviable")["status"] == "unviable");
    CHECK(mutant(r.outcomes, "FIX.noop")["status"] == "noop");
    const json report = json::parse(read_text(w / "out" / "mutation-report.json"));
    std::set<std::string> statuses;
    for (const auto& m : report["files"]["src/lib.cpp"]["mutants"]) statuses.insert(m["status"]);
    CHECK(statuses == std::set<std::string>{"CompileError", "Ignored"});
  }
  {
    INFO("killed but not by every expected gate: exit 7");
    const Run r = mutate(w, fixture_args({"--only", "FIX.mismatch"}));
    INFO(r.log);
    CHECK(r.rc == 7);
    const json& m = mutant(r.outcomes, "FIX.mismatch");
    CHECK(m["status"] == "killed");
    CHECK(m["expected_not_killing"] == json::array({"FIX.add"}));
  }
  {
    INFO("a red baseline: exit 4");
    const Run r = mutate(w, fixture_args({"--only", "FIX.killed"}), {{"KVGATE_FIXTURE_RED", "1"}});
    INFO(r.log);
    CHECK(r.rc == 4);
    CHECK(r.log.find("not green: FIX.never") != std::string::npos);
  }
  {
    INFO("a STALE anchor: exit 5, naming the mutant");
    json cat = json::parse(read_text(kSource / "mutations" / "tests" / "fixture" / "catalog.json"));
    cat["mutants"][1]["anchor"] = "int add(int a, int b) { return a + b + 0; }";
    fs::create_directories(w);
    write_text(w / "stale.json", cat.dump(2));
    std::vector<std::string> a = fixture_args({});
    a[3] = (w / "stale.json").string();
    a.push_back("--only");
    a.push_back("FIX.killed");
    const Run r = mutate(w, a);
    CHECK(r.rc == 5);
    CHECK(r.log.find("STALE FIX.killed") != std::string::npos);
  }
  {
    INFO("--since: only mutants whose file changed (none since HEAD in the committed fixture)");
    const Run r = mutate(w, fixture_args({"--since", "HEAD"}));
    INFO(r.log);
    CHECK(r.rc == 0);
    CHECK(r.log.find("--since HEAD: 0 mutant(s) on changed lines") != std::string::npos);
    CHECK(r.outcomes["full_run"] == false);
  }
  {
    INFO("--list: the catalog and its anchors");
    const Run r = mutate(w, fixture_args({"--list"}));
    CHECK(r.rc == 0);
    CHECK(r.log.find("FIX.mismatch") != std::string::npos);
  }
  {
    INFO("the environment matrix: a mutant only gate_math's ctest variant (FX_PORTABLE=1) reaches is killed there");
    const Run r = mutate(w, fixture_args({"--only", "FIX.portable_only"}));
    INFO(r.log);
    CHECK(r.rc == 0);
    CHECK(r.log.find("gate_math runs in default portable (FX_PORTABLE=1)") != std::string::npos);
    const json& m = mutant(r.outcomes, "FIX.portable_only");
    CHECK(m["status"] == "killed");
    CHECK(m["killed_by"] == json::array({"FIX.triple"}));
    CHECK(m["killed_in"]["FIX.triple"] == json::array({"portable"}));  // not in the default run
    CHECK(m["gates"]["FIX.triple"]["variant"] == "portable");
    CHECK(r.outcomes["variants"].size() == 2);
    CHECK(read_text(w / "out" / "kill_matrix.md").find("FIX.triple [portable]") != std::string::npos);
    // Anti-vacuity: the unmutated default run of FIX.triple passed (the variant made the kill).
    CHECK(mutant(r.outcomes, "FIX.portable_only")["gates"].size() >= 4);
  }
  {
    INFO("a mutant in a file no gate program compiles is refused by name (exit 5), at run time and at --list");
    json cat = json::parse(read_text(kSource / "mutations" / "tests" / "fixture" / "catalog.json"));
    json m = cat["mutants"][1];
    m["id"] = "FIX.nogate";
    m["file"] = "src/unused.cpp";
    m["anchor"] = "int fx_unused() { return 1; }";
    m["replacement"] = "int fx_unused() { return 2; }";
    cat["mutants"].push_back(m);
    fs::create_directories(w);
    write_text(w / "nogate.json", cat.dump(2));
    std::vector<std::string> a = fixture_args({"--only", "FIX.nogate"});
    a[3] = (w / "nogate.json").string();
    const Run r = mutate(w, a);
    INFO(r.log);
    CHECK(r.rc == 5);
    CHECK(r.log.find("mutant FIX.nogate: no gate program of this run compiles src/unused.cpp") != std::string::npos);
    CHECK(r.log.find("noop:") == std::string::npos);
    std::vector<std::string> l = fixture_args({"--list", "--build-dir", (w / "tree" / "build").string()});
    l[3] = (w / "nogate.json").string();
    const Run rl = mutate(w, l);
    INFO(rl.log);
    CHECK(rl.rc == 5);
    CHECK(rl.log.find("NOGATE") != std::string::npos);
    CHECK(rl.log.find("1 in a file no gate program compiles") != std::string::npos);
  }
}

TEST_CASE("fixture: schemata and patch-and-rebuild give the same verdicts; the report names each path",
          "[fixture]") {
  const fs::path w = kWork / "fixture_schemata";
  // The fixture catalog (less the 120 s sleeper) plus a mutant of code no gate calls.
  json cat = json::parse(read_text(kSource / "mutations" / "tests" / "fixture" / "catalog.json"));
  json& ms = cat["mutants"];
  ms.erase(std::remove_if(ms.begin(), ms.end(), [](const json& m) { return m["id"] == "FIX.timeout"; }), ms.end());
  json un = ms[1];
  REQUIRE(un["id"] == "FIX.killed");
  un["id"] = "FIX.unreached";
  un["anchor"] = "int unreached(int x) { return x + 1; }";
  un["replacement"] = "int unreached(int x) { return x + 2; }";
  un["expect_killed_by"] = json::array({"FIX.add"});
  ms.push_back(un);
  fs::create_directories(w);
  write_text(w / "catalog.json", cat.dump(2));
  auto args = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = fixture_args(extra);
    a[3] = (w / "catalog.json").string();
    return a;
  };
  const Run sch = mutate(w / "schema", args({}));
  INFO(sch.log);
  const Run reb = mutate(w / "rebuild", args({"--no-schemata"}));
  INFO(reb.log);
  REQUIRE(sch.outcomes.contains("mutants"));
  REQUIRE(reb.outcomes.contains("mutants"));
  CHECK(sch.rc == reb.rc);
  REQUIRE(sch.outcomes["mutants"].size() == reb.outcomes["mutants"].size());
  REQUIRE(sch.outcomes["mutants"].size() == ms.size() - 1);  // less the canary
  std::map<std::string, std::string> path;
  for (std::size_t i = 0; i < sch.outcomes["mutants"].size(); ++i) {
    const json& a = sch.outcomes["mutants"][i];
    const json& b = reb.outcomes["mutants"][i];
    INFO(a["id"] << ": " << a["path"] << " (" << a["path_reason"] << ")");
    REQUIRE(a["id"] == b["id"]);  // selection order, whatever order the paths ran in
    path[a["id"]] = a["path"];
    CHECK(b["path"] == "rebuild");
    if (a["id"] == "FIX.unreached") continue;
    CHECK(a["status"] == b["status"]);
    CHECK(a["killed_by"] == b["killed_by"]);
    CHECK(a["expected_not_killing"] == b["expected_not_killing"]);
  }
  // Anti-vacuity: both paths ran, and the switched mutants needed no build.
  CHECK(path["FIX.killed"] == "schema");
  CHECK(path["FIX.survived"] == "schema");
  CHECK(path["FIX.portable_only"] == "schema");  // killed only in the FX_PORTABLE=1 variant, as a switch
  CHECK(path["FIX.noop"] == "rebuild");          // a comment: only the rebuild can tell a no-op
  CHECK(path["FIX.unviable"] == "rebuild");      // no switch form compiles: moved to the rebuild path
  CHECK(mutant(sch.outcomes, "FIX.unviable")["path_reason"].get<std::string>().find("no switch form compiles") !=
        std::string::npos);
  CHECK(mutant(sch.outcomes, "FIX.killed")["build_s"] == 0);
  CHECK(mutant(sch.outcomes, "FIX.killed")["status"] == "killed");
  CHECK(mutant(sch.outcomes, "FIX.portable_only")["killed_in"]["FIX.triple"] == json::array({"portable"}));
  // A switch no gate reaches is a finding (noop: nothing runs that code), where the rebuild path
  // can only say "survived".
  CHECK(mutant(sch.outcomes, "FIX.unreached")["status"] == "noop");
  CHECK(mutant(sch.outcomes, "FIX.unreached")["reason"].get<std::string>().find("reach") != std::string::npos);
  CHECK(mutant(reb.outcomes, "FIX.unreached")["status"] == "survived");
  CHECK(sch.log.find("schemata: ") != std::string::npos);
  // Compile-ahead (the default): with ccache, the patch-and-rebuild mutants after the first are
  // compiled into the cache on a copy of the scratch sources before their turn; the verdicts are
  // those of a run that compiles each in its turn.
  const Run cold = mutate(w / "cold", args({"--no-schemata", "--no-compile-ahead"}));
  INFO(cold.log);
  REQUIRE(cold.outcomes.contains("mutants"));
  REQUIRE(cold.outcomes["mutants"].size() == reb.outcomes["mutants"].size());
  int ahead = 0;
  for (std::size_t i = 0; i < cold.outcomes["mutants"].size(); ++i) {
    const json& a = cold.outcomes["mutants"][i];
    const json& b = reb.outcomes["mutants"][i];
    INFO(a["id"]);
    CHECK(a["status"] == b["status"]);
    CHECK(a["killed_by"] == b["killed_by"]);
    CHECK(a.value("compiled_ahead", false) == false);
    ahead += b.value("compiled_ahead", false) ? 1 : 0;
  }
  CHECK(cold.log.find("compile-ahead:") == std::string::npos);
  if (std::system("command -v ccache >/dev/null 2>&1") == 0) {  // the fixture compiles through ccache when present
    CHECK(ahead > 0);
    CHECK(reb.log.find("compile-ahead: ") != std::string::npos);
    CHECK(fs::exists(w / "rebuild" / "tree.ahead" / "src" / "lib.cpp"));
    // The copy is put back after each job: it holds the unmutated source.
    CHECK(read_text(w / "rebuild" / "tree.ahead" / "src" / "lib.cpp") ==
          read_text(kSource / "mutations" / "tests" / "fixture" / "src" / "lib.cpp"));
  }
  // Coverage selection (the default) against --all-gates: the same verdicts; the program that never
  // evaluates a switch does not run for it.
  const Run all = mutate(w / "all", args({"--all-gates"}));
  INFO(all.log);
  REQUIRE(all.outcomes.contains("mutants"));
  REQUIRE(all.outcomes["mutants"].size() == sch.outcomes["mutants"].size());
  for (std::size_t i = 0; i < all.outcomes["mutants"].size(); ++i) {
    const json& a = all.outcomes["mutants"][i];
    const json& b = sch.outcomes["mutants"][i];
    INFO(a["id"]);
    CHECK(a["status"] == b["status"]);
    CHECK(a["killed_by"] == b["killed_by"]);
  }
  CHECK(sch.log.find("kvgate mutate: coverage: ") != std::string::npos);
  CHECK(mutant(sch.outcomes, "FIX.killed")["gates"]["FIX.identity"]["status"] == "not_run");  // gate_misc never calls add()
  CHECK(mutant(all.outcomes, "FIX.killed")["gates"]["FIX.identity"]["status"] == "passed");
  CHECK(mutant(sch.outcomes, "FIX.unreached")["reason"].get<std::string>().find("no gate program reaches") !=
        std::string::npos);
  CHECK(mutant(all.outcomes, "FIX.unreached")["reason"].get<std::string>().find("no gate reached") != std::string::npos);
  // --bail: the same statuses; each kill comes from gates the full run also saw kill; the gates
  // after the first kill are "not run", so the run is partial.
  const Run bail = mutate(w / "bail", args({"--bail", "--jobs", "1"}));
  INFO(bail.log);
  REQUIRE(bail.outcomes.contains("mutants"));
  REQUIRE(bail.outcomes["mutants"].size() == sch.outcomes["mutants"].size());
  int bailed_gates = 0;
  for (std::size_t i = 0; i < bail.outcomes["mutants"].size(); ++i) {
    const json& a = bail.outcomes["mutants"][i];
    const json& b = sch.outcomes["mutants"][i];
    INFO(a["id"]);
    CHECK(a["status"] == b["status"]);
    for (const auto& g : a["killed_by"]) {
      const auto& kb = b["killed_by"];
      CHECK(std::find(kb.begin(), kb.end(), g) != kb.end());
    }
    if (a["status"] == "killed") CHECK_FALSE(a["killed_by"].empty());
    for (const auto& [id, g] : a["gates"].items())
      if (g["status"] == "not_run" && g.value("detail", "").find("--bail") != std::string::npos) ++bailed_gates;
    CHECK(a["expected_not_killing"] == b["expected_not_killing"]);
  }
  // FIX.mismatch is killed by FIX.twice in gate_math and expects FIX.add too: with one job and
  // gate_math's first failing case being FIX.twice, the rest of gate_math is never run.
  CHECK(bailed_gates > 0);
  CHECK(bail.outcomes["full_run"] == false);
  // The scratch copy leaves the run as the source is.
  CHECK(read_text(w / "schema" / "tree" / "src" / "lib.cpp") ==
        read_text(kSource / "mutations" / "tests" / "fixture" / "src" / "lib.cpp"));
  check_report(w / "schema" / "out");
}

TEST_CASE("fixture: --since selects the mutants on changed lines, not every mutant of a changed file", "[fixture]") {
  const fs::path w = kWork / "fixture_since";
  const fs::path repo = w / "repo";
  fs::remove_all(repo);
  fs::create_directories(w);
  fs::copy(kSource / "mutations" / "tests" / "fixture", repo, fs::copy_options::recursive);
  auto git = [&](std::vector<std::string> a) {
    a.insert(a.begin(), {"git", "-C", repo.string(), "-c", "user.name=kvgate", "-c", "user.email=kvgate@localhost"});
    return run_process({a, {}, {}, (w / "git.log").string(), 60}).ok();
  };
  REQUIRE(git({"init", "-q"}));
  REQUIRE(git({"add", "-A"}));
  REQUIRE(git({"commit", "-q", "-m", "fixture"}));
  // One line changes (the anchor on it stays intact): only the mutant on that line runs.
  const std::string lib = read_text(repo / "src" / "lib.cpp");
  const std::string from = "\"value \" + std::to_string(x);";
  REQUIRE(lib.find(from) != std::string::npos);
  std::string changed = lib;
  changed.replace(changed.find(from), from.size(), "\"value \" + std::to_string(x + 0);");
  write_text(repo / "src" / "lib.cpp", changed);
  const Run r = mutate(w, {"--source-dir", repo.string(), "--catalog", (repo / "catalog.json").string(), "--min-timeout", "2",
                           "--since", "HEAD"});
  INFO(r.log);
  CHECK(r.log.find("--since HEAD: 1 mutant(s) on changed lines") != std::string::npos);
  REQUIRE(r.outcomes.contains("mutants"));
  REQUIRE(r.outcomes["mutants"].size() == 1);
  CHECK(r.outcomes["mutants"][0]["id"] == "FIX.survived");
  CHECK(r.outcomes["full_run"] == false);
}

TEST_CASE("fixture: requires cuda-device, --expected-gates-only, --restore-objects", "[fixture]") {
  const fs::path w = kWork / "fixture_device";
  fs::remove_all(w);  // the first run must find no scratch build
  fs::create_directories(w);
  // The fixture catalog plus a copy of FIX.killed that needs a CUDA device.
  json cat = json::parse(read_text(kSource / "mutations" / "tests" / "fixture" / "catalog.json"));
  json dev = cat["mutants"][1];
  REQUIRE(dev["id"] == "FIX.killed");
  dev["id"] = "FIX.device";
  dev["requires"] = json::array({"cuda-device"});
  cat["mutants"].push_back(dev);
  json red = cat["mutants"][1];  // FIX.killed again, expecting only a gate that KVGATE_FIXTURE_RED turns red
  red["id"] = "FIX.redgate";
  red["expect_killed_by"] = json::array({"FIX.never"});
  cat["mutants"].push_back(red);
  write_text(w / "catalog.json", cat.dump(2));
  auto args = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = fixture_args(extra);
    a[3] = (w / "catalog.json").string();
    return a;
  };
  {
    INFO("no device: skipped with the probe's reason, nothing built, exit 0");
    const Run r = mutate(w, args({"--only-requires", "cuda-device"}), {{"KVGATE_MUTATE_CUDA_DEVICE", "0"}});
    INFO(r.log);
    CHECK(r.rc == 0);
    const json& m = mutant(r.outcomes, "FIX.device");
    CHECK(m["status"] == "skipped");
    CHECK(m["reason"].get<std::string>().find("requires a CUDA device: none found (KVGATE_MUTATE_CUDA_DEVICE=0)") !=
          std::string::npos);
    CHECK(r.outcomes["summary"]["skipped"] == 1);
    CHECK(r.log.find("nothing built") != std::string::npos);
    CHECK_FALSE(fs::exists(w / "tree" / "build" / "build.ninja"));
  }
  {
    INFO("a device but no CUDA build (the fixture has no gate_cuda): skipped, naming the build");
    const Run r = mutate(w, args({"--only-requires", "cuda-device"}), {{"KVGATE_MUTATE_CUDA_DEVICE", "1"}});
    INFO(r.log);
    CHECK(r.rc == 0);
    CHECK(mutant(r.outcomes, "FIX.device")["reason"].get<std::string>().find("requires a CUDA build") !=
          std::string::npos);
    CHECK(r.log.find("-DKVGATE_CUDA=ON") != std::string::npos);
  }
  {
    INFO("--expected-gates-only --restore-objects: only the named gates run; the objects come back");
    // (The rebuild path: --no-schemata.)
    const Run r = mutate(w, args({"--only", "FIX.killed", "--expected-gates-only", "--restore-objects", "--no-schemata"}));
    INFO(r.log);
    REQUIRE(r.rc == 0);
    const json& k = mutant(r.outcomes, "FIX.killed");
    CHECK(k["status"] == "killed");
    CHECK(k["killed_by"] == json::array({"FIX.add"}));
    CHECK_FALSE(k["gates"].contains("FIX.mul"));  // not a gate of this run
    CHECK(r.outcomes["full_run"] == false);
    CHECK(r.log.find("gate_misc has none of the focused gates") != std::string::npos);
    CHECK(read_text(w / "tree" / "src" / "lib.cpp") ==
          read_text(kSource / "mutations" / "tests" / "fixture" / "src" / "lib.cpp"));
    // The next run's baseline relinks but does not recompile lib.cpp, and is green: the restored
    // object is the unmutated one.
    const Run r2 = mutate(w, args({"--only", "FIX.survived", "--expected-gates-only", "--no-schemata"}));
    INFO(r2.log);
    CHECK(r2.rc == 2);  // FIX.survived survives, as in the plain run
    const std::string blog = read_text(w / "out" / "baseline" / "build.log");
    INFO(blog);
    CHECK(blog.find("lib.cpp.o") == std::string::npos);
    CHECK(blog.find("Linking") != std::string::npos);
  }
  {
    INFO("--skip-red-gates: a red gate is left out, the mutants that need only it are skipped, exit 4");
    const Run r = mutate(w, args({"--only", "FIX.killed,FIX.redgate", "--expected-gates-only", "--skip-red-gates"}),
                         {{"KVGATE_FIXTURE_RED", "1"}});
    INFO(r.log);
    CHECK(r.rc == 4);
    CHECK(mutant(r.outcomes, "FIX.killed")["status"] == "killed");
    const json& m = mutant(r.outcomes, "FIX.redgate");
    CHECK(m["status"] == "skipped");
    CHECK(m["reason"].get<std::string>().find("red in the baseline") != std::string::npos);
    CHECK(r.outcomes["canary_survivors"].empty());
  }
}

TEST_CASE("fixture: Ctrl-C restores the scratch tree and still writes the results", "[fixture]") {
  const fs::path w = kWork / "fixture_interrupt";
  std::vector<std::string> argv{kKvgate, "mutate", "--scratch", (w / "tree").string(), "--out", (w / "out").string()};
  for (const auto& a : fixture_args({"--only", "FIX.killed,FIX.timeout"}, "60")) argv.push_back(a);
  fs::create_directories(w);
  fs::remove(w / "out" / "outcomes.json");
  // Start the driver, wait until it is inside the hanging mutant, then interrupt it.
  std::vector<char*> av;
  for (auto& a : argv) av.push_back(a.data());
  av.push_back(nullptr);
  const std::string log = (w / "driver.log").string();
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (!freopen(log.c_str(), "w", stderr)) _exit(127);
    execv(av[0], av.data());
    _exit(127);
  }
  bool inside = false;
  for (int i = 0; i < 1200 && !inside; ++i) {  // up to 120 s (a cold scratch build)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    inside = read_text(log).find("FIX.timeout (src/lib.cpp) ...") != std::string::npos;
  }
  REQUIRE(inside);
  std::this_thread::sleep_for(std::chrono::seconds(3));  // built, the gates are hanging now
  kill(pid, SIGINT);
  int st = 0;
  waitpid(pid, &st, 0);
  const std::string text = read_text(log);
  INFO(text);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 130);
  CHECK(read_text(w / "tree" / "src" / "lib.cpp") ==
        read_text(kSource / "mutations" / "tests" / "fixture" / "src" / "lib.cpp"));
  const json oc = json::parse(read_text(w / "out" / "outcomes.json"));
  CHECK(oc["interrupted"] == true);
  CHECK(oc["exit_code"] == 130);
  CHECK(mutant(oc, "FIX.killed")["status"] == "killed");
  CHECK(fs::exists(w / "out" / "kill_matrix.md"));
}

namespace {

// Runs a program (not kvgate mutate) with its output in work/<name>.log.
Run run_tool(const fs::path& work, const std::string& name, const std::vector<std::string>& argv,
             const std::vector<std::pair<std::string, std::string>>& env = {}) {
  fs::create_directories(work);
  const ProcResult pr = run_process({argv, {}, env, (work / (name + ".log")).string(), 900});
  Run r;
  r.rc = pr.ended_normally() ? pr.exit_code : -1;
  r.log = read_text(work / (name + ".log"));
  return r;
}

// xmllint --schema mutations/schema/junit.xsd: exit 0 when the file validates.
Run junit_valid(const fs::path& work, const fs::path& file) {
  return run_tool(work, "xmllint", {"xmllint", "--noout", "--schema",
                                    (kSource / "mutations" / "schema" / "junit.xsd").string(), file.string()});
}

// The kill matrix without the times: mutant, category, file, status and one cell per gate.
std::vector<std::string> matrix_without_times(const fs::path& csv) {
  std::vector<std::string> rows;
  std::istringstream in(read_text(csv));
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string c; std::getline(ls, c, ',');) f.push_back(c);
    if (f.size() > 4) f.erase(f.begin() + 4);  // wall_s
    std::string r;
    for (const auto& c : f) r += c + ",";
    rows.push_back(r);
  }
  return rows;
}

}  // namespace

TEST_CASE("fixture: --shard 3 ways + merge (through docs/ci/kvgate-ci.sh) equals the unsharded run; JUnit; "
          "github annotations; merge refusals",
          "[fixture]") {
  const fs::path w = kWork / "fixture_shard";
  fs::remove_all(w / "ci");
  const fs::path fixture = kSource / "mutations" / "tests" / "fixture";
  const std::string only = "FIX.killed,FIX.crash,FIX.survived,FIX.mismatch,FIX.portable_only,FIX.noop";
  REQUIRE(run_tool(w, "xmllint_version", {"xmllint", "--version"}).rc == 0);  // libxml2-utils: scripts/setup.sh --deps

  const Run full = mutate(w, fixture_args({"--only", only, "--junit", (w / "full.xml").string(), "--format", "github"}));
  INFO(full.log);
  REQUIRE(full.rc == 2);  // FIX.survived
  REQUIRE(full.outcomes["mutants"].size() == 6);
  CHECK(full.outcomes["shard"]["count"] == 1);
  CHECK(full.outcomes["shard"]["selection"].size() == 6);
  CHECK(full.outcomes["shard"]["catalog_digest"].get<std::string>().size() == 16);

  // The CI recipes' steps, as the workflows call them: three shards, then the merge.
  const fs::path ci = w / "ci";
  const std::string script = (kSource / "docs" / "ci" / "kvgate-ci.sh").string();
  const std::vector<std::pair<std::string, std::string>> env{{"KVGATE", kKvgate}, {"FORMAT", "github"}};
  const std::vector<std::string> pass{"--source-dir", fixture.string(), "--catalog", (fixture / "catalog.json").string(),
                                      "--min-timeout", "2", "--scratch", (w / "tree").string(), "--only", only};
  std::set<std::string> ran;
  for (int k = 0; k < 3; ++k) {
    std::vector<std::string> argv{script, "shard", std::to_string(k), "3", ci.string()};
    argv.insert(argv.end(), pass.begin(), pass.end());
    const Run r = run_tool(w, "shard" + std::to_string(k), argv, env);
    INFO(r.log);
    CHECK(r.rc == 0);  // survivors do not fail a shard step
    const json oc = json::parse(read_text(ci / ("shard-" + std::to_string(k)) / "outcomes.json"));
    CHECK(oc["shard"]["index"] == k);
    CHECK(oc["shard"]["count"] == 3);
    CHECK(oc["canary"]["status"] == "killed");  // the canary and the baseline run on every shard
    CHECK(oc["mutants"].size() == 2);           // 6 mutants, position mod 3
    for (const auto& m : oc["mutants"]) ran.insert(m["id"].get<std::string>());
    CHECK(junit_valid(w, ci / ("shard-" + std::to_string(k) + ".xml")).rc == 0);
  }
  CHECK(ran.size() == 6);
  const Run merged = run_tool(w, "merge", {script, "merge", ci.string()}, env);
  INFO(merged.log);
  CHECK(merged.rc == full.rc);
  const json mo = json::parse(read_text(ci / "merged" / "outcomes.json"));
  REQUIRE(mo["mutants"].size() == full.outcomes["mutants"].size());
  for (std::size_t i = 0; i < mo["mutants"].size(); ++i) {
    const json &a = full.outcomes["mutants"][i], &b = mo["mutants"][i];
    INFO(a["id"]);
    CHECK(a["id"] == b["id"]);  // the unsharded order
    CHECK(a["status"] == b["status"]);
    CHECK(a["killed_by"] == b["killed_by"]);
    CHECK(a["killed_in"] == b["killed_in"]);
    CHECK(a["expected_not_killing"] == b["expected_not_killing"]);
  }
  CHECK(mo["exit_code"] == full.outcomes["exit_code"]);
  CHECK(mo["check_failures"] == full.outcomes["check_failures"]);
  CHECK(mo["shard"]["merged_shards"] == 3);
  CHECK(matrix_without_times(ci / "merged" / "kill_matrix.csv") == matrix_without_times(w / "out" / "kill_matrix.csv"));
  check_report(ci / "merged");
  // The merged logs point into the shard folders.
  const std::string log0 = mutant(mo, "FIX.killed")["gates"]["FIX.add"]["log"];
  CHECK(log0.rfind("../shard-0/", 0) == 0);
  CHECK(fs::exists(ci / "merged" / log0));

  // JUnit: the files validate; a survivor is a failure naming its expected killers, a kill names its gates.
  for (const fs::path& f : {w / "full.xml", ci / "mutants.xml"}) {
    INFO(f.string());
    CHECK(junit_valid(w, f).rc == 0);
    const std::string x = read_text(f);
    CHECK(x.find("tests=\"7\" failures=\"1\" errors=\"1\"") != std::string::npos);  // canary + 6; survived; noop
    CHECK(x.find("<testcase name=\"FIX.survived\" classname=\"src/lib.cpp\"") != std::string::npos);
    CHECK(x.find("<failure message=\"survived: every gate stayed green\" type=\"survived\">") != std::string::npos);
    CHECK(x.find("expected killers: FIX.describe") != std::string::npos);
    CHECK(x.find("killed by: FIX.mul") != std::string::npos);
  }
  {
    // Anti-vacuity: the schema refuses a testcase without its classname.
    std::string x = read_text(w / "full.xml");
    x.replace(x.find(" classname=\"src/lib.cpp\""), std::string(" classname=\"src/lib.cpp\"").size(), "");
    write_text(w / "broken.xml", x);
    CHECK(junit_valid(w, w / "broken.xml").rc != 0);
  }
  // kvgate gate --junit on the fixture's gate programs, green and red.
  for (const bool red : {false, true}) {
    std::vector<std::pair<std::string, std::string>> genv = env;
    if (red) genv.emplace_back("KVGATE_FIXTURE_RED", "1");
    const fs::path out = w / (red ? "gates_red" : "gates_green");
    const Run g = run_tool(w, "gates", {script, "gates", out.string(), "--gates-dir", (w / "tree" / "build" / "gates").string()}, genv);
    INFO(g.log);
    CHECK(g.rc == (red ? 1 : 0));
    CHECK(junit_valid(w, out / "gates.xml").rc == 0);
    const std::string x = read_text(out / "gates.xml");
    CHECK(x.find("classname=\"gate_math\"") != std::string::npos);
    CHECK((x.find("<failure") != std::string::npos) == red);
    if (red) CHECK(x.find("gate FIX.never (gate_misc) failed") != std::string::npos);
  }

  // --format github: one ::error at the survivor's anchor line.
  {
    const std::string src = read_text(fixture / "src" / "lib.cpp");
    const auto line = 1 + std::count(src.begin(), src.begin() + static_cast<long>(src.find("\"value \"")), '\n');
    const std::string want = "::error file=src/lib.cpp,line=" + std::to_string(line) + ",title=mutant FIX.survived survived::";
    CHECK(full.log.find(want) != std::string::npos);
    CHECK(merged.log.find(want) != std::string::npos);
    CHECK(full.log.find("::error file=src/lib.cpp,line=", full.log.find(want) + 1) == std::string::npos);  // only the survivor
  }

  // Refusals: each names the file, the field and the fix, and writes nothing.
  auto refused = [&](const std::vector<fs::path>& dirs, const std::string& needle) {
    const fs::path out = w / "refused";
    fs::remove_all(out);
    std::vector<std::string> argv{kKvgate, "mutate", "merge"};
    for (const auto& d : dirs) argv.push_back(d.string());
    argv.insert(argv.end(), {"--out", out.string(), "--junit", (w / "refused.xml").string()});
    fs::remove(w / "refused.xml");
    const Run r = run_tool(w, "refused", argv);
    INFO(r.log);
    CHECK(r.rc == 1);
    CHECK(r.log.find(needle) != std::string::npos);
    CHECK(r.log.find("fix: ") != std::string::npos);
    CHECK(r.log.find("nothing written") != std::string::npos);
    CHECK(!fs::exists(out));
    CHECK(!fs::exists(w / "refused.xml"));
  };
  const fs::path s0 = ci / "shard-0", s1 = ci / "shard-1", s2 = ci / "shard-2";
  refused({s0, s1}, "shard 2/3 is missing");
  refused({s0, s1, s1, s2}, "field /shard/index is 1, and so is");
  auto tampered = [&](const std::string& name, const std::function<void(json&)>& edit) {
    const fs::path d = w / name;
    fs::remove_all(d);
    fs::create_directories(d);
    json oc = json::parse(read_text(s2 / "outcomes.json"));
    edit(oc);
    write_text(d / "outcomes.json", oc.dump(2));
    return d;
  };
  refused({s0, s1, tampered("other_catalog", [](json& j) { j["shard"]["catalog_digest"] = "0123456789abcdef"; })},
          "field /shard/catalog_digest is 0123456789abcdef but");
  refused({s0, s1, tampered("other_commit", [](json& j) { j["shard"]["commit"] = "deadbeef"; })},
          "field /shard/commit is 'deadbeef' but");
  refused({s0, s1, tampered("lost_mutant", [](json& j) { j["mutants"].erase(0); })}, "has no outcome for FIX.survived");
  {
    const fs::path d = w / "corrupt";
    fs::create_directories(d);
    const std::string text = read_text(s2 / "outcomes.json");
    write_text(d / "outcomes.json", text.substr(0, text.size() / 2));
    refused({s0, s1, d}, (d / "outcomes.json").string() + ": field / is not JSON");
  }
  {
    const Run r = mutate(w, fixture_args({"--only", only, "--shard", "3/3"}));
    CHECK(r.rc == 1);
    CHECK(r.log.find("--shard '3/3': the shard index k is out of range") != std::string::npos);
  }

  // Every recipe in docs/ci/ runs these steps through the script.
  for (const char* recipe : {"github-actions.yml", "gitlab-ci.yml", "slurm-mutate.sh"}) {
    INFO(recipe);
    const std::string text = read_text(kSource / "docs" / "ci" / recipe);
    CHECK(text.find("docs/ci/kvgate-ci.sh shard ") != std::string::npos);
    CHECK(text.find("docs/ci/kvgate-ci.sh merge ") != std::string::npos);
  }
  for (const char* recipe : {"github-actions.yml", "gitlab-ci.yml"})
    CHECK(read_text(kSource / "docs" / "ci" / recipe).find("docs/ci/kvgate-ci.sh gates ") != std::string::npos);
}

namespace {
const json& proof_of(const json& proof, const std::string& gate) { return entry(proof.at("proven"), "gate", gate); }
std::set<std::string> unproven_of(const json& proof) {
  std::set<std::string> s;
  for (const auto& u : proof.at("unproven")) s.insert(u.at("gate").get<std::string>());
  return s;
}
}  // namespace

TEST_CASE("fixture: --prove-gates proves each gate by any mutant, names the gates none kills, joins catalogs, seeds",
          "[fixture]") {
  const fs::path w = kWork / "fixture_prove";
  fs::create_directories(w);
  // Catalog 1: the fixture's, with FIX.killed naming FIX.mul (so FIX.add is proven only by a mutant
  // that names another gate) and FIX.portable_only moved to catalog 2, which repeats the canary.
  json c1 = json::parse(read_text(kSource / "mutations" / "tests" / "fixture" / "catalog.json"));
  json c2 = c1;
  json& ms = c1["mutants"];
  for (auto& m : ms)
    if (m["id"] == "FIX.killed") m["expect_killed_by"] = json::array({"FIX.mul"});
  json portable;
  for (const auto& m : ms)
    if (m["id"] == "FIX.portable_only") portable = m;
  REQUIRE(portable.is_object());
  ms.erase(std::remove_if(ms.begin(), ms.end(), [](const json& m) { return m["id"] == "FIX.portable_only"; }), ms.end());
  json stale = portable;  // an anchor the tree no longer has: left out by name, the proof goes on
  stale["id"] = "FIX.stale";
  stale["anchor"] = "int no_such_function(int x) { return x; }";
  c2["mutants"] = json::array({c1["mutants"][0], portable, stale});
  REQUIRE(c2["mutants"][0]["category"] == "canary");
  write_text(w / "c1.json", c1.dump(2));
  write_text(w / "c2.json", c2.dump(2));
  auto args = [&](const std::vector<std::string>& extra) { return fixture_args_for(w / "c1.json", extra); };
  {
    INFO("the whole proof, switches then rebuilds: a gate no mutant kills is a finding (exit 7)");
    const Run r = mutate(w / "all", args({"--prove-gates", "--prove-rebuild", "--catalog", (w / "c2.json").string()}));
    INFO(r.log);
    CHECK(r.rc == 7);
    const json proof = json::parse(read_text(w / "all" / "out" / "proof.json"));
    CHECK(proof["summary"]["gates"] == 7);
    CHECK(proof["summary"]["proven"] == 4);
    CHECK(proof["catalogs"].size() == 2);
    // FIX.add: killed by FIX.killed, whose record names FIX.mul only.
    CHECK(proof_of(proof, "FIX.add")["mutant"] == "FIX.killed");
    CHECK(proof_of(proof, "FIX.add")["path"] == "schema");
    CHECK(proof_of(proof, "FIX.add")["program"] == "gate_math");
    // A crash inside the gate's own test case proves it; the gates after the crash were run alone
    // and stayed green, so FIX.crash proves nothing else (FIX.twice is FIX.mismatch's).
    CHECK(proof_of(proof, "FIX.mul")["mutant"] == "FIX.crash");
    CHECK(proof_of(proof, "FIX.mul")["status"] == "crashed");
    // FIX.mismatch shares its line with FIX.unviable, whose switch cannot compile: the error's
    // column moves FIX.unviable alone, so FIX.mismatch stays a switch.
    CHECK(proof_of(proof, "FIX.twice")["mutant"] == "FIX.mismatch");
    CHECK(proof_of(proof, "FIX.twice")["path"] == "schema");
    // From the second catalog, killed only in the ctest variant.
    CHECK(proof_of(proof, "FIX.triple")["mutant"] == "FIX.portable_only");
    CHECK(proof_of(proof, "FIX.triple")["variants"] == json::array({"portable"}));
    CHECK(unproven_of(proof) == std::set<std::string>{"FIX.describe", "FIX.identity", "FIX.never"});
    bool identity_timed_out = false;
    for (const auto& u : proof["unproven"]) {
      CHECK(!u["tried"].empty());  // every unproven gate says which mutants were tried on it
      if (u["gate"] == "FIX.identity")
        for (const auto& t : u["tried"]) identity_timed_out = identity_timed_out || (t["mutant"] == "FIX.timeout" && t["status"] == "timeout");
    }
    CHECK(identity_timed_out);  // a timeout is not a proof
    REQUIRE(proof["skipped_mutants"].size() == 1);
    CHECK(proof["skipped_mutants"][0].get<std::string>().rfind("FIX.stale: stale anchor", 0) == 0);
    const std::string md = read_text(w / "all" / "out" / "proof.md");
    CHECK(md.find("- **FIX.never** (gate_misc)") != std::string::npos);
    CHECK(md.find("| FIX.add | gate_math | FIX.killed | schema |") != std::string::npos);
  }
  {
    INFO("seeded from an earlier run's outcomes.json; without --prove-rebuild the patched mutants are listed, not run");
    const Run r0 = mutate(w / "seed", args({"--only", "FIX.crash"}));
    INFO(r0.log);
    REQUIRE(r0.rc == 0);
    const Run r = mutate(w / "seeded", args({"--prove-gates", "--prove-seed", (w / "seed" / "out").string()}));
    INFO(r.log);
    CHECK(r.rc == 7);
    const json proof = json::parse(read_text(w / "seeded" / "out" / "proof.json"));
    CHECK(proof["summary"]["seeded"] == 1);
    CHECK(proof_of(proof, "FIX.mul")["path"] == "seed");
    CHECK(proof_of(proof, "FIX.mul")["mutant"] == "FIX.crash");
    CHECK(proof_of(proof, "FIX.add")["mutant"] == "FIX.killed");
    CHECK(proof_of(proof, "FIX.twice")["mutant"] == "FIX.mismatch");
    CHECK(unproven_of(proof).count("FIX.identity") == 1);  // only a patched mutant (which times out) reaches it
    const auto& nt = proof["rebuild_not_tried"];
    CHECK(std::find(nt.begin(), nt.end(), "FIX.timeout") != nt.end());
    // Resumed from the whole proof: its 4 proven gates are not run again.
    const Run again = mutate(w / "resumed", args({"--prove-gates", "--prove-seed", (w / "all" / "out" / "proof.json").string()}));
    INFO(again.log);
    CHECK(again.rc == 7);
    const json p2 = json::parse(read_text(w / "resumed" / "out" / "proof.json"));
    CHECK(p2["summary"]["seeded"] == 4);
    CHECK(proof_of(p2, "FIX.twice")["mutant"] == "FIX.mismatch");
    CHECK(unproven_of(p2) == std::set<std::string>{"FIX.describe", "FIX.identity", "FIX.never"});
  }
  {
    INFO("refusals: two catalogs without --prove-gates; a mutant ID in both catalogs");
    const Run r = mutate(w / "refuse", args({"--catalog", (w / "c2.json").string()}));
    CHECK(r.rc == 1);
    CHECK(r.log.find("only --prove-gates joins catalogs") != std::string::npos);
    json dup = c2;
    dup["mutants"].push_back(c1["mutants"][1]);
    write_text(w / "dup.json", dup.dump(2));
    const Run d = mutate(w / "refuse", args({"--prove-gates", "--catalog", (w / "dup.json").string()}));
    CHECK(d.rc == 5);
    CHECK(d.log.find("mutant FIX.killed is in " + (w / "c1.json").string() + " and in " + (w / "dup.json").string()) !=
          std::string::npos);
  }
}

TEST_CASE("real tree: three fast mutants against the fast gates, Stryker report valid", "[real]") {
  const fs::path w = kWork / "real";
  const Run r = mutate(w, {"--source-dir", kSource.string(), "--only",
                           "ACCT.budget_counts_k_twice,ACCT.guard_check_front_only,STORE.hadamard_not_normalized",
                           "--gate-targets", "gate_storage,gate_invariance", "--jobs", "2"});
  INFO(r.log);
  REQUIRE(r.rc == 0);
  CHECK(r.outcomes["canary_survivors"].empty());
  CHECK(r.outcomes["summary"]["killed"] == 3);
  CHECK(mutant(r.outcomes, "ACCT.budget_counts_k_twice")["killed_by"].dump().find("STO.budget") != std::string::npos);
  CHECK(mutant(r.outcomes, "ACCT.guard_check_front_only")["killed_by"].dump().find("STO.guards") != std::string::npos);
  CHECK(mutant(r.outcomes, "STORE.hadamard_not_normalized")["killed_by"].dump().find("INV.rotation") !=
        std::string::npos);
  check_report(w / "out");
}
