// SentencePiece-style BPE by piece scores, as llama2.c run.c `encode`/`decode` do it:
// - pieces are plain byte strings with ' ' for spaces (GGUF's U+2581 is mapped to ' ' on load);
// - encode: optional BOS, a dummy-prefix " " token when the text is non-empty, one token per UTF-8
//   code point (byte-fallback tokens <0xXX> when the code point is not a piece), then repeatedly
//   merge the adjacent pair whose concatenation is a piece with the highest score;
// - decode_piece: strips the leading space of the first piece after BOS; byte tokens <0xXX> decode
//   to the raw byte.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <unordered_map>
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
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }
  bool adds_bos() const override { return add_bos_ && bos_ >= 0; }
  bool adds_eos() const override { return add_eos_ && eos_ >= 0; }
  void set_adds(bool bos, bool eos) {
    add_bos_ = bos;
    add_eos_ = eos;
  }

  const std::string& piece(int id) const { return pieces_.at(static_cast<std::size_t>(id)); }
  float score(int id) const { return scores_.at(static_cast<std::size_t>(id)); }
  int piece_id(const std::string& s) const;  // -1 when absent
  int byte_token(unsigned char b) const { return byte_id_[b]; }  // -1 when the vocab has no <0xXX> for b

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> lookup_;
  std::array<int, 256> byte_id_{};
  int bos_, eos_, unk_;
  bool add_bos_ = true, add_eos_ = false;
};

}  // namespace kvgate
