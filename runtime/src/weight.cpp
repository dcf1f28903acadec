// Weight storage (kvgate/weight.hpp): FP32 owned, or 16-bit elements read in place.
#include "kvgate/weight.hpp"

#include <cstring>

#include "kvgate/numeric.hpp"

namespace kvgate {

const char* weight_dtype_name(WeightDtype d) {
  switch (d) {
    case WeightDtype::f32: return "f32";
    case WeightDtype::bf16: return "bf16";
    case WeightDtype::f16: return "f16";
  }
  return "?";
}

float half_weight_to_f32(WeightDtype d, std::uint16_t h) {
  return d == WeightDtype::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

const float* WeightView::f32() const {
  if (dtype != WeightDtype::f32)
    throw std::logic_error(std::string("weight: FP32 elements asked of a ") + weight_dtype_name(dtype) +
                           " weight (a reader of 16-bit weights converts them: WeightView::to_f32)");
  return static_cast<const float*>(p);
}

WeightView WeightView::slice(std::size_t off, std::size_t count) const {
  if (off > n || count > n - off)
    throw std::out_of_range("weight: elements [" + std::to_string(off) + ", " + std::to_string(off + count) +
                            ") of a weight of " + std::to_string(n));
  const auto* b = static_cast<const unsigned char*>(p);
  return {dtype, b ? b + off * weight_dtype_bytes(dtype) : nullptr, count};
}

void WeightView::to_f32(std::size_t off, std::size_t count, float* out) const {
  const WeightView s = slice(off, count);
  if (dtype == WeightDtype::f32) {
    if (count) std::memcpy(out, s.p, count * sizeof(float));
    return;
  }
  const std::uint16_t* h = s.half();
  if (dtype == WeightDtype::bf16) {
    for (std::size_t i = 0; i < count; ++i) out[i] = bf16_to_f32(h[i]);
  } else {
    for (std::size_t i = 0; i < count; ++i) out[i] = f16_to_f32(h[i]);
  }
}

Weight Weight::half_view(WeightDtype d, const std::uint16_t* p, std::size_t n, std::shared_ptr<const void> keep) {
  if (d == WeightDtype::f32) throw std::logic_error("weight: half_view of an FP32 weight");
  Weight w;
  w.dtype_ = d;
  w.half_ = p;
  w.n_ = n;
  w.keep_ = std::move(keep);
  return w;
}

std::vector<float> Weight::to_f32() const {
  if (is_f32()) return f32_;
  std::vector<float> out(n_);
  half_to_f32_bulk(half_, dtype_ == WeightDtype::bf16, out.data(), n_);
  return out;
}

float Weight::at(std::size_t i) const {
  if (i >= size()) throw std::out_of_range("weight: element " + std::to_string(i) + " of " + std::to_string(size()));
  return is_f32() ? f32_[i] : half_weight_to_f32(dtype_, half_[i]);
}

const std::vector<float>& Weight::checked_f32() const {
  if (!is_f32())
    throw std::logic_error(std::string("weight: FP32 storage asked of a ") + weight_dtype_name(dtype_) +
                           " weight kept as the checkpoint stores it (read it through view() or to_f32(), or load "
                           "with --weights f32)");
  return f32_;
}

std::vector<float>& Weight::checked_f32() {
  return const_cast<std::vector<float>&>(static_cast<const Weight&>(*this).checked_f32());
}

bool operator==(const Weight& a, const Weight& b) {
  if (a.size() != b.size()) return false;
  if (a.is_f32() && b.is_f32()) return a.f32_ == b.f32_;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(a.at(i) == b.at(i))) return false;
  return true;
}

}  // namespace kvgate
