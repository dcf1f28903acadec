// Static fp8 scales per KV head for the gates (docs/FORMATS.md "Static scales per KV head"): distinct
// per head, per layer and between K and V, at ratios that are not powers of two (a fixture where
// the heads share a scale, or differ by 2^k only, cannot catch a head-stride or a K/V mix-up), and
// a multi-layer store filled with rows whose head h is sized to its own scale (x / s_h normal).
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvgate/engine.hpp"
#include "kvgate/kv_store.hpp"
#include "store_harness.hpp"

namespace kvgate::gates {

// [n_layers * n_kv_heads], layer-major: K = 0.37 (1 + 0.29 h)(1 + 0.13 l), V = 0.0213 (1 + 0.41 h)(1 + 0.17 l).
inline std::vector<float> gate_head_scales(int n_layers, int n_kv_heads, KvHalf half) {
  std::vector<float> s;
  for (int l = 0; l < n_layers; ++l)
    for (int h = 0; h < n_kv_heads; ++h)
      s.push_back(half == KvHalf::K ? static_cast<float>(0.37 * (1 + 0.29 * h) * (1 + 0.13 * l))
                                    : static_cast<float>(0.0213 * (1 + 0.41 * h) * (1 + 0.17 * l)));
  return s;
}

// The gates' scales on an fp8 e4m3 half of `f` (the engine's k_scale / v_scale for a model of
// n_layers x n_kv_heads); other formats keep their options' scales.
inline void set_gate_head_scales_if_fp8(EngineOptions& o, const KvFormat& f, int n_layers, int n_kv_heads) {
  if (f.k != HalfFormat::fp8_e4m3 && f.v != HalfFormat::fp8_e4m3) return;
  o.k_scale = gate_head_scales(n_layers, n_kv_heads, KvHalf::K);
  o.v_scale = gate_head_scales(n_layers, n_kv_heads, KvHalf::V);
}

struct HeadScaledStore {
  std::unique_ptr<PagedKvStore> store;
  SeqId seq = 0;
  int n = 0;
  std::vector<std::vector<float>> k, v;  // per layer, [n][H*D] rows as written
};

// A store of `fmt` with n_layers x n_kv_heads per-head scales `ks`/`vs` ([L*H]) holding n tokens of
// rows whose head h of layer l has |x| in [0.5, 60] * s(l, h) (normal and unsaturated in e4m3 and e5m2).
inline HeadScaledStore fill_head_scaled(const KvFormat& fmt, int n_layers, int H, int D, int B, int n,
                                        const std::vector<float>& ks, const std::vector<float>& vs, std::uint64_t seed) {
  StoreConfig cfg;
  cfg.format = fmt;
  cfg.n_layers = n_layers;
  cfg.n_kv_heads = H;
  cfg.head_dim = D;
  cfg.block_size = B;
  cfg.n_blocks = n / B + 3;
  cfg.k_scale = ks;
  cfg.v_scale = vs;
  HeadScaledStore out;
  out.store = std::make_unique<PagedKvStore>(cfg);
  out.seq = out.store->create_sequence();
  out.n = n;
  out.store->extend(out.seq, n);
  Rng r(seed);
  const std::size_t HD = static_cast<std::size_t>(H) * D;
  for (int l = 0; l < n_layers; ++l) {
    std::vector<float> k(static_cast<std::size_t>(n) * HD), v(k.size());
    for (std::size_t i = 0; i < k.size(); ++i) {
      const std::size_t h = (i % HD) / static_cast<std::size_t>(D), at = static_cast<std::size_t>(l) * H + h;
      const double mk = (0.5 + 59.5 * r.uniform()) * (r.next() & 1 ? 1 : -1), mv = (0.5 + 59.5 * r.uniform()) * (r.next() & 1 ? 1 : -1);
      k[i] = static_cast<float>(mk * ks[at]);
      v[i] = static_cast<float>(mv * vs[at]);
    }
    out.store->write(out.seq, l, 0, n, k.data(), HD, v.data(), HD);
    out.k.push_back(std::move(k));
    out.v.push_back(std::move(v));
  }
  return out;
}

}  // namespace kvgate::gates
