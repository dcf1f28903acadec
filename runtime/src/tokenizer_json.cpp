// tokenizer.json loading: model kind, special-token rule, SentencePiece-style BPE spec
// (see kvgate/tokenizer_json.hpp).
#include "kvgate/json_limits.hpp"
#include "kvgate/tokenizer_json.hpp"

#include <filesystem>
#include <fstream>

#include "tokenizer_json_internal.hpp"

namespace kvgate {

namespace {

using json = nlohmann::json;

json read_json(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ModelError(path + ": cannot open " + what);
  try {
    return limits::parse_json(in, path);
  } catch (const json::exception& e) {
    throw ModelError(path + ": not valid JSON (" + e.what() + ")");
  }
}

std::string type_of(const json& v) { return v.is_object() ? v.value("type", std::string()) : std::string(); }

[[noreturn]] void refuse(const std::string& path, const std::string& field, const std::string& why) {
  throw ModelError(path + ": " + field + " " + why);
}

// Id of a token by content: added_tokens first, then model.vocab; -1 when absent.
int find_token(const json& j, const std::string& content) {
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& a : j["added_tokens"])
      if (a.is_object() && a.value("content", std::string()) == content && a.contains("id") &&
          a["id"].is_number_integer())
        return a["id"].get<int>();
  if (j.contains("model") && j["model"].is_object() && j["model"].contains("vocab") && j["model"]["vocab"].is_object()) {
    const auto& v = j["model"]["vocab"];
    auto it = v.find(content);
    if (it != v.end() && it->is_number_integer()) return it->get<int>();
  }
  return -1;
}

SpecialsRule rule_of(const json& p, const std::string& path, const std::string& field) {
  SpecialsRule r;
  if (p.is_null()) return r;
  const std::string t = type_of(p);
  if (t == "ByteLevel") return r;  // offsets only: adds no token
  if (t == "TemplateProcessing") {
    if (!p.contains("single") || !p["single"].is_array())
      refuse(path, field + ".single", "must be a list of {\"SpecialToken\"} / {\"Sequence\"} items");
    bool seen_a = false;
    for (std::size_t k = 0; k < p["single"].size(); ++k) {
      const auto& item = p["single"][k];
      const std::string f = field + ".single[" + std::to_string(k) + "]";
      if (item.is_object() && item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].is_object() ||
          !item["SpecialToken"].contains("id") || !item["SpecialToken"]["id"].is_string())
        refuse(path, f, "is neither {\"SpecialToken\": {\"id\": ...}} nor {\"Sequence\": ...}");
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (!p.contains("special_tokens") || !p["special_tokens"].is_object() || !p["special_tokens"].contains(name) ||
          !p["special_tokens"][name].contains("ids") || !p["special_tokens"][name]["ids"].is_array())
        refuse(path, field + ".special_tokens[\"" + name + "\"].ids",
               "is missing (the template of `single` names \"" + name + "\")");
      for (const auto& id : p["special_tokens"][name]["ids"]) {
        if (!id.is_number_integer() || id.get<long long>() < 0 ||
            static_cast<std::uint64_t>(id.get<long long>()) > limits::max_of(limits::kTokenId))
          refuse(path, field + ".special_tokens[\"" + name + "\"].ids", "holds a value that is not a token id");
        (seen_a ? r.suffix : r.prefix).push_back(id.get<int>());
      }
    }
    if (!seen_a) refuse(path, field + ".single", "has no {\"Sequence\": {\"id\": \"A\"}} item");
    r.source = path + " " + field + " (TemplateProcessing)";
    return r;
  }
  if (t == "RobertaProcessing" || t == "BertProcessing") {
    auto tok = [&](const char* key) {
      if (!p.contains(key) || !p[key].is_array() || p[key].size() != 2 || !p[key][1].is_number_integer())
        refuse(path, field + "." + key, "must be [\"token\", id]");
      return p[key][1].get<int>();
    };
    r.prefix = {tok("cls")};
    r.suffix = {tok("sep")};
    r.source = path + " " + field + " (" + t + ")";
    return r;
  }
  if (t == "Sequence") {
    if (!p.contains("processors") || !p["processors"].is_array())
      refuse(path, field + ".processors", "must be a list of post-processors");
    for (std::size_t k = 0; k < p["processors"].size(); ++k) {
      SpecialsRule s = rule_of(p["processors"][k], path, field + ".processors[" + std::to_string(k) + "]");
      // Each processor wraps what the previous ones produced.
      s.prefix.insert(s.prefix.end(), r.prefix.begin(), r.prefix.end());
      r.suffix.insert(r.suffix.end(), s.suffix.begin(), s.suffix.end());
      r.prefix = std::move(s.prefix);
      if (!s.source.empty()) r.source = s.source;
    }
    return r;
  }
  refuse(path, field + ".type",
         "\"" + t + "\" is not supported (kvgate reads TemplateProcessing, RobertaProcessing, BertProcessing, "
         "ByteLevel, Sequence); the special tokens it adds would be guessed");
}

// tokenizer_config.json `add_bos_token` / `add_eos_token` replace that side of the rule.
void apply_tokenizer_config(const json& j, const std::string& tok_path, const std::string& cfg_path,
                            SpecialsRule* rule, int* bos_id, int* eos_id) {
  const json c = read_json(cfg_path, "tokenizer_config.json");
  if (!c.is_object()) throw ModelError(cfg_path + ": not a JSON object");
  auto token_of = [&](const char* key) -> int {
    if (!c.contains(key) || c[key].is_null()) return -1;
    std::string content;
    if (c[key].is_string()) content = c[key].get<std::string>();
    else if (c[key].is_object() && c[key].contains("content") && c[key]["content"].is_string())
      content = c[key]["content"].get<std::string>();
    else refuse(cfg_path, key, "must be a token string or {\"content\": ...}");
    const int id = find_token(j, content);
    if (id < 0)
      refuse(cfg_path, key, "= \"" + content + "\" is not a token of " + tok_path + " (added_tokens or model.vocab)");
    return id;
  };
  const int cb = token_of("bos_token"), ce = token_of("eos_token");
  if (*bos_id < 0) *bos_id = cb;
  if (*eos_id < 0) *eos_id = ce;
  auto side = [&](const char* flag, const char* token_key, int id, std::vector<int>* ids) {
    if (!c.contains(flag) || c[flag].is_null()) return;
    if (!c[flag].is_boolean()) refuse(cfg_path, flag, "must be true or false");
    ids->clear();
    if (c[flag].get<bool>()) {
      if (id < 0)
        refuse(cfg_path, flag, std::string("is true but ") + token_key + " names no token; set " + token_key +
                                   " or remove " + flag);
      ids->push_back(id);
    }
    rule->source += std::string(rule->source.empty() ? "" : "; ") + cfg_path + " " + flag + " = " +
                    (c[flag].get<bool>() ? "true" : "false");
  };
  side("add_bos_token", "bos_token", cb, &rule->prefix);
  side("add_eos_token", "eos_token", ce, &rule->suffix);
}

// ---- SentencePiece-style BPE ------------------------------------------------------------------

using Sp = SpBpeTokenizer;

std::string string_pattern(const json& q, const std::string& path, const std::string& field) {
  if (!q.contains("pattern") || !q["pattern"].is_object() || !q["pattern"].contains("String") ||
      !q["pattern"]["String"].is_string())
    refuse(path, field + ".pattern", "must be {\"String\": ...} (Regex patterns are not supported)");
  return q["pattern"]["String"].get<std::string>();
}

std::string str_field(const json& q, const char* key, const std::string& path, const std::string& field) {
  if (!q.contains(key) || !q[key].is_string()) refuse(path, field + "." + key, "must be a string");
  return q[key].get<std::string>();
}

Sp::Prepend prepend_scheme(const json& q, const std::string& path, const std::string& field) {
  if (q.contains("prepend_scheme") && q["prepend_scheme"].is_string()) {
    const std::string s = q["prepend_scheme"].get<std::string>();
    if (s == "always") return Sp::Prepend::always;
    if (s == "first") return Sp::Prepend::first;
    if (s == "never") return Sp::Prepend::never;
    refuse(path, field + ".prepend_scheme", "= \"" + s + "\" is not one of always, first, never");
  }
  if (q.contains("add_prefix_space") && q["add_prefix_space"].is_boolean())  // older files
    return q["add_prefix_space"].get<bool>() ? Sp::Prepend::always : Sp::Prepend::never;
  return Sp::Prepend::always;
}

void parse_normalizer(const json& q, const std::string& path, const std::string& field, std::vector<Sp::NormOp>* out) {
  if (q.is_null()) return;
  const std::string t = type_of(q);
  if (t == "Sequence") {
    if (!q.contains("normalizers") || !q["normalizers"].is_array())
      refuse(path, field + ".normalizers", "must be a list of normalizers");
    for (std::size_t k = 0; k < q["normalizers"].size(); ++k)
      parse_normalizer(q["normalizers"][k], path, field + ".normalizers[" + std::to_string(k) + "]", out);
  } else if (t == "Prepend") {
    out->push_back({Sp::NormOp::prepend, str_field(q, "prepend", path, field), {}});
  } else if (t == "Replace") {
    out->push_back({Sp::NormOp::replace, string_pattern(q, path, field), str_field(q, "content", path, field)});
  } else {
    refuse(path, field + ".type",
           "\"" + t + "\" is not supported for SentencePiece-style BPE (kvgate reads Prepend, Replace, Sequence)");
  }
}

void parse_pre_tokenizer(const json& q, const std::string& path, const std::string& field, Sp::Metaspace* ms) {
  if (q.is_null()) return;
  const std::string t = type_of(q);
  if (t == "Sequence" && q.contains("pretokenizers") && q["pretokenizers"].is_array() &&
      q["pretokenizers"].size() == 1) {
    parse_pre_tokenizer(q["pretokenizers"][0], path, field + ".pretokenizers[0]", ms);
    return;
  }
  if (t != "Metaspace")
    refuse(path, field + ".type",
           "\"" + t + "\" is not supported for SentencePiece-style BPE (kvgate reads Metaspace or no pre_tokenizer)");
  ms->on = true;
  ms->replacement = str_field(q, "replacement", path, field);
  ms->scheme = prepend_scheme(q, path, field);
  ms->split = q.value("split", true);
}

void parse_decoder(const json& q, const std::string& path, const std::string& field, std::vector<Sp::DecodeOp>* out) {
  const std::string t = type_of(q);
  if (t == "Sequence") {
    if (!q.contains("decoders") || !q["decoders"].is_array())
      refuse(path, field + ".decoders", "must be a list of decoders");
    for (std::size_t k = 0; k < q["decoders"].size(); ++k)
      parse_decoder(q["decoders"][k], path, field + ".decoders[" + std::to_string(k) + "]", out);
    return;
  }
  Sp::DecodeOp op{};
  if (t == "Replace") {
    op.kind = Sp::DecodeOp::replace;
    op.a = string_pattern(q, path, field);
    op.b = str_field(q, "content", path, field);
  } else if (t == "ByteFallback") {
    op.kind = Sp::DecodeOp::byte_fallback;
  } else if (t == "Fuse") {
    op.kind = Sp::DecodeOp::fuse;
  } else if (t == "Strip") {
    op.kind = Sp::DecodeOp::strip;
    op.a = str_field(q, "content", path, field);
    op.start = q.value("start", 0);
    op.stop = q.value("stop", 0);
    if (op.start < 0 || op.stop < 0) refuse(path, field, "start/stop must be >= 0");
  } else if (t == "Metaspace") {
    op.kind = Sp::DecodeOp::metaspace;
    op.a = str_field(q, "replacement", path, field);
    op.scheme = prepend_scheme(q, path, field);
  } else {
    refuse(path, field + ".type",
           "\"" + t + "\" is not supported for SentencePiece-style BPE (kvgate reads Replace, ByteFallback, Fuse, "
           "Strip, Metaspace, Sequence)");
  }
  out->push_back(std::move(op));
}

std::vector<Sp::AddedToken> parse_added(const json& j, const std::string& path) {
  std::vector<Sp::AddedToken> out;
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return out;
  if (!j["added_tokens"].is_array()) refuse(path, "added_tokens", "must be a list");
  for (std::size_t k = 0; k < j["added_tokens"].size(); ++k) {
    const auto& a = j["added_tokens"][k];
    const std::string f = "added_tokens[" + std::to_string(k) + "]";
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string())
      refuse(path, f, "needs integer 'id' and string 'content'");
    if (a.value("single_word", false))
      refuse(path, f + ".single_word", "is true (\"" + a["content"].get<std::string>() +
                                           "\"); kvgate does not implement single-word matching of added tokens");
    limits::check(limits::kTokenId, a["id"].get<long long>(), path, f + ".id");  // before any table is sized by it
    Sp::AddedToken t;
    t.id = a["id"].get<int>();
    t.content = a["content"].get<std::string>();
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.normalized = a.value("normalized", !t.special);
    out.push_back(std::move(t));
  }
  return out;
}

bool mentions_sentencepiece(const json& q) {
  if (q.is_object()) {
    const std::string t = type_of(q);
    if (t == "Metaspace" || t == "Prepend" || t == "Replace" || t == "ByteFallback" || t == "Fuse" || t == "Strip")
      return true;
    for (const auto& [k, v] : q.items())
      if (mentions_sentencepiece(v)) return true;
  } else if (q.is_array()) {
    for (const auto& v : q)
      if (mentions_sentencepiece(v)) return true;
  }
  return false;
}

}  // namespace

void detail::check_vocab_limits(const json& m, const std::string& path) {
  namespace L = limits;
  if (m.contains("vocab") && m["vocab"].is_object()) {
    const json& v = m["vocab"];
    L::check(L::kVocab, v.size(), path, "model.vocab (entries)");
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string& piece = it.key();
      const std::string shown = "model.vocab[\"" + piece.substr(0, 32) + (piece.size() > 32 ? "...\"]" : "\"]");
      L::check(L::kTokenBytes, piece.size(), path, "length of the piece " + shown);
      if (it->is_number_integer() && it->get<long long>() >= 0) L::check(L::kTokenId, it->get<long long>(), path, shown);
    }
  }
  if (m.contains("merges") && m["merges"].is_array()) L::check(L::kMerges, m["merges"].size(), path, "model.merges (entries)");
}

namespace {

std::unique_ptr<Tokenizer> sp_from_json(const json& j, const std::string& path, int bos_id, int eos_id,
                                        SpecialsRule rule) {
  const auto& m = j["model"];
  Sp::Spec s;
  s.path = path;
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(key) && !m[key].is_null() && !(m[key].is_string() && m[key].get<std::string>().empty()))
      refuse(path, std::string("model.") + key, "is set; kvgate's SentencePiece-style BPE does not implement it");
  if (m.contains("dropout") && !m["dropout"].is_null() && !(m["dropout"].is_number() && m["dropout"].get<double>() == 0))
    refuse(path, "model.dropout", "is set (BPE dropout is random); set it to null");
  if (!m.contains("vocab") || !m["vocab"].is_object()) refuse(path, "model.vocab", "is missing (an object)");
  detail::check_vocab_limits(m, path);  // before the table is sized by the largest id
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<long long>() < 0 || it.value().get<long long>() > (1 << 24))
      refuse(path, "model.vocab[\"" + it.key() + "\"]", "is not a valid token id");
    const auto id = static_cast<std::size_t>(it.value().get<long long>());
    if (id >= s.vocab.size()) s.vocab.resize(id + 1);
    s.vocab[id] = it.key();
  }
  s.byte_fallback = m.value("byte_fallback", false);
  if (s.byte_fallback) SpBpeTokenizer::check_byte_tokens(path, s.vocab);
  if (!m.contains("merges") || !m["merges"].is_array()) refuse(path, "model.merges", "is missing (a list)");
  for (std::size_t r = 0; r < m["merges"].size(); ++r) {
    const auto& e = m["merges"][r];
    if (e.is_string()) {
      const std::string x = e.get<std::string>();
      const std::size_t sp = x.find(' ');
      if (sp == std::string::npos || x.find(' ', sp + 1) != std::string::npos)
        refuse(path, "model.merges[" + std::to_string(r) + "]", "= \"" + x + "\" is not \"left right\"");
      s.merges.emplace_back(x.substr(0, sp), x.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      s.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      refuse(path, "model.merges[" + std::to_string(r) + "]", "is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  s.ignore_merges = m.value("ignore_merges", false);
  s.fuse_unk = m.value("fuse_unk", false);
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    const std::string u = m["unk_token"].get<std::string>();
    s.unk_id = find_token(j, u);
    if (s.unk_id < 0) refuse(path, "model.unk_token", "= \"" + u + "\" is not in model.vocab");
  }
  if (j.contains("normalizer")) parse_normalizer(j["normalizer"], path, "normalizer", &s.normalizer);
  if (j.contains("pre_tokenizer")) parse_pre_tokenizer(j["pre_tokenizer"], path, "pre_tokenizer", &s.pre);
  if (!j.contains("decoder") || j["decoder"].is_null())
    refuse(path, "decoder", "is null; a SentencePiece-style BPE needs its decoder (e.g. Replace + ByteFallback + Fuse)");
  parse_decoder(j["decoder"], path, "decoder", &s.decoder);
  s.added = parse_added(j, path);
  s.bos_id = bos_id >= 0 ? bos_id : (rule.prefix.empty() ? -1 : rule.prefix.front());
  s.eos_id = eos_id >= 0 ? eos_id : (rule.suffix.empty() ? -1 : rule.suffix.back());
  s.specials = std::move(rule);
  return std::make_unique<SpBpeTokenizer>(std::move(s));
}

}  // namespace

namespace detail {
SpecialsRule rule_from_post_processor(const json& j, const std::string& path) {
  if (!j.contains("post_processor")) return {};
  return rule_of(j["post_processor"], path, "post_processor");
}
}  // namespace detail

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path, int bos_id, int eos_id,
                                               const std::string& tokenizer_config) {
  const json j = read_json(path, "tokenizer file");
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw ModelError(path + ": missing object field 'model'");
  const auto& m = j["model"];
  const std::string type = m.value("type", std::string("BPE"));
  if (type != "BPE")
    refuse(path, "model.type",
           "is \"" + type + "\"; kvgate reads BPE tokenizers only (byte-level or SentencePiece-style with byte_fallback)");
  SpecialsRule rule = detail::rule_from_post_processor(j, path);
  std::error_code ec;
  if (!tokenizer_config.empty() && std::filesystem::is_regular_file(tokenizer_config, ec))
    apply_tokenizer_config(j, path, tokenizer_config, &rule, &bos_id, &eos_id);
  if (rule.source.empty()) rule.source = path + " post_processor (adds no special token)";
  const bool sp = m.value("byte_fallback", false) || (j.contains("normalizer") && mentions_sentencepiece(j["normalizer"])) ||
                  (j.contains("pre_tokenizer") && mentions_sentencepiece(j["pre_tokenizer"])) ||
                  (j.contains("decoder") && mentions_sentencepiece(j["decoder"]));
  if (sp) return sp_from_json(j, path, bos_id, eos_id, std::move(rule));
  return detail::bpe_from_json(j, path, bos_id, eos_id, std::move(rule));
}

}  // namespace kvgate
