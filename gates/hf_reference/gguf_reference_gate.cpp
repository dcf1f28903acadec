// MOD.gguf.<case>: the GGUF loader on files made by an outside path. Each transformers reference
// directory (hf_ref_harness.hpp) is converted at test time by datasets/tools/hf_to_gguf.py, which
// does what llama.cpp's convert_hf_to_gguf.py does (llama.cpp's key and tensor names, q/k rows
// permuted for llama, Gemma norms stored as 1 + w, fused Phi-3 tensors kept fused, llama3 RoPE as
// rope_freqs, longrope as rope_factors_long/_short), into the build directory
// ($KVGATE_GGUF_REFS_OUT, else <build>/gates/hf_reference/gguf_refs; nothing is committed). Then:
//
//  1. the GGUF and the Hugging Face directory load to the same model: every config field the forward
//     reads equal (windows, soft-caps, softmax scale, embedding scale, norms, RoPE: the inverse
//     frequencies and attention scaling within 4 float32 ulps at lengths 1 and 96, the variant's own
//     rounding), every weight bit-identical (llama's q/k after undoing the converter's permutation
//     here, independently of the tool);
//  2. the GGUF model's teacher-forced logits meet transformers' under the HF-reference bound
//     (check_logits: max |diff| <= 2B(p) at every position, NMSE <= the bound's NMSE, top-1 changes
//     only where the margin is within 2B; the run passes the window / original length).
//
// Bound: gates/common/bounds.hpp "ORA.model" through hf_ref_harness.hpp's pair_bound (float32
// forward rounding chain of the model's shape and RoPE variant). Anti-vacuity: check_logits' own
// (the bound is below kOraSensitivity of the logit RMS; the reference is not constant), the loaded
// GGUF declares the architecture the converter names, and the case's distinguishing feature is
// non-trivial in the loaded config (a window, a cap, a scale, QK-norm, fused split...).
// MOD.gguf.tool_refuses: the converter refuses what GGUF cannot spell (dynamic NTK) instead of
// writing a plain-RoPE file.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "hf_ref_harness.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/rope.hpp"

using namespace kvgate;
using namespace kvgate::gates::hf_ref;

namespace {

std::string source_dir() {
  if (const char* s = std::getenv("KVGATE_SOURCE_DIR"); s && *s) return s;
  return KVGATE_SOURCE_DIR_DEFAULT;
}

std::string out_dir() {
  if (const char* e = std::getenv("KVGATE_GGUF_REFS_OUT"); e && *e) return e;
  return KVGATE_GGUF_OUT_DEFAULT;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs the converter; returns its exit status and output.
int run_tool(const std::string& src, const std::string& dst, std::string* log) {
  const fs::path tool = fs::path(source_dir()) / "datasets" / "tools" / "hf_to_gguf.py";
  const fs::path lp = fs::path(dst).string() + ".log";
  const std::string cmd = std::string("'") + KVGATE_PYTHON + "' '" + tool.string() + "' '" + src + "' '" + dst +
                          "' > '" + lp.string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  *log = "$ " + cmd + "\n" + slurp(lp);
  return rc;
}

// The case converted once per program run (a fresh conversion each run: the tool and the reference
// are what is tested, never a stale file).
const std::string& converted(const RefCase& rc) {
  static std::map<std::string, std::string> done;
  if (auto it = done.find(rc.name); it != done.end()) return it->second;
  fs::create_directories(out_dir());
  const std::string dst = (fs::path(out_dir()) / (rc.name + ".gguf")).string();
  std::error_code ec;
  fs::remove(dst, ec);
  std::string log;
  const int status = run_tool(rc.dir, dst, &log);
  std::cout << log;
  INFO("MOD.gguf." << rc.name << ": datasets/tools/hf_to_gguf.py failed (python3 with the standard library is "
                   "needed):\n" << log);
  REQUIRE(status == 0);
  REQUIRE(fs::is_regular_file(dst));
  return done.emplace(rc.name, dst).first->second;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Undoes convert_hf_to_gguf.py's LlamaModel.permute: GGUF row h*hd + 2j + t holds HF row
// h*hd + t*hd/2 + j.
std::vector<float> unpermute(const std::vector<float>& w, int n_head, int head_dim, int cols) {
  std::vector<float> out(w.size());
  const std::size_t C = static_cast<std::size_t>(cols);
  for (int h = 0; h < n_head; ++h)
    for (int j = 0; j < head_dim / 2; ++j)
      for (int t = 0; t < 2; ++t) {
        const std::size_t hf = static_cast<std::size_t>(h * head_dim + t * (head_dim / 2) + j) * C;
        const std::size_t gg = static_cast<std::size_t>(h * head_dim + 2 * j + t) * C;
        std::memcpy(out.data() + hf, w.data() + gg, C * sizeof(float));
      }
  return out;
}

void check_rope_same(const RopeConfig& a, float theta_a, const RopeConfig& b, float theta_b, int head_dim,
                     const char* which) {
  for (int L : {1, 96}) {
    const RopeFrequencies fa = rope_frequencies(a, theta_a, head_dim, L), fb = rope_frequencies(b, theta_b, head_dim, L);
    INFO(which << " RoPE at length " << L << ": HF " << describe_rope(a) << ", GGUF " << describe_rope(b));
    REQUIRE(fa.inv_freq.size() == fb.inv_freq.size());
    for (std::size_t i = 0; i < fa.inv_freq.size(); ++i) {
      INFO("pair " << i << ": HF " << fa.inv_freq[i] << ", GGUF " << fb.inv_freq[i]);
      CHECK(std::fabs(fa.inv_freq[i] - fb.inv_freq[i]) <= 4 * std::ldexp(std::fabs(fa.inv_freq[i]), -23));
    }
    CHECK(std::fabs(fa.attention_scaling - fb.attention_scaling) <= 4 * std::ldexp(fa.attention_scaling, -23));
  }
}

// 1. The GGUF loads to the model the HF directory loads to.
void check_same_model(const Model& hf, const Model& gg) {
  const ModelConfig &a = hf.config, &b = gg.config;
  using MC = ModelConfig;
  for (int MC::*f : {&MC::dim, &MC::hidden_dim, &MC::n_layers, &MC::n_heads, &MC::n_kv_heads, &MC::head_dim,
                     &MC::vocab_size})
    CHECK(b.*f == a.*f);
  for (float MC::*f : {&MC::rms_eps, &MC::embed_scale, &MC::attn_softcap, &MC::final_softcap}) CHECK(b.*f == a.*f);
  for (bool MC::*f : {&MC::post_norms, &MC::qk_norm, &MC::qkv_bias, &MC::tied_embeddings, &MC::has_rope_local})
    CHECK(b.*f == a.*f);
  CHECK(b.layer_window == a.layer_window);
  CHECK(b.ffn_act == a.ffn_act);
  CHECK(std::fabs(b.attn_scale - a.attn_scale) <= std::ldexp(a.attn_scale, -23));
  CHECK(rope_rotary_dim(b.rope, b.head_dim) == rope_rotary_dim(a.rope, a.head_dim));
  check_rope_same(a.rope, a.rope_theta, b.rope, b.rope_theta, a.head_dim, "global");
  if (a.has_rope_local && b.has_rope_local)
    check_rope_same(a.rope_local, a.rope_theta, b.rope_local, b.rope_theta, a.head_dim, "local");
  const bool permuted = b.rope_style == RopeStyle::interleaved;
  CHECK(permuted == (a.arch == "llama" || a.arch == "mistral"));  // llama.cpp: NORM RoPE for llama only
  const ModelWeights &wa = hf.weights, &wb = gg.weights;
  for (std::vector<float> ModelWeights::*f : {&ModelWeights::tok_embeddings, &ModelWeights::final_norm,
                                              &ModelWeights::classifier})
    CHECK(same_bits(wb.*f, wa.*f));
  REQUIRE(wb.layers.size() == wa.layers.size());
  using LW = LayerWeights;
  for (std::size_t l = 0; l < wa.layers.size(); ++l) {
    const LW &x = wa.layers[l], &y = wb.layers[l];
    INFO("layer " << l);
    CHECK(same_bits(permuted ? unpermute(y.wq, b.n_heads, b.head_dim, b.dim) : y.wq, x.wq));
    CHECK(same_bits(permuted ? unpermute(y.wk, b.n_kv_heads, b.head_dim, b.dim) : y.wk, x.wk));
    int k = 0;
    for (std::vector<float> LW::*f : {&LW::wv, &LW::wo, &LW::bq, &LW::bk, &LW::bv, &LW::q_norm, &LW::k_norm,
                                      &LW::attn_norm, &LW::ffn_norm, &LW::post_attn_norm, &LW::post_ffn_norm, &LW::w1,
                                      &LW::w2, &LW::w3}) {
      INFO("tensor " << k++ << " of wv, wo, bq, bk, bv, q_norm, k_norm, attn_norm, ffn_norm, post_attn_norm, "
                        "post_ffn_norm, w1, w2, w3");
      CHECK(same_bits(y.*f, x.*f));
    }
  }
}

auto cpu_engine(const Model& m) {
  return [&m](int n_tokens) {
    EngineOptions o = engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1);
    o.max_context = n_tokens;
    o.prefill_chunk = n_tokens;
    return std::make_unique<Engine>(m, o);
  };
}

// `feature` (anti-vacuity): what the case exercises holds in the loaded GGUF config.
template <class Feature>
void gguf_case(const std::string& name, const std::string& arch, Feature&& feature) {
  const Loaded& hf = gates::hf_ref::loaded(name, "MOD.gguf", "cpu");
  const std::string& path = converted(hf.rc);
  Model gg;
  try {
    gg = load_model(path);
  } catch (const std::exception& e) {
    FAIL("MOD.gguf." << name << ": kvgate's GGUF loader refuses '" << path << "': " << e.what());
  }
  REQUIRE(gg.source_kind == "gguf");
  REQUIRE(gg.config.arch == arch);
  {
    INFO("MOD.gguf." << name << ": the case's feature is absent from the loaded GGUF config");
    CHECK(feature(gg.config));
  }
  std::cout << "MOD.gguf." << name << ": " << path << " (arch " << arch << ") vs " << hf.rc.dir << "\n";
  check_same_model(hf.m, gg);
  check_logits(hf.rc, gg, cpu_engine(gg));
}

bool any_window(const ModelConfig& c) {
  for (int w : c.layer_window)
    if (w > 0) return true;
  return false;
}

}  // namespace

#define GGUF_CASE(c, arch, feature)                                                                       \
  TEST_CASE("MOD.gguf." c " converted as llama.cpp does: same model as the HF load, transformers' logits", \
            "[gate:MOD][fmt:f32]") {                                                                      \
    gguf_case(c, arch, [](const ModelConfig& m) { return feature; });                                     \
  }

GGUF_CASE("llama_default", "llama", m.rope_style == RopeStyle::interleaved)
GGUF_CASE("llama3_rope", "llama", !m.rope.freq_divisors.empty())
GGUF_CASE("llama3_legacy", "llama", !m.rope.freq_divisors.empty())
GGUF_CASE("llama_linear", "llama", m.rope.type == RopeType::linear)
GGUF_CASE("llama_sp", "llama", m.rope_style == RopeStyle::interleaved)
GGUF_CASE("mistral_swa", "llama", any_window(m) && m.window(0) == 16)
GGUF_CASE("qwen2", "qwen2", m.qkv_bias && m.rope_style == RopeStyle::half)
GGUF_CASE("qwen2_swa", "qwen2", any_window(m) && m.window(0) == 0)
GGUF_CASE("qwen3", "qwen3", m.qk_norm)
GGUF_CASE("qwen3_yarn", "qwen3", m.rope.type == RopeType::yarn && m.rope.attention_factor > 1)
GGUF_CASE("phi3", "phi3", m.rope.rotary_dim > 0 && m.rope.rotary_dim < m.head_dim)
GGUF_CASE("phi3_longrope", "phi3", m.rope.type == RopeType::longrope && m.rope.attention_factor > 1)
GGUF_CASE("gemma2", "gemma2", m.attn_softcap > 0 && m.final_softcap > 0 && m.post_norms && any_window(m))
GGUF_CASE("gemma3", "gemma3", m.qk_norm && m.has_rope_local && m.window(1) == 0 && m.window(0) > 0)

TEST_CASE("MOD.gguf.tool_refuses the converter refuses dynamic NTK (no GGUF spelling) instead of dropping it",
          "[gate:MOD][fmt:none]") {
  const RefCase rc = load_case("llama_dynamic");
  fs::create_directories(out_dir());
  const std::string dst = (fs::path(out_dir()) / "llama_dynamic.gguf").string();
  std::error_code ec;
  fs::remove(dst, ec);
  std::string log;
  const int status = run_tool(rc.dir, dst, &log);
  INFO(log);
  CHECK(status != 0);
  CHECK(!fs::exists(dst));
  CHECK(log.find("rope_type") != std::string::npos);
  CHECK(log.find("dynamic") != std::string::npos);
}
