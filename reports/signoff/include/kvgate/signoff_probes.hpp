// Probe parity of a sign-off: the probe cases (needle, counting, echo, ...) the baseline passes and
// the format fails, from the matrix's per-format probe records. Incomplete evidence is no evidence:
// when a probe or one of the cases the baseline ran and passed is missing from the format's
// results, or did not run for the format, the count is "not measured" (nullopt), never a smaller
// number, so the probe-parity rule cannot read "within" on a partial run.
#pragma once
#include <optional>

#include <nlohmann/json.hpp>

namespace kvgate::signoff {

// base, fmt: matrix.json per-format entries ({"probes": {name: {"cases_detail": [{"id", "status",
// "passed"}, ...]}}}). nullopt when either has no probes, a probe of the baseline is absent from the
// format, or a case the baseline ran and passed is absent or not "ran" for the format.
std::optional<int> probe_regressions(const nlohmann::json& base, const nlohmann::json& fmt);

}  // namespace kvgate::signoff
