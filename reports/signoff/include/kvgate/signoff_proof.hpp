// The sign-off's mutation proof plan: which catalog mutants prove each format (those whose expected
// killers are gates of that format), which are left out and why, and the `kvgate mutate` command
// that runs them. Pure functions: `kvgate signoff` runs the command; gate_signoff checks the plan
// (SGN.proof.*), so the plumbing between the sign-off and the driver is mutation-proven like the
// verdict rules.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvgate::signoff {

struct ProofSelection {
  std::map<std::string, std::vector<std::string>> mutants_of;  // format -> mutant IDs, catalog order
  // A mutant that only a GPU gate can kill (requires: cuda-device) on a sign-off that is not
  // --device cuda: its gates skip there, so it proves nothing about the CPU path.
  std::map<std::string, int> gpu_only_left_out;
  // A mutant of code only a CUDA build compiles (requires: cuda) when this kvgate has no CUDA
  // backend: the driver could not build it, and that code is not in what this build ships.
  std::map<std::string, int> cuda_build_left_out;
  std::set<std::string> all_ids;  // every selected mutant once
};

// `catalog`: the mutation catalog document (its `mutants` array; anything else selects nothing).
// `gate_ids`: format -> the gate IDs of that format. The canary is never selected (the driver runs
// it itself). `device`: "cpu" or "cuda"; `cuda_build`: this kvgate has the CUDA backend.
ProofSelection select_proof_mutants(const nlohmann::json& catalog,
                                    const std::map<std::string, std::set<std::string>>& gate_ids,
                                    const std::string& device, bool cuda_build);

struct ProofCommand {
  std::string self;     // the kvgate executable
  std::string out;      // the outcomes folder
  int jobs = 1;
  std::string scratch;  // --scratch, or "" for the driver's default
  // false (the default): --bail, each mutant stops at its first kill (the verdict needs only killed
  // or not); true (--mutate-full-matrix): every reached gate of every mutant.
  bool full_matrix = false;
  // This kvgate has the CUDA backend: the driver's scratch build is configured with it too
  // (--cmake-arg -DKVGATE_CUDA=ON), so the mutants of code only a CUDA build compiles (requires:
  // cuda, selected above for such a build) are built and run instead of coming back "skipped"
  // when the machine has no device (the driver enables CUDA by itself only when it finds one).
  bool cuda_build = false;
};
// The shell command line (arguments single-quoted) of `kvgate mutate --only IDS` for the proof.
std::string proof_mutate_command(const ProofCommand& c, const std::set<std::string>& ids);

}  // namespace kvgate::signoff
