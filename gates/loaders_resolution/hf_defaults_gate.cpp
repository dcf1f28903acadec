// STO.loader.config_defaults: a Hugging Face config.json that omits a key gets transformers' default
// for that architecture, not another one. Here: tie_word_embeddings. transformers writes it only
// where it differs from the class default; LlamaConfig / MistralConfig / Qwen2Config default to
// false (an lm_head.weight is loaded), Gemma to true. The class it closes: a default taken from the
// wrong place (PretrainedConfig's true for every architecture) that silently drops lm_head.
// Exact: the loaded classifier equals the checkpoint's lm_head, and differs from the embeddings.
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "catch_compat.hpp"
#include "kvgate/model.hpp"
#include "kvgate/synth.hpp"
#include "scratch_dir.hpp"

using namespace kvgate;

TEST_CASE("STO.loader.config_defaults an omitted tie_word_embeddings is false for llama/mistral/qwen2 (lm_head loaded)",
          "[gate:STO][loader]") {
  for (const char* arch : {"llama", "mistral", "qwen2"}) {
    INFO("arch " << arch);
    gates::ScratchDir d("kvgate-hfdef");
    SynthOptions o;
    o.arch = arch;
    o.layers = 1;
    o.hidden = 64;
    o.heads = 4;
    o.kv_heads = 2;
    o.ffn = 96;
    o.vocab = 300;
    o.max_seq_len = 64;
    o.tie_embeddings = false;
    o.out = d.sub("m");
    synth_hf(o);
    const Model explicit_false = load_model(o.out);
    REQUIRE_FALSE(explicit_false.config.tied_embeddings);
    REQUIRE_FALSE(explicit_false.weights.classifier.empty());
    // Drop the key: transformers' default for these architectures is false.
    const std::string cfg = o.out + "/config.json";
    nlohmann::json j;
    {
      std::ifstream in(cfg);
      in >> j;
    }
    REQUIRE(j.contains("tie_word_embeddings"));  // anti-vacuity: synth wrote it, so the edit removes something
    j.erase("tie_word_embeddings");
    std::ofstream(cfg) << j.dump(2);
    const Model omitted = load_model(o.out);
    CHECK_FALSE(omitted.config.tied_embeddings);
    CHECK(omitted.weights.classifier == explicit_false.weights.classifier);
    CHECK(omitted.weights.classifier != omitted.weights.tok_embeddings);  // anti-vacuity: lm_head is its own tensor
  }
}
