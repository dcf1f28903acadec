#include "kvgate/tokenizer_sp.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>

#include "kvgate/limits.hpp"

namespace kvgate {

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// "<0xAB>" -> 0xAB; -1 for anything else.
int parse_byte_piece(const std::string& p) {
  if (p.size() != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return -1;
  const int hi = hex_digit(p[3]), lo = hex_digit(p[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

SpTokenizer::SpTokenizer(std::vector<std::string> pieces, std::vector<float> scores, int bos_id, int eos_id,
                         int unk_id)
    : pieces_(std::move(pieces)), scores_(std::move(scores)), bos_(bos_id), eos_(eos_id), unk_(unk_id) {
  if (pieces_.size() != scores_.size())
    throw ModelError("tokenizer: " + std::to_string(pieces_.size()) + " pieces but " + std::to_string(scores_.size()) +
                     " scores");
  if (unk_ < 0 || static_cast<std::size_t>(unk_) >= pieces_.size())
    throw ModelError("tokenizer: the unknown-token id " + std::to_string(unk_) + " is outside the vocabulary of " +
                     std::to_string(pieces_.size()) + " pieces");
  byte_id_.fill(-1);
  lookup_.reserve(pieces_.size() * 2);
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    lookup_.emplace(pieces_[i], static_cast<int>(i));  // first id wins on duplicates
    const int b = parse_byte_piece(pieces_[i]);
    if (b >= 0 && byte_id_[static_cast<std::size_t>(b)] < 0) byte_id_[static_cast<std::size_t>(b)] = static_cast<int>(i);
  }
}

std::unique_ptr<SpTokenizer> SpTokenizer::from_llama2c_file(const std::string& path, int vocab_size, int bos_id,
                                                            int eos_id) {
  namespace L = limits;
  const std::string where = "tokenizer '" + path + "'";
  // The vocabulary size comes from the model header: VOCAB before anything is read or sized by it.
  const std::uint64_t n_tok = L::check_positive(L::kVocab, vocab_size, where, "vocab_size (from the model header)");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ModelError(where + ": cannot open the file (pass --tokenizer PATH)");
  std::vector<char> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::size_t off = 0;
  auto need = [&](std::size_t n, const std::string& what) {
    if (buf.size() - off < n)
      throw ModelError(where + ": truncated at byte " + std::to_string(off) + " while reading " + what + " (file has " +
                       std::to_string(buf.size()) + " bytes; expected " + std::to_string(vocab_size) +
                       " tokens in llama2.c tokenizer.bin format)");
  };
  auto rd_i32 = [&](const std::string& what) {
    need(4, what);
    std::int32_t v;
    std::memcpy(&v, buf.data() + off, 4);
    off += 4;
    return v;
  };
  const std::int32_t max_len = rd_i32("max_token_length");
  L::check_positive(L::kTokenBytes, max_len, where, "max_token_length");
  // Every token takes at least 8 bytes (its score and its length): the vocabulary must fit in what is
  // left before it sizes the tables.
  if (n_tok > (buf.size() - off) / 8)
    throw ModelError(where + ": truncated: vocab_size = " + std::to_string(vocab_size) + " tokens need at least " +
                     std::to_string(off + 8 * n_tok) + " bytes, the file has " + std::to_string(buf.size()) +
                     " (the tokenizer does not match the model's vocab_size, or the file is cut)");
  std::vector<std::string> pieces(static_cast<std::size_t>(n_tok));
  std::vector<float> scores(static_cast<std::size_t>(n_tok));
  for (int i = 0; i < vocab_size; ++i) {
    const std::string tok = "token " + std::to_string(i);
    need(4, "score of " + tok);
    float& score = scores[static_cast<std::size_t>(i)];
    std::memcpy(&score, buf.data() + off, 4);
    off += 4;
    // Refused, not accepted: SentencePiece writes finite log-probabilities; a NaN score would drop the
    // piece from every merge (each comparison false) and +inf would make it win every one, so the
    // encoding would silently differ from llama2.c's. A non-finite score is a corrupted file.
    if (!std::isfinite(score))
      throw ModelError(where + ": score of " + tok + " = " + std::to_string(score) +
                       " is not finite (a corrupted file, or not a llama2.c tokenizer.bin)");
    const std::int32_t len = rd_i32("length of " + tok);
    if (len < 0) throw ModelError(where + ": length of " + tok + " = " + std::to_string(len) + " is negative");
    if (static_cast<std::size_t>(len) > buf.size() - off)
      throw ModelError(where + ": length of " + tok + " = " + std::to_string(len) + " bytes, more than the " +
                       std::to_string(buf.size() - off) + " left in the file (truncated file or corrupted length)");
    L::check(L::kTokenBytes, len, where, "length of " + tok);
    if (len > max_len)
      throw ModelError(where + ": length of " + tok + " = " + std::to_string(len) + " exceeds max_token_length = " +
                       std::to_string(max_len) + " stated at the start of the file");
    pieces[static_cast<std::size_t>(i)].assign(buf.data() + off, static_cast<std::size_t>(len));
    off += static_cast<std::size_t>(len);
  }
  if (off != buf.size())
    throw ModelError(where + ": " + std::to_string(buf.size() - off) + " trailing bytes after " +
                     std::to_string(vocab_size) + " tokens; the tokenizer does not match the model's vocab_size");
  return std::make_unique<SpTokenizer>(std::move(pieces), std::move(scores), bos_id, eos_id, 0);
}

int SpTokenizer::piece_id(const std::string& s) const {
  const auto it = lookup_.find(s);
  return it == lookup_.end() ? -1 : it->second;
}

void SpTokenizer::set_gguf_rules(bool add_space_prefix, const std::vector<int>& types) {
  space_prefix_ = add_space_prefix;
  strip_first_ = true;
  for (auto& v : specials_) v.clear();
  not_byte_.assign(types.empty() ? 0 : pieces_.size(), false);
  for (std::size_t id = 0; id < types.size() && id < pieces_.size(); ++id) {
    const int t = types[id];
    not_byte_[id] = t != 6;
    const std::string& p = pieces_[id];
    if ((t == 2 || t == 3 || t == 4) && !p.empty())  // unknown, control, user-defined
      specials_[static_cast<unsigned char>(p[0])].emplace_back(p, static_cast<int>(id));
  }
  for (auto& v : specials_)
    std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

std::vector<int> SpTokenizer::encode(const std::string& text, bool add_special) const {
  std::vector<int> out;
  out.reserve(text.size() + 2);
  if (add_special && adds_bos()) out.push_back(bos_);
  // Cut the special pieces out of the text (llama.cpp's tokenizer_st_partition): each fragment
  // between them is encoded alone, with the prefix when it starts the text or follows a special.
  bool prev_special = true;
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size();) {
    const std::pair<std::string, int>* hit = nullptr;
    for (const auto& sp : specials_[static_cast<unsigned char>(text[i])])
      if (text.compare(i, sp.first.size(), sp.first) == 0) {
        hit = &sp;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > start) encode_fragment(text.substr(start, i - start), space_prefix_ && prev_special, out);
    out.push_back(hit->second);
    prev_special = true;
    i += hit->first.size();
    start = i;
  }
  if (text.size() > start) encode_fragment(text.substr(start), space_prefix_ && prev_special, out);
  if (add_special && adds_eos()) out.push_back(eos_);
  return out;
}

void SpTokenizer::encode_fragment(const std::string& text, bool prefix, std::vector<int>& out) const {
  const std::size_t first = out.size();  // merges never reach back past the fragment
  auto push_bytes = [&](const std::string& s) {
    for (unsigned char c : s) {
      const int id = byte_id_[c];
      out.push_back(id >= 0 ? id : unk_);
    }
  };
  if (prefix) {  // dummy prefix, as SentencePiece's add_dummy_prefix
    const int sp = piece_id(" ");
    if (sp >= 0) out.push_back(sp);
    else push_bytes(" ");
  }
  // One token per UTF-8 code point (at most 4 bytes), byte fallback when it is not a piece.
  std::string cp;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) cp.clear();
    cp.push_back(static_cast<char>(c));
    const bool next_cont = i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
    if (next_cont && cp.size() < 4) continue;
    const int id = piece_id(cp);
    if (id >= 0) out.push_back(id);
    else push_bytes(cp);
    cp.clear();
  }
  // Greedy merges by score: the best-scoring adjacent pair (first one on ties) until none is a piece.
  std::string buf;
  for (;;) {
    float best_score = -1e10f;
    int best_id = -1;
    std::size_t best_idx = 0;
    for (std::size_t i = first; i + 1 < out.size(); ++i) {
      buf = pieces_[static_cast<std::size_t>(out[i])];
      buf += pieces_[static_cast<std::size_t>(out[i + 1])];
      const int id = piece_id(buf);
      if (id >= 0 && scores_[static_cast<std::size_t>(id)] > best_score) {
        best_score = scores_[static_cast<std::size_t>(id)];
        best_id = id;
        best_idx = i;
      }
    }
    if (best_id < 0) break;
    out[best_idx] = best_id;
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(best_idx) + 1);
  }
}

std::string SpTokenizer::piece_text(int token, bool strip) const {
  if (token < 0 || token >= vocab_size()) return {};
  const std::string& p = pieces_[static_cast<std::size_t>(token)];
  const int b = not_byte_.empty() || !not_byte_[static_cast<std::size_t>(token)] ? parse_byte_piece(p) : -1;
  if (b >= 0) return std::string(1, static_cast<char>(b));
  if (space_prefix_ && strip && !p.empty() && p[0] == ' ') return p.substr(1);
  return p;
}

// Streaming (`kvgate run` prints each token as it comes): the prefix is stripped after BOS, where a
// generation starts (llama2.c run.c), and at the first token under the GGUF rules.
std::string SpTokenizer::decode_piece(int prev, int token) const {
  return piece_text(token, prev == bos_ || (strip_first_ && prev < 0));
}

// A whole sequence under the GGUF rules: llama.cpp's detokenizer strips the first token's prefix only,
// keeping it after a BOS inside the sequence (as the tokenizers library's Strip decoder does).
std::string SpTokenizer::decode(const std::vector<int>& ids) const {
  if (!strip_first_) return Tokenizer::decode(ids);
  std::string s;
  for (std::size_t k = 0; k < ids.size(); ++k) s += piece_text(ids[k], k == 0);
  return s;
}

}  // namespace kvgate
