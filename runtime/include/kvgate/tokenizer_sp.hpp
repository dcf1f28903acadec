// SentencePiece-style BPE by piece scores, as llama2.c run.c `encode`/`decode` do it:
// - pieces are plain byte strings with ' ' for spaces (GGUF's U+2581 is mapped to ' ' on load);
// - encode: optional BOS, a dummy-prefix " " token when the text is non-empty, one token per UTF-8
//   code point (byte-fallback tokens <0xXX> when the code point is not a piece), then repeatedly
//   merge the adjacent pair whose concatenation is a piece with the highest score;
// - decode_piece: strips the leading space of the first piece after BOS; byte tokens <0xXX> decode
//   to the raw byte.
// A GGUF "llama" vocabulary adds llama.cpp's rules (llama-vocab.cpp, LLAMA_VOCAB_TYPE_SPM), set by
// set_gguf_rules: its CONTROL / USER_DEFINED / UNKNOWN pieces are cut out of the text first (longest
// match first) and emitted as themselves; every remaining text fragment that starts the text or
// follows such a token gets the " " prefix when tokenizer.ggml.add_space_prefix (default true), and
// none at all when false (Gemma); merges stay inside a fragment; decode(ids) strips the leading space
// of the first piece only (not the one after a BOS inside the sequence), as llama.cpp's detokenizer
// does, and only with the prefix on; decode_piece strips it after BOS and at the first token (prev < 0);
// a <0xXX> piece decodes to its byte only when it is typed BYTE.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvgate/model.hpp"

namespace kvgate {

class SpTokenizer : public Tokenizer {
 public:
  // pieces[id] with ' ' for spaces; scores[id]; unk_id is used when even byte fallback is impossible.
  SpTokenizer(std::vector<std::string> pieces, std::vector<float> scores, int bos_id, int eos_id, int unk_id = 0);

  // llama2.c tokenizer.bin (e.g. tok512.bin): int32 max_token_length, then per token: float32 score,
  // int32 length, bytes. `vocab_size` comes from the model header. Throws ModelError naming the file
  // and the field (the token index), limits::LimitError for vocab_size, max_token_length or a piece
  // over VOCAB / TOKEN_BYTES; a negative length or a NaN / infinite score is refused.
  static std::unique_ptr<SpTokenizer> from_llama2c_file(const std::string& path, int vocab_size, int bos_id = 1,
                                                        int eos_id = 2);

  // add_special: BOS first when adds_bos() (llama2.c always; GGUF tokenizer.ggml.add_bos_token), EOS
  // last when adds_eos().
  std::vector<int> encode(const std::string& text, bool add_special) const override;
  std::string decode_piece(int prev, int token) const override;
  std::string decode(const std::vector<int>& ids) const override;
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }
  bool adds_bos() const override { return add_bos_ && bos_ >= 0; }
  bool adds_eos() const override { return add_eos_ && eos_ >= 0; }
  void set_adds(bool bos, bool eos) {
    add_bos_ = bos;
    add_eos_ = eos;
  }
  // llama.cpp's SentencePiece rules of a GGUF vocabulary (see above). `types`: tokenizer.ggml.token_type
  // per id (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte), or empty when the file
  // has none (then no piece is special and every <0xXX> piece decodes as its byte).
  void set_gguf_rules(bool add_space_prefix, const std::vector<int>& types);
  bool adds_space_prefix() const { return space_prefix_; }

  const std::string& piece(int id) const { return pieces_.at(static_cast<std::size_t>(id)); }
  float score(int id) const { return scores_.at(static_cast<std::size_t>(id)); }
  int piece_id(const std::string& s) const;  // -1 when absent
  int byte_token(unsigned char b) const { return byte_id_[b]; }  // -1 when the vocab has no <0xXX> for b

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> lookup_;
  std::array<int, 256> byte_id_{};
  // A piece's text: its byte for a byte piece, else the piece less its leading space when `strip`
  // (and the prefix rule is on).
  std::string piece_text(int token, bool strip) const;
  // One text fragment (no special token inside) in SentencePiece's way, appended to `out`.
  void encode_fragment(const std::string& text, bool prefix, std::vector<int>& out) const;

  int bos_, eos_, unk_;
  bool add_bos_ = true, add_eos_ = false;
  bool space_prefix_ = true, strip_first_ = false;
  // Special pieces by first byte, longest first: (piece, id).
  std::array<std::vector<std::pair<std::string, int>>, 256> specials_{};
  std::vector<bool> not_byte_;  // ids typed other than BYTE (llama.cpp prints their text, even "<0xXX>")
};

}  // namespace kvgate
