// The CPU side of the injected KV damage (kvgate/kv_damage.hpp): the read hook's step on the
// dequantized rows of one page.
#include "kvgate/kv_damage.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace kvgate {

namespace {

// x += amp * amax(cell) * u per element, cell = one KV head's row (amax before any change).
void perturb(float* row, int row_elems, int hd, double amp, int layer, int pos, std::uint64_t salt) {
  for (int c0 = 0; c0 < row_elems; c0 += hd) {
    const int c1 = std::min(row_elems, c0 + hd);
    float amax = 0;
    for (int i = c0; i < c1; ++i) amax = std::max(amax, std::fabs(row[i]));
    for (int i = c0; i < c1; ++i) row[i] = damage_noisy(row[i], amp, amax, layer, pos, i, salt);
  }
}

}  // namespace

void apply_kv_damage(const KvDamage& d, int head_dim, int layer, KvHalf h, int pos0, int n, int row_elems, float* rows) {
  if (h != damaged_half(d.kind)) return;
  const int hd = std::max(1, head_dim);
  const auto row = [&](int t) { return rows + static_cast<std::size_t>(t) * row_elems; };
  switch (d.kind) {
    case KvDamageKind::v_noise:
      for (int t = 0; t < n; ++t) perturb(row(t), row_elems, hd, damage_amplitude(d), layer, pos0 + t, damage_salt(d.kind));
      return;
    case KvDamageKind::v_repeat:
      // Slot t takes slot t-1's undamaged row (descending: t-1 is not changed yet); slot 0 keeps its own.
      for (int t = n - 1; t >= 1; --t)
        if (damage_repeats(pos0 + t, d.size)) std::copy(row(t - 1), row(t), row(t));
      return;
    case KvDamageKind::k_noise_span:
      for (int t = 0; t < n; ++t) {
        const int p = pos0 + t;
        if (p >= d.pos0 && p < d.pos1) perturb(row(t), row_elems, hd, damage_amplitude(d), layer, p, damage_salt(d.kind));
      }
      return;
  }
}

}  // namespace kvgate
