// Byte-level BPE (see kvgate/tokenizer_bpe.hpp).
#include "kvgate/json_limits.hpp"
#include "kvgate/tokenizer_bpe.hpp"

#include "tokenizer_json_internal.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

namespace kvgate {

namespace {

// ---- UTF-8 ------------------------------------------------------------------------------------
// One code point below U+0800: the byte map's code points end at U+0143 (68 shifted bytes from U+0100).
void append_utf8(std::string* s, std::uint32_t cp) {
  if (cp < 0x80) {
    s->push_back(static_cast<char>(cp));
  } else {
    s->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Decodes one UTF-8 sequence at s[i]; invalid bytes decode as one "code point" 0xFFFFFFFF of
// length 1 (passed through byte by byte).
constexpr std::uint32_t kInvalidCp = 0xFFFFFFFFu;
std::uint32_t next_cp(std::string_view s, std::size_t i, std::size_t* len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  auto cont = [&](std::size_t k) {
    return i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
  };
  auto cb = [&](std::size_t k) { return static_cast<std::uint32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F); };
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  if (b0 >= 0xC2 && b0 < 0xE0 && cont(1)) {
    *len = 2;
    return ((b0 & 0x1Fu) << 6) | cb(1);
  }
  if (b0 >= 0xE0 && b0 < 0xF0 && cont(1) && cont(2)) {
    const std::uint32_t cp = ((b0 & 0x0Fu) << 12) | (cb(1) << 6) | cb(2);
    if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) {
      *len = 3;
      return cp;
    }
  }
  if (b0 >= 0xF0 && b0 < 0xF5 && cont(1) && cont(2) && cont(3)) {
    const std::uint32_t cp = ((b0 & 0x07u) << 18) | (cb(1) << 12) | (cb(2) << 6) | cb(3);
    if (cp >= 0x10000 && cp <= 0x10FFFF) {
      *len = 4;
      return cp;
    }
  }
  *len = 1;
  return kInvalidCp;
}

// ---- character classes -----------------------------------------------------------------------
enum class Cls : std::uint8_t { L, N, S, O };

bool is_space_cp(std::uint32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

struct CpRange {
  std::uint32_t lo, hi;
  Cls cls;
};
#include "tokenizer_bpe_tables.inc"

Cls classify(std::uint32_t c) {
  if (c == kInvalidCp) return Cls::O;
  if (c < 0x80) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return Cls::L;
    if (c >= '0' && c <= '9') return Cls::N;
    if (is_space_cp(c)) return Cls::S;
    return Cls::O;  // punctuation, symbols and control characters
  }
  const CpRange* end = std::end(kCpRanges);
  const CpRange* it = std::upper_bound(std::begin(kCpRanges), end, c,
                                       [](std::uint32_t v, const CpRange& r) { return v < r.lo; });
  if (it == std::begin(kCpRanges)) return Cls::O;
  --it;
  return c <= it->hi ? it->cls : Cls::O;
}

struct Ch {
  std::size_t pos, len;
  std::uint32_t cp;
  Cls cls;
};

std::vector<Ch> to_chars(std::string_view s) {
  std::vector<Ch> out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    std::size_t len = 1;
    const std::uint32_t cp = next_cp(s, i, &len);
    out.push_back({i, len, cp, classify(cp)});
    i += len;
  }
  return out;
}

char lower_ascii(std::uint32_t c) {
  return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
}

// Length (in chars) of a contraction 's|'t|'re|'ve|'m|'ll|'d at i, or 0.
std::size_t contraction(const std::vector<Ch>& c, std::size_t i, bool icase) {
  if (c[i].cp != '\'' || i + 1 >= c.size()) return 0;
  auto at = [&](std::size_t k) -> char {
    if (i + k >= c.size() || c[i + k].cp >= 0x80) return 0;
    return icase ? lower_ascii(c[i + k].cp) : static_cast<char>(c[i + k].cp);
  };
  const char a = at(1), b = at(2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

bool is_nl(std::uint32_t cp) { return cp == '\r' || cp == '\n'; }

// Whitespace handling shared by the three rules: \s+(?!\S) | \s+ (and, for llama3/qwen2,
// \s*[\r\n]+ before them). Returns the end index.
std::size_t whitespace_piece(const std::vector<Ch>& c, std::size_t i, bool newline_rule) {
  std::size_t j = i;
  while (j < c.size() && c[j].cls == Cls::S) ++j;
  if (newline_rule) {
    std::size_t last_nl = SIZE_MAX;
    for (std::size_t k = i; k < j; ++k)
      if (is_nl(c[k].cp)) last_nl = k;
    if (last_nl != SIZE_MAX) return last_nl + 1;  // \s*[\r\n]+
  }
  if (j == c.size()) return j;  // \s+(?!\S) at the end
  if (j - i >= 2) return j - 1;  // back off one so the next piece can take it
  return j;                      // \s+
}

std::size_t match_gpt2(const std::vector<Ch>& c, std::size_t i) {
  const std::size_t n = c.size();
  if (std::size_t k = contraction(c, i, false)) return i + k;
  std::size_t s = i;
  if (c[i].cp == ' ' && i + 1 < n && c[i + 1].cls != Cls::S) s = i + 1;
  const Cls cls = c[s].cls;
  if (cls == Cls::L || cls == Cls::N || cls == Cls::O) {
    std::size_t j = s;
    while (j < n && c[j].cls == cls) ++j;
    return j;
  }
  return whitespace_piece(c, i, false);
}

std::size_t match_llama3(const std::vector<Ch>& c, std::size_t i, bool digits3) {
  const std::size_t n = c.size();
  if (std::size_t k = contraction(c, i, true)) return i + k;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  {
    std::size_t s = i;
    if (c[i].cls != Cls::L && c[i].cls != Cls::N && !is_nl(c[i].cp) && i + 1 < n && c[i + 1].cls == Cls::L) s = i + 1;
    if (c[s].cls == Cls::L) {
      std::size_t j = s;
      while (j < n && c[j].cls == Cls::L) ++j;
      return j;
    }
  }
  // \p{N}{1,3} (qwen2: \p{N})
  if (c[i].cls == Cls::N) {
    std::size_t j = i;
    const std::size_t cap = digits3 ? 3 : 1;
    while (j < n && j - i < cap && c[j].cls == Cls::N) ++j;
    return j;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  {
    std::size_t s = i;
    if (c[i].cp == ' ' && i + 1 < n && c[i + 1].cls == Cls::O) s = i + 1;
    if (c[s].cls == Cls::O) {
      std::size_t j = s;
      while (j < n && c[j].cls == Cls::O) ++j;
      while (j < n && is_nl(c[j].cp)) ++j;
      return j;
    }
  }
  return whitespace_piece(c, i, true);
}

// GPT-2 bytes_to_unicode.
struct ByteMap {
  std::array<std::string, 256> enc;
  std::unordered_map<std::uint32_t, std::uint8_t> dec;
  ByteMap() {
    std::array<bool, 256> direct{};
    for (int b = '!'; b <= '~'; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    std::uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const std::uint32_t cp = direct[b] ? static_cast<std::uint32_t>(b) : next++;
      append_utf8(&enc[b], cp);
      dec[cp] = static_cast<std::uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

std::string merge_key(const std::string& a, const std::string& b) {
  std::string k;
  k.reserve(a.size() + b.size() + 1);
  k += a;
  k.push_back('\x01');
  k += b;
  return k;
}

}  // namespace

bool parse_pre_tokenizer(std::string_view name, PreTokenizer* out) {
  if (name == "gpt2" || name == "gpt-2" || name == "default") {
    *out = PreTokenizer::gpt2;
  } else if (name == "llama3" || name == "llama-bpe" || name == "llama-3" || name == "smaug-bpe") {
    *out = PreTokenizer::llama3;
  } else if (name == "qwen2" || name == "qwen") {
    *out = PreTokenizer::qwen2;
  } else if (name == "none") {
    *out = PreTokenizer::none;
  } else {
    return false;
  }
  return true;
}

std::string byte_to_unicode_utf8(std::uint8_t b) { return byte_map().enc[b]; }

bool byte_level_decode(std::string_view token, std::string* bytes) {
  const auto& m = byte_map();
  bytes->clear();
  for (std::size_t i = 0; i < token.size();) {
    std::size_t len = 1;
    const std::uint32_t cp = next_cp(token, i, &len);
    auto it = m.dec.find(cp);
    if (it == m.dec.end()) return false;
    bytes->push_back(static_cast<char>(it->second));
    i += len;
  }
  return true;
}

std::vector<std::string> pre_tokenize(std::string_view text, PreTokenizer rule) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  if (rule == PreTokenizer::none) {
    out.emplace_back(text);
    return out;
  }
  const std::vector<Ch> c = to_chars(text);
  for (std::size_t i = 0; i < c.size();) {
    std::size_t j = 0;
    switch (rule) {
      case PreTokenizer::gpt2: j = match_gpt2(c, i); break;
      case PreTokenizer::llama3: j = match_llama3(c, i, true); break;
      case PreTokenizer::qwen2: j = match_llama3(c, i, false); break;
      case PreTokenizer::none: j = c.size(); break;
    }
    if (j <= i) j = i + 1;  // cannot happen; guarantees progress
    const std::size_t b0 = c[i].pos, b1 = j < c.size() ? c[j].pos : text.size();
    out.emplace_back(text.substr(b0, b1 - b0));
    i = j;
  }
  return out;
}

// ---- BpeTokenizer ------------------------------------------------------------------------------

BpeTokenizer::BpeTokenizer(std::vector<std::string> vocab, const std::vector<std::string>& merges, Options opts)
    : opts_(std::move(opts)) {
  std::vector<std::pair<std::string, std::string>> pairs;
  pairs.reserve(merges.size());
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    // A merge is "left right"; the byte-level alphabet never contains a raw space, so the first
    // space separates the two (a leading space would be a non-byte-level token: split after it).
    const std::size_t sp = m.find(' ', 1);
    if (sp == std::string::npos)
      throw ModelError("BPE merges[" + std::to_string(r) + "] = \"" + m + "\" is not of the form \"left right\"");
    pairs.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  init(std::move(vocab), std::move(pairs));
}

BpeTokenizer::BpeTokenizer(std::vector<std::string> vocab,
                           const std::vector<std::pair<std::string, std::string>>& merges, Options opts)
    : opts_(std::move(opts)) {
  init(std::move(vocab), merges);
}

void BpeTokenizer::init(std::vector<std::string> vocab, std::vector<std::pair<std::string, std::string>> merges) {
  int max_id = static_cast<int>(vocab.size()) - 1;
  for (const auto& a : opts_.added) max_id = std::max(max_id, a.id);
  id_to_token_ = std::move(vocab);
  id_to_token_.resize(static_cast<std::size_t>(max_id + 1));
  std::vector<bool> is_added(id_to_token_.size(), false);
  for (const auto& a : opts_.added) {
    if (a.id < 0) throw ModelError("BPE added token \"" + a.content + "\" has a negative id");
    if (a.content.empty()) throw ModelError("BPE added token id " + std::to_string(a.id) + " has empty content");
    id_to_token_[static_cast<std::size_t>(a.id)] = a.content;
    is_added[static_cast<std::size_t>(a.id)] = true;
  }
  id_to_bytes_.resize(id_to_token_.size());
  token_to_id_.reserve(id_to_token_.size() * 2);
  for (std::size_t id = 0; id < id_to_token_.size(); ++id) {
    const std::string& t = id_to_token_[id];
    if (t.empty()) continue;
    if (is_added[id] || !byte_level_decode(t, &id_to_bytes_[id])) id_to_bytes_[id] = t;  // verbatim
    token_to_id_.emplace(t, static_cast<int>(id));                                        // first id wins
  }
  byte_token_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    auto it = token_to_id_.find(byte_to_unicode_utf8(static_cast<std::uint8_t>(b)));
    if (it != token_to_id_.end()) byte_token_[static_cast<std::size_t>(b)] = it->second;
  }
  merge_rank_.reserve(merges.size() * 2);
  for (std::size_t r = 0; r < merges.size(); ++r)
    merge_rank_.emplace(merge_key(merges[r].first, merges[r].second), static_cast<int>(r));
  added_sorted_ = opts_.added;
  std::stable_sort(added_sorted_.begin(), added_sorted_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  added_first_.assign(256, false);
  for (const AddedToken& a : added_sorted_) added_first_[static_cast<unsigned char>(a.content[0])] = true;
}

int BpeTokenizer::token_id(const std::string& byte_level) const {
  auto it = token_to_id_.find(byte_level);
  return it == token_to_id_.end() ? -1 : it->second;
}

void BpeTokenizer::bpe_piece(const std::string& piece_bytes, std::vector<int>* out) const {
  const auto& bm = byte_map();
  std::string whole;
  std::vector<std::string> sym;
  sym.reserve(piece_bytes.size());
  for (unsigned char b : piece_bytes) {
    sym.push_back(bm.enc[b]);
    whole += bm.enc[b];
  }
  if (opts_.ignore_merges) {
    auto it = token_to_id_.find(whole);
    if (it != token_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  while (sym.size() > 1) {
    int best = INT_MAX;
    std::size_t best_i = 0;
    for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merge_rank_.find(merge_key(sym[i], sym[i + 1]));
      if (it != merge_rank_.end() && it->second < best) {
        best = it->second;
        best_i = i;
      }
    }
    if (best == INT_MAX) break;
    const std::string left = sym[best_i], right = sym[best_i + 1];
    std::vector<std::string> next;
    next.reserve(sym.size());
    for (std::size_t i = 0; i < sym.size();) {
      if (i + 1 < sym.size() && sym[i] == left && sym[i + 1] == right) {
        next.push_back(left + right);
        i += 2;
      } else {
        next.push_back(std::move(sym[i]));
        ++i;
      }
    }
    sym.swap(next);
  }
  for (const std::string& s : sym) {
    auto it = token_to_id_.find(s);
    if (it != token_to_id_.end()) {
      out->push_back(it->second);
      continue;
    }
    std::string raw;
    byte_level_decode(s, &raw);
    for (unsigned char b : raw) {
      const int id = byte_token_[b];
      if (id < 0) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", b);
        throw ModelError(std::string("BPE tokenizer has no token for byte ") + hex +
                         " (the vocabulary lacks the 256 byte-level base tokens)");
      }
      out->push_back(id);
    }
  }
}

std::vector<int> BpeTokenizer::encode(const std::string& text, bool add_special) const {
  std::vector<int> ids;
  if (add_special) ids = opts_.specials.prefix;
  auto encode_segment = [&](std::string_view seg, bool at_start) {
    if (seg.empty()) return;
    std::string buf;
    if (opts_.add_prefix_space && at_start && seg.front() != ' ') {
      buf = " ";
      buf += seg;
      seg = buf;
    }
    for (const std::string& piece : pre_tokenize(seg, opts_.pre)) bpe_piece(piece, &ids);
  };
  std::size_t seg_start = 0;
  bool at_start = true;
  for (std::size_t i = 0; i < text.size();) {
    const AddedToken* hit = nullptr;
    if (added_first_[static_cast<unsigned char>(text[i])])
      for (const AddedToken& a : added_sorted_)
        if (text.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
    if (!hit) {
      ++i;
      continue;
    }
    encode_segment(std::string_view(text).substr(seg_start, i - seg_start), at_start);
    ids.push_back(hit->id);
    at_start = false;
    i += hit->content.size();
    seg_start = i;
  }
  encode_segment(std::string_view(text).substr(seg_start), at_start);
  if (add_special) ids.insert(ids.end(), opts_.specials.suffix.begin(), opts_.specials.suffix.end());
  return ids;
}

std::string BpeTokenizer::decode_piece(int /*prev*/, int token) const {
  if (token < 0 || static_cast<std::size_t>(token) >= id_to_bytes_.size()) return {};
  return id_to_bytes_[static_cast<std::size_t>(token)];
}

// ---- tokenizer.json ------------------------------------------------------------------------------

namespace {

PreTokenizer pre_from_regex(const std::string& path, const std::string& field, const std::string& re) {
  if (re.find("\\p{N}{1,3}") != std::string::npos) return PreTokenizer::llama3;
  if (re.find("(?i:'s|'t|'re|'ve|'m|'ll|'d)") != std::string::npos && re.find("\\p{N}") != std::string::npos)
    return PreTokenizer::qwen2;
  if (re.find("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+") != std::string::npos) return PreTokenizer::gpt2;
  throw ModelError(path + ": " + field + " has a split regex kvgate does not implement (" + re.substr(0, 120) +
                   "); supported: the GPT-2, Llama-3 and Qwen2 byte-level patterns");
}

}  // namespace

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_tokenizer_json(const std::string& path, int bos_id, int eos_id) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ModelError(path + ": cannot open tokenizer file");
  nlohmann::json j;
  try {
    j = limits::parse_json(in, path);
  } catch (const nlohmann::json::exception& e) {
    throw ModelError(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw ModelError(path + ": missing object field 'model'");
  SpecialsRule rule = detail::rule_from_post_processor(j, path);
  return detail::bpe_from_json(j, path, bos_id, eos_id, std::move(rule));
}

std::unique_ptr<BpeTokenizer> detail::bpe_from_json(const nlohmann::json& j, const std::string& path, int bos_id,
                                                    int eos_id, SpecialsRule rule) {
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw ModelError(path + ": missing object field 'model'");
  const auto& m = j["model"];
  const std::string type = m.value("type", std::string("BPE"));
  if (type != "BPE")
    throw ModelError(path + ": model.type is \"" + type + "\"; kvgate reads byte-level BPE tokenizers only");
  if (m.contains("byte_fallback") && m["byte_fallback"].is_boolean() && m["byte_fallback"].get<bool>())
    throw ModelError(path +
                     ": model.byte_fallback is true (a SentencePiece-style BPE, e.g. Llama 2/Mistral v0.x); this "
                     "reader takes byte-level BPE only -- load it with load_tokenizer_json (the Hugging Face "
                     "loader and --tokenizer do)");
  if (!m.contains("vocab") || !m["vocab"].is_object()) throw ModelError(path + ": missing object field model.vocab");
  detail::check_vocab_limits(m, path);  // before the table is sized by the largest id

  std::vector<std::string> vocab;
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<long long>() < 0 ||
        static_cast<std::uint64_t>(it.value().get<long long>()) > limits::max_of(limits::kTokenId))
      throw ModelError(path + ": model.vocab[\"" + it.key() + "\"] is not a valid token id");
    const auto id = static_cast<std::size_t>(it.value().get<long long>());
    if (id >= vocab.size()) vocab.resize(id + 1);
    vocab[id] = it.key();
  }
  std::vector<std::pair<std::string, std::string>> merges;
  if (m.contains("merges") && m["merges"].is_array()) {
    const auto& ms = m["merges"];
    merges.reserve(ms.size());
    for (std::size_t r = 0; r < ms.size(); ++r) {
      const auto& e = ms[r];
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const std::size_t sp = s.find(' ', 1);
        if (sp == std::string::npos)
          throw ModelError(path + ": model.merges[" + std::to_string(r) + "] = \"" + s + "\" is not \"left right\"");
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      } else {
        throw ModelError(path + ": model.merges[" + std::to_string(r) + "] is neither \"a b\" nor [\"a\", \"b\"]");
      }
    }
  } else {
    throw ModelError(path + ": missing array field model.merges");
  }

  BpeTokenizer::Options o;
  o.bos_id = bos_id;
  o.eos_id = eos_id;
  o.specials = std::move(rule);
  o.ignore_merges = m.value("ignore_merges", false);
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (std::size_t k = 0; k < j["added_tokens"].size(); ++k) {
      const auto& a = j["added_tokens"][k];
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string())
        throw ModelError(path + ": added_tokens[" + std::to_string(k) + "] needs integer 'id' and string 'content'");
      for (const char* flag : {"single_word", "lstrip", "rstrip"})
        if (a.value(flag, false))
          throw ModelError(path + ": added_tokens[" + std::to_string(k) + "]." + flag + " is true (\"" +
                           a["content"].get<std::string>() +
                           "\"); kvgate's byte-level BPE matches added tokens verbatim only");
      // The id sizes tables later: a huge one is refused here, before any allocation.
      limits::check(limits::kTokenId, a["id"].get<long long>(), path, "added_tokens[" + std::to_string(k) + "].id");
      o.added.push_back({a["id"].get<int>(), a["content"].get<std::string>(), a.value("special", true)});
    }
  }
  // Normalizer: none or NFC (identity on NFC input) only.
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const std::string nt = j["normalizer"].value("type", std::string());
    const bool empty_seq = nt == "Sequence" && j["normalizer"].contains("normalizers") &&
                           j["normalizer"]["normalizers"].is_array() && j["normalizer"]["normalizers"].empty();
    if (nt != "NFC" && !empty_seq)
      throw ModelError(path + ": normalizer.type \"" + nt + "\" is not supported (byte-level BPE with no normalizer or NFC)");
  }
  // Pre-tokenizer.
  o.pre = PreTokenizer::none;
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
    const auto& p = j["pre_tokenizer"];
    auto visit = [&](const nlohmann::json& q, const std::string& field, bool* found_split) {
      const std::string t = q.value("type", std::string());
      if (t == "ByteLevel") {
        o.add_prefix_space = q.value("add_prefix_space", false);
        if (q.value("use_regex", true) && !*found_split) {
          o.pre = PreTokenizer::gpt2;
          *found_split = true;
        }
      } else if (t == "Split") {
        std::string re;
        if (q.contains("pattern") && q["pattern"].is_object() && q["pattern"].contains("Regex") &&
            q["pattern"]["Regex"].is_string())
          re = q["pattern"]["Regex"].get<std::string>();
        else
          throw ModelError(path + ": " + field + ".pattern.Regex is missing (string split patterns are not supported)");
        if (!*found_split) {
          o.pre = pre_from_regex(path, field + ".pattern.Regex", re);
          *found_split = true;
        }
      } else if (t == "Digits" || t == "Punctuation" || t == "Whitespace" || t == "Metaspace" ||
                 t == "WhitespaceSplit") {
        throw ModelError(path + ": " + field + ".type \"" + t + "\" is not supported by kvgate's byte-level BPE");
      }
    };
    bool found = false;
    const std::string t = p.value("type", std::string());
    if (t == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
      for (std::size_t k = 0; k < p["pretokenizers"].size(); ++k)
        visit(p["pretokenizers"][k], "pre_tokenizer.pretokenizers[" + std::to_string(k) + "]", &found);
    } else {
      visit(p, "pre_tokenizer", &found);
    }
  }
  auto tok = std::make_unique<BpeTokenizer>(std::move(vocab), merges, std::move(o));
  if (tok->token_id(byte_to_unicode_utf8('a')) < 0 || tok->token_id(byte_to_unicode_utf8(' ')) < 0)
    throw ModelError(path + ": model.vocab lacks the byte-level base tokens (e.g. \"a\", \"\xC4\xA0\"); not a "
                            "byte-level BPE vocabulary");
  return tok;
}

}  // namespace kvgate
