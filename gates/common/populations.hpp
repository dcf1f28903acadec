// Deterministic adversarial inputs for the store gates. Every case prints its parameters and seed
// on failure (describe()).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace kvgate::gates {

// splitmix64 + Box-Muller written out, so data is identical on every machine and library.
struct Rng {
  std::uint64_t s;
  explicit Rng(std::uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)
  float normal() {
    const double u1 = uniform() + 0x1p-54, u2 = uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

inline constexpr float kTinyMagnitude = 1e-6f;

enum class Pattern { gaussian, uniform, outliers, zero_cells, equal_cells, tie_extremes, tiny, mixed_magnitude };

inline const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::gaussian: return "gaussian";
    case Pattern::uniform: return "uniform";
    case Pattern::outliers: return "outliers";
    case Pattern::zero_cells: return "zero_cells";
    case Pattern::equal_cells: return "equal_cells";
    case Pattern::tie_extremes: return "tie_extremes";
    case Pattern::tiny: return "tiny";
    case Pattern::mixed_magnitude: return "mixed_magnitude";
  }
  return "?";
}

inline constexpr Pattern kAllPatterns[] = {Pattern::gaussian,     Pattern::uniform,      Pattern::outliers,
                                           Pattern::zero_cells,   Pattern::equal_cells,  Pattern::tie_extremes,
                                           Pattern::tiny,         Pattern::mixed_magnitude};

struct StoreCase {
  int block_size, n_kv_heads, head_dim, n_tokens;
  Pattern pattern;
  std::uint64_t seed;
  int row_pad;  // extra floats between rows: non-contiguous input
  std::string describe() const {
    return "block_size=" + std::to_string(block_size) + " kv_heads=" + std::to_string(n_kv_heads) +
           " head_dim=" + std::to_string(head_dim) + " tokens=" + std::to_string(n_tokens) +
           " pattern=" + pattern_name(pattern) + " seed=" + std::to_string(seed) + " row_pad=" + std::to_string(row_pad);
  }
  std::size_t row_stride() const { return static_cast<std::size_t>(n_kv_heads * head_dim + row_pad); }
};

// Rows [n_tokens][row_stride] (pad slots hold NaN: a store that reads them is caught at once).
inline std::vector<float> make_rows(const StoreCase& c, float magnitude, std::uint64_t salt) {
  Rng r(c.seed * 1315423911ull + salt);
  const int HD = c.n_kv_heads * c.head_dim;
  std::vector<float> x(static_cast<std::size_t>(c.n_tokens) * c.row_stride(), std::nanf(""));
  for (int t = 0; t < c.n_tokens; ++t) {
    float* row = x.data() + static_cast<std::size_t>(t) * c.row_stride();
    for (int i = 0; i < HD; ++i) {
      float v = 0;
      switch (c.pattern) {
        case Pattern::uniform: v = static_cast<float>(r.uniform() * 2 - 1); break;
        case Pattern::tiny: v = r.normal() * kTinyMagnitude; break;  // f16 scales in the subnormal range
        case Pattern::mixed_magnitude: v = r.normal() * std::ldexp(1.0f, static_cast<int>(r.next() % 12) - 6); break;
        default: v = r.normal(); break;
      }
      row[i] = v * magnitude;
    }
    for (int h = 0; h < c.n_kv_heads; ++h) {
      float* cell = row + h * c.head_dim;
      const int sel = (t * 7 + h * 3) % 4;  // a deterministic subset of cells gets the special shape
      if (c.pattern == Pattern::outliers && sel == 0) cell[(t + h) % c.head_dim] = magnitude * 40.0f * (t % 2 ? 1 : -1);
      if (c.pattern == Pattern::zero_cells && sel == 0)
        for (int i = 0; i < c.head_dim; ++i) cell[i] = 0.0f;
      if (c.pattern == Pattern::equal_cells && sel == 0)
        for (int i = 0; i < c.head_dim; ++i) cell[i] = magnitude * 0.75f;
    }
    if (c.pattern == Pattern::tie_extremes) {
      // +a then -a in each 32-block (lowest index wins the q4_0 tie) and values just past 7.5|d|
      // on the opposite side (the q4_0 clamp population).
      for (int b = 0; b + 32 <= HD; b += 32) {
        row[b + 3] = 2.0f * magnitude;
        row[b + 9] = -2.0f * magnitude;
        row[b + 17] = -1.95f * magnitude;
      }
    }
  }
  return x;
}


// --- directed populations --------------------------------------------------------------------------
// Inputs placed on the edges the random covering set reaches only by chance: the largest head
// dimensions and KV-head counts the runtime serves (head_dim up to 512, 16 KV heads), contexts one
// short of, at and one past a page (k*B - 1, k*B, k*B + 1) and past a CUDA decode split
// (kDirectedSplit, the split-K chunk), truncation to 0, to a page boundary and to the middle of a
// page. K and V always get different values (different salts and magnitudes) and, where a format
// has per-tensor scales, different non-unit power-of-two scales per layer.
inline constexpr int kDirectedSplit = 256;

struct DirectedGeometry {
  int n_kv_heads, head_dim;
};
inline constexpr DirectedGeometry kDirectedGeometries[] = {{16, 64}, {8, 128}, {4, 256}, {1, 512}, {16, 512}};
inline constexpr int kDirectedBlocks[] = {16, 32};

// Token counts for page size B: 1, B - 1, B, B + 1, 2B, 2B + 1.
inline std::vector<int> directed_token_counts(int B) { return {1, B - 1, B, B + 1, 2 * B, 2 * B + 1}; }
// Contexts at a decode split: k*split - 1, k*split, k*split + 1 for k = 1, 2.
inline std::vector<int> directed_split_contexts() {
  return {kDirectedSplit - 1, kDirectedSplit, kDirectedSplit + 1, 2 * kDirectedSplit - 1, 2 * kDirectedSplit,
          2 * kDirectedSplit + 1};
}
// Truncation points of a sequence of n tokens at page size B: 0, a page boundary, mid-page, and
// one either side of a boundary (only those < n).
inline std::vector<int> directed_truncations(int n, int B) {
  std::vector<int> out;
  for (int t : {2 * B + 1, 2 * B, 2 * B - 1, B + B / 2, B, 1, 0})
    if (t < n) out.push_back(t);
  return out;
}

// Per-layer power-of-two scales, non-unit, distinct per layer and between K and V (fp8 fixtures on
// more than one layer): a scale read from the wrong layer or the wrong half changes the codes.
inline std::vector<float> directed_k_scales(int n_layers) {
  const float s[] = {0.25f, 4.0f, 0.0625f, 2.0f};
  std::vector<float> out;
  for (int l = 0; l < n_layers; ++l) out.push_back(s[l % 4] * (l >= 4 ? 16.0f : 1.0f));
  return out;
}
inline std::vector<float> directed_v_scales(int n_layers) {
  const float s[] = {2.0f, 0.125f, 8.0f, 0.5f};
  std::vector<float> out;
  for (int l = 0; l < n_layers; ++l) out.push_back(s[l % 4] * (l >= 4 ? 16.0f : 1.0f));
  return out;
}

// The directed store cases: every directed geometry x block size x token count, gaussian data with a
// seed per case (K and V then differ by their salts, see make_rows).
inline std::vector<StoreCase> directed_cases(std::uint64_t seed0) {
  std::vector<StoreCase> out;
  std::uint64_t i = 0;
  for (const DirectedGeometry& g : kDirectedGeometries)
    for (int B : kDirectedBlocks)
      for (int n : directed_token_counts(B)) out.push_back({B, g.n_kv_heads, g.head_dim, n, Pattern::gaussian, seed0 + i++, 0});
  return out;
}

}  // namespace kvgate::gates
