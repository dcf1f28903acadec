#include "kvgate/format.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "kvgate/blocks.hpp"
#include "kvgate/limits.hpp"
#include "kvgate/numeric.hpp"

namespace kvgate {

namespace {

constexpr std::array<HalfFormatInfo, kHalfFormatCount> kInfo{{
    {HalfFormat::f32, "f32", "f32", "none", "-", "none", "f32", "f32", "f32", "exact", false, false},
    {HalfFormat::f16, "f16", "f16", "none", "-", "none", "f16", "f16", "f32",
     "|x^-x| <= 2^-11|x| (normal range), RNE", false, false},
    {HalfFormat::bf16, "bf16", "bf16", "none", "-", "none", "bf16", "bf16", "f32", "|x^-x| <= 2^-8|x|, RNE", false,
     false},
    {HalfFormat::int8, "int8", "int8 [-127,127]", "per cell (token x kv head)", "f16", "none", "int8 + f16 scale",
     "int8 + f16 scale", "f32", "|x^-x| <= s/2, s = absmax/127 rounded up to f16", true, false},
    {HalfFormat::fp8_e4m3, "fp8_e4m3", "e4m3fn (sat. +-448)", "per tensor (layer, K|V)", "f32", "none", "e4m3fn",
     "e4m3fn", "f32", "|x^-x| <= 2^-4|x| + 2^-10 s", false, true},
    {HalfFormat::fp8_e5m2, "fp8_e5m2", "e5m2 (sat. +-57344)", "per tensor (layer, K|V)", "f32", "none", "e5m2", "e5m2",
     "f32", "|x^-x| <= 2^-3|x| + 2^-17 s", false, true},
    {HalfFormat::q8_0, "q8_0", "int8 [-127,127]", "per 32-block of the token row", "f16", "none", "q8_0 blocks",
     "q8_0 blocks", "f32", "|x^-x| <= |d|/2, d = absmax/127 rounded up to f16", true, false},
    {HalfFormat::q4_0, "q4_0", "uint4 (code-8)", "per 32-block of the token row", "f16", "none", "q4_0 blocks",
     "q4_0 blocks", "f32", "|x^-x| <= |d|/2; opposite-side elements beyond 7.5|d| clamp: <= |d|", true, false},
    {HalfFormat::q4_0_rot, "q4_0_rot", "uint4 (code-8)", "per 32-block of the rotated token row", "f16",
     "walsh-hadamard per head", "q4_0 blocks (rotated)", "q4_0 blocks (rotated)", "f32",
     "q4_0 envelope in the rotated domain; L2 per head in the original domain", true, false},
}};

constexpr std::array<HalfFormat, kHalfFormatCount> kAll{HalfFormat::f32,      HalfFormat::f16,      HalfFormat::bf16,
                                                        HalfFormat::int8,     HalfFormat::fp8_e4m3, HalfFormat::fp8_e5m2,
                                                        HalfFormat::q8_0,     HalfFormat::q4_0,     HalfFormat::q4_0_rot};

constexpr std::array<Preset, 9> kPresets{{
    {"f32", {HalfFormat::f32, HalfFormat::f32}},
    {"f16", {HalfFormat::f16, HalfFormat::f16}},
    {"bf16", {HalfFormat::bf16, HalfFormat::bf16}},
    {"int8", {HalfFormat::int8, HalfFormat::int8}},
    {"fp8", {HalfFormat::fp8_e4m3, HalfFormat::fp8_e4m3}},
    {"fp8_e5m2", {HalfFormat::fp8_e5m2, HalfFormat::fp8_e5m2}},
    {"q8_0", {HalfFormat::q8_0, HalfFormat::q8_0}},
    {"q4_0", {HalfFormat::q4_0, HalfFormat::q4_0}},
    {"k8v4", {HalfFormat::int8, HalfFormat::q4_0_rot}},
}};

bool is_block32(HalfFormat f) { return f == HalfFormat::q8_0 || f == HalfFormat::q4_0 || f == HalfFormat::q4_0_rot; }

std::size_t elem_bytes(HalfFormat f) {
  switch (f) {
    case HalfFormat::f32: return 4;
    case HalfFormat::f16:
    case HalfFormat::bf16: return 2;
    default: return 1;
  }
}

std::size_t block_bytes(HalfFormat f) { return f == HalfFormat::q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0); }

// Per-cell int8 quantization (and the q8_0 block body): docs/FORMATS.md "int8".
void quantize_absmax127(const float* x, int n, std::int8_t* codes, std::uint16_t* scale_out) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0.0f) {
    *scale_out = 0;
    std::memset(codes, 0, static_cast<std::size_t>(n));
    return;
  }
  const std::uint16_t s16 = f16_scale_round_up(amax, 127);
  const float s = f16_to_f32(s16);
  for (int i = 0; i < n; ++i) {
    // NaN elements take code 0 (docs/FORMATS.md); they were already ignored by amax.
    codes[i] = std::isnan(x[i]) ? std::int8_t{0}
                                : static_cast<std::int8_t>(std::clamp(round_half_even(x[i] / s), -127, 127));
  }
  *scale_out = s16;
}

void quantize_q4_0_block(const float* x, block_q4_0* b) {
  float m = 0.0f;
  float amax = 0.0f;
  for (int i = 0; i < kQBlock; ++i) {
    if (std::fabs(x[i]) > amax) {  // strict: the lowest index wins a tie
      amax = std::fabs(x[i]);
      m = x[i];
    }
  }
  std::uint8_t codes[kQBlock];
  if (amax == 0.0f) {
    b->d = 0;
    std::fill(codes, codes + kQBlock, std::uint8_t{8});
  } else {
    const std::uint16_t mag = f16_scale_round_up(amax, 8);
    const std::uint16_t d16 = m > 0.0f ? static_cast<std::uint16_t>(mag | 0x8000u) : mag;  // d = -sign(m)|d|
    const float d = f16_to_f32(d16);
    for (int i = 0; i < kQBlock; ++i) {
      codes[i] = std::isnan(x[i]) ? std::uint8_t{8}
                                  : static_cast<std::uint8_t>(std::clamp(round_half_even(x[i] / d) + 8, 0, 15));
    }
    b->d = d16;
  }
  for (int j = 0; j < kQBlock / 2; ++j) b->qs[j] = static_cast<std::uint8_t>(codes[j] | (codes[j + 16] << 4));
}

void dequantize_q4_0_block(const block_q4_0* b, float* y) {
  const float d = f16_to_f32(b->d);
  for (int j = 0; j < kQBlock / 2; ++j) {
    y[j] = static_cast<float>((b->qs[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((b->qs[j] >> 4) - 8) * d;
  }
}

}  // namespace

const HalfFormatInfo& info(HalfFormat f) { return kInfo[static_cast<std::size_t>(f)]; }
std::string_view name(HalfFormat f) { return info(f).name; }
std::span<const HalfFormat> all_half_formats() { return kAll; }

std::optional<HalfFormat> parse_half(std::string_view s) {
  if (s == "fp8") return HalfFormat::fp8_e4m3;
  for (const auto& i : kInfo)
    if (i.name == s) return i.id;
  return std::nullopt;
}

Capability supports(HalfFormat f, const PageGeometry& g) {
  if (g.block_size < 1 || g.n_kv_heads < 1 || g.head_dim < 1)
    return {false, "invalid_geometry", "block_size, n_kv_heads and head_dim must all be >= 1"};
  // Products of the geometry are taken in int elsewhere (row_elems, page sizes): refuse a geometry
  // whose row or page would overflow, before any product is formed (kvgate/limits.hpp).
  if (static_cast<std::uint64_t>(g.n_kv_heads) * static_cast<std::uint64_t>(g.head_dim) >
          limits::max_of(limits::kKvRow) ||
      static_cast<std::uint64_t>(g.block_size) > limits::max_of(limits::kBlockSize))
    return {false, "geometry_too_large",
            "n_kv_heads*head_dim = " + std::to_string(static_cast<std::uint64_t>(g.n_kv_heads) *
                                                      static_cast<std::uint64_t>(g.head_dim)) +
                " (limit " + std::to_string(limits::max_of(limits::kKvRow)) + ", " +
                limits::override_hint(limits::kKvRow) + ") or block_size = " + std::to_string(g.block_size) +
                " (limit " + std::to_string(limits::max_of(limits::kBlockSize)) + ", " +
                limits::override_hint(limits::kBlockSize) + ") is beyond the limits"};
  if (is_block32(f) && g.row_elems() % kQBlock != 0)
    return {false, "row_not_multiple_of_32",
            std::string(name(f)) + " quantizes the token row (n_kv_heads*head_dim = " + std::to_string(g.row_elems()) +
                ") in 32-element blocks; the row length must be a multiple of 32"};
  if (f == HalfFormat::q4_0_rot && (g.head_dim & (g.head_dim - 1)) != 0)
    return {false, "head_dim_not_power_of_two",
            "q4_0_rot applies a Walsh-Hadamard rotation over head_dim, which must be a power of two (got " +
                std::to_string(g.head_dim) + ")"};
  return {};
}

std::size_t page_bytes(HalfFormat f, const PageGeometry& g) {
  std::size_t total = 0;
  for (const auto& r : page_runs(f, g)) total += r.bytes;
  return total;
}

std::vector<ByteRun> page_runs(HalfFormat f, const PageGeometry& g) {
  const std::size_t B = static_cast<std::size_t>(g.block_size);
  const std::size_t H = static_cast<std::size_t>(g.n_kv_heads);
  const std::size_t D = static_cast<std::size_t>(g.head_dim);
  if (is_block32(f)) return {{"blocks", 0, B * (H * D / kQBlock) * block_bytes(f)}};
  const std::size_t codes = B * H * D * elem_bytes(f);
  if (f == HalfFormat::int8) return {{"codes", 0, codes}, {"scales", codes, B * H * sizeof(std::uint16_t)}};
  return {{"codes", 0, codes}};
}

double bytes_per_cell(HalfFormat f, const PageGeometry& g) {
  return static_cast<double>(page_bytes(f, g)) / (static_cast<double>(g.block_size) * g.n_kv_heads);
}

std::vector<ByteRun> token_ranges(HalfFormat f, const PageGeometry& g, int slot) {
  const std::size_t t = static_cast<std::size_t>(slot);
  const std::size_t HD = static_cast<std::size_t>(g.row_elems());
  if (is_block32(f)) {
    const std::size_t row = (HD / kQBlock) * block_bytes(f);
    return {{"blocks", t * row, row}};
  }
  const std::size_t row = HD * elem_bytes(f);
  std::vector<ByteRun> r{{"codes", t * row, row}};
  if (f == HalfFormat::int8) {
    const std::size_t sc = static_cast<std::size_t>(g.n_kv_heads) * sizeof(std::uint16_t);
    r.push_back({"scales", static_cast<std::size_t>(g.block_size) * HD + t * sc, sc});
  }
  return r;
}

std::string KvFormat::name() const {
  for (const auto& p : kPresets)
    if (p.fmt == *this) return std::string(p.name);
  return "k=" + std::string(kvgate::name(k)) + ",v=" + std::string(kvgate::name(v));
}

std::span<const Preset> presets() { return kPresets; }

std::optional<KvFormat> parse_kv_format(std::string_view s) {
  for (const auto& p : kPresets)
    if (p.name == s) return p.fmt;
  if (s == "fp8_e4m3") return KvFormat{HalfFormat::fp8_e4m3, HalfFormat::fp8_e4m3};
  if (s.starts_with("k=")) {
    const auto comma = s.find(",v=");
    if (comma == std::string_view::npos) return std::nullopt;
    const auto k = parse_half(s.substr(2, comma - 2));
    const auto v = parse_half(s.substr(comma + 3));
    if (k && v) return KvFormat{*k, *v};
  }
  return std::nullopt;
}

std::string known_formats_text() {
  std::string s = "presets:";
  for (const auto& p : kPresets) s += " " + std::string(p.name);
  s += "; halves (for k=<K>,v=<V> or --kv-k/--kv-v):";
  for (const auto& i : kInfo) s += " " + std::string(i.name);
  return s;
}

void hadamard_normalized(float* x, int n) {
  for (int len = 1; len < n; len <<= 1) {
    for (int i = 0; i < n; ++i) {
      if (i & len) continue;
      const float a = x[i];
      const float b = x[i + len];
      x[i] = a + b;
      x[i + len] = a - b;
    }
  }
  const float c = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (int i = 0; i < n; ++i) x[i] *= c;
}

void quantize_token(HalfFormat f, const PageGeometry& g, int slot, const float* row, float tensor_scale,
                    std::uint8_t* page) {
  const int HD = g.row_elems();
  const std::size_t t = static_cast<std::size_t>(slot);
  switch (f) {
    case HalfFormat::f32: std::memcpy(page + t * HD * 4, row, static_cast<std::size_t>(HD) * 4); return;
    case HalfFormat::f16: {
      auto* out = reinterpret_cast<std::uint16_t*>(page) + t * HD;
      for (int i = 0; i < HD; ++i) out[i] = f32_to_f16_rne(row[i]);
      return;
    }
    case HalfFormat::bf16: {
      auto* out = reinterpret_cast<std::uint16_t*>(page) + t * HD;
      for (int i = 0; i < HD; ++i) out[i] = f32_to_bf16_rne(row[i]);
      return;
    }
    case HalfFormat::int8: {
      auto* codes = reinterpret_cast<std::int8_t*>(page) + t * HD;
      auto* scales = reinterpret_cast<std::uint16_t*>(page + static_cast<std::size_t>(g.block_size) * HD) +
                     t * g.n_kv_heads;
      for (int h = 0; h < g.n_kv_heads; ++h)
        quantize_absmax127(row + h * g.head_dim, g.head_dim, codes + h * g.head_dim, scales + h);
      return;
    }
    case HalfFormat::fp8_e4m3:
    case HalfFormat::fp8_e5m2: {
      auto* out = page + t * HD;
      const bool e4 = f == HalfFormat::fp8_e4m3;
      for (int i = 0; i < HD; ++i) {
        const float y = row[i] / tensor_scale;
        out[i] = e4 ? f32_to_fp8_e4m3(y) : f32_to_fp8_e5m2(y);
      }
      return;
    }
    case HalfFormat::q8_0: {
      auto* blocks = reinterpret_cast<block_q8_0*>(page) + t * (HD / kQBlock);
      for (int b = 0; b < HD / kQBlock; ++b) quantize_absmax127(row + b * kQBlock, kQBlock, blocks[b].qs, &blocks[b].d);
      return;
    }
    case HalfFormat::q4_0:
    case HalfFormat::q4_0_rot: {
      auto* blocks = reinterpret_cast<block_q4_0*>(page) + t * (HD / kQBlock);
      const float* src = row;
      std::vector<float> rotated;
      if (f == HalfFormat::q4_0_rot) {
        rotated.assign(row, row + HD);
        for (int h = 0; h < g.n_kv_heads; ++h) hadamard_normalized(rotated.data() + h * g.head_dim, g.head_dim);
        src = rotated.data();
      }
      for (int b = 0; b < HD / kQBlock; ++b) quantize_q4_0_block(src + b * kQBlock, &blocks[b]);
      return;
    }
  }
}

void dequantize_token(HalfFormat f, const PageGeometry& g, int slot, const std::uint8_t* page, float tensor_scale,
                      float* row) {
  const int HD = g.row_elems();
  const std::size_t t = static_cast<std::size_t>(slot);
  switch (f) {
    case HalfFormat::f32: std::memcpy(row, page + t * HD * 4, static_cast<std::size_t>(HD) * 4); return;
    case HalfFormat::f16: {
      const auto* in = reinterpret_cast<const std::uint16_t*>(page) + t * HD;
      for (int i = 0; i < HD; ++i) row[i] = f16_to_f32(in[i]);
      return;
    }
    case HalfFormat::bf16: {
      const auto* in = reinterpret_cast<const std::uint16_t*>(page) + t * HD;
      for (int i = 0; i < HD; ++i) row[i] = bf16_to_f32(in[i]);
      return;
    }
    case HalfFormat::int8: {
      const auto* codes = reinterpret_cast<const std::int8_t*>(page) + t * HD;
      const auto* scales = reinterpret_cast<const std::uint16_t*>(page + static_cast<std::size_t>(g.block_size) * HD) +
                           t * g.n_kv_heads;
      for (int h = 0; h < g.n_kv_heads; ++h) {
        const float s = f16_to_f32(scales[h]);
        for (int i = 0; i < g.head_dim; ++i)
          row[h * g.head_dim + i] = static_cast<float>(codes[h * g.head_dim + i]) * s;
      }
      return;
    }
    case HalfFormat::fp8_e4m3:
    case HalfFormat::fp8_e5m2: {
      const auto* in = page + t * HD;
      const bool e4 = f == HalfFormat::fp8_e4m3;
      for (int i = 0; i < HD; ++i) row[i] = (e4 ? fp8_e4m3_to_f32(in[i]) : fp8_e5m2_to_f32(in[i])) * tensor_scale;
      return;
    }
    case HalfFormat::q8_0: {
      const auto* blocks = reinterpret_cast<const block_q8_0*>(page) + t * (HD / kQBlock);
      for (int b = 0; b < HD / kQBlock; ++b) {
        const float d = f16_to_f32(blocks[b].d);
        for (int i = 0; i < kQBlock; ++i) row[b * kQBlock + i] = static_cast<float>(blocks[b].qs[i]) * d;
      }
      return;
    }
    case HalfFormat::q4_0:
    case HalfFormat::q4_0_rot: {
      const auto* blocks = reinterpret_cast<const block_q4_0*>(page) + t * (HD / kQBlock);
      for (int b = 0; b < HD / kQBlock; ++b) dequantize_q4_0_block(&blocks[b], row + b * kQBlock);
      if (f == HalfFormat::q4_0_rot)
        for (int h = 0; h < g.n_kv_heads; ++h) hadamard_normalized(row + h * g.head_dim, g.head_dim);
      return;
    }
  }
}

double envelope_bound(HalfFormat f, float x, float scale, bool clamped) {
  const double ax = std::fabs(static_cast<double>(x));
  const double s = std::fabs(static_cast<double>(scale));
  // FP slack: one binary32 rounding of the quotient x/s (<= 2^-24 * 127 code units) and one of the
  // product code*s (<= 2^-24 |x^|): 2^-20 * (s + |x|) covers both with margin.
  const double slack = 0x1p-20 * (s + ax);
  switch (f) {
    case HalfFormat::f32: return 0.0;
    case HalfFormat::f16: return std::max(0x1p-11 * ax, 0x1p-25);  // half ulp; subnormal spacing 2^-24
    case HalfFormat::bf16: return 0x1p-8 * ax;
    case HalfFormat::int8:
    case HalfFormat::q8_0: return s / 2 + slack;
    case HalfFormat::fp8_e4m3: return 0x1p-4 * ax + 0x1p-10 * s + slack;
    case HalfFormat::fp8_e5m2: return 0x1p-3 * ax + 0x1p-17 * s + slack;
    case HalfFormat::q4_0:
    case HalfFormat::q4_0_rot: return (clamped ? s : s / 2) + slack;
  }
  return 0.0;
}

}  // namespace kvgate
