#include "kvgate/signoff_proof.hpp"

#include <algorithm>

namespace kvgate::signoff {

namespace {
std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
}  // namespace

ProofSelection select_proof_mutants(const nlohmann::json& catalog,
                                    const std::map<std::string, std::set<std::string>>& gate_ids,
                                    const std::string& device, bool cuda_build) {
  ProofSelection s;
  if (!catalog.is_object() || !catalog.contains("mutants") || !catalog["mutants"].is_array()) return s;
  for (const auto& m : catalog["mutants"]) {
    if (!m.is_object() || m.value("category", "") == "canary") continue;
    bool needs_device = false, needs_cuda_build = false;
    for (const auto& r : m.value("requires", nlohmann::json::array())) {
      needs_device = needs_device || r == "cuda-device";
      needs_cuda_build = needs_cuda_build || r == "cuda";
    }
    const std::string id = m.value("id", "");
    for (const auto& [f, ids] : gate_ids) {
      bool mine = false;
      for (const auto& g : m.value("expect_killed_by", nlohmann::json::array()))
        mine = mine || (g.is_string() && ids.count(g.get<std::string>()) > 0);
      if (!mine) continue;
      if (needs_device && device != "cuda") {
        ++s.gpu_only_left_out[f];
        continue;
      }
      if (needs_cuda_build && !cuda_build) {
        ++s.cuda_build_left_out[f];
        continue;
      }
      s.mutants_of[f].push_back(id);
      s.all_ids.insert(id);
    }
  }
  return s;
}

std::string proof_mutate_command(const ProofCommand& c, const std::set<std::string>& ids) {
  std::string list;
  for (const auto& id : ids) list += (list.empty() ? "" : ",") + id;
  return quote(c.self) + " mutate --only " + quote(list) + " --out " + quote(c.out) + " -j " +
         std::to_string(std::max(1, c.jobs)) + (c.scratch.empty() ? "" : " --scratch " + quote(c.scratch)) +
         (c.cuda_build ? " --cmake-arg -DKVGATE_CUDA=ON" : "") + (c.full_matrix ? "" : " --bail");
}

}  // namespace kvgate::signoff
