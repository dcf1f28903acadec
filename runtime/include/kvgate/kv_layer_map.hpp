// Per-layer KV format maps (docs/FORMATS.md, "Per-layer maps"): `--kv-layers "0-1:bf16,*:fp8"` gives
// each model layer its own KV format, as engines that keep the first/last layers in 16 bits do.
// The CPU engine stores every run of layers with one format in its own store (as a pipeline stage
// does), so a map changes which bytes each layer holds and nothing else.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kvgate/format.hpp"

namespace kvgate {

class KvLayerMapError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// One format per model layer. Empty: every layer holds the engine's one format.
using KvLayerMap = std::vector<KvFormat>;

// Parses SPEC for a model of n_layers: comma-separated ITEMs, ITEM = LAYERS ':' FORMAT, LAYERS = N |
// N-M (inclusive) | '*' (every layer no other item names), FORMAT = a preset or a half pair spelled
// K/V (e.g. q8_0/q4_0; the k=<K>,v=<V> spelling holds a comma, so it is not accepted here).
// Refused (KvLayerMapError naming `flag`, the item, and the fix): an empty spec or item, a layer out
// of [0, n_layers), N > M, a layer named twice, '*' twice, layers left without a format (no '*'),
// an unknown format (with the known ones).
KvLayerMap parse_kv_layer_map(std::string_view spec, int n_layers, std::string_view flag = "--kv-layers");

// vLLM's spelling: the listed layers (comma-separated N or N-M) keep `keep`, every other layer holds
// `rest`. Refusals as parse_kv_layer_map (a layer out of range, named twice, an empty list).
KvLayerMap kv_skip_layers_map(std::string_view layers, int n_layers, const KvFormat& keep, const KvFormat& rest,
                              std::string_view flag = "--kv-cache-dtype-skip-layers");

// True when every layer holds the same format (an empty map included).
bool kv_layer_map_uniform(const KvLayerMap& m);

// The canonical spelling: runs of equal formats as "N-M:fmt" (or "N:fmt"), comma-joined, in layer
// order; a half pair is written K/V. parse_kv_layer_map(kv_layer_map_name(m), n) == m.
std::string kv_layer_map_name(const KvLayerMap& m);

// Contiguous runs of one format: [first, last + 1) and the format, in layer order.
struct KvLayerRun {
  int first = 0, end = 0;
  KvFormat format;
};
std::vector<KvLayerRun> kv_layer_runs(const KvLayerMap& m);

}  // namespace kvgate
