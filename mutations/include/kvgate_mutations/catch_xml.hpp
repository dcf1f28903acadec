// The Catch2 XML reader lives in the harness library (mutations/harness); the driver uses it under
// its own namespace.
#pragma once
#include "kvgate_harness/catch_xml.hpp"

namespace kvgate::mutate {
using harness::CaseResult;
using harness::catch_spec_for_gate;
using harness::gate_id_of;
using harness::parse_catch_xml;
}  // namespace kvgate::mutate
