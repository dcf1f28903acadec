// Hugging Face directories: config.json + model.safetensors (or model.safetensors.index.json with
// shards) + tokenizer.json. Llama, Mistral, Qwen2 (qkv bias), Qwen3 (QK-norm), Gemma 2/3, Phi-3, and
// the mixture-of-experts Qwen3-MoE and Mixtral (read_moe_config / load_moe_layer).
//
// HF checkpoints keep q/k in the layout of transformers' rotate_half RoPE, so the model is loaded
// as-is with RopeStyle::half (no permutation).
//
// The KV declaration is read in this order (field notes 002/004): config.json
// quantization_config.kv_cache_quant_algo first, then the legacy hf_quant_config.json
// quantization.kv_cache_quant_algo; the loader only records it (ModelConfig::declared_kv and its
// source). resolve_kv decides; an unknown value is kept verbatim so the resolver can refuse it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <type_traits>

#include "kvgate/json_limits.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/memory_info.hpp"
#include "kvgate/kv_store.hpp"
#include "kvgate/numeric.hpp"
#include "kvgate/tokenizer_bpe.hpp"
#include "rope_json.hpp"
#include "kvgate/tokenizer_json.hpp"

namespace kvgate {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- safetensors -----------------------------------------------------------------------------------

struct StTensor {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // relative to the data section
};

int st_dtype_size(const std::string& d) {
  static const std::map<std::string, int> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},     {"BF16", 2},    {"I64", 8},     {"I32", 4},      {"I16", 2},
      {"I8", 1},  {"U8", 1},  {"U16", 2},     {"U32", 4},     {"U64", 8},     {"BOOL", 1},     {"F8_E4M3", 1},
      {"F8_E5M2", 1}, {"F8_E4M3FNUZ", 1}, {"F8_E5M2FNUZ", 1}, {"F8_E8M0", 1}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;  // the safetensors reference refuses > 100 MB

class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::string path) : path_(std::move(path)) {
    h_.fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (h_.fd < 0) throw ModelError("'" + path_ + "': cannot open (" + std::strerror(errno) + ")");
    struct stat st {};
    if (::fstat(h_.fd, &st) != 0) fail("cannot stat the file");
    h_.size = static_cast<std::uint64_t>(st.st_size);
    if (h_.size < 8)
      fail("truncated: " + std::to_string(h_.size) + " bytes, shorter than the 8-byte header length field");
    void* p = ::mmap(nullptr, h_.size, PROT_READ, MAP_PRIVATE, h_.fd, 0);
    if (p == MAP_FAILED) fail(std::string("cannot map the file (") + std::strerror(errno) + ")");
    h_.base = static_cast<const std::uint8_t*>(p);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | h_.base[i];
    if (n == 0 || n > kMaxHeaderBytes)
      fail("header length field = " + std::to_string(n) + " is absurd (must be 1.." + std::to_string(kMaxHeaderBytes) +
           " bytes); not a safetensors file, or a corrupted one");
    if (n > h_.size - 8)
      fail("truncated: header length field = " + std::to_string(n) + " but only " + std::to_string(h_.size - 8) +
           " bytes follow it");
    data_off_ = 8 + n;
    data_size_ = h_.size - data_off_;
    json h;
    try {
      h = limits::parse_json(std::string_view(reinterpret_cast<const char*>(h_.base) + 8, n), path_);
    } catch (const json::exception& e) {
      fail(std::string("header is not valid JSON (") + e.what() + ")");
    }
    if (!h.is_object()) fail("header is not a JSON object");
    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string& name = it.key();
      if (name == "__metadata__") continue;
      const json& v = it.value();
      const std::string where = "tensor '" + name + "'";
      if (!v.is_object()) fail(where + ": header entry is not an object");
      if (!v.contains("dtype") || !v["dtype"].is_string()) fail(where + ": field 'dtype' is missing or not a string");
      StTensor t;
      t.dtype = v["dtype"].get<std::string>();
      const int es = st_dtype_size(t.dtype);
      if (es == 0) fail(where + ": field 'dtype' = \"" + t.dtype + "\" is not a safetensors dtype");
      if (!v.contains("shape") || !v["shape"].is_array()) fail(where + ": field 'shape' is missing or not an array");
      std::uint64_t numel = 1;
      for (const auto& d : v["shape"]) {
        if (!d.is_number_integer() || d.get<std::int64_t>() < 0) fail(where + ": field 'shape' has a non-integer or negative dimension");
        const auto dim = static_cast<std::uint64_t>(d.get<std::int64_t>());
        if (dim != 0 && numel > (std::numeric_limits<std::uint64_t>::max() / 16) / dim)
          fail(where + ": field 'shape' is absurdly large (element count overflows)");
        numel *= dim;
        t.shape.push_back(static_cast<std::int64_t>(dim));
      }
      if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2 ||
          !v["data_offsets"][0].is_number_unsigned() || !v["data_offsets"][1].is_number_unsigned())
        fail(where + ": field 'data_offsets' must be two non-negative integers");
      t.begin = v["data_offsets"][0].get<std::uint64_t>();
      t.end = v["data_offsets"][1].get<std::uint64_t>();
      if (t.end < t.begin)
        fail(where + ": field 'data_offsets' = [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
             "] ends before it begins");
      if (t.end > data_size_)
        fail(where + ": field 'data_offsets' = [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
             "] runs past the end of the data section (" + std::to_string(data_size_) +
             " bytes; file truncated or header corrupted)");
      if (t.end - t.begin != numel * static_cast<std::uint64_t>(es))
        fail(where + ": field 'data_offsets' spans " + std::to_string(t.end - t.begin) + " bytes but dtype " +
             t.dtype + " x shape " + shape_str(t.shape) + " needs " + std::to_string(numel * es));
      if (t.begin % static_cast<std::uint64_t>(es) != 0)
        fail(where + ": field 'data_offsets' begins at byte " + std::to_string(t.begin) +
             ", not a multiple of the " + std::to_string(es) + "-byte dtype " + t.dtype + " (misaligned tensor)");
      tensors_.emplace(name, std::move(t));
    }
    check_tiling();
  }
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const StTensor* find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  const std::uint8_t* bytes(const StTensor& t) const { return h_.base + data_off_ + t.begin; }
  const std::map<std::string, StTensor>& tensors() const { return tensors_; }

  static std::string shape_str(const std::vector<std::int64_t>& s) {
    std::string r = "[";
    for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw ModelError("'" + path_ + "': " + what); }

  // The tensors tile the data section exactly, as the safetensors reference's metadata validation
  // requires: in offset order each begins where the previous one ends (no overlap, no hole) and the
  // last ends at the end of the file. Two tensors sharing bytes, or bytes no tensor owns, mean a file
  // this loader would read wrong or a header that was edited by hand.
  void check_tiling() const {
    std::vector<std::pair<const std::string*, const StTensor*>> by_offset;
    for (const auto& [name, t] : tensors_) by_offset.emplace_back(&name, &t);
    std::stable_sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
      return a.second->begin != b.second->begin ? a.second->begin < b.second->begin : a.second->end < b.second->end;
    });
    std::uint64_t at = 0;
    const std::string* prev = nullptr;
    for (const auto& [name, t] : by_offset) {
      const std::string range = "[" + std::to_string(t->begin) + ", " + std::to_string(t->end) + "]";
      if (t->begin < at)
        fail("tensor '" + *name + "': field 'data_offsets' = " + range + " overlaps tensor '" + *prev +
             "' (which ends at byte " + std::to_string(at) + "); each byte of the data section belongs to one "
             "tensor: re-save the checkpoint with the safetensors library");
      if (t->begin > at)
        fail("tensor '" + *name + "': field 'data_offsets' = " + range + " leaves a hole of " +
             std::to_string(t->begin - at) + " bytes after " + (prev ? "tensor '" + *prev + "'" : std::string("the header")) +
             " (no tensor owns bytes " + std::to_string(at) + ".." + std::to_string(t->begin) +
             "); re-save the checkpoint with the safetensors library");
      at = t->end;
      prev = name;
    }
    if (at != data_size_)
      fail("the data section holds " + std::to_string(data_size_) + " bytes but the tensors end at byte " +
           std::to_string(at) + " (a hole of " + std::to_string(data_size_ - at) +
           " trailing bytes no tensor owns); the file was appended to or its header edited: re-save it");
  }

  std::string path_;
  // The descriptor and the mapping, released by their own destructor, so also when the constructor
  // refuses the file: a throwing constructor runs no destructor of its class, and a refused file
  // must not keep a descriptor (the fuzzer ran out of them after ~70,000 refusals).
  struct Handle {
    int fd = -1;
    const std::uint8_t* base = nullptr;
    std::uint64_t size = 0;
    Handle() = default;
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle() {
      if (base) ::munmap(const_cast<std::uint8_t*>(base), size);
      if (fd >= 0) ::close(fd);
    }
  };
  Handle h_;
  std::uint64_t data_off_ = 0, data_size_ = 0;
  std::map<std::string, StTensor> tensors_;
};

// All tensors of the checkpoint: one file, or the shards an index names.
class TensorSource {
 public:
  explicit TensorSource(const fs::path& dir) {
    const fs::path single = dir / "model.safetensors";
    const fs::path index = dir / "model.safetensors.index.json";
    if (fs::is_regular_file(single)) {
      files_.emplace("model.safetensors", std::make_shared<SafetensorsFile>(single.string()));
      single_ = files_.begin()->second;
      return;
    }
    if (!fs::is_regular_file(index))
      throw ModelError("'" + dir.string() + "': no model.safetensors and no model.safetensors.index.json");
    index_path_ = index.string();
    json j;
    {
      std::ifstream in(index, std::ios::binary);
      try {
        j = limits::parse_json(in, index_path_);
      } catch (const json::exception& e) {
        throw ModelError("'" + index_path_ + "': not valid JSON (" + e.what() + ")");
      }
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw ModelError("'" + index_path_ + "': field 'weight_map' is missing or not an object");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw ModelError("'" + index_path_ + "': weight_map[\"" + it.key() + "\"] is not a file name");
      const std::string shard = it.value().get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard.find('\\') != std::string::npos ||
          shard == "." || shard == "..")
        throw ModelError("'" + index_path_ + "': weight_map[\"" + it.key() + "\"] = \"" + shard +
                         "\" is not a plain file name in the model directory");
      weight_map_[it.key()] = shard;
    }
    dir_ = dir;
  }

  struct Found {
    std::shared_ptr<const SafetensorsFile> file;  // shared: a weight kept as stored maps into it
    const StTensor* t;
  };

  // Every tensor of every file (the shards the index names are opened).
  template <class F>
  void for_each_tensor(F&& f) {
    if (single_) {
      for (const auto& [name, t] : single_->tensors()) f(name, t);
      return;
    }
    std::set<std::string> shards;
    for (const auto& [name, file] : weight_map_) shards.insert(file);
    for (const std::string& sh : shards)
      for (const auto& [name, t] : shard(sh)->tensors()) f(name, t);
  }

  // nullptr file when the tensor is absent (`where` is filled with the place it was looked for).
  std::optional<Found> find(const std::string& name, std::string* where) {
    if (single_) {
      *where = single_->path();
      if (const StTensor* t = single_->find(name)) return Found{single_, t};
      return std::nullopt;
    }
    auto it = weight_map_.find(name);
    if (it == weight_map_.end()) {
      *where = index_path_ + " (weight_map)";
      return std::nullopt;
    }
    std::shared_ptr<const SafetensorsFile> f = shard(it->second);
    *where = f->path();
    if (const StTensor* t = f->find(name)) return Found{f, t};
    *where = f->path() + " (which " + index_path_ + " names for it)";
    return std::nullopt;
  }

 private:
  std::shared_ptr<const SafetensorsFile> shard(const std::string& name) {
    auto it = files_.find(name);
    if (it != files_.end()) return it->second;
    const fs::path p = dir_ / name;
    if (!fs::is_regular_file(p))
      throw ModelError("'" + index_path_ + "': weight_map names shard \"" + name + "\", which does not exist in " +
                       dir_.string());
    return files_.emplace(name, std::make_shared<SafetensorsFile>(p.string())).first->second;
  }

  fs::path dir_;
  std::string index_path_;
  std::shared_ptr<const SafetensorsFile> single_;
  std::map<std::string, std::string> weight_map_;
  std::map<std::string, std::shared_ptr<const SafetensorsFile>> files_;
};

void to_f32(const SafetensorsFile& f, const std::string& name, const StTensor& t, std::vector<float>* out) {
  std::uint64_t numel = 1;
  for (auto d : t.shape) numel *= static_cast<std::uint64_t>(d);
  out->resize(static_cast<std::size_t>(numel));
  const std::uint8_t* p = f.bytes(t);
  float* o = out->data();
  if (t.dtype == "F32") {
    std::memcpy(o, p, numel * 4);
  } else if (t.dtype == "F16" || t.dtype == "BF16") {
    half_to_f32_bulk(p, t.dtype == "BF16", o, static_cast<std::size_t>(numel));
  } else {
    throw ModelError("'" + f.path() + "': tensor '" + name + "' field 'dtype' = " + t.dtype +
                     " is not supported for weights (kvgate reads F32, F16 and BF16)");
  }
}

// A weight matrix: BF16 / F16 kept as stored (read in place from the mapping, which the weight keeps
// alive) unless FP32 was asked for; F32 (and a 16-bit tensor at an odd byte address, which a reader
// of uint16 elements cannot take in place) is copied into FP32 the model owns.
void load_weight(const TensorSource::Found& f, const std::string& name, WeightStorage storage, Weight* out) {
  const StTensor& t = *f.t;
  const bool half = t.dtype == "BF16" || t.dtype == "F16";
  const std::uint8_t* p = f.file->bytes(t);
  if (storage == WeightStorage::as_stored && half && reinterpret_cast<std::uintptr_t>(p) % 2 == 0) {
    std::uint64_t numel = 1;
    for (auto d : t.shape) numel *= static_cast<std::uint64_t>(d);
    *out = Weight::half_view(t.dtype == "BF16" ? WeightDtype::bf16 : WeightDtype::f16,
                             reinterpret_cast<const std::uint16_t*>(p), static_cast<std::size_t>(numel), f.file);
    return;
  }
  std::vector<float> v;
  to_f32(*f.file, name, t, &v);
  *out = std::move(v);
}

// Whether a tensor becomes a Weight kept in the mapping (as stored): a 16-bit matrix (2-D) other than
// what the model holds in FP32 whatever the storage (MoE routers and experts, MLA's low-rank
// projections). Norms, biases and scales (1-D) are converted.
bool kept_as_stored(const std::string& name, const StTensor& t) {
  if ((t.dtype != "BF16" && t.dtype != "F16") || t.shape.size() != 2) return false;
  for (const char* f32_only : {".experts.", "mlp.gate.weight", "q_a_proj", "kv_a_proj_with_mqa", "kv_b_proj"})
    if (name.find(f32_only) != std::string::npos) return false;
  return true;
}

// The memory the weights will hold, before any is read: 16-bit matrices kept as stored stay in the
// mapped files (page cache: 2 bytes an element); every other tensor, and every 16-bit one with
// --weights f32, takes 4 bytes an element the model owns (FP32). More than the machine has
// available is refused with both figures, instead of a load the kernel kills half-way.
void check_weights_fit(TensorSource& src, const std::string& dir, WeightStorage storage) {
  std::uint64_t mapped = 0, owned = 0;
  src.for_each_tensor([&](const std::string& name, const StTensor& t) {
    std::uint64_t numel = 1;
    for (auto d : t.shape) numel *= static_cast<std::uint64_t>(d);
    if (storage == WeightStorage::as_stored && kept_as_stored(name, t)) mapped += 2 * numel;
    else owned += 4 * numel;
  });
  const MemoryAvailable avail = host_memory_available();
  if (mapped + owned > avail.bytes)
    throw ModelError("'" + dir + "': the weights need " + format_bytes_exact(mapped + owned) + " of memory (" +
                     format_bytes_exact(mapped) + " kept as stored in the mapped files, " + format_bytes_exact(owned) +
                     " converted to FP32) but " + format_bytes_exact(avail.bytes) + " is available (" + avail.source +
                     "); use a machine with more memory" +
                     (storage == WeightStorage::f32 ? ", or keep 16-bit weights as stored (drop --weights f32)"
                                                    : "") +
                     ", or free memory");
}

// ---- config.json -------------------------------------------------------------------------------------

json read_json(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw ModelError("'" + p.string() + "': cannot open");
  try {
    return limits::parse_json(in, p.string());
  } catch (const json::exception& e) {
    throw ModelError("'" + p.string() + "': not valid JSON (" + e.what() + ")");
  }
}

struct Cfg {
  const json& j;
  std::string path;

  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  [[noreturn]] void bad(const char* k, const std::string& why) const {
    throw ModelError("'" + path + "': field '" + k + "' " + why);
  }
  int int_req(const char* k, long long lo, long long hi) const {
    if (!has(k)) bad(k, "is missing");
    return int_checked(k, lo, hi);
  }
  int int_opt(const char* k, int def, long long lo, long long hi) const { return has(k) ? int_checked(k, lo, hi) : def; }
  int int_checked(const char* k, long long lo, long long hi) const {
    if (!j[k].is_number_integer()) bad(k, "is not an integer");
    const long long v = j[k].get<long long>();
    if (v < lo || v > hi)
      bad(k, "= " + std::to_string(v) + " is outside the plausible range [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "]");
    return static_cast<int>(v);
  }
  double num_opt(const char* k, double def) const {
    if (!has(k)) return def;
    if (!j[k].is_number()) bad(k, "is not a number");
    const double v = j[k].get<double>();
    if (!std::isfinite(v) || v <= 0) bad(k, "must be a positive finite number");
    return v;
  }
  bool bool_opt(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!j[k].is_boolean()) bad(k, "is not a boolean");
    return j[k].get<bool>();
  }
  // bos/eos: an integer, a list (first element taken) or null.
  int token_id(const char* k, int def) const {
    if (!has(k)) return def;
    const json& v = j[k];
    if (v.is_number_integer()) return v.get<int>();
    if (v.is_array() && !v.empty() &&
        std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_number_integer(); }))
      return v[0].get<int>();
    std::string shown = v.dump();
    if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
    bad(k, "= " + shown + " is neither an integer nor a non-empty list of integers");
  }
};

std::string normalize_kv_algo(const std::string& s) {
  if (s == "FP8") return "fp8";
  if (s == "INT8") return "int8";
  std::string r = s;
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

// Reads the KV declaration. Returns false when the file does not declare one.
bool kv_decl_from(const json& obj, const char* outer, const std::string& file, std::string* value) {
  if (!obj.contains(outer) || obj[outer].is_null()) return false;
  const json& q = obj[outer];
  if (!q.is_object()) throw ModelError("'" + file + "': field '" + outer + "' is not an object");
  if (!q.contains("kv_cache_quant_algo") || q["kv_cache_quant_algo"].is_null()) return false;
  if (!q["kv_cache_quant_algo"].is_string())
    throw ModelError("'" + file + "': field '" + outer + ".kv_cache_quant_algo' is not a string (or null)");
  const std::string v = q["kv_cache_quant_algo"].get<std::string>();
  if (v.empty()) return false;
  *value = normalize_kv_algo(v);
  return true;
}

std::string layer_name(int i, const char* rest) { return "model.layers." + std::to_string(i) + "." + rest; }

// Per-layer attention windows (0 = full), as transformers decides which layers slide:
//  - `layer_types` (transformers >= 4.53 writes it): "sliding_attention" / "full_attention" per layer;
//  - else Mistral / Phi-3: every layer when sliding_window is set; Qwen2 / Qwen3: layers
//    i >= max_window_layers when use_sliding_window; Gemma 2: even layers ((i + 1) % 2 != 0);
//    Gemma 3: every layer but each sliding_window_pattern-th ((i + 1) % pattern != 0, pattern 6).
// Qwen's sliding_window counts only with use_sliding_window (the config drops it otherwise).
// A window longer than the context is full attention; <= 0 or a non-integer is refused.
std::vector<int> layer_windows(const Cfg& cf, const std::string& arch, int n_layers) {
  const json& j = cf.j;
  const bool qwen = arch == "qwen2" || arch == "qwen3" || arch == "qwen3_moe";
  const bool gemma = arch == "gemma2" || arch == "gemma3";
  const bool declares = arch == "mistral" || arch == "mixtral" || arch == "phi3" || qwen || gemma;
  if (!declares) return {};  // Llama has no sliding window in transformers
  int window = 0;
  if (qwen && !cf.bool_opt("use_sliding_window", false)) {
    window = 0;
  } else if (cf.has("sliding_window")) {
    if (!j["sliding_window"].is_number_integer())
      cf.bad("sliding_window", "= " + j["sliding_window"].dump() +
                                   " is not an integer (the window in tokens; null for full attention)");
    const long long w = j["sliding_window"].get<long long>();
    if (w <= 0)
      cf.bad("sliding_window", "= " + std::to_string(w) +
                                   " must be > 0 (a query sees the window's last keys; null for full attention)");
    window = static_cast<int>(std::min<long long>(w, 1 << 30));
  } else if (gemma) {
    window = 4096;  // Gemma2Config / Gemma3TextConfig default
  }
  std::vector<bool> slides(static_cast<std::size_t>(n_layers), false);
  if (cf.has("layer_types")) {
    const json& lt = j["layer_types"];
    if (!lt.is_array() || lt.size() != static_cast<std::size_t>(n_layers))
      cf.bad("layer_types", "must be a list of num_hidden_layers = " + std::to_string(n_layers) + " strings");
    for (std::size_t l = 0; l < lt.size(); ++l) {
      const std::string t = lt[l].is_string() ? lt[l].get<std::string>() : lt[l].dump();
      if (t == "sliding_attention") slides[l] = true;
      else if (t != "full_attention")
        cf.bad("layer_types", "[" + std::to_string(l) + "] = \"" + t +
                                  "\" is not supported (kvgate runs \"full_attention\" and \"sliding_attention\")");
    }
  } else {
    int pattern = 1;  // every layer
    if (arch == "gemma2") pattern = 2;
    if (arch == "gemma3") pattern = cf.int_opt("sliding_window_pattern", 6, 1, 1 << 20);
    const int first_sliding = qwen ? cf.int_opt("max_window_layers", 28, 0, 1 << 20) : 0;
    for (int l = 0; l < n_layers; ++l)
      slides[static_cast<std::size_t>(l)] = l >= first_sliding && (pattern == 1 || (l + 1) % pattern != 0);
  }
  if (window == 0) return {};
  std::vector<int> out(static_cast<std::size_t>(n_layers), 0);
  bool any = false;
  for (int l = 0; l < n_layers; ++l)
    if (slides[static_cast<std::size_t>(l)]) out[static_cast<std::size_t>(l)] = window, any = true;
  if (!any) return {};
  return out;
}


// ---- mixture of experts --------------------------------------------------------------------------------


// Converts `count` elements of tensor t starting at element `first` to f32 into dst (no staging copy).
void to_f32_into(const SafetensorsFile& f, const std::string& name, const StTensor& t, std::uint64_t first,
                 std::uint64_t count, float* dst) {
  const std::uint8_t* p = f.bytes(t);
  if (t.dtype == "F32") {
    std::memcpy(dst, p + 4 * first, count * 4);
  } else if (t.dtype == "F16" || t.dtype == "BF16") {
    half_to_f32_bulk(p + 2 * first, t.dtype == "BF16", dst, static_cast<std::size_t>(count));
  } else {
    throw ModelError("'" + f.path() + "': tensor '" + name + "' field 'dtype' = " + t.dtype +
                     " is not supported for weights (kvgate reads F32, F16 and BF16)");
  }
}

// The MoE fields of config.json (Qwen3-MoE: num_experts, num_experts_per_tok, moe_intermediate_size,
// norm_topk_prob, decoder_sparse_step, mlp_only_layers; Mixtral: num_local_experts,
// num_experts_per_tok, intermediate_size for every expert, always renormalised), as transformers'
// decoder layers decide which layers are sparse.
void read_moe_config(const Cfg& cf, ModelConfig& c) {
  MoeConfig& m = c.moe;
  const json& j = cf.j;
  m.layer_moe.assign(static_cast<std::size_t>(c.n_layers), 0);
  if (c.arch == "mixtral") {
    m.n_experts = cf.int_opt("num_local_experts", 8, 1, 1 << 16);
    m.top_k = cf.int_opt("num_experts_per_tok", 2, 1, 1 << 16);
    if (m.top_k > m.n_experts)
      cf.bad("num_experts_per_tok", "= " + std::to_string(m.top_k) + " exceeds num_local_experts = " +
                                        std::to_string(m.n_experts) + " (each token picks that many distinct experts)");
    m.expert_dim = c.hidden_dim;  // MixtralConfig: intermediate_size is each expert's width
    m.norm_topk = true;           // MixtralTopKRouter always divides the top-k by their sum
    std::fill(m.layer_moe.begin(), m.layer_moe.end(), 1);
    return;
  }
  // qwen3_moe
  // transformers 5 writes the count as num_local_experts (Qwen3MoeConfig's attribute_map); hub
  // configs as num_experts. Both present and different is refused.
  if (cf.has("num_experts") && cf.has("num_local_experts") &&
      cf.int_checked("num_experts", 0, 1 << 16) != cf.int_checked("num_local_experts", 0, 1 << 16))
    cf.bad("num_local_experts", "= " + j["num_local_experts"].dump() + " disagrees with num_experts = " +
                                    j["num_experts"].dump() + " (the same count under two names); keep one");
  m.n_experts = cf.has("num_experts") ? cf.int_checked("num_experts", 0, 1 << 16)
                                      : cf.int_opt("num_local_experts", 128, 0, 1 << 16);
  m.top_k = cf.int_opt("num_experts_per_tok", 8, 1, 1 << 16);
  m.expert_dim = cf.int_opt("moe_intermediate_size", 768, 1, 1 << 20);
  m.norm_topk = cf.bool_opt("norm_topk_prob", false);
  const int step = cf.int_opt("decoder_sparse_step", 1, 1, 1 << 20);
  if (m.n_experts > 0 && m.top_k > m.n_experts)
    cf.bad("num_experts_per_tok", "= " + std::to_string(m.top_k) + " exceeds num_experts = " +
                                      std::to_string(m.n_experts) + " (each token picks that many distinct experts)");
  std::vector<bool> dense_only(static_cast<std::size_t>(c.n_layers), false);
  if (cf.has("mlp_only_layers")) {
    if (!j["mlp_only_layers"].is_array()) cf.bad("mlp_only_layers", "is not a list of layer indices");
    for (const auto& v : j["mlp_only_layers"]) {
      if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() >= c.n_layers)
        cf.bad("mlp_only_layers", "holds " + v.dump() + ", not a layer index in [0, num_hidden_layers = " +
                                      std::to_string(c.n_layers) + ")");
      dense_only[static_cast<std::size_t>(v.get<long long>())] = true;
    }
  }
  // Qwen3MoeDecoderLayer: sparse when not in mlp_only_layers and (layer_idx + 1) % decoder_sparse_step == 0.
  for (int l = 0; l < c.n_layers; ++l)
    m.layer_moe[static_cast<std::size_t>(l)] =
        !dense_only[static_cast<std::size_t>(l)] && m.n_experts > 0 && (l + 1) % step == 0;
}

// One MoE layer's router and experts. Accepted layouts, looked up in this order:
//  - fused (transformers 5 in-memory names): {p}.experts.gate_up_proj [E, 2 I, H] (gate rows first)
//    and {p}.experts.down_proj [E, H, I];
//  - per expert (hub checkpoints): {p}.experts.{e}.gate_proj / up_proj / down_proj.weight (Qwen3-MoE,
//    transformers-5 Mixtral) or {p}.experts.{e}.w1 / w3 / w2.weight (hub Mixtral);
// with p = model.layers.{i}.mlp, or model.layers.{i}.block_sparse_moe (hub Mixtral). The router is
// {p}.gate.weight [E, H]. An expert count that disagrees with config.json is refused naming the
// tensor and the field.
void load_moe_layer(TensorSource& src, const std::string& cfg_path, const std::string& arch_label,
                    const char* count_field, const ModelConfig& c, int layer, LayerWeights& L) {  // NOLINT
  const MoeConfig& m = c.moe;
  const std::int64_t E = m.n_experts, I = m.expert_dim, H = c.dim;
  const char* width_field = c.arch == "mixtral" ? "intermediate_size" : "moe_intermediate_size";
  if (c.arch == "deepseek_v3") count_field = "n_routed_experts";
  std::string where;
  std::string prefix;
  for (const char* p : {"mlp", "block_sparse_moe"}) {
    const std::string cand = layer_name(layer, p);
    if (src.find(cand + ".gate.weight", &where)) {
      prefix = cand;
      break;
    }
  }
  if (prefix.empty()) {
    src.find(layer_name(layer, "mlp.gate.weight"), &where);
    throw ModelError("'" + where + "': missing tensor '" + layer_name(layer, "mlp.gate.weight") +
                     "' (or block_sparse_moe.gate.weight): the router of MoE layer " + std::to_string(layer) + " (" +
                     arch_label + "; config.json '" + cfg_path + "' makes this layer sparse through " + count_field +
                     (c.arch == "mixtral" ? "" : ", decoder_sparse_step and mlp_only_layers") + ")");
  }
  auto shape_err = [&](const SafetensorsFile& f, const std::string& name, const StTensor& t,
                       const std::vector<std::int64_t>& want, const std::string& fix) {
    throw ModelError("'" + f.path() + "': tensor '" + name + "' field 'shape' = " + SafetensorsFile::shape_str(t.shape) +
                     ", but config.json implies " + SafetensorsFile::shape_str(want) + "; " + fix);
  };
  const std::string count_fix = std::string("fix config.json '") + cfg_path + "' field '" + count_field +
                                "' (= " + std::to_string(E) + ") to the checkpoint's expert count, or re-export it";
  {
    const std::string name = prefix + ".gate.weight";
    auto f = src.find(name, &where);
    if (f->t->shape.size() == 2 && f->t->shape[1] == H && f->t->shape[0] != E)
      shape_err(*f->file, name, *f->t, {E, H}, "the router scores " + std::to_string(f->t->shape[0]) +
                                                   " experts; " + count_fix);
    if (f->t->shape != std::vector<std::int64_t>{E, H})
      shape_err(*f->file, name, *f->t, {E, H}, "fix config.json hidden_size / " + std::string(count_field));
    to_f32(*f->file, name, *f->t, &L.router);
  }
  const std::size_t blk = static_cast<std::size_t>(I * H);
  L.ew1.assign(static_cast<std::size_t>(E) * blk, 0.0f);
  L.ew3.assign(static_cast<std::size_t>(E) * blk, 0.0f);
  L.ew2.assign(static_cast<std::size_t>(E) * blk, 0.0f);
  const std::string fused_gu = prefix + ".experts.gate_up_proj", fused_dn = prefix + ".experts.down_proj";
  if (auto gu = src.find(fused_gu, &where)) {
    auto dn = src.find(fused_dn, &where);
    if (!dn)
      throw ModelError("'" + where + "': missing tensor '" + fused_dn + "' (" + fused_gu +
                       " is fused, so the down projections must be too: [" + std::to_string(E) + ", " +
                       std::to_string(H) + ", " + std::to_string(I) + "])");
    for (const auto& [name, f, want] :
         {std::tuple<std::string, TensorSource::Found, std::vector<std::int64_t>>{fused_gu, *gu, {E, 2 * I, H}},
          std::tuple<std::string, TensorSource::Found, std::vector<std::int64_t>>{fused_dn, *dn, {E, H, I}}}) {
      if (f.t->shape.size() == 3 && f.t->shape[0] != E && f.t->shape[1] == want[1] && f.t->shape[2] == want[2])
        shape_err(*f.file, name, *f.t, want,
                  "it stacks " + std::to_string(f.t->shape[0]) + " experts; " + count_fix);
      if (f.t->shape != want)
        shape_err(*f.file, name, *f.t, want,
                  std::string("fix config.json hidden_size / ") + width_field + " (rows [gate | up] per expert)");
    }
    for (std::int64_t e = 0; e < E; ++e) {
      const std::uint64_t base = static_cast<std::uint64_t>(e) * 2 * blk;
      to_f32_into(*gu->file, fused_gu, *gu->t, base, blk, L.ew1.data() + e * blk);
      to_f32_into(*gu->file, fused_gu, *gu->t, base + blk, blk, L.ew3.data() + e * blk);
    }
    to_f32_into(*dn->file, fused_dn, *dn->t, 0, static_cast<std::uint64_t>(E) * blk, L.ew2.data());
    return;
  }
  // Per-expert tensors: which naming, then every expert, then no expert beyond the count.
  const std::string e0 = prefix + ".experts.0.";
  const bool w_names = !src.find(e0 + "gate_proj.weight", &where) && src.find(e0 + "w1.weight", &where);
  const char* gate_n = w_names ? "w1.weight" : "gate_proj.weight";
  const char* up_n = w_names ? "w3.weight" : "up_proj.weight";
  const char* down_n = w_names ? "w2.weight" : "down_proj.weight";
  auto expert = [&](std::int64_t e, const char* leaf) { return prefix + ".experts." + std::to_string(e) + "." + leaf; };
  for (std::int64_t e = 0; e < E; ++e) {
    for (const auto& [leaf, dst, want] :
         {std::tuple<const char*, Weight*, std::vector<std::int64_t>>{gate_n, &L.ew1, {I, H}},
          std::tuple<const char*, Weight*, std::vector<std::int64_t>>{up_n, &L.ew3, {I, H}},
          std::tuple<const char*, Weight*, std::vector<std::int64_t>>{down_n, &L.ew2, {H, I}}}) {
      const std::string name = expert(e, leaf);
      auto f = src.find(name, &where);
      if (!f)
        throw ModelError("'" + where + "': missing tensor '" + name + "' (nor the fused " + fused_gu +
                         "): config.json '" + cfg_path + "' field '" + count_field + "' = " + std::to_string(E) +
                         " needs experts 0.." + std::to_string(E - 1) + "; if the checkpoint has fewer, " + count_fix);
      if (f->t->shape != want)
        shape_err(*f->file, name, *f->t, want, std::string("fix config.json hidden_size / ") + width_field);
      to_f32_into(*f->file, name, *f->t, 0, blk, dst->data() + e * blk);
    }
  }
  const std::string extra = expert(E, gate_n);
  if (src.find(extra, &where))
    throw ModelError("'" + where + "': tensor '" + extra + "' exists, but config.json '" + cfg_path + "' field '" +
                     count_field + "' = " + std::to_string(E) + " (experts 0.." + std::to_string(E - 1) +
                     "): the checkpoint has more experts than the config; " + count_fix);
}


// DeepSeek-V3 (DeepseekV3Config): MLA dimensions, and the V3 router (sigmoid scores, correction
// bias for the choice, n_group / topk_group, routed_scaling_factor), first_k_dense_replace dense
// layers, n_shared_experts shared experts of moe_intermediate_size each. config.json's head_dim is
// the RoPE dimension (transformers sets head_dim = qk_rope_head_dim); the model's head_dim becomes
// qk_nope_head_dim + qk_rope_head_dim, one KV head per query head.
void read_deepseek_config(const Cfg& cf, ModelConfig& c) {
  MlaConfig& a = c.mla;
  a.kv_lora_rank = cf.int_req("kv_lora_rank", 1, 1 << 16);
  a.q_lora_rank = cf.has("q_lora_rank") ? cf.int_checked("q_lora_rank", 1, 1 << 16) : 0;
  a.nope_dim = cf.int_req("qk_nope_head_dim", 1, 1 << 14);
  a.rope_dim = cf.int_req("qk_rope_head_dim", 2, 512);
  a.v_dim = cf.int_req("v_head_dim", 1, 1 << 14);
  if (a.rope_dim % 2 != 0) cf.bad("qk_rope_head_dim", "= " + std::to_string(a.rope_dim) + " is odd; RoPE needs pairs");
  if (c.head_dim != a.rope_dim)
    cf.bad("head_dim", "= " + std::to_string(c.head_dim) + " differs from qk_rope_head_dim = " +
                           std::to_string(a.rope_dim) + " (transformers sets head_dim to the RoPE width); fix one of them");
  if (cf.has("qk_head_dim") && cf.int_checked("qk_head_dim", 1, 1 << 15) != a.nope_dim + a.rope_dim)
    cf.bad("qk_head_dim", "= " + cf.j["qk_head_dim"].dump() + " is not qk_nope_head_dim + qk_rope_head_dim = " +
                              std::to_string(a.nope_dim + a.rope_dim));
  if (a.v_dim > a.nope_dim + a.rope_dim)
    cf.bad("v_head_dim", "= " + std::to_string(a.v_dim) + " is wider than qk_nope_head_dim + qk_rope_head_dim = " +
                             std::to_string(a.nope_dim + a.rope_dim) +
                             " (kvgate stores V zero-padded to the key width)");
  a.rope_interleave = cf.bool_opt("rope_interleave", true);
  c.head_dim = a.nope_dim + a.rope_dim;
  c.n_kv_heads = c.n_heads;  // the expanded cache holds one K/V head per query head
  // Softmax scale: qk_head_dim^-0.5, times mscale^2 when the RoPE is scaled and mscale_all_dim is set.
  double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  if (c.rope.type != RopeType::plain && c.rope.mscale_all_dim > 0 && c.rope.factor > 0) {
    const double m = 0.1 * c.rope.mscale_all_dim * std::log(c.rope.factor) + 1.0;
    scale = scale * m * m;
  }
  c.attn_scale = static_cast<float>(scale);

  MoeConfig& m = c.moe;
  m.router = MoeConfig::Router::sigmoid_groups;
  m.n_experts = cf.int_req("n_routed_experts", 1, 1 << 16);
  m.top_k = cf.int_req("num_experts_per_tok", 1, 1 << 16);
  m.expert_dim = cf.int_req("moe_intermediate_size", 1, 1 << 20);
  m.norm_topk = cf.bool_opt("norm_topk_prob", true);
  m.n_group = cf.int_opt("n_group", 1, 1, 1 << 16);
  m.topk_group = cf.int_opt("topk_group", 1, 1, 1 << 16);
  m.routed_scale = static_cast<float>(cf.num_opt("routed_scaling_factor", 1.0));
  const int n_shared = cf.int_opt("n_shared_experts", 0, 0, 1 << 10);
  m.shared_dim = n_shared * m.expert_dim;
  if (m.n_experts % m.n_group != 0)
    cf.bad("n_group", "= " + std::to_string(m.n_group) + " does not divide n_routed_experts = " +
                          std::to_string(m.n_experts));
  if (m.topk_group > m.n_group)
    cf.bad("topk_group", "= " + std::to_string(m.topk_group) + " exceeds n_group = " + std::to_string(m.n_group));
  if (m.n_experts / m.n_group < 2)
    cf.bad("n_group", "= " + std::to_string(m.n_group) + " leaves fewer than 2 experts per group (a group is scored "
                          "by its two best experts)");
  if (m.top_k > m.topk_group * (m.n_experts / m.n_group))
    cf.bad("num_experts_per_tok", "= " + std::to_string(m.top_k) + " exceeds the experts of topk_group = " +
                                      std::to_string(m.topk_group) + " groups of " +
                                      std::to_string(m.n_experts / m.n_group));
  const int first_dense = cf.int_opt("first_k_dense_replace", 0, 0, 1 << 20);
  m.layer_moe.assign(static_cast<std::size_t>(c.n_layers), 0);
  for (int l = first_dense; l < c.n_layers; ++l) m.layer_moe[static_cast<std::size_t>(l)] = 1;
}

// One MLA layer's projections (self_attn.*): q_proj, or q_a_proj + q_a_layernorm + q_b_proj;
// kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj.
template <class Load>
void load_mla_layer(Load& load, const ModelConfig& c, int i, LayerWeights& L) {
  const MlaConfig& a = c.mla;
  const std::int64_t D = c.dim, H = c.n_heads, QK = a.nope_dim + a.rope_dim;
  if (a.q_lora_rank > 0) {
    load(layer_name(i, "self_attn.q_a_proj.weight"), {a.q_lora_rank, D}, &L.wq_a);
    load(layer_name(i, "self_attn.q_a_layernorm.weight"), {a.q_lora_rank}, &L.q_a_norm);
    load(layer_name(i, "self_attn.q_b_proj.weight"), {H * QK, a.q_lora_rank}, &L.wq);
  } else {
    load(layer_name(i, "self_attn.q_proj.weight"), {H * QK, D}, &L.wq);
  }
  load(layer_name(i, "self_attn.kv_a_proj_with_mqa.weight"), {a.kv_lora_rank + a.rope_dim, D}, &L.wkv_a);
  load(layer_name(i, "self_attn.kv_a_layernorm.weight"), {a.kv_lora_rank}, &L.kv_a_norm);
  load(layer_name(i, "self_attn.kv_b_proj.weight"), {H * (a.nope_dim + a.v_dim), a.kv_lora_rank}, &L.wkv_b);
}

// DeepSeek MoE layer extras: the router's correction bias and the shared expert.
template <class Load>
void load_deepseek_moe_extras(Load& load, const ModelConfig& c, int i, LayerWeights& L) {
  const std::int64_t D = c.dim, E = c.moe.n_experts, S = c.moe.shared_dim;
  load(layer_name(i, "mlp.gate.e_score_correction_bias"), {E}, &L.router_bias);
  if (S > 0) {
    load(layer_name(i, "mlp.shared_experts.gate_proj.weight"), {S, D}, &L.sw1);
    load(layer_name(i, "mlp.shared_experts.up_proj.weight"), {S, D}, &L.sw3);
    load(layer_name(i, "mlp.shared_experts.down_proj.weight"), {D, S}, &L.sw2);
  }
}

}  // namespace

Model load_hf(const std::string& dir_str, WeightStorage storage) {
  const fs::path dir(dir_str);
  if (!fs::is_directory(dir)) throw ModelError("'" + dir_str + "': not a directory (a Hugging Face model is a directory)");
  const fs::path cfg_path = dir / "config.json";
  if (!fs::is_regular_file(cfg_path)) throw ModelError("'" + dir_str + "': no config.json in the model directory");
  const json cj = read_json(cfg_path);
  if (!cj.is_object()) throw ModelError("'" + cfg_path.string() + "': not a JSON object");
  const Cfg cf{cj, cfg_path.string()};

  Model m;
  m.path = dir_str;
  m.source_kind = "hf";
  ModelConfig& c = m.config;

  // Architecture.
  std::string arch_name;
  if (cf.has("architectures")) {
    if (!cj["architectures"].is_array() || cj["architectures"].empty() || !cj["architectures"][0].is_string())
      cf.bad("architectures", "is not a non-empty list of names");
    arch_name = cj["architectures"][0].get<std::string>();
  } else if (cf.has("model_type") && cj["model_type"].is_string()) {
    arch_name = cj["model_type"].get<std::string>();
  } else {
    cf.bad("architectures", "is missing (and no model_type)");
  }
  if (arch_name == "LlamaForCausalLM" || arch_name == "llama") {
    c.arch = "llama";
  } else if (arch_name == "MistralForCausalLM" || arch_name == "mistral") {
    c.arch = "mistral";
  } else if (arch_name == "Qwen2ForCausalLM" || arch_name == "qwen2") {
    c.arch = "qwen2";
  } else if (arch_name == "Qwen3ForCausalLM" || arch_name == "qwen3") {
    c.arch = "qwen3";
  } else if (arch_name == "Qwen3MoeForCausalLM" || arch_name == "qwen3_moe") {
    c.arch = "qwen3_moe";
  } else if (arch_name == "MixtralForCausalLM" || arch_name == "mixtral") {
    c.arch = "mixtral";
  } else if (arch_name == "DeepseekV3ForCausalLM" || arch_name == "deepseek_v3") {
    c.arch = "deepseek_v3";
  } else if (arch_name == "Gemma2ForCausalLM" || arch_name == "gemma2") {
    c.arch = "gemma2";
  } else if (arch_name == "Gemma3ForCausalLM" || arch_name == "gemma3_text") {
    c.arch = "gemma3";
  } else if (arch_name == "Phi3ForCausalLM" || arch_name == "phi3") {
    c.arch = "phi3";
  } else if (arch_name == "Gemma3ForConditionalGeneration" || arch_name == "gemma3") {
    cf.bad("architectures", "= \"" + arch_name +
                                "\" is the multimodal Gemma 3 checkpoint (text_config + vision tower, weights under "
                                "model.language_model); kvgate loads the text-only Gemma3ForCausalLM: export the "
                                "language model with transformers (Gemma3ForCausalLM) and load that directory");
  } else {
    cf.bad("architectures", "= \"" + arch_name +
                                "\" is not supported (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                                "Qwen3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, DeepseekV3ForCausalLM, Gemma2ForCausalLM, "
                                "Gemma3ForCausalLM, Phi3ForCausalLM)");
  }
  const bool gemma = c.arch == "gemma2" || c.arch == "gemma3";
  if (gemma) {
    // transformers' Gemma 2/3 MLP reads hidden_activation only (hidden_act is a legacy key it ignores).
    if (cf.has("hidden_activation") &&
        (!cj["hidden_activation"].is_string() || cj["hidden_activation"].get<std::string>() != "gelu_pytorch_tanh"))
      cf.bad("hidden_activation", "must be \"gelu_pytorch_tanh\" (GeGLU with the tanh GELU, the only Gemma "
                                  "activation kvgate implements); got " + cj["hidden_activation"].dump());
    c.ffn_act = FfnAct::gelu_tanh;
    if (cf.bool_opt("use_bidirectional_attention", false))
      cf.bad("use_bidirectional_attention", "is true (an encoder-style Gemma): kvgate runs causal decoders only");
  } else if (cf.has("hidden_act") && (!cj["hidden_act"].is_string() || cj["hidden_act"].get<std::string>() != "silu")) {
    cf.bad("hidden_act", "must be \"silu\" (SwiGLU); got " + cj["hidden_act"].dump());
  }

  c.dim = cf.int_req("hidden_size", 1, 1 << 30);  // structural bounds here; the limits: check_config_limits
  c.hidden_dim = cf.int_req("intermediate_size", 1, 1 << 30);
  c.n_layers = cf.int_req("num_hidden_layers", 1, 1 << 30);
  c.n_heads = cf.int_req("num_attention_heads", 1, 1 << 30);
  c.n_kv_heads = cf.int_opt("num_key_value_heads", c.n_heads, 1, c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0)
    cf.bad("num_key_value_heads", "= " + std::to_string(c.n_kv_heads) + " does not divide num_attention_heads = " +
                                      std::to_string(c.n_heads));
  if (cf.has("head_dim")) {
    c.head_dim = cf.int_checked("head_dim", 2, 1 << 30);
  } else {
    if (c.dim % c.n_heads != 0)
      cf.bad("hidden_size", "= " + std::to_string(c.dim) + " is not a multiple of num_attention_heads = " +
                                std::to_string(c.n_heads) + " (and no head_dim is given)");
    c.head_dim = c.dim / c.n_heads;
  }
  if (c.head_dim % 2 != 0) cf.bad("head_dim", "= " + std::to_string(c.head_dim) + " is odd; RoPE needs pairs");
  c.vocab_size = cf.int_req("vocab_size", 1, 1 << 30);
  c.max_seq_len = cf.int_opt("max_position_embeddings", 2048, 1, 1 << 30);
  c.layer_window = layer_windows(cf, c.arch, c.n_layers);
  c.rms_eps = static_cast<float>(cf.num_opt("rms_norm_eps", 1e-6));
  // RoPE: rope_parameters (transformers 5) or legacy rope_scaling + rope_theta (rope_json.hpp).
  read_hf_rope(cj, cfg_path.string(), c);
  c.rope_style = RopeStyle::half;
  c.qkv_bias = c.arch == "qwen2";
  if (cf.bool_opt("attention_bias", false) && c.arch != "qwen2")
    cf.bad("attention_bias", "is true: biases on q/k/v/o projections are supported for Qwen2 (q/k/v) only");
  c.qk_norm = c.arch == "qwen3" || c.arch == "qwen3_moe" || c.arch == "gemma3";
  if (c.arch == "qwen3_moe" || c.arch == "mixtral") read_moe_config(cf, c);
  if (c.arch == "deepseek_v3") read_deepseek_config(cf, c);
  // transformers writes tie_word_embeddings only where it differs from PretrainedConfig's default
  // (true): Gemma checkpoints, tied, usually omit it.
  c.tied_embeddings = cf.bool_opt("tie_word_embeddings", gemma);
  if (gemma) {
    c.post_norms = true;
    // query_pre_attn_scalar: the softmax scale is its inverse square root (not head_dim's).
    c.attn_scale = static_cast<float>(1.0 / std::sqrt(cf.num_opt("query_pre_attn_scalar", 256.0)));
    // Soft-caps: null (or absent) = none. Gemma 2's defaults are 50 / 30, Gemma 3's none; every
    // transformers-written config spells them out.
    const double def_attn = c.arch == "gemma2" ? 50.0 : 0.0, def_final = c.arch == "gemma2" ? 30.0 : 0.0;
    auto cap = [&](const char* k, double def) {
      if (!cj.contains(k)) return def;
      if (cj[k].is_null()) return 0.0;
      return cf.num_opt(k, def);
    };
    c.attn_softcap = static_cast<float>(cap("attn_logit_softcapping", def_attn));
    c.final_softcap = static_cast<float>(cap("final_logit_softcapping", def_final));
  } else {
    for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"})
      if (cf.has(k))
        cf.bad(k, "is set, but kvgate applies it to Gemma 2/3 only (" + c.arch + " does not use it in transformers)");
  }
  c.bos_id = cf.token_id("bos_token_id", -1);
  c.eos_id = cf.token_id("eos_token_id", -1);

  // KV declaration: inline config.json first, then the legacy hf_quant_config.json.
  {
    std::string v;
    if (kv_decl_from(cj, "quantization_config", cfg_path.string(), &v)) {
      c.declared_kv = v;
      c.declared_kv_source = cfg_path.string() + ":quantization_config.kv_cache_quant_algo";
    } else {
      const fs::path legacy = dir / "hf_quant_config.json";
      if (fs::is_regular_file(legacy)) {
        const json lj = read_json(legacy);
        if (!lj.is_object()) throw ModelError("'" + legacy.string() + "': not a JSON object");
        if (kv_decl_from(lj, "quantization", legacy.string(), &v)) {
          c.declared_kv = v;
          c.declared_kv_source = legacy.string() + ":quantization.kv_cache_quant_algo";
        }
      }
    }
  }

  // Weights.
  TensorSource src(dir);
  const std::string arch_label = arch_name;
  auto load = [&](const std::string& name, std::vector<std::int64_t> shape, auto* out) {
    std::string where;
    auto f = src.find(name, &where);
    if (!f)
      throw ModelError("'" + where + "': missing tensor '" + name + "' (" + arch_label + " with config.json " +
                       "num_hidden_layers = " + std::to_string(c.n_layers) + " needs it)");
    if (f->t->shape != shape)
      throw ModelError("'" + f->file->path() + "': tensor '" + name + "' field 'shape' = " +
                       SafetensorsFile::shape_str(f->t->shape) + ", but config.json implies " +
                       SafetensorsFile::shape_str(shape));
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(*out)>, Weight>) load_weight(*f, name, storage, out);
    else to_f32(*f->file, name, *f->t, out);
  };
  // Optional KV scale tensor: a scalar (shape [] or [1]) or one per KV head (shape [n_kv_heads],
  // llm-compressor / ModelOpt); returns false when absent. Every value finite and > 0.
  const int H = c.n_kv_heads;
  auto load_kv_scale = [&](const std::string& name, std::vector<float>* out) {
    std::string where;
    auto f = src.find(name, &where);
    if (!f) return false;
    std::uint64_t numel = 1;
    for (auto d : f->t->shape) numel *= static_cast<std::uint64_t>(d);
    const bool per_head = f->t->shape.size() == 1 && f->t->shape[0] == H;
    if (numel != 1 && !per_head)
      throw ModelError("'" + f->file->path() + "': tensor '" + name + "' field 'shape' = " +
                       SafetensorsFile::shape_str(f->t->shape) + ", expected a scalar ([] or [1]) or one scale per KV " +
                       "head ([" + std::to_string(H) + "], config.json num_key_value_heads); re-export the KV scales " +
                       "with that shape");
    std::vector<float> v;
    to_f32(*f->file, name, *f->t, &v);
    for (std::size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i]) || v[i] <= 0)
        throw ModelError("'" + f->file->path() + "': tensor '" + name + "'" +
                         (v.size() > 1 ? " element " + std::to_string(i) + " (KV head " + std::to_string(i) + ")" : "") +
                         " = " + std::to_string(v[i]) + " is not a positive finite KV scale; recalibrate it (a KV " +
                         "scale divides the cached values, so it must be > 0)");
    *out = std::move(v);
    return true;
  };

  check_config_limits(cfg_path.string(), c);  // before any product of the config's sizes
  const std::int64_t D = c.dim, F = c.hidden_dim, V = c.vocab_size, Q = c.q_dim(), KV = c.kv_dim(),
                     HD = c.head_dim;
  check_weights_fit(src, dir_str, storage);
  ModelWeights& w = m.weights;
  load("model.embed_tokens.weight", {V, D}, &w.tok_embeddings);
  w.layers.resize(static_cast<std::size_t>(c.n_layers));
  int n_k_scales = 0, n_v_scales = 0;
  std::vector<std::vector<float>> ks(static_cast<std::size_t>(c.n_layers)), vs(static_cast<std::size_t>(c.n_layers));
  // Phi-3 stores q/k/v as one qkv_proj [q_dim + 2 kv_dim, dim] (rows q, then k, then v) and the
  // gate/up pair as gate_up_proj [2 intermediate, dim] (gate rows first): split here.
  auto load_fused = [&](const std::string& name, const std::vector<std::int64_t>& parts, std::int64_t cols,
                        const char* layout, std::initializer_list<Weight*> outs) {
    std::int64_t rows = 0;
    for (auto r : parts) rows += r;
    std::string where;
    auto f = src.find(name, &where);
    if (!f)
      throw ModelError("'" + where + "': missing tensor '" + name + "' (" + arch_label +
                       " stores it fused: " + layout + ")");
    if (f->t->shape != std::vector<std::int64_t>{rows, cols})
      throw ModelError("'" + f->file->path() + "': tensor '" + name + "' field 'shape' = " +
                       SafetensorsFile::shape_str(f->t->shape) + ", but config.json implies " +
                       SafetensorsFile::shape_str({rows, cols}) + " (" + layout +
                       "); fix config.json (hidden_size, num_attention_heads, num_key_value_heads, head_dim, "
                       "intermediate_size) or re-export the checkpoint");
    // Each part is a row range of the fused tensor: a view into it when kept as stored.
    Weight all;
    load_weight(*f, name, storage, &all);
    std::size_t r0 = 0, k = 0;
    for (Weight* o : outs) {
      const std::size_t n = static_cast<std::size_t>(parts[k++] * cols);
      if (all.is_f32()) {
        o->assign(all.begin() + static_cast<std::ptrdiff_t>(r0), all.begin() + static_cast<std::ptrdiff_t>(r0 + n));
      } else {
        const WeightView v = all.view(r0, n);
        *o = Weight::half_view(v.dtype, v.half(), n, f->file);
      }
      r0 += n;
    }
  };
  const bool phi3 = c.arch == "phi3";
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& L = w.layers[static_cast<std::size_t>(i)];
    load(layer_name(i, "input_layernorm.weight"), {D}, &L.attn_norm);
    if (c.mla.any()) {
      load_mla_layer(load, c, i, L);
    } else if (phi3) {
      load_fused(layer_name(i, "self_attn.qkv_proj.weight"), {Q, KV, KV}, D,
                 "rows [q_dim | kv_dim | kv_dim] = q_proj, k_proj, v_proj", {&L.wq, &L.wk, &L.wv});
    } else {
      load(layer_name(i, "self_attn.q_proj.weight"), {Q, D}, &L.wq);
      load(layer_name(i, "self_attn.k_proj.weight"), {KV, D}, &L.wk);
      load(layer_name(i, "self_attn.v_proj.weight"), {KV, D}, &L.wv);
    }
    load(layer_name(i, "self_attn.o_proj.weight"), {D, c.attn_out_dim()}, &L.wo);
    if (c.qkv_bias) {
      load(layer_name(i, "self_attn.q_proj.bias"), {Q}, &L.bq);
      load(layer_name(i, "self_attn.k_proj.bias"), {KV}, &L.bk);
      load(layer_name(i, "self_attn.v_proj.bias"), {KV}, &L.bv);
    }
    if (c.qk_norm) {
      load(layer_name(i, "self_attn.q_norm.weight"), {HD}, &L.q_norm);
      load(layer_name(i, "self_attn.k_norm.weight"), {HD}, &L.k_norm);
    }
    if (gemma) {  // sandwich norms: post_attention_layernorm is the attention OUTPUT's norm
      load(layer_name(i, "post_attention_layernorm.weight"), {D}, &L.post_attn_norm);
      load(layer_name(i, "pre_feedforward_layernorm.weight"), {D}, &L.ffn_norm);
      load(layer_name(i, "post_feedforward_layernorm.weight"), {D}, &L.post_ffn_norm);
    } else {
      load(layer_name(i, "post_attention_layernorm.weight"), {D}, &L.ffn_norm);
    }
    if (c.moe.is_moe(i) && c.arch == "deepseek_v3") {
      load_moe_layer(src, cfg_path.string(), arch_label, "n_routed_experts", c, i, L);
      load_deepseek_moe_extras(load, c, i, L);
    } else if (c.moe.is_moe(i)) {
      load_moe_layer(src, cfg_path.string(), arch_label,
                     c.arch == "mixtral" || !cf.has("num_experts") ? "num_local_experts" : "num_experts", c, i, L);
    } else if (phi3) {
      load_fused(layer_name(i, "mlp.gate_up_proj.weight"), {F, F}, D,
                 "rows [intermediate | intermediate] = gate_proj, up_proj", {&L.w1, &L.w3});
    } else {
      load(layer_name(i, "mlp.gate_proj.weight"), {F, D}, &L.w1);
      load(layer_name(i, "mlp.up_proj.weight"), {F, D}, &L.w3);
    }
    if (!c.moe.is_moe(i)) load(layer_name(i, "mlp.down_proj.weight"), {D, F}, &L.w2);
    // Per-layer FP8 KV scales under the names checkpoints use for them.
    const auto ui = static_cast<std::size_t>(i);
    if (load_kv_scale(layer_name(i, "self_attn.k_scale"), &ks[ui]) ||
        load_kv_scale(layer_name(i, "self_attn.k_proj.k_scale"), &ks[ui]) ||
        load_kv_scale(layer_name(i, "self_attn.kv_scale"), &ks[ui]))
      ++n_k_scales;
    if (load_kv_scale(layer_name(i, "self_attn.v_scale"), &vs[ui]) ||
        load_kv_scale(layer_name(i, "self_attn.v_proj.v_scale"), &vs[ui]) ||
        load_kv_scale(layer_name(i, "self_attn.kv_scale"), &vs[ui]))
      ++n_v_scales;
  }
  if (n_k_scales != 0 || n_v_scales != 0) {
    if (n_k_scales != c.n_layers || n_v_scales != c.n_layers)
      throw ModelError("'" + dir_str + "': KV scales are incomplete: " + std::to_string(n_k_scales) + " layers carry " +
                       "k_scale and " + std::to_string(n_v_scales) + " carry v_scale, of " +
                       std::to_string(c.n_layers) + " layers (model.layers.{i}.self_attn.k_scale / v_scale)");
    // [n_layers] when every layer's tensors are scalars; else [n_layers * n_kv_heads], a scalar layer's
    // scale on each of its heads (K and V decided apart).
    c.k_scale = flatten_kv_scales(ks, H);
    c.v_scale = flatten_kv_scales(vs, H);
  }
  load("model.norm.weight", {D}, &w.final_norm);
  if (gemma) {
    // Gemma's RMSNorm multiplies by (1 + w), computed in f32 (transformers: 1.0 + weight.float()):
    // stored as such so both backends run the plain norm.
    auto plus_one = [](std::vector<float>& v) {
      for (float& x : v) x = 1.0f + x;
    };
    for (LayerWeights& L : w.layers)
      for (auto* v : {&L.attn_norm, &L.post_attn_norm, &L.ffn_norm, &L.post_ffn_norm, &L.q_norm, &L.k_norm})
        plus_one(*v);
    plus_one(w.final_norm);
    // Embedding scale sqrt(hidden_size), rounded to the embedding's dtype as transformers does
    // (normalizer = torch.tensor(hidden_size**0.5, dtype=hidden_states.dtype)).
    std::string where;
    const auto emb = src.find("model.embed_tokens.weight", &where);
    const float e = static_cast<float>(std::sqrt(static_cast<double>(c.dim)));
    c.embed_scale = emb->t->dtype == "BF16"  ? bf16_to_f32(f32_to_bf16_rne(e))
                    : emb->t->dtype == "F16" ? f16_to_f32(f32_to_f16_rne(e))
                                             : e;
  }
  if (!c.tied_embeddings) {
    std::string where;
    if (!src.find("lm_head.weight", &where))
      throw ModelError("'" + where + "': missing tensor 'lm_head.weight' (config.json tie_word_embeddings is false or "
                       "absent, so the classifier must be stored)");
    load("lm_head.weight", {V, D}, &w.classifier);
  }
  validate_weights(dir_str, c, w);

  // Tokenizer (optional). Its BOS/EOS rule comes from tokenizer.json's post_processor and
  // tokenizer_config.json, never from config.json's bos_token_id (Qwen2/3 declare one and add none).
  const fs::path tok_path = dir / "tokenizer.json";
  if (fs::is_regular_file(tok_path)) {
    auto tok = load_tokenizer_json(tok_path.string(), c.bos_id, c.eos_id, (dir / "tokenizer_config.json").string());
    if (tok->vocab_size() > c.vocab_size)
      throw ModelError("'" + tok_path.string() + "': the tokenizer has " + std::to_string(tok->vocab_size()) +
                       " tokens but config.json vocab_size = " + std::to_string(c.vocab_size) +
                       " (token ids past the embedding table)");
    m.tokenizer = std::move(tok);
  }
  m.fingerprint = model_fingerprint(c, w);
  return m;
}

}  // namespace kvgate
