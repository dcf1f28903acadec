// libFuzzer harness: tokenizer.json, both kinds (byte-level BPE and SentencePiece-style BPE) through
// load_tokenizer_json and BpeTokenizer::from_tokenizer_json, then encode/decode of a fixed text.
#include <exception>

#include "fuzz_common.hpp"
#include "kvgate/tokenizer_bpe.hpp"
#include "kvgate/tokenizer_json.hpp"

namespace {
void exercise(const kvgate::Tokenizer& t) {
  const auto ids = t.encode("Hello, world! <|begin_of_text|> caf\xC3\xA9 \xff 123\n\tx", true);
  int prev = t.bos_id();
  for (int id : ids) {
    (void)t.decode_piece(prev, id);
    prev = id;
  }
  (void)t.decode(ids);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = kvgate::fuzz::scratch_dir() / "tokenizer.json";
  kvgate::fuzz::write_file(path, data, size);
  try {
    exercise(*kvgate::load_tokenizer_json(path.string(), 1, 2));
  } catch (const std::exception&) {
  }
  try {
    exercise(*kvgate::BpeTokenizer::from_tokenizer_json(path.string(), 1, 2));
  } catch (const std::exception&) {
  }
  return 0;
}
