// `--corpus FILE`: a corpus JSON, a token-id file or a text file, checked against the model.
#include <cctype>
#include <fstream>
#include <sstream>

#include "kvgate/json_limits.hpp"
#include "kvgate/model.hpp"
#include "kvgate/signoff.hpp"

namespace kvgate::signoff {

namespace {

[[noreturn]] void refuse(const std::string& path, const std::string& field, const std::string& problem, const std::string& fix) {
  throw PolicyError("corpus " + path + ": " + field + ": " + problem + "; fix: " + fix);
}

bool only_ids(const std::string& s) {
  bool digit = false;
  for (char c : s) {
    if (std::isdigit(static_cast<unsigned char>(c))) digit = true;
    else if (!(c == ' ' || c == ',' || c == '\n' || c == '\r' || c == '\t' || c == '-')) return false;
  }
  return digit;
}

}  // namespace

std::vector<std::vector<int>> load_corpus_file(const std::string& path, const Model& model, int max_context) {
  std::ifstream f(path, std::ios::binary);
  if (!f) refuse(path, "(file)", "cannot be read", "give --corpus an existing text, token-id or corpus JSON file");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  std::vector<std::vector<int>> seqs;
  std::string kind;
  const bool is_json = path.size() >= 5 && path.substr(path.size() - 5) == ".json";
  if (is_json) {
    kind = "corpus JSON";
    nlohmann::json j;
    try {
      j = limits::parse_json(text, path);
    } catch (const std::exception& e) {
      refuse(path, "(file)", std::string("not valid JSON (") + e.what() + ")",
             "write {\"sequences\": [{\"tokens\": [ids...]}, ...]} or pass a .txt / token-id file");
    }
    if (!j.is_object() || !j.contains("sequences") || !j["sequences"].is_array())
      refuse(path, "field 'sequences'", "missing or not an array", "write {\"sequences\": [{\"tokens\": [ids...]}, ...]}");
    for (std::size_t i = 0; i < j["sequences"].size(); ++i) {
      const auto& s = j["sequences"][i];
      const std::string field = "field 'sequences[" + std::to_string(i) + "].tokens'";
      if (!s.is_object() || !s.contains("tokens") || !s["tokens"].is_array())
        refuse(path, field, "missing or not an array", "give every sequence a \"tokens\" array of ids");
      std::vector<int> t;
      for (const auto& x : s["tokens"]) {
        if (!x.is_number_integer()) refuse(path, field, "holds " + x.dump() + ", not an integer id", "write token ids as integers");
        t.push_back(x.get<int>());
      }
      seqs.push_back(std::move(t));
    }
  } else if (only_ids(text)) {
    kind = "token-id file";
    std::istringstream lines(text);
    std::string line;
    std::vector<int> cur;
    while (std::getline(lines, line)) {
      bool blank = true;
      for (char c : line) blank = blank && std::isspace(static_cast<unsigned char>(c));
      if (blank) {
        if (!cur.empty()) seqs.push_back(std::move(cur));
        cur.clear();
        continue;
      }
      for (auto& c : line)
        if (c == ',') c = ' ';
      std::istringstream w(line);
      long long id;
      while (w >> id) cur.push_back(static_cast<int>(id));
    }
    if (!cur.empty()) seqs.push_back(std::move(cur));
  } else {
    kind = "text file";
    if (!model.tokenizer)
      refuse(path, "(text)", "the model " + model.path + " has no tokenizer to encode text with",
             "give a token-id file, or a model with its tokenizer beside it");
    seqs.push_back(model.tokenizer->encode(text, true));
  }
  std::size_t total = 0;
  for (const auto& s : seqs) total += s.size();
  if (total == 0) refuse(path, "(contents)", "the " + kind + " holds no token", "give a file with at least two tokens of text or ids");
  const int vocab = model.config.vocab_size;
  for (std::size_t i = 0; i < seqs.size(); ++i)
    for (std::size_t k = 0; k < seqs[i].size(); ++k)
      if (seqs[i][k] < 0 || seqs[i][k] >= vocab)
        refuse(path, "sequence " + std::to_string(i) + ", token " + std::to_string(k),
               "id " + std::to_string(seqs[i][k]) + " is outside the vocabulary [0, " + std::to_string(vocab) + ") of " + model.path,
               "give ids of this model's tokenizer (or a text file, which it encodes)");
  std::vector<std::vector<int>> out;
  const std::size_t L = static_cast<std::size_t>(std::max(2, max_context));
  for (const auto& s : seqs)
    for (std::size_t i = 0; i < s.size(); i += L) out.emplace_back(s.begin() + static_cast<std::ptrdiff_t>(i),
                                                                   s.begin() + static_cast<std::ptrdiff_t>(std::min(s.size(), i + L)));
  return out;
}

}  // namespace kvgate::signoff
