// Test directories for the resolution and loader gates: written by the test itself (synth, or by
// hand), in a fresh temporary folder that is removed afterwards.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvgate/model.hpp"
#include "kvgate/synth.hpp"
#include "scratch_dir.hpp"

namespace kvgate::gates {

// The message of the ModelError f() throws ("<no ModelError>" when it throws none).
template <class F>
std::string model_error(F&& f) {
  try {
    f();
  } catch (const ModelError& e) {
    return e.what();
  }
  return "<no ModelError>";
}
inline bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

class TempDir {  // a fresh temp folder removed afterwards (gates/common/scratch_dir.hpp)
 public:
  const std::filesystem::path& path() const { return dir_.path(); }
  std::string sub(const std::string& name) const { return dir_.sub(name); }

 private:
  ScratchDir dir_{"kvgate_resolve"};
};

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + p.string());
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

inline nlohmann::json read_json_file(const std::filesystem::path& p) { return nlohmann::json::parse(read_bytes(p)); }
inline void write_json_file(const std::filesystem::path& p, const nlohmann::json& j) { write_bytes(p, j.dump(2)); }

// A tiny synth model: 2 layers, hidden 32, 2 query heads, 2 KV heads of 16 (token row 32).
inline SynthOptions tiny_options(const std::string& out, std::uint64_t seed = 7) {
  SynthOptions o;
  o.arch = "llama";
  o.layers = 2;
  o.hidden = 32;
  o.ffn = 48;
  o.heads = 2;
  o.kv_heads = 2;
  o.head_dim = 16;
  o.vocab = 300;
  o.seed = seed;
  o.max_seq_len = 128;
  o.out = out;
  return o;
}

// safetensors split into its header (JSON) and data section, and joined back.
struct StFile {
  nlohmann::json header;
  std::string data;
};
inline StFile read_st(const std::filesystem::path& p) {
  const std::string b = read_bytes(p);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(b[static_cast<std::size_t>(i)]);
  StFile f;
  f.header = nlohmann::json::parse(b.substr(8, n));
  f.data = b.substr(8 + n);
  return f;
}
inline void write_st(const std::filesystem::path& p, const StFile& f) {
  const std::string h = f.header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xFF);
  write_bytes(p, out + h + f.data);
}

}  // namespace kvgate::gates
