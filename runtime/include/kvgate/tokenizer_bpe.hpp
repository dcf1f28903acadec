// Byte-level BPE tokenizer (GPT-2 / Llama-3 / Qwen2 style), shared by the Hugging Face loader
// (tokenizer.json) and the GGUF loader (`gpt2` vocabularies: tokenizer.ggml.tokens + merges).
//
// Tokens are stored in their byte-level form: every byte 0..255 is mapped to one printable Unicode
// code point (GPT-2's bytes_to_unicode), so " hello" is the token string "Ġhello".
//
// Pre-tokenization re-implements the published split regexes by hand (no regex engine with \p{..}
// classes is used). Character classes come from a generated table of the \p{L}, \p{N} and \s
// ranges (runtime/src/tokenizer_bpe_tables.inc); bytes that are not valid UTF-8 pass through as
// single "other" characters, so decode(encode(s)) == s for any byte string s.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvgate/model.hpp"

namespace kvgate {

// The split rule applied before BPE.
enum class PreTokenizer : std::uint8_t {
  gpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  llama3,  // (?i:'s|'t|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  qwen2,   // as llama3 but \p{N} one digit at a time
  none     // the whole text (between added tokens) is one piece
};

// Parses a pre-tokenizer name: "gpt2", "llama3"/"llama-bpe", "qwen2", "none" (GGUF tokenizer.ggml.pre
// values map onto these). Returns false for a name it does not know.
bool parse_pre_tokenizer(std::string_view name, PreTokenizer* out);

// GPT-2 byte <-> unicode map.
std::string byte_to_unicode_utf8(std::uint8_t b);  // UTF-8 of the code point standing for byte b
// Decodes a byte-level token string back to raw bytes; returns false when a code point is not in
// the map (e.g. special tokens written verbatim).
bool byte_level_decode(std::string_view token, std::string* bytes);

// Splits `text` into pre-tokens with the given rule (exposed for tests).
std::vector<std::string> pre_tokenize(std::string_view text, PreTokenizer rule);

class BpeTokenizer : public Tokenizer {
 public:
  struct AddedToken {
    int id = -1;
    std::string content;   // matched verbatim in the input text before pre-tokenization
    bool special = true;
  };
  struct Options {
    PreTokenizer pre = PreTokenizer::llama3;
    bool add_prefix_space = false;  // GPT-2 ByteLevel option: prepend ' ' when text starts without one
    bool ignore_merges = false;     // tokenizer.json model.ignore_merges: a pre-token in the vocab is one token
    int bos_id = -1;
    int eos_id = -1;
    SpecialsRule specials;          // what encode(text, true) puts around the text
    std::vector<AddedToken> added;  // specials / added tokens (ids may also appear in vocab)
  };

  // vocab[id] = byte-level token string; merges = "left right" in rank order (rank = index).
  BpeTokenizer(std::vector<std::string> vocab, const std::vector<std::string>& merges, Options opts);
  // Same with merges as pairs.
  BpeTokenizer(std::vector<std::string> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
               Options opts);

  // Reads a Hugging Face tokenizer.json (model.type "BPE", byte-level); the special-token rule from
  // its post_processor (load_tokenizer_json in kvgate/tokenizer_json.hpp also reads
  // tokenizer_config.json and the SentencePiece-style kind). bos/eos: bos_id()/eos_id().
  // Throws ModelError naming the file and field on anything it cannot use.
  static std::unique_ptr<BpeTokenizer> from_tokenizer_json(const std::string& path, int bos_id, int eos_id);

  std::vector<int> encode(const std::string& text, bool add_special) const override;
  std::string decode_piece(int prev, int token) const override;
  int vocab_size() const override { return static_cast<int>(id_to_token_.size()); }
  int bos_id() const override { return opts_.bos_id; }
  int eos_id() const override { return opts_.eos_id; }
  bool adds_bos() const override { return !opts_.specials.prefix.empty(); }
  bool adds_eos() const override { return !opts_.specials.suffix.empty(); }

  // Token id for an exact byte-level string, or -1.
  int token_id(const std::string& byte_level) const;
  const std::string& token_string(int id) const { return id_to_token_.at(static_cast<std::size_t>(id)); }
  std::size_t merge_count() const { return merge_rank_.size(); }
  const Options& options() const { return opts_; }

 private:
  void init(std::vector<std::string> vocab, std::vector<std::pair<std::string, std::string>> merges);
  void bpe_piece(const std::string& piece_bytes, std::vector<int>* out) const;

  Options opts_;
  std::vector<std::string> id_to_token_;   // byte-level strings (added tokens verbatim)
  std::vector<std::string> id_to_bytes_;   // decoded bytes per id
  std::unordered_map<std::string, int> token_to_id_;
  std::unordered_map<std::string, int> merge_rank_;  // key: left + '\x01' + right
  std::vector<int> byte_token_;                      // byte -> id of its single-byte token (-1 if none)
  std::vector<AddedToken> added_sorted_;             // longest content first
  std::vector<bool> added_first_;                    // first bytes of added tokens (fast skip)
};

}  // namespace kvgate
