// libFuzzer harness: the release policy (parse_policy after a JSON parse under the limits policy),
// then the effective budgets of every preset the policy could name.
#include <exception>

#include "fuzz_common.hpp"
#include "kvgate/format.hpp"
#include "kvgate/json_limits.hpp"
#include "kvgate/signoff.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto doc = kvgate::limits::parse_json(kvgate::fuzz::as_text(data, size), "fuzz-policy.json");
    const kvgate::signoff::Policy p = kvgate::signoff::parse_policy(doc, "fuzz-policy.json");
    for (const auto& pr : kvgate::presets()) (void)kvgate::signoff::budgets_for(p, std::string(pr.name));
  } catch (const std::exception&) {
  }
  return 0;
}
