// STO.loader gates: the Hugging Face loader refuses every bad input with a ModelError that names
// the file and the field (never a crash), and synth -> load_hf round-trips shapes, values and the
// fingerprint deterministically. Also the byte-level BPE tokenizer the loader builds.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "catch_compat.hpp"
#include "fixtures.hpp"
#include "model_fixtures.hpp"
#include "limit_fixtures.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/limits.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/numeric.hpp"
#include "kvgate/tokenizer_bpe.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace fs = std::filesystem;

namespace {


std::string synth_tiny(const TempDir& t, const std::string& name, std::uint64_t seed = 7) {
  synth_hf(tiny_options(t.sub(name), seed));
  return t.sub(name);
}

// Edits the header of DIR/model.safetensors with `edit`, keeping the data section.
template <class F>
void edit_header(const std::string& dir, F&& edit) {
  const fs::path p = fs::path(dir) / "model.safetensors";
  StFile f = read_st(p);
  edit(f.header);
  write_st_raw(p, f);  // the header as edited: these gates damage offsets on purpose
}

// A valid checkpoint without one tensor (its bytes gone too, so the file still tiles).
void drop_tensor(const std::string& dir, const std::string& name) {
  const fs::path p = fs::path(dir) / "model.safetensors";
  StFile f = read_st(p);
  f.header.erase(name);
  write_st(p, f);
}

const char* const kUp = "model.layers.1.mlp.up_proj.weight";

}  // namespace

// ---- safetensors robustness ------------------------------------------------------------------------

TEST_CASE("STO.loader.truncated a file shorter than its header length field", "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string dir = synth_tiny(t, "m");
  const fs::path st = fs::path(dir) / "model.safetensors";
  const std::string bytes = read_bytes(st);
  for (std::size_t keep : {std::size_t{0}, std::size_t{5}, std::size_t{60}}) {
    write_bytes(st, bytes.substr(0, keep));
    const std::string msg = model_error([&] { load_hf(dir); });
    INFO("kept " << keep << " bytes: " << msg);
    CHECK(has(msg, st.string()));
    CHECK(has(msg, "truncated"));
    CHECK((has(msg, "header length") || has(msg, "8-byte")));
  }
}

TEST_CASE("STO.loader.truncated_data the data section cut short: offsets past the end", "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string dir = synth_tiny(t, "m");
  const fs::path st = fs::path(dir) / "model.safetensors";
  const std::string bytes = read_bytes(st);
  write_bytes(st, bytes.substr(0, bytes.size() - 100));
  const std::string msg = model_error([&] { load_hf(dir); });
  INFO(msg);
  CHECK(has(msg, st.string()));
  CHECK(has(msg, "data_offsets"));
  CHECK(has(msg, "past the end"));
  CHECK(has(msg, "lm_head.weight"));  // the last tensor in the data section
}

// The descriptor and mapping of a refused safetensors file are released: the loader's constructor
// refuses by throwing, and a descriptor held past it leaked one per refusal (the safetensors fuzzer
// ran out of descriptors after ~70,000 refused inputs, fuzz/crashes/safetensors). 200 refusals of
// every kind (too short, absurd header length, bad header JSON, offsets past the end) leave the
// process with the descriptors it had. Anti-vacuity: every one of them is refused.
TEST_CASE("STO.loader.refusal_releases_file a refused safetensors file leaves no descriptor open",
          "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string dir = synth_tiny(t, "m");
  const fs::path st = fs::path(dir) / "model.safetensors";
  const std::string good = read_bytes(st);
  auto open_fds = [] {
    long n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  std::string absurd = good;
  for (int i = 0; i < 8; ++i) absurd[static_cast<std::size_t>(i)] = static_cast<char>(i == 5 ? 1 : 0);
  std::string bad_json = good;
  bad_json[8] = '!';
  const std::vector<std::string> bad = {good.substr(0, 5), absurd, bad_json, good.substr(0, good.size() - 100)};
  const long before = open_fds();
  int refused = 0;
  for (int i = 0; i < 200; ++i) {
    write_bytes(st, bad[static_cast<std::size_t>(i) % bad.size()]);
    refused += model_error([&] { load_hf(dir); }) != "<no ModelError>";
  }
  const long after = open_fds();
  INFO("open descriptors before " << before << ", after 200 refusals " << after);
  CHECK(refused == 200);
  CHECK(after <= before);
}

TEST_CASE("STO.loader.header_length an absurd header length field", "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string dir = synth_tiny(t, "m");
  const fs::path st = fs::path(dir) / "model.safetensors";
  std::string bytes = read_bytes(st);
  const std::uint64_t absurd = 1ull << 40;
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((absurd >> (8 * i)) & 0xFF);
  write_bytes(st, bytes);
  const std::string msg = model_error([&] { load_hf(dir); });
  INFO(msg);
  CHECK(has(msg, st.string()));
  CHECK(has(msg, "header length"));
  CHECK(has(msg, "absurd"));
}

TEST_CASE("STO.loader.bad_header a header that is not JSON, or not the expected object", "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string dir = synth_tiny(t, "m");
  const fs::path st = fs::path(dir) / "model.safetensors";
  std::string bytes = read_bytes(st);
  bytes[8] = 'x';  // the header's opening brace
  write_bytes(st, bytes);
  std::string msg = model_error([&] { load_hf(dir); });
  INFO(msg);
  CHECK(has(msg, st.string()));
  CHECK(has(msg, "not valid JSON"));

  const std::string dir2 = synth_tiny(t, "m2");
  edit_header(dir2, [](nlohmann::json& h) { h[kUp].erase("data_offsets"); });
  msg = model_error([&] { load_hf(dir2); });
  INFO(msg);
  CHECK(has(msg, kUp));
  CHECK(has(msg, "data_offsets"));

  // Valid JSON of the wrong kind: an array of the same length as the original header.
  const std::string dir3 = synth_tiny(t, "m3");
  const fs::path st3 = fs::path(dir3) / "model.safetensors";
  std::string b3 = read_bytes(st3);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(b3[static_cast<std::size_t>(i)]);
  REQUIRE(n >= 2);
  REQUIRE(b3.size() >= 8 + n);
  b3.replace(8, n, "[" + std::string(n - 2, ' ') + "]");
  write_bytes(st3, b3);
  msg = model_error([&] { load_hf(dir3); });
  INFO(msg);
  CHECK(has(msg, st3.string()));
  CHECK(has(msg, "not a JSON object"));
}

TEST_CASE("STO.loader.offsets data_offsets past the end of the data section", "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string dir = synth_tiny(t, "m");
  edit_header(dir, [](nlohmann::json& h) {
    const std::uint64_t b = h[kUp]["data_offsets"][0].get<std::uint64_t>() + (1ull << 30);
    const std::uint64_t e = h[kUp]["data_offsets"][1].get<std::uint64_t>() + (1ull << 30);
    h[kUp]["data_offsets"] = {b, e};
  });
  const std::string msg = model_error([&] { load_hf(dir); });
  INFO(msg);
  CHECK(has(msg, "model.safetensors"));
  CHECK(has(msg, kUp));
  CHECK(has(msg, "data_offsets"));
  CHECK(has(msg, "past the end"));
}

TEST_CASE("STO.loader.span data_offsets that disagree with dtype x shape", "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string dir = synth_tiny(t, "m");
  edit_header(dir, [](nlohmann::json& h) { h[kUp]["dtype"] = "F16"; });  // the bytes are F32
  const std::string msg = model_error([&] { load_hf(dir); });
  INFO(msg);
  CHECK(has(msg, kUp));
  CHECK(has(msg, "data_offsets"));
  CHECK(has(msg, "F16"));
}

TEST_CASE("STO.loader.tiling overlapping tensors, holes and trailing bytes in the data section refused",
          "[gate:STO][fmt:none]") {
  // The safetensors reference refuses a data section its tensors do not tile exactly (each begins
  // where the previous ends, the last ends at the end of the file); the loader must too: an alias
  // or a hole means a header edited by hand, and an overlap reads one tensor's bytes as another's.
  TempDir t;
  const std::string dir = synth_tiny(t, "m");
  REQUIRE_NOTHROW(load_hf(dir));  // anti-vacuity: the untouched file loads
  const fs::path p = fs::path(dir) / "model.safetensors";
  const StFile good = read_st(p);
  const std::string down = "model.layers.1.mlp.down_proj.weight";
  REQUIRE(good.header.contains(down));
  struct Case {
    const char* what;
    std::function<void(StFile&)> damage;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"one tensor moved back by one element onto its neighbour",
       [&](StFile& f) {
         auto& o = f.header[kUp]["data_offsets"];
         o = {o[0].get<std::uint64_t>() - 4, o[1].get<std::uint64_t>() - 4};
       },
       "overlaps tensor"},
      {"a second name aliasing the bytes of up_proj",
       [&](StFile& f) { f.header["model.extra.weight"] = f.header[kUp]; }, "overlaps tensor"},
      {"a tensor erased from the header, its bytes left behind",
       [&](StFile& f) { f.header.erase(kUp); }, "hole of"},
      {"eight bytes appended after the last tensor", [&](StFile& f) { f.data += std::string(8, '\0'); },
       "trailing bytes"},
  };
  for (const Case& c : cases) {
    StFile f = good;
    c.damage(f);
    write_st_raw(p, f);
    const std::string msg = model_error([&] { load_hf(dir); });
    INFO(c.what << ": " << msg);
    CHECK(has(msg, p.string()));
    CHECK(has(msg, c.expect));
    if (std::string(c.expect) != "trailing bytes") CHECK(has(msg, "data_offsets"));
  }
  write_st_raw(p, good);
  CHECK_NOTHROW(load_hf(dir));  // and the restored file loads again
}

TEST_CASE("STO.loader.missing_tensor a tensor the config implies is absent", "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string dir = synth_tiny(t, "m");
  drop_tensor(dir, kUp);
  std::string msg = model_error([&] { load_hf(dir); });
  INFO(msg);
  CHECK(has(msg, "model.safetensors"));
  CHECK(has(msg, "missing tensor"));
  CHECK(has(msg, kUp));

  // An untied model without lm_head.weight.
  const std::string dir2 = synth_tiny(t, "m2");
  drop_tensor(dir2, "lm_head.weight");
  msg = model_error([&] { load_hf(dir2); });
  INFO(msg);
  CHECK(has(msg, "lm_head.weight"));
  CHECK(has(msg, "tie_word_embeddings"));
}

TEST_CASE("STO.loader.shape a tensor whose shape disagrees with config.json", "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string dir = synth_tiny(t, "m");
  edit_header(dir, [](nlohmann::json& h) {  // same element count, transposed
    const auto s = h[kUp]["shape"];
    h[kUp]["shape"] = {s[1], s[0]};
  });
  std::string msg = model_error([&] { load_hf(dir); });
  INFO(msg);
  CHECK(has(msg, "model.safetensors"));
  CHECK(has(msg, kUp));
  CHECK(has(msg, "'shape'"));
  CHECK(has(msg, "[48, 32]"));  // what config.json implies

  // The other way round: config.json changed under the weights.
  const std::string dir2 = synth_tiny(t, "m2");
  auto cj = read_json_file(fs::path(dir2) / "config.json");
  cj["intermediate_size"] = 64;
  write_json_file(fs::path(dir2) / "config.json", cj);
  msg = model_error([&] { load_hf(dir2); });
  INFO(msg);
  CHECK(has(msg, "gate_proj"));
  CHECK(has(msg, "[64, 32]"));
}

TEST_CASE("STO.loader.dtype unknown and unsupported dtypes", "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string dir = synth_tiny(t, "m");
  edit_header(dir, [](nlohmann::json& h) { h[kUp]["dtype"] = "Q7"; });
  std::string msg = model_error([&] { load_hf(dir); });
  INFO(msg);
  CHECK(has(msg, "model.safetensors"));
  CHECK(has(msg, kUp));
  CHECK(has(msg, "'dtype'"));
  CHECK(has(msg, "Q7"));

  const std::string dir2 = synth_tiny(t, "m2");
  edit_header(dir2, [](nlohmann::json& h) { h[kUp]["dtype"] = "I32"; });  // same byte size, not a float
  msg = model_error([&] { load_hf(dir2); });
  INFO(msg);
  CHECK(has(msg, kUp));
  CHECK(has(msg, "I32"));
  CHECK(has(msg, "F32, F16 and BF16"));
}

// ---- config.json / directory robustness ---------------------------------------------------------

TEST_CASE("STO.loader.rope_parameters transformers 5 RoPE settings are read, not defaulted", "[gate:STO][fmt:none]") {
  // transformers >= 5 writes rope_parameters {rope_type, rope_theta} instead of top-level rope_theta:
  // a loader that ignores it runs theta 10000 on a model trained with another theta, silently.
  TempDir t;
  const std::string dir = synth_tiny(t, "r");
  auto cj = read_json_file(fs::path(dir) / "config.json");
  cj.erase("rope_theta");
  cj["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  write_json_file(fs::path(dir) / "config.json", cj);
  CHECK(load_hf(dir).config.rope_theta == 500000.0f);
  // Anti-vacuity: the same model with the top-level key reads the same theta.
  const std::string dir2 = synth_tiny(t, "r2");
  auto cj2 = read_json_file(fs::path(dir2) / "config.json");
  cj2["rope_theta"] = 500000.0;
  write_json_file(fs::path(dir2) / "config.json", cj2);
  CHECK(load_hf(dir2).config.rope_theta == 500000.0f);
  // A RoPE type kvgate does not implement is refused with the field named.
  cj["rope_parameters"] = {{"rope_type", "proportional"}, {"rope_theta", 500000.0}, {"factor", 4.0}};
  write_json_file(fs::path(dir) / "config.json", cj);
  const std::string msg = model_error([&] { load_hf(dir); });
  INFO(msg);
  CHECK(has(msg, "rope_parameters"));
  CHECK(has(msg, "proportional"));
}

TEST_CASE("STO.loader.config bad config.json fields are named", "[gate:STO][fmt:none]") {
  TempDir t;
  struct Case {
    const char* field;
    nlohmann::json value;  // null: erase
    const char* expect;
  };
  const Case cases[] = {
      {"hidden_size", nullptr, "'hidden_size' is missing"},
      {"num_hidden_layers", -3, "'num_hidden_layers'"},
      {"num_key_value_heads", 3, "'num_key_value_heads'"},
      {"architectures", nlohmann::json::array({"GPT2LMHeadModel"}), "GPT2LMHeadModel"},
      {"hidden_act", "gelu", "'hidden_act'"},
      {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}, "'rope_scaling.low_freq_factor' is missing"},
      {"vocab_size", "many", "'vocab_size' is not an integer"},
  };
  const char* const names[] = {"m0", "m1", "m2", "m3", "m4", "m5", "m6"};
  int k = 0;
  for (const Case& c : cases) {
    const std::string dir = synth_tiny(t, names[k++]);
    auto cj = read_json_file(fs::path(dir) / "config.json");
    if (c.value.is_null())
      cj.erase(c.field);
    else
      cj[c.field] = c.value;
    write_json_file(fs::path(dir) / "config.json", cj);
    const std::string msg = model_error([&] { load_hf(dir); });
    INFO(c.field << ": " << msg);
    CHECK(has(msg, dir + "/config.json"));
    CHECK(has(msg, c.expect));
  }
  // Not JSON at all / no config / not a directory / no weights.
  const std::string dir = synth_tiny(t, "x");
  write_bytes(fs::path(dir) / "config.json", "{\"hidden_size\": 3");
  CHECK(has(model_error([&] { load_hf(dir); }), "not valid JSON"));
  fs::remove(fs::path(dir) / "config.json");
  CHECK(has(model_error([&] { load_hf(dir); }), "no config.json"));
  CHECK(has(model_error([&] { load_hf(dir + "/tokenizer.json"); }), "not a directory"));
  const std::string dir2 = synth_tiny(t, "y");
  fs::remove(fs::path(dir2) / "model.safetensors");
  CHECK(has(model_error([&] { load_hf(dir2); }), "no model.safetensors"));
}

TEST_CASE("STO.loader.sharded index errors name the index and the shard", "[gate:STO][fmt:none]") {
  TempDir t;
  SynthOptions o = tiny_options(t.sub("s"));
  o.shards = 3;
  synth_hf(o);
  const fs::path dir(o.out);
  REQUIRE(fs::exists(dir / "model-00003-of-00003.safetensors"));
  REQUIRE_NOTHROW(load_hf(o.out));

  auto idx = read_json_file(dir / "model.safetensors.index.json");
  const std::string shard = idx["weight_map"][kUp].get<std::string>();
  auto broken = idx;
  broken["weight_map"].erase(kUp);
  write_json_file(dir / "model.safetensors.index.json", broken);
  std::string msg = model_error([&] { load_hf(o.out); });
  INFO(msg);
  CHECK(has(msg, "model.safetensors.index.json"));
  CHECK(has(msg, kUp));

  write_json_file(dir / "model.safetensors.index.json", idx);
  fs::remove(dir / shard);
  msg = model_error([&] { load_hf(o.out); });
  INFO(msg);
  CHECK(has(msg, "model.safetensors.index.json"));
  CHECK(has(msg, shard));

  broken = idx;
  broken["weight_map"][kUp] = "../../etc/passwd";
  write_json_file(dir / "model.safetensors.index.json", broken);
  CHECK(has(model_error([&] { load_hf(o.out); }), "not a plain file name"));
}

TEST_CASE("STO.loader.kv_scales per-layer k_scale/v_scale are read, partial sets refused", "[gate:STO][fmt:fp8]") {
  TempDir t;
  SynthOptions o = tiny_options(t.sub("s"));
  o.kv_algo = "FP8";
  o.kv_scale = 0.5f;
  synth_hf(o);
  const Model m = load_hf(o.out);
  REQUIRE(m.config.k_scale.size() == 2);
  REQUIRE(m.config.v_scale.size() == 2);
  CHECK(m.config.k_scale[0] == 0.5f);
  CHECK(m.config.v_scale[1] == 0.5f);
  CHECK(load_hf(synth_tiny(t, "noscale")).config.k_scale.empty());

  drop_tensor(o.out, "model.layers.1.self_attn.v_scale");
  const std::string msg = model_error([&] { load_hf(o.out); });
  INFO(msg);
  CHECK(has(msg, "v_scale"));
  CHECK(has(msg, "incomplete"));
}

TEST_CASE("STO.loader.kv_head_scales [n_kv_heads] k_scale/v_scale are read per head; a wrong shape or a value <= 0, "
          "NaN or inf is refused naming the file, the tensor and the fix",
          "[gate:STO][fmt:fp8]") {
  TempDir t;
  SynthOptions o = tiny_options(t.sub("h"));
  o.kv_algo = "FP8";
  o.kv_scale = 0.5f;
  o.kv_scale_per_head = true;  // layer i head h: K = 0.5 (1 + i/8)(1 + h/4), V = 0.75 K
  synth_hf(o);
  const Model m = load_hf(o.out);
  const int H = o.kv_heads;
  REQUIRE(m.config.k_scale.size() == static_cast<std::size_t>(o.layers * H));
  REQUIRE(m.config.v_scale.size() == static_cast<std::size_t>(o.layers * H));
  for (int i = 0; i < o.layers; ++i)
    for (int h = 0; h < H; ++h) {
      const float k = 0.5f * (1.0f + 0.125f * static_cast<float>(i)) * (1.0f + 0.25f * static_cast<float>(h));
      const float v = 0.5f * 0.75f * (1.0f + 0.125f * static_cast<float>(i)) * (1.0f + 0.25f * static_cast<float>(h));
      CHECK(m.config.k_scale[static_cast<std::size_t>(i * H + h)] == k);
      CHECK(m.config.v_scale[static_cast<std::size_t>(i * H + h)] == v);
    }
  // The engine's store holds them per head, and a scalar checkpoint fills every head.
  {
    Engine e(m, resolved_engine_options(m, KvFormat{HalfFormat::fp8_e4m3, HalfFormat::fp8_e4m3}, 16, 64));
    CHECK(e.store().per_head_scales());
    CHECK(e.store().head_scales(1, KvHalf::V)[1] == m.config.v_scale[3]);
    SynthOptions os = tiny_options(t.sub("scalar"));
    os.kv_algo = "FP8";
    os.kv_scale = 0.5f;
    synth_hf(os);
    const Model ms = load_hf(os.out);
    REQUIRE(ms.config.k_scale.size() == static_cast<std::size_t>(os.layers));
    Engine es(ms, resolved_engine_options(ms, KvFormat{HalfFormat::fp8_e4m3, HalfFormat::fp8_e4m3}, 16, 64));
    CHECK_FALSE(es.store().per_head_scales());
    for (int h = 0; h < H; ++h) CHECK(es.store().head_scales(1, KvHalf::K)[static_cast<std::size_t>(h)] == 0.5f);
  }
  const fs::path st = fs::path(o.out) / "model.safetensors";
  const StFile good = read_st(st);
  const std::string name = "model.layers.1.self_attn.k_scale";
  {  // shape [1, H]: neither a scalar nor [n_kv_heads]
    StFile f = good;
    f.header[name]["shape"] = {1, H};
    write_st(st, f);
    const std::string msg = model_error([&] { load_hf(o.out); });
    INFO(msg);
    CHECK(has(msg, "model.safetensors"));
    CHECK(has(msg, name));
    CHECK(has(msg, "field 'shape' = [1, 2]"));
    CHECK(has(msg, "one scale per KV head ([2]"));
  }
  const float bad_values[] = {0.0f, -0.25f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()};
  for (float bad : bad_values) {
    StFile f = good;
    const auto off = f.header[name]["data_offsets"][0].get<std::size_t>() + 4;  // head 1
    std::memcpy(f.data.data() + off, &bad, 4);
    write_st(st, f);
    const std::string msg = model_error([&] { load_hf(o.out); });
    INFO(msg);
    CHECK(has(msg, "model.safetensors"));
    CHECK(has(msg, name + "' element 1 (KV head 1)"));
    CHECK(has(msg, "not a positive finite KV scale"));
  }
  write_st(st, good);
  CHECK_NOTHROW(load_hf(o.out));
}

TEST_CASE("STO.loader.tokenizer a broken tokenizer.json is named", "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string dir = synth_tiny(t, "m");
  const fs::path tp = fs::path(dir) / "tokenizer.json";
  auto tj = read_json_file(tp);
  write_bytes(tp, "{");
  CHECK(has(model_error([&] { load_hf(dir); }), "tokenizer.json"));
  auto bad = tj;
  bad["model"]["byte_fallback"] = true;
  write_json_file(tp, bad);
  CHECK(has(model_error([&] { load_hf(dir); }), "byte_fallback"));
  bad = tj;
  bad["model"]["merges"][3] = 17;
  write_json_file(tp, bad);
  CHECK(has(model_error([&] { load_hf(dir); }), "model.merges[3]"));
  fs::remove(tp);
  const Model m = load_hf(dir);  // the tokenizer is optional
  CHECK(m.tokenizer == nullptr);
}

// ---- synth -> load round trip ------------------------------------------------------------------------

namespace {
double stddev(const std::vector<float>& v) {
  double s = 0, s2 = 0;
  for (float x : v) {
    s += x;
    s2 += double(x) * x;
  }
  const double n = static_cast<double>(v.size());
  return std::sqrt(s2 / n - (s / n) * (s / n));
}
}  // namespace

TEST_CASE("STO.synth.roundtrip shapes and config of every architecture", "[gate:STO][fmt:none]") {
  TempDir t;
  for (const char* arch : {"llama", "mistral", "qwen2", "qwen3"}) {
    INFO(arch);
    SynthOptions o = tiny_options(t.sub(arch));
    o.arch = arch;
    o.hidden = 64;
    o.heads = 4;
    o.kv_heads = 2;
    o.head_dim = 32;  // != hidden / heads, as Qwen3 does
    o.ffn = 96;
    o.layers = 3;
    o.vocab = 400;
    o.max_seq_len = 333;
    const SynthResult sr = synth_hf(o);
    const Model m = load_hf(o.out);
    const ModelConfig& c = m.config;
    CHECK(m.source_kind == "hf");
    CHECK(c.arch == arch);
    CHECK(c.dim == 64);
    CHECK(c.hidden_dim == 96);
    CHECK(c.n_layers == 3);
    CHECK(c.n_heads == 4);
    CHECK(c.n_kv_heads == 2);
    CHECK(c.head_dim == 32);
    CHECK(c.vocab_size == 400);
    CHECK(c.max_seq_len == 333);
    CHECK(c.rope_style == RopeStyle::half);
    CHECK(c.qkv_bias == (std::string(arch) == "qwen2"));
    CHECK(c.qk_norm == (std::string(arch) == "qwen3"));
    CHECK_FALSE(c.tied_embeddings);
    CHECK(c.bos_id == 398);
    CHECK(c.eos_id == 399);
    CHECK(c.rope_theta == (std::string(arch).rfind("qwen", 0) == 0 ? 1e6f : 1e4f));
    const LayerWeights& L = m.weights.layers.at(2);
    CHECK(L.wq.size() == 128u * 64u);
    CHECK(L.wk.size() == 64u * 64u);
    CHECK(L.wo.size() == 64u * 128u);
    CHECK(L.w2.size() == 64u * 96u);
    CHECK(L.bq.size() == (c.qkv_bias ? 128u : 0u));
    CHECK(L.q_norm.size() == (c.qk_norm ? 32u : 0u));
    CHECK(m.weights.classifier.size() == 400u * 64u);
    CHECK(L.attn_norm == std::vector<float>(64, 1.0f));
    // N(0, 1/sqrt(fan_in)): the standard deviation within a few percent.
    CHECK(std::abs(stddev(L.w1) / (1.0 / std::sqrt(64.0)) - 1.0) < 0.05);
    CHECK(std::abs(stddev(L.w2) / (1.0 / std::sqrt(96.0)) - 1.0) < 0.05);
    CHECK(std::abs(stddev(m.weights.tok_embeddings) - 1.0) < 0.05);
    // Parameter count = every float loaded.
    std::uint64_t n = m.weights.tok_embeddings.size() + m.weights.final_norm.size() + m.weights.classifier.size();
    for (const auto& l : m.weights.layers)
      n += l.attn_norm.size() + l.wq.size() + l.wk.size() + l.wv.size() + l.wo.size() + l.bq.size() + l.bk.size() +
           l.bv.size() + l.q_norm.size() + l.k_norm.size() + l.ffn_norm.size() + l.w1.size() + l.w2.size() +
           l.w3.size();
    CHECK(n == sr.n_params);
    REQUIRE(m.tokenizer != nullptr);
    CHECK(m.tokenizer->vocab_size() == 400);
    CHECK(m.tokenizer->bos_id() == 398);
  }
  SynthOptions o = tiny_options(t.sub("tied"));
  o.tie_embeddings = true;
  synth_hf(o);
  const Model m = load_hf(o.out);
  CHECK(m.config.tied_embeddings);
  CHECK(m.weights.classifier.empty());
  {  // deepseek_v3: MLA without q LoRA, every layer dense; the loader's widths and shapes
    SynthOptions d = tiny_options(t.sub("deepseek_v3"));
    d.arch = "deepseek_v3";
    d.hidden = 64;
    d.heads = 3;
    d.ffn = 96;
    d.layers = 2;
    d.kv_lora_rank = 256;
    d.qk_rope_head_dim = 16;
    d.qk_nope_head_dim = 24;
    d.v_head_dim = 20;
    const SynthResult sr = synth_hf(d);
    const Model dm = load_hf(d.out);
    const ModelConfig& c = dm.config;
    CHECK(c.arch == "deepseek_v3");
    CHECK(c.mla.kv_lora_rank == 256);
    CHECK(c.mla.q_lora_rank == 0);
    CHECK(c.mla.rope_dim == 16);
    CHECK(c.mla.nope_dim == 24);
    CHECK(c.mla.v_dim == 20);
    CHECK(c.head_dim == 40);
    CHECK(c.n_heads == 3);
    CHECK(c.n_kv_heads == 3);
    CHECK(c.moe.layer_moe == std::vector<std::uint8_t>(2, 0));  // dense: no router runs
    const LayerWeights& L = dm.weights.layers.at(1);
    CHECK(L.wq.size() == 3u * 40u * 64u);
    CHECK(L.wkv_a.size() == (256u + 16u) * 64u);
    CHECK(L.kv_a_norm == std::vector<float>(256, 1.0f));
    CHECK(L.wkv_b.size() == 3u * (24u + 20u) * 256u);
    CHECK(L.wo.size() == 64u * 3u * 20u);
    CHECK(std::abs(stddev(L.wkv_b) / (1.0 / std::sqrt(256.0)) - 1.0) < 0.05);
    std::uint64_t n = dm.weights.tok_embeddings.size() + dm.weights.final_norm.size() + dm.weights.classifier.size();
    for (const auto& l : dm.weights.layers)
      n += l.attn_norm.size() + l.wq.size() + l.wkv_a.size() + l.kv_a_norm.size() + l.wkv_b.size() + l.wo.size() +
           l.ffn_norm.size() + l.w1.size() + l.w2.size() + l.w3.size();
    CHECK(n == sr.n_params);
    // A RoPE width the loader cannot rotate is refused by the generator, naming the flag.
    SynthOptions bad = d;
    bad.qk_rope_head_dim = 15;
    bad.out = t.sub("deepseek_bad");
    std::string msg;
    try {
      synth_hf(bad);
    } catch (const std::invalid_argument& e) {
      msg = e.what();
    }
    CHECK(msg.find("--qk-rope-head-dim") != std::string::npos);
  }
}

TEST_CASE("STO.synth.determinism same seed -> same bytes and fingerprint, other seed -> different",
          "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string a = synth_tiny(t, "a", 11), b = synth_tiny(t, "b", 11), c = synth_tiny(t, "c", 12);
  CHECK(read_bytes(fs::path(a) / "model.safetensors") == read_bytes(fs::path(b) / "model.safetensors"));
  CHECK(read_bytes(fs::path(a) / "tokenizer.json") == read_bytes(fs::path(b) / "tokenizer.json"));
  const Model ma = load_hf(a), mb = load_hf(b), mc = load_hf(c);
  CHECK(ma.fingerprint.size() == 16);
  CHECK(ma.fingerprint == mb.fingerprint);
  CHECK(ma.fingerprint != mc.fingerprint);
  // Sharding changes the files, not the model.
  SynthOptions o = tiny_options(t.sub("sharded"), 11);
  o.shards = 4;
  synth_hf(o);
  CHECK(load_hf(o.out).fingerprint == ma.fingerprint);
  // Pinned values (cross-checked against an independent Python xoshiro256** + libm Box-Muller):
  // the generator is defined by its arithmetic, not by the platform's libm.
  SynthRng rng(42);
  float v[4];
  synth_normals(rng, 1.0f, v, 4);
  std::uint32_t bits[4];
  std::memcpy(bits, v, sizeof bits);
  INFO(std::hex << bits[0] << " " << bits[1] << " " << bits[2] << " " << bits[3]);
  CHECK(bits[0] == 0xbe9b454cu);
  CHECK(bits[1] == 0x3e93b142u);
  CHECK(bits[2] == 0x3fac0206u);
  CHECK(bits[3] == 0xbf301f24u);
}

namespace {
// Tensors past one generator chunk (2^20 elements): the embedding and the classifier hold
// 8200 x 256 = 2,099,200 elements, two whole chunks and a partial third of 2048.
SynthOptions multi_chunk_options(const std::string& out, int threads) {
  SynthOptions o = wide_embedding_options(8200);
  o.seed = 3;
  o.max_seq_len = 128;
  o.out = out;
  o.threads = threads;
  return o;
}
constexpr std::size_t kChunk = std::size_t{1} << 20;
constexpr std::size_t kEmbed = 8200u * 256u;
}  // namespace

TEST_CASE("STO.synth.threads the bytes do not depend on the thread count; each chunk has its own stream",
          "[gate:STO][fmt:bf16]") {
  TempDir t;
  // Bound: exact. The generator is defined per chunk, so 1 and 3 threads (and 3 threads with a
  // sharded layout) must give byte-identical files.
  for (const char* dt : {"bf16", "f32"}) {
    INFO(dt);
    SynthOptions a = multi_chunk_options(t.sub(std::string(dt) + "_t1"), 1), b = multi_chunk_options(t.sub(std::string(dt) + "_t3"), 3);
    a.dtype = b.dtype = dt;
    synth_hf(a);
    synth_hf(b);
    const std::string fa = read_bytes(fs::path(a.out) / "model.safetensors");
    const std::string fb = read_bytes(fs::path(b.out) / "model.safetensors");
    REQUIRE(fa.size() > 2 * kEmbed * (std::string(dt) == "f32" ? 4 : 2));  // anti-vacuity: several chunks
    CHECK(fa == fb);
  }
  // Values: chunk 1 of the embedding is a fresh stream (not chunk 0 again), every chunk has the
  // declared N(0, 1) spread, and the partial last chunk is filled.
  const Model m = load_hf(t.sub("f32_t1"));
  const std::vector<float>& e = m.weights.tok_embeddings;
  REQUIRE(e.size() == kEmbed);
  CHECK_FALSE(std::equal(e.begin(), e.begin() + 4096, e.begin() + static_cast<std::ptrdiff_t>(kChunk)));
  for (std::size_t c = 0; c < 3; ++c) {
    INFO("chunk " << c);
    const std::size_t b = c * kChunk, n = std::min(kChunk, kEmbed - b);
    CHECK(std::abs(stddev(std::vector<float>(e.begin() + static_cast<std::ptrdiff_t>(b),
                                             e.begin() + static_cast<std::ptrdiff_t>(b + n))) - 1.0) < (c < 2 ? 0.01 : 0.1));
  }
  // Pinned values (an independent Python xoshiro256** + libm Box-Muller with the chunk seeding
  // splitmix64(splitmix64(seed ^ FNV-1a(name)) ^ k * 0xD1B54A32D192ED03)): the first two values of
  // chunks 0, 1 and 2 of model.embed_tokens.weight at seed 3.
  const std::pair<std::size_t, std::uint32_t> pins[] = {{0, 0x3fa3a1bau},          {1, 0x3e60e911u},
                                                        {kChunk, 0x3f27e0a3u},     {kChunk + 1, 0xbfc4c8f7u},
                                                        {2 * kChunk, 0xbe4b3c22u}, {2 * kChunk + 1, 0x3d81aaf8u}};
  for (const auto& [i, bits] : pins) {
    std::uint32_t got;
    std::memcpy(&got, &e[i], 4);
    INFO("element " << i << ": " << std::hex << got);
    CHECK(got == bits);
  }
  // A tensor of at most one chunk keeps the values of the single-stream generator of earlier
  // releases: the fingerprint (XXH64 of the config and of every f32 weight) of the tiny model as
  // that generator wrote it (kvgate of a994852, `kvgate run --json`).
  CHECK(load_hf(synth_tiny(t, "tiny")).fingerprint == "3230dbb59628e4ce");
}

TEST_CASE("STO.loader.half_convert loaded f16/bf16 weights are the stored values, for any thread split",
          "[gate:STO][fmt:f16][fmt:bf16]") {
  TempDir t;
  // Bound: exact (a widening conversion). Reference: each stored 16-bit word through the scalar
  // bf16_to_f32 / f16_to_f32, read from the file's own bytes.
  for (const char* dt : {"bf16", "f16"}) {
    INFO(dt);
    const bool bf = std::string(dt) == "bf16";
    SynthOptions o = multi_chunk_options(t.sub(dt), 0);
    o.dtype = dt;
    synth_hf(o);
    const StFile f = read_st(fs::path(o.out) / "model.safetensors");
    const Model m = load_hf(o.out, WeightStorage::f32);  // the conversion path (as stored: STO.loader.weights_as_stored)
    for (const auto& [name, got] : {std::pair<const char*, const Weight*>{"model.embed_tokens.weight", &m.weights.tok_embeddings},
                                    {"lm_head.weight", &m.weights.classifier},
                                    {"model.layers.0.mlp.down_proj.weight", &m.weights.layers[0].w2}}) {
      INFO(name);
      const std::size_t off = f.header.at(name).at("data_offsets").at(0).get<std::size_t>();
      const std::size_t n = got->size();
      REQUIRE(f.header.at(name).at("data_offsets").at(1).get<std::size_t>() - off == 2 * n);
      std::vector<float> ref(n);
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, f.data.data() + off + 2 * i, 2);
        ref[i] = bf ? bf16_to_f32(h) : f16_to_f32(h);
      }
      CHECK(std::memcmp(ref.data(), got->data(), n * 4) == 0);
      // The bulk conversion itself with 1 and 3 threads, from an odd address (no alignment assumed).
      std::string odd(1, '\0');
      odd.append(f.data, off, 2 * n);
      for (int threads : {1, 3}) {
        std::vector<float> out(n, -1.0f);
        half_to_f32_bulk(odd.data() + 1, bf, out.data(), n, threads);
        INFO(threads << " threads");
        CHECK(std::memcmp(ref.data(), out.data(), n * 4) == 0);
      }
    }
    CHECK(m.weights.tok_embeddings.size() > 2 * kChunk);  // anti-vacuity: several conversion pieces
  }
}

TEST_CASE("STO.synth.dtypes f16 and bf16 files hold the RNE-rounded f32 weights", "[gate:STO][fmt:f16][fmt:bf16]") {
  TempDir t;
  const Model ref = load_hf(synth_tiny(t, "f32", 5));
  for (const char* dt : {"f16", "bf16"}) {
    INFO(dt);
    SynthOptions o = tiny_options(t.sub(dt), 5);
    o.dtype = dt;
    synth_hf(o);
    const Model m = load_hf(o.out);
    const bool bf = std::string(dt) == "bf16";
    REQUIRE(m.weights.layers[1].w3.dtype() == (bf ? WeightDtype::bf16 : WeightDtype::f16));  // kept as stored
    auto rounded = [&](float x) { return bf ? bf16_to_f32(f32_to_bf16_rne(x)) : f16_to_f32(f32_to_f16_rne(x)); };
    std::size_t bad = 0;
    const auto& a = ref.weights.layers[1].w3;
    const auto& b = m.weights.layers[1].w3;
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) bad += rounded(a[i]) != b.at(i);
    CHECK(bad == 0);
    CHECK(m.fingerprint != ref.fingerprint);
  }
}

// ---- tokenizer ---------------------------------------------------------------------------------------

TEST_CASE("STO.tokenizer.roundtrip byte-level BPE decodes to the exact input bytes", "[gate:STO][fmt:none]") {
  TempDir t;
  for (const char* arch : {"llama", "qwen2"}) {
    SynthOptions o = tiny_options(t.sub(arch));
    o.arch = arch;
    o.vocab = 1000;
    synth_hf(o);
    const Model m = load_hf(o.out);
    REQUIRE(m.tokenizer);
    const Tokenizer& tk = *m.tokenizer;
    const std::string texts[] = {"The cache keeps the keys and the values of every token.",
                                 "  two spaces, a tab\tand\nnew\r\nlines\n\n\n",
                                 "numbers 1234567 and 3.14159; it's THEY'RE we'll",
                                 "UTF-8: caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80!",
                                 "invalid \xFF\xFE bytes pass through",
                                 ""};
    for (const std::string& s : texts) {
      INFO(arch << ": " << s);
      // Llama 3's tokenizer adds BOS; Qwen2's adds none although its config declares one.
      const std::vector<int> ids = tk.encode(s, true);
      CHECK(tk.adds_bos() == (std::string(arch) == "llama"));
      const std::size_t first = tk.adds_bos() ? 1 : 0;
      REQUIRE(ids.size() >= first);
      if (first) CHECK(ids[0] == tk.bos_id());
      CHECK(std::vector<int>(ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end()) == tk.encode(s, false));
      std::string back;
      for (std::size_t i = first; i < ids.size(); ++i) {
        CHECK(ids[i] >= 0);
        CHECK(ids[i] < tk.vocab_size());
        back += tk.decode_piece(i ? ids[i - 1] : -1, ids[i]);
      }
      CHECK(back == s);
    }
    // Merges are applied: common English compresses well below one token per byte.
    const std::string en = "the cache keeps the keys and the values";
    CHECK(tk.encode(en, false).size() < en.size() / 2);
    // Special tokens in the text are single ids.
    const std::vector<int> sp = tk.encode("a<|end_of_text|>b", false);
    REQUIRE(sp.size() == 3);
    CHECK(sp[1] == tk.eos_id());
  }
}

TEST_CASE("STO.tokenizer.pretokenize hand-written splitter matches the published regexes", "[gate:STO][fmt:none]") {
  // Expected pieces computed with the reference patterns (Python `regex` module).
  using V = std::vector<std::string>;
  const std::string s = "Hello world's 12345 !!\n\n  x\tI'M ok...yes  ";
  CHECK(pre_tokenize(s, PreTokenizer::llama3) ==
        V{"Hello", " world", "'s", " ", "123", "45", " !!\n\n", " ", " x", "\tI", "'M", " ok", "...", "yes", "  "});
  CHECK(pre_tokenize(s, PreTokenizer::qwen2) ==
        V{"Hello", " world", "'s", " ", "1", "2", "3", "4", "5", " !!\n\n", " ", " x", "\tI", "'M", " ok", "...", "yes",
          "  "});
  CHECK(pre_tokenize(s, PreTokenizer::gpt2) == V{"Hello", " world", "'s", " 12345", " !!", "\n\n ", " x", "\t", "I",
                                                  "'", "M", " ok", "...", "yes", "  "});
}

TEST_CASE("STO.loader.limits config sizes over the runtime limits refused before any weight is read",
          "[gate:STO][fmt:none]") {
  // runtime/limits declares the largest vocabulary, layer count, widths, heads, head_dim and context
  // a model file may ask for (each at least 4x the largest real checkpoint); a config.json over one
  // is refused naming the file, the field, the value, the limit and its KVGATE_LIMIT_<NAME> override,
  // before the weights are mapped (so a toy file cannot ask for gigabytes).
  TempDir t;
  const std::string dir = synth_tiny(t, "m");
  REQUIRE_NOTHROW(load_hf(dir));  // anti-vacuity: the untouched config loads
  const fs::path cfg = fs::path(dir) / "config.json";
  const nlohmann::json good = read_json_file(cfg);
  struct Case {
    const char* field;
    long long value;
    const char* limit;  // the KVGATE_LIMIT_ name
  };
  for (const Case& c : {Case{"vocab_size", 1LL << 23, "VOCAB"}, Case{"num_hidden_layers", 2000, "LAYERS"},
                        Case{"hidden_size", 1LL << 17, "DIM"}, Case{"intermediate_size", 1LL << 19, "HIDDEN_DIM"},
                        Case{"max_position_embeddings", 1LL << 21, "CONTEXT"}, Case{"num_attention_heads", 2048, "HEADS"},
                        Case{"head_dim", 8192, "HEAD_DIM"}}) {
    nlohmann::json cj = good;
    cj[c.field] = c.value;
    write_json_file(cfg, cj);
    std::string msg;
    try {
      load_hf(dir);
      msg = "<loaded>";
    } catch (const limits::LimitError& e) {
      msg = e.what();
    } catch (const std::exception& e) {
      msg = std::string("<not a LimitError> ") + e.what();
    }
    INFO(c.field << " = " << c.value << ": " << msg);
    CHECK(has(msg, cfg.string()));
    CHECK(has(msg, c.field));
    CHECK(has(msg, std::to_string(c.value)));
    CHECK(has(msg, "exceeds the limit"));
    CHECK(has(msg, std::string("KVGATE_LIMIT_") + c.limit));
  }
  write_json_file(cfg, good);
  CHECK_NOTHROW(load_hf(dir));
  // KV_ROW, a product of two fields, lowered to what the model holds: it loads; one below, refused.
  const Model m = load_hf(dir);
  const std::uint64_t row = static_cast<std::uint64_t>(m.config.n_kv_heads) * m.config.head_dim;
  {
    const ScopedLimit at("KV_ROW", row);
    CHECK(limit_refusal([&] { load_hf(dir); }) == "<ok>");
  }
  const ScopedLimit below("KV_ROW", row - 1);
  const std::string msg = limit_refusal([&] { load_hf(dir); });
  INFO(msg);
  CHECK(has(msg, cfg.string() + "': n_kv_heads * head_dim = " + std::to_string(row) + " exceeds the limit " +
                     std::to_string(row - 1)));
  CHECK(has(msg, "KVGATE_LIMIT_KV_ROW=N"));
}
