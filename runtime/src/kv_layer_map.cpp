// Per-layer KV format maps: parsing, the canonical name, runs (kvgate/kv_layer_map.hpp).
#include "kvgate/kv_layer_map.hpp"

#include <charconv>
#include <optional>

namespace kvgate {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (std::size_t at = 0;;) {
    const std::size_t p = s.find(sep, at);
    out.push_back(trim(s.substr(at, p == std::string_view::npos ? std::string_view::npos : p - at)));
    if (p == std::string_view::npos) return out;
    at = p + 1;
  }
}

[[noreturn]] void refuse(std::string_view flag, const std::string& what) {
  throw KvLayerMapError(std::string(flag) + ": " + what);
}

// "N" or "N-M" (inclusive) of a model of n layers -> [first, end).
std::pair<int, int> parse_layers(std::string_view flag, std::string_view item, std::string_view s, int n) {
  const std::size_t dash = s.find('-');
  auto number = [&](std::string_view t) {
    t = trim(t);
    int v = -1;
    const auto r = std::from_chars(t.data(), t.data() + t.size(), v);
    if (t.empty() || r.ec != std::errc() || r.ptr != t.data() + t.size() || v < 0)
      refuse(flag, "'" + std::string(item) + "': '" + std::string(t) +
                       "' is not a layer number (give N, N-M or *, layers counted from 0)");
    if (v >= n)
      refuse(flag, "'" + std::string(item) + "': layer " + std::to_string(v) + " is out of range: the model has " +
                       std::to_string(n) + " layers (0-" + std::to_string(n - 1) + ")");
    return v;
  };
  const int a = number(s.substr(0, dash));
  const int b = dash == std::string_view::npos ? a : number(s.substr(dash + 1));
  if (a > b)
    refuse(flag, "'" + std::string(item) + "': the range " + std::to_string(a) + "-" + std::to_string(b) +
                     " runs backwards (write " + std::to_string(b) + "-" + std::to_string(a) + ")");
  return {a, b + 1};
}

KvFormat parse_format(std::string_view flag, std::string_view item, std::string_view s) {
  s = trim(s);
  std::optional<KvFormat> f;
  if (const std::size_t slash = s.find('/'); slash != std::string_view::npos) {
    const auto k = parse_half(trim(s.substr(0, slash))), v = parse_half(trim(s.substr(slash + 1)));
    if (k && v) f = KvFormat{*k, *v};
  } else if (!s.empty()) {
    f = parse_kv_format(s);
  }
  if (!f)
    refuse(flag, "'" + std::string(item) + "': unknown KV format '" + std::string(s) + "' (a preset or K/V halves: " +
                     known_formats_text() + ")");
  return *f;
}

}  // namespace

KvLayerMap parse_kv_layer_map(std::string_view spec, int n_layers, std::string_view flag) {
  if (n_layers < 1) refuse(flag, "the model has no layers");
  if (trim(spec).empty()) refuse(flag, "empty: give items LAYERS:FORMAT, e.g. \"0-1:bf16,*:fp8\"");
  std::vector<std::optional<KvFormat>> at(static_cast<std::size_t>(n_layers));
  std::vector<std::string> named_by(static_cast<std::size_t>(n_layers));
  std::optional<KvFormat> rest;
  for (std::string_view item : split(spec, ',')) {
    if (item.empty()) refuse(flag, "an empty item in \"" + std::string(spec) + "\" (items are LAYERS:FORMAT, comma-separated)");
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos)
      refuse(flag, "'" + std::string(item) + "' has no ':' (items are LAYERS:FORMAT, e.g. 0-1:bf16 or *:fp8)");
    const std::string_view layers = trim(item.substr(0, colon));
    const KvFormat f = parse_format(flag, item, item.substr(colon + 1));
    if (layers == "*") {
      if (rest) refuse(flag, "'*' is given twice (one '*' item covers every layer no other item names)");
      rest = f;
      continue;
    }
    const auto [a, b] = parse_layers(flag, item, layers, n_layers);
    for (int l = a; l < b; ++l) {
      auto& slot = at[static_cast<std::size_t>(l)];
      if (slot)
        refuse(flag, "layer " + std::to_string(l) + " is named twice ('" + named_by[static_cast<std::size_t>(l)] +
                         "' and '" + std::string(item) + "'): give each layer one format");
      slot = f;
      named_by[static_cast<std::size_t>(l)] = std::string(item);
    }
  }
  KvLayerMap m;
  std::string missing;
  for (int l = 0; l < n_layers; ++l) {
    const auto& slot = at[static_cast<std::size_t>(l)];
    if (slot) m.push_back(*slot);
    else if (rest) m.push_back(*rest);
    else missing += (missing.empty() ? "" : ",") + std::to_string(l);
  }
  if (!missing.empty())
    refuse(flag, "layers " + missing + " have no format: name them or add a '*:FORMAT' item for the rest");
  return m;
}

KvLayerMap kv_skip_layers_map(std::string_view layers, int n_layers, const KvFormat& keep, const KvFormat& rest,
                              std::string_view flag) {
  if (n_layers < 1) refuse(flag, "the model has no layers");
  if (trim(layers).empty()) refuse(flag, "empty: give the layers that keep " + keep.name() + ", e.g. 0,1 or 0-1");
  KvLayerMap m(static_cast<std::size_t>(n_layers), rest);
  std::vector<bool> named(static_cast<std::size_t>(n_layers), false);
  for (std::string_view item : split(layers, ',')) {
    if (item.empty()) refuse(flag, "an empty item in \"" + std::string(layers) + "\" (comma-separated N or N-M)");
    const auto [a, b] = parse_layers(flag, item, item, n_layers);
    for (int l = a; l < b; ++l) {
      if (named[static_cast<std::size_t>(l)]) refuse(flag, "layer " + std::to_string(l) + " is named twice");
      named[static_cast<std::size_t>(l)] = true;
      m[static_cast<std::size_t>(l)] = keep;
    }
  }
  return m;
}

bool kv_layer_map_uniform(const KvLayerMap& m) {
  for (const KvFormat& f : m)
    if (!(f == m.front())) return false;
  return true;
}

std::vector<KvLayerRun> kv_layer_runs(const KvLayerMap& m) {
  std::vector<KvLayerRun> runs;
  for (int l = 0; l < static_cast<int>(m.size()); ++l) {
    const KvFormat& f = m[static_cast<std::size_t>(l)];
    if (runs.empty() || !(runs.back().format == f)) runs.push_back({l, l + 1, f});
    else runs.back().end = l + 1;
  }
  return runs;
}

std::string kv_layer_map_name(const KvLayerMap& m) {
  std::string s;
  for (const KvLayerRun& r : kv_layer_runs(m)) {
    const std::string n = r.format.name();
    const std::string fmt = n.starts_with("k=") ? std::string(name(r.format.k)) + "/" + std::string(name(r.format.v)) : n;
    s += (s.empty() ? "" : ",") + std::to_string(r.first) + (r.end - r.first > 1 ? "-" + std::to_string(r.end - 1) : "") +
         ":" + fmt;
  }
  return s;
}

}  // namespace kvgate
