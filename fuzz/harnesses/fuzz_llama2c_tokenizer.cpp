// libFuzzer harness: the llama2.c tokenizer.bin reader (SpTokenizer::from_llama2c_file), then an
// encode and a decode of every id with the tokenizer it accepted. The first byte picks the vocab size.
#include <exception>

#include "fuzz_common.hpp"
#include "kvgate/tokenizer_sp.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const int vocab = data[0] == 0 ? 512 : data[0];  // 0 -> 512 (tok512.bin), else 1..255
  const auto path = kvgate::fuzz::scratch_dir() / "tokenizer.bin";
  kvgate::fuzz::write_file(path, data + 1, size - 1);
  try {
    auto tok = kvgate::SpTokenizer::from_llama2c_file(path.string(), vocab, 1, 2);
    const auto ids = tok->encode("Once upon a time, \xE2\x96\x81 <0x0A> \xff\xfe caf\xC3\xA9", true);
    for (int id : ids) (void)tok->decode_piece(1, id);
    for (int id = 0; id < tok->vocab_size(); ++id) (void)tok->decode_piece(id == 0 ? 1 : id - 1, id);
  } catch (const std::exception&) {
  }
  return 0;
}
