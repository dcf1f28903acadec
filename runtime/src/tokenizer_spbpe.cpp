// SentencePiece-style BPE from tokenizer.json (see kvgate/tokenizer_json.hpp for the algorithm).
#include <algorithm>
#include <cstdio>
#include <queue>

#include "kvgate/tokenizer_json.hpp"

namespace kvgate {

namespace {

// Length of the UTF-8 character at s[i] (1 for a byte that does not start a valid sequence).
std::size_t char_len(const std::string& s, std::size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  std::size_t n = 1;
  if (b >= 0xC2 && b < 0xE0) n = 2;
  else if (b >= 0xE0 && b < 0xF0) n = 3;
  else if (b >= 0xF0 && b < 0xF5) n = 4;
  if (i + n > s.size()) return 1;
  for (std::size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  return n;
}

std::uint32_t decode_cp(const std::string& s, std::size_t i, std::size_t n) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (n == 1) return b0;
  std::uint32_t cp = b0 & (n == 2 ? 0x1Fu : n == 3 ? 0x0Fu : 0x07u);
  for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
  return cp;
}

// Rust's char::is_whitespace (Unicode White_Space).
bool is_ws(std::uint32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  out.reserve(s.size());
  std::size_t pos = 0;
  for (;;) {
    const std::size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
  }
  out.append(s, pos, std::string::npos);
  return out;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// "<0xAB>" -> 0xAB, as tokenizers' ByteFallback decoder reads it; -1 otherwise.
int byte_token_value(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  const int hi = hexval(t[3]), lo = hexval(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = char_len(s, i);
    if (n == 1 && static_cast<unsigned char>(s[i]) >= 0x80) return false;
    if (n > 1) {  // overlongs / surrogates / > U+10FFFF
      const std::uint32_t cp = decode_cp(s, i, n);
      if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return false;
    }
    i += n;
  }
  return true;
}

std::uint64_t pair_key(int a, int b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

}  // namespace

void SpBpeTokenizer::check_byte_tokens(const std::string& path, const std::vector<std::string>& vocab) {
  std::vector<bool> have(256, false);
  for (const std::string& p : vocab) {
    const int b = byte_token_value(p);
    if (b < 0) continue;
    char name[16];
    std::snprintf(name, sizeof name, "<0x%02X>", b);  // the spelling tokenizers looks up ({:#04X})
    if (p == name) have[static_cast<std::size_t>(b)] = true;
  }
  std::string missing;
  int n_missing = 0;
  for (int b = 0; b < 256; ++b)
    if (!have[static_cast<std::size_t>(b)] && n_missing++ < 4) {
      char name[16];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      missing += std::string(missing.empty() ? "" : ", ") + name;
    }
  if (n_missing > 0)
    throw ModelError(path + ": model.byte_fallback is true but model.vocab lacks " + std::to_string(n_missing) +
                     " of the 256 byte tokens (" + missing + (n_missing > 4 ? ", ..." : "") +
                     "); add the <0x00>..<0xFF> tokens to model.vocab, or set model.byte_fallback to false if the "
                     "vocabulary really has no byte fallback");
}

SpBpeTokenizer::SpBpeTokenizer(Spec spec) : spec_(std::move(spec)) {
  const std::string& path = spec_.path;
  int max_id = static_cast<int>(spec_.vocab.size()) - 1;
  for (const auto& a : spec_.added) max_id = std::max(max_id, a.id);
  id_to_piece_ = spec_.vocab;
  id_to_piece_.resize(static_cast<std::size_t>(max_id + 1));
  for (const auto& a : spec_.added) {
    if (a.id < 0 || a.content.empty())
      throw ModelError(path + ": added_tokens entry \"" + a.content + "\" (id " + std::to_string(a.id) +
                       ") needs a non-negative id and non-empty content");
    id_to_piece_[static_cast<std::size_t>(a.id)] = a.content;
  }
  piece_to_id_.reserve(id_to_piece_.size() * 2);
  for (std::size_t id = 0; id < spec_.vocab.size(); ++id)
    if (!spec_.vocab[id].empty()) piece_to_id_.emplace(spec_.vocab[id], static_cast<int>(id));
  for (const auto& a : spec_.added) piece_to_id_.emplace(a.content, a.id);
  byte_id_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    char name[16];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = piece_to_id_.find(name);
    if (it != piece_to_id_.end()) byte_id_[static_cast<std::size_t>(b)] = it->second;
  }
  if (spec_.byte_fallback) check_byte_tokens(path, spec_.vocab);
  merges_.reserve(spec_.merges.size() * 2);
  for (std::size_t r = 0; r < spec_.merges.size(); ++r) {
    const auto& [a, b] = spec_.merges[r];
    const int ia = token_id(a), ib = token_id(b), inew = token_id(a + b);
    if (ia < 0 || ib < 0 || inew < 0)
      throw ModelError(path + ": model.merges[" + std::to_string(r) + "] = \"" + a + " " + b + "\": " +
                       (ia < 0 ? "\"" + a + "\"" : ib < 0 ? "\"" + b + "\"" : "the merged \"" + a + b + "\"") +
                       " is not in model.vocab");
    merges_.insert_or_assign(pair_key(ia, ib), std::make_pair(static_cast<int>(r), inew));  // later entry wins
  }
  for (const auto& a : spec_.added) {
    if (!a.normalized) {
      raw_added_.push_back(a);
    } else {
      AddedToken n = a;
      n.content = normalize(a.content);
      if (!n.content.empty()) norm_added_.push_back(n);
    }
  }
  auto longest_first = [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); };
  std::stable_sort(raw_added_.begin(), raw_added_.end(), longest_first);
  std::stable_sort(norm_added_.begin(), norm_added_.end(), longest_first);
  for (int id : spec_.specials.prefix)
    if (id < 0 || id >= vocab_size())
      throw ModelError(path + ": the special-token rule (" + spec_.specials.source + ") adds id " + std::to_string(id) +
                       ", outside the vocabulary");
}

int SpBpeTokenizer::token_id(const std::string& piece) const {
  auto it = piece_to_id_.find(piece);
  return it == piece_to_id_.end() ? -1 : it->second;
}

std::string SpBpeTokenizer::normalize(const std::string& s) const {
  std::string out = s;
  for (const NormOp& op : spec_.normalizer) {
    if (op.kind == NormOp::prepend) {
      if (!out.empty()) out = op.a + out;
    } else {
      out = replace_all(out, op.a, op.b);
    }
  }
  return out;
}

// tokenizers' AddedVocabulary::find_matches: leftmost match, longest first; lstrip/rstrip widen it
// over whitespace (lstrip never into the previous match).
std::vector<SpBpeTokenizer::Segment> SpBpeTokenizer::split_added(const std::vector<Segment>& in,
                                                                 bool normalized) const {
  const std::vector<AddedToken>& set = normalized ? norm_added_ : raw_added_;
  std::vector<Segment> out;
  for (const Segment& seg : in) {
    if (seg.added_id >= 0 || set.empty()) {
      out.push_back(seg);
      continue;
    }
    const std::string& s = seg.text;
    std::size_t start_offset = 0;
    auto emit_text = [&](std::size_t a, std::size_t b) {
      if (b > a) out.push_back({-1, s.substr(a, b - a), seg.at_start && a == 0});
    };
    for (std::size_t i = 0; i < s.size();) {
      const AddedToken* hit = nullptr;
      for (const AddedToken& a : set)
        if (s.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
      if (!hit) {
        i += char_len(s, i);
        continue;
      }
      std::size_t start = i, stop = i + hit->content.size();
      if (hit->lstrip) {
        std::size_t j = start;
        while (j > start_offset) {
          std::size_t k = j - 1;  // back to the start of the previous character
          while (k > start_offset && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
          if (!is_ws(decode_cp(s, k, char_len(s, k)))) break;
          j = k;
        }
        start = j;
      }
      if (hit->rstrip) {
        while (stop < s.size()) {
          const std::size_t n = char_len(s, stop);
          if (!is_ws(decode_cp(s, stop, n))) break;
          stop += n;
        }
      }
      emit_text(start_offset, start);
      out.push_back({hit->id, {}, false});
      start_offset = stop;
      i = stop;
    }
    emit_text(start_offset, s.size());
  }
  return out;
}

void SpBpeTokenizer::bpe_word(const std::string& word, std::vector<int>* out) const {
  if (spec_.ignore_merges) {
    const int id = token_id(word);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  struct Sym {
    int id;
    int prev, next;
    bool alive;
  };
  std::vector<Sym> sym;
  sym.reserve(word.size());
  auto push = [&](int id) {
    const int n = static_cast<int>(sym.size());
    sym.push_back({id, n - 1, n + 1, true});
  };
  bool last_unk = false;
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t n = char_len(word, i);
    const std::string ch = word.substr(i, n);
    i += n;
    const int id = token_id(ch);
    if (id >= 0) {
      push(id);
      last_unk = false;
      continue;
    }
    if (spec_.byte_fallback) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_id_[b] >= 0;
      if (all) {
        for (unsigned char b : ch) push(byte_id_[b]);
        last_unk = false;
        continue;
      }
    }
    if (spec_.unk_id >= 0) {
      if (!(spec_.fuse_unk && last_unk)) push(spec_.unk_id);
      last_unk = true;
    }
    // no unk token: tokenizers drops the character
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  struct Merge {
    int pos, rank, new_id;
  };
  auto worse = [](const Merge& x, const Merge& y) { return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos; };
  std::priority_queue<Merge, std::vector<Merge>, decltype(worse)> q(worse);
  auto lookup = [&](int a, int b) -> const std::pair<int, int>* {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (std::size_t i = 0; i + 1 < sym.size(); ++i)
    if (const auto* m = lookup(sym[i].id, sym[i + 1].id)) q.push({static_cast<int>(i), m->first, m->second});
  while (!q.empty()) {
    const Merge top = q.top();
    q.pop();
    Sym& cur = sym[static_cast<std::size_t>(top.pos)];
    if (!cur.alive || cur.next < 0) continue;
    const Sym right = sym[static_cast<std::size_t>(cur.next)];
    const auto* m = lookup(cur.id, right.id);
    if (!m || m->second != top.new_id) continue;  // an expired entry
    cur.id = top.new_id;
    sym[static_cast<std::size_t>(cur.next)].alive = false;
    cur.next = right.next;
    if (right.next >= 0) sym[static_cast<std::size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0)
      if (const auto* pm = lookup(sym[static_cast<std::size_t>(cur.prev)].id, cur.id))
        q.push({cur.prev, pm->first, pm->second});
    if (cur.next >= 0)
      if (const auto* nm = lookup(cur.id, sym[static_cast<std::size_t>(cur.next)].id))
        q.push({top.pos, nm->first, nm->second});
  }
  for (const Sym& s : sym)
    if (s.alive) out->push_back(s.id);
}

std::vector<int> SpBpeTokenizer::encode(const std::string& text, bool add_special) const {
  std::vector<int> ids;
  if (add_special) ids = spec_.specials.prefix;
  std::vector<Segment> segs = split_added({{-1, text, true}}, false);
  for (Segment& s : segs)
    if (s.added_id < 0) s.text = normalize(s.text);
  segs = split_added(segs, true);
  const Metaspace& ms = spec_.pre;
  for (const Segment& s : segs) {
    if (s.added_id >= 0) {
      ids.push_back(s.added_id);
      continue;
    }
    if (s.text.empty()) continue;
    if (!ms.on) {
      bpe_word(s.text, &ids);
      continue;
    }
    std::string t = replace_all(s.text, " ", ms.replacement);
    const bool prepend = ms.scheme == Prepend::always || (ms.scheme == Prepend::first && s.at_start);
    if (prepend && !starts_with(t, ms.replacement)) t = ms.replacement + t;
    if (!ms.split) {
      bpe_word(t, &ids);
      continue;
    }
    // MergedWithNext: every replacement character opens a new word.
    std::size_t begin = 0;
    for (std::size_t i = 1; i <= t.size(); ++i) {  // a replacement at 0 opens the first word
      if (i == t.size() || t.compare(i, ms.replacement.size(), ms.replacement) == 0) {
        if (i > begin) bpe_word(t.substr(begin, i - begin), &ids);
        begin = i;
      }
    }
  }
  if (add_special) ids.insert(ids.end(), spec_.specials.suffix.begin(), spec_.specials.suffix.end());
  return ids;
}

// The decoder chain over token strings. streaming: one token of a running text (byte tokens give
// their raw byte, `first` says whether it starts the text).
std::vector<std::string> SpBpeTokenizer::run_decoder(std::vector<std::string> toks, bool streaming,
                                                     bool first) const {
  bool fused = false;
  for (const DecodeOp& op : spec_.decoder) {
    switch (op.kind) {
      case DecodeOp::replace:
        for (auto& t : toks) t = replace_all(t, op.a, op.b);
        break;
      case DecodeOp::byte_fallback: {
        std::vector<std::string> next;
        std::string bytes;
        std::size_t n_bytes = 0;
        auto flush = [&] {
          if (n_bytes == 0) return;
          if (streaming || valid_utf8(bytes)) {
            next.push_back(bytes);
          } else {
            for (std::size_t k = 0; k < n_bytes; ++k) next.emplace_back("\xEF\xBF\xBD");  // U+FFFD per byte token
          }
          bytes.clear();
          n_bytes = 0;
        };
        for (auto& t : toks) {
          const int b = byte_token_value(t);
          if (b >= 0) {
            bytes.push_back(static_cast<char>(b));
            ++n_bytes;
          } else {
            flush();
            next.push_back(std::move(t));
          }
        }
        flush();
        toks.swap(next);
        break;
      }
      case DecodeOp::fuse: {
        std::string all;
        for (const auto& t : toks) all += t;
        toks.assign(1, all);
        fused = true;
        break;
      }
      case DecodeOp::strip:
        for (auto& t : toks) {
          const bool whole = !streaming || !fused;  // after Fuse, a streamed token is only part of the text
          std::size_t a = 0, b = t.size();
          if (whole || first)
            for (int k = 0; k < op.start && a < b && starts_with(t.substr(a), op.a); ++k) a += op.a.size();
          if (whole)
            for (int k = 0; k < op.stop && b >= a + op.a.size() && t.compare(b - op.a.size(), op.a.size(), op.a) == 0;
                 ++k)
              b -= op.a.size();
          t = t.substr(a, b - a);
        }
        break;
      case DecodeOp::metaspace:
        for (std::size_t i = 0; i < toks.size(); ++i) {
          // After Fuse the whole text is token 0 (tokenizers then drops every replacement
          // character, not only the first); a streamed piece is then part of token 0 too.
          const bool is_first = fused || (streaming ? first : i == 0);
          toks[i] = replace_all(toks[i], op.a, is_first && op.scheme != Prepend::never ? "" : " ");
        }
        break;
    }
  }
  return toks;
}

std::string SpBpeTokenizer::decode(const std::vector<int>& ids) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int id : ids)
    if (id >= 0 && id < vocab_size()) toks.push_back(id_to_piece_[static_cast<std::size_t>(id)]);
  std::string out;
  for (const auto& t : run_decoder(std::move(toks), false, true)) out += t;
  return out;
}

std::string SpBpeTokenizer::decode_piece(int prev, int token) const {
  if (token < 0 || token >= vocab_size()) return {};
  const bool first = prev < 0;  // as decode(): only the text's first token loses its leading space
  std::string out;
  for (const auto& t : run_decoder({id_to_piece_[static_cast<std::size_t>(token)]}, true, first)) out += t;
  return out;
}

}  // namespace kvgate
