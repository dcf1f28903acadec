#include "kvgate/signoff_probes.hpp"

#include <map>
#include <string>

namespace kvgate::signoff {

using json = nlohmann::json;

std::optional<int> probe_regressions(const json& base, const json& fmt) {
  if (!base.is_object() || !fmt.is_object()) return std::nullopt;
  const json bp = base.value("probes", json::object()), fp = fmt.value("probes", json::object());
  if (bp.empty() || fp.empty()) return std::nullopt;
  int n = 0;
  for (const auto& [pn, b] : bp.items()) {
    if (!fp.contains(pn)) return std::nullopt;
    const json got_cases = fp[pn].value("cases_detail", json::array());
    const json base_cases = b.value("cases_detail", json::array());
    std::map<std::string, const json*> got;  // points into got_cases
    for (const auto& c : got_cases) got[c.value("id", "")] = &c;
    for (const auto& c : base_cases) {
      if (c.value("status", "") != "ran" || !c.value("passed", false)) continue;
      const auto it = got.find(c.value("id", ""));
      if (it == got.end() || it->second->value("status", "") != "ran") return std::nullopt;
      if (!it->second->value("passed", false)) ++n;
    }
  }
  return n;
}

}  // namespace kvgate::signoff
