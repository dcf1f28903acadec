// GPU twins of MOD.hf_arch: the whole-model CUDA forward against transformers' references for the
// sliding-window families, and the capability switch for what the CUDA kernels do not implement.
//
//  MOD.cuda.hf_arch.<case>  teacher-forced GPU logits (f32 weights and KV) within the ORA.model
//                           forward bound plus the GPU's extra roundings per layer (the q prescale,
//                           exp2 approximations, split merges and one online-softmax rescale per
//                           key: 8 + n_ctx, as MOD.cuda.logits), greedy (GPU argmax, cached) identical
//                           up to a reference margin under the bound.
//  STO.cuda.arch_refusal    an architecture the CUDA forward does not implement is refused with its
//                           name and the list it does, never run as the nearest one.
//
// Without a device every case prints "SKIPPED: no CUDA device: <reason>" and passes.
#ifndef KVGATE_SOURCE_DIR_DEFAULT
#define KVGATE_SOURCE_DIR_DEFAULT "."
#endif
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "kvgate/build_paths.hpp"
#include "catch_compat.hpp"
#include "cuda_gate_common.hpp"
#include "hf_arch_ref.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/sampler.hpp"

using namespace kvgate;
using namespace kvgate::gates::hf_arch;
namespace kc = kvgate::cuda;

namespace {

kc::CudaEngineOptions gpu_opts(int chunk, bool graphs) {
  kc::CudaEngineOptions o;
  o.engine = engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1);
  o.engine.kv.backend = "cuda";
  o.engine.prefill_chunk = chunk;
  o.cuda_graphs = graphs;
  return o;
}

double gpu_extra_chain_layers = 0;
double gpu_extra(int pos) { return gpu_extra_chain_layers * (8.0 + pos + 1.0); }

void run_cuda_case(const std::string& name) {
  const fs::path dir = refs_root() / name;
  INFO("reference directory " << dir.string());
  const Ref ref = read_ref(dir);
  const Model m = load_network(dir);
  const ModelConfig& c = m.config;
  const int V = ref.vocab;
  REQUIRE(c.vocab_size == V);
  gpu_extra_chain_layers = c.n_layers;
  int max_window = 0;
  for (int l = 0; l < c.n_layers; ++l) max_window = std::max(max_window, c.window(l));
  REQUIRE(max_window > 0);
  for (const auto& tf : ref.j.at("teacher_forced")) {
    const std::vector<int> ids = tf.at("ids").get<std::vector<int>>();
    const int T = tf.at("T").get<int>();
    const float* z = ref.logits.data() + tf.at("offset").get<std::size_t>();
    CHECK(T > 2 * max_window);
    // The prefill kernel over one chunk, chunks straddling the window edges, and token by token
    // (chunk 1: the decode kernel, the generic one that serves windows, planned per call).
    for (int chunk : {128, 7, 1}) {
      kc::CudaEngine e(m, gpu_opts(chunk, true));
      const std::vector<float> got = e.forward_all_logits(ids);
      REQUIRE(got.size() == static_cast<std::size_t>(T) * V);
      const TfResult r = compare(c, got, z, T, V, gpu_extra);
      INFO(name << " '" << tf.at("name").get<std::string>() << "' chunk " << chunk << ": NMSE " << r.nmse
                << " (bound " << r.nmse_bound << "), top-1 " << r.top1_agree << "/" << T);
      CHECK(r.nmse <= r.nmse_bound);
      CHECK(r.top1_unexplained == 0);
      CHECK(r.nmse_bound < 1e-4);
    }
  }
  long steps = 0;
  for (const auto& g : ref.j.at("greedy")) {
    const std::vector<int> prompt = g.at("prompt_ids").get<std::vector<int>>();
    const std::vector<int> want = g.at("generated").get<std::vector<int>>();
    const std::vector<double> margin = g.at("top2_margin").get<std::vector<double>>();
    for (bool graphs : {true, false}) {  // decode kernel through a captured graph (one plan) and planned per call
      kc::CudaEngine e(m, gpu_opts(128, graphs));
      const std::vector<float>* l = &e.prefill(prompt);
      for (std::size_t s = 0; s < want.size(); ++s) {
        const int t = argmax(*l);
        if (t != want[s]) {
          double zmax = 0;
          for (float x : *l) zmax = std::max(zmax, std::fabs(double(x)));
          const int pos = static_cast<int>(prompt.size() + s) - 1;
          const double b = position_bound(c, pos, zmax, gpu_extra(pos));
          INFO(name << " greedy step " << s << " (graphs " << graphs << "): GPU " << t << ", transformers " << want[s]
                    << ", margin " << margin[s] << ", 2x bound " << 2 * b);
          CHECK(margin[s] <= 2 * b);
          break;
        }
        ++steps;
        if (s + 1 < want.size()) l = &e.decode(t);
      }
    }
  }
  CHECK(steps >= 64);
}

}  // namespace

TEST_CASE("MOD.cuda.hf_arch.mistral_swa GPU sliding window 16 on every layer == transformers",
          "[gate:MOD][cuda][fmt:f32]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  run_cuda_case("mistral_swa");
}

TEST_CASE("MOD.cuda.hf_arch.qwen2_swa GPU sliding layers from layer_types == transformers", "[gate:MOD][cuda][fmt:f32]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  run_cuda_case("qwen2_swa");
}

TEST_CASE("STO.cuda.arch_refusal the CUDA forward refuses an architecture it does not implement, naming it",
          "[gate:STO][cuda][fmt:f32]") {
  Model m = load_network(refs_root() / "gemma2");
  // Gemma 2's soft-caps are implemented (MOD.cuda.hf.gemma2): the switch accepts the model as is.
  REQUIRE(m.config.attn_softcap > 0);
  CHECK(kc::forward_unsupported_reason(m.config).empty());
  m.config.arch = "gpt_neox";  // no forward of this family: refused with its name, not run as Llama
  const std::string why = kc::forward_unsupported_reason(m.config);
  INFO(why);
  CHECK(why.find("'gpt_neox'") != std::string::npos);
  CHECK(why.find("gemma2") != std::string::npos);  // the list of what it implements
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  CHECK_THROWS_AS(kc::CudaEngine(m, gpu_opts(128, true)), ModelError);
}
