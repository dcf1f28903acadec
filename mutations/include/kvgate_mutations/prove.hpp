// `kvgate mutate --prove-gates`: every gate ID shown able to go red by some mutant, gate by gate
// (docs/MUTATIONS.md "Proving every gate"). A full run answers "every gate killed one" only by
// running every reached gate program for every mutant; the proof instead keeps, per gate program,
// the gate IDs not shown yet, and runs each candidate mutant once on exactly those (a Catch2
// filter), preferring mutants whose expected gates resemble the unproven ones. A gate leaves the
// set when its own test case fails (or crashes) under a mutant.
//
// This module is the bookkeeping: the order of the candidates, what counts as a proof, the seed
// from an earlier outcomes.json, and the record (proof.json, proof.md). The driver supplies how a
// mutant runs on a set of gates (driver.cpp: the schemata switch, or patch-and-rebuild).
#pragma once
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "kvgate_mutations/catalog.hpp"
#include "kvgate_mutations/driver.hpp"

namespace kvgate::mutate {

struct ProofGate {
  std::string id;
  std::string program;  // the gate executable whose test cases carry the ID
  double seconds = 0;   // its test cases' baseline time (the cost of running it once)
};

struct ProofCandidate {
  const Mutant* mutant = nullptr;
  std::set<std::string> programs;  // the gate programs that reach it (coverage, or compile its file)
  bool rebuild = false;            // patch-and-rebuild path (slow): tried only after the switches
};

// A gate shown able to go red: by which mutant, in which program and variants.
struct GateProof {
  std::string mutant;
  std::string program;
  std::string path;    // schema | rebuild | seed
  std::string status;  // failed | crashed
  std::vector<std::string> variants;
  std::string detail, log;
  std::string seed_file;  // path == "seed": the outcomes.json it came from
};

// One mutant run on a gate that stayed unproven: what the gate did ("passed", "timeout", ...).
struct GateTry {
  std::string mutant, status, detail;
};

struct ProofRecord {
  std::vector<ProofGate> gates;                          // every gate of the run, baseline order
  std::map<std::string, std::string> not_provable;       // gate -> why (skipped in the baseline)
  std::map<std::string, GateProof> proven;               // gate -> its proof
  std::map<std::string, std::vector<GateTry>> tried;     // unproven gate -> every mutant tried on it
  std::vector<std::string> unproven;                     // baseline order
  std::map<std::string, int> candidates_left;            // unproven gate -> candidates not tried (interrupted)
  std::vector<std::string> rebuild_not_tried;            // rebuild-path candidates left out (no --prove-rebuild)
  std::vector<std::string> skipped_mutants;              // "<id>: why" (stale anchor, needs CUDA, ...)
  std::vector<std::string> seeds;                        // "<file> (commit X)": the outcomes.json read
  std::vector<std::string> catalogs;                     // the catalogs joined for the run
  std::string commit, started_at;
  bool dirty = false, interrupted = false;
  // --prove-deadline: the deadline passed, so no further run was started (the record is complete
  // up to there; the open gates with candidates left are no finding yet).
  bool deadline_reached = false;
  double deadline_s = 0;  // the deadline asked for (0: none), seconds after the driver started
  // false while the loop still runs: a record written after a run (a checkpoint), which stays on
  // disk as the last word when the process is killed (a wall limit's SIGKILL).
  bool finished = false;
  int runs = 0;  // mutant runs (one run = the reached programs with the current filter)
  double wall_s = 0, baseline_build_s = 0, baseline_test_s = 0;
};

// What counts as a kill of the gate itself: its own test case failed, or the program crashed while
// running it (or while running it alone). A process that failed with every test case green (a
// crash after the last case, in a static destructor) names no gate: not a proof, rerun alone. A
// gate process killed by Ctrl-C proves nothing either.
bool proves_gate(const GateOutcome& g);
bool crash_outside_cases(const GateOutcome& g);

// How much a mutant resembles a gate it might prove: 100 when it names the gate; else 10 per
// leading ID component it shares with a gate it names (the family "INV", "MOD.gguf"), 15 when
// their last components match (the format sibling: INV.int8 beside ENV.int8), 5 when a mutant
// naming the gate patches the same file; 20 more when the gate is of the CUDA backend (an ID
// component "cuda") and the mutant is CUDA code (a file under runtime/cuda/, or it needs a CUDA
// build). 0: no resemblance (still a candidate, tried last).
int affinity(const Mutant& m, const std::string& gate, const std::map<std::string, std::set<std::string>>& files_naming);

// Runs `m` on exactly `gates` (all of them in programs that reach it); the outcome per gate ID.
using ProofRunner = std::function<std::map<std::string, GateOutcome>(const ProofCandidate&, const std::vector<std::string>&)>;

// The proof loop: while some candidate reaches an unproven gate, run the best one (highest summed
// affinity over the unproven gates it reaches per second those gates took in the baseline, a rebuild
// candidate's seconds including ProofLoop::rebuild_s; catalog order on ties) on every unproven gate
// of the programs it reaches; record the gates it proves. Each candidate runs at most once. The
// rebuild candidates run only when `rebuild` is set.
// `stop()` true ends the loop early (Ctrl-C): the record says interrupted.
void prove_gates(ProofRecord& rec, const std::vector<ProofCandidate>& candidates, const ProofRunner& run,
                 bool rebuild, const std::function<bool()>& stop, std::ostream& log);

// The same loop with its controls:
//  - `past_deadline()` true (--prove-deadline): start no further run; the run under way (and its
//    runs of single gates after a crash) finishes and counts; the record says deadline_reached.
//  - `checkpoint(rec)` is called once before the first run (the seeded record) and after every
//    finished run, with unproven / candidates_left / rebuild_not_tried up to date and `finished`
//    false: the driver writes proof.json and proof.md there, so a process killed at a wall limit
//    leaves the record of every run it finished (a seed for the next proof).
struct ProofLoop {
  bool rebuild = false;
  // Seconds a patch-and-rebuild candidate adds to its run (its incremental build and the revert):
  // measured medians 4.4 s (CPU, 2 cores, round 15) and 9.3 s (a CUDA kernel header, H200,
  // 16 cores, round 11); 10 is their round upper value.
  double rebuild_s = 10;
  // Mutant IDs picked first, in this order, each while it reaches an open gate it has not tried
  // (--prove-first); then the affinity order.
  std::vector<std::string> first;
  std::function<bool()> stop;
  std::function<bool()> past_deadline;
  std::function<void(const ProofRecord&)> checkpoint;
};
void prove_gates(ProofRecord& rec, const std::vector<ProofCandidate>& candidates, const ProofRunner& run,
                 const ProofLoop& loop, std::ostream& log);

// "running" (a checkpoint), "interrupted", "deadline" or "finished".
std::string proof_state(const ProofRecord& rec);

// Seeds the record from an earlier run's outcomes.json (a file or its folder): every gate of this
// run that one of its mutants killed (its own case failed or crashed) is proven with path "seed".
// A proof.json (a file whose /tool is "kvgate mutate --prove-gates", whatever its name) is an
// earlier proof instead: its proven gates start proven (resume, or join proofs run per program). Throws (the file, the field, the fix) on anything else.
// Returns how many gates it proved.
int seed_proofs(ProofRecord& rec, const std::filesystem::path& outcomes, std::ostream& log);

// The record as JSON and Markdown; write_proof writes proof.json and proof.md into `dir`
// (atomically) and returns the exit code: 0 when every provable gate is proven, kExitExpectation
// when one is left unproven (also when the deadline stopped the loop), kExitInterrupted when
// interrupted.
nlohmann::json proof_json(const ProofRecord& rec);
std::string proof_md(const ProofRecord& rec);
int write_proof(const ProofRecord& rec, const std::filesystem::path& dir);

// Joins the catalogs of one run (--catalog given more than once): mutants in order, the canary
// once (every catalog may carry the same canary record); any other ID twice is a CatalogError
// naming both files.
Catalog join_catalogs(const std::vector<Catalog>& cats);

}  // namespace kvgate::mutate
