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
//   PAR.layer_map.options    a map of the wrong length is refused; a byte budget buys budget / (the
//                            map's K + V page bytes over all layers) blocks.
//   PAR.layer_map.persist.<fmt>  a KV file of a mapped run (version 4: each layer's formats in its
//                            layer-formats region): the map <fmt> on layer 0, a second format on
//                            layer 1, f32 on the rest (runs whose token bytes differ, so
//                            every layer's region offsets differ from a one-format file's). Saved
//                            after a first part of the prompt, it hydrates a fresh mapped engine:
//                            every K/V row of every layer bitwise the saver's, and the rest of the
//                            prompt's logits bitwise the uninterrupted mapped run's. Through a
//                            pipeline split of the same map (other store boundaries) the same.
//                            Refused, naming both sides and nothing of the live sequence touched:
//                            the file into a run of another map, into the uniform <fmt> run, and a
//                            uniform file into the mapped run. Anti-vacuity: the file's body is
//                            not a one-format file's size, and the mapped logits differ from the
//                            uniform <fmt> run's.
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

// The persisted map: <fmt> on layer 0, a second format on layer 1, f32 on layers 2.. (the
// 2-layer synth model: <fmt>, then the second format).
// The second format is the first of q4_0, int8, f16 whose pages have another size than <fmt>'s,
// so that layer 1's region bytes differ from layer 0's.
KvLayerMap persist_map(const KvFormat& f, const ModelConfig& c) {
  const int n = c.n_layers;
  const PageGeometry g{16, c.n_kv_heads, c.head_dim};
  const auto bytes = [&](const KvFormat& x) { return page_bytes(x.k, g) + page_bytes(x.v, g); };
  KvFormat second{HalfFormat::f16, HalfFormat::f16};
  for (const HalfFormat h : {HalfFormat::q4_0, HalfFormat::int8})
    if (bytes({h, h}) != bytes(f)) {
      second = {h, h};
      break;
    }
  const KvFormat f32{HalfFormat::f32, HalfFormat::f32};
  KvLayerMap map;
  for (int l = 0; l < n; ++l) map.push_back(l == 0 ? f : l == 1 ? second : f32);
  return map;
}

void run_layer_map_persist(const Model& m, const KvFormat& f) {
  const int n = m.config.n_layers;
  INFO("model " << m.path << ", format " << f.name());
  REQUIRE(n >= 2);
  const std::vector<int> prompt = joined_turns(m);
  const std::size_t cut = prompt.size() / 2 + 3;  // inside a page and a prefill chunk
  REQUIRE(prompt.size() > cut + 2);
  const std::span<const int> first = std::span<const int>(prompt).first(cut), rest = std::span<const int>(prompt).subspan(cut);
  EngineOptions o = map_options(m, f);
  o.kv_layers = persist_map(f, m.config);
  const std::string map_name = kv_layer_map_name(o.kv_layers);
  INFO("map " << map_name);

  // The uninterrupted mapped run: the logits of every position of the rest.
  Engine live(m, o);
  (void)live.prefill(first);
  const std::vector<float> live_rest = live.forward_all_logits(rest);
  Engine uni(m, map_options(m, f));
  (void)uni.prefill(first);
  CHECK(!bitwise_equal(uni.forward_all_logits(rest), live_rest));  // the map is not the uniform run

  TempDir t;
  const std::string path = t.file("mapped.kvf");
  Engine saver(m, o);
  (void)saver.prefill(first);
  saver.save_kv(path);
  const KvFile file = read_kv_file(path);
  CHECK(file.header.version == kKvFileVersion);
  CHECK(file.header.layer_formats == o.kv_layers);
  CHECK(!file.header.uniform());
  CHECK(file.format_name() == "per-layer map " + map_name);
  CHECK(file.header.used_tokens == static_cast<int>(cut));
  {  // anti-vacuity: a one-format file of layer 0's format has other region sizes
    KvFileHeader one = file.header;
    one.layer_formats.clear();
    const KvRegionSizes a = kv_region_sizes(one);
    CHECK(a.body + a.scales != file.header.body_bytes + file.header.scales_bytes);
  }

  for (const int stages : {1, 2}) {
    INFO("hydrating engine with pipeline_stages " << stages);
    EngineOptions oh = o;
    oh.pipeline_stages = stages;
    Engine e(m, oh);
    REQUIRE(e.hydrate(file, prompt) == static_cast<int>(cut));
    CHECK(e.stats().hydrated_tokens == static_cast<int>(cut));
    // Every layer's rows, bitwise the saver's.
    for (int l = 0; l < n; ++l)
      for (KvHalf h : {KvHalf::K, KvHalf::V}) {
        INFO("layer " << l << " half " << (h == KvHalf::K ? "K" : "V"));
        int se = 0, ss = 0;
        while (e.stage_layers(se).second <= l) ++se;
        while (saver.stage_layers(ss).second <= l) ++ss;
        CHECK(bitwise_equal(layer_rows(e.stage_store(se), e.stage_sequence(se), l - e.stage_layers(se).first, h),
                            layer_rows(saver.stage_store(ss), saver.stage_sequence(ss), l - saver.stage_layers(ss).first, h)));
      }
    CHECK(bitwise_equal(e.forward_all_logits(rest), live_rest));
  }

  // Refusals: another map, the uniform run, a uniform file into the mapped run.
  auto refused = [&](Engine& e, const KvFile& kf, const std::string& file_side, const std::string& run_side) {
    (void)e.prefill(first.first(3));
    const std::string msg = [&] {
      try {
        e.hydrate(kf, prompt);
      } catch (const std::exception& x) {
        return std::string(x.what());
      }
      return std::string("(no refusal)");
    }();
    INFO(msg);
    CHECK_THAT(msg, kvgate_catch::contains("format " + file_side + " in the file, " + run_side + " in this run"));
    CHECK(e.position() == 3);  // the live sequence untouched
  };
  {
    EngineOptions other = o;
    const KvFormat f32{HalfFormat::f32, HalfFormat::f32}, bf16{HalfFormat::bf16, HalfFormat::bf16};
    other.kv_layers.back() = other.kv_layers.back() == f32 ? bf16 : f32;
    Engine e(m, other);
    const std::string other_name = kv_layer_map_uniform(other.kv_layers) ? other.kv_layers.front().name()
                                                                         : "per-layer map " + kv_layer_map_name(other.kv_layers);
    refused(e, file, "per-layer map " + map_name, other_name);
  }
  {
    Engine e(m, map_options(m, f));
    refused(e, file, "per-layer map " + map_name, f.name());
  }
  {
    const std::string upath = t.file("uniform.kvf");
    Engine us(m, map_options(m, f));
    (void)us.prefill(first);
    us.save_kv(upath);
    Engine e(m, o);
    refused(e, read_kv_file(upath), f.name(), "per-layer map " + map_name);
  }
}

#define PAR_LAYER_MAP_PERSIST_CASE(id, preset)                                                             \
  TEST_CASE("PAR.layer_map.persist." id " a KV file of a per-layer map hydrates bitwise; other maps refused", \
            "[gate:PAR][fmt:" preset "]") {                                                                \
    on_par_models(run_layer_map_persist, fmt_of(preset));                                                  \
  }
KVGATE_PRESETS(PAR_PRESET_ROW, PAR_LAYER_MAP_PERSIST_CASE)
#undef PAR_LAYER_MAP_PERSIST_CASE

}  // namespace

TEST_CASE("PAR.layer_map.options a map of the wrong length, the pool budget of a map",
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
