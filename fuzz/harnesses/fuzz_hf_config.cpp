// libFuzzer harness: config.json, tokenizer_config.json and generation_config.json of the Hugging
// Face loader, with the fixture's weights and tokenizer. The first byte picks the file the rest of
// the input replaces (0: config.json, 1: tokenizer_config.json, 2: generation_config.json).
#include <exception>

#include "fuzz_common.hpp"
#include "kvgate/loaders.hpp"

namespace {
const char* const kFiles[] = {"config.json", "tokenizer_config.json", "generation_config.json"};
const std::filesystem::path& fixture() {
  static const std::filesystem::path f = kvgate::fuzz::source_file("fuzz/fixtures/hf_tiny");
  return f;
}
const std::filesystem::path& dir() {
  static const std::filesystem::path d = [] {
    auto p = kvgate::fuzz::scratch_dir() / "hf";
    std::filesystem::create_directories(p);
    for (const char* f : {"model.safetensors", "tokenizer.json"}) kvgate::fuzz::copy_file(fixture() / f, p / f);
    return p;
  }();
  return d;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const auto& d = dir();
  const int which = data[0] % 3;
  for (int i = 0; i < 3; ++i) {
    std::error_code ec;
    std::filesystem::remove(d / kFiles[i], ec);
    if (i != which && std::filesystem::exists(fixture() / kFiles[i])) kvgate::fuzz::copy_file(fixture() / kFiles[i], d / kFiles[i]);
  }
  kvgate::fuzz::write_file(d / kFiles[which], data + 1, size - 1);
  try {
    const kvgate::Model m = kvgate::load_hf(d.string());
    (void)m;
  } catch (const std::exception&) {
  }
  return 0;
}
