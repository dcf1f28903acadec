// Shared set-up of the gates that compare the runtime's store with the oracle (store_vs_oracle,
// cuda): the oracle's name for a runtime half format. Only gate programs that link the oracle
// include it.
#pragma once
#include <cmath>
#include <span>
#include <vector>

#include "bounds.hpp"
#include "catch_compat.hpp"
#include "kvgate/format.hpp"
#include "kvgate_oracle/formats.hpp"
#include "kvgate_oracle/metrics.hpp"

namespace kvgate::gates {

// The oracle's half format of the same name; a runtime format the oracle does not know fails the
// gate (REQUIRE), never skips it.
inline kvgate_oracle::Half oracle_half(HalfFormat f) {
  const auto h = kvgate_oracle::parse_half(name(f));
  REQUIRE(h.has_value());
  return *h;
}

// A runtime output against the oracle's binary64 reference under a derived max-abs bound, in
// llama.cpp test-backend-ops order: NaN/Inf first, then NMSE (against the bound's own NMSE), then
// max-abs; then the anti-vacuity every such gate shares: the bound stays under kOraSensitivity of
// the reference's RMS (the gate sees errors far below a real bug). Returns the reference's RMS.
inline double check_within_bound(const std::vector<double>& ref, const std::vector<float>& got, double bound) {
  double ref_sq = 0;
  for (double x : ref) ref_sq += x * x;
  const double nmse_bound = bound * bound * double(ref.size()) / ref_sq;
  REQUIRE(kvgate_oracle::count_nonfinite(std::span<const float>(got)) == 0);
  const double e_nmse = kvgate_oracle::nmse(ref, got), e_max = kvgate_oracle::max_abs_diff(ref, got);
  INFO("nmse " << e_nmse << " (bound " << nmse_bound << "), max-abs " << e_max << " (bound " << bound << ")");
  CHECK(e_nmse <= nmse_bound);
  CHECK(e_max <= bound);
  const double rms = std::sqrt(ref_sq / double(ref.size()));
  INFO("bound / rms(ref) = " << bound / rms);
  CHECK(bound <= kOraSensitivity * rms);
  return rms;
}

}  // namespace kvgate::gates
