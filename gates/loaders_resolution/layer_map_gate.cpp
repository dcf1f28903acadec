// STO.resolve.layer_map: the per-layer KV map a spec means (kvgate/kv_layer_map.hpp, `--kv-layers`, and
// vLLM's `--kv-cache-dtype-skip-layers`), table-driven: spec x model layers -> the format of every
// layer, or the refusal (its words name the flag, the item and the fix). The expected column is
// written from the grammar in docs/FORMATS.md ("Per-layer maps"), never from a run:
//   ITEM = LAYERS ':' FORMAT, comma-separated; LAYERS = N | N-M (inclusive) | '*' (every layer no
//   other item names, wherever it stands); FORMAT = a preset or K/V halves; a layer named twice, a
//   second '*', a layer out of range, a backwards range, layers without a format, an unknown format,
//   an empty spec or item are refused.
// Also: the canonical name of every map parses back to the same map; kv_layer_runs cut exactly where
// the format changes. The class it closes: a range end off by one (exclusive vs inclusive), '*'
// applied to named layers or only after them, the skip list inverted, overlaps taking the last item.
// Exact (formats compared as values, messages by substring).
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/kv_layer_map.hpp"

using namespace kvgate;

namespace {

KvFormat F(const char* s) {
  const auto f = parse_kv_format(s);
  if (!f) throw std::runtime_error(std::string("unknown preset ") + s);
  return *f;
}

struct Case {
  const char* spec;
  int layers;
  std::vector<const char*> want;  // per layer; empty: refused
  const char* refusal;            // substring of the refusal (with the flag prefix checked apart)
};

}  // namespace

TEST_CASE("STO.resolve.layer_map --kv-layers specs: the format of every layer or the refusal naming the item and the fix",
          "[gate:STO][fmt:int8][fmt:fp8][fmt:bf16][fmt:q4_0]") {
  const std::vector<Case> cases = {
      {"0-1:bf16,*:fp8", 5, {"bf16", "bf16", "fp8", "fp8", "fp8"}, nullptr},
      {"*:fp8,0-1:bf16", 5, {"bf16", "bf16", "fp8", "fp8", "fp8"}, nullptr},  // '*' wherever it stands
      {"4:f32,*:int8", 5, {"int8", "int8", "int8", "int8", "f32"}, nullptr},
      {"0:f16,1-3:q4_0,4:f16", 5, {"f16", "q4_0", "q4_0", "q4_0", "f16"}, nullptr},
      {"2-2:k8v4,*:int8", 4, {"int8", "int8", "k8v4", "int8"}, nullptr},
      {"0-3:q8_0/q4_0", 4, {"k=q8_0,v=q4_0", "k=q8_0,v=q4_0", "k=q8_0,v=q4_0", "k=q8_0,v=q4_0"}, nullptr},
      {" 0 - 1 : bf16 , * : int8 ", 3, {"bf16", "bf16", "int8"}, nullptr},
      {"*:int8", 1, {"int8"}, nullptr},
      {"0:f16,1:f16", 2, {"f16", "f16"}, nullptr},
      // refusals
      {"", 5, {}, "empty"},
      {"0-1:bf16,,*:fp8", 5, {}, "an empty item"},
      {"0-1bf16", 5, {}, "has no ':'"},
      {"0-1:bf16,1:fp8,*:int8", 5, {}, "layer 1 is named twice ('0-1:bf16' and '1:fp8')"},
      {"*:int8,*:fp8", 5, {}, "'*' is given twice"},
      {"0-5:int8", 5, {}, "layer 5 is out of range: the model has 5 layers (0-4)"},
      {"3-1:int8,*:f16", 5, {}, "runs backwards (write 1-3)"},
      {"0-2:int8", 5, {}, "layers 3,4 have no format"},
      {"0-1:int9,*:f16", 5, {}, "unknown KV format 'int9'"},
      {"0-1:,*:f16", 5, {}, "unknown KV format ''"},
      {"x:int8", 5, {}, "'x' is not a layer number"},
      {"-1:int8", 5, {}, "is not a layer number"},
      {"0:q8_0/q9", 2, {}, "unknown KV format 'q8_0/q9'"},
  };
  int accepted = 0, refused = 0;
  for (const Case& c : cases) {
    INFO("spec \"" << c.spec << "\", " << c.layers << " layers");
    if (c.want.empty()) {
      CHECK_THROWS_AS(parse_kv_layer_map(c.spec, c.layers), KvLayerMapError);
      CHECK_THROWS_WITH(parse_kv_layer_map(c.spec, c.layers), kvgate_catch::contains(std::string("--kv-layers: ")));
      CHECK_THROWS_WITH(parse_kv_layer_map(c.spec, c.layers), kvgate_catch::contains(std::string(c.refusal)));
      ++refused;
      continue;
    }
    const KvLayerMap m = parse_kv_layer_map(c.spec, c.layers);
    REQUIRE(m.size() == c.want.size());
    for (std::size_t l = 0; l < m.size(); ++l) {
      INFO("layer " << l);
      CHECK(m[l] == F(c.want[l]));
    }
    // The canonical name parses back to the same map; the runs cut where the format changes.
    CHECK(parse_kv_layer_map(kv_layer_map_name(m), c.layers) == m);
    const std::vector<KvLayerRun> runs = kv_layer_runs(m);
    int at = 0;
    for (const KvLayerRun& r : runs) {
      CHECK(r.first == at);
      CHECK(r.end > r.first);
      for (int l = r.first; l < r.end; ++l) CHECK(m[static_cast<std::size_t>(l)] == r.format);
      if (r.end < c.layers) CHECK(!(m[static_cast<std::size_t>(r.end)] == r.format));
      at = r.end;
    }
    CHECK(at == c.layers);
    ++accepted;
  }
  CHECK(kv_layer_map_name(parse_kv_layer_map("0-1:bf16,*:fp8", 5)) == "0-1:bf16,2-4:fp8");
  CHECK(kv_layer_map_name(parse_kv_layer_map("0:q8_0/q4_0,*:int8", 3)) == "0:q8_0/q4_0,1-2:int8");
  CHECK(kv_layer_map_uniform(parse_kv_layer_map("0:f16,1:f16", 2)));
  CHECK(!kv_layer_map_uniform(parse_kv_layer_map("0:f16,1:bf16", 2)));
  CHECK(accepted == 9);
  CHECK(refused == 13);
}

TEST_CASE("STO.resolve.layer_map.skip vLLM's --kv-cache-dtype-skip-layers: the listed layers keep the model's own KV",
          "[gate:STO][fmt:fp8][fmt:f16]") {
  const KvFormat keep = F("f16"), rest = F("fp8");
  const KvLayerMap m = kv_skip_layers_map("0,3-4", 6, keep, rest);
  const std::vector<KvFormat> want = {keep, rest, rest, keep, keep, rest};
  CHECK(m == want);
  CHECK(kv_skip_layers_map("5", 6, keep, rest) == KvLayerMap{rest, rest, rest, rest, rest, keep});
  CHECK_THROWS_WITH(kv_skip_layers_map("0,0", 6, keep, rest), kvgate_catch::contains("--kv-cache-dtype-skip-layers: layer 0 is named twice"));
  CHECK_THROWS_WITH(kv_skip_layers_map("6", 6, keep, rest), kvgate_catch::contains("layer 6 is out of range"));
  CHECK_THROWS_WITH(kv_skip_layers_map("", 6, keep, rest), kvgate_catch::contains("empty"));
  CHECK_THROWS_WITH(kv_skip_layers_map("1,,2", 6, keep, rest), kvgate_catch::contains("an empty item"));
}
