// Hugging Face tokenizer.json: the loader that picks the model kind, the special-token rule
// (which tokens encode(text, add_special = true) puts around the text), and the
// SentencePiece-style BPE model (Llama 2, Mistral v0.x, Gemma).
//
// The special-token rule follows the tokenizer, as the `tokenizers` library, transformers and
// llama.cpp do, never config.json's bos_token_id:
//   - tokenizer.json `post_processor`: TemplateProcessing (the special tokens before / after $A of
//     `single`), RobertaProcessing / BertProcessing (cls $A sep), Sequence of processors; ByteLevel
//     and null add nothing (Qwen2/2.5/3: config.json declares bos_token_id, the tokenizer adds none);
//   - tokenizer_config.json `add_bos_token` / `add_eos_token`, when present, replace that side of the
//     rule (transformers' Llama/Gemma tokenizers rebuild their post-processor from them), with
//     `bos_token` / `eos_token` naming the token.
//
// SentencePiece-style BPE (model.type "BPE" with byte_fallback, or a ▁ normalizer/pre-tokenizer),
// applied in the `tokenizers` library's order:
//   1. added tokens whose `normalized` is false are split out of the raw text (leftmost, longest
//      first; `lstrip` / `rstrip` swallow the whitespace beside them);
//   2. each remaining piece is normalized (Prepend, Replace with a String pattern, Sequence), then
//      the added tokens whose `normalized` is true are split out (their content normalized too);
//   3. pre-tokenizer: none (the piece is one word) or Metaspace (' ' -> replacement, prepend_scheme
//      always / first (only the piece at offset 0 of the text) / never, `split` before each ▁);
//   4. BPE per word: one symbol per character (its vocab id; else, with byte_fallback, one <0xXX>
//      token per UTF-8 byte; else unk, fused when fuse_unk), then merges by rank, lowest first and
//      leftmost on ties, each merge re-pairing with its neighbours (tokenizers' Word::merge_all);
//      ignore_merges: a word that is itself in the vocab is one token.
//   Decoding runs the decoder chain (Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence) over the
//   token strings, as `tokenizers` decode(ids, skip_special_tokens = false) does.
// Anything else (another model type, normalizer, pre-tokenizer, decoder or post-processor) is
// refused naming the file and the field.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvgate/model.hpp"

namespace kvgate {


// Loads DIR/tokenizer.json-style files: byte-level BPE (BpeTokenizer) or SentencePiece-style BPE
// (SpBpeTokenizer), with the special-token rule above. `tokenizer_config` may be empty or name a
// file that does not exist (then only tokenizer.json decides). bos_id/eos_id: config.json's ids
// (-1 when absent), used for bos_id()/eos_id() when the tokenizer files name none. Throws ModelError
// naming the file and the field.
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path, int bos_id, int eos_id,
                                               const std::string& tokenizer_config = {});

class SpBpeTokenizer : public Tokenizer {
 public:
  enum class Prepend : std::uint8_t { always, first, never };
  struct NormOp {  // prepend: a = text; replace: a -> b (String pattern)
    enum Kind : std::uint8_t { prepend, replace } kind;
    std::string a, b;
  };
  struct Metaspace {
    bool on = false;
    std::string replacement = "\xE2\x96\x81";  // U+2581
    Prepend scheme = Prepend::always;
    bool split = true;
  };
  struct DecodeOp {
    enum Kind : std::uint8_t { replace, byte_fallback, fuse, strip, metaspace } kind;
    std::string a, b;          // replace: a -> b; strip: a = content; metaspace: a = replacement
    int start = 0, stop = 0;   // strip
    Prepend scheme = Prepend::always;  // metaspace
  };
  struct AddedToken {
    int id = -1;
    std::string content;
    bool special = true, lstrip = false, rstrip = false, normalized = false;
  };
  struct Spec {
    std::vector<std::string> vocab;  // id -> piece (▁ for spaces, <0xXX> byte tokens)
    std::vector<std::pair<std::string, std::string>> merges;  // rank order
    std::vector<NormOp> normalizer;
    Metaspace pre;
    std::vector<DecodeOp> decoder;
    std::vector<AddedToken> added;
    bool byte_fallback = false, ignore_merges = false, fuse_unk = false;
    int unk_id = -1;
    int bos_id = -1, eos_id = -1;
    SpecialsRule specials;
    std::string path;  // for error messages
  };

  explicit SpBpeTokenizer(Spec spec);
  // Throws ModelError naming `path` and model.byte_fallback unless vocab holds all 256 <0xXX> tokens.
  static void check_byte_tokens(const std::string& path, const std::vector<std::string>& vocab);

  std::vector<int> encode(const std::string& text, bool add_special) const override;
  std::string decode_piece(int prev, int token) const override;
  std::string decode(const std::vector<int>& ids) const override;
  int vocab_size() const override { return static_cast<int>(id_to_piece_.size()); }
  int bos_id() const override { return spec_.bos_id; }
  int eos_id() const override { return spec_.eos_id; }
  bool adds_bos() const override { return !spec_.specials.prefix.empty(); }
  bool adds_eos() const override { return !spec_.specials.suffix.empty(); }
  const SpecialsRule& specials() const { return spec_.specials; }

  int token_id(const std::string& piece) const;  // -1 when absent
  const std::string& piece(int id) const { return id_to_piece_.at(static_cast<std::size_t>(id)); }

 private:
  struct Segment {
    int added_id;        // >= 0: an added token
    std::string text;    // else the text
    bool at_start;       // the text begins at offset 0 of the input
  };
  std::vector<Segment> split_added(const std::vector<Segment>& in, bool normalized) const;
  std::string normalize(const std::string& s) const;
  void bpe_word(const std::string& word, std::vector<int>* out) const;
  std::vector<std::string> run_decoder(std::vector<std::string> tokens, bool streaming, bool first) const;

  Spec spec_;
  std::vector<std::string> id_to_piece_;
  std::unordered_map<std::string, int> piece_to_id_;
  std::unordered_map<std::uint64_t, std::pair<int, int>> merges_;  // (left id, right id) -> (rank, new id)
  std::vector<AddedToken> raw_added_, norm_added_;                 // longest content first
  std::vector<int> byte_id_;                                       // byte -> <0xXX> id or -1
};

}  // namespace kvgate
