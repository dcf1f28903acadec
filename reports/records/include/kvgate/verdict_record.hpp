// One format's verdict in signoff.json (`verdicts[]`, reports/schema/signoff.schema.json) as a typed
// record with one field table each (kvgate/records.hpp): the JSON writer, the JSON reader and the
// Markdown printer all walk these tables. kvgate::signoff fills it from its FormatVerdict
// (signoff::to_record); the unit test records_unit keeps the tables and the schema in step.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "kvgate/records.hpp"

namespace kvgate::records {

// One policy line judged against one measured value (signoff.schema.json#/$defs/line).
struct VerdictLineRecord {
  std::string metric, origin, line, direction;
  std::optional<double> bound;  // null: the line is not budgeted
  std::string unit, source, scope;
  std::optional<double> value, noise_floor;
  std::string status, reason;
  std::optional<double> margin;  // signed headroom relative to the bound; null when not measured
};

struct ConformanceRecord {
  std::string verdict;  // CONFORMS | DOES-NOT-CONFORM | NOT-VALIDATED
  std::vector<std::string> reasons;
};

struct FitRecord {
  std::string verdict;  // FITS | OVER-BUDGET | NOT-MEASURED
  std::vector<std::string> reasons;
  int deciding = -1;    // index into lines of the line that decided the verdict
  std::vector<VerdictLineRecord> lines;
};

struct GateCountsRecord {
  int passed = 0, failed = 0, skipped = 0;
  std::vector<std::string> failing, skipped_ids;
};

struct MutationProofRecord {
  std::string status;  // run | read | not_run | none
  std::vector<std::string> mutants, killed, survived, not_run;
};

struct FormatVerdictRecord {
  std::string format;
  std::string verdict;  // PASS | DOES-NOT-CONFORM | OVER-BUDGET | NOT-VALIDATED | NOT-MEASURED
  ConformanceRecord conformance;
  FitRecord fit;
  std::string deciding_line;
  std::vector<std::string> reasons;  // the conformance reasons, then the fit reasons
  std::vector<std::string> notes;
  GateCountsRecord gates;
  MutationProofRecord mutation;
  json matrix = json::object();  // the format's matrix summary (its own record, matrix.json)
  json quality;                  // the depth-bucketed quality report, null when not measured
};

template <> struct FieldTable<VerdictLineRecord> { static const std::vector<Field<VerdictLineRecord>>& fields(); };
template <> struct FieldTable<ConformanceRecord> { static const std::vector<Field<ConformanceRecord>>& fields(); };
template <> struct FieldTable<FitRecord> { static const std::vector<Field<FitRecord>>& fields(); };
template <> struct FieldTable<GateCountsRecord> { static const std::vector<Field<GateCountsRecord>>& fields(); };
template <> struct FieldTable<MutationProofRecord> { static const std::vector<Field<MutationProofRecord>>& fields(); };
template <> struct FieldTable<FormatVerdictRecord> { static const std::vector<Field<FormatVerdictRecord>>& fields(); };

}  // namespace kvgate::records
