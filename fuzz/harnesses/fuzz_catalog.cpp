// libFuzzer harness: the mutant catalog (JSON parsed under the limits policy, schema check against
// mutations/catalog.schema.json, then parse_catalog's own checks).
#include <exception>

#include "fuzz_common.hpp"
#include "kvgate/json_limits.hpp"
#include "kvgate_mutations/catalog.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const nlohmann::json schema = [] {
    std::ifstream in(kvgate::fuzz::source_file("mutations/catalog.schema.json"));
    return nlohmann::json::parse(in);
  }();
  try {
    const auto doc = kvgate::limits::parse_json(kvgate::fuzz::as_text(data, size), "fuzz-catalog.json");
    (void)kvgate::mutate::parse_catalog(doc, schema, "fuzz-catalog.json");
  } catch (const std::exception&) {
  }
  return 0;
}
