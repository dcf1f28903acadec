// Reading optional fields of a record: `const json::operator[]` on an absent key is undefined
// behaviour (it reads past the object), so the renderers read every field through field(), which
// gives null for an absent key or a non-object (rendered as an empty / "–" cell).
#pragma once
#include <cmath>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

namespace kvgate::reports {

inline const nlohmann::json& field(const nlohmann::json& j, std::string_view key) {
  static const nlohmann::json kNull;
  if (!j.is_object()) return kNull;
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

// A count or id of a record as an integer: the field's integer value, a finite float within range
// truncated, else 0. (json::value<int> casts a float to int unchecked: 1e300 is undefined behaviour,
// which the report fuzzer found, and a string throws a bare type_error.)
inline long long int_field(const nlohmann::json& j, std::string_view key) {
  const nlohmann::json& v = field(j, key);
  if (v.is_number_integer()) return v.is_number_unsigned() && v.get<std::uint64_t>() > INT64_MAX ? INT64_MAX : v.get<long long>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return std::isfinite(d) && std::fabs(d) < 9.0e18 ? static_cast<long long>(d) : 0;
  }
  return 0;
}

}  // namespace kvgate::reports
