// Tokenizer gates against outside code:
//   MOD.tok.bos_rule        BOS follows the tokenizer (post_processor), not config.json bos_token_id
//   MOD.tok.hf_refs.model_bos  every models/<case>/: adds_bos == transformers' bos_added
//   MOD.tok.hf_refs.<kind>  every datasets/models/hf_refs/tokenizers/<kind>/: ids, ids without
//                           specials, decode, BOS/EOS rule and transformers' input_ids equal to what
//                           the `tokenizers` library / transformers wrote (tok_ref.json); bound: exact
//                           equality (token ids are integers, decoded text is bytes)
//   MOD.tok.bad_input       unknown model / normalizer / pre_tokenizer / decoder / post_processor
//                           types and missing byte tokens are refused naming the file and the field
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kvgate/build_paths.hpp"
#include "catch_compat.hpp"
#include "printable.hpp"
#include "../loaders_resolution/fixtures.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/sampler.hpp"
#include "kvgate/model.hpp"
#include "kvgate/tokenizer_bpe.hpp"
#include "kvgate/tokenizer_json.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace fs = std::filesystem;

namespace {

// The source tree (datasets/ lives there): $KVGATE_SOURCE_DIR (ctest), else the tree this gate was
// built from.
fs::path source_dir() {
  if (const char* s = std::getenv("KVGATE_SOURCE_DIR"); s && *s) return s;
  return KVGATE_SOURCE_DIR_DEFAULT;
}

fs::path refs_dir() { return source_dir() / "datasets" / "models" / "hf_refs" / "tokenizers"; }


std::string esc(const std::string& s) { return printable(s); }

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
  // The BOS-less prompt runs through the engine's generate loop (greedy; the stop rules keep the
  // config's EOS/BOS ids): the tokens come back and stay in the vocabulary.
  Engine e(q, engine_options_for(*parse_kv_format("f32")));
  const std::vector<int> prompt = q.tokenizer->encode(text, true);
  const GenerateResult g = e.generate(prompt, 6, SamplerOptions{});
  CHECK((g.stop_reason == "steps" || g.stop_reason == "eos" || g.stop_reason == "bos"));
  CHECK(g.tokens.size() <= 6u);
  for (int id : g.tokens) CHECK((id >= 0 && id < q.config.vocab_size && id != q.config.eos_id));
  CHECK(e.history().size() >= prompt.size());
  CHECK(std::vector<int>(e.history().begin(), e.history().begin() + static_cast<std::ptrdiff_t>(prompt.size())) ==
        prompt);
}

// ---- the tokenizers library's references -----------------------------------------------------------

namespace {

struct RefCase {
  std::string kind;
  nlohmann::json ref;
  std::unique_ptr<Tokenizer> tok;
};

// Loads <kind>/ the way the Hugging Face loader does (tokenizer.json + tokenizer_config.json; these
// directories have no config.json, so no config ids).
RefCase load_ref(const std::string& kind) {
  const fs::path d = refs_dir() / kind;
  INFO("reference directory " << d.string()
                              << " (written on the H200 by datasets/tools/make_hf_refs.py with the tokenizers "
                                 "library and transformers; see datasets/models/hf_refs/README.md)");
  REQUIRE(fs::is_regular_file(d / "tok_ref.json"));
  RefCase c;
  c.kind = kind;
  c.ref = read_json_file(d / "tok_ref.json");
  c.tok = load_tokenizer_json((d / "tokenizer.json").string(), -1, -1, (d / "tokenizer_config.json").string());
  return c;
}

std::vector<std::vector<int>> ids_of(const nlohmann::json& ref, const char* key) {
  std::vector<std::vector<int>> out;
  for (const auto& v : ref.at(key)) out.push_back(v.get<std::vector<int>>());
  return out;
}

// Every text of the corpus, against the references; returns the number of texts.
void check_against_refs(const RefCase& c) {
  const Tokenizer& tk = *c.tok;
  const auto& r = c.ref;
  const auto texts = r.at("texts").get<std::vector<std::string>>();
  const auto ids = ids_of(r, "ids"), plain = ids_of(r, "ids_no_special"), hf = ids_of(r, "hf_input_ids");
  const auto decoded = r.at("decoded").get<std::vector<std::string>>();
  REQUIRE(texts.size() >= 8);
  REQUIRE(ids.size() == texts.size());
  REQUIRE(plain.size() == texts.size());
  REQUIRE(hf.size() == texts.size());
  REQUIRE(decoded.size() == texts.size());
  CHECK(tk.adds_bos() == r.at("bos_added").get<bool>());
  CHECK(tk.adds_eos() == r.at("eos_added").get<bool>());
  const auto& st = r.at("special_tokens");
  if (!st.at("bos").is_null() && tk.adds_bos()) CHECK(tk.bos_id() == st.at("bos").get<int>());
  if (!st.at("eos").is_null()) CHECK(tk.eos_id() == st.at("eos").get<int>());
  CHECK(r.at("vocab_size").get<int>() == tk.vocab_size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    INFO(c.kind << " text " << i << ": \"" << esc(texts[i]) << "\"");
    CHECK(tk.encode(texts[i], true) == ids[i]);
    CHECK(tk.encode(texts[i], false) == plain[i]);
    CHECK(tk.encode(texts[i], true) == hf[i]);  // transformers (reads tokenizer_config.json too)
    if (r.at("bos_added").get<bool>()) {
      REQUIRE_FALSE(ids[i].empty());
      CHECK(ids[i].front() == st.at("bos").get<int>());
    }
    CHECK(esc(tk.decode(plain[i])) == esc(decoded[i]));
    std::string streamed;  // decode_piece, token by token, as `kvgate run` prints
    for (std::size_t k = 0; k < plain[i].size(); ++k) streamed += tk.decode_piece(k ? plain[i][k - 1] : -1, plain[i][k]);
    CHECK(esc(streamed) == esc(decoded[i]));
  }
}

// Anti-vacuity: the corpus exercises what the kind is about.
struct Exercised {
  int byte_tokens = 0;      // <0xXX> ids in the references
  int specials_in_text = 0; // texts whose ids_no_special hold an added special token
  int leading_space = 0, multi_space = 0, non_ascii = 0;
};

Exercised exercised(const RefCase& c) {
  Exercised e;
  const auto texts = c.ref.at("texts").get<std::vector<std::string>>();
  const auto plain = ids_of(c.ref, "ids_no_special");
  const auto* sp = dynamic_cast<const SpBpeTokenizer*>(c.tok.get());
  const auto* bl = dynamic_cast<const BpeTokenizer*>(c.tok.get());
  REQUIRE((sp || bl));
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const std::string& t = texts[i];
    e.leading_space += !t.empty() && t[0] == ' ';
    e.multi_space += t.find("  ") != std::string::npos;
    for (unsigned char ch : t) {
      if (ch >= 0x80) {
        ++e.non_ascii;
        break;
      }
    }
    bool special = false;
    for (int id : plain[i]) {
      const std::string piece = sp ? sp->piece(id) : bl->token_string(id);
      if (piece.size() == 6 && piece.compare(0, 3, "<0x") == 0 && piece[5] == '>') ++e.byte_tokens;
      if (bl)
        for (const auto& a : bl->options().added) special = special || (a.id == id && a.special);
      if (sp) special = special || (id == c.ref.at("special_tokens").at("bos").get<int>()) ||
                        (id == c.ref.at("special_tokens").at("eos").get<int>()) || piece == "<unk>" ||
                        piece == "<pad>";
    }
    e.specials_in_text += special;
  }
  return e;
}

void gate_kind(const std::string& kind, bool sentencepiece) {
  const RefCase c = load_ref(kind);
  CHECK((dynamic_cast<const SpBpeTokenizer*>(c.tok.get()) != nullptr) == sentencepiece);
  check_against_refs(c);
  const Exercised e = exercised(c);
  INFO(kind << ": byte tokens " << e.byte_tokens << ", texts with special tokens " << e.specials_in_text
            << ", leading space " << e.leading_space << ", multiple spaces " << e.multi_space << ", non-ASCII "
            << e.non_ascii);
  CHECK(e.specials_in_text >= 2);
  CHECK(e.leading_space >= 1);
  CHECK(e.multi_space >= 1);
  CHECK(e.non_ascii >= 1);
  if (sentencepiece) CHECK(e.byte_tokens > 0);  // byte fallback hit
}

}  // namespace

TEST_CASE("MOD.tok.hf_refs.bytelevel_qwen byte-level BPE, no BOS: ids == the tokenizers library's",
          "[gate:MOD][fmt:none]") {
  gate_kind("bytelevel_qwen", false);
  const RefCase c = load_ref("bytelevel_qwen");
  CHECK_FALSE(c.ref.at("bos_added").get<bool>());  // the case the Qwen BOS bug got wrong
  // The same tokenizer in transformers' Qwen2 model directory, whose config.json declares
  // bos_token_id: load_hf must still add none.
  const fs::path qd = source_dir() / "datasets" / "models" / "hf_refs" / "models" / "qwen2";
  REQUIRE(read_bytes(qd / "tokenizer.json") == read_bytes(refs_dir() / "bytelevel_qwen" / "tokenizer.json"));
  const Model q = load_hf(qd.string());
  REQUIRE(q.tokenizer);
  REQUIRE(q.config.bos_id >= 0);  // the trap
  CHECK_FALSE(q.tokenizer->adds_bos());
  const auto texts = c.ref.at("texts").get<std::vector<std::string>>();
  const auto ids = ids_of(c.ref, "ids");
  for (std::size_t i = 0; i < texts.size(); ++i) {
    INFO("text " << i << ": \"" << esc(texts[i]) << "\"");
    CHECK(q.tokenizer->encode(texts[i], true) == ids[i]);
  }
}

TEST_CASE("MOD.tok.hf_refs.model_bos every transformers model directory: the BOS rule == transformers' (ref.json)",
          "[gate:MOD][fmt:none]") {
  const fs::path md = source_dir() / "datasets" / "models" / "hf_refs" / "models";
  REQUIRE(fs::is_directory(md));
  auto id_of = [](const nlohmann::json& cfg, const char* key) {
    if (!cfg.contains(key) || cfg[key].is_null()) return -1;
    if (cfg[key].is_array()) return cfg[key].empty() ? -1 : cfg[key][0].get<int>();
    return cfg[key].get<int>();
  };
  int n = 0, with_bos = 0, declared_but_none = 0;
  for (const auto& e : fs::directory_iterator(md)) {
    if (!e.is_directory()) continue;
    const fs::path d = e.path();
    INFO(d.string());
    const nlohmann::json cfg = read_json_file(d / "config.json"), ref = read_json_file(d / "ref.json");
    // The tokenizer as load_hf reads it (tokenizer.json + tokenizer_config.json, config.json's ids).
    const auto tok = load_tokenizer_json((d / "tokenizer.json").string(), id_of(cfg, "bos_token_id"),
                                         id_of(cfg, "eos_token_id"), (d / "tokenizer_config.json").string());
    const bool bos_added = ref.at("bos_added").get<bool>();
    CHECK(tok->adds_bos() == bos_added);
    const std::vector<int> with = tok->encode("Hello world", true), plain = tok->encode("Hello world", false);
    REQUIRE_FALSE(plain.empty());
    CHECK(with.size() == plain.size() + (bos_added ? 1u : 0u));
    CHECK(std::vector<int>(with.end() - static_cast<std::ptrdiff_t>(plain.size()), with.end()) == plain);
    for (const auto& tf : ref.at("teacher_forced")) {
      const auto tids = tf.at("ids").get<std::vector<int>>();
      REQUIRE_FALSE(tids.empty());
      if (bos_added) CHECK(tids.front() == tok->encode("", true).front());
    }
    ++n;
    with_bos += bos_added;
    declared_but_none += !bos_added && id_of(cfg, "bos_token_id") >= 0;
  }
  INFO(n << " cases, " << with_bos << " add BOS, " << declared_but_none << " declare bos_token_id and add none");
  CHECK(n >= 10);
  CHECK(with_bos >= 1);
  CHECK(declared_but_none >= 1);  // the Qwen trap is in the set
}

TEST_CASE("MOD.tok.hf_refs.bytelevel_llama3 byte-level BPE + TemplateProcessing BOS: ids == the tokenizers library's",
          "[gate:MOD][fmt:none]") {
  gate_kind("bytelevel_llama3", false);
}

TEST_CASE("MOD.tok.hf_refs.sp_llama2 SentencePiece BPE (Prepend+Replace, byte fallback): ids == the tokenizers library's",
          "[gate:MOD][fmt:none]") {
  gate_kind("sp_llama2", true);
}

TEST_CASE("MOD.tok.hf_refs.sp_metaspace SentencePiece BPE (Metaspace first): ids == the tokenizers library's",
          "[gate:MOD][fmt:none]") {
  gate_kind("sp_metaspace", true);
}

TEST_CASE("MOD.tok.hf_refs.sp_gemma SentencePiece BPE (Replace only, add_bos_token): ids == the tokenizers library's",
          "[gate:MOD][fmt:none]") {
  gate_kind("sp_gemma", true);
}

TEST_CASE("MOD.tok.hf_refs.model_bos the tokenizer kinds present are exactly the gated ones", "[gate:MOD][fmt:none]") {
  const fs::path d = refs_dir();
  INFO(d.string());
  REQUIRE(fs::is_directory(d));
  std::vector<std::string> kinds;
  for (const auto& e : fs::directory_iterator(d))
    if (e.is_directory()) kinds.push_back(e.path().filename().string());
  std::sort(kinds.begin(), kinds.end());
  CHECK(kinds == std::vector<std::string>{"bytelevel_llama3", "bytelevel_qwen", "sp_gemma", "sp_llama2", "sp_metaspace"});
}

// ---- bad input ---------------------------------------------------------------------------------------

TEST_CASE("MOD.tok.bad_input unknown types and missing byte tokens are refused naming the file and the field",
          "[gate:MOD][fmt:none]") {
  TempDir t;
  const fs::path src = refs_dir() / "sp_llama2" / "tokenizer.json";
  REQUIRE(fs::is_regular_file(src));
  const nlohmann::json good = read_json_file(src);
  const fs::path p = t.path() / "tokenizer.json";
  auto refused = [&](const nlohmann::json& j) {
    write_json_file(p, j);
    return model_error([&] { load_tokenizer_json(p.string(), -1, -1); });
  };
  write_json_file(p, good);
  REQUIRE(load_tokenizer_json(p.string(), -1, -1)->vocab_size() == 596);  // the unbroken file loads
  struct Bad {
    const char* field;
    std::function<void(nlohmann::json&)> edit;
  };
  const std::vector<Bad> bad = {
      {"model.type", [](nlohmann::json& j) { j["model"]["type"] = "Unigram"; }},
      {"normalizer.normalizers[0].type", [](nlohmann::json& j) { j["normalizer"]["normalizers"][0]["type"] = "NFKC"; }},
      {"normalizer.normalizers[1].pattern", [](nlohmann::json& j) {
         j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
       }},
      {"pre_tokenizer.type", [](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }},
      {"decoder.decoders[2].type", [](nlohmann::json& j) { j["decoder"]["decoders"][2]["type"] = "WordPiece"; }},
      {"decoder", [](nlohmann::json& j) { j["decoder"] = nullptr; }},
      {"post_processor.type", [](nlohmann::json& j) { j["post_processor"]["type"] = "CustomProcessing"; }},
      {"added_tokens[1].single_word", [](nlohmann::json& j) { j["added_tokens"][1]["single_word"] = true; }},
      {"model.dropout", [](nlohmann::json& j) { j["model"]["dropout"] = 0.1; }},
  };
  for (const Bad& b : bad) {
    nlohmann::json j = good;
    b.edit(j);
    const std::string msg = refused(j);
    INFO(b.field << ": " << esc(msg));
    CHECK(has(msg, p.string()));
    CHECK(has(msg, b.field));
  }
  // byte_fallback with byte tokens missing: the file, the field, the fix.
  {
    nlohmann::json j = good;
    j["model"]["vocab"].erase("<0x41>");
    const std::string msg = refused(j);
    INFO(esc(msg));
    CHECK(has(msg, p.string()));
    CHECK(has(msg, "model.byte_fallback"));
    CHECK(has(msg, "<0x41>"));
    CHECK(has(msg, "add the <0x00>..<0xFF> tokens"));
  }
  // The byte-level reader takes no SentencePiece-style file.
  {
    write_json_file(p, good);
    const std::string msg = model_error([&] { BpeTokenizer::from_tokenizer_json(p.string(), -1, -1); });
    INFO(esc(msg));
    CHECK(has(msg, p.string()));
    CHECK(has(msg, "byte_fallback"));
  }
  // tokenizer_config.json add_bos_token with no bos_token to add.
  {
    write_json_file(p, good);
    const fs::path cfg = t.path() / "tokenizer_config.json";
    write_json_file(cfg, {{"add_bos_token", true}, {"bos_token", nullptr}});
    const std::string msg = model_error([&] { load_tokenizer_json(p.string(), -1, -1, cfg.string()); });
    INFO(esc(msg));
    CHECK(has(msg, cfg.string()));
    CHECK(has(msg, "add_bos_token"));
  }
}

// ---- added-token flags (no reference file carries them: checked by their definition) -------------------

TEST_CASE("MOD.tok.added_strip lstrip/rstrip added tokens swallow the whitespace beside them",
          "[gate:MOD][fmt:none]") {
  // tokenizers' AddedVocabulary: a match of an lstrip (rstrip) token extends over the whitespace on
  // its left (right), which then belongs to the token. So with the flag set, "a </s> b" must encode
  // as "a</s> b" (lstrip) / "a </s>b" (rstrip) does without it.
  TempDir t;
  const fs::path src = refs_dir() / "sp_llama2" / "tokenizer.json";
  REQUIRE(fs::is_regular_file(src));
  const nlohmann::json good = read_json_file(src);
  std::size_t k = 0;
  while (k < good["added_tokens"].size() && good["added_tokens"][k]["content"] != "</s>") ++k;
  REQUIRE(k < good["added_tokens"].size());
  auto load_with = [&](const char* flag) {
    nlohmann::json j = good;
    if (flag) j["added_tokens"][k][flag] = true;
    const fs::path p = t.path() / (std::string(flag ? flag : "plain") + ".json");
    write_json_file(p, j);
    return load_tokenizer_json(p.string(), -1, -1);
  };
  const auto plain = load_with(nullptr), l = load_with("lstrip"), r = load_with("rstrip");
  const std::string text = "a  </s>  b";
  // Anti-vacuity: the whitespace matters without the flags.
  REQUIRE(plain->encode(text, false) != plain->encode("a</s>  b", false));
  REQUIRE(plain->encode(text, false) != plain->encode("a  </s>b", false));
  CHECK(l->encode(text, false) == plain->encode("a</s>  b", false));
  CHECK(r->encode(text, false) == plain->encode("a  </s>b", false));
}

// ---- refusals of the tokenizer.json readers, field by field ---------------------------------------------

// MOD.tok.refusals: every malformed special-token rule, tokenizer_config.json token, SentencePiece-style
// and byte-level BPE field the readers check is refused with a ModelError naming the file, the field
// and what is wrong (bound: the exact field and reason text). Anti-vacuity: each base file loads
// unedited, and each edit is applied to a copy of it (one fault per file).
TEST_CASE("MOD.tok.refusals each malformed tokenizer.json / tokenizer_config.json field is refused by name",
          "[gate:MOD][fmt:none]") {
  TempDir t;
  using J = nlohmann::json;
  std::map<std::string, J> base;
  for (const char* k : {"sp_llama2", "sp_metaspace", "bytelevel_qwen"}) base[k] = read_json_file(refs_dir() / k / "tokenizer.json");
  const fs::path p = t.path() / "tokenizer.json", cfg = t.path() / "tokenizer_config.json";
  for (const auto& [k, j] : base) {
    write_json_file(p, j);
    REQUIRE(load_tokenizer_json(p.string(), -1, -1)->vocab_size() > 256);
  }
  const J tpl_s = {{"SpecialToken", {{"id", "<s>"}}}}, tpl_a = {{"Sequence", {{"id", "A"}}}};
  struct Bad {
    const char* base;
    const char* field;
    const char* why;
    std::function<void(J&)> edit;
    J config = nullptr;          // a tokenizer_config.json beside the file, when not null
    bool byte_level_reader = false;  // BpeTokenizer::from_tokenizer_json instead of load_tokenizer_json
  };
  const std::vector<Bad> bad = {
      // post_processor (both readers share it)
      {"sp_llama2", "post_processor.single", "must be a list",
       [](J& j) { j["post_processor"] = {{"type", "TemplateProcessing"}}; }},
      {"sp_llama2", "post_processor.single[0]", "is neither",
       [](J& j) { j["post_processor"]["single"][0] = {{"Foo", 1}}; }},
      {"sp_llama2", "post_processor.special_tokens[\"<s>\"].ids", "is missing",
       [](J& j) { j["post_processor"]["special_tokens"] = J::object(); }},
      {"sp_llama2", "post_processor.special_tokens[\"<s>\"].ids", "not a token id",
       [](J& j) { j["post_processor"]["special_tokens"]["<s>"]["ids"] = {"one"}; }},
      {"sp_llama2", "post_processor.single", "has no {\"Sequence\"",
       // J::array, not {tpl_s}: clang reads a one-element brace list of a json as a copy of it
       [&](J& j) { j["post_processor"]["single"] = J::array({tpl_s}); }},
      {"sp_llama2", "post_processor.cls", "must be [\"token\", id]",
       [](J& j) { j["post_processor"] = {{"type", "RobertaProcessing"}, {"sep", {"</s>", 2}}}; }},
      {"sp_llama2", "post_processor.processors", "must be a list of post-processors",
       [](J& j) { j["post_processor"] = {{"type", "Sequence"}}; }},
      {"sp_llama2", "the special-token rule", "outside the vocabulary",
       [](J& j) { j["post_processor"]["special_tokens"]["<s>"]["ids"] = {4000}; }},
      // tokenizer_config.json
      {"sp_llama2", "bos_token", "must be a token string or {\"content\"", [](J&) {},
       J{{"add_bos_token", true}, {"bos_token", 5}}},
      {"sp_llama2", "bos_token", "is not a token of", [](J&) {}, J{{"add_bos_token", true}, {"bos_token", "<nope>"}}},
      {"sp_llama2", "add_bos_token", "must be true or false", [](J&) {}, J{{"add_bos_token", "yes"}, {"bos_token", "<s>"}}},
      // SentencePiece-style BPE
      {"sp_metaspace", "pre_tokenizer.prepend_scheme", "is not one of always, first, never",
       [](J& j) { j["pre_tokenizer"]["prepend_scheme"] = "sometimes"; }},
      {"sp_metaspace", "pre_tokenizer.type", "Metaspace or no pre_tokenizer",
       [](J& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }},
      {"sp_metaspace", "pre_tokenizer.replacement", "must be a string",
       [](J& j) { j["pre_tokenizer"].erase("replacement"); }},
      {"sp_llama2", "normalizer.normalizers", "must be a list of normalizers",
       [](J& j) { j["normalizer"].erase("normalizers"); }},
      {"sp_llama2", "decoder.decoders", "must be a list of decoders", [](J& j) { j["decoder"].erase("decoders"); }},
      {"sp_llama2", "decoder.decoders[3]", "start/stop must be >= 0",
       [](J& j) { j["decoder"]["decoders"][3]["start"] = -1; }},
      {"sp_llama2", "added_tokens[0]", "needs integer 'id' and string 'content'",
       [](J& j) { j["added_tokens"][0]["id"] = "zero"; }},
      {"sp_llama2", "added_tokens", "must be a list", [](J& j) { j["added_tokens"] = J::object(); }},
      {"sp_llama2", "model.continuing_subword_prefix", "is set", [](J& j) { j["model"]["continuing_subword_prefix"] = "##"; }},
      {"sp_llama2", "model.vocab[\"<unk>\"]", "is not a valid token id", [](J& j) { j["model"]["vocab"]["<unk>"] = "zero"; }},
      {"sp_llama2", "model.vocab", "is missing", [](J& j) { j["model"].erase("vocab"); }},
      {"sp_llama2", "model.merges", "is missing (a list)", [](J& j) { j["model"].erase("merges"); }},
      {"sp_llama2", "model.merges[0]", "is not \"left right\"", [](J& j) { j["model"]["merges"][0] = "h e x"; }},
      {"sp_llama2", "model.merges[1]", "is neither \"a b\" nor", [](J& j) { j["model"]["merges"][1] = {1, 2}; }},
      {"sp_llama2", "model.merges[0]", "is not in model.vocab", [](J& j) { j["model"]["merges"][0] = {"h", "\xC3\xBF"}; }},
      {"sp_llama2", "model.unk_token", "is not in model.vocab", [](J& j) { j["model"]["unk_token"] = "<nope>"; }},
      {"sp_llama2", "model.type", "BPE tokenizers only", [](J& j) { j["model"]["type"] = "WordPiece"; }},
      {"sp_llama2", "'model'", "missing object field", [](J& j) { j.erase("model"); }},
      // byte-level BPE (load_tokenizer_json and the byte-level reader itself)
      {"bytelevel_qwen", "model.vocab[\"a\"]", "is not a valid token id", [](J& j) { j["model"]["vocab"]["a"] = -1; }},
      {"bytelevel_qwen", "model.merges[0]", "is not \"left right\"", [](J& j) { j["model"]["merges"][0] = "he"; }},
      {"bytelevel_qwen", "model.merges[1]", "is neither \"a b\" nor", [](J& j) { j["model"]["merges"][1] = 7; }},
      {"bytelevel_qwen", "model.merges", "missing array field", [](J& j) { j["model"].erase("merges"); }},
      {"bytelevel_qwen", "added_tokens[1]", "needs integer 'id' and string 'content'",
       [](J& j) { j["added_tokens"][1].erase("content"); }},
      {"bytelevel_qwen", "added_tokens[2].rstrip", "matches added tokens verbatim only",
       [](J& j) { j["added_tokens"][2]["rstrip"] = true; }},
      {"bytelevel_qwen", "normalizer.type \"NFKC\"", "is not supported", [](J& j) { j["normalizer"] = {{"type", "NFKC"}}; }},
      {"bytelevel_qwen", "pre_tokenizer.pretokenizers[0].pattern.Regex", "is missing (string split patterns",
       [](J& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", " "}}; }},
      {"bytelevel_qwen", "pre_tokenizer.pretokenizers[0].pattern.Regex", "split regex kvgate does not implement",
       [](J& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+"; }},
      {"bytelevel_qwen", "pre_tokenizer.type \"Punctuation\"", "is not supported by kvgate's byte-level BPE",
       [](J& j) { j["pre_tokenizer"] = {{"type", "Punctuation"}}; }},
      {"bytelevel_qwen", "model.vocab", "lacks the byte-level base tokens", [](J& j) { j["model"]["vocab"].erase("a"); }},
      {"bytelevel_qwen", "model.type", "byte-level BPE tokenizers only", [](J& j) { j["model"]["type"] = "Unigram"; }, nullptr,
       true},
      {"bytelevel_qwen", "'model'", "missing object field", [](J& j) { j["model"] = 3; }, nullptr, true},
  };
  for (const Bad& b : bad) {
    J j = base.at(b.base);
    b.edit(j);
    write_json_file(p, j);
    if (!b.config.is_null()) write_json_file(cfg, b.config);
    const std::string msg = model_error([&] {
      if (b.byte_level_reader) BpeTokenizer::from_tokenizer_json(p.string(), -1, -1);
      else load_tokenizer_json(p.string(), -1, -1, b.config.is_null() ? std::string() : cfg.string());
    });
    INFO(b.base << " " << b.field << ": " << esc(msg));
    CHECK(has(msg, (b.config.is_null() ? p : cfg).string() + ": "));
    CHECK(has(msg, b.field));
    CHECK(has(msg, b.why));
    fs::remove(cfg);
  }
  // A file that is not JSON, through the byte-level reader.
  write_bytes(p, "{\"model\": ");
  const std::string msg = model_error([&] { BpeTokenizer::from_tokenizer_json(p.string(), -1, -1); });
  CHECK(has(msg, p.string() + ": not valid JSON"));
}

// MOD.tok.variants: the accepted variants of a field encode as their definition says (bound: exact
// token ids). Each variant is compared with an equivalent spelling or a hand-computed id list; the
// anti-vacuity checks show each edit changes the encoding where the definition says it must.
TEST_CASE("MOD.tok.variants equivalent spellings of a tokenizer.json field encode identically",
          "[gate:MOD][fmt:none]") {
  TempDir t;
  using J = nlohmann::json;
  const J sp = read_json_file(refs_dir() / "sp_llama2" / "tokenizer.json");
  const J ms = read_json_file(refs_dir() / "sp_metaspace" / "tokenizer.json");
  const J bl = read_json_file(refs_dir() / "bytelevel_qwen" / "tokenizer.json");
  int n = 0;
  auto load = [&](const J& j, const J& config = nullptr) {
    const fs::path p = t.path() / ("v" + std::to_string(n++) + ".json");
    write_json_file(p, j);
    fs::path c;
    if (!config.is_null()) write_json_file(c = t.path() / ("c" + std::to_string(n) + ".json"), config);
    return load_tokenizer_json(p.string(), -1, -1, c.string());
  };
  const std::vector<std::string> texts = {"hello world", " the cat sat", "it's 12345 caf\xC3\xA9!", "a\n\nb  c"};
  auto same = [&](const Tokenizer& a, const Tokenizer& b) {
    for (const auto& s : texts)
      if (a.encode(s, true) != b.encode(s, true)) return false;
    return true;
  };
  const auto sp0 = load(sp), ms0 = load(ms), bl0 = load(bl);
  const auto id = [](const J& j, const std::string& piece) { return j["model"]["vocab"].at(piece).get<int>(); };

  SECTION("RobertaProcessing: cls before, sep after") {
    J j = sp;
    j["post_processor"] = {{"type", "RobertaProcessing"}, {"cls", {"<s>", 1}}, {"sep", {"</s>", 2}}};
    const auto r = load(j);
    std::vector<int> want = {1};
    for (int x : sp0->encode("hello", false)) want.push_back(x);
    want.push_back(2);
    CHECK(r->encode("hello", true) == want);
    CHECK(sp0->encode("hello", true).back() != 2);
  }
  SECTION("tokenizer_config.json: {\"content\"} tokens, and a token found in model.vocab") {
    const auto r = load(sp, J{{"add_bos_token", true}, {"bos_token", {{"content", "<s>"}}},
                              {"add_eos_token", true}, {"eos_token", "\xE2\x96\x81t"}});
    std::vector<int> want = {1};
    for (int x : sp0->encode("hello", false)) want.push_back(x);
    want.push_back(id(sp, "\xE2\x96\x81t"));
    CHECK(r->encode("hello", true) == want);
    CHECK(r->eos_id() == id(sp, "\xE2\x96\x81t"));
  }
  SECTION("Metaspace prepend_scheme never / always, the older add_prefix_space, a one-item Sequence") {
    auto with = [&](const std::function<void(J&)>& f) {
      J j = ms;
      f(j["pre_tokenizer"]);
      return load(j);
    };
    const auto never = with([](J& q) { q["prepend_scheme"] = "never"; });
    const auto always = with([](J& q) { q["prepend_scheme"] = "always"; });
    CHECK(never->encode(" hello", false) == always->encode("hello", false));
    CHECK(never->encode("hello", false) != always->encode("hello", false));  // the prefix matters
    const auto old_no = with([](J& q) { q.erase("prepend_scheme"), q["add_prefix_space"] = false; });
    const auto old_yes = with([](J& q) { q.erase("prepend_scheme"), q["add_prefix_space"] = true; });
    CHECK(same(*old_no, *never));
    CHECK(same(*old_yes, *always));
    const auto seq = with([](J& q) { q = {{"type", "Sequence"}, {"pretokenizers", {q}}}; });
    CHECK(same(*seq, *ms0));
  }
  SECTION("merges as \"a b\" strings == merges as pairs") {
    J j = sp;
    for (auto& m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
    CHECK(same(*load(j), *sp0));
  }
  SECTION("ignore_merges: a word in the vocabulary is one token, with no merge at all") {
    std::string word;  // the longest vocabulary piece "▁" + lowercase letters
    for (auto it = sp["model"]["vocab"].begin(); it != sp["model"]["vocab"].end(); ++it) {
      const std::string& k = it.key();
      if (k.rfind("\xE2\x96\x81", 0) == 0 && k.size() > word.size() &&
          std::all_of(k.begin() + 3, k.end(), [](char c) { return c >= 'a' && c <= 'z'; }))
        word = k;
    }
    REQUIRE(word.size() >= 6);
    J j = sp;
    j["model"]["merges"] = J::array();
    const auto plain = load(j);
    j["model"]["ignore_merges"] = true;
    const auto whole = load(j);
    CHECK(whole->encode(word.substr(3), false) == std::vector<int>{id(sp, word)});
    CHECK(plain->encode(word.substr(3), false).size() == word.size() - 2);  // one token per character
    // The byte-level reader, the same rule.
    J b = bl;
    b["model"]["merges"] = J::array();
    const auto bplain = load(b);
    b["model"]["ignore_merges"] = true;
    const auto bwhole = load(b);
    CHECK(bwhole->encode(" the", false) == std::vector<int>{id(bl, "\xC4\xA0the")});
    CHECK(bplain->encode(" the", false).size() == 4);
  }
  SECTION("no byte fallback: an unknown character is <unk>, fused when fuse_unk") {
    J j = sp;
    j["model"]["byte_fallback"] = false;
    const std::string two = "\xE4\xB8\x80\xE4\xB8\x81";  // two CJK characters outside the vocabulary
    const auto fused = load(j);
    j["model"]["fuse_unk"] = false;
    const auto unfused = load(j);
    const int unk = id(sp, "<unk>");
    auto count = [&](const std::vector<int>& v) { return std::count(v.begin(), v.end(), unk); };
    CHECK(count(fused->encode(two, false)) == 1);
    CHECK(count(unfused->encode(two, false)) == 2);
    CHECK(count(sp0->encode(two, false)) == 0);  // with byte fallback: bytes, no unk
  }
  SECTION("an added token with normalized = true matches the normalized text") {
    J j = sp;
    const int tid = id(sp, "\xE2\x96\x81t");
    j["added_tokens"].push_back({{"id", tid}, {"content", "hello world"}, {"normalized", true}, {"special", false}});
    const auto r = load(j);
    CHECK(r->encode("hello world", false) == std::vector<int>{tid});
    CHECK(sp0->encode("hello world", false).size() > 1);
  }
  SECTION("byte-level: ByteLevel use_regex == a Split with the GPT-2 pattern") {
    const std::string gpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
    J x = bl;  // a merge across the word boundary, so a missing split shows in the ids
    x["model"]["vocab"]["e\xC4\xA0"] = static_cast<int>(x["model"]["vocab"].size());
    x["model"]["merges"].insert(x["model"]["merges"].begin(), J{"e", "\xC4\xA0"});
    J a = x, b = x, c = x;
    a["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    b["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = gpt2;
    c["pre_tokenizer"] = nullptr;  // no split at all
    const auto ta = load(a), tb = load(b), tc = load(c);
    CHECK(same(*ta, *tb));
    CHECK(!same(*ta, *tc));
  }
  SECTION("byte-level: a merge whose result is not a token falls back to the byte tokens") {
    J j = bl;
    REQUIRE(!j["model"]["vocab"].contains("xq"));
    j["model"]["merges"].insert(j["model"]["merges"].begin(), J{"x", "q"});
    CHECK(load(j)->encode("xq", false) == std::vector<int>{id(bl, "x"), id(bl, "q")});
    j = bl;
    j["model"]["vocab"].erase("q");  // 'a' and the space stay: the file loads, "q" cannot be encoded
    for (auto& m : j["model"]["merges"]) {
      const std::string l = m[0], r = m[1];
      if (l.find('q') != std::string::npos || r.find('q') != std::string::npos) m = J{"\xC4\xA0", "\xC4\xA0"};
    }
    const auto noq = load(j);
    CHECK(noq->encode("a", false) == std::vector<int>{id(bl, "a")});
    const std::string msg = model_error([&] { noq->encode("q", false); });
    CHECK(has(msg, "no token for byte 0x71"));
  }
}
