// PAR.layer_map.*: per-layer KV format maps (EngineOptions::kv_layers, `--kv-layers`), laid out as the
// pipeline split is: every run of layers with one format has its own store.
//   PAR.layer_map.<fmt>      for every boundary b (layers [0, b) in <fmt>, [b, n) in f32), against the
//                            uniform <fmt> engine and the uniform f32 engine on the same prompt:
//                            - the stores: two, holding [0, b) in <fmt> and [b, n) in f32;
//                            - layers < b hold, bitwise, the rows the uniform <fmt> engine holds (the
//                              same inputs through the same formats);
//                            - layer b's f32 rows, quantized to <fmt> by a store of the uniform
//                              engine's config, are bitwise that engine's layer-b rows: so layer b's
//                              inputs came through <fmt> layers only (a boundary one layer off, or
//                              a layer in the wrong format, changes them) and layer b itself is f32;
//                            - the per-layer stats: each layer's format, its bytes per token
//                              ((K page + V page) / block), the map's canonical name, kv_bytes = the
//                              pages in use of every layer;
//                            - a map with one format everywhere is that format: one store, bitwise
//                              the uniform engine's logits, no map name (the only check of f32, the
//                              boundary maps' other format).
//                            Anti-vacuity: every boundary's logits differ in their bits from the
//                            uniform <fmt> engine's and from the f32 engine's (a map that is ignored
//                            matches one of them).
//   PAR.layer_map.options    a map of the wrong length is refused; a mapped run cannot be saved to
//                            or hydrated from a KV file (one format per file): refused naming
//                            --kv-layers, nothing written; a byte budget buys budget / (the map's
//                            K + V page bytes over all layers) blocks.
// Bound: zero, bitwise (as PAR.split): the mapped engine performs the same operations on the same
// rows; only the format of the store that holds a layer changes.
#include <algorithm>
#include <filesystem>
#include <numeric>

#include "kvgate/format_list.hpp"
#include "kvgate/kv_layer_map.hpp"
#include "par_common.hpp"

using namespace kvgate;
using namespace kvgate::par;

namespace {

constexpr int kChunk = 7;  // prefill chunks of 7 tokens: the prompt crosses chunks and pages

EngineOptions map_options(const Model& m, const KvFormat& f) {
  EngineOptions o = options(m, f);
  o.prefill_chunk = kChunk;
  return o;
}

std::string expected_map_name(const KvFormat& f, int b, int n) {
  const std::string a = f.name().starts_with("k=") ? std::string(name(f.k)) + "/" + std::string(name(f.v)) : f.name();
  return "0" + (b > 1 ? "-" + std::to_string(b - 1) : std::string()) + ":" + a + "," + std::to_string(b) +
         (n - 1 > b ? "-" + std::to_string(n - 1) : std::string()) + ":f32";
}

// A map with one format everywhere is that format: one store, the uniform engine's logits bitwise, no map name.
void check_uniform_map(const Model& m, const KvFormat& f, const std::vector<int>& prompt, const std::vector<float>& uni_logits) {
  EngineOptions o = map_options(m, f);
  o.kv_layers.assign(static_cast<std::size_t>(m.config.n_layers), f);
  Engine same(m, o);
  CHECK(bitwise_equal(same.forward_all_logits(prompt), uni_logits));
  CHECK(same.stage_count() == 1);
  CHECK(same.stats().kv_layer_map.empty());
  CHECK(same.stats().effective_kv == f.name());
}

// f32, the boundary maps' other format: only the uniform map applies.
void run_uniform_map(const Model& m, const KvFormat& f) {
  INFO("model " << m.path << ", format " << f.name());
  const std::vector<int> prompt = joined_turns(m);
  Engine uni(m, map_options(m, f));
  check_uniform_map(m, f, prompt, uni.forward_all_logits(prompt));
}

void run_layer_map(const Model& m, const KvFormat& f) {
  const ModelConfig& c = m.config;
  const int n = c.n_layers;
  INFO("model " << m.path << ", format " << f.name());
  REQUIRE(n >= 2);
  const std::vector<int> prompt = joined_turns(m);
  REQUIRE(static_cast<int>(prompt.size()) > 2 * kChunk);
  const KvFormat f32{HalfFormat::f32, HalfFormat::f32};

  Engine uni(m, map_options(m, f)), full(m, map_options(m, f32));
  const std::vector<float> uni_logits = uni.forward_all_logits(prompt), f32_logits = full.forward_all_logits(prompt);
  REQUIRE(uni.stage_count() == 1);

  check_uniform_map(m, f, prompt, uni_logits);

  const PageGeometry g{16, c.n_kv_heads, c.head_dim};
  for (int b = 1; b < n; ++b) {
    INFO("boundary " << b << ": layers 0-" << b - 1 << " " << f.name() << ", " << b << "-" << n - 1 << " f32");
    EngineOptions o = map_options(m, f);
    for (int l = 0; l < n; ++l) o.kv_layers.push_back(l < b ? f : f32);
    Engine mapped(m, o);
    const std::vector<float> logits = mapped.forward_all_logits(prompt);
    CHECK(!bitwise_equal(logits, uni_logits));  // the f32 layers are not <fmt>'s
    CHECK(!bitwise_equal(logits, f32_logits));  // the <fmt> layers are not f32's

    // The stores.
    REQUIRE(mapped.stage_count() == 2);
    CHECK(mapped.stage_layers(0) == std::pair<int, int>{0, b});
    CHECK(mapped.stage_layers(1) == std::pair<int, int>{b, n});
    const PagedKvStore& lo = mapped.stage_store(0);
    const PagedKvStore& hi = mapped.stage_store(1);
    CHECK(lo.format() == f);
    CHECK(hi.format() == f32);
    CHECK(lo.config().first_layer == 0);
    CHECK(hi.config().first_layer == b);
    const SeqId ls = mapped.stage_sequence(0), hs = mapped.stage_sequence(1);
    REQUIRE(lo.length(ls) == static_cast<int>(prompt.size()));
    REQUIRE(hi.length(hs) == static_cast<int>(prompt.size()));

    // Layers < b: the uniform engine's rows.
    for (int l = 0; l < b; ++l)
      for (KvHalf h : {KvHalf::K, KvHalf::V}) {
        INFO("layer " << l << " half " << (h == KvHalf::K ? "K" : "V"));
        CHECK(bitwise_equal(layer_rows(lo, ls, l, h), layer_rows(uni.store(), uni.sequence(), l, h)));
      }
    // Layer b: f32 rows that quantize to the uniform engine's layer-b rows.
    {
      const std::vector<float> k = layer_rows(hi, hs, 0, KvHalf::K), v = layer_rows(hi, hs, 0, KvHalf::V);
      PagedKvStore ref(uni.store().config());
      const SeqId rs = ref.create_sequence();
      ref.extend(rs, static_cast<int>(prompt.size()));
      const std::size_t row = static_cast<std::size_t>(c.n_kv_heads) * static_cast<std::size_t>(c.head_dim);
      ref.write(rs, b, 0, static_cast<int>(prompt.size()), k.data(), row, v.data(), row);
      for (KvHalf h : {KvHalf::K, KvHalf::V}) {
        INFO("layer " << b << " (the first f32 layer) half " << (h == KvHalf::K ? "K" : "V"));
        CHECK(bitwise_equal(layer_rows(ref, rs, b, h), layer_rows(uni.store(), uni.sequence(), b, h)));
      }
    }

    // The stats.
    const EngineStats& st = mapped.stats();
    CHECK(st.kv_layer_map == expected_map_name(f, b, n));
    CHECK(st.effective_kv == st.kv_layer_map);
    CHECK(parse_kv_layer_map(st.kv_layer_map, n) == o.kv_layers);
    REQUIRE(st.layer_kv.size() == static_cast<std::size_t>(n));
    REQUIRE(st.layer_kv_bytes_per_token.size() == static_cast<std::size_t>(n));
    std::size_t per_block = 0;
    for (int l = 0; l < n; ++l) {
      const KvFormat& lf = l < b ? f : f32;
      INFO("layer " << l);
      CHECK(st.layer_kv[static_cast<std::size_t>(l)] == lf.name());
      CHECK(st.layer_kv_bytes_per_token[static_cast<std::size_t>(l)] ==
            static_cast<double>(page_bytes(lf.k, g) + page_bytes(lf.v, g)) / 16.0);
      per_block += page_bytes(lf.k, g) + page_bytes(lf.v, g);
    }
    const std::size_t pages = (prompt.size() + 15) / 16;
    CHECK(st.kv_bytes == pages * per_block);
    CHECK(st.pipeline_stages == 1);  // a map is not a pipeline split
    CHECK(st.topology == "single");
  }
}

#define PAR_LAYER_MAP_CASE(id, preset)                                                       \
  TEST_CASE("PAR.layer_map." id " per-layer KV map: each boundary's stores, rows and stats", \
            "[gate:PAR][fmt:" preset "]") {                                                  \
    const KvFormat f = fmt_of(preset);                                                       \
    on_par_models(f == KvFormat{HalfFormat::f32, HalfFormat::f32} ? run_uniform_map : run_layer_map, f); \
  }
KVGATE_PRESETS(PAR_PRESET_ROW, PAR_LAYER_MAP_CASE)
#undef PAR_LAYER_MAP_CASE

}  // namespace

TEST_CASE("PAR.layer_map.options a map of the wrong length, a KV file of a mapped run, the pool budget of a map",
          "[gate:PAR][fmt:int8]") {
  const Model& m = stories();
  const int n = m.config.n_layers;
  const KvFormat i8{HalfFormat::int8, HalfFormat::int8}, f32{HalfFormat::f32, HalfFormat::f32};
  {
    EngineOptions o = options(m, i8);
    o.kv_layers.assign(static_cast<std::size_t>(n - 1), i8);
    CHECK_THROWS_WITH(Engine(m, o), kvgate_catch::contains("--kv-layers: one per layer"));
  }
  EngineOptions o = options(m, i8);
  for (int l = 0; l < n; ++l) o.kv_layers.push_back(l == 0 ? f32 : i8);
  {
    Engine e(m, o);
    const std::vector<int> prompt = joined_turns(m);
    e.prefill(prompt);
    TempDir t;
    const std::string path = t.file("mapped.kv");
    CHECK_THROWS_WITH(e.save_kv(path, {}), kvgate_catch::contains("--kv-layers 0:f32,1-4:int8"));
    CHECK(!std::filesystem::exists(path));  // nothing written
    // A file of the uniform engine does not hydrate into the mapped one.
    Engine uni(m, options(m, i8));
    uni.prefill(prompt);
    const std::string upath = t.file("uniform.kv");
    uni.save_kv(upath, {});
    const KvFile file = read_kv_file(upath);
    CHECK_THROWS_WITH(e.hydrate(file, prompt), kvgate_catch::contains("cannot be hydrated from a KV file"));
    CHECK(e.position() == static_cast<int>(prompt.size()));  // the live sequence untouched
  }
  // The budget: blocks = budget / the map's bytes per block.
  const PageGeometry g{16, m.config.n_kv_heads, m.config.head_dim};
  const std::size_t per_block = (page_bytes(HalfFormat::f32, g) * 2) + (n - 1) * (page_bytes(HalfFormat::int8, g) * 2);
  for (const std::size_t budget : {per_block * 7, per_block * 7 + per_block / 2, per_block * 3 - 1}) {
    EngineOptions ob = o;
    ob.kv_cache_memory = budget;
    INFO("budget " << budget);
    CHECK(make_store_config(m, ob, m.config.max_seq_len, "engine").n_blocks == static_cast<int>(budget / per_block));
    CHECK(static_cast<int>(budget / per_block) !=
          blocks_for_budget(i8, g, n, budget));  // the uniform int8 rule would buy more
  }
}
