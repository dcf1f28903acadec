// The field tables of a format's verdict in signoff.json (kvgate/verdict_record.hpp).
#include "kvgate/verdict_record.hpp"

namespace kvgate::records {

const std::vector<Field<VerdictLineRecord>>& FieldTable<VerdictLineRecord>::fields() {
  using R = VerdictLineRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, metric, string, true, "the policy metric (kl_mean, top1, ...)"),
      KVGATE_FIELD(R, origin, string, true, "where the line comes from (policy default or a format override)"),
      KVGATE_FIELD(R, line, string, true, "the line as the report prints it"),
      KVGATE_FIELD(R, direction, string, true, "at_most or at_least"),
      KVGATE_FIELD(R, bound, number, true, "the bound; null when the metric is not budgeted"),
      KVGATE_FIELD(R, unit, string, true, "nats, fraction, cases or ratio"),
      KVGATE_FIELD(R, source, string, true, "why the bound is what it is"),
      KVGATE_FIELD(R, scope, string, true, "\"all\", a depth bucket, or empty for unbucketed metrics"),
      KVGATE_FIELD(R, value, number, true, "the measured value; null when not measured"),
      KVGATE_FIELD(R, noise_floor, number, true, "the metric's noise floor beside the value"),
      KVGATE_FIELD(R, status, string, true, "within, over, not_measured, refused or not_applicable"),
      KVGATE_FIELD(R, reason, string, true, "why the line has its status"),
      KVGATE_FIELD(R, margin, number, false, "signed headroom relative to the bound (< 0: over); null when not measured"),
  };
  return f;
}

const std::vector<Field<ConformanceRecord>>& FieldTable<ConformanceRecord>::fields() {
  using R = ConformanceRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, verdict, string, true, "CONFORMS, DOES-NOT-CONFORM or NOT-VALIDATED"),
      KVGATE_FIELD(R, reasons, array, true, "why it does not conform or was not validated"),
  };
  return f;
}

const std::vector<Field<FitRecord>>& FieldTable<FitRecord>::fields() {
  using R = FitRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, verdict, string, true, "FITS, OVER-BUDGET or NOT-MEASURED"),
      KVGATE_FIELD(R, reasons, array, true, "why it does not fit or was not measured"),
      KVGATE_FIELD(R, deciding, integer, true, "index into lines of the deciding line (-1: none)"),
      KVGATE_FIELD(R, lines, array, true, "every policy line judged"),
  };
  return f;
}

const std::vector<Field<GateCountsRecord>>& FieldTable<GateCountsRecord>::fields() {
  using R = GateCountsRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, passed, integer, true, "gates of the format that passed"),
      KVGATE_FIELD(R, failed, integer, true, "gates of the format that failed"),
      KVGATE_FIELD(R, skipped, integer, true, "gates of the format that were skipped"),
      KVGATE_FIELD(R, failing, array, true, "IDs of the failed gates"),
      KVGATE_FIELD(R, skipped_ids, array, true, "IDs of the skipped gates"),
  };
  return f;
}

const std::vector<Field<MutationProofRecord>>& FieldTable<MutationProofRecord>::fields() {
  using R = MutationProofRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, status, string, true, "run, read (from --mutants), not_run or none"),
      KVGATE_FIELD(R, mutants, array, true, "the catalog mutants whose expected killers are gates of the format"),
      KVGATE_FIELD(R, killed, array, true, "those killed"),
      KVGATE_FIELD(R, survived, array, true, "those that survived"),
      KVGATE_FIELD(R, not_run, array, true, "those not run, missing from the outcomes or undecided"),
  };
  return f;
}

const std::vector<Field<FormatVerdictRecord>>& FieldTable<FormatVerdictRecord>::fields() {
  using R = FormatVerdictRecord;
  static const std::vector<Field<R>> f{
      KVGATE_FIELD(R, format, string, true, "the KV format"),
      KVGATE_FIELD(R, verdict, string, true, "PASS, DOES-NOT-CONFORM, OVER-BUDGET, NOT-VALIDATED or NOT-MEASURED"),
      KVGATE_FIELD(R, conformance, object, true, "the conformance verdict (gates, mutation proof, no fallback)"),
      KVGATE_FIELD(R, fit, object, true, "the fit verdict (quality under the release policy)"),
      KVGATE_FIELD(R, deciding_line, string, true, "the policy line that decided the verdict"),
      KVGATE_FIELD(R, reasons, array, true, "the conformance reasons, then the fit reasons"),
      KVGATE_FIELD(R, notes, array, false, "remarks that decide nothing (e.g. no CUDA timing row ran)"),
      KVGATE_FIELD(R, gates, object, true, "the format's gate results"),
      KVGATE_FIELD(R, mutation, object, true, "the format's mutation proof"),
      KVGATE_FIELD(R, matrix, object, true, "the format's matrix summary"),
      KVGATE_FIELD(R, quality, object, true, "the depth-bucketed quality report; null when not measured"),
  };
  return f;
}

}  // namespace kvgate::records
