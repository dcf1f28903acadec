// Test directories for the resolution and loader gates: written by the test itself (synth, or by
// hand), in a fresh temporary folder that is removed afterwards.
#pragma once
#include <algorithm>
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
// Writes the file as it is, header offsets and all (the robustness gates damage them on purpose).
inline void write_st_raw(const std::filesystem::path& p, const StFile& f) {
  const std::string h = f.header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xFF);
  write_bytes(p, out + h + f.data);
}

// Rebuilds the data section so the tensors tile it exactly, as the safetensors library writes it
// (the loader refuses overlaps and holes): every tensor's bytes copied once, widest dtype first, then
// in the order of their old offsets. Fixtures that alias one tensor's bytes under a second name, erase
// a tensor or append a new one's bytes at the end get a file a real writer could have made.
inline void pack_st(StFile& f) {
  auto width = [](const std::string& dt) { return dt == "F64" || dt == "I64" ? 8 : dt == "F32" || dt == "I32" ? 4 : dt == "F16" || dt == "BF16" || dt == "I16" ? 2 : 1; };
  std::vector<std::string> names;
  for (auto it = f.header.begin(); it != f.header.end(); ++it)
    if (it.key() != "__metadata__") names.push_back(it.key());
  std::stable_sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
    const int wa = width(f.header[a]["dtype"].get<std::string>()), wb = width(f.header[b]["dtype"].get<std::string>());
    if (wa != wb) return wa > wb;
    return f.header[a]["data_offsets"][0].get<std::uint64_t>() < f.header[b]["data_offsets"][0].get<std::uint64_t>();
  });
  std::string data;
  for (const std::string& n : names) {
    nlohmann::json& e = f.header[n];
    const auto b = e["data_offsets"][0].get<std::uint64_t>(), end = e["data_offsets"][1].get<std::uint64_t>();
    const std::uint64_t at = data.size();
    data += f.data.substr(b, end - b);
    e["data_offsets"] = {at, at + (end - b)};
  }
  f.data = std::move(data);
}

// Writes a valid file: the data section packed (pack_st) first.
inline void write_st(const std::filesystem::path& p, StFile f) {
  pack_st(f);
  write_st_raw(p, f);
}

}  // namespace kvgate::gates
