// libFuzzer harness: the safetensors reader of the Hugging Face loader. The first byte picks what the
// rest of the input is: even -> model.safetensors (header + data) of a fixed config.json; odd ->
// model.safetensors.index.json next to the fixture's weights renamed to one shard.
#include <exception>

#include "fuzz_common.hpp"
#include "kvgate/loaders.hpp"

namespace {
const std::filesystem::path& dir() {
  static const std::filesystem::path d = [] {
    auto p = kvgate::fuzz::scratch_dir() / "hf";
    std::filesystem::create_directories(p);
    const auto fx = kvgate::fuzz::source_file("fuzz/fixtures/hf_tiny");
    for (const char* f : {"config.json", "tokenizer.json"}) kvgate::fuzz::copy_file(fx / f, p / f);
    kvgate::fuzz::copy_file(fx / "model.safetensors", p / "model-00001-of-00001.safetensors");
    return p;
  }();
  return d;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const auto& d = dir();
  std::error_code ec;
  std::filesystem::remove(d / "model.safetensors", ec);
  std::filesystem::remove(d / "model.safetensors.index.json", ec);
  kvgate::fuzz::write_file(d / ((data[0] & 1) ? "model.safetensors.index.json" : "model.safetensors"), data + 1,
                           size - 1);
  try {
    const kvgate::Model m = kvgate::load_hf(d.string());
    (void)m;
  } catch (const std::exception&) {
  }
  return 0;
}
