#include "kvgate/shard_record.hpp"

namespace kvgate::records {

const std::vector<Field<ShardRecord>>& FieldTable<ShardRecord>::fields() {
  using R = ShardRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, index, integer, true, "k of --shard k/n (0-based)"),
      KVGATE_FIELD(R, count, integer, true, "n of --shard k/n (1: not sharded)"),
      KVGATE_FIELD(R, catalog_digest, string, true, "FNV-1a 64 of the catalog file, 16 hex digits"),
      KVGATE_FIELD(R, commit, string, true, "git HEAD of the source tree (empty: not a git work tree)"),
      KVGATE_FIELD(R, dirty, boolean, true, "the source tree had uncommitted changes"),
      KVGATE_FIELD(R, selection, array, true, "every selected mutant ID before the partition, run order"),
      KVGATE_FIELD(R, full_selection, boolean, true, "the selection was the whole catalog"),
      KVGATE_FIELD(R, merged_shards, integer, true, "0: one run; n: merged from n shards"),
  };
  return f;
}

}  // namespace kvgate::records
