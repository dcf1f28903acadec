// A weight matrix as the model holds it: FP32 values the runtime owns (llama2.c, GGUF, F32
// safetensors, synthetic fixtures), or BF16 / F16 elements kept as the checkpoint stores them, read
// in place from the memory-mapped safetensors file (no FP32 copy on the host). Every reader converts
// a 16-bit element exactly (bf16 and f16 are subsets of f32), so a product over a 16-bit weight is
// bit for bit the product over its FP32 conversion.
//
// The FP32 accessors (data(), f32(), begin/end, the conversion to const std::vector<float>&) are for
// FP32 storage only and refuse a 16-bit weight by name: a reader that needs every element as FP32
// calls to_f32(), which converts (and says so by its name). view() / rows() work for every dtype.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvgate {

enum class WeightDtype : std::uint8_t { f32, bf16, f16 };

const char* weight_dtype_name(WeightDtype d);
inline std::size_t weight_dtype_bytes(WeightDtype d) { return d == WeightDtype::f32 ? 4 : 2; }

// One element of a 16-bit weight as FP32 (exact).
float half_weight_to_f32(WeightDtype d, std::uint16_t h);

// n elements starting at element `off` of a weight, any dtype; what the matmul, the embedding lookup
// and the CUDA upload read. Not owning: valid while the Weight (and its mapping) lives.
struct WeightView {
  WeightDtype dtype = WeightDtype::f32;
  const void* p = nullptr;
  std::size_t n = 0;

  static WeightView of_f32(const float* p, std::size_t n) { return {WeightDtype::f32, p, n}; }
  bool empty() const { return n == 0; }
  const float* f32() const;  // FP32 storage only (refused by name otherwise)
  const std::uint16_t* half() const { return static_cast<const std::uint16_t*>(p); }
  WeightView slice(std::size_t off, std::size_t count) const;
  // out[0, count) = elements [off, off + count) as FP32.
  void to_f32(std::size_t off, std::size_t count, float* out) const;
};

class Weight {
 public:
  Weight() = default;
  Weight(std::vector<float> v) : f32_(std::move(v)) {}  // NOLINT: a vector of FP32 values is a weight
  Weight& operator=(std::vector<float> v) {
    reset_half();
    f32_ = std::move(v);
    return *this;
  }

  // A 16-bit weight read in place: `keep` holds the memory (the file mapping) alive.
  static Weight half_view(WeightDtype d, const std::uint16_t* p, std::size_t n, std::shared_ptr<const void> keep);

  WeightDtype dtype() const { return dtype_; }
  bool is_f32() const { return dtype_ == WeightDtype::f32; }
  // Whether the elements live in a mapped file (true) or in memory the weight owns (false).
  bool mapped() const { return keep_ != nullptr; }
  std::size_t size() const { return is_f32() ? f32_.size() : n_; }
  bool empty() const { return size() == 0; }
  std::size_t bytes() const { return size() * weight_dtype_bytes(dtype_); }

  WeightView view() const { return is_f32() ? WeightView{WeightDtype::f32, f32_.data(), f32_.size()} : WeightView{dtype_, half_, n_}; }
  WeightView view(std::size_t off, std::size_t count) const { return view().slice(off, count); }
  operator WeightView() const { return view(); }  // NOLINT: every reader takes a view

  // Every element as FP32 (a copy for 16-bit storage).
  std::vector<float> to_f32() const;
  float at(std::size_t i) const;  // one element as FP32, any dtype

  // FP32 storage only: refused for a 16-bit weight, naming its dtype (use view() or to_f32()).
  const std::vector<float>& f32() const { return checked_f32(); }
  std::vector<float>& f32() { return checked_f32(); }
  operator const std::vector<float>&() const { return checked_f32(); }  // NOLINT
  const float* data() const { return checked_f32().data(); }
  float* data() { return checked_f32().data(); }
  float operator[](std::size_t i) const { return checked_f32()[i]; }
  float& operator[](std::size_t i) { return checked_f32()[i]; }
  auto begin() const { return checked_f32().begin(); }
  auto end() const { return checked_f32().end(); }
  auto begin() { return checked_f32().begin(); }
  auto end() { return checked_f32().end(); }
  void resize(std::size_t n) { checked_f32().resize(n); }
  template <class It>
  void assign(It b, It e) {
    reset_half();
    f32_.assign(b, e);
  }
  void assign(std::size_t n, float v) {
    reset_half();
    f32_.assign(n, v);
  }
  void clear() {
    reset_half();
    f32_.clear();
  }

  // Values equal element for element (as FP32), whatever the storage.
  friend bool operator==(const Weight& a, const Weight& b);
  friend bool operator!=(const Weight& a, const Weight& b) { return !(a == b); }

 private:
  const std::vector<float>& checked_f32() const;
  std::vector<float>& checked_f32();
  void reset_half() {
    dtype_ = WeightDtype::f32;
    half_ = nullptr;
    n_ = 0;
    keep_.reset();
  }

  WeightDtype dtype_ = WeightDtype::f32;
  std::vector<float> f32_;
  const std::uint16_t* half_ = nullptr;
  std::size_t n_ = 0;
  std::shared_ptr<const void> keep_;
};

// How a loader keeps 16-bit checkpoint weights: as stored (mapped, the default) or converted to
// owned FP32 (what kvgate did before; `--weights f32`).
enum class WeightStorage : std::uint8_t { as_stored, f32 };

}  // namespace kvgate
