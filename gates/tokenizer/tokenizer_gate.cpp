// Tokenizer gates against outside code.
#include <filesystem>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "../resolve/fixtures.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/model.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace fs = std::filesystem;

namespace {

// A synthetic byte-level model whose tokenizer.json gets `post_processor` (config.json declares
// bos_token_id = vocab - 2 either way, as Qwen2/2.5/3 configs do).
std::string model_with_post_processor(const TempDir& t, const std::string& name, const std::string& arch,
                                      const nlohmann::json& post) {
  SynthOptions o = tiny_options(t.sub(name));
  o.arch = arch;
  synth_hf(o);
  const fs::path tp = fs::path(o.out) / "tokenizer.json";
  nlohmann::json j = read_json_file(tp);
  j["post_processor"] = post;
  write_json_file(tp, j);
  return o.out;
}

}  // namespace

TEST_CASE("MOD.tok.bos_rule BOS follows the tokenizer's post_processor, not config.json bos_token_id",
          "[gate:MOD][fmt:none]") {
  TempDir t;
  // Qwen2's tokenizer.json post_processor, verbatim: ByteLevel alone adds no token.
  const nlohmann::json qwen_post = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  const Model q = load_hf(model_with_post_processor(t, "qwen", "qwen2", qwen_post));
  REQUIRE(q.tokenizer);
  REQUIRE(q.config.bos_id >= 0);  // anti-vacuity: the config declares a BOS, the trap of the bug
  const std::string text = "Hello world";
  const std::vector<int> plain = q.tokenizer->encode(text, false);
  REQUIRE_FALSE(plain.empty());
  CHECK(q.tokenizer->encode(text, true) == plain);
  // Llama 3's TemplateProcessing "<|begin_of_text|> $A" adds it.
  const int bos = q.config.bos_id;
  const nlohmann::json tp_post = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", nlohmann::json::array()},
      {"special_tokens",
       {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {bos}}, {"tokens", {"<|begin_of_text|>"}}}}}}};
  const Model l = load_hf(model_with_post_processor(t, "llama", "llama", tp_post));
  REQUIRE(l.tokenizer);
  std::vector<int> want = {bos};
  for (int id : l.tokenizer->encode(text, false)) want.push_back(id);
  CHECK(l.tokenizer->encode(text, true) == want);
}
