// Injected KV damage of known size (diagnostics only: the probes' sensitivity proves a probe can go
// red). One definition of the damage, used by both engines:
//  - the CPU engine applies it on every store read (KvReadHook -> apply_kv_damage on the dequantized
//    rows of a page);
//  - the CUDA engine applies it once to the stored rows right after they are written
//    (CudaEngineOptions::damage; float KV halves only), through the same per-element functions below,
//    compiled for the device.
// Families: v_noise: every V element x += size * envelope * amax(cell) * u; v_repeat: a fraction
// `size` of the V rows (chosen by position, the same in every layer) replaced by the previous row of
// their page (the first slot of a page keeps its own); k_noise_span: the K elements of positions
// [pos0, pos1) x += size * amax(cell) * u. u is a deterministic uniform in [-1, 1) of (layer,
// position, element index in the row, salt); a cell is one KV head's row.
#pragma once
#include <cstdint>

#include "kvgate/kv_store.hpp"

#if defined(__CUDACC__)
#define KVGATE_HOST_DEVICE __host__ __device__
#else
#define KVGATE_HOST_DEVICE
#endif

namespace kvgate {

enum class KvDamageKind : std::uint8_t { v_noise, v_repeat, k_noise_span };
struct KvDamage {
  KvDamageKind kind = KvDamageKind::v_noise;
  double size = 0;
  double envelope = 0;  // v_noise: the relative envelope the size multiplies
  int pos0 = 0, pos1 = 0;
};

// The half a family damages.
KVGATE_HOST_DEVICE inline KvHalf damaged_half(KvDamageKind k) { return k == KvDamageKind::k_noise_span ? KvHalf::K : KvHalf::V; }
// The noise families' amplitude relative to amax(cell): size * envelope (v_noise), size (k_noise_span).
KVGATE_HOST_DEVICE inline double damage_amplitude(const KvDamage& d) { return d.kind == KvDamageKind::v_noise ? d.size * d.envelope : d.size; }
// The noise salts: V noise 1, K noise 2 (v_repeat's row choice uses its own constants).
KVGATE_HOST_DEVICE inline std::uint64_t damage_salt(KvDamageKind k) { return k == KvDamageKind::k_noise_span ? 2 : 1; }

// Deterministic uniform in [-1, 1) from (layer, position, element, salt): splitmix64. Exact in
// binary64 on host and device (53-bit integer times 2^-52, minus 1).
KVGATE_HOST_DEVICE inline double damage_unit_noise(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t salt) {
  std::uint64_t z = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ (c + salt) * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1p-52 - 1.0;
}
// v_repeat: whether position `pos` takes the previous row of its page (a fraction `size` of the positions).
KVGATE_HOST_DEVICE inline bool damage_repeats(int pos, double size) {
  return 0.5 * (damage_unit_noise(static_cast<std::uint64_t>(pos), 7, 11, 3) + 1.0) < size;
}
// One damaged element: x + float(amp * amax * u) in binary32 (the product in binary64, rounded once).
KVGATE_HOST_DEVICE inline float damage_noisy(float x, double amp, float amax, int layer, int pos, int elem,
                                             std::uint64_t salt) {
  const double u = damage_unit_noise(static_cast<std::uint64_t>(layer), static_cast<std::uint64_t>(pos),
                                     static_cast<std::uint64_t>(elem), salt);
  return x + static_cast<float>(amp * static_cast<double>(amax) * u);
}

// The damage on `n` dequantized rows [n][row_elems] of one page of `layer`, positions [pos0, pos0 + n)
// (pos0 the page's first position), cells of `head_dim` elements (the CPU read hook's step).
void apply_kv_damage(const KvDamage& d, int head_dim, int layer, KvHalf h, int pos0, int n, int row_elems, float* rows);

}  // namespace kvgate
