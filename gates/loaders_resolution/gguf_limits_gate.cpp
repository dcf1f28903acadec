// STO.loader.gguf_limits, STO.loader.gguf_dims and STO.loader.tokenizer_limits: every count and
// length a GGUF file or a tokenizer.json states is checked against its limit in runtime/limits
// (kvgate/limits.hpp) before anything is sized by it, and the refusal names the file, the field, the
// value, the limit and the KVGATE_LIMIT_<NAME> override. Anti-vacuity: with each limit lowered (the
// override) to exactly what the file holds, the file loads; one below, it is refused.
// STO.loader.gguf_scores: every tokenizer.ggml.scores element finite and within float32's range.
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvgate/build_paths.hpp"
#include "catch_compat.hpp"
#include "fixtures.hpp"
#include "gguf_writer.hpp"
#include "limit_fixtures.hpp"
#include "kvgate/limits.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/tokenizer_json.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace fs = std::filesystem;

namespace {

SynthTensor f32_tensor(const std::string& name, std::vector<std::uint64_t> ne, float base) {
  std::size_t n = 1;
  for (auto e : ne) n *= e;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = base + 0.01f * static_cast<float>(static_cast<int>(i % 7) - 3);
  SynthTensor t{name, std::move(ne), 0, std::vector<std::uint8_t>(n * 4), x};
  std::memcpy(t.data.data(), x.data(), n * 4);
  return t;
}

// What the tiny GGUF holds, per limit (the figures the gate lowers each limit to).
constexpr std::uint64_t kTensors = 11, kKv = 14, kNameBytes = 200, kArray = 100, kVocabN = 16, kMergesN = 3,
                        kLongPiece = 40, kLargestTensor = 32 * 64;

// A tiny F32 llama GGUF (dim 32, 4 heads, 2 KV heads, FFN 64, 1 layer) with a SentencePiece
// vocabulary of 16 pieces (the last `piece_bytes` long), a 200-byte general.name, an unread
// i32 array of 100 and 3 merges. `scores` (when given) replaces the scores -1, as f64 when `f64`;
// without `tokenizer`, the four tokenizer keys are left out.
std::vector<std::uint8_t> tiny_gguf(std::size_t piece_bytes = kLongPiece, const std::vector<double>& scores = {},
                                    bool f64 = false, bool tokenizer = true) {
  std::vector<SynthTensor> ts;
  ts.push_back(f32_tensor("token_embd.weight", {32, kVocabN}, 0.0f));
  ts.push_back(f32_tensor("output_norm.weight", {32}, 1.0f));
  const std::string p = "blk.0.";
  ts.push_back(f32_tensor(p + "attn_norm.weight", {32}, 1.0f));
  ts.push_back(f32_tensor(p + "attn_q.weight", {32, 32}, 0.0f));
  ts.push_back(f32_tensor(p + "attn_k.weight", {32, 16}, 0.0f));
  ts.push_back(f32_tensor(p + "attn_v.weight", {32, 16}, 0.0f));
  ts.push_back(f32_tensor(p + "attn_output.weight", {32, 32}, 0.0f));
  ts.push_back(f32_tensor(p + "ffn_norm.weight", {32}, 1.0f));
  ts.push_back(f32_tensor(p + "ffn_gate.weight", {32, 64}, 0.0f));
  ts.push_back(f32_tensor(p + "ffn_up.weight", {32, 64}, 0.0f));
  ts.push_back(f32_tensor(p + "ffn_down.weight", {64, 32}, 0.0f));
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
  for (char ch = 'a'; pieces.size() < kVocabN - 1; ++ch) pieces.push_back(std::string(1, ch));
  pieces.push_back(std::string(piece_bytes, 'z'));
  GgufWriter w;
  w.header(3, ts.size(), tokenizer ? kKv : kKv - 4);
  w.kv_str("general.architecture", "llama");
  w.llama_shape(32, 64, 1, 4, 2, 64, 10000.0f);
  w.kv_str("general.name", std::string(kNameBytes, 'n'));
  w.kv_i32s("kvgate.test.unread", std::vector<std::int32_t>(kArray, 7));
  if (tokenizer) {
    w.kv_str("tokenizer.ggml.model", "llama");
    w.kv_strs("tokenizer.ggml.tokens", pieces);
    if (scores.empty()) w.kv_f32s("tokenizer.ggml.scores", std::vector<float>(kVocabN, -1.0f));
    else if (f64) w.kv_f64s("tokenizer.ggml.scores", scores);
    else w.kv_f32s("tokenizer.ggml.scores", std::vector<float>(scores.begin(), scores.end()));
    w.kv_strs("tokenizer.ggml.merges", {"a b", "b c", "c d"});
  }
  w.tensors(ts, 32);
  return w.b;
}

std::string write_gguf(const TempDir& t, const std::string& name, const std::vector<std::uint8_t>& b) {
  const std::string path = t.sub(name);
  write_bytes(path, std::string(b.begin(), b.end()));
  return path;
}

void check_refusal(const std::string& msg, const std::string& file, const std::string& field, std::uint64_t value,
                   const std::string& limit) {
  INFO(msg);
  CHECK(has(msg, file));
  CHECK(has(msg, field));
  CHECK(has(msg, "= " + std::to_string(value)));
  CHECK(has(msg, "exceeds the limit"));
  CHECK(has(msg, "KVGATE_LIMIT_" + limit));
}

}  // namespace

TEST_CASE("STO.loader.gguf_limits GGUF counts, lengths and tensor sizes over their limits are refused before any allocation",
          "[gate:STO][fmt:none]") {
  // Bound: each limit of runtime/limits (kvgate/limits.hpp), lowered through its KVGATE_LIMIT_<NAME>
  // override to exactly what the tiny file holds: at the limit it loads, one below it is refused.
  TempDir t;
  const std::string path = write_gguf(t, "tiny.gguf", tiny_gguf());
  const Model m = load_gguf(path);  // anti-vacuity: the file loads with every default limit
  REQUIRE(m.config.vocab_size == static_cast<int>(kVocabN));
  REQUIRE(m.tokenizer);
  struct Case {
    const char* limit;
    std::uint64_t held;  // what the file holds
    const char* field;
  };
  for (const Case& c : {Case{"TENSORS", kTensors, "tensor_count"}, Case{"METADATA", kKv, "metadata_kv_count"},
                        Case{"STRING_BYTES", kNameBytes, "length of metadata key 'general.name'"},
                        Case{"ARRAY_LEN", kArray, "array length of 'kvgate.test.unread'"},
                        Case{"VOCAB", kVocabN, "array length of 'tokenizer.ggml.tokens'"},
                        Case{"MERGES", kMergesN, "array length of 'tokenizer.ggml.merges'"},
                        Case{"TOKEN_BYTES", kLongPiece, "length of element 15 of 'tokenizer.ggml.tokens'"},
                        Case{"TENSOR_RANK", 2, "n_dims of tensor 'token_embd.weight'"},
                        Case{"TENSOR_ELEMS", kLargestTensor, "elements of tensor 'blk.0.ffn_gate.weight'"}}) {
    INFO("KVGATE_LIMIT_" << c.limit);
    {
      const ScopedLimit at(c.limit, c.held);
      CHECK(limit_refusal([&] { load_gguf(path); }) == "<ok>");
    }
    const ScopedLimit below(c.limit, c.held - 1);
    check_refusal(limit_refusal([&] { load_gguf(path); }), path, c.field, c.held, c.limit);
  }
  // At the default limits: a vocabulary piece one byte over TOKEN_BYTES (65536).
  const std::uint64_t max_piece = limits::kTokenBytes.max;
  const std::string big = write_gguf(t, "piece.gguf", tiny_gguf(max_piece + 1));
  check_refusal(limit_refusal([&] { load_gguf(big); }), big, "'tokenizer.ggml.tokens'", max_piece + 1, "TOKEN_BYTES");
  CHECK(limit_refusal([&] { load_gguf(write_gguf(t, "piece_at.gguf", tiny_gguf(max_piece))); }) == "<ok>");
  // Without a tokenizer, the vocabulary is token_embd.weight's rows: VOCAB before the int cast.
  const std::string bare = write_gguf(t, "bare.gguf", tiny_gguf(kLongPiece, {}, false, false));
  {
    const ScopedLimit at("VOCAB", kVocabN);
    CHECK(limit_refusal([&] { load_gguf(bare); }) == "<ok>");
  }
  const ScopedLimit below("VOCAB", kVocabN - 1);
  check_refusal(limit_refusal([&] { load_gguf(bare); }), bare, "token_embd.weight ne[1] (the vocabulary)", kVocabN,
                "VOCAB");
}

TEST_CASE("STO.loader.gguf_dims tensor dims whose product passes the element limit or the file are refused",
          "[gate:STO][fmt:none]") {
  // Bound: TENSOR_ELEMS (2^36 elements) and the file size, both before any buffer is sized by the dims.
  TempDir t;
  const std::vector<std::uint8_t> good = tiny_gguf();
  // token_embd.weight's dims follow its name: [32, 16] as two u64.
  const std::string name = "token_embd.weight";
  const auto at = std::search(good.begin(), good.end(), name.begin(), name.end()) - good.begin() +
                  static_cast<std::ptrdiff_t>(name.size()) + 4;  // past the name and the u32 n_dims
  auto with_dims = [&](std::uint64_t d0, std::uint64_t d1) {
    std::vector<std::uint8_t> b = good;
    std::memcpy(b.data() + at, &d0, 8);
    std::memcpy(b.data() + at + 8, &d1, 8);
    return b;
  };
  std::uint64_t d0 = 0;
  std::memcpy(&d0, good.data() + at, 8);
  REQUIRE(d0 == 32);  // the offset is right
  // 2^20 x 2^20 = 2^40 elements: over TENSOR_ELEMS.
  const std::string huge = write_gguf(t, "huge.gguf", with_dims(1ull << 20, 1ull << 20));
  const std::string msg = limit_refusal([&] { load_gguf(huge); });
  INFO(msg);
  CHECK(has(msg, huge));
  CHECK(has(msg, "elements of tensor 'token_embd.weight'"));
  CHECK(has(msg, "1099511627776"));
  CHECK(has(msg, "KVGATE_LIMIT_TENSOR_ELEMS"));
  // 32 x 2^30 elements (128 GiB of F32): within the limit, refused against the 5 KB file.
  const std::string big = write_gguf(t, "big.gguf", with_dims(32, 1ull << 30));
  const std::string m2 = model_error([&] { load_gguf(big); });
  INFO(m2);
  CHECK(has(m2, big));
  CHECK(has(m2, "token_embd.weight"));
  CHECK(has(m2, "more than the whole file"));
  CHECK_NOTHROW(load_gguf(write_gguf(t, "good.gguf", good)));
}

TEST_CASE("STO.loader.gguf_scores NaN, infinite and beyond-float vocabulary scores are refused by element",
          "[gate:STO][fmt:none]") {
  // Bound: every tokenizer.ggml.scores element finite and within float32's range (the tokenizer.bin
  // rule); the refusal names the file, the key and the element. Anti-vacuity: the largest float32
  // score (f32 and f64 arrays) and -0 load.
  TempDir t;
  const double fmax = std::numeric_limits<float>::max(), inf = std::numeric_limits<double>::infinity();
  auto scores_with = [](double x) {
    std::vector<double> s(kVocabN, -1.0);
    s[5] = x;
    return s;
  };
  for (const bool f64 : {false, true}) {
    INFO((f64 ? "f64" : "f32") << " scores");
    for (const double ok : {fmax, -fmax, -0.0}) {
      const std::string p = write_gguf(t, "ok.gguf", tiny_gguf(kLongPiece, scores_with(ok), f64));
      CHECK(limit_refusal([&] { load_gguf(p); }) == "<ok>");
    }
    struct Bad {
      double v;
      const char* shown;
    };
    std::vector<Bad> bad = {{std::nan(""), "nan"}, {inf, "inf"}, {-inf, "-inf"}};
    if (f64) bad.push_back({1e300, "1e+300"});
    for (const Bad& b : bad) {
      const std::string p = write_gguf(t, "bad.gguf", tiny_gguf(kLongPiece, scores_with(b.v), f64));
      const std::string msg = model_error([&] { load_gguf(p); });
      INFO(msg);
      CHECK(msg == "model '" + p + "': element 5 of 'tokenizer.ggml.scores' = " + b.shown +
                       " is not a finite float32 score (a corrupted file)");
    }
  }
}

TEST_CASE("STO.loader.tokenizer_limits tokenizer.json vocabulary, merges and piece length over their limits are refused",
          "[gate:STO][fmt:none]") {
  // Bound: VOCAB, MERGES, TOKEN_BYTES and TOKEN_ID of runtime/limits, lowered to exactly what each
  // file holds: at the limit it loads, one below it is refused. Both readers: the byte-level BPE of
  // the synth model and the SentencePiece-style BPE of the committed fuzz seed (byte_fallback).
  TempDir t;
  synth_hf(tiny_options(t.sub("m")));
  for (const fs::path& tok : {fs::path(t.sub("m")) / "tokenizer.json",
                             fs::path(KVGATE_GGUF_LIMITS_SOURCE_DIR) / "fuzz/corpus/tokenizer_json/sp_llama2.json"}) {
    INFO(tok.string());
    const nlohmann::json j = read_json_file(tok);
    const std::uint64_t n_vocab = j["model"]["vocab"].size(), n_merges = j["model"]["merges"].size();
    std::uint64_t longest = 0;
    for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it)
      longest = std::max<std::uint64_t>(longest, it.key().size());
    REQUIRE(n_vocab > 1);
    REQUIRE(n_merges > 1);
    REQUIRE(longest > 1);
    const auto load = [&] { (void)load_tokenizer_json(tok.string(), 1, 2); };
    REQUIRE(limit_refusal(load) == "<ok>");  // anti-vacuity
    // TOKEN_ID: the largest id, a vocabulary entry's or an added token's (checked before any table is sized).
    std::uint64_t max_id = 0;
    std::string id_field;
    for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it)
      if (it->get<std::uint64_t>() > max_id) max_id = it->get<std::uint64_t>(), id_field = "model.vocab[\"" + it.key() + "\"]";
    if (j.contains("added_tokens"))
      for (std::size_t k = 0; k < j["added_tokens"].size(); ++k)
        if (j["added_tokens"][k]["id"].get<std::uint64_t>() > max_id)
          max_id = j["added_tokens"][k]["id"].get<std::uint64_t>(), id_field = "added_tokens[" + std::to_string(k) + "].id";
    REQUIRE(max_id > 1);
    struct Case {
      const char* limit;
      std::uint64_t held;
      const char* field;
    };
    for (const Case& c : {Case{"VOCAB", n_vocab, "model.vocab (entries)"}, Case{"MERGES", n_merges, "model.merges (entries)"},
                          Case{"TOKEN_BYTES", longest, "length of the piece model.vocab["},
                          Case{"TOKEN_ID", max_id, id_field.c_str()}}) {
      INFO("KVGATE_LIMIT_" << c.limit);
      {
        const ScopedLimit at(c.limit, c.held);
        CHECK(limit_refusal(load) == "<ok>");
      }
      const ScopedLimit below(c.limit, c.held - 1);
      check_refusal(limit_refusal(load), tok.string(), c.field, c.held, c.limit);
    }
  }
}
