// STO.loader gates for the architecture switches of the Hugging Face loader: which layers slide
// (transformers' rules per family, layer_types first), the Gemma 2/3 fields, and Phi-3's fused
// qkv_proj / gate_up_proj split; every bad value refused naming the file and the field.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "fixtures.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/numeric.hpp"
#include "kvgate/sampler.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {


std::string synth_arch(const TempDir& t, const std::string& name, const std::string& arch, int layers = 6,
                       const std::string& dtype = "f32", bool tied = false) {
  SynthOptions o = tiny_options(t.sub(name));
  o.arch = arch;
  o.layers = layers;
  o.dtype = dtype;
  o.tie_embeddings = tied;
  synth_hf(o);
  return o.out;
}

template <class F>
void edit_config(const std::string& dir, F&& edit) {
  auto cj = read_json_file(fs::path(dir) / "config.json");
  edit(cj);
  write_json_file(fs::path(dir) / "config.json", cj);
}

// A Gemma directory from a synth one: the architecture name, and the two extra norms per layer as
// header aliases of post_attention_layernorm's bytes (the loader reads them as separate tensors).
void make_gemma(const std::string& dir, const std::string& arch, int layers) {
  const fs::path p = fs::path(dir) / "model.safetensors";
  StFile f = read_st(p);
  for (int i = 0; i < layers; ++i) {
    const std::string b = "model.layers." + std::to_string(i) + ".";
    f.header[b + "pre_feedforward_layernorm.weight"] = f.header[b + "post_attention_layernorm.weight"];
    f.header[b + "post_feedforward_layernorm.weight"] = f.header[b + "post_attention_layernorm.weight"];
  }
  write_st(p, f);
  edit_config(dir, [&](json& cj) {
    cj["architectures"] = {arch == "gemma2" ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM"};
    cj["model_type"] = arch == "gemma2" ? "gemma2" : "gemma3_text";
    cj.erase("hidden_act");
    cj["hidden_activation"] = "gelu_pytorch_tanh";
    cj["query_pre_attn_scalar"] = 24;
    cj["sliding_window"] = 16;
  });
}

// Phi-3 from a Llama synth directory: per layer q|k|v rows -> self_attn.qkv_proj and gate|up rows
// -> mlp.gate_up_proj (row-major, any dtype: concatenating row blocks concatenates their bytes).
void make_phi3(const std::string& dir, int layers, bool gate_up_swapped = false) {
  const fs::path p = fs::path(dir) / "model.safetensors";
  StFile f = read_st(p);
  auto take = [&](const std::string& name) {
    const json e = f.header.at(name);
    f.header.erase(name);
    const auto b = e["data_offsets"][0].get<std::size_t>(), n = e["data_offsets"][1].get<std::size_t>() - b;
    return std::make_pair(e, f.data.substr(b, n));
  };
  auto put = [&](const std::string& name, const std::vector<std::pair<json, std::string>>& parts) {
    std::string bytes;
    std::int64_t rows = 0, cols = parts[0].first["shape"][1].get<std::int64_t>();
    for (const auto& pr : parts) bytes += pr.second, rows += pr.first["shape"][0].get<std::int64_t>();
    const std::size_t b = f.data.size();
    f.data += bytes;
    f.header[name] = {{"dtype", parts[0].first["dtype"]}, {"shape", {rows, cols}}, {"data_offsets", {b, b + bytes.size()}}};
  };
  for (int i = 0; i < layers; ++i) {
    const std::string b = "model.layers." + std::to_string(i) + ".";
    const auto q = take(b + "self_attn.q_proj.weight"), k = take(b + "self_attn.k_proj.weight"),
               v = take(b + "self_attn.v_proj.weight");
    put(b + "self_attn.qkv_proj.weight", {q, k, v});
    const auto g = take(b + "mlp.gate_proj.weight"), u = take(b + "mlp.up_proj.weight");
    if (gate_up_swapped) put(b + "mlp.gate_up_proj.weight", {u, g});
    else put(b + "mlp.gate_up_proj.weight", {g, u});
  }
  write_st(p, f);
  edit_config(dir, [](json& cj) {
    cj["architectures"] = {"Phi3ForCausalLM"};
    cj["model_type"] = "phi3";
  });
}

std::vector<float> logits_of(const Model& m, const std::vector<int>& ids, int threads = 1) {
  Engine e(m, engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, threads));
  return e.forward_all_logits(ids);
}

std::vector<int> some_ids(int n, int vocab) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 37 + 11) % vocab);
  return ids;
}

}  // namespace

TEST_CASE("STO.loader.windows which layers slide, per family, as transformers decides", "[gate:STO][fmt:none]") {
  TempDir t;
  struct Case {
    const char* name;
    const char* arch;  // synth arch (or gemma2/gemma3: converted)
    json edits;        // config.json keys to set (null values erase)
    std::vector<int> expect;
  };
  const std::vector<Case> cases = {
      {"mistral_all", "mistral", {{"sliding_window", 5}}, {5, 5, 5, 5, 5, 5}},
      {"mistral_null", "mistral", {{"sliding_window", nullptr}}, {}},
      {"qwen2_max_window_layers", "qwen2", {{"use_sliding_window", true}, {"sliding_window", 8}, {"max_window_layers", 4}},
       {0, 0, 0, 0, 8, 8}},
      {"qwen2_off", "qwen2", {{"use_sliding_window", false}, {"sliding_window", 8}, {"max_window_layers", 1}}, {}},
      {"qwen2_layer_types_first", "qwen2",
       {{"use_sliding_window", true},
        {"sliding_window", 8},
        {"max_window_layers", 4},
        {"layer_types",
         {"sliding_attention", "full_attention", "sliding_attention", "full_attention", "full_attention",
          "full_attention"}}},
       {8, 0, 8, 0, 0, 0}},
      {"qwen3_max_window_layers", "qwen3", {{"use_sliding_window", true}, {"sliding_window", 3}, {"max_window_layers", 5}},
       {0, 0, 0, 0, 0, 3}},
      {"gemma2_alternating", "gemma2", json::object(), {16, 0, 16, 0, 16, 0}},
      {"gemma3_pattern6", "gemma3", json::object(), {16, 16, 16, 16, 16, 0}},
      {"gemma3_pattern3", "gemma3", {{"sliding_window_pattern", 3}}, {16, 16, 0, 16, 16, 0}},
      {"gemma3_layer_types", "gemma3",
       {{"layer_types",
         {"full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention",
          "sliding_attention"}}},
       {0, 16, 0, 16, 0, 16}},
      {"llama_ignores", "llama", {{"sliding_window", 4}}, {}},
      {"longer_than_context", "mistral", {{"sliding_window", 100000}}, {100000, 100000, 100000, 100000, 100000, 100000}},
  };
  for (const Case& c : cases) {
    const std::string a = c.arch;
    const bool gemma = a == "gemma2" || a == "gemma3";
    const std::string dir = synth_arch(t, c.name, gemma ? (a == "gemma3" ? "qwen3" : "llama") : a, 6, "f32", gemma);
    if (gemma) make_gemma(dir, a, 6);
    edit_config(dir, [&](json& cj) {
      for (auto it = c.edits.begin(); it != c.edits.end(); ++it) cj[it.key()] = it.value();
    });
    const Model m = load_hf(dir);
    INFO(c.name);
    CHECK(m.config.layer_window == c.expect);
    CHECK(m.config.max_seq_len == 128);  // the window no longer caps the context
  }

  // Bad values: refused, naming config.json and the field.
  struct Bad {
    const char* name;
    const char* arch;
    json edits;
    const char* field;
  };
  const std::vector<Bad> bad = {
      {"zero", "mistral", {{"sliding_window", 0}}, "'sliding_window'"},
      {"negative", "mistral", {{"sliding_window", -4}}, "'sliding_window'"},
      {"fraction", "mistral", {{"sliding_window", 2.5}}, "'sliding_window' = 2.5 is not an integer"},
      {"string", "qwen2", {{"use_sliding_window", true}, {"sliding_window", "16"}}, "'sliding_window'"},
      {"types_length", "mistral", {{"sliding_window", 4}, {"layer_types", {"full_attention"}}}, "'layer_types'"},
      {"types_value", "qwen2",
       {{"use_sliding_window", true},
        {"sliding_window", 4},
        {"layer_types",
         {"full_attention", "chunked_attention", "full_attention", "full_attention", "full_attention",
          "full_attention"}}},
       "chunked_attention"},
  };
  for (const Bad& b : bad) {
    const std::string dir = synth_arch(t, std::string("bad_") + b.name, b.arch);
    edit_config(dir, [&](json& cj) {
      for (auto it = b.edits.begin(); it != b.edits.end(); ++it) cj[it.key()] = it.value();
    });
    const std::string msg = model_error([&] { load_hf(dir); });
    INFO(b.name << ": " << msg);
    CHECK(has(msg, dir + "/config.json"));
    CHECK(has(msg, b.field));
  }
}

TEST_CASE("STO.loader.window_runs a window shorter than the run: generation goes on, logits change; "
          "a window past the context equals full attention",
          "[gate:STO][fmt:f32]") {
  TempDir t;
  const std::string full = synth_arch(t, "full", "mistral", 2);
  const std::string w5 = synth_arch(t, "w5", "mistral", 2);
  const std::string wbig = synth_arch(t, "wbig", "mistral", 2);
  edit_config(w5, [](json& cj) { cj["sliding_window"] = 5; });
  edit_config(wbig, [](json& cj) { cj["sliding_window"] = 1000; });
  const Model mf = load_hf(full), m5 = load_hf(w5), mb = load_hf(wbig);
  const auto ids = some_ids(40, mf.config.vocab_size);
  const auto lf = logits_of(mf, ids), l5 = logits_of(m5, ids), lb = logits_of(mb, ids);
  CHECK(lb == lf);  // window 1000 > 40 tokens: bit-identical to full attention
  const std::size_t V = static_cast<std::size_t>(mf.config.vocab_size);
  // Positions 0..4 see all their keys either way; from position 5 on the window cuts.
  CHECK(std::equal(l5.begin(), l5.begin() + 5 * V, lf.begin()));
  double d = 0;
  for (std::size_t i = 5 * V; i < l5.size(); ++i) d = std::max(d, double(std::fabs(l5[i] - lf[i])));
  INFO("largest logit change from the window " << d);
  CHECK(d > 1e-3);
  // Generation runs past the window (the context is max_position_embeddings, not the window).
  // The prefill splits a windowed chunk's queries across threads by their windowed work: the
  // logits do not depend on the thread count.
  for (int threads : {2, 3, 4}) {
    INFO("threads " << threads);
    CHECK(logits_of(m5, ids, threads) == l5);
  }
  // Greedy decoding 60 steps from a 3-token prompt: 63 positions, 12 windows of 5.
  Engine e(m5, engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1));
  const std::vector<int> prompt(ids.begin(), ids.begin() + 3);
  const std::vector<float>* l = &e.prefill(prompt);
  int steps = 0;
  for (; steps < 60; ++steps) REQUIRE_NOTHROW(l = &e.decode(argmax(*l)));  // refused past the context
  CHECK(steps == 60);
  CHECK(l->size() == V);
}

TEST_CASE("STO.loader.gemma Gemma 2/3 fields: (1 + w) norms, embedding scale in the weights' dtype, "
          "query_pre_attn_scalar, soft-caps; bad values refused",
          "[gate:STO][fmt:none]") {
  TempDir t;
  for (const std::string dtype : {"f32", "bf16"}) {
    const std::string base = synth_arch(t, "base_" + dtype, "llama", 2, dtype, true);
    const std::string g = synth_arch(t, "g2_" + dtype, "llama", 2, dtype, true);
    make_gemma(g, "gemma2", 2);
    edit_config(g, [](json& cj) {
      cj["attn_logit_softcapping"] = 8.0;
      cj["final_logit_softcapping"] = nullptr;
    });
    const Model mb = load_hf(base), mg = load_hf(g);
    const ModelConfig& c = mg.config;
    INFO("dtype " << dtype);
    CHECK(c.arch == "gemma2");
    CHECK(c.ffn_act == FfnAct::gelu_tanh);
    CHECK(c.post_norms);
    CHECK(c.attn_scale == static_cast<float>(1.0 / std::sqrt(24.0)));
    CHECK(c.attn_softcap == 8.0f);
    CHECK(c.final_softcap == 0.0f);
    CHECK(c.layer_window == std::vector<int>{16, 0});
    CHECK(mg.weights.classifier.empty());  // tied (synth wrote no lm_head)
    // sqrt(32) = 5.65685...: f32 as is; a bf16 checkpoint multiplies by bf16(sqrt(32)) = 5.65625.
    CHECK(c.embed_scale == (dtype == "f32" ? static_cast<float>(std::sqrt(32.0)) : 5.65625f));
    // Every norm is (1 + w) of the stored w, in f32.
    for (std::size_t i = 0; i < mb.weights.final_norm.size(); ++i) {
      CHECK(mg.weights.final_norm[i] == 1.0f + mb.weights.final_norm[i]);
      CHECK(mg.weights.layers[1].attn_norm[i] == 1.0f + mb.weights.layers[1].attn_norm[i]);
      CHECK(mg.weights.layers[1].post_ffn_norm[i] == 1.0f + mb.weights.layers[1].ffn_norm[i]);
    }
    // The forward runs and the soft-cap and the sandwich norms are in it (logits differ from Llama's).
    const auto ids = some_ids(24, c.vocab_size);
    const auto lg = logits_of(mg, ids);
    for (float x : lg) REQUIRE(std::isfinite(x));
  }
  // Gemma 3: QK-norm with (1 + w) too, no soft-caps by default.
  {
    const std::string b3 = synth_arch(t, "b3", "qwen3", 2, "f32", true);
    const std::string g3 = synth_arch(t, "g3", "qwen3", 2, "f32", true);
    make_gemma(g3, "gemma3", 2);
    edit_config(g3, [](json& cj) {
      cj["attn_logit_softcapping"] = nullptr;
      cj["final_logit_softcapping"] = nullptr;
    });
    const Model mb = load_hf(b3), mg = load_hf(g3);
    CHECK(mg.config.qk_norm);
    CHECK(mg.config.attn_softcap == 0.0f);
    for (std::size_t i = 0; i < mb.weights.layers[0].q_norm.size(); ++i)
      CHECK(mg.weights.layers[0].q_norm[i] == 1.0f + mb.weights.layers[0].q_norm[i]);
  }
  struct Bad {
    const char* name;
    json edits;
    const char* field;
  };
  const std::vector<Bad> bad = {
      {"act", {{"hidden_activation", "gelu"}}, "'hidden_activation'"},
      {"bidir", {{"use_bidirectional_attention", true}}, "'use_bidirectional_attention'"},
      {"cap", {{"attn_logit_softcapping", -1.0}}, "'attn_logit_softcapping'"},
      {"final_cap", {{"final_logit_softcapping", "30"}}, "'final_logit_softcapping'"},
      {"scalar", {{"query_pre_attn_scalar", 0}}, "'query_pre_attn_scalar'"},
      {"multimodal", {{"architectures", {"Gemma3ForConditionalGeneration"}}}, "Gemma3ForCausalLM"},
  };
  for (const Bad& b : bad) {
    const std::string dir = synth_arch(t, std::string("bad_") + b.name, "llama", 2, "f32", true);
    make_gemma(dir, "gemma2", 2);
    edit_config(dir, [&](json& cj) {
      for (auto it = b.edits.begin(); it != b.edits.end(); ++it) cj[it.key()] = it.value();
    });
    const std::string msg = model_error([&] { load_hf(dir); });
    INFO(b.name << ": " << msg);
    CHECK(has(msg, dir + "/config.json"));
    CHECK(has(msg, b.field));
  }
  // A soft-cap on a family that has none in transformers is refused, not applied.
  const std::string l = synth_arch(t, "llama_cap", "llama", 2);
  edit_config(l, [](json& cj) { cj["final_logit_softcapping"] = 30.0; });
  CHECK(has(model_error([&] { load_hf(l); }), "'final_logit_softcapping'"));
}

TEST_CASE("STO.loader.phi3_fused qkv_proj / gate_up_proj split == the unfused Llama weights; wrong shapes refused",
          "[gate:STO][fmt:f32]") {
  TempDir t;
  const std::string llama = synth_arch(t, "llama", "llama", 2);
  const std::string phi = synth_arch(t, "phi", "llama", 2);
  make_phi3(phi, 2);
  const Model ml = load_hf(llama), mp = load_hf(phi);
  CHECK(mp.config.arch == "phi3");
  for (std::size_t i = 0; i < 2; ++i) {
    const LayerWeights &a = ml.weights.layers[i], &b = mp.weights.layers[i];
    CHECK(a.wq == b.wq);
    CHECK(a.wk == b.wk);
    CHECK(a.wv == b.wv);
    CHECK(a.w1 == b.w1);
    CHECK(a.w3 == b.w3);
  }
  const auto ids = some_ids(20, ml.config.vocab_size);
  CHECK(logits_of(ml, ids) == logits_of(mp, ids));
  // Anti-vacuity: gate and up fused in the wrong order give other logits (the split order matters).
  const std::string sw = synth_arch(t, "swapped", "llama", 2);
  make_phi3(sw, 2, true);
  CHECK(logits_of(load_hf(sw), ids) != logits_of(ml, ids));

  // Wrong shapes, with a data section that matches them: the loader names the file, the tensor,
  // the field and the fix.
  for (const char* which : {"self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"}) {
    const std::string dir = synth_arch(t, std::string("bad_") + which, "llama", 2);
    make_phi3(dir, 2);
    const fs::path p = fs::path(dir) / "model.safetensors";
    StFile f = read_st(p);
    const std::string name = std::string("model.layers.1.") + which;
    json& e = f.header[name];
    const std::int64_t rows = e["shape"][0].get<std::int64_t>() - 16, cols = e["shape"][1].get<std::int64_t>();
    e["shape"] = {rows, cols};
    e["data_offsets"][1] = e["data_offsets"][0].get<std::size_t>() + static_cast<std::size_t>(rows * cols * 4);
    write_st(p, f);
    const std::string msg = model_error([&] { load_hf(dir); });
    INFO(msg);
    CHECK(has(msg, p.string()));
    CHECK(has(msg, name));
    CHECK(has(msg, "'shape'"));
    CHECK(has(msg, "fix config.json"));
  }
  // A fused checkpoint missing its fused tensor says what it looked for.
  const std::string miss = synth_arch(t, "miss", "llama", 2);
  edit_config(miss, [](json& cj) { cj["architectures"] = {"Phi3ForCausalLM"}; });
  const std::string msg = model_error([&] { load_hf(miss); });
  INFO(msg);
  CHECK(has(msg, "self_attn.qkv_proj.weight"));
}

namespace {

// Sets an environment variable for one scope.
struct EnvFor {
  EnvFor(const char* k, const std::string& v) : key(k) { ::setenv(k, v.c_str(), 1); }
  ~EnvFor() { ::unsetenv(key); }
  const char* key;
};

template <class F>
void each_matrix(const ModelWeights& w, F&& f) {
  f("tok_embeddings", w.tok_embeddings);
  if (!w.classifier.empty()) f("classifier", w.classifier);
  for (const LayerWeights& L : w.layers)
    for (const auto& [n, m] : {std::pair<const char*, const Weight*>{"wq", &L.wq}, {"wk", &L.wk}, {"wv", &L.wv},
                               {"wo", &L.wo}, {"w1", &L.w1}, {"w2", &L.w2}, {"w3", &L.w3}})
      f(n, *m);
}

}  // namespace

TEST_CASE("STO.loader.weights_as_stored 16-bit matrices read in place: the FP32 conversion's logits; memory checked",
          "[gate:STO][fmt:bf16][fmt:f16]") {
  TempDir t;
  // Bound: exact. A 16-bit element converts to FP32 exactly and the CPU matmul multiplies the same
  // FP32 rows in the same order whatever the storage, so the logits are the converted model's bit for
  // bit (for 1 and 2 threads: the row split); qwen2 has biases (the row offset of a piece), Phi-3's
  // matrices are row ranges of one fused tensor (views at an offset).
  struct Case {
    const char* name;
    const char* arch;
    const char* dtype;
    bool phi3;
  };
  for (const Case c : {Case{"llama_bf16", "llama", "bf16", false}, Case{"qwen2_f16", "qwen2", "f16", false},
                       Case{"qwen3_bf16", "qwen3", "bf16", false}, Case{"phi3_bf16", "llama", "bf16", true}}) {
    INFO(c.name);
    std::string dir;
    if (std::string(c.arch) == "qwen2") {  // 8 heads of 16: 128 biased rows per projection, two pieces of 64
      SynthOptions o = tiny_options(t.sub(c.name));
      o.arch = c.arch;
      o.heads = o.kv_heads = 8;
      o.dtype = c.dtype;
      synth_hf(o);
      dir = o.out;
    } else {
      dir = synth_arch(t, c.name, c.arch, 2, c.dtype, false);
    }
    if (c.phi3) make_phi3(dir, 2);
    const Model kept = load_hf(dir), conv = load_hf(dir, WeightStorage::f32);
    const WeightDtype want = std::string(c.dtype) == "bf16" ? WeightDtype::bf16 : WeightDtype::f16;
    std::size_t elems = 0, n_mats = 0;
    each_matrix(kept.weights, [&](const char* n, const Weight& w) {
      INFO(n);
      CHECK(w.dtype() == want);
      CHECK(w.mapped());
    });
    each_matrix(conv.weights, [&](const char* n, const Weight& w) {
      INFO(n);
      CHECK(w.is_f32());
      CHECK_FALSE(w.mapped());
      elems += w.size();
      ++n_mats;
    });
    REQUIRE(n_mats == 2 + 2 * 7);  // anti-vacuity: every matrix looked at (untied: a classifier)
    CHECK(kept.weights.mapped_bytes() == 2 * elems);
    CHECK(conv.weights.mapped_bytes() == 0);
    CHECK(conv.weights.owned_bytes() == kept.weights.owned_bytes() + 4 * elems);
    CHECK(kept.fingerprint == conv.fingerprint);
    for (std::size_t l = 0; l < 2; ++l) {
      CHECK(kept.weights.layers[l].wq == conv.weights.layers[l].wq);
      CHECK(kept.weights.layers[l].w3 == conv.weights.layers[l].w3);
    }
    const auto ids = some_ids(20, kept.config.vocab_size);
    for (int threads : {1, 2}) {
      INFO(threads << " threads");
      const auto a = logits_of(kept, ids, threads), b = logits_of(conv, ids, threads);
      REQUIRE(a.size() == b.size());
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
    // A 16-bit weight refuses FP32 access by name instead of handing out its bits as floats.
    CHECK_THROWS_WITH(kept.weights.layers[0].wq.data(), kvgate_catch::contains("kept as the checkpoint stores it"));
  }

  // Memory: the figure the load asks for, computed here from the file's header: 2-D 16-bit tensors
  // kept as stored at 2 bytes an element, every other tensor at 4 (FP32); with --weights f32 every
  // tensor at 4. Equal to what the loaded model holds.
  const std::string dir = synth_arch(t, "mem", "llama", 2, "bf16");
  const StFile f = read_st(fs::path(dir) / "model.safetensors");
  std::uint64_t need = 0, need_f32 = 0;
  for (auto it = f.header.begin(); it != f.header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    std::uint64_t numel = 1;
    for (const auto& d : it.value()["shape"]) numel *= d.get<std::uint64_t>();
    need += (it.value()["shape"].size() == 2 ? 2 : 4) * numel;
    need_f32 += 4 * numel;
  }
  {
    const Model m = load_hf(dir);
    CHECK(m.weights.owned_bytes() + m.weights.mapped_bytes() == need);
  }
  {
    EnvFor e("KVGATE_MEMORY_AVAILABLE", std::to_string(need - 1));
    const std::string msg = model_error([&] { load_hf(dir); });
    INFO(msg);
    CHECK(has(msg, "'" + dir + "'"));
    CHECK(has(msg, "(" + std::to_string(need) + " bytes) of memory"));
    CHECK(has(msg, "(" + std::to_string(need - 1) + " bytes) is available (KVGATE_MEMORY_AVAILABLE)"));
  }
  {
    EnvFor e("KVGATE_MEMORY_AVAILABLE", std::to_string(need));
    CHECK_NOTHROW(load_hf(dir));  // at the figure: loads
    const std::string msg = model_error([&] { load_hf(dir, WeightStorage::f32); });  // FP32 needs more
    INFO(msg);
    CHECK(has(msg, "(" + std::to_string(need_f32) + " bytes) of memory"));
    CHECK(has(msg, "drop --weights f32"));
  }
}
