// `kvgate bench --shard k/n` and `kvgate bench merge` (docs/ARCHITECTURE.md, bench/matrix): the
// formats asked for are split by position mod n; f32, the baseline every row is compared with,
// runs on every shard. The merge puts the rows back in the unsharded order.
#include <algorithm>
#include <deque>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "kvgate/matrix.hpp"

namespace kvgate::matrix {

namespace {

std::runtime_error refusal(const std::string& file, const std::string& field, const std::string& problem,
                           const std::string& fix) {
  return std::runtime_error(file + ": field " + field + " " + problem + "; fix: " + fix);
}

// Consecutive rows (or per-format entries) of one device grouped by their "format".
std::deque<nlohmann::json> groups_of(const nlohmann::json& rows, const nlohmann::json& device) {
  std::deque<nlohmann::json> out;
  for (const auto& row : rows) {
    if (!device.is_null() && row.value("device", nlohmann::json()) != device) continue;
    if (out.empty() || out.back().back().value("format", "") != row.value("format", ""))
      out.push_back(nlohmann::json::array());
    out.back().push_back(row);
  }
  return out;
}

// The unsharded order from each shard's groups: f32 from shard 0, then format p from shard (p-1) mod n.
nlohmann::json interleave(std::vector<std::deque<nlohmann::json>> groups, std::size_t formats) {
  nlohmann::json out = nlohmann::json::array();
  const std::size_t n = groups.size();
  for (std::size_t s = 0; s < n; ++s)
    if (!groups[s].empty() && s > 0) groups[s].pop_front();  // every shard's own f32 group: shard 0's is kept
  for (std::size_t p = 0; p < formats; ++p) {
    auto& g = groups[p == 0 ? 0 : (p - 1) % n];
    if (g.empty()) continue;  // a format without rows on this device (e.g. no CUDA timing rows)
    for (const auto& x : g.front()) out.push_back(x);
    g.pop_front();
  }
  return out;
}

}  // namespace

std::vector<std::string> shard_formats(const std::vector<std::string>& formats, int index, int count) {
  std::vector<std::string> asked;  // as resolve_formats sees them: f32 first, no repeats
  for (const auto& f : formats)
    if (f != "f32" && std::find(asked.begin(), asked.end(), f) == asked.end()) asked.push_back(f);
  std::vector<std::string> mine;
  for (std::size_t i = 0; i < asked.size(); ++i)
    if (static_cast<int>(i % static_cast<std::size_t>(count)) == index) mine.push_back(asked[i]);
  return mine;
}

nlohmann::json merge_matrices(const std::vector<std::pair<std::string, nlohmann::json>>& shards) {
  if (shards.empty()) throw std::runtime_error("no shard folder given; fix: pass every --shard k/n output folder");
  // References, not structured bindings: clang 14 (the sanitizer build) cannot capture a binding.
  const std::string& file0 = shards.front().first;
  const nlohmann::json& m0 = shards.front().second;
  std::map<int, std::size_t> by_index;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::string& file = shards[i].first;
    const nlohmann::json& m = shards[i].second;
    if (!m.is_object() || m.value("kind", "") != "matrix")
      throw refusal(file, "/kind", "is not \"matrix\": not a kvgate bench matrix.json", "pass the output folders of kvgate bench --shard k/n");
    if (!m.contains("shard") || !m["shard"].is_object() || !m["shard"].value("index", nlohmann::json()).is_number_integer() ||
        !m["shard"].value("count", nlohmann::json()).is_number_integer() || !m["shard"].value("formats", nlohmann::json()).is_array())
      throw refusal(file, "/shard", "is missing or incomplete: this bench did not run with --shard k/n", "rerun it with kvgate bench --shard k/n");
    if (m["shard"].value("merged_shards", 0) > 0)
      throw refusal(file, "/shard/merged_shards", "is set: already a merged matrix", "merge the shard folders themselves");
    auto same = [&](const std::string& ptr, const char* fix) {
      const nlohmann::json::json_pointer jp(ptr);
      const nlohmann::json a = m.contains(jp) ? m[jp] : nlohmann::json(), b = m0.contains(jp) ? m0[jp] : nlohmann::json();
      if (a != b)
        throw refusal(file, ptr, "is " + a.dump() + " but " + file0 + " has " + b.dump() + ": not shards of one run", fix);
    };
    same("/schema", "run every shard with the same kvgate");
    same("/shard/count", "pass the shards of one run (the same n in --shard k/n)");
    same("/shard/formats", "run every shard with the same --formats");
    same("/provenance/git_commit", "run every shard on the same commit");
    same("/provenance/git_dirty", "run every shard on the same (committed) tree");
    same("/provenance/model", "run every shard on the same model");
    for (const char* key : {"lengths", "windows", "devices", "decode_steps", "repeats", "budget_bytes", "threads", "timing",
                            "quick", "block_size", "corpus", "probes", "probe_subject"})
      same(std::string("/config/") + key, "run every shard with the same options (all but --shard)");
    const int k = m["shard"]["index"], n = m["shard"]["count"];
    if (k < 0 || k >= n)
      throw refusal(file, "/shard/index", "is " + std::to_string(k) + ", outside 0.." + std::to_string(n - 1), "rerun that shard with a valid --shard k/n");
    if (by_index.count(k))
      throw refusal(file, "/shard/index", "is " + std::to_string(k) + ", and so is " + shards[by_index[k]].first + ": the shard is doubled",
                    "pass each shard's folder once");
    by_index[k] = i;
  }
  const int n = m0["shard"]["count"];
  for (int k = 0; k < n; ++k)
    if (!by_index.count(k))
      throw std::runtime_error("shard " + std::to_string(k) + "/" + std::to_string(n) +
                               " is missing; fix: run kvgate bench --shard " + std::to_string(k) + "/" + std::to_string(n) +
                               " and pass its output folder");
  const std::vector<std::string> all = m0["shard"]["formats"].get<std::vector<std::string>>();
  for (const auto& [k, i] : by_index) {
    std::vector<std::string> want{"f32"};
    for (const auto& f : shard_formats(all, k, n)) want.push_back(f);
    if (shards[i].second["config"]["formats"] != nlohmann::json(want))
      throw refusal(shards[i].first, "/config/formats",
                    "is " + shards[i].second["config"]["formats"].dump() + ", not shard " + std::to_string(k) + "'s part " +
                        nlohmann::json(want).dump(),
                    "rerun that shard with this kvgate's --shard partition");
  }
  std::vector<const nlohmann::json*> ordered;
  for (const auto& [k, i] : by_index) ordered.push_back(&shards[i].second);
  const std::size_t nformats = 1 + shard_formats(all, 0, 1).size();
  nlohmann::json merged = m0;
  merged["config"]["formats"] = nlohmann::json::array({"f32"});
  for (const auto& f : shard_formats(all, 0, 1)) merged["config"]["formats"].push_back(f);
  {
    std::vector<std::deque<nlohmann::json>> g;
    for (const auto* m : ordered) g.push_back(groups_of((*m)["formats"], nullptr));
    merged["formats"] = interleave(g, nformats);
  }
  merged["rows"] = nlohmann::json::array();
  for (const auto& device : m0["config"]["devices"]) {
    std::vector<std::deque<nlohmann::json>> g;
    for (const auto* m : ordered) g.push_back(groups_of((*m)["rows"], device));
    for (const auto& row : interleave(g, nformats)) merged["rows"].push_back(row);
  }
  nlohmann::json notes = nlohmann::json::array();
  for (const auto* m : ordered)
    for (const auto& note : (*m)["notes"])
      if (std::find(notes.begin(), notes.end(), note) == notes.end()) notes.push_back(note);
  notes.push_back("merged from " + std::to_string(n) + " shards (kvgate bench --shard k/n): each shard compared its rows with its own f32 rows; the f32 rows shown are shard 0's");
  merged["notes"] = notes;
  merged["shard"] = {{"index", 0}, {"count", n}, {"formats", all}, {"merged_shards", n}};
  return merged;
}

}  // namespace kvgate::matrix
