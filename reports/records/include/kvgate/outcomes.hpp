// outcomes.json, the record `kvgate mutate` writes and `kvgate signoff --mutants` reads, as typed
// structs with one field table each (kvgate/records.hpp). Its schema is
// mutations/schema/outcomes.schema.json: checked when the driver writes the file and when a reader
// loads it; the unit test records_unit keeps the tables and the schema in step.
#pragma once
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kvgate/records.hpp"
#include "kvgate/shard_record.hpp"

namespace kvgate::records {

inline constexpr int kOutcomesFormatVersion = 2;  // 2: per-variant gate runs (variants, killed_in)

// One gate's result on one mutant (the worst over its test cases and variants).
struct GateCell {
  std::string status;       // passed | failed | crashed | timeout | not_run | skipped
  double seconds = 0;
  std::string log;          // relative to the outcomes' folder
  std::string detail;       // "exit 1", "test case failed: ...", ...
  std::string variant;      // the environment variant that decided the status ("default", "no_avx2", ...)
};

// One catalog mutant's outcome.
struct MutantRecord {
  std::string id, category, file, description;
  std::string status;       // killed | survived | timeout | unviable | noop | skipped | interrupted
  std::string reason;
  std::vector<std::string> killed_by;
  std::vector<std::string> expect_killed_by;
  std::vector<std::string> expected_not_killing;
  std::vector<std::string> expected_unknown;
  // The variants in which each killing gate failed (gate ID -> variant names); a mutant killed
  // only in one variant (e.g. the portable page readers under no_avx2) is killed.
  std::map<std::string, std::vector<std::string>> killed_in;
  double build_s = 0, test_s = 0, wall_s = 0;
  std::string diff, build_log;
  std::vector<std::string> changed_objects;
  std::map<std::string, GateCell> gates;  // by gate ID
  std::string path = "rebuild";  // schema (a run-time switch, no rebuild) | rebuild (patched and rebuilt)
  std::string path_reason;       // the switch form, or why the mutant could not be a switch
  bool compiled_ahead = false;   // rebuild path: objects compiled into ccache ahead of its turn
};

// One environment variant a gate program runs in (the product ships each).
struct VariantRecord {
  std::string name;                   // "default", "no_avx2", "threads_1", ...
  std::map<std::string, std::string> env;  // variables set for the gate process
};

struct ExecutableRecord {
  std::string target, path;
  double seconds = 0;
  std::vector<std::string> gates;
  std::vector<std::string> variants;  // names of the variants it runs in
};

struct GateRecord {
  std::string id, exe;
  std::vector<std::string> cases;
  double seconds = 0;
  bool skipped = false;
};

struct BaselineRecord {
  bool green = false;
  std::vector<std::string> red;
  double build_s = 0, test_s = 0;
  std::vector<ExecutableRecord> executables;
  std::vector<GateRecord> gates;
};

struct OptionsRecord {
  std::vector<std::string> only, gate_targets;
  std::string since;
  int jobs = 1;
  double min_timeout_s = 0, timeout_factor = 0;
  bool canary = true;
};

struct SummaryRecord {
  int run = 0, killed = 0, survived = 0, timeout = 0, unviable = 0, noop = 0, skipped = 0;
  double mutation_s = 0, setup_s = 0, median_wall_s = 0, mutants_per_minute = 0;
};

struct OutcomesRecord {
  std::string tool = "kvgate mutate";
  int format_version = kOutcomesFormatVersion;
  std::string started_at, source_dir, scratch_dir, catalog;
  OptionsRecord options;
  bool full_run = true, interrupted = false;
  int exit_code = 0;
  std::vector<VariantRecord> variants;  // every variant of this run
  BaselineRecord baseline;
  std::optional<MutantRecord> canary;
  std::vector<std::string> canary_survivors;
  SummaryRecord summary;
  std::vector<MutantRecord> mutants;
  std::map<std::string, int> kills_per_gate;
  std::vector<std::string> gates_killing_none, check_failures;
  // The catalog digest, commit and shard (kvgate/shard_record.hpp); absent in files written before it.
  std::optional<ShardRecord> shard;

  const MutantRecord* find(const std::string& id) const;
};

template <> struct FieldTable<GateCell> { static const std::vector<Field<GateCell>>& fields(); };
template <> struct FieldTable<MutantRecord> { static const std::vector<Field<MutantRecord>>& fields(); };
template <> struct FieldTable<VariantRecord> { static const std::vector<Field<VariantRecord>>& fields(); };
template <> struct FieldTable<ExecutableRecord> { static const std::vector<Field<ExecutableRecord>>& fields(); };
template <> struct FieldTable<GateRecord> { static const std::vector<Field<GateRecord>>& fields(); };
template <> struct FieldTable<BaselineRecord> { static const std::vector<Field<BaselineRecord>>& fields(); };
template <> struct FieldTable<OptionsRecord> { static const std::vector<Field<OptionsRecord>>& fields(); };
template <> struct FieldTable<SummaryRecord> { static const std::vector<Field<SummaryRecord>>& fields(); };
template <> struct FieldTable<OutcomesRecord> { static const std::vector<Field<OutcomesRecord>>& fields(); };

// mutations/schema/outcomes.schema.json of the tree this library was built from.
std::filesystem::path default_outcomes_schema();

// Checks `doc` against the schema; every violation as "<pointer>: <message>" (empty: valid).
std::vector<std::string> outcomes_schema_errors(const json& doc, const std::filesystem::path& schema);

// The record as the file holds it; refuses (std::logic_error, naming the field) a record that does
// not match its own schema: a writer bug, never a file that a reader would refuse.
json outcomes_document(const OutcomesRecord& r, const std::filesystem::path& schema = default_outcomes_schema());

// Parses, checks the format version and the schema, then reads the typed record. Refuses
// (RecordError: the file, the field, the fix) a file that is missing, not JSON, of another
// format_version or that breaks the schema.
OutcomesRecord parse_outcomes(const json& doc, const std::string& file,
                              const std::filesystem::path& schema = default_outcomes_schema());
OutcomesRecord read_outcomes(const std::filesystem::path& file,
                             const std::filesystem::path& schema = default_outcomes_schema());

}  // namespace kvgate::records
