// STO.loader.llama2c_tokenizer_limits and STO.loader.llama2c_header_limits: the llama2.c files
// (tokenizer.bin: max_token_length, then per token a float32 score, an int32 length and the bytes;
// the checkpoint: a header of 7 int32, then fp32 arrays) checked against the limits policy
// (kvgate/limits.hpp) and against the bytes the file holds, before anything is sized by them.
// Bound: every refusal names the file, the field (the token index or the header field), the value
// and, for a limit, the limit and its KVGATE_LIMIT_<NAME> override (exact substrings). Anti-vacuity:
// with each limit lowered to exactly what the file holds it loads, one below it is refused; the
// accepted neighbours of every refused value (length 0, length = max_token_length, the largest
// finite score) load.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "fixtures.hpp"
#include "limit_fixtures.hpp"
#include "kvgate/limits.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/tokenizer_sp.hpp"

using namespace kvgate;
using namespace kvgate::gates;

namespace {

template <class T>
void put(std::string& b, T v) {
  b.append(reinterpret_cast<const char*>(&v), sizeof v);
}

struct TokEntry {
  float score;
  std::int32_t len;  // the stated length (may differ from piece.size() to corrupt the file)
  std::string piece;
};

std::string tokbin(std::int32_t max_len, const std::vector<TokEntry>& toks) {
  std::string b;
  put(b, max_len);
  for (const TokEntry& t : toks) {
    put(b, t.score);
    put(b, t.len);
    b += t.piece;
  }
  return b;
}

// 11 pieces of 0 to 5 bytes (the longest, " abcd", is max_token_length), score -i: " a" merges before "ab".
std::vector<TokEntry> good_tokens() {
  std::vector<TokEntry> t;
  for (const char* p : {"<unk>", "<s>", "</s>", "", " ", "a", "b", " a", "ab", " ab", " abcd"})
    t.push_back({-static_cast<float>(t.size()), static_cast<std::int32_t>(std::strlen(p)), p});
  return t;
}
constexpr std::int32_t kMaxLen = 5;
constexpr int kVocabN = 11;

void check_limit_refusal(const std::string& msg, const std::string& file, const std::string& field_value,
                         const std::string& limit) {
  INFO(msg);
  CHECK(has(msg, file));
  CHECK(has(msg, field_value));
  CHECK(has(msg, "exceeds the limit"));
  CHECK(has(msg, "KVGATE_LIMIT_" + limit));
}

// A llama2.c legacy checkpoint: the header, then exactly the floats it implies (0.01 each).
std::string llama2c_file(std::vector<std::int32_t> h) {
  std::string b;
  for (std::int32_t v : h) put(b, v);
  const std::uint64_t D = h[0], F = h[1], L = h[2], V = static_cast<std::uint64_t>(std::llabs(h[5])),
                      HD = D / h[3], KV = HD * h[4], S = h[6];
  const std::uint64_t n = V * D + L * (D + 2 * D * D + 2 * KV * D + D + 3 * F * D) + D + S * HD + (h[5] < 0 ? V * D : 0);
  for (std::uint64_t i = 0; i < n; ++i) put(b, 0.01f);
  return b;
}

}  // namespace

TEST_CASE("STO.loader.llama2c_tokenizer_limits tokenizer.bin counts, lengths and scores refused by file, token and limit",
          "[gate:STO][fmt:none]") {
  // Bound: VOCAB and TOKEN_BYTES of runtime/limits (lowered through their override to exactly what
  // the file holds, and at the default TOKEN_BYTES = 65536 bytes); the file size for every length.
  TempDir t;
  const std::string good = t.sub("tok.bin");
  write_bytes(good, tokbin(kMaxLen, good_tokens()));
  const auto load = [](const std::string& p, int vocab = kVocabN) { (void)SpTokenizer::from_llama2c_file(p, vocab); };
  {
    const auto tok = SpTokenizer::from_llama2c_file(good, kVocabN);  // anti-vacuity: the file loads and encodes
    REQUIRE(tok->vocab_size() == kVocabN);
    CHECK(tok->piece(10) == " abcd");
    CHECK(tok->piece(3).empty());
    CHECK(tok->encode("ab", true) == std::vector<int>{1, 9});  // BOS, then " " a b -> " a" b -> " ab"
  }
  // The limits, lowered to what the file holds: it loads; one below, refused.
  {
    const ScopedLimit at("VOCAB", kVocabN);
    CHECK(limit_refusal([&] { load(good); }) == "<ok>");
  }
  {
    const ScopedLimit below("VOCAB", kVocabN - 1);
    check_limit_refusal(limit_refusal([&] { load(good); }), good, "vocab_size (from the model header) = 11", "VOCAB");
  }
  {
    const ScopedLimit at("TOKEN_BYTES", kMaxLen);
    CHECK(limit_refusal([&] { load(good); }) == "<ok>");
  }
  {
    const ScopedLimit below("TOKEN_BYTES", kMaxLen - 1);
    check_limit_refusal(limit_refusal([&] { load(good); }), good, "max_token_length = 5", "TOKEN_BYTES");
  }
  // At the default TOKEN_BYTES (65536): max_token_length and one piece one byte over.
  const std::int32_t max_piece = static_cast<std::int32_t>(limits::kTokenBytes.max);
  auto with_long = [&](const std::string& name, std::int32_t max_len, std::int32_t piece_len) {
    std::vector<TokEntry> toks = good_tokens();
    toks[9] = {-9.0f, piece_len, std::string(static_cast<std::size_t>(piece_len), 'q')};
    const std::string p = t.sub(name);
    write_bytes(p, tokbin(max_len, toks));
    return p;
  };
  const std::string over_max = with_long("over_max.bin", max_piece + 1, 3);
  check_limit_refusal(limit_refusal([&] { load(over_max); }), over_max, "max_token_length = 65537", "TOKEN_BYTES");
  const std::string over_piece = with_long("over_piece.bin", max_piece, max_piece + 1);
  check_limit_refusal(limit_refusal([&] { load(over_piece); }), over_piece, "length of token 9 = 65537", "TOKEN_BYTES");
  CHECK(limit_refusal([&] { load(with_long("at_piece.bin", max_piece, max_piece)); }) == "<ok>");
  CHECK(limit_refusal([&] { load(good, 0); }) ==
        "tokenizer '" + good + "': vocab_size (from the model header) = 0 must be >= 1 (the vocabulary size)");

  // Structural refusals (ModelError), each naming the file, the token and the value.
  struct Bad {
    const char* name;
    std::int32_t max_len;
    int token;            // the entry edited (-1: none)
    TokEntry entry;
    const char* why;      // the message after "tokenizer '<path>': "
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<Bad> bad = {
      {"neg.bin", kMaxLen, 4, {-4.0f, -1, ""}, "length of token 4 = -1 is negative"},
      {"past.bin", kMaxLen, 4, {-4.0f, 1 << 30, ""},
       "length of token 4 = 1073741824 bytes, more than the 62 left in the file (truncated file or corrupted length)"},
      {"over_stated.bin", kMaxLen, 4, {-4.0f, 6, "abcdef"}, "length of token 4 = 6 exceeds max_token_length = 5 stated "
                                                            "at the start of the file"},
      {"nan.bin", kMaxLen, 2, {nan, 4, "</s>"}, "score of token 2 = nan is not finite (a corrupted file, or not a "
                                                "llama2.c tokenizer.bin)"},
      {"inf.bin", kMaxLen, 2, {inf, 4, "</s>"}, "score of token 2 = inf is not finite"},
      {"minf.bin", kMaxLen, 2, {-inf, 4, "</s>"}, "score of token 2 = -inf is not finite"},
      {"zero_max.bin", 0, -1, {}, "max_token_length = 0 must be >= 1 (the bytes of one token piece)"},
      {"neg_max.bin", -3, -1, {}, "max_token_length = -3 must be >= 1"},
  };
  for (const Bad& b : bad) {
    std::vector<TokEntry> toks = good_tokens();
    if (b.token >= 0) toks[static_cast<std::size_t>(b.token)] = b.entry;
    const std::string p = t.sub(b.name);
    write_bytes(p, tokbin(b.max_len, toks));
    const std::string msg = limit_refusal([&] { load(p); });
    INFO(msg);
    CHECK(has(msg, "tokenizer '" + p + "': " + b.why));
  }
  // The accepted neighbours: the largest finite scores, a piece of exactly max_token_length.
  std::vector<TokEntry> edge = good_tokens();
  edge[0].score = std::numeric_limits<float>::max();
  edge[1].score = -std::numeric_limits<float>::max();
  edge[4] = {-4.0f, kMaxLen, "xyzzy"};
  write_bytes(t.sub("edge.bin"), tokbin(kMaxLen, edge));
  CHECK(limit_refusal([&] { load(t.sub("edge.bin")); }) == "<ok>");

  // A vocabulary the file cannot hold (8 bytes a token at least) is refused before the tables are sized.
  const std::string few = limit_refusal([&] { load(good, 1000); });
  CHECK(has(few, "tokenizer '" + good + "': truncated: vocab_size = 1000 tokens need at least 8004 bytes, the file has"));
  // Cut at every byte: refused, naming the file and what was being read; one byte more: trailing bytes.
  const std::string full = read_bytes(good);
  for (std::size_t cut = 0; cut < full.size(); ++cut) {
    const std::string p = t.sub("cut.bin");
    write_bytes(p, full.substr(0, cut));
    const std::string msg = limit_refusal([&] { load(p); });
    INFO("cut at " << cut << ": " << msg);
    CHECK(has(msg, "tokenizer '" + p + "': "));
    CHECK(has(msg, "truncated"));
    CHECK((has(msg, "max_token_length") || has(msg, "vocab_size = 11") || has(msg, " of token ")));
  }
  write_bytes(t.sub("trail.bin"), full + "x");
  CHECK(has(limit_refusal([&] { load(t.sub("trail.bin")); }), "1 trailing bytes after 11 tokens"));
}

TEST_CASE("STO.loader.llama2c_header_limits llama2.c header fields against the limits before the size they imply",
          "[gate:STO][fmt:none]") {
  // Bound: DIM, HIDDEN_DIM, LAYERS, HEADS, VOCAB and CONTEXT of runtime/limits, lowered through their
  // override to exactly what the tiny checkpoint holds: at the limit it loads, one below it is
  // refused naming the header field; the implied file size in checked 64-bit arithmetic.
  TempDir t;
  //                                     dim hidden layers heads kv vocab seq
  const std::vector<std::int32_t> hdr = {16, 24, 2, 4, 2, 10, 12};
  const std::string path = t.sub("m.bin");
  write_bytes(path, llama2c_file(hdr));
  const Model m = load_llama2c(path);  // anti-vacuity
  REQUIRE(m.config.dim == 16);
  REQUIRE(m.config.max_seq_len == 12);
  struct Case {
    const char* limit;
    std::int32_t held;
    const char* field;
  };
  for (const Case& c : {Case{"DIM", 16, "dim"}, Case{"HIDDEN_DIM", 24, "hidden_dim"}, Case{"LAYERS", 2, "n_layers"},
                        Case{"HEADS", 4, "n_heads"}, Case{"VOCAB", 10, "|vocab_size|"}, Case{"CONTEXT", 12, "seq_len"}}) {
    INFO("KVGATE_LIMIT_" << c.limit);
    {
      const ScopedLimit at(c.limit, static_cast<std::uint64_t>(c.held));
      CHECK(limit_refusal([&] { load_llama2c(path); }) == "<ok>");
    }
    const ScopedLimit below(c.limit, static_cast<std::uint64_t>(c.held - 1));
    check_limit_refusal(limit_refusal([&] { load_llama2c(path); }), path,
                        "llama2.c header field " + std::string(c.field) + " = " + std::to_string(c.held), c.limit);
  }
  // At the default limits, header-only files: refused by the limit before the size check.
  auto header_only = [&](const std::string& name, std::vector<std::int32_t> h) {
    std::string b;
    for (std::int32_t v : h) put(b, v);
    const std::string p = t.sub(name);
    write_bytes(p, b);
    return p;
  };
  const std::string big_seq = header_only("seq.bin", {16, 24, 2, 4, 2, 10, (1 << 20) + 1});
  check_limit_refusal(limit_refusal([&] { load_llama2c(big_seq); }), big_seq,
                      "llama2.c header field seq_len = 1048577", "CONTEXT");
  const std::string big_dim = header_only("dim.bin", {65538, 24, 2, 2, 2, 10, 12});
  check_limit_refusal(limit_refusal([&] { load_llama2c(big_dim); }), big_dim, "llama2.c header field dim = 65538", "DIM");
  const std::string neg = header_only("neg.bin", {16, -24, 2, 4, 2, 10, 12});
  CHECK(has(limit_refusal([&] { load_llama2c(neg); }),
            "model '" + neg + "': llama2.c header field hidden_dim = -24 must be >= 1 (the feed-forward dimension)"));
  // Limits raised far beyond any model: the implied size overflows 64 bits and is refused as such.
  const ScopedLimit d("DIM", 1ull << 31), f("HIDDEN_DIM", 1ull << 31), l("LAYERS", 1ull << 31);
  const std::string wrap = header_only("wrap.bin", {1 << 30, 1 << 30, 1 << 30, 1, 1, 10, 12});
  const std::string msg = limit_refusal([&] { load_llama2c(wrap); });
  INFO(msg);
  CHECK(has(msg, "model '" + wrap + "': the size implied by the header = "));
  CHECK(has(msg, "overflows 64 bits"));
}
