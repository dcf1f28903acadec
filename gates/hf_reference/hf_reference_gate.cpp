// MOD.hf.<case>: kvgate (CPU engine, f32 KV) against transformers' own logits and greedy ids on
// the project's reference directories (hf_ref_harness.hpp: layout, bounds, anti-vacuity). One test
// case per case and check, so each is reported on its own; a directory kvgate's loader refuses
// FAILS its case with the loader's message.
//
//  MOD.hf.<case>.logits   every teacher-forced position: no NaN, max |diff| <= 2B(p), NMSE <= bound;
//                         for RoPE-scaled / sliding cases the run passes the original length / window.
//  MOD.hf.<case>.greedy   greedy ids from prompt_ids == transformers' generate(do_sample=False) up
//                         to the first step whose reference top-2 margin is within 2B.
//  (MOD.hf.llama_default.logits also checks that the reference folder holds exactly these cases.)
#include <algorithm>
#include <map>
#include <memory>

#include "catch_compat.hpp"
#include "hf_ref_harness.hpp"
#include "kvgate/engine.hpp"

using namespace kvgate;
using namespace kvgate::gates::hf_ref;

namespace {

const Loaded& loaded(const std::string& name) { return gates::hf_ref::loaded(name, "MOD.hf", "cpu"); }

// The reference folder holds exactly the cases of this table (checked inside
// MOD.hf.llama_default.logits, so a new reference directory cannot go untested unnoticed).
void check_inventory() {
  const fs::path models = fs::path(refs_root()) / "models";
  INFO("reference folder " << models.string());
  REQUIRE(fs::is_directory(models));
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(models))
    if (e.is_directory()) found.push_back(e.path().filename().string());
  for (const auto& f : found) {
    INFO("case '" << f << "' has a reference directory but no test case in gates/hf_reference");
    CHECK(std::find(case_names().begin(), case_names().end(), f) != case_names().end());
  }
  for (const auto& n : case_names()) {
    INFO("case '" << n << "' has no reference directory");
    CHECK(std::find(found.begin(), found.end(), n) != found.end());
  }
}

auto cpu_engine(const Model& m) {
  return [&m](int n_tokens) {
    EngineOptions o = engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1);
    o.max_context = n_tokens;
    o.prefill_chunk = n_tokens;  // one forward over all given ids
    return std::make_unique<Engine>(m, o);
  };
}

}  // namespace

#define HF_CASE(c)                                                                                     \
  TEST_CASE("MOD.hf." c ".logits transformers' teacher-forced logits, CPU engine f32 KV",               \
            "[gate:MOD][fmt:f32]") {                                                                   \
    if (std::string(c) == "llama_default") check_inventory();                                         \
    const Loaded& l = loaded(c);                                                                       \
    check_logits(l.rc, l.m, cpu_engine(l.m));                                                          \
  }                                                                                                    \
  TEST_CASE("MOD.hf." c ".greedy transformers' greedy ids, CPU engine f32 KV", "[gate:MOD][fmt:f32]") { \
    const Loaded& l = loaded(c);                                                                       \
    check_greedy(l.rc, l.m, cpu_engine(l.m));                                                          \
  }

HF_CASE("llama_default")
HF_CASE("llama3_rope")
HF_CASE("llama3_legacy")
HF_CASE("llama_linear")
HF_CASE("llama_dynamic")
HF_CASE("llama_sp")
HF_CASE("qwen2")
HF_CASE("qwen2_swa")
HF_CASE("qwen3")
HF_CASE("qwen3_yarn")
HF_CASE("mistral_swa")
HF_CASE("phi3")
HF_CASE("phi3_longrope")
HF_CASE("gemma2")
HF_CASE("gemma3")
HF_CASE("qwen3_moe")
HF_CASE("mixtral")
HF_CASE("deepseek_v3")
HF_CASE("deepseek_v3_qlora")

