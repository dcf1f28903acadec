// `kvgate mutate`: baseline -> canary -> for each mutant: apply in the scratch copy, incremental
// rebuild of the gate targets, run every gate, classify, revert -> kill matrix and reports.
// docs/MUTATIONS.md describes the behaviour and the outputs; exit codes are below.
#pragma once
#include <filesystem>
#include <functional>
#include <optional>
#include <iosfwd>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kvgate/shard_record.hpp"
#include "kvgate_mutations/catalog.hpp"

namespace kvgate::mutate {

// Exit codes (docs/MUTATIONS.md). When several apply after a run, the first in this order wins:
// survived, timeout, unviable/noop, expectation mismatch.
enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,          // usage, I/O, configure failure, internal inconsistency
  kExitSurvived = 2,
  kExitTimeout = 3,
  kExitBaselineRed = 4,    // the unmutated gates are not all green, or the canary left a gate green
  kExitStale = 5,          // catalog invalid or an anchor count != occurrences
  kExitUnviable = 6,       // a mutant did not build (unviable) or changed no object (noop)
  kExitExpectation = 7,    // expect_killed_by not honoured, or (full runs) a gate killed no mutant
  kExitInterrupted = 130,  // Ctrl-C: the scratch tree was restored and partial results written
};

struct MutateOptions {
  std::filesystem::path source_dir;   // the tree to copy from (never modified)
  std::filesystem::path catalog;      // default <source>/mutations/catalog.json
  std::filesystem::path schema;       // default <catalog dir>/catalog.schema.json
  std::filesystem::path out_dir = "mutants.out";
  std::filesystem::path scratch_dir;  // default <source>/.scratch/mutants
  std::filesystem::path build_dir;    // default <scratch>/build
  std::filesystem::path web_dist;     // mutation-test-elements.js to copy next to index.html
  std::filesystem::path report_schema;  // Stryker schema; default <source>/mutations/schema/...
  std::vector<std::string> only;      // mutant ids
  std::vector<std::string> gate_targets;  // restrict to these gate executables (smoke tests); empty: all
  std::string since;                  // git revision: only mutants whose file changed since it
  int jobs = 1;                       // ninja -j and concurrent gate processes
  bool list = false;                  // print the catalog with anchor status, run nothing
  // --list: the build whose gate programs are checked to compile each mutant's file (--build-dir
  // wins; cmd_mutate passes the folder of the running kvgate). A run checks its scratch build.
  std::filesystem::path list_build_dir;
  bool canary = true;
  double min_timeout_s = 20;          // per gate process: max(min, factor x baseline) x timeout_scale
  double timeout_factor = 5;
  std::vector<std::string> cmake_args;  // extra configure arguments for the scratch build
  std::vector<std::string> only_requires;  // keep only mutants whose `requires` names one of these
  // Run only the gates a mutant names in expect_killed_by (baseline and canary: the union over the
  // selected mutants), through a Catch2 test spec: a device run of a few GPU mutants instead of
  // every gate per mutant. The run is then partial.
  bool expected_gates_only = false;
  // Copy every object file after the baseline build and put the baseline bytes back when a mutant
  // is reverted (the reverted source keeps its original mtime), so the next build does not
  // recompile what the mutant touched. For machines without ccache (a decode-kernel header
  // recompiles 9 nvcc TUs).
  bool restore_objects = false;
  // With expected_gates_only: a baseline that is red only in some gates does not stop the run;
  // those gates are left out, mutants that expect only them are skipped, and the exit code is 4.
  bool skip_red_gates = false;
  // --shard k/n: run only the selected mutants whose index in the selection is k modulo n (the
  // baseline and the canary run on every shard); `kvgate mutate merge` joins the n outputs.
  int shard_index = 0, shard_count = 1;
  // Mutant schemata (mutations/include/kvgate_mutations/schemata.hpp): the selected mutants that
  // can be a run-time switch are compiled into the scratch build once and turned on per gate run by
  // KVGATE_MUTANT=<id>; the others are patched and rebuilt. false (--no-schemata): every mutant
  // is patched and rebuilt.
  bool schemata = true;
  // Compile-ahead (mutations/include/kvgate_mutations/compile_ahead.hpp): while the driver runs the
  // switches and the earlier rebuilds, a worker compiles the coming patch-and-rebuild mutants'
  // objects into ccache on a copy of the scratch sources, so each rebuild is a cache hit. false
  // (--no-compile-ahead): each rebuild compiles in its turn.
  bool compile_ahead = true;
  // With schemata: each gate program (and environment variant) records in the baseline which
  // switches it evaluates (KVGATE_MUTANT_COVERAGE); a switched mutant then runs only the programs
  // that reach it, the others' gates are "not reached", and a mutant no program reaches is noop
  // without running anything. true (--all-gates): every gate runs for every mutant.
  bool all_gates = false;
  // --bail (Stryker's default, PIT's fail-fast): per mutant the gate programs run quickest first,
  // each stopping at its first failed case (Catch2 --abort), and the first kill stops the others.
  // Each mutant's status is the same as without it; the kill matrix then holds one killing gate
  // per mutant, so the run is partial (no "every gate kills one" check): a catalog's regression
  // run, not its proof. The baseline and the canary run every gate as usual.
  bool bail = false;
  // --prove-gates (docs/MUTATIONS.md "Proving every gate"): instead of the mutant-by-mutant run,
  // show every gate ID able to go red (mutations/include/kvgate_mutations/prove.hpp); proof.json
  // and proof.md in out_dir. The catalogs after the first (--catalog given again) are joined to it.
  bool prove_gates = false;
  std::vector<std::filesystem::path> extra_catalogs;
  std::vector<std::filesystem::path> prove_seeds;  // --prove-seed: earlier outcomes.json files
  bool prove_rebuild = false;  // --prove-rebuild: also the patch-and-rebuild mutants (slow), after the switches
  // --prove-deadline: seconds after the driver started past which the proof starts no further
  // mutant run (the run under way finishes); 0: none. proof.json is written after every run anyway.
  double prove_deadline_s = 0;
  // --prove-first: mutant IDs the proof tries first, in this order (each while it reaches an open
  // gate it has not tried), before the affinity order: a device call spends its few runs on the
  // mutants known to reach many open gates.
  std::vector<std::string> prove_first;
  // --gate-shards PROGRAM=N: run that gate program as N processes side by side, each a Catch2 spec
  // for its share of the gate IDs (a GPU program whose FP64 oracles keep one core busy for minutes).
  std::map<std::string, int> gate_shards;
  std::filesystem::path junit;  // --junit FILE: one JUnit testcase per mutant (written atomically)
  std::string format = "text";  // --format github: ::error annotations for survivors on stdout
};

// --gate-shards: `ids` split into at most n groups of about equal summed seconds (longest first
// onto the least loaded group; IDs of 0 s, not timed yet, dealt round robin). Every ID lands in
// exactly one group; no group is empty; n < 2 or fewer than two IDs: one group.
std::vector<std::vector<std::string>> split_gate_ids(const std::vector<std::string>& ids, std::size_t n,
                                                     const std::function<double(const std::string&)>& seconds);

// A device-only mutant in a run whose device is present: "" when a gate that can kill it really ran
// in the baseline, else why not. `expect`: its expect_killed_by; `ran(id)`: nullopt when id is no gate
// of the run, else whether it ran unskipped (with the skip reason beside). One of the expected gates
// ran; or, for a mutant written apart that names no gate of the run (a placeholder), any GPU gate
// (".cuda." in its ID, the gate programs' naming) ran.
struct BaselineGate {
  bool ran = false;
  std::string skip_reason;
};
std::string device_gate_gap(const std::vector<std::string>& expect,
                            const std::function<std::optional<BaselineGate>(const std::string&)>& lookup,
                            const std::vector<std::string>& all_ran);

// `requires: cuda-device`: is a CUDA device present? Decided before building (the build only gets
// CUDA when a device mutant can run). KVGATE_MUTATE_CUDA_DEVICE=0|1 overrides; CUDA_VISIBLE_DEVICES
// set to "" or "-1" means none; else `nvidia-smi -L` must list a "GPU <n>:" line.
struct DeviceProbe {
  bool present = false;
  std::string how;  // what was found, e.g. "nvidia-smi -L: GPU 0: NVIDIA H200 (UUID: ...)"
};
DeviceProbe probe_cuda_device(const std::filesystem::path& scratch_log);

enum class GateStatus { passed, failed, crashed, timeout, not_run, skipped };
const char* to_string(GateStatus s);
inline bool is_kill(GateStatus s) { return s == GateStatus::failed || s == GateStatus::crashed; }

enum class MutantStatus { killed, survived, timeout, unviable, noop, skipped, interrupted };
const char* to_string(MutantStatus s);

struct GateOutcome {
  GateStatus status = GateStatus::not_run;
  double seconds = 0;
  std::string log;     // path relative to the out dir
  std::string detail;  // e.g. "exit 1", "killed by signal 6"
  std::string variant = "default";  // the environment variant whose run decided the status
  std::vector<std::string> kill_variants;  // every variant in which the gate failed or crashed
};

// An environment the product ships a gate program's code in (e.g. the portable page readers under
// KVGATE_NO_AVX2=1): the driver runs each gate program once per variant it has.
struct Variant {
  std::string name;                                       // "default", "no_avx2", ...
  std::vector<std::pair<std::string, std::string>> env;   // set for the gate process
};

// One gate = one gate ID (first token of its TEST_CASE names) inside one gate executable.
struct Gate {
  std::string id;
  std::string exe;  // target name
  std::vector<std::string> cases;
  double baseline_s = 0;  // sum of its test-case durations
  bool skipped = false;   // reported as skipped in the baseline (e.g. no GPU): cannot be proven
  std::string skip_reason;  // what the skipped case printed ("no CUDA device: ...")
};

struct GateExe {
  std::string target;
  std::filesystem::path path;
  std::vector<std::string> gate_ids;
  double baseline_s = 0;  // wall time of the whole executable (summed over its variants)
  std::vector<std::string> variants{"default"};  // names of the variants it runs in
};

struct MutantOutcome {
  const Mutant* mutant = nullptr;
  MutantStatus status = MutantStatus::survived;
  std::string reason;
  double build_s = 0, test_s = 0, wall_s = 0;
  std::map<std::string, GateOutcome> gates;  // by gate ID
  std::vector<std::string> killed_by;
  std::map<std::string, std::vector<std::string>> killed_in;  // killing gate ID -> variants it failed in
  std::vector<std::string> expected_not_killing;  // expect_killed_by gates that did not kill it
  std::vector<std::string> expected_unknown;      // expect_killed_by IDs that are not gates of this run
  std::string diff_path, build_log;               // relative to the out dir
  std::vector<std::string> changed_objects;
  // How the mutant was run: "schema" (a switch in the scratch build, no rebuild) or "rebuild"
  // (patched and rebuilt); path_reason says why a mutant could not be a switch.
  std::string path = "rebuild";
  std::string path_reason;
  bool compiled_ahead = false;  // rebuild path: its objects were compiled into ccache ahead of its turn
};

struct RunSummary {
  int killed = 0, survived = 0, timeout = 0, unviable = 0, noop = 0, skipped = 0, interrupted = 0;
  int run() const { return killed + survived + timeout + unviable + noop; }
};

struct RunResult {
  std::vector<Variant> variants;  // every variant of the run ("default" first)
  std::vector<GateExe> exes;
  std::vector<Gate> gates;
  double baseline_build_s = 0, baseline_test_s = 0, setup_s = 0, mutation_s = 0;
  bool baseline_green = false;
  std::vector<std::string> baseline_red;  // gate IDs (or "build") that were not green
  bool canary_ran = false;
  std::vector<std::string> canary_survivors;  // gates the canary left green
  MutantOutcome canary;
  std::vector<MutantOutcome> outcomes;  // catalog mutants (not the canary), run order
  RunSummary summary;
  std::vector<std::string> gates_killing_none;  // proven gates that killed no mutant
  bool full_run = true;                         // no --only / --since / --gate-targets / --bail filter
  bool interrupted = false;
  std::vector<std::string> check_failures;
  int exit_code = kExitOk;
  std::string started_at;
  records::ShardRecord shard;  // catalog digest, commit, shard k/n and the whole selection
};

// The run's own checks over r.outcomes (outcome count, expectations, and on a full run the gates
// that killed none), then the exit code; `red`: gates left out as red (--skip-red-gates). Used at
// the end of a run and by `kvgate mutate merge` on the merged outcomes.
void classify_run(RunResult& r, const std::set<std::string>& red);
void count(RunSummary& s, MutantStatus st);  // one outcome into the counts

// Runs `kvgate mutate`; progress and diagnostics go to `log`. Returns the exit code.
int run_mutate(const MutateOptions& opts, std::ostream& log);

}  // namespace kvgate::mutate

namespace kvgate::mutate {
// The source tree this library was configured from (fallback when no git work tree is found).
std::string default_source_dir();
}  // namespace kvgate::mutate
