// MOD.cuda.hf.<case>: the [cuda] twin of gates/hf_reference (MOD.hf.<case>): the same transformers
// reference directories and checks (gates/hf_reference/hf_ref_harness.hpp) on the CUDA engine, f32
// weights and f32 KV. The bound adds the CUDA forward's own rounding chain to transformers'
// (hf_ref_harness.hpp pair_bound). Decode runs with CUDA graphs (the default), so the greedy check
// also covers the per-call RoPE rows of length-dependent variants under graph replay.
// Without a device every case prints "SKIPPED: no CUDA device: <reason>" and passes.
#include <map>
#include <memory>

#include "../hf_reference/hf_ref_harness.hpp"
#include "catch_compat.hpp"
#include "cuda_gate_common.hpp"
#include "kvgate/cuda/engine.hpp"

using namespace kvgate;
using namespace kvgate::gates::hf_ref;
namespace kc = kvgate::cuda;

namespace {

const Loaded& loaded(const std::string& name) { return gates::hf_ref::loaded(name, "MOD.cuda.hf", "cuda"); }

auto cuda_engine(const Model& m, MlaCache mla = MlaCache::expanded) {
  return [&m, mla](int n_tokens) {
    kc::CudaEngineOptions o;
    o.engine = engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1);
    o.engine.mla_cache = mla;
    o.engine.kv.backend = "cuda";
    o.engine.max_context = n_tokens;
    o.engine.prefill_chunk = n_tokens;  // one forward over all given ids
    return std::make_unique<kc::CudaEngine>(m, o);
  };
}

}  // namespace

#define CUDA_HF_CASE(c)                                                                                 \
  TEST_CASE("MOD.cuda.hf." c ".logits transformers' teacher-forced logits, CUDA engine f32 KV",          \
            "[gate:MOD][cuda][fmt:f32]") {                                                              \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                    \
    const Loaded& l = loaded(c);                                                                        \
    check_logits(l.rc, l.m, cuda_engine(l.m), true);                                                    \
  }                                                                                                     \
  TEST_CASE("MOD.cuda.hf." c ".greedy transformers' greedy ids, CUDA engine f32 KV", "[gate:MOD][cuda][fmt:f32]") { \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                    \
    const Loaded& l = loaded(c);                                                                        \
    check_greedy(l.rc, l.m, cuda_engine(l.m), true);                                                    \
  }

CUDA_HF_CASE("llama_default")
CUDA_HF_CASE("llama3_rope")
CUDA_HF_CASE("llama3_legacy")
CUDA_HF_CASE("llama_linear")
CUDA_HF_CASE("llama_dynamic")
CUDA_HF_CASE("llama_sp")
CUDA_HF_CASE("qwen2")
CUDA_HF_CASE("qwen2_swa")
CUDA_HF_CASE("qwen3")
CUDA_HF_CASE("qwen3_yarn")
CUDA_HF_CASE("mistral_swa")
CUDA_HF_CASE("phi3")
CUDA_HF_CASE("phi3_longrope")
CUDA_HF_CASE("gemma2")  // attention-logit and final-logit soft-caps in the CUDA kernels and forward
CUDA_HF_CASE("gemma3")
// Mixture of experts: the router kernel and every expert over every row (runtime/cuda/model/forward.cpp).
CUDA_HF_CASE("qwen3_moe")
CUDA_HF_CASE("mixtral")
// DeepSeek-V3: MLA expanded into per-head K/V rows (the assemble kernel), the V3 group router and the
// shared expert.
CUDA_HF_CASE("deepseek_v3")
CUDA_HF_CASE("deepseek_v3_qlora")

// MOD.cuda.hf.<case>.latent.*: the DeepSeek-V3 cases with the MLA latent cache on the CUDA engine
// (the store holds c_kv and the RoPE key; the latent kernel reads them in the weight-absorbed form,
// runtime/cuda/kernels/mla_decode.cuh), against the same transformers logits and greedy ids as
// MOD.hf.<case>.latent.* (the bound adds the absorbed chain: hf_ref_harness.hpp mla_latent_chain).
// The layout is checked to be the latent one, so a silent expanded run cannot pass.
#define CUDA_HF_LATENT_CASE(c)                                                                             \
  TEST_CASE("MOD.cuda.hf." c ".latent.logits transformers' teacher-forced logits, CUDA engine, MLA latent cache f32", \
            "[gate:MOD][cuda][fmt:f32][mla]") {                                                           \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                       \
    const Loaded& l = loaded(c);                                                                           \
    REQUIRE(cuda_engine(l.m, MlaCache::latent)(4)->stats().kv_layout.rfind("mla_latent", 0) == 0);        \
    check_logits(l.rc, l.m, cuda_engine(l.m, MlaCache::latent), true, true);                              \
  }                                                                                                        \
  TEST_CASE("MOD.cuda.hf." c ".latent.greedy transformers' greedy ids, CUDA engine, MLA latent cache f32",  \
            "[gate:MOD][cuda][fmt:f32][mla]") {                                                           \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                       \
    const Loaded& l = loaded(c);                                                                           \
    check_greedy(l.rc, l.m, cuda_engine(l.m, MlaCache::latent), true, true);                              \
  }

CUDA_HF_LATENT_CASE("deepseek_v3")
CUDA_HF_LATENT_CASE("deepseek_v3_qlora")
