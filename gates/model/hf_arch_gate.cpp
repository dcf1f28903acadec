// MOD.hf_arch.<case>: the runtime against transformers on the project's reference directories
// (datasets/models/hf_refs/models/<case>, made by datasets/tools/make_hf_refs.py with transformers
// 5.17, f32, eager attention) for the architecture pieces: sliding windows (Mistral, Qwen2 with
// max_window_layers), Gemma 2 (sandwich (1 + w) norms, GeGLU, query_pre_attn_scalar, attention and
// final soft-caps, alternating sliding/global layers). Teacher-forced logits of every position within
// the ORA.model forward bound, and the cached greedy continuation identical up to the first step
// whose reference top-2 margin is under that bound.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bounds.hpp"
#include "catch_compat.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/model.hpp"
#include "kvgate/sampler.hpp"

using namespace kvgate;
namespace fs = std::filesystem;

namespace {

fs::path refs_root() {
  std::string src;
  if (const char* s = std::getenv("KVGATE_SOURCE_DIR"); s && *s) src = s;
#ifdef KVGATE_SOURCE_DIR_DEFAULT
  if (src.empty()) src = KVGATE_SOURCE_DIR_DEFAULT;
#endif
  return fs::path(src) / "datasets" / "models" / "hf_refs" / "models";
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) FAIL("cannot read " << p.string() << " (the transformers reference directories are committed under "
                                              "datasets/models/hf_refs; run through ctest or set KVGATE_SOURCE_DIR)");
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// The model only (config.json + model.safetensors, linked into a fresh folder): the gate is about
// the network, the tokenizer files have gates of their own.
Model load_network(const fs::path& dir) {
  const fs::path tmp = fs::temp_directory_path() / ("kvgate_hf_arch_" + dir.filename().string() + "_" +
                                                    std::to_string(static_cast<long long>(::getpid())));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  for (const char* f : {"config.json", "model.safetensors"}) fs::create_symlink(fs::absolute(dir / f), tmp / f);
  Model m = load_model(tmp.string());
  fs::remove_all(tmp, ec);
  return m;
}

struct Ref {
  nlohmann::json j;
  std::vector<float> logits;
  int vocab = 0;
};

Ref read_ref(const fs::path& dir) {
  Ref r;
  r.j = nlohmann::json::parse(slurp(dir / "ref.json"));
  const std::string b = slurp(dir / "logits.f32");
  r.logits.resize(b.size() / 4);
  std::memcpy(r.logits.data(), b.data(), r.logits.size() * 4);
  r.vocab = r.j.at("vocab_size").get<int>();
  return r;
}

// The ORA.model bound (bounds.hpp forward_rounding_chain / forward_f32_logit_bound) of one position,
// with the Gemma extras on the chain: per layer the two sandwich norms (dim + 3 each) and their adds,
// the soft-capped score (divide, tanh, multiply: 3) and GeGLU's tanh GELU (6 operations instead of
// SiLU's 4); then the embedding scale (1) and the final soft-cap (3). Both transformers and kvgate
// are binary32 evaluations of the same function, each within the bound of the exact value: their
// difference is within twice the bound.
double position_bound(const ModelConfig& c, int pos, double zmax) {
  double chain = gates::forward_rounding_chain(c.n_layers, c.dim, c.hidden_dim, c.head_dim, c.q_dim(), pos);
  if (c.post_norms) chain += c.n_layers * (2.0 * (c.dim + 3) + 2 + 3 + 2) + 1 + 3;
  return 2 * gates::forward_f32_logit_bound(chain, zmax);
}

struct TfResult {
  double nmse = 0, nmse_bound = 0;
  int top1_agree = 0, top1_unexplained = 0, positions = 0;
};

TfResult compare(const ModelConfig& c, const std::vector<float>& got, const float* ref, int T, int V) {
  TfResult r;
  double num = 0, den = 0, bnum = 0;
  for (int p = 0; p < T; ++p) {
    const float* z = ref + static_cast<std::size_t>(p) * V;
    const float* g = got.data() + static_cast<std::size_t>(p) * V;
    double zmax = 0;
    for (int v = 0; v < V; ++v) zmax = std::max(zmax, std::fabs(double(z[v])));
    const double b = position_bound(c, p, zmax);
    int az = 0, ag = 0;
    for (int v = 0; v < V; ++v) {
      num += (double(g[v]) - z[v]) * (double(g[v]) - z[v]);
      den += double(z[v]) * z[v];
      if (z[v] > z[az]) az = v;
      if (g[v] > g[ag]) ag = v;
    }
    bnum += double(V) * b * b;
    if (az == ag) ++r.top1_agree;
    else if (double(z[az]) - z[ag] > 2 * b) ++r.top1_unexplained;
  }
  r.nmse = num / den;
  r.nmse_bound = bnum / den;
  r.positions = T;
  return r;
}

void run_case(const std::string& name) {
  const fs::path dir = refs_root() / name;
  INFO("reference directory " << dir.string());
  const Ref ref = read_ref(dir);
  const Model m = load_network(dir);
  const ModelConfig& c = m.config;
  REQUIRE(c.vocab_size == ref.vocab);
  const int V = ref.vocab;
  int max_window = 0;
  for (int l = 0; l < c.n_layers; ++l) max_window = std::max(max_window, c.window(l));
  REQUIRE(max_window > 0);  // every case here has sliding layers

  long compared = 0;
  for (const auto& tf : ref.j.at("teacher_forced")) {
    const std::vector<int> ids = tf.at("ids").get<std::vector<int>>();
    const int T = tf.at("T").get<int>();
    const std::size_t off = tf.at("offset").get<std::size_t>();
    REQUIRE(static_cast<int>(ids.size()) == T);
    REQUIRE(off + static_cast<std::size_t>(T) * V <= ref.logits.size());
    // Anti-vacuity: the run is longer than every window, so the windows cut.
    CHECK(T > 2 * max_window);
    const float* z = ref.logits.data() + off;
    for (int chunk : {128, 7}) {  // one prefill chunk, and chunks that straddle the window edges
      EngineOptions eo = engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1);
      eo.prefill_chunk = chunk;
      Engine e(m, eo);
      const std::vector<float> got = e.forward_all_logits(ids);
      REQUIRE(got.size() == static_cast<std::size_t>(T) * V);
      const TfResult r = compare(c, got, z, T, V);
      INFO(name << " '" << tf.at("name").get<std::string>() << "' chunk " << chunk << ": NMSE " << r.nmse
                << " (bound " << r.nmse_bound << "), top-1 " << r.top1_agree << "/" << T << ", unexplained "
                << r.top1_unexplained);
      CHECK(r.nmse <= r.nmse_bound);
      CHECK(r.top1_unexplained == 0);
      // The bound is far below the signal (a wrong norm, activation or scale is O(1) in NMSE).
      CHECK(r.nmse_bound < 1e-4);
      ++compared;
    }
    // Anti-vacuity: the same network with every window removed misses the reference by more than
    // the bound (the windows, not only the causal mask, shape these logits).
    Model full = load_network(dir);
    full.config.layer_window.clear();
    Engine ef(full, engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1));
    const TfResult rf = compare(full.config, ef.forward_all_logits(ids), z, T, V);
    INFO("without the windows: NMSE " << rf.nmse << " (bound " << rf.nmse_bound << ")");
    CHECK(rf.nmse > 100 * rf.nmse_bound);
  }
  CHECK(compared >= 2);

  // Greedy (cached, token by token): identical up to the first step whose reference margin is
  // within the bound (where either order is a correct binary32 answer).
  long steps = 0;
  for (const auto& g : ref.j.at("greedy")) {
    const std::vector<int> prompt = g.at("prompt_ids").get<std::vector<int>>();
    const std::vector<int> want = g.at("generated").get<std::vector<int>>();
    const std::vector<double> margin = g.at("top2_margin").get<std::vector<double>>();
    REQUIRE(margin.size() == want.size());
    CHECK(static_cast<int>(prompt.size() + want.size()) > 2 * max_window);
    Engine e(m, engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1));
    const std::vector<float>* l = &e.prefill(prompt);
    for (std::size_t s = 0; s < want.size(); ++s) {
      const int t = argmax(*l);
      if (t != want[s]) {
        double zmax = 0;
        for (float x : *l) zmax = std::max(zmax, std::fabs(double(x)));
        const double b = position_bound(c, static_cast<int>(prompt.size() + s) - 1, zmax);
        INFO(name << " greedy '" << g.at("name").get<std::string>() << "' step " << s << ": kvgate " << t
                  << ", transformers " << want[s] << ", reference top-2 margin " << margin[s] << ", 2x bound "
                  << 2 * b);
        CHECK(margin[s] <= 2 * b);
        break;
      }
      ++steps;
      if (s + 1 < want.size()) l = &e.decode(t);
    }
  }
  CHECK(steps >= 32);
}

}  // namespace

TEST_CASE("MOD.hf_arch.mistral_swa sliding window 16 on every layer == transformers, 96 positions",
          "[gate:MOD][fmt:f32]") {
  run_case("mistral_swa");
}

TEST_CASE("MOD.hf_arch.qwen2_swa sliding layers from max_window_layers / layer_types == transformers",
          "[gate:MOD][fmt:f32]") {
  run_case("qwen2_swa");
}

TEST_CASE("MOD.hf_arch.gemma2 Gemma 2 (sandwich norms, GeGLU, soft-caps, query_pre_attn_scalar) == transformers",
          "[gate:MOD][fmt:f32]") {
  run_case("gemma2");
}
