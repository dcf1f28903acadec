// Shared set-up of the gates that compare the runtime's store with the oracle (store_vs_oracle,
// cuda): the oracle's name for a runtime half format. Only gate programs that link the oracle
// include it.
#pragma once
#include "catch_compat.hpp"
#include "kvgate/format.hpp"
#include "kvgate_oracle/formats.hpp"

namespace kvgate::gates {

// The oracle's half format of the same name; a runtime format the oracle does not know fails the
// gate (REQUIRE), never skips it.
inline kvgate_oracle::Half oracle_half(HalfFormat f) {
  const auto h = kvgate_oracle::parse_half(name(f));
  REQUIRE(h.has_value());
  return *h;
}

}  // namespace kvgate::gates
