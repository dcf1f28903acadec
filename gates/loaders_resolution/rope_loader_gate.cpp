// STO.loader.rope_*: the RoPE section of config.json (runtime/src/rope.cpp). Both spellings
// (transformers 5 `rope_parameters`, legacy `rope_scaling` with `type` or `rope_type` and a top-level
// `rope_theta`) give the same RopeConfig; partial_rotary_factor gives int(head_dim * factor)
// rotated dims; Gemma 3's per-layer-type dict and its legacy rope_local_base_freq give the sliding
// layers their own RoPE; unknown types and inconsistent parameters are refused naming the file,
// the field and the value. The arithmetic of each variant is gated against the oracle
// (ORA.model.rope.*) and against transformers (MOD.hf.*).
#include <string>

#include "catch_compat.hpp"
#include "fixtures.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/rope.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {


// A tiny synth model (head_dim 16, max_position_embeddings 128) whose config.json is edited.
template <class F>
std::string with_config(const TempDir& t, const std::string& name, F&& edit) {
  synth_hf(tiny_options(t.sub(name), 7));
  const fs::path p = fs::path(t.sub(name)) / "config.json";
  json cj = read_json_file(p);
  cj.erase("rope_theta");
  edit(cj);
  write_json_file(p, cj);
  return t.sub(name);
}

json variant(const std::string& type) {
  if (type == "linear") return {{"factor", 4.0}};
  if (type == "dynamic") return {{"factor", 2.0}};
  if (type == "yarn") return {{"factor", 4.0}, {"original_max_position_embeddings", 32}, {"beta_fast", 16}};
  if (type == "llama3")
    return {{"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 32}};
  json s = json::array(), l = json::array();
  for (int i = 0; i < 8; ++i) s.push_back(1.0 + 0.1 * i), l.push_back(1.0 + i);
  return {{"short_factor", s}, {"long_factor", l}, {"original_max_position_embeddings", 32}};
}

void same_rope(const RopeConfig& a, const RopeConfig& b) {
  CHECK(describe_rope(a) == describe_rope(b));
  for (int L : {16, 200}) {
    const RopeFrequencies fa = rope_frequencies(a, 5e5f, 16, L), fb = rope_frequencies(b, 5e5f, 16, L);
    CHECK(fa.inv_freq == fb.inv_freq);
    CHECK(fa.attention_scaling == fb.attention_scaling);
  }
}

}  // namespace

TEST_CASE("STO.loader.rope_spellings rope_parameters and legacy rope_scaling read the same RoPE", "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string plain_dir = with_config(t, "plain", [](json& cj) { cj["rope_theta"] = 500000.0; });
  const Model plain = load_hf(plain_dir);
  CHECK(plain.config.rope.is_plain());
  for (const std::string type : {"linear", "dynamic", "yarn", "llama3", "longrope"}) {
    INFO("rope_type " << type);
    const std::string d5 = with_config(t, type + "5", [&](json& cj) {
      json rp = variant(type);
      rp["rope_type"] = type;
      rp["rope_theta"] = 500000.0;
      cj["rope_parameters"] = rp;
    });
    const std::string dl = with_config(t, type + "l", [&](json& cj) {
      json rs = variant(type);
      rs["type"] = type;  // the oldest spelling
      cj["rope_scaling"] = rs;
      cj["rope_theta"] = 500000.0;
    });
    const std::string dr = with_config(t, type + "r", [&](json& cj) {
      json rs = variant(type);
      rs["rope_type"] = type;
      cj["rope_scaling"] = rs;
      cj["rope_theta"] = 500000.0;
    });
    const Model m5 = load_hf(d5), ml = load_hf(dl), mr = load_hf(dr);
    CHECK(std::string(rope_type_name(m5.config.rope.type)) == type);
    CHECK(m5.config.rope_theta == 500000.0f);
    CHECK(ml.config.rope_theta == 500000.0f);
    same_rope(m5.config.rope, ml.config.rope);
    same_rope(m5.config.rope, mr.config.rope);
    CHECK(m5.fingerprint == ml.fingerprint);
    // Anti-vacuity: the variant is not the plain RoPE, and the fingerprint says so.
    CHECK(m5.fingerprint != plain.fingerprint);
    const RopeFrequencies fv = rope_frequencies(m5.config.rope, 5e5f, 16, 200);
    const RopeFrequencies fp = rope_frequencies(plain.config.rope, 5e5f, 16, 200);
    CHECK((fv.inv_freq != fp.inv_freq || fv.attention_scaling != fp.attention_scaling));
  }
  // Spot values of the parsed fields.
  const Model y = load_hf(t.sub("yarn5"));
  CHECK(y.config.rope.factor == 4.0);
  CHECK(y.config.rope.original_max == 32);
  CHECK(y.config.rope.beta_fast == 16.0);
  CHECK(y.config.rope.beta_slow == 1.0);
  const Model l3 = load_hf(t.sub("llama35"));
  CHECK(l3.config.rope.low_freq_factor == 1.0);
  CHECK(l3.config.rope.high_freq_factor == 4.0);
  const Model d = load_hf(t.sub("dynamic5"));
  CHECK(d.config.rope.max_position == 128);  // max_position_embeddings: dynamic NTK's reference length
  // A top-level original_max_position_embeddings takes priority (transformers; Phi-3 keeps it there).
  const std::string top = with_config(t, "top", [&](json& cj) {
    json rp = variant("longrope");
    rp["rope_type"] = "longrope";
    cj["rope_parameters"] = rp;
    cj["original_max_position_embeddings"] = 64;
  });
  CHECK(load_hf(top).config.rope.original_max == 64);
}

TEST_CASE("STO.loader.rope_refused unknown RoPE types and inconsistent parameters are named", "[gate:STO][fmt:none]") {
  TempDir t;
  struct Case {
    const char* name;
    json rope;             // rope_parameters
    const char* field;     // expected in the message
    const char* detail;    // expected in the message
  };
  json bad_long = variant("longrope");
  bad_long["rope_type"] = "longrope";
  bad_long["long_factor"] = json::array({1.0, 2.0, 3.0});
  json no_orig = variant("llama3");
  no_orig["rope_type"] = "llama3";
  no_orig.erase("original_max_position_embeddings");
  json high_low = variant("llama3");
  high_low["rope_type"] = "llama3";
  high_low["high_freq_factor"] = 0.5;
  const Case cases[] = {
      {"unknown", {{"rope_type", "proportional"}, {"rope_theta", 1e4}}, "'rope_parameters.rope_type'", "proportional"},
      {"factor_neg", {{"rope_type", "linear"}, {"factor", -2.0}}, "'rope_parameters.factor'", "> 0"},
      {"factor_zero", {{"rope_type", "yarn"}, {"factor", 0}, {"original_max_position_embeddings", 32}},
       "'rope_parameters.factor'", "> 0"},
      {"factor_missing", {{"rope_type", "dynamic"}}, "'rope_parameters.factor'", "missing"},
      {"no_original", no_orig, "original_max_position_embeddings", "missing"},
      {"long_len", bad_long, "'rope_parameters.long_factor'", "needs rotary_dim / 2 = 8"},
      {"high_low", high_low, "'rope_parameters.high_freq_factor'", "greater than low_freq_factor"},
      {"mrope", {{"rope_type", "default"}, {"mrope_section", json::array({2, 2, 4})}}, "mrope_section", "M-RoPE"},
  };
  for (const Case& c : cases) {
    const std::string dir = with_config(t, c.name, [&](json& cj) { cj["rope_parameters"] = c.rope; });
    const std::string msg = model_error([&] { load_hf(dir); });
    INFO(c.name << ": " << msg);
    CHECK(has(msg, (fs::path(dir) / "config.json").string()));
    CHECK(has(msg, c.field));
    CHECK(has(msg, c.detail));
  }
  // The legacy spelling names its own field.
  const std::string dl = with_config(t, "legacy", [](json& cj) { cj["rope_scaling"] = {{"type", "ntk-by-parts"}}; });
  const std::string msg = model_error([&] { load_hf(dl); });
  INFO(msg);
  CHECK(has(msg, "'rope_scaling.type'"));
  CHECK(has(msg, "ntk-by-parts"));
}

TEST_CASE("STO.loader.rope_partial partial_rotary_factor rotates int(head_dim * factor) dims", "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string half = with_config(t, "half", [](json& cj) { cj["partial_rotary_factor"] = 0.5; });
  CHECK(load_hf(half).config.rope.rotary_dim == 8);
  CHECK(rope_frequencies(load_hf(half).config.rope, 1e4f, 16, 1).inv_freq.size() == 4);
  const std::string inner = with_config(t, "inner", [](json& cj) {
    cj["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e4}, {"partial_rotary_factor", 0.25}};
  });
  CHECK(load_hf(inner).config.rope.rotary_dim == 4);
  const std::string full = with_config(t, "full", [](json& cj) { cj["partial_rotary_factor"] = 1.0; });
  CHECK(load_hf(full).config.rope.rotary_dim == 0);  // all dims
  const std::string odd = with_config(t, "odd", [](json& cj) { cj["partial_rotary_factor"] = 0.1; });
  const std::string msg = model_error([&] { load_hf(odd); });
  INFO(msg);
  CHECK(has(msg, "'partial_rotary_factor'"));
  CHECK(has(msg, "even"));
}

TEST_CASE("STO.loader.rope_layer_types Gemma 3: per-layer-type rope_parameters and rope_local_base_freq", "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string v5 = with_config(t, "v5", [](json& cj) {
    cj["rope_parameters"] = {
        {"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
        {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  });
  const Model m = load_hf(v5);
  CHECK(m.config.rope.type == RopeType::linear);
  CHECK(m.config.rope.factor == 8.0);
  CHECK(m.config.rope_theta == 1e6f);
  REQUIRE(m.config.has_rope_local);
  CHECK(m.config.rope_local.type == RopeType::plain);
  CHECK(m.config.rope_local.theta == 1e4);
  const std::string legacy = with_config(t, "legacy", [](json& cj) {
    cj["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
    cj["rope_theta"] = 1e6;
    cj["rope_local_base_freq"] = 1e4;
  });
  const Model ml = load_hf(legacy);
  CHECK(ml.config.rope.type == RopeType::linear);
  CHECK(ml.config.rope_theta == 1e6f);
  REQUIRE(ml.config.has_rope_local);
  CHECK(ml.config.rope_local.theta == 1e4);
  CHECK(m.fingerprint == ml.fingerprint);
  // Anti-vacuity: without the local base the model is a different one.
  const std::string none = with_config(t, "none", [](json& cj) {
    cj["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
    cj["rope_theta"] = 1e6;
  });
  const Model mn = load_hf(none);
  CHECK(!mn.config.has_rope_local);
  CHECK(mn.fingerprint != ml.fingerprint);
}
