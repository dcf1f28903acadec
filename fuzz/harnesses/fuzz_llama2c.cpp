// libFuzzer harness: the llama2.c checkpoint loader (load_llama2c) with the real tok512.bin-style
// tokenizer beside it absent, so only the checkpoint bytes are under test.
#include <exception>

#include "fuzz_common.hpp"
#include "kvgate/loaders.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = kvgate::fuzz::scratch_dir() / "model.bin";
  kvgate::fuzz::write_file(path, data, size);
  try {
    const kvgate::Model m = kvgate::load_llama2c(path.string(), "/nonexistent-tokenizer.bin");
    (void)m;
  } catch (const std::exception&) {
  }
  return 0;
}
