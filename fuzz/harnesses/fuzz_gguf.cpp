// libFuzzer harness: the GGUF loader (load_gguf: header, metadata, tensor infos and data, the
// tokenizer from metadata), then an encode/decode with the tokenizer it built.
#include <exception>

#include "fuzz_common.hpp"
#include "kvgate/loaders.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = kvgate::fuzz::scratch_dir() / "model.gguf";
  kvgate::fuzz::write_file(path, data, size);
  try {
    const kvgate::Model m = kvgate::load_gguf(path.string());
    if (m.tokenizer) {
      const auto ids = m.tokenizer->encode("Once upon a time \xff caf\xC3\xA9", true);
      for (int id : ids) (void)m.tokenizer->decode_piece(0, id);
    }
  } catch (const std::exception&) {
  }
  return 0;
}
