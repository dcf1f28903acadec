#include "kvgate/outcomes.hpp"

#include "kvgate/build_paths.hpp"

#include <fstream>
#include <sstream>

#include "kvgate/json_limits.hpp"
#include "kvgate/json_schema.hpp"

namespace kvgate::records {

namespace fs = std::filesystem;

// --- the field tables ----------------------------------------------------------------------------
const std::vector<Field<GateCell>>& FieldTable<GateCell>::fields() {
  using R = GateCell;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, status, string, true, "passed, failed, crashed, timeout, not_run or skipped"),
      KVGATE_FIELD(R, seconds, number, true, "wall time of the gate's test cases"),
      KVGATE_FIELD(R, log, string, true, "the gate program's log, relative to the outcomes folder"),
      KVGATE_FIELD(R, detail, string, false, "why it failed, crashed or skipped"),
      KVGATE_FIELD(R, variant, string, false, "the environment variant whose run decided the status"),
  };
  return f;
}

const std::vector<Field<MutantRecord>>& FieldTable<MutantRecord>::fields() {
  using R = MutantRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, id, string, true, "catalog ID"),
      KVGATE_FIELD(R, category, string, true, "catalog category"),
      KVGATE_FIELD(R, file, string, true, "the mutated file, relative to the source tree"),
      KVGATE_FIELD(R, description, string, true, "what the mutant breaks"),
      KVGATE_FIELD(R, status, string, true, "killed, survived, timeout, unviable, noop, skipped or interrupted"),
      KVGATE_FIELD(R, reason, string, true, "why it is not killed (empty when killed)"),
      KVGATE_FIELD(R, killed_by, array, true, "gate IDs that failed or crashed"),
      KVGATE_FIELD(R, expect_killed_by, array, true, "gate IDs the catalog expects to kill it"),
      KVGATE_FIELD(R, expected_not_killing, array, true, "expected killers that stayed green"),
      KVGATE_FIELD(R, expected_unknown, array, true, "expected killers that are not gates of this run"),
      KVGATE_FIELD(R, killed_in, object, true, "per killing gate: the environment variants it failed in"),
      KVGATE_FIELD(R, build_s, number, true, "incremental rebuild time"),
      KVGATE_FIELD(R, test_s, number, true, "time of the gate runs"),
      KVGATE_FIELD(R, wall_s, number, true, "whole mutant"),
      KVGATE_FIELD(R, diff, string, true, "the mutant's diff, relative to the outcomes folder"),
      KVGATE_FIELD(R, build_log, string, true, "its build log, relative to the outcomes folder"),
      KVGATE_FIELD(R, changed_objects, array, true, "object files whose bytes the mutant changed"),
      KVGATE_FIELD(R, gates, object, true, "gate ID -> its result on this mutant"),
      KVGATE_FIELD(R, path, string, false, "schema (a run-time switch in the scratch build) or rebuild (patched and rebuilt)"),
      KVGATE_FIELD(R, path_reason, string, false, "the switch form, or why the mutant could not be a switch"),
      KVGATE_FIELD(R, compiled_ahead, boolean, false,
                   "rebuild path: its objects were compiled into ccache ahead of its turn (its build_s is then mostly cache hits)"),
  };
  return f;
}

const std::vector<Field<VariantRecord>>& FieldTable<VariantRecord>::fields() {
  using R = VariantRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, name, string, true, "variant name, e.g. default or no_avx2"),
      KVGATE_FIELD(R, env, object, true, "environment variables the gate process gets in this variant"),
  };
  return f;
}

const std::vector<Field<ExecutableRecord>>& FieldTable<ExecutableRecord>::fields() {
  using R = ExecutableRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, target, string, true, "CMake target of the gate program"),
      KVGATE_FIELD(R, path, string, true, "the program in the scratch build"),
      KVGATE_FIELD(R, seconds, number, true, "baseline wall time, summed over its variants"),
      KVGATE_FIELD(R, gates, array, true, "gate IDs it holds"),
      KVGATE_FIELD(R, variants, array, true, "the environment variants it runs in"),
  };
  return f;
}

const std::vector<Field<GateRecord>>& FieldTable<GateRecord>::fields() {
  using R = GateRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, id, string, true, "gate ID (first token of its test-case names)"),
      KVGATE_FIELD(R, exe, string, true, "the gate program holding it"),
      KVGATE_FIELD(R, cases, array, true, "its test-case names"),
      KVGATE_FIELD(R, seconds, number, true, "baseline time of its test cases"),
      KVGATE_FIELD(R, skipped, boolean, true, "skipped in the baseline (cannot be proven here)"),
  };
  return f;
}

const std::vector<Field<BaselineRecord>>& FieldTable<BaselineRecord>::fields() {
  using R = BaselineRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, green, boolean, true, "every gate of the unmutated tree passed (or skipped)"),
      KVGATE_FIELD(R, red, array, true, "gate IDs (or build) that were not green"),
      KVGATE_FIELD(R, build_s, number, true, "baseline build time"),
      KVGATE_FIELD(R, test_s, number, true, "baseline gate time"),
      KVGATE_FIELD(R, executables, array, true, "the gate programs"),
      KVGATE_FIELD(R, gates, array, true, "the gates"),
  };
  return f;
}

const std::vector<Field<OptionsRecord>>& FieldTable<OptionsRecord>::fields() {
  using R = OptionsRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, only, array, true, "--only"),
      KVGATE_FIELD(R, gate_targets, array, true, "--gate-targets"),
      KVGATE_FIELD(R, since, string, true, "--since"),
      KVGATE_FIELD(R, jobs, integer, true, "-j"),
      KVGATE_FIELD(R, min_timeout_s, number, true, "--min-timeout"),
      KVGATE_FIELD(R, timeout_factor, number, true, "--timeout-factor"),
      KVGATE_FIELD(R, canary, boolean, true, "the canary ran"),
  };
  return f;
}

const std::vector<Field<SummaryRecord>>& FieldTable<SummaryRecord>::fields() {
  using R = SummaryRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, run, integer, true, "mutants run (killed + survived + timeout + unviable + noop)"),
      KVGATE_FIELD(R, killed, integer, true, "killed"),
      KVGATE_FIELD(R, survived, integer, true, "survived"),
      KVGATE_FIELD(R, timeout, integer, true, "timed out"),
      KVGATE_FIELD(R, unviable, integer, true, "did not build"),
      KVGATE_FIELD(R, noop, integer, true, "changed no object byte"),
      KVGATE_FIELD(R, skipped, integer, true, "could not run here (requires)"),
      KVGATE_FIELD(R, mutation_s, number, true, "time of the mutant loop"),
      KVGATE_FIELD(R, setup_s, number, true, "time before the baseline"),
      KVGATE_FIELD(R, median_wall_s, number, true, "median wall time per mutant"),
      KVGATE_FIELD(R, mutants_per_minute, number, true, "throughput"),
  };
  return f;
}

const std::vector<Field<OutcomesRecord>>& FieldTable<OutcomesRecord>::fields() {
  using R = OutcomesRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, tool, string, true, "always \"kvgate mutate\""),
      KVGATE_FIELD(R, format_version, integer, true, "version of this record (kOutcomesFormatVersion)"),
      KVGATE_FIELD(R, started_at, string, true, "UTC start time"),
      KVGATE_FIELD(R, source_dir, string, true, "the tree the mutants were written against"),
      KVGATE_FIELD(R, scratch_dir, string, true, "the scratch copy they were applied in"),
      KVGATE_FIELD(R, catalog, string, true, "the catalog file"),
      KVGATE_FIELD(R, options, object, true, "the options of the run"),
      KVGATE_FIELD(R, full_run, boolean, true, "no filter (--only, --since, --gate-targets, ...)"),
      KVGATE_FIELD(R, interrupted, boolean, true, "stopped by Ctrl-C"),
      KVGATE_FIELD(R, exit_code, integer, true, "kvgate mutate's exit code"),
      KVGATE_FIELD(R, variants, array, true, "the environment variants the gate programs ran in"),
      KVGATE_FIELD(R, baseline, object, true, "the unmutated run"),
      KVGATE_FIELD(R, canary, object, true, "the canary's outcome (null when it did not run)"),
      KVGATE_FIELD(R, canary_survivors, array, true, "gates the canary left green"),
      KVGATE_FIELD(R, summary, object, true, "counts and times"),
      KVGATE_FIELD(R, mutants, array, true, "one outcome per selected mutant, run order"),
      KVGATE_FIELD(R, kills_per_gate, object, true, "gate ID -> mutants it killed"),
      KVGATE_FIELD(R, gates_killing_none, array, true, "proven gates that killed no mutant"),
      KVGATE_FIELD(R, check_failures, array, true, "the run's own consistency checks that failed"),
      KVGATE_FIELD(R, shard, object, false, "catalog digest, commit and shard of the run (kvgate/shard_record.hpp)"),
  };
  return f;
}

const MutantRecord* OutcomesRecord::find(const std::string& id) const {
  for (const auto& m : mutants)
    if (m.id == id) return &m;
  return nullptr;
}

// --- the edge ----------------------------------------------------------------------------------------
fs::path default_outcomes_schema() {
  return fs::path(KVGATE_RECORDS_SOURCE_DIR) / "mutations" / "schema" / "outcomes.schema.json";
}

namespace {
json load_schema(const fs::path& schema) {
  std::ifstream in(schema);
  if (!in)
    throw std::runtime_error(schema.string() + ": cannot read the outcomes.json schema (mutations/schema/outcomes.schema.json of the source tree)");
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error(schema.string() + ": not JSON: " + e.what());
  }
}
const char* kRerun = "fix: rerun `kvgate mutate` with this kvgate to write a current outcomes.json";
}  // namespace

std::vector<std::string> outcomes_schema_errors(const json& doc, const fs::path& schema) {
  std::vector<std::string> out;
  for (const auto& e : json_schema::validate_json(doc, load_schema(schema)))
    out.push_back((e.instance_path.empty() ? "/" : e.instance_path) + ": " + e.message);
  return out;
}

json outcomes_document(const OutcomesRecord& r, const fs::path& schema) {
  json doc = to_json(r);
  const auto errs = outcomes_schema_errors(doc, schema);
  if (!errs.empty())
    throw std::logic_error("kvgate mutate wrote an outcomes record that breaks " + schema.string() + ": field " + errs.front());
  return doc;
}

OutcomesRecord parse_outcomes(const json& doc, const std::string& file, const fs::path& schema) {
  if (!doc.is_object()) throw RecordError(file, "", std::string("is ") + doc.type_name() + ", not an outcomes object", kRerun);
  if (doc.value("tool", "") != "kvgate mutate")
    throw RecordError(file, "/tool", "is " + (doc.contains("tool") ? doc["tool"].dump() : std::string("missing")) +
                                         ", not \"kvgate mutate\": this is not an outcomes.json",
                      "fix: pass the outcomes.json (or its folder) that kvgate mutate wrote");
  const auto v = doc.find("format_version");
  if (v == doc.end() || !v->is_number_integer() || v->get<int>() != kOutcomesFormatVersion)
    throw RecordError(file, "/format_version",
                      "is " + (v == doc.end() ? std::string("missing") : v->dump()) + "; this kvgate reads format_version " +
                          std::to_string(kOutcomesFormatVersion),
                      kRerun);
  const auto errs = outcomes_schema_errors(doc, schema);
  if (!errs.empty()) {
    const std::string& e = errs.front();
    const auto colon = e.find(": ");
    throw RecordError(file, e.substr(0, colon), "does not match " + schema.filename().string() + ": " + e.substr(colon + 2) +
                                                    (errs.size() > 1 ? " (and " + std::to_string(errs.size() - 1) + " more)" : ""),
                      kRerun);
  }
  return from_json<OutcomesRecord>(doc, file, kRerun);
}

OutcomesRecord read_outcomes(const fs::path& file, const fs::path& schema) {
  std::ifstream in(file);
  if (!in) throw RecordError(file.string(), "", "cannot be read (missing?)", "fix: pass the outcomes.json (or its folder) that kvgate mutate wrote");
  std::stringstream ss;
  ss << in.rdbuf();
  json doc;
  try {
    doc = limits::parse_json(ss.str(), file.string());  // size and depth limits
  } catch (const limits::LimitError&) {
    throw;  // names the file, the size, the limit and its override already
  } catch (const std::exception& e) {
    throw RecordError(file.string(), "", std::string("is not JSON (") + e.what() + ")", kRerun);
  }
  limits::check_records(doc, file.string());  // before the schema walks the records
  return parse_outcomes(doc, file.string(), schema);
}

}  // namespace kvgate::records
