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

}  // namespace kvgate::gates
