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
// Each case's GGUF also carries the directory's tokenizer (tokenizer.ggml.*): its BOS/EOS rule must be
// transformers' (ref.json bos_added) and the tokenizer.json load's.
// MOD.gguf.tool_refuses: the converter refuses what GGUF cannot spell (dynamic NTK) instead of
// writing a plain-RoPE file.
// MOD.gguf.tokenizer.<kind>: each datasets/models/hf_refs/tokenizers/<kind> converted with
// --tokenizer (into a reference model of the same vocabulary size) and loaded by the GGUF loader:
// encode(text, true / false), decode and decode_piece give exactly the `tokenizers` library's ids and
// text (tok_ref.json; bound: exact equality, ids are integers and text is bytes), and the BOS/EOS rule
// is the tokenizer.json path's. sp_metaspace is checked against sp_llama2's references (same
// vocabulary and merges, checked): Metaspace(prepend_scheme "first") has no GGUF spelling and
// llama.cpp prefixes every text fragment, as sp_llama2's Prepend normalizer does. Anti-vacuity: at
// least 8 non-empty texts, multi-byte UTF-8, >= 10 merged tokens, >= 2 texts with special tokens
// inside, byte-fallback tokens for the SentencePiece kinds, and all (sp_metaspace: >= 5) texts equal
// to the kind's own references.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kvgate/build_paths.hpp"
#include "catch_compat.hpp"
#include "printable.hpp"
#include "hf_ref_harness.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/rope.hpp"
#include "kvgate/tokenizer_bpe.hpp"
#include "kvgate/tokenizer_json.hpp"
#include "kvgate/tokenizer_sp.hpp"

using namespace kvgate;
using namespace kvgate::gates::hf_ref;

namespace {

std::string source_dir() {
  if (const char* s = std::getenv("KVGATE_SOURCE_DIR"); s && *s) return s;
  return KVGATE_SOURCE_DIR_DEFAULT;
}

std::string out_dir() {
  if (const char* e = std::getenv("KVGATE_GGUF_REFS_OUT"); e && *e) return e;
  return (fs::path(KVGATE_GGUF_BINARY_DIR) / "gguf_refs").string();
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs the converter; returns its exit status and output.
// `tokenizer`: a tokenizer directory for --tokenizer (empty: the model directory's own).
int run_tool(const std::string& src, const std::string& dst, std::string* log, const std::string& tokenizer = {}) {
  const fs::path tool = fs::path(source_dir()) / "datasets" / "tools" / "hf_to_gguf.py";
  const fs::path lp = fs::path(dst).string() + ".log";
  const std::string tok = tokenizer.empty() ? std::string() : "--tokenizer '" + tokenizer + "' ";
  const std::string cmd = std::string("'") + KVGATE_PYTHON + "' '" + tool.string() + "' " + tok + "'" + src + "' '" +
                          dst + "' > '" + lp.string() + "' 2>&1";
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
  CHECK(same_bits(wb.tok_embeddings, wa.tok_embeddings));
  CHECK(same_bits(wb.final_norm, wa.final_norm));
  CHECK(same_bits(wb.classifier, wa.classifier));
  REQUIRE(wb.layers.size() == wa.layers.size());
  using LW = LayerWeights;
  for (std::size_t l = 0; l < wa.layers.size(); ++l) {
    const LW &x = wa.layers[l], &y = wb.layers[l];
    INFO("layer " << l);
    CHECK(same_bits(permuted ? unpermute(y.wq, b.n_heads, b.head_dim, b.dim) : y.wq.f32(), x.wq));
    CHECK(same_bits(permuted ? unpermute(y.wk, b.n_kv_heads, b.head_dim, b.dim) : y.wk.f32(), x.wk));
    int k = 0;
    for (Weight LW::*f : {&LW::wv, &LW::wo, &LW::w1, &LW::w2, &LW::w3}) {
      INFO("matrix " << k++ << " of wv, wo, w1, w2, w3");
      CHECK(same_bits(y.*f, x.*f));
    }
    k = 0;
    for (std::vector<float> LW::*f : {&LW::bq, &LW::bk, &LW::bv, &LW::q_norm, &LW::k_norm, &LW::attn_norm,
                                      &LW::ffn_norm, &LW::post_attn_norm, &LW::post_ffn_norm}) {
      INFO("tensor " << k++ << " of bq, bk, bv, q_norm, k_norm, attn_norm, ffn_norm, post_attn_norm, post_ffn_norm");
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
  {
    // The converter wrote the directory's tokenizer: the GGUF BOS/EOS rule is transformers' (ref.json).
    INFO("MOD.gguf." << name << ": the GGUF's tokenizer.ggml.* against the tokenizer.json load");
    REQUIRE(gg.tokenizer);
    REQUIRE(hf.m.tokenizer);
    CHECK(gg.tokenizer->adds_bos() == hf.rc.ref.at("bos_added").get<bool>());
    CHECK(gg.tokenizer->adds_bos() == hf.m.tokenizer->adds_bos());
    CHECK(gg.tokenizer->adds_eos() == hf.m.tokenizer->adds_eos());
    CHECK(gg.tokenizer->encode("Hello world", true) == hf.m.tokenizer->encode("Hello world", true));
  }
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

// ---- MOD.gguf.tokenizer.<kind> ------------------------------------------------------------------------
namespace {

fs::path tokenizers_dir() { return fs::path(refs_root()) / "tokenizers"; }

std::string esc(const std::string& s) { return gates::printable(s); }

std::vector<std::vector<int>> ids_of(const json& ref, const char* key) {
  std::vector<std::vector<int>> out;
  for (const auto& v : ref.at(key)) out.push_back(v.get<std::vector<int>>());
  return out;
}

// The references one kind is checked against: its own tok_ref.json, or, for a rule GGUF cannot spell,
// another kind's of the same vocabulary (`rule_kind`).
struct TokRefs {
  std::vector<std::string> texts, decoded;
  std::vector<std::vector<int>> ids, plain;
  bool bos_added = false, eos_added = false;
  int bos = -1, eos = -1, vocab = 0;
};

TokRefs tok_refs(const std::string& kind) {
  const json r = read_json(tokenizers_dir() / kind / "tok_ref.json");
  TokRefs t;
  t.texts = r.at("texts").get<std::vector<std::string>>();
  t.decoded = r.at("decoded").get<std::vector<std::string>>();
  t.ids = ids_of(r, "ids");
  t.plain = ids_of(r, "ids_no_special");
  t.bos_added = r.at("bos_added").get<bool>();
  t.eos_added = r.at("eos_added").get<bool>();
  const json& st = r.at("special_tokens");
  t.bos = st.at("bos").is_null() ? -1 : st.at("bos").get<int>();
  t.eos = st.at("eos").is_null() ? -1 : st.at("eos").get<int>();
  t.vocab = r.at("vocab_size").get<int>();
  REQUIRE(t.texts.size() >= 8);
  REQUIRE(t.ids.size() == t.texts.size());
  REQUIRE(t.plain.size() == t.texts.size());
  REQUIRE(t.decoded.size() == t.texts.size());
  return t;
}

// Converts `model_case` with --tokenizer tokenizers/<kind> and loads the GGUF.
Model converted_with_tokenizer(const std::string& kind, const std::string& model_case, std::string* log) {
  const RefCase rc = load_case(model_case);
  fs::create_directories(out_dir());
  const std::string dst = (fs::path(out_dir()) / ("tokenizer_" + kind + ".gguf")).string();
  std::error_code ec;
  fs::remove(dst, ec);
  const int status = run_tool(rc.dir, dst, log, (tokenizers_dir() / kind).string());
  std::cout << *log;
  INFO("MOD.gguf.tokenizer." << kind << ": datasets/tools/hf_to_gguf.py failed:\n" << *log);
  REQUIRE(status == 0);
  try {
    return load_model(dst);
  } catch (const std::exception& e) {
    FAIL("MOD.gguf.tokenizer." << kind << ": kvgate's GGUF loader refuses '" << dst << "': " << e.what());
  }
  return {};
}

// `rule_kind`: the kind whose references hold llama.cpp's rule where it differs from `kind`'s
// tokenizer.json (same vocabulary and merges, checked); empty when they are the same.
void gguf_tokenizer_case(const std::string& kind, const std::string& model_case, bool sentencepiece,
                         const std::string& rule_kind = {}) {
  std::string log;
  const Model m = converted_with_tokenizer(kind, model_case, &log);
  const std::string expect_model = sentencepiece ? "llama" : "gpt2";
  CHECK(log.find("tokenizer.ggml.model " + expect_model) != std::string::npos);
  REQUIRE(m.tokenizer);
  const Tokenizer& tk = *m.tokenizer;
  const auto* sp = dynamic_cast<const SpTokenizer*>(m.tokenizer.get());
  const auto* bl = dynamic_cast<const BpeTokenizer*>(m.tokenizer.get());
  REQUIRE((sentencepiece ? sp != nullptr : bl != nullptr));

  // The tokenizer.json path of the same directory: the BOS/EOS rule must be the same.
  const fs::path d = tokenizers_dir() / kind;
  const auto hf = load_tokenizer_json((d / "tokenizer.json").string(), -1, -1, (d / "tokenizer_config.json").string());
  const TokRefs own = tok_refs(kind);
  CHECK(tk.adds_bos() == hf->adds_bos());
  CHECK(tk.adds_eos() == hf->adds_eos());
  CHECK(tk.adds_bos() == own.bos_added);
  CHECK(tk.adds_eos() == own.eos_added);
  if (own.bos_added) CHECK(tk.bos_id() == own.bos);
  if (own.eos >= 0) CHECK(tk.eos_id() == own.eos);
  CHECK(tk.vocab_size() == own.vocab);

  TokRefs ref = own;
  int agree = 0;  // texts whose GGUF ids are the kind's own tokenizers-library ids
  if (!rule_kind.empty()) {
    const json a = read_json(d / "tokenizer.json").at("model"), b = read_json(tokenizers_dir() / rule_kind / "tokenizer.json").at("model");
    REQUIRE(a.at("vocab") == b.at("vocab"));
    REQUIRE(a.at("merges") == b.at("merges"));
    ref = tok_refs(rule_kind);
    REQUIRE(ref.texts == own.texts);
    CHECK(ref.bos_added == own.bos_added);
  }
  const std::size_t n = ref.texts.size();
  int non_empty = 0, multibyte = 0, byte_tokens = 0, merged = 0, specials_in_text = 0, streamed_checked = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::string& text = ref.texts[i];
    INFO(kind << " text " << i << ": \"" << esc(text) << "\"");
    const std::vector<int> with = tk.encode(text, true), plain = tk.encode(text, false);
    CHECK(with == ref.ids[i]);
    CHECK(plain == ref.plain[i]);
    agree += plain == own.plain[i] && with == own.ids[i];
    CHECK(esc(tk.decode(ref.plain[i])) == esc(ref.decoded[i]));
    // decode_piece, token by token, as `kvgate run` prints: the same text, except that streaming also
    // strips the prefix after a BOS (where a generation starts), so texts with a BOS inside are left out.
    if (std::find(ref.plain[i].begin(), ref.plain[i].end(), tk.bos_id()) == ref.plain[i].end()) {
      std::string streamed;
      for (std::size_t k = 0; k < ref.plain[i].size(); ++k)
        streamed += tk.decode_piece(k ? ref.plain[i][k - 1] : -1, ref.plain[i][k]);
      CHECK(esc(streamed) == esc(ref.decoded[i]));
      ++streamed_checked;
    }
    non_empty += !text.empty();
    multibyte += std::any_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0xC0; });
    bool special = false;
    for (int id : ref.plain[i]) {
      if (sp) {
        const std::string& p = sp->piece(id);
        byte_tokens += p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>';
        special = special || id == own.bos || id == own.eos || p == "<unk>" || p == "<pad>";
        // A merged piece: more than one UTF-8 code point (not a special, not a byte token).
        int cps = 0;
        for (unsigned char c : p) cps += (c & 0xC0) != 0x80;
        merged += cps > 1 && p[0] != '<';
      } else {
        bool added = false;
        for (const auto& a : bl->options().added) added = added || a.id == id;
        special = special || added;
        int cps = 0;
        for (unsigned char c : bl->token_string(id)) cps += (c & 0xC0) != 0x80;
        merged += !added && cps > 1;
      }
    }
    specials_in_text += special;
  }
  std::cout << "MOD.gguf.tokenizer." << kind << ": " << n << " texts (" << non_empty << " non-empty, " << multibyte
            << " multi-byte UTF-8), " << agree << " equal to " << kind << "'s own tokenizers-library ids"
            << (rule_kind.empty() ? "" : ", all equal to " + rule_kind + "'s (llama.cpp's prefix rule)") << "; "
            << byte_tokens << " byte-fallback tokens, " << merged << " merged tokens, " << specials_in_text
            << " texts with special tokens inside\n";
  // Anti-vacuity.
  CHECK(non_empty >= 8);
  CHECK(multibyte >= 1);
  CHECK(merged >= 10);
  CHECK(specials_in_text >= 2);
  CHECK(streamed_checked >= 8);
  if (sentencepiece) CHECK(byte_tokens >= 1);
  if (rule_kind.empty()) CHECK(agree == static_cast<int>(n));
  else CHECK(agree >= 5);  // the rules differ only after a special token and before a leading space
}

}  // namespace

TEST_CASE("MOD.gguf.tokenizer.bytelevel_llama3 converted tokenizer (gpt2, llama-bpe): ids == the tokenizers library's",
          "[gate:MOD][fmt:none]") {
  gguf_tokenizer_case("bytelevel_llama3", "llama_default", false);
}

TEST_CASE("MOD.gguf.tokenizer.bytelevel_qwen converted tokenizer (gpt2, qwen2, no BOS): ids == the tokenizers library's",
          "[gate:MOD][fmt:none]") {
  gguf_tokenizer_case("bytelevel_qwen", "qwen2", false);
}

TEST_CASE("MOD.gguf.tokenizer.sp_llama2 converted tokenizer (llama, byte fallback): ids == the tokenizers library's",
          "[gate:MOD][fmt:none]") {
  gguf_tokenizer_case("sp_llama2", "llama_sp", true);
}

TEST_CASE("MOD.gguf.tokenizer.sp_gemma converted tokenizer (llama, no space prefix): ids == the tokenizers library's",
          "[gate:MOD][fmt:none]") {
  gguf_tokenizer_case("sp_gemma", "gemma2", true);
}

// Metaspace(prepend_scheme "first") has no GGUF spelling: llama.cpp prefixes every text fragment, as
// sp_llama2's Prepend normalizer does on the same vocabulary, so that kind's references hold the ids.
TEST_CASE("MOD.gguf.tokenizer.sp_metaspace converted tokenizer (llama): ids == the tokenizers library's under llama.cpp's prefix rule",
          "[gate:MOD][fmt:none]") {
  gguf_tokenizer_case("sp_metaspace", "mistral_swa", true, "sp_llama2");
}

// The converter refuses a tokenizer it cannot write faithfully, naming the file and the field.
TEST_CASE("MOD.gguf.tool_refuses_tokenizer missing byte pieces, a vocabulary past the model's, no tokenizer.json: refused",
          "[gate:MOD][fmt:none]") {
  fs::create_directories(out_dir());
  const fs::path work = fs::path(out_dir()) / "tokenizer_refusals";
  std::error_code ec;
  fs::remove_all(work, ec);
  fs::create_directories(work);
  auto refused = [&](const std::string& name, const std::string& model_case, const fs::path& tok,
                     const std::vector<std::string>& words) {
    const std::string dst = (work / (name + ".gguf")).string();
    std::string log;
    const int status = run_tool(load_case(model_case).dir, dst, &log, tok.string());
    INFO(name << ":\n" << log);
    CHECK(status != 0);
    CHECK(!fs::exists(dst));
    for (const auto& w : words) CHECK(log.find(w) != std::string::npos);
  };
  // sp_llama2 without its <0x41> piece (the id left to a [PAD] slot).
  const fs::path nb = work / "no_byte";
  fs::create_directories(nb);
  json tj = read_json(tokenizers_dir() / "sp_llama2" / "tokenizer.json");
  REQUIRE(tj.at("model").at("vocab").erase("<0x41>") == 1);
  std::ofstream(nb / "tokenizer.json") << tj.dump();
  fs::copy_file(tokenizers_dir() / "sp_llama2" / "tokenizer_config.json", nb / "tokenizer_config.json");
  refused("no_byte", "llama_sp", nb, {"tokenizer.json", "model.vocab", "<0x41>"});
  // A 596-piece tokenizer into a 420-token model.
  refused("too_big", "llama_default", tokenizers_dir() / "sp_llama2", {"tokenizer.json", "vocab_size"});
  // --tokenizer naming a folder without tokenizer.json.
  refused("no_file", "llama_sp", work, {"--tokenizer", "no tokenizer.json"});
  fs::remove_all(work, ec);
}
