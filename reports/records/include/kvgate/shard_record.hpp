// What a `kvgate mutate` run was run against and which part of the selection it ran: the catalog's
// digest, the source tree's commit, the shard (k of n) and the whole selection before the partition.
// `kvgate mutate merge` refuses shards whose catalog, commit or selection differ, and a missing or
// doubled shard, by this record (docs/MUTATIONS.md "Sharding").
#pragma once
#include <string>
#include <vector>

#include "kvgate/records.hpp"

namespace kvgate::records {

struct ShardRecord {
  int index = 0;  // k of --shard k/n (0-based)
  int count = 1;  // n (1: not sharded)
  std::string catalog_digest;  // FNV-1a 64 of the catalog file's bytes, 16 hex digits
  std::string commit;          // `git rev-parse HEAD` of the source tree ("" when it is not a git work tree)
  bool dirty = false;          // the source tree had uncommitted changes
  std::vector<std::string> selection;  // every selected mutant ID before the partition, in run order
  bool full_selection = true;  // the selection was the whole catalog (no --only, --since, ...)
  int merged_shards = 0;       // 0: one run; n: written by `kvgate mutate merge` from n shards
};

template <> struct FieldTable<ShardRecord> { static const std::vector<Field<ShardRecord>>& fields(); };

}  // namespace kvgate::records
