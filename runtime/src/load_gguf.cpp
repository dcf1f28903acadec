// GGUF v2/v3 loader: header, metadata key/values (every value type, arrays included), tensor
// table, alignment, tensor data (F32, F16, BF16, Q8_0, Q4_0 dequantized to FP32), architecture
// `llama`, tokenizer from metadata. Every read is bounds-checked against the file size before any
// allocation, so a corrupted or hostile file gives a ModelError, never a crash. Every count and
// length the file states is also checked against its limit (kvgate/limits.hpp: TENSORS, METADATA,
// ARRAY_LEN, STRING_BYTES, TENSOR_RANK, TENSOR_ELEMS; VOCAB, MERGES and TOKEN_BYTES for the
// tokenizer.ggml.* arrays) before anything is sized by it, so a large file cannot ask for more
// than the policy allows either.
//
// Conventions: a tensor's dims are ne[0] (innermost, contiguous) first, so a [out][in] row-major
// weight has ne = {in, out}. llama.cpp's converter stores llama q/k weights permuted for
// interleaved (adjacent-pair) RoPE, exactly as llama2.c does: rope_style = interleaved.
#include <algorithm>
#include <limits>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kvgate/blocks.hpp"
#include "kvgate/limits.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/numeric.hpp"
#include "kvgate/tokenizer_bpe.hpp"
#include "kvgate/tokenizer_sp.hpp"

namespace kvgate {

namespace {

enum GgufType : std::uint32_t {
  T_U8 = 0, T_I8 = 1, T_U16 = 2, T_I16 = 3, T_U32 = 4, T_I32 = 5, T_F32 = 6, T_BOOL = 7,
  T_STRING = 8, T_ARRAY = 9, T_U64 = 10, T_I64 = 11, T_F64 = 12
};

const char* type_name(std::uint32_t t) {
  static const char* n[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  return t < 13 ? n[t] : "?";
}

std::size_t scalar_size(std::uint32_t t) {
  switch (t) {
    case T_U8: case T_I8: case T_BOOL: return 1;
    case T_U16: case T_I16: return 2;
    case T_U32: case T_I32: case T_F32: return 4;
    case T_U64: case T_I64: case T_F64: return 8;
    default: return 0;
  }
}

// ggml tensor types we dequantize.
enum GgmlType : std::uint32_t { G_F32 = 0, G_F16 = 1, G_Q4_0 = 2, G_Q8_0 = 8, G_BF16 = 30 };

std::string ggml_type_name(std::uint32_t t) {
  static const std::map<std::uint32_t, const char*> n{
      {0, "F32"},   {1, "F16"},   {2, "Q4_0"},  {3, "Q4_1"},   {6, "Q5_0"},   {7, "Q5_1"},  {8, "Q8_0"},
      {9, "Q8_1"},  {10, "Q2_K"}, {11, "Q3_K"}, {12, "Q4_K"},  {13, "Q5_K"},  {14, "Q6_K"}, {15, "Q8_K"},
      {16, "IQ2_XXS"}, {17, "IQ2_XS"}, {18, "IQ3_XXS"}, {19, "IQ1_S"}, {20, "IQ4_NL"}, {21, "IQ3_S"},
      {22, "IQ2_S"}, {23, "IQ4_XS"}, {24, "I8"}, {25, "I16"}, {26, "I32"}, {27, "I64"}, {28, "F64"},
      {29, "IQ1_M"}, {30, "BF16"}};
  const auto it = n.find(t);
  return it == n.end() ? "type " + std::to_string(t) : std::string(it->second) + " (" + std::to_string(t) + ")";
}

// One metadata value. Scalars live in u/i/f/b, strings in s; arrays of scalars in nums (as double;
// integers beyond 2^53 lose precision, which no key we read needs), arrays of strings in strs,
// nested arrays in arrs.
struct Value {
  std::uint32_t type = 0;
  std::uint32_t elem_type = 0;  // arrays
  std::uint64_t u = 0;
  std::int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<double> nums;
  std::vector<std::string> strs;
  std::vector<Value> arrs;
  std::uint64_t count = 0;  // arrays
};

class Mapped {
 public:
  explicit Mapped(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw ModelError("model '" + path + "': cannot open the file: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw ModelError("model '" + path + "': not a regular file");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
      if (p == MAP_FAILED) {
        ::close(fd_);
        throw ModelError("model '" + path + "': mmap failed: " + std::strerror(errno));
      }
      data_ = static_cast<const std::uint8_t*>(p);
    }
  }
  ~Mapped() {
    if (data_) ::munmap(const_cast<std::uint8_t*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  int fd_ = -1;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

class Cursor {
 public:
  Cursor(const std::string& path, const std::uint8_t* d, std::size_t n) : path_(path), d_(d), n_(n) {}
  std::size_t off() const { return off_; }
  std::size_t left() const { return n_ - off_; }
  [[noreturn]] void fail(const std::string& what) const {
    throw ModelError("model '" + path_ + "': " + what + " (at byte " + std::to_string(off_) + " of " +
                     std::to_string(n_) + ")");
  }
  void need(std::uint64_t k, const std::string& what) const {
    if (k > left()) fail("truncated while reading " + what + " (needs " + std::to_string(k) + " bytes)");
  }
  template <class T>
  T rd(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, d_ + off_, sizeof(T));
    off_ += sizeof(T);
    return v;
  }
  // "model '<path>'": the where of a limits refusal.
  std::string where() const { return "model '" + path_ + "'"; }
  // A length-prefixed string of at most `limit` bytes (STRING_BYTES, TOKEN_BYTES for vocabulary pieces).
  std::string str(const std::string& what, const limits::Limit& limit = limits::kStringBytes) {
    const auto len = rd<std::uint64_t>("length of " + what);
    if (len > left())
      fail("string " + what + " claims " + std::to_string(len) + " bytes, more than the " + std::to_string(left()) +
           " left in the file (truncated file or corrupted length)");
    limits::check(limit, len, where(), "length of " + what);  // a length the file can hold, over the policy
    std::string s(reinterpret_cast<const char*>(d_ + off_), static_cast<std::size_t>(len));
    off_ += static_cast<std::size_t>(len);
    return s;
  }
  Value value(std::uint32_t type, const std::string& key, int depth) {
    Value v;
    v.type = type;
    switch (type) {
      case T_U8: v.u = rd<std::uint8_t>(key); v.i = static_cast<std::int64_t>(v.u); v.f = static_cast<double>(v.u); break;
      case T_I8: v.i = rd<std::int8_t>(key); v.u = static_cast<std::uint64_t>(v.i); v.f = static_cast<double>(v.i); break;
      case T_U16: v.u = rd<std::uint16_t>(key); v.i = static_cast<std::int64_t>(v.u); v.f = static_cast<double>(v.u); break;
      case T_I16: v.i = rd<std::int16_t>(key); v.u = static_cast<std::uint64_t>(v.i); v.f = static_cast<double>(v.i); break;
      case T_U32: v.u = rd<std::uint32_t>(key); v.i = static_cast<std::int64_t>(v.u); v.f = static_cast<double>(v.u); break;
      case T_I32: v.i = rd<std::int32_t>(key); v.u = static_cast<std::uint64_t>(v.i); v.f = static_cast<double>(v.i); break;
      case T_U64: v.u = rd<std::uint64_t>(key); v.i = static_cast<std::int64_t>(v.u); v.f = static_cast<double>(v.u); break;
      case T_I64: v.i = rd<std::int64_t>(key); v.u = static_cast<std::uint64_t>(v.i); v.f = static_cast<double>(v.i); break;
      case T_F32: v.f = rd<float>(key); break;
      case T_F64: v.f = rd<double>(key); break;
      case T_BOOL: {
        const auto b = rd<std::uint8_t>(key);
        if (b > 1) fail("metadata key '" + key + "': bool value " + std::to_string(b) + " is not 0 or 1");
        v.u = b; v.i = b; v.f = b;
        break;
      }
      case T_STRING: v.s = str("metadata key '" + key + "'"); break;
      case T_ARRAY: {
        if (depth > 8) fail("metadata key '" + key + "': arrays nested deeper than 8 levels");
        v.elem_type = rd<std::uint32_t>("array type of '" + key + "'");
        v.count = rd<std::uint64_t>("array length of '" + key + "'");
        if (v.elem_type > T_F64)
          fail("metadata key '" + key + "': array element type " + std::to_string(v.elem_type) + " is not a GGUF type");
        // Every element takes at least 1 byte (strings and arrays at least 8): refuse absurd counts
        // before allocating anything.
        const std::size_t min_elem = v.elem_type == T_STRING ? 8 : v.elem_type == T_ARRAY ? 12 : scalar_size(v.elem_type);
        if (v.count > left() / min_elem)
          fail("metadata key '" + key + "': array of " + std::to_string(v.count) + " " + type_name(v.elem_type) +
               " elements cannot fit in the " + std::to_string(left()) +
               " bytes left (truncated file or corrupted length)");
        limits::check(array_limit(key), v.count, where(), "array length of '" + key + "'");
        if (v.elem_type == T_STRING) {
          v.strs.reserve(static_cast<std::size_t>(v.count));
          const limits::Limit& piece = key == "tokenizer.ggml.tokens" ? limits::kTokenBytes : limits::kStringBytes;
          for (std::uint64_t k = 0; k < v.count; ++k)
            v.strs.push_back(str("element " + std::to_string(k) + " of '" + key + "'", piece));
        } else if (v.elem_type == T_ARRAY) {
          v.arrs.reserve(static_cast<std::size_t>(v.count));
          for (std::uint64_t k = 0; k < v.count; ++k) v.arrs.push_back(value(T_ARRAY, key, depth + 1));
        } else {
          v.nums.resize(static_cast<std::size_t>(v.count));
          for (std::uint64_t k = 0; k < v.count; ++k) v.nums[static_cast<std::size_t>(k)] = value(v.elem_type, key, depth + 1).f;
        }
        break;
      }
      default: fail("metadata key '" + key + "': value type " + std::to_string(type) + " is not a GGUF type");
    }
    return v;
  }
  void seek(std::size_t o) { off_ = o; }

  // The limit on the length of the array under `key`: the vocabulary for the per-token arrays,
  // MERGES for the merges, ARRAY_LEN for every other key.
  static const limits::Limit& array_limit(const std::string& key) {
    if (key == "tokenizer.ggml.tokens" || key == "tokenizer.ggml.token_type" || key == "tokenizer.ggml.scores")
      return limits::kVocab;
    if (key == "tokenizer.ggml.merges") return limits::kMerges;
    return limits::kArrayLen;
  }

 private:
  const std::string& path_;
  const std::uint8_t* d_;
  std::size_t n_;
  std::size_t off_ = 0;
};

struct TensorInfo {
  std::string name;
  std::vector<std::uint64_t> ne;
  std::uint32_t type = 0;
  std::uint64_t offset = 0;  // relative to the data section
  std::uint64_t n_elems = 0;
  std::uint64_t n_bytes = 0;
};

std::string shape_text(const std::vector<std::uint64_t>& ne) {
  std::string s = "[";
  for (std::size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

class Gguf {
 public:
  explicit Gguf(const std::string& path) : path_(path), map_(path) { parse(); }

  const std::string& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  const Value* find(const std::string& key) const {
    const auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
  }
  std::optional<std::int64_t> get_int(const std::string& key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type == T_F32 || v->type == T_F64 || v->type == T_STRING || v->type == T_ARRAY || v->type == T_BOOL)
      throw ModelError("model '" + path_ + "': metadata key '" + key + "' has type " + type_name(v->type) +
                       ", expected an integer");
    return v->i;
  }
  std::optional<double> get_float(const std::string& key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type == T_STRING || v->type == T_ARRAY || v->type == T_BOOL)
      throw ModelError("model '" + path_ + "': metadata key '" + key + "' has type " + type_name(v->type) +
                       ", expected a number");
    return v->f;
  }
  std::optional<std::string> get_string(const std::string& key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != T_STRING)
      throw ModelError("model '" + path_ + "': metadata key '" + key + "' has type " + type_name(v->type) +
                       ", expected a string");
    return v->s;
  }
  std::optional<bool> get_bool(const std::string& key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != T_BOOL)
      throw ModelError("model '" + path_ + "': metadata key '" + key + "' has type " + type_name(v->type) +
                       ", expected a bool");
    return v->u != 0;
  }
  const Value* get_array(const std::string& key, std::uint32_t elem_type) const {
    const Value* v = find(key);
    if (!v) return nullptr;
    if (v->type != T_ARRAY || (v->elem_type != elem_type && !(elem_type == T_F64 && scalar_size(v->elem_type) > 0)))
      throw ModelError("model '" + path_ + "': metadata key '" + key + "' has type " + type_name(v->type) +
                       (v->type == T_ARRAY ? std::string(" of ") + type_name(v->elem_type) : std::string()) +
                       ", expected an array of " + (elem_type == T_F64 ? "numbers" : type_name(elem_type)));
    return v;
  }
  std::int64_t require_int(const std::string& key, std::int64_t lo, std::int64_t hi) const {
    const auto v = get_int(key);
    if (!v) throw ModelError("model '" + path_ + "': required metadata key '" + key + "' is missing");
    if (*v < lo || *v > hi)
      throw ModelError("model '" + path_ + "': metadata key '" + key + "' = " + std::to_string(*v) +
                       " is outside the plausible range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return *v;
  }

  const TensorInfo* tensor(const std::string& name) const {
    const auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }

  // Dequantizes a tensor into FP32 after checking it exists and has the expected shape.
  std::vector<float> load(const std::string& name, const std::vector<std::uint64_t>& expect_ne, bool required,
                          const std::string& shape_origin) const {
    const TensorInfo* t = tensor(name);
    if (!t) {
      if (!required) return {};
      throw ModelError("model '" + path_ + "': tensor '" + name + "' is missing");
    }
    std::vector<std::uint64_t> ne = t->ne;
    while (ne.size() > expect_ne.size() && ne.back() == 1) ne.pop_back();
    if (ne != expect_ne)
      throw ModelError("model '" + path_ + "': tensor '" + name + "' has shape " + shape_text(t->ne) + ", expected " +
                       shape_text(expect_ne) + " (from " + shape_origin + ")");
    std::vector<float> out(static_cast<std::size_t>(t->n_elems));
    const std::uint8_t* src = map_.data() + data_start_ + t->offset;
    const std::size_t n = out.size();
    switch (t->type) {
      case G_F32: std::memcpy(out.data(), src, n * 4); break;
      case G_F16: half_to_f32_bulk(src, false, out.data(), n); break;
      case G_BF16: half_to_f32_bulk(src, true, out.data(), n); break;
      case G_Q8_0:
        for (std::size_t b = 0; b < n / kQBlock; ++b) {
          block_q8_0 blk;
          std::memcpy(&blk, src + b * sizeof(block_q8_0), sizeof blk);
          const float d = f16_to_f32(blk.d);
          for (int j = 0; j < kQBlock; ++j) out[b * kQBlock + static_cast<std::size_t>(j)] = static_cast<float>(blk.qs[j]) * d;
        }
        break;
      case G_Q4_0:
        for (std::size_t b = 0; b < n / kQBlock; ++b) {
          block_q4_0 blk;
          std::memcpy(&blk, src + b * sizeof(block_q4_0), sizeof blk);
          const float d = f16_to_f32(blk.d);
          float* o = out.data() + b * kQBlock;
          for (int j = 0; j < kQBlock / 2; ++j) {
            o[j] = static_cast<float>((blk.qs[j] & 0x0F) - 8) * d;
            o[j + kQBlock / 2] = static_cast<float>((blk.qs[j] >> 4) - 8) * d;
          }
        }
        break;
      default: break;  // rejected in parse()
    }
    return out;
  }

 private:
  void parse() {
    Cursor c(path_, map_.data(), map_.size());
    if (map_.size() < 4) c.fail("truncated: too short for the GGUF magic");
    const auto magic = c.rd<std::uint32_t>("magic");
    if (std::memcmp(&magic, "GGUF", 4) != 0) {
      char m[5] = {};
      std::memcpy(m, &magic, 4);
      for (char& ch : m)
        if (ch && (ch < 32 || ch > 126)) ch = '?';
      throw ModelError("model '" + path_ + "': wrong magic '" + std::string(m) + "', expected 'GGUF' (not a GGUF file)");
    }
    version_ = c.rd<std::uint32_t>("version");
    if (version_ == 1) c.fail("GGUF version 1 is not supported (only v2 and v3); re-convert the model");
    if (version_ > 0xFFFF) c.fail("GGUF version field " + std::to_string(version_) + ": a big-endian GGUF file, not supported");
    if (version_ != 2 && version_ != 3) c.fail("GGUF version " + std::to_string(version_) + " is not supported (v2, v3)");
    const auto n_tensors = c.rd<std::uint64_t>("tensor_count");
    const auto n_kv = c.rd<std::uint64_t>("metadata_kv_count");
    // Each key/value takes >= 13 bytes (8 key length + 1 key byte + 4 type), each tensor info >= 24.
    if (n_kv > c.left() / 13)
      c.fail("metadata_kv_count = " + std::to_string(n_kv) + " cannot fit in the file");
    if (n_tensors > c.left() / 24)
      c.fail("tensor_count = " + std::to_string(n_tensors) + " cannot fit in the file");
    // Counts the file can hold, over the policy.
    limits::check(limits::kTensorCount, n_tensors, c.where(), "tensor_count");
    limits::check(limits::kMetadataCount, n_kv, c.where(), "metadata_kv_count");
    for (std::uint64_t k = 0; k < n_kv; ++k) {
      std::string key = c.str("metadata key " + std::to_string(k));
      const auto type = c.rd<std::uint32_t>("value type of '" + key + "'");
      Value v = c.value(type, key, 0);
      if (!kv_.emplace(key, std::move(v)).second) c.fail("duplicate metadata key '" + key + "'");
    }
    alignment_ = 32;
    if (const Value* a = find("general.alignment")) {
      if (a->type != T_U32 && a->type != T_I32 && a->type != T_U64)
        throw ModelError("model '" + path_ + "': metadata key 'general.alignment' has type " + type_name(a->type) +
                         ", expected u32");
      if (a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (1u << 20))
        throw ModelError("model '" + path_ + "': metadata key 'general.alignment' = " + std::to_string(a->u) +
                         " is not a power of two <= 1 MiB");
      alignment_ = a->u;
    }
    std::vector<TensorInfo> infos;
    infos.reserve(static_cast<std::size_t>(n_tensors));
    for (std::uint64_t k = 0; k < n_tensors; ++k) {
      TensorInfo t;
      t.name = c.str("name of tensor " + std::to_string(k));
      const auto nd = c.rd<std::uint32_t>("n_dims of tensor '" + t.name + "'");
      if (nd == 0 || nd > 4) c.fail("tensor '" + t.name + "' has n_dims = " + std::to_string(nd) + " (expected 1..4)");
      limits::check(limits::kTensorRank, nd, c.where(), "n_dims of tensor '" + t.name + "'");
      t.n_elems = 1;
      for (std::uint32_t d = 0; d < nd; ++d) {
        const auto e = c.rd<std::uint64_t>("dims of tensor '" + t.name + "'");
        // Structural first (no GGUF tensor comes near), then the policy on the product.
        if (e == 0 || e > (1ull << 40) || t.n_elems > (1ull << 42) / e)
          c.fail("tensor '" + t.name + "' has an absurd dimension " + std::to_string(e) + " (dims so far " +
                 shape_text(t.ne) + ")");
        t.ne.push_back(e);
        std::uint64_t n = 0;
        const bool fits = limits::mul_ok(t.n_elems, e, &n);
        if (!fits || n > limits::max_of(limits::kTensorElems))
          limits::refuse(limits::kTensorElems, c.where(), "elements of tensor '" + t.name + "' (dims " + shape_text(t.ne) + ")",
                         fits ? std::to_string(n) : std::string("more than 2^64"));
        t.n_elems = n;
      }
      t.type = c.rd<std::uint32_t>("type of tensor '" + t.name + "'");
      t.offset = c.rd<std::uint64_t>("offset of tensor '" + t.name + "'");
      switch (t.type) {
        case G_F32: t.n_bytes = t.n_elems * 4; break;
        case G_F16:
        case G_BF16: t.n_bytes = t.n_elems * 2; break;
        case G_Q8_0:
        case G_Q4_0:
          if (t.ne[0] % kQBlock != 0)
            c.fail("tensor '" + t.name + "' of type " + ggml_type_name(t.type) + " has ne[0] = " +
                   std::to_string(t.ne[0]) + ", not a multiple of 32");
          t.n_bytes = t.n_elems / kQBlock * (t.type == G_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0));
          break;
        default:
          throw ModelError("model '" + path_ + "': tensor '" + t.name + "' has type " + ggml_type_name(t.type) +
                           ", which kvgate does not load (supported: F32, F16, BF16, Q8_0, Q4_0)");
      }
      // The product against the file before anything is sized by it (the exact span is checked below).
      if (t.n_bytes > map_.size())
        c.fail("tensor '" + t.name + "' (" + ggml_type_name(t.type) + ", " + shape_text(t.ne) + ") needs " +
               std::to_string(t.n_bytes) + " bytes, more than the whole file: truncated file or corrupted dims");
      if (t.offset % alignment_ != 0)
        c.fail("tensor '" + t.name + "' offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
               std::to_string(alignment_));
      infos.push_back(std::move(t));
    }
    data_start_ = (c.off() + alignment_ - 1) / alignment_ * alignment_;
    if (data_start_ > map_.size() && n_tensors > 0)
      throw ModelError("model '" + path_ + "': truncated: the tensor data section would start at byte " +
                       std::to_string(data_start_) + ", past the end of the file (" + std::to_string(map_.size()) +
                       " bytes)");
    const std::uint64_t data_bytes = map_.size() > data_start_ ? map_.size() - data_start_ : 0;
    // Tensors may not share bytes (an overlap: two tensors read the same data, the sign of a
    // damaged or hand-edited file). Gaps are tolerated, as ggml does.
    {
      std::vector<const TensorInfo*> order;
      for (const auto& t : infos) order.push_back(&t);
      std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
        return a->offset != b->offset ? a->offset < b->offset : a->n_bytes < b->n_bytes;
      });
      std::uint64_t at = 0;
      const TensorInfo* prev = nullptr;
      for (const TensorInfo* t : order) {
        if (prev && t->offset < at)
          throw ModelError("model '" + path_ + "': tensor '" + t->name + "' at data offset " + std::to_string(t->offset) +
                           " overlaps tensor '" + prev->name + "' (data bytes [" + std::to_string(prev->offset) + ", " +
                           std::to_string(at) + ")): bad tensor offset");
        if (t->n_bytes <= std::numeric_limits<std::uint64_t>::max() - t->offset) at = std::max(at, t->offset + t->n_bytes);
        prev = t;
      }
    }
    for (auto& t : infos) {
      if (t.offset > data_bytes || t.n_bytes > data_bytes - t.offset)
        throw ModelError("model '" + path_ + "': tensor '" + t.name + "' (" + ggml_type_name(t.type) + ", " +
                         shape_text(t.ne) + ") spans data bytes [" + std::to_string(t.offset) + ", " +
                         std::to_string(t.offset + t.n_bytes) + ") past the end of the data section (" +
                         std::to_string(data_bytes) + " bytes): truncated file or bad tensor offset");
      const std::string name = t.name;
      if (!tensors_.emplace(name, std::move(t)).second)
        throw ModelError("model '" + path_ + "': duplicate tensor '" + name + "'");
    }
  }

  std::string path_;
  Mapped map_;
  std::uint32_t version_ = 0;
  std::map<std::string, Value> kv_;
  std::map<std::string, TensorInfo> tensors_;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_start_ = 0;
};

// The BOS/EOS rule of a GGUF vocabulary, as llama.cpp's llama_vocab::load: tokenizer.ggml.add_bos_token /
// add_eos_token when present; else add BOS for SentencePiece ("llama") vocabularies and for the gpt2
// pre-tokenizers llama.cpp marks so (llama3 / llama-v3 / llama-bpe / falcon3 / falcon-h1 / pixtral /
// midm-2.0 / lfm2 / tekken / chameleon), never EOS.
std::pair<bool, bool> gguf_adds_specials(const Gguf& g, const std::string& model) {
  bool add_bos = false;
  if (model == "llama") {
    add_bos = true;
  } else if (model == "gpt2") {
    const std::string pre = g.get_string("tokenizer.ggml.pre").value_or("");
    for (const char* p : {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                          "tekken", "chameleon"})
      if (pre == p) add_bos = true;
  }
  bool add_eos = false;
  if (g.find("tokenizer.ggml.add_bos_token")) add_bos = g.get_bool("tokenizer.ggml.add_bos_token").value();
  if (g.find("tokenizer.ggml.add_eos_token")) add_eos = g.get_bool("tokenizer.ggml.add_eos_token").value();
  return {add_bos, add_eos};
}

std::unique_ptr<Tokenizer> gguf_tokenizer(const Gguf& g, int vocab, int bos, int eos) {
  const auto model = g.get_string("tokenizer.ggml.model");
  if (!model) return nullptr;
  const auto [add_bos, add_eos] = gguf_adds_specials(g, *model);
  const Value* tokens = g.get_array("tokenizer.ggml.tokens", T_STRING);
  if (!tokens) throw ModelError("model '" + g.path() + "': tokenizer.ggml.model is set but 'tokenizer.ggml.tokens' is missing");
  if (static_cast<int>(tokens->strs.size()) != vocab)
    throw ModelError("model '" + g.path() + "': 'tokenizer.ggml.tokens' has " + std::to_string(tokens->strs.size()) +
                     " entries, the model's vocab (token_embd) has " + std::to_string(vocab));
  const Value* types = g.find("tokenizer.ggml.token_type") ? g.get_array("tokenizer.ggml.token_type", T_F64) : nullptr;
  if (types && types->nums.size() != tokens->strs.size())
    throw ModelError("model '" + g.path() + "': 'tokenizer.ggml.token_type' has " + std::to_string(types->nums.size()) +
                     " entries, 'tokenizer.ggml.tokens' has " + std::to_string(tokens->strs.size()));
  if (*model == "llama") {
    std::vector<float> scores(tokens->strs.size(), 0.0f);
    if (const Value* sc = g.find("tokenizer.ggml.scores") ? g.get_array("tokenizer.ggml.scores", T_F64) : nullptr) {
      if (sc->nums.size() != tokens->strs.size())
        throw ModelError("model '" + g.path() + "': 'tokenizer.ggml.scores' has " + std::to_string(sc->nums.size()) +
                         " entries, 'tokenizer.ggml.tokens' has " + std::to_string(tokens->strs.size()));
      for (std::size_t i = 0; i < scores.size(); ++i) {
        // Finite and within float's range, as in tokenizer.bin: a NaN or infinite score silently
        // changes every merge, and a double beyond float's range has no float (an undefined cast).
        const double d = sc->nums[i];
        if (!(std::fabs(d) <= static_cast<double>(std::numeric_limits<float>::max()))) {
          char shown[32];
          std::snprintf(shown, sizeof shown, "%g", d);
          throw ModelError("model '" + g.path() + "': element " + std::to_string(i) + " of 'tokenizer.ggml.scores' = " +
                           shown + " is not a finite float32 score (a corrupted file)");
        }
        scores[i] = static_cast<float>(d);
      }
    }
    std::vector<std::string> pieces = tokens->strs;
    static const std::string kSpm = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's space
    for (auto& p : pieces) {
      std::string o;
      o.reserve(p.size());
      for (std::size_t i = 0; i < p.size();) {
        if (p.compare(i, 3, kSpm) == 0) {
          o.push_back(' ');
          i += 3;
        } else {
          o.push_back(p[i++]);
        }
      }
      p = std::move(o);
    }
    const std::int64_t unk64 = g.get_int("tokenizer.ggml.unknown_token_id").value_or(0);
    if (unk64 < 0 || unk64 >= static_cast<std::int64_t>(pieces.size()))
      throw ModelError("model '" + g.path() + "': metadata key 'tokenizer.ggml.unknown_token_id' = " +
                       std::to_string(unk64) + " is outside the vocabulary (0.." + std::to_string(pieces.size() - 1) +
                       " from 'tokenizer.ggml.tokens'); fix the id or drop the key (default 0)");
    const int unk = static_cast<int>(unk64);
    auto tok = std::make_unique<SpTokenizer>(std::move(pieces), std::move(scores), bos, eos, unk);
    tok->set_adds(add_bos, add_eos);
    // llama.cpp's SentencePiece rules (token types: UNKNOWN / CONTROL / USER_DEFINED pieces cut out
    // of the text, BYTE pieces decoded to their byte) and tokenizer.ggml.add_space_prefix (default true).
    std::vector<int> type_ids;
    if (types)
      for (double t : types->nums) type_ids.push_back(static_cast<int>(t));
    tok->set_gguf_rules(g.get_bool("tokenizer.ggml.add_space_prefix").value_or(true), type_ids);
    return tok;
  }
  if (*model == "gpt2") {
    const Value* merges = g.get_array("tokenizer.ggml.merges", T_STRING);
    if (!merges) throw ModelError("model '" + g.path() + "': gpt2 tokenizer without 'tokenizer.ggml.merges'");
    BpeTokenizer::Options o;
    const std::string pre = g.get_string("tokenizer.ggml.pre").value_or("default");
    if (pre == "default" || pre == "gpt-2") o.pre = PreTokenizer::gpt2;
    else if (!parse_pre_tokenizer(pre, &o.pre))
      throw ModelError("model '" + g.path() + "': metadata key 'tokenizer.ggml.pre' = '" + pre +
                       "' is a pre-tokenizer kvgate does not implement (known: default, gpt2, llama3/llama-bpe, qwen2)");
    o.bos_id = bos;
    o.eos_id = eos;
    if (add_bos && bos >= 0) o.specials.prefix = {bos};
    if (add_eos && eos >= 0) o.specials.suffix = {eos};
    o.specials.source = g.path() + " tokenizer.ggml.add_bos_token / add_eos_token (llama.cpp defaults when absent)";
    if (types)
      for (std::size_t i = 0; i < types->nums.size(); ++i) {
        const int t = static_cast<int>(types->nums[i]);
        if (t == 3 || t == 4) o.added.push_back({static_cast<int>(i), tokens->strs[i], t == 3});  // control, user-defined
      }
    return std::make_unique<BpeTokenizer>(tokens->strs, merges->strs, std::move(o));
  }
  throw ModelError("model '" + g.path() + "': metadata key 'tokenizer.ggml.model' = '" + *model +
                   "' is not supported (llama, gpt2)");
}

}  // namespace

// The architectures the GGUF loader runs, with llama.cpp's conventions for each (llama-arch.cpp,
// llama-model.cpp, convert_hf_to_gguf.py):
//   llama   q/k stored permuted for adjacent-pair RoPE (LLAMA_ROPE_TYPE_NORM); Mistral ships as llama.
//   qwen2   rotate-half RoPE (NEOX), attn_q/k/v.bias.
//   qwen3   rotate-half, attn_q_norm / attn_k_norm over each head.
//   phi3    rotate-half, fused attn_qkv [q | k | v] and ffn_up [gate | up] (no ffn_gate), partial
//           rotary (rope.dimension_count), longrope as the rope_factors_long / _short tensors.
//   gemma2  rotate-half, GeGLU (tanh GELU), pre/post norms (post_attention_norm, post_ffw_norm), norms
//           stored as (1 + w) by the converter (not added again here), embeddings times sqrt(dim),
//           attn_logit_softcapping / final_logit_softcapping, sliding window on even layers.
//   gemma3  gemma2's layout without the attention soft-cap, plus attn_q_norm / attn_k_norm; sliding
//           layers every layer but each 6th, their RoPE base rope.freq_base_swa (llama.cpp: 10000,
//           no scaling) while the global layers take rope.freq_base and rope.scaling.*.
// Keys llama.cpp defines that kvgate reads for every architecture when present:
// {arch}.attention.sliding_window (the window; without a pattern every layer is windowed, except
// Gemma's fixed patterns), {arch}.attention.sliding_window_pattern (a bool per layer, true =
// sliding), {arch}.attention.scale (the softmax scale; Gemma's default is llama.cpp's
// 1/sqrt(key_length), 1/sqrt(embedding_length / head_count) for the 27B models).
namespace {

struct GgufArch {
  const char* name;
  bool interleaved_rope, qkv_fused, qk_norm, gemma;
};

const GgufArch* gguf_arch(const std::string& a) {
  static const GgufArch archs[] = {{"llama", true, false, false, false},  {"qwen2", false, false, false, false},
                                   {"qwen3", false, false, true, false},  {"phi3", false, true, false, false},
                                   {"gemma2", false, false, false, true}, {"gemma3", false, false, true, true}};
  for (const GgufArch& x : archs)
    if (a == x.name) return &x;
  return nullptr;
}

// Per-layer windows from {arch}.attention.sliding_window and the layer pattern.
std::vector<int> gguf_layer_windows(const Gguf& g, const std::string& arch, int n_layers) {
  const std::string p = arch + ".";
  const std::string wk = p + "attention.sliding_window";
  if (!g.find(wk)) return {};
  const std::int64_t w = g.require_int(wk, 0, 1 << 24);
  if (w == 0) return {};  // llama.cpp: 0 = no window
  std::vector<int> out(static_cast<std::size_t>(n_layers), 0);
  const std::string pk = p + "attention.sliding_window_pattern";
  if (const Value* pat = g.find(pk)) {
    if (pat->type != T_ARRAY || pat->elem_type != T_BOOL || pat->nums.size() != static_cast<std::size_t>(n_layers))
      throw ModelError("model '" + g.path() + "': metadata key '" + pk + "' must be an array of " +
                       std::to_string(n_layers) + " bools ('" + p + "block_count'), true for a sliding-window layer");
    for (int l = 0; l < n_layers; ++l)
      if (pat->nums[static_cast<std::size_t>(l)] != 0) out[static_cast<std::size_t>(l)] = static_cast<int>(w);
    return out;
  }
  // llama.cpp's set_swa_pattern(n): layer l slides when l % n < n - 1.
  const int n = arch == "gemma2" ? 2 : arch == "gemma3" ? 6 : 1;
  for (int l = 0; l < n_layers; ++l)
    if (n == 1 || l % n < n - 1) out[static_cast<std::size_t>(l)] = static_cast<int>(w);
  return out;
}

// llama.cpp's rope.scaling.* keys into c.rope (rope.scaling.type none | linear | yarn; llama3 comes
// as the rope_freqs tensor and longrope as rope_factors_long / _short, read with the tensors).
void gguf_rope_scaling(const Gguf& g, const std::string& p, RopeConfig& r) {
  const auto st = g.find(p + "rope.scaling.type") ? g.get_string(p + "rope.scaling.type") : std::nullopt;
  if (!st || *st == "none") return;
  const std::string k = p + "rope.scaling.";
  const double factor = g.get_float(k + "factor").value_or(0.0);
  if (!(factor > 0))
    throw ModelError("model '" + g.path() + "': '" + k + "factor' is missing or <= 0; rope.scaling.type '" + *st +
                     "' needs the scaling factor");
  r.factor = factor;
  if (*st == "linear") {
    r.type = RopeType::linear;
  } else if (*st == "yarn") {
    r.type = RopeType::yarn;
    const auto orig = g.get_int(k + "original_context_length");
    if (!orig || *orig < 1)
      throw ModelError("model '" + g.path() + "': '" + k + "original_context_length' is missing; yarn needs the "
                       "pre-training context length");
    r.original_max = static_cast<int>(*orig);
    if (const auto ext = g.get_float(k + "yarn_ext_factor"); ext && *ext != 1.0)
      throw ModelError("model '" + g.path() + "': '" + k + "yarn_ext_factor' = " + std::to_string(*ext) +
                       " is not supported (kvgate runs YaRN's full ramp, ext_factor 1, as transformers does); "
                       "drop the key or set it to 1");
    r.beta_fast = g.get_float(k + "yarn_beta_fast").value_or(32.0);
    r.beta_slow = g.get_float(k + "yarn_beta_slow").value_or(1.0);
    // ggml's YaRN: mscale = attn_factor * (1 + 0.1 ln(factor)); attn_factor from yarn_attn_factor,
    // else the older attn_factor key, else 1.
    const double af = g.get_float(k + "yarn_attn_factor").value_or(g.get_float(k + "attn_factor").value_or(1.0));
    if (!(af > 0))
      throw ModelError("model '" + g.path() + "': '" + k + "yarn_attn_factor' must be > 0 (1 when absent)");
    r.attention_factor = af * (factor > 1 ? 0.1 * std::log(factor) + 1.0 : 1.0);
  } else {
    throw ModelError("model '" + g.path() + "': '" + k + "type' = '" + *st +
                     "' is not supported (none, linear, yarn; llama3 scaling comes as the rope_freqs tensor, "
                     "longrope as rope_factors_long / rope_factors_short)");
  }
}

}  // namespace

Model load_gguf(const std::string& path) {
  const Gguf g(path);
  const std::string arch = g.get_string("general.architecture").value_or("");
  if (arch.empty()) throw ModelError("model '" + path + "': required metadata key 'general.architecture' is missing");
  const GgufArch* A = gguf_arch(arch);
  if (!A)
    throw ModelError("model '" + path + "': metadata key 'general.architecture' = '" + arch +
                     "' is not supported by the GGUF loader (llama, qwen2, qwen3, phi3, gemma2, gemma3); use the "
                     "Hugging Face directory instead");
  const std::string p = arch + ".";
  Model m;
  m.path = path;
  m.source_kind = "gguf";
  ModelConfig& c = m.config;
  c.arch = arch;
  c.dim = static_cast<int>(g.require_int(p + "embedding_length", 1, 1 << 16));
  c.hidden_dim = static_cast<int>(g.require_int(p + "feed_forward_length", 1, 1 << 18));
  c.n_layers = static_cast<int>(g.require_int(p + "block_count", 1, 1024));
  c.n_heads = static_cast<int>(g.require_int(p + "attention.head_count", 1, 1024));
  c.n_kv_heads = g.get_int(p + "attention.head_count_kv")
                     ? static_cast<int>(g.require_int(p + "attention.head_count_kv", 1, c.n_heads))
                     : c.n_heads;
  if (c.n_heads % c.n_kv_heads != 0)
    throw ModelError("model '" + path + "': '" + p + "attention.head_count' = " + std::to_string(c.n_heads) +
                     " is not a multiple of '" + p + "attention.head_count_kv' = " + std::to_string(c.n_kv_heads));
  if (g.get_int(p + "attention.key_length")) {
    c.head_dim = static_cast<int>(g.require_int(p + "attention.key_length", 2, 1 << 12));
    if (g.get_int(p + "attention.value_length") && *g.get_int(p + "attention.value_length") != c.head_dim)
      throw ModelError("model '" + path + "': '" + p + "attention.value_length' differs from key_length; not supported");
  } else {
    if (c.dim % c.n_heads != 0)
      throw ModelError("model '" + path + "': '" + p + "embedding_length' = " + std::to_string(c.dim) +
                       " is not a multiple of '" + p + "attention.head_count' = " + std::to_string(c.n_heads));
    c.head_dim = c.dim / c.n_heads;
  }
  if (c.head_dim % 2 != 0) throw ModelError("model '" + path + "': head_dim " + std::to_string(c.head_dim) + " is odd");
  // RoPE: partial rotary (rope.dimension_count < head_dim) and llama.cpp's scaling metadata.
  if (const auto rd = g.get_int(p + "rope.dimension_count"); rd && *rd != c.head_dim) {
    if (*rd < 2 || *rd > c.head_dim || *rd % 2 != 0)
      throw ModelError("model '" + path + "': '" + p + "rope.dimension_count' = " + std::to_string(*rd) +
                       " must be an even count in [2, head_dim " + std::to_string(c.head_dim) + "]");
    c.rope.rotary_dim = static_cast<int>(*rd);
  }
  gguf_rope_scaling(g, p, c.rope);
  c.max_seq_len = g.get_int(p + "context_length") ? static_cast<int>(g.require_int(p + "context_length", 1, 1 << 24)) : 2048;
  c.rms_eps = static_cast<float>(g.get_float(p + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.rope_theta = static_cast<float>(g.get_float(p + "rope.freq_base").value_or(10000.0));
  if (!(c.rms_eps > 0) || !(c.rope_theta > 0))
    throw ModelError("model '" + path + "': rms epsilon and rope.freq_base must be > 0");
  c.rope_style = A->interleaved_rope ? RopeStyle::interleaved : RopeStyle::half;
  c.qk_norm = A->qk_norm;
  c.layer_window = gguf_layer_windows(g, arch, c.n_layers);
  for (int w : c.layer_window)
    if (w > c.max_seq_len)
      throw ModelError("model '" + path + "': '" + p + "attention.sliding_window' = " + std::to_string(w) +
                       " is larger than '" + p + "context_length' = " + std::to_string(c.max_seq_len) +
                       "; fix the window (or the context length)");
  if (const auto sc = g.get_float(p + "attention.scale")) {
    if (!(*sc > 0) || !std::isfinite(*sc))
      throw ModelError("model '" + path + "': '" + p + "attention.scale' = " + std::to_string(*sc) +
                       " must be a finite number > 0 (the softmax scale; drop the key for 1/sqrt(head_dim))");
    c.attn_scale = static_cast<float>(*sc);
  }
  if (A->gemma) {
    c.ffn_act = FfnAct::gelu_tanh;
    c.post_norms = true;
    c.embed_scale = std::sqrt(static_cast<float>(c.dim));  // llama.cpp: ggml_scale(inpL, sqrtf(n_embd))
    if (c.attn_scale == 0) {
      const bool is_27b = (arch == "gemma2" && c.n_layers == 46) || (arch == "gemma3" && c.n_layers == 62);
      c.attn_scale = 1.0f / std::sqrt(static_cast<float>(is_27b ? c.dim / c.n_heads : c.head_dim));
    }
    // llama.cpp's defaults: Gemma 2 caps 50 / 30, Gemma 3 no attention cap and no final cap.
    auto cap = [&](const std::string& k, double def) {
      const double v = g.get_float(p + k).value_or(def);
      if (v < 0 || !std::isfinite(v))
        throw ModelError("model '" + path + "': '" + p + k + "' = " + std::to_string(v) + " must be >= 0 (0 = no cap)");
      return static_cast<float>(v);
    };
    c.attn_softcap = arch == "gemma2" ? cap("attn_logit_softcapping", 50.0) : 0.0f;
    c.final_softcap = cap("final_logit_softcapping", arch == "gemma2" ? 30.0 : 0.0);
    if (arch == "gemma3" && !c.layer_window.empty()) {
      c.has_rope_local = true;
      c.rope_local.theta = g.get_float(p + "rope.freq_base_swa").value_or(10000.0);
      c.rope_local.rotary_dim = c.rope.rotary_dim;
    }
  } else {
    for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping", "rope.freq_base_swa"})
      if (g.find(p + k))
        throw ModelError("model '" + path + "': metadata key '" + p + k + "' is set, but kvgate applies it to gemma2 / "
                         "gemma3 only (" + arch + " does not use it in llama.cpp)");
  }
  c.bos_id = static_cast<int>(g.get_int("tokenizer.ggml.bos_token_id").value_or(1));
  c.eos_id = static_cast<int>(g.get_int("tokenizer.ggml.eos_token_id").value_or(2));

  const TensorInfo* emb = g.tensor("token_embd.weight");
  if (!emb) throw ModelError("model '" + path + "': tensor 'token_embd.weight' is missing");
  if (emb->ne.size() == 2) limits::check(limits::kVocab, emb->ne[1], "model '" + path + "'", "token_embd.weight ne[1] (the vocabulary)");
  if (emb->ne.size() != 2 || emb->ne[0] != static_cast<std::uint64_t>(c.dim))
    throw ModelError("model '" + path + "': tensor 'token_embd.weight' has shape " + shape_text(emb->ne) +
                     ", expected [" + std::to_string(c.dim) + ", vocab]");
  c.vocab_size = static_cast<int>(emb->ne[1]);
  if (const auto vs = g.get_int(p + "vocab_size"); vs && *vs != c.vocab_size)
    throw ModelError("model '" + path + "': '" + p + "vocab_size' = " + std::to_string(*vs) +
                     " but token_embd.weight has " + std::to_string(c.vocab_size) + " rows");

  check_config_limits(path, c);  // before any product of the config's sizes
  using U = std::uint64_t;
  const U D = static_cast<U>(c.dim), F = static_cast<U>(c.hidden_dim), Q = static_cast<U>(c.q_dim()),
          KV = static_cast<U>(c.kv_dim()), V = static_cast<U>(c.vocab_size), HD = static_cast<U>(c.head_dim);
  const std::string origin = p + "embedding_length, head_count, head_count_kv, feed_forward_length";
  ModelWeights& w = m.weights;
  w.tok_embeddings = g.load("token_embd.weight", {D, V}, true, origin);
  w.final_norm = g.load("output_norm.weight", {D}, true, origin);
  w.classifier = g.load("output.weight", {D, V}, false, origin);
  {
    const U pairs = static_cast<U>(rope_rotary_dim(c.rope, c.head_dim) / 2);
    // Llama 3.1 RoPE scaling as llama.cpp's converter stores it: per-frequency divisors.
    c.rope.freq_divisors = g.load("rope_freqs.weight", {pairs}, false, "rope.dimension_count / 2");
    // Phi-3 longrope: the long / short factors, chosen by the length as transformers does (llama.cpp
    // chooses by the context size it is given).
    c.rope.long_factor = g.load("rope_factors_long.weight", {pairs}, false, "rope.dimension_count / 2");
    c.rope.short_factor = g.load("rope_factors_short.weight", {pairs}, false, "rope.dimension_count / 2");
    if (c.rope.long_factor.empty() != c.rope.short_factor.empty())
      throw ModelError("model '" + path + "': only one of the tensors 'rope_factors_long.weight' and "
                       "'rope_factors_short.weight' is present; longrope needs both");
    if (!c.rope.long_factor.empty()) {
      if (c.rope.type != RopeType::plain)
        throw ModelError("model '" + path + "': rope_factors_long / _short (longrope) together with '" + p +
                         "rope.scaling.type' = " + rope_type_name(c.rope.type) + "; keep one RoPE scaling");
      c.rope.type = RopeType::longrope;
      const auto orig = g.get_int(p + "rope.scaling.original_context_length");
      if (!orig || *orig < 1 || *orig > c.max_seq_len)
        throw ModelError("model '" + path + "': '" + p + "rope.scaling.original_context_length' is missing or outside "
                         "[1, context_length]; longrope (rope_factors_long / _short) needs the pre-training length");
      c.rope.original_max = static_cast<int>(*orig);
      c.rope.max_position = c.max_seq_len;
      c.rope.factor = static_cast<double>(c.max_seq_len) / static_cast<double>(*orig);
      c.rope.attention_factor = g.get_float(p + "rope.scaling.attn_factor").value_or(1.0);
    }
  }
  validate_rope(c.rope, c.head_dim, path, p + "rope");
  if (c.has_rope_local) validate_rope(c.rope_local, c.head_dim, path, p + "rope.freq_base_swa");
  c.tied_embeddings = w.classifier.empty();
  w.layers.resize(static_cast<std::size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[static_cast<std::size_t>(l)];
    L.attn_norm = g.load(b + "attn_norm.weight", {D}, true, origin);
    if (A->qkv_fused) {
      // attn_qkv: rows [q_dim | kv_dim | kv_dim] (q, k, v), as Phi-3's qkv_proj.
      const std::vector<float> qkv = g.load(b + "attn_qkv.weight", {D, Q + 2 * KV}, true, origin);
      const auto q_end = static_cast<std::ptrdiff_t>(Q * D), k_end = static_cast<std::ptrdiff_t>((Q + KV) * D);
      L.wq.assign(qkv.begin(), qkv.begin() + q_end);
      L.wk.assign(qkv.begin() + q_end, qkv.begin() + k_end);
      L.wv.assign(qkv.begin() + k_end, qkv.end());
    } else {
      L.wq = g.load(b + "attn_q.weight", {D, Q}, true, origin);
      L.wk = g.load(b + "attn_k.weight", {D, KV}, true, origin);
      L.wv = g.load(b + "attn_v.weight", {D, KV}, true, origin);
    }
    L.wo = g.load(b + "attn_output.weight", {Q, D}, true, origin);
    if (c.qk_norm) {
      L.q_norm = g.load(b + "attn_q_norm.weight", {HD}, true, p + "attention.key_length");
      L.k_norm = g.load(b + "attn_k_norm.weight", {HD}, true, p + "attention.key_length");
    }
    L.ffn_norm = g.load(b + "ffn_norm.weight", {D}, true, origin);
    if (A->gemma) {
      L.post_attn_norm = g.load(b + "post_attention_norm.weight", {D}, true, origin);
      L.post_ffn_norm = g.load(b + "post_ffw_norm.weight", {D}, true, origin);
    }
    if (A->qkv_fused && !g.tensor(b + "ffn_gate.weight")) {
      // ffn_up: rows [gate | up] (Phi-3's gate_up_proj; llama.cpp's fused SwiGLU takes the gate first).
      const std::vector<float> gu = g.load(b + "ffn_up.weight", {D, 2 * F}, true, origin);
      const auto half = static_cast<std::ptrdiff_t>(F * D);
      L.w1.assign(gu.begin(), gu.begin() + half);
      L.w3.assign(gu.begin() + half, gu.end());
    } else {
      L.w1 = g.load(b + "ffn_gate.weight", {D, F}, true, origin);
      L.w3 = g.load(b + "ffn_up.weight", {D, F}, true, origin);
    }
    L.w2 = g.load(b + "ffn_down.weight", {F, D}, true, origin);
    L.bq = g.load(b + "attn_q.bias", {Q}, false, origin);
    L.bk = g.load(b + "attn_k.bias", {KV}, false, origin);
    L.bv = g.load(b + "attn_v.bias", {KV}, false, origin);
    if (!L.bq.empty() || !L.bk.empty() || !L.bv.empty()) {
      if (L.bq.empty() || L.bk.empty() || L.bv.empty())
        throw ModelError("model '" + path + "': layer " + std::to_string(l) + " has some but not all of attn_q/k/v.bias");
      c.qkv_bias = true;
    }
  }
  validate_weights(path, c, w);
  m.tokenizer = gguf_tokenizer(g, c.vocab_size, c.bos_id, c.eos_id);
  m.fingerprint = model_fingerprint(c, w);
  return m;
}

}  // namespace kvgate
