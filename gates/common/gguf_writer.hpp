// A byte-level GGUF writer for the gates that build GGUF files by hand (v2/v3 header, metadata
// keys, tensor infos, the data section padded to an alignment).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvgate::gates {

struct SynthTensor {
  std::string name;
  std::vector<std::uint64_t> ne;
  std::uint32_t type;             // 0 F32, 1 F16, 8 Q8_0, 2 Q4_0
  std::vector<std::uint8_t> data;
  std::vector<float> expect;      // what the loader must produce
};

struct GgufWriter {
  std::vector<std::uint8_t> b;
  template <class T>
  void pod(T v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
  }
  void str(const std::string& s) {
    pod<std::uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void kv_str(const std::string& k, const std::string& v) { str(k), pod<std::uint32_t>(8), str(v); }
  void kv_u32(const std::string& k, std::uint32_t v) { str(k), pod<std::uint32_t>(4), pod(v); }
  void kv_f32(const std::string& k, float v) { str(k), pod<std::uint32_t>(6), pod(v); }
  void kv_bool(const std::string& k, bool v) { str(k), pod<std::uint32_t>(7), pod<std::uint8_t>(v ? 1 : 0); }
  // A scalar of any GGUF value type (0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 10 u64, 11 i64, 12 f64).
  template <class T>
  void kv_typed(const std::string& k, std::uint32_t type, T v) {
    str(k), pod(type), pod(v);
  }
  void kv_strs(const std::string& k, const std::vector<std::string>& v) {
    str(k), pod<std::uint32_t>(9), pod<std::uint32_t>(8), pod<std::uint64_t>(v.size());
    for (const auto& s : v) str(s);
  }
  void kv_i32s(const std::string& k, const std::vector<std::int32_t>& v) {
    str(k), pod<std::uint32_t>(9), pod<std::uint32_t>(5), pod<std::uint64_t>(v.size());
    for (auto x : v) pod(x);
  }
  void kv_f32s(const std::string& k, const std::vector<float>& v) {
    str(k), pod<std::uint32_t>(9), pod<std::uint32_t>(6), pod<std::uint64_t>(v.size());
    for (auto x : v) pod(x);
  }
  void kv_f64s(const std::string& k, const std::vector<double>& v) {
    str(k), pod<std::uint32_t>(9), pod<std::uint32_t>(12), pod<std::uint64_t>(v.size());
    for (auto x : v) pod(x);
  }
  void pad(std::size_t a) { b.resize((b.size() + a - 1) / a * a, 0); }
  // Magic, version and the two counts.
  void header(std::uint32_t version, std::uint64_t n_tensors, std::uint64_t n_kv) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    pod(version);
    pod(n_tensors);
    pod(n_kv);
  }
  // The seven llama.* shape keys (7 of the KV count).
  void llama_shape(std::uint32_t dim, std::uint32_t ffn, std::uint32_t layers, std::uint32_t heads, std::uint32_t kv_heads,
                   std::uint32_t context, float freq_base) {
    kv_u32("llama.embedding_length", dim);
    kv_u32("llama.feed_forward_length", ffn);
    kv_u32("llama.block_count", layers);
    kv_u32("llama.attention.head_count", heads);
    kv_u32("llama.attention.head_count_kv", kv_heads);
    kv_u32("llama.context_length", context);
    kv_f32("llama.rope.freq_base", freq_base);
  }
  // The tensor infos, then the data, each tensor padded to `align`.
  void tensors(const std::vector<SynthTensor>& ts, std::size_t align) {
    std::uint64_t off = 0;
    for (const auto& t : ts) {
      str(t.name);
      pod<std::uint32_t>(static_cast<std::uint32_t>(t.ne.size()));
      for (auto e : t.ne) pod(e);
      pod(t.type);
      pod(off);
      off += (t.data.size() + align - 1) / align * align;
    }
    pad(align);
    for (const auto& t : ts) {
      b.insert(b.end(), t.data.begin(), t.data.end());
      pad(align);
    }
  }
};

}  // namespace kvgate::gates
