// MOD.cuda.rope.<variant>: the CUDA forward's RoPE variants (rope.hpp) against the CPU engine, on
// the MOD random-weight model (gates/model_vs_oracle/model_harness.hpp: dim 256, 4 layers, head_dim 64)
// with each variant as ORA.model.rope.* configures it (original / reference length 64, 256
// positions), f32 weights and f32 KV. Two schedules, the same on both engines:
//   one chunk   all 256 ids in one forward (static tables; length-dependent variants at L = 256)
//   decode      a 40-token prompt, then 216 single-token steps (CUDA graph replay; dynamic NTK and
//               longrope re-staged per step with L = position + 1, crossing the length 64)
// Bound per position: B_cpu(p) + B_gpu(p) with B = forward_f32_logit_bound over the CPU's rounding
// chain (with the variant's frequency roundings, bounds.hpp) and the GPU's (+ 8 + n_ctx per layer,
// cuda_model_gate.cpp). Anti-vacuity: the plain-RoPE model on the GPU exceeds the bound against the
// variant's CPU logits (the GPU really ran the variant).
// Without a device every case prints "SKIPPED: no CUDA device: <reason>" and passes.
#include <cmath>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "../model_vs_oracle/model_harness.hpp"
#include "bounds.hpp"
#include "catch_compat.hpp"
#include "cuda_gate_common.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/rope.hpp"

using namespace kvgate;
using namespace kvgate::gates;
using namespace kvgate::gates::model_level;
namespace kc = kvgate::cuda;

namespace {

constexpr int kN = 256, kPrompt = 40, kOrig = 64;

Model rope_model(const RopeConfig& r, bool half_style) {
  RandomModelSpec s;
  s.seq_len = kN;
  const ko::Transformer ora = random_oracle_model(s);
  Model m = runtime_model_from(ora, "random-weight model, RoPE " + describe_rope(r));
  m.config.rope = r;
  m.config.rope_style = half_style ? RopeStyle::half : RopeStyle::interleaved;
  return m;
}

int freq_ops(const RopeConfig& r) {
  switch (r.type) {
    case RopeType::plain: return 1;
    case RopeType::linear: return 2;
    case RopeType::longrope: return 3;
    case RopeType::dynamic: return 4;
    case RopeType::yarn: return 6;
    case RopeType::llama3: return 8;
  }
  return 8;
}

// [n][vocab] logits of every position under `schedule` (0: one chunk, 1: prompt + decode steps).
template <class E>
std::vector<float> run(E& e, const std::vector<int>& ids, int schedule) {
  if (schedule == 0) return e.forward_all_logits(ids);
  std::vector<float> out = e.forward_all_logits(std::span<const int>(ids.data(), kPrompt));
  for (int p = kPrompt; p < kN; ++p) {
    const std::vector<float>& l = e.decode(ids[static_cast<std::size_t>(p)]);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

std::vector<float> cpu_logits(const Model& m, const std::vector<int>& ids, int schedule) {
  EngineOptions o = engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1);
  o.max_context = kN;
  o.prefill_chunk = kN;
  Engine e(m, o);
  return run(e, ids, schedule);
}

std::vector<float> gpu_logits(const Model& m, const std::vector<int>& ids, int schedule) {
  kc::CudaEngineOptions o;
  o.engine = engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1);
  o.engine.kv.backend = "cuda";
  o.engine.max_context = kN;
  o.engine.prefill_chunk = kN;
  kc::CudaEngine e(m, o);
  return run(e, ids, schedule);
}

void cuda_rope(const std::string& id, const RopeConfig& r, bool half_style) {
  const Model m = rope_model(r, half_style);
  const Model plain = rope_model(RopeConfig{}, half_style);
  const ModelConfig& c = m.config;
  const int V = c.vocab_size;
  const bool scaled = r.type == RopeType::yarn || r.type == RopeType::longrope;
  const std::vector<int> ids = random_tokens(kN, V, 2048);
  for (int schedule : {0, 1}) {
    const char* sname = schedule == 0 ? "one chunk" : "prompt + decode steps";
    const std::vector<float> cpu = cpu_logits(m, ids, schedule), gpu = gpu_logits(m, ids, schedule);
    const std::vector<float> gpu_plain = gpu_logits(plain, ids, schedule);
    REQUIRE(cpu.size() == gpu.size());
    long bad = 0;
    for (float x : gpu) bad += !std::isfinite(x);
    REQUIRE(bad == 0);
    double worst = 0, num = 0, den = 0, bnum = 0, pnum = 0;
    int worst_pos = 0;
    for (int p = 0; p < kN; ++p) {
      const std::size_t o = static_cast<std::size_t>(p) * V;
      double zmax = 0, e = 0;
      for (int v = 0; v < V; ++v) zmax = std::max(zmax, std::fabs(double(cpu[o + v])));
      const double chain = forward_rounding_chain(c.n_layers, c.dim, c.hidden_dim, c.head_dim, c.q_dim(), p, freq_ops(r), scaled);
      const double b = forward_f32_logit_bound(chain, zmax) +
                       forward_f32_logit_bound(chain + c.n_layers * (8.0 + p + 1), zmax);
      for (int v = 0; v < V; ++v) {
        const double d = double(gpu[o + v]) - cpu[o + v], dp = double(gpu_plain[o + v]) - cpu[o + v];
        e = std::max(e, std::fabs(d));
        num += d * d;
        pnum += dp * dp;
        den += double(cpu[o + v]) * cpu[o + v];
      }
      bnum += double(V) * b * b;
      if (e / b > worst) worst = e / b, worst_pos = p;
    }
    std::cout << std::setprecision(4) << id << " (" << sname << "): " << describe_rope(r) << ", NMSE " << num / den
              << " (bound " << bnum / den << "), worst |gpu - cpu| at " << worst << " of the bound (position " << worst_pos
              << "); plain RoPE on the GPU: NMSE " << pnum / den << "\n";
    INFO(id << " " << sname << ": NMSE " << num / den << " (bound " << bnum / den << "), worst " << worst << " at "
            << worst_pos << "; plain-RoPE GPU NMSE " << pnum / den);
    CHECK(num / den <= bnum / den);
    CHECK(worst <= 1.0);
    CHECK(pnum / den > bnum / den);  // anti-vacuity: the variant is visible in the GPU's logits
  }
}

RopeConfig variant(RopeType t) {
  RopeConfig r;
  r.type = t;
  r.original_max = kOrig;
  r.max_position = kOrig;
  switch (t) {
    case RopeType::linear: r.factor = 4; break;
    case RopeType::dynamic: r.factor = 2; break;
    case RopeType::yarn: r.factor = 4; break;
    case RopeType::llama3: r.factor = 8, r.low_freq_factor = 1, r.high_freq_factor = 4; break;
    case RopeType::longrope:
      r.factor = 4;
      for (int j = 0; j < 32; ++j) r.short_factor.push_back(1.0f + 0.03f * j), r.long_factor.push_back(1.0f + 0.5f * j);
      break;
    case RopeType::plain: break;
  }
  return r;
}

}  // namespace

TEST_CASE("MOD.cuda.rope.linear GPU linear RoPE == CPU engine, one chunk and decode steps", "[gate:MOD][cuda][fmt:f32]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  cuda_rope("MOD.cuda.rope.linear", variant(RopeType::linear), false);
}
TEST_CASE("MOD.cuda.rope.dynamic GPU dynamic NTK (per-row staged) == CPU engine past the length 64", "[gate:MOD][cuda][fmt:f32]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  cuda_rope("MOD.cuda.rope.dynamic", variant(RopeType::dynamic), false);
}
TEST_CASE("MOD.cuda.rope.yarn GPU YaRN (attention factor in the tables) == CPU engine", "[gate:MOD][cuda][fmt:f32]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  cuda_rope("MOD.cuda.rope.yarn", variant(RopeType::yarn), true);
}
TEST_CASE("MOD.cuda.rope.llama3 GPU Llama 3.1 RoPE == CPU engine", "[gate:MOD][cuda][fmt:f32]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  cuda_rope("MOD.cuda.rope.llama3", variant(RopeType::llama3), true);
}
TEST_CASE("MOD.cuda.rope.longrope GPU LongRoPE (per-row staged, long past 64) == CPU engine", "[gate:MOD][cuda][fmt:f32]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  cuda_rope("MOD.cuda.rope.longrope", variant(RopeType::longrope), true);
}
TEST_CASE("MOD.cuda.rope.partial GPU partial rotary (32 of 64 dims, rotate-half) == CPU engine", "[gate:MOD][cuda][fmt:f32]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  RopeConfig r;
  r.rotary_dim = 32;
  cuda_rope("MOD.cuda.rope.partial", r, true);
}
