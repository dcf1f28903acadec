// Reading optional fields of a record: `const json::operator[]` on an absent key is undefined
// behaviour (it reads past the object), so the renderers read every field through field(), which
// gives null for an absent key or a non-object (rendered as an empty / "–" cell).
#pragma once
#include <string_view>

#include <nlohmann/json.hpp>

namespace kvgate::reports {

inline const nlohmann::json& field(const nlohmann::json& j, std::string_view key) {
  static const nlohmann::json kNull;
  if (!j.is_object()) return kNull;
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

}  // namespace kvgate::reports
