// `--kv-scales FILE`: the fp8 KV scales of every layer, K and V, one per layer or one per KV head
// (schema reports/schema/kv-scales.schema.json, docs/FORMATS.md "Static scales per KV head").
// Read once, checked against the model, and turned into EngineOptions::k_scale/v_scale:
// [n_layers] when every entry of a half is a number, else [n_layers * n_kv_heads] (a number fills
// every head of its layer). Every refusal names the file, the field and the fix.
#pragma once
#include <cmath>
#include <cstddef>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvgate/kv_store.hpp"

namespace kvgate::cli {

inline constexpr const char* kKvScalesSchema = "kvgate.kv-scales/1";

// One half (K or V) of every layer: each layer's scale, or its n_kv_heads scales.
struct KvScalesHalf {
  std::vector<std::vector<float>> layers;
};
struct KvScalesFile {
  std::string path;
  KvScalesHalf k, v;
};

namespace detail {
[[noreturn]] inline void kv_scales_refuse(const std::string& path, const std::string& field, const std::string& what,
                                          const std::string& fix) {
  throw std::invalid_argument("--kv-scales '" + path + "': field '" + field + "' " + what + "; " + fix);
}

inline std::vector<float> kv_scales_entry(const std::string& path, const std::string& field, const nlohmann::json& j) {
  const std::string fix = "give a number > 0 (every KV head of the layer) or an array of one number > 0 per KV head";
  std::vector<float> out;
  auto one = [&](const nlohmann::json& x, const std::string& where) {
    if (!x.is_number()) kv_scales_refuse(path, where, "is " + std::string(x.type_name()) + ", not a number", fix);
    const double d = x.get<double>();
    const float f = static_cast<float>(d);
    if (!(f > 0.0f) || !std::isfinite(f))
      kv_scales_refuse(path, where, "= " + x.dump() + " is not a finite KV scale > 0 in binary32",
                       "a KV scale divides the cached values: " + fix);
    out.push_back(f);
  };
  if (j.is_array()) {
    if (j.empty()) kv_scales_refuse(path, field, "is an empty array", fix);
    for (std::size_t i = 0; i < j.size(); ++i) one(j[i], field + "[" + std::to_string(i) + "]");
  } else {
    one(j, field);
  }
  return out;
}
}  // namespace detail

// Structure and values (the model is not known yet): JSON, "schema", one {"k", "v"} object per layer.
inline KvScalesFile load_kv_scales_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("--kv-scales '" + path + "': cannot be opened; give the path of a kv-scales JSON file");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("--kv-scales '" + path + "': not valid JSON (" + e.what() + ")");
  }
  using detail::kv_scales_refuse;
  if (!doc.is_object()) kv_scales_refuse(path, "/", "is not a JSON object", "write {\"schema\": \"kvgate.kv-scales/1\", \"layers\": [...]}");
  if (doc.value("schema", std::string()) != kKvScalesSchema)
    kv_scales_refuse(path, "schema", "is missing or not \"" + std::string(kKvScalesSchema) + "\"",
                     "set \"schema\": \"" + std::string(kKvScalesSchema) + "\"");
  for (const auto& [key, _] : doc.items())
    if (key != "schema" && key != "layers" && key != "n_kv_heads" && key != "description" && key != "$schema")
      kv_scales_refuse(path, key, "is not a field of " + std::string(kKvScalesSchema),
                       "remove it (fields: schema, description, n_kv_heads, layers)");
  if (!doc.contains("layers") || !doc["layers"].is_array() || doc["layers"].empty())
    kv_scales_refuse(path, "layers", "is missing or not a non-empty array",
                     "give one {\"k\": ..., \"v\": ...} object per model layer, in layer order");
  KvScalesFile f;
  f.path = path;
  const auto& layers = doc["layers"];
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const std::string at = "layers[" + std::to_string(l) + "]";
    const auto& e = layers[l];
    if (!e.is_object() || !e.contains("k") || !e.contains("v"))
      kv_scales_refuse(path, at, "is not an object with \"k\" and \"v\"", "give the layer's K and V scales: {\"k\": ..., \"v\": ...}");
    for (const auto& [key, _] : e.items())
      if (key != "k" && key != "v")
        kv_scales_refuse(path, at + "." + key, "is not a field of a layer entry", "a layer entry has \"k\" and \"v\" only");
    f.k.layers.push_back(detail::kv_scales_entry(path, at + ".k", e["k"]));
    f.v.layers.push_back(detail::kv_scales_entry(path, at + ".v", e["v"]));
  }
  if (doc.contains("n_kv_heads")) {
    const auto& n = doc["n_kv_heads"];
    if (!n.is_number_integer() || n.get<long long>() < 1)
      kv_scales_refuse(path, "n_kv_heads", "is not an integer >= 1", "give the model's KV head count or leave it out");
    for (const KvScalesHalf* h : {&f.k, &f.v})
      for (std::size_t l = 0; l < h->layers.size(); ++l)
        if (h->layers[l].size() > 1 && static_cast<long long>(h->layers[l].size()) != n.get<long long>())
          kv_scales_refuse(path, "layers[" + std::to_string(l) + "]." + (h == &f.k ? "k" : "v"),
                           "has " + std::to_string(h->layers[l].size()) + " scales but n_kv_heads is " + n.dump(),
                           "give one scale per KV head");
  }
  return f;
}

// The half's scales for a model of n_layers x n_kv_heads: [n_layers] or [n_layers * n_kv_heads].
inline std::vector<float> kv_scales_for_model(const KvScalesFile& f, bool k_half, int n_layers, int n_kv_heads) {
  const KvScalesHalf& h = k_half ? f.k : f.v;
  const char* half = k_half ? "k" : "v";
  if (static_cast<int>(h.layers.size()) != n_layers)
    detail::kv_scales_refuse(f.path, "layers",
                             "has " + std::to_string(h.layers.size()) + " entries but the model has " +
                                 std::to_string(n_layers) + " layers",
                             "give one {\"k\": ..., \"v\": ...} entry per layer (" + std::to_string(n_layers) + ")");
  for (std::size_t l = 0; l < h.layers.size(); ++l) {
    if (h.layers[l].size() == 1) continue;
    if (static_cast<int>(h.layers[l].size()) != n_kv_heads)
      detail::kv_scales_refuse(f.path, "layers[" + std::to_string(l) + "]." + half,
                               "has " + std::to_string(h.layers[l].size()) + " scales but the model has " +
                                   std::to_string(n_kv_heads) + " KV heads",
                               "give one scale per KV head (" + std::to_string(n_kv_heads) + "), or one number for the layer");
  }
  return flatten_kv_scales(h.layers, n_kv_heads);
}

}  // namespace kvgate::cli
