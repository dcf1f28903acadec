// Sharding a mutation run over machines (`kvgate mutate --shard k/n`) and joining the outputs
// (`kvgate mutate merge DIR... --out DIR`): docs/MUTATIONS.md "Sharding".
#pragma once
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "kvgate_mutations/catalog.hpp"

namespace kvgate::mutate {

struct ShardSpec {
  int index = 0, count = 1;
};
// "k/n" with 0 <= k < n; nullopt and `error` (what is wrong and the fix) otherwise.
std::optional<ShardSpec> parse_shard(const std::string& text, std::string* error);

// The partition: the mutant at position i of the selection (catalog order, or --only's order)
// belongs to shard i mod n. It depends only on the selection, so every machine computes the same.
std::vector<const Mutant*> shard_of(const std::vector<const Mutant*>& selection, ShardSpec s);

// FNV-1a 64 of the file's bytes as 16 hex digits (throws std::runtime_error naming the file).
std::string file_digest(const std::filesystem::path& file);

struct SourceCommit {
  std::string commit;  // `git rev-parse HEAD`, "" when the tree is not a git work tree
  bool dirty = false;  // `git status --porcelain` lists a change
};
SourceCommit source_commit(const std::filesystem::path& dir);

struct MergeOptions {
  std::vector<std::filesystem::path> inputs;  // shard output folders (or their outcomes.json)
  std::filesystem::path out_dir;
  std::filesystem::path catalog;     // default: the catalog the shards recorded
  std::filesystem::path source_dir;  // default: the source tree the shards recorded
  std::filesystem::path web_dist;
  std::filesystem::path junit;       // --junit FILE
  std::string format = "text";       // --format github
};

// Checks every shard (same catalog digest, commit, selection and shard count; each index once,
// none missing; each mutant of the selection exactly once; no interrupted or unfinished shard)
// before writing anything, then writes one outcomes.json, kill matrix, Stryker report (and JUnit).
// A refusal names the file, the field and the fix and writes nothing. Returns the merged run's
// exit code (as `kvgate mutate` would have), or 1 on a refusal.
int merge_outcomes(const MergeOptions& o, std::ostream& log);

}  // namespace kvgate::mutate
