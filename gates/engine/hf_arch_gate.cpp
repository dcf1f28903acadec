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
#include "hf_arch_ref.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/model.hpp"
#include "kvgate/sampler.hpp"

using namespace kvgate;
namespace fs = std::filesystem;

using namespace kvgate::gates::hf_arch;

namespace {

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
