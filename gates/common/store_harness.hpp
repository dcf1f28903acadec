// Shared plumbing of the store gates: build a one-layer store for a case, write K and V rows,
// read them back through the runtime's dequantized view.
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kvgate/format.hpp"
#include "kvgate/kv_store.hpp"
#include "populations.hpp"

namespace kvgate::gates {

// "first differing byte at page offset i: runtime 0x.. oracle 0x.." (or "none") for page diffs.
inline std::string first_diff(const std::uint8_t* a, const std::uint8_t* b, std::size_t n) {
  static const char* hex = "0123456789abcdef";
  for (std::size_t i = 0; i < n; ++i)
    if (a[i] != b[i])
      return "first differing byte at page offset " + std::to_string(i) + ": runtime 0x" + hex[a[i] >> 4] +
             hex[a[i] & 15] + " oracle 0x" + hex[b[i] >> 4] + hex[b[i] & 15];
  return "none";
}

// n values drawn from N(0, sd^2) by `g` (std::normal_distribution: the same sequence on one standard
// library; the gates that use it print their seed).
inline std::vector<float> normal_rows(std::mt19937& g, std::size_t n, float sd) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> x(n);
  for (float& v : x) v = d(g);
  return x;
}

// Per-tensor fp8 scales used by the gates: non-unit, unequal, not powers of two (anti-vacuity).
inline constexpr float kGateKScale = 0.37f;
inline constexpr float kGateVScale = 0.0213f;
// K and V magnitudes differ so their dynamic scales differ too.
inline constexpr float kGateKMagnitude = 1.0f;
inline constexpr float kGateVMagnitude = 0.05f;

struct StoredCase {
  std::vector<float> k, v;        // inputs [n_tokens][row_stride]
  std::vector<float> k_hat, v_hat;  // runtime dequant [n_tokens][H*D]
  std::string guards;             // empty when every guard region is intact
};

inline bool case_supported(const KvFormat& f, const StoreCase& c) {
  const PageGeometry g{c.block_size, c.n_kv_heads, c.head_dim};
  return supports(f.k, g).ok && supports(f.v, g).ok;
}

inline StoreConfig case_config(const KvFormat& f, const StoreCase& c, float k_scale = kGateKScale,
                               float v_scale = kGateVScale) {
  StoreConfig cfg;
  cfg.format = f;
  cfg.n_layers = 1;
  cfg.n_kv_heads = c.n_kv_heads;
  cfg.head_dim = c.head_dim;
  cfg.block_size = c.block_size;
  cfg.n_blocks = (c.n_tokens + c.block_size - 1) / c.block_size + 2;
  cfg.k_scale = {k_scale};
  cfg.v_scale = {v_scale};
  return cfg;
}

// Writes the case in two appends (so a page boundary is crossed by an append, not only by a page).
inline void write_case(PagedKvStore& store, SeqId s, const StoreCase& c, const std::vector<float>& k,
                       const std::vector<float>& v) {
  const int first = c.n_tokens / 2 + 1 > c.n_tokens ? c.n_tokens : c.n_tokens / 2 + 1;
  const std::size_t st = c.row_stride();
  store.extend(s, first);
  store.write(s, 0, 0, first, k.data(), st, v.data(), st);
  if (c.n_tokens > first) {
    store.extend(s, c.n_tokens - first);
    store.write(s, 0, first, c.n_tokens - first, k.data() + first * st, st, v.data() + first * st, st);
  }
}

inline StoredCase store_and_read(const KvFormat& f, const StoreCase& c, float k_scale = kGateKScale,
                                 float v_scale = kGateVScale, float k_mag = kGateKMagnitude,
                                 float v_mag = kGateVMagnitude) {
  StoredCase out;
  out.k = make_rows(c, k_mag, 1);
  out.v = make_rows(c, v_mag, 2);
  PagedKvStore store(case_config(f, c, k_scale, v_scale));
  const SeqId s = store.create_sequence();
  write_case(store, s, c, out.k, out.v);
  const std::size_t HD = static_cast<std::size_t>(c.n_kv_heads * c.head_dim);
  out.k_hat.resize(c.n_tokens * HD);
  out.v_hat.resize(c.n_tokens * HD);
  store.read(s, 0, KvHalf::K, 0, c.n_tokens, out.k_hat.data());
  store.read(s, 0, KvHalf::V, 0, c.n_tokens, out.v_hat.data());
  out.guards = store.check_guards();
  return out;
}

// The covering set of geometries: every head_dim x every KV-head count, block sizes rotating
// over {1, 3, 7, 16}, 2.5 pages of tokens (crossing page boundaries), every pattern.
inline std::vector<StoreCase> covering_cases(std::uint64_t seed0) {
  std::vector<StoreCase> cases;
  const int dims[] = {8, 64, 128, 256};
  const int heads[] = {1, 2, 4, 8};
  const int blocks[] = {1, 3, 7, 16};
  int i = 0;
  for (int d : dims)
    for (int h : heads)
      for (Pattern p : kAllPatterns) {
        const int b = blocks[i % 4];
        cases.push_back({b, h, d, 2 * b + b / 2 + 1, p, seed0 + static_cast<std::uint64_t>(i), (i % 3 == 0) ? 5 : 0});
        ++i;
      }
  return cases;
}

// Contiguous copy of rows [t0, t0 + n) of a case's strided input (make_rows): what one page holds.
inline std::vector<float> case_rows(const StoreCase& c, const std::vector<float>& x, int t0, int n) {
  const std::size_t HD = static_cast<std::size_t>(c.n_kv_heads * c.head_dim);
  std::vector<float> out(static_cast<std::size_t>(n) * HD);
  for (int t = 0; t < n; ++t)
    std::copy_n(x.data() + static_cast<std::size_t>(t0 + t) * c.row_stride(), HD, out.data() + t * HD);
  return out;
}

// The attention geometries the oracle-parity gates sweep: {KV heads, head_dim} in {4,8} {8,8} {1,64}
// {2,64} {8,128} {1,128} {2,256} {4,256} x GQA group 1, 2, 4, 8, the block size rotating over
// {1, 3, 7, 16}. Calls f(block_size, kv_heads, head_dim, group, i), i = 0, 1, ... in that order.
template <class F>
void for_each_attention_geometry(F&& f) {
  const int shapes[][2] = {{4, 8}, {8, 8}, {1, 64}, {2, 64}, {8, 128}, {1, 128}, {2, 256}, {4, 256}};  // {H, D}
  const int groups[] = {1, 2, 4, 8};
  const int blocks[] = {1, 3, 7, 16};
  int i = 0;
  for (const auto& sh : shapes)
    for (int g : groups) {
      f(blocks[i % 4], sh[0], sh[1], g, i);
      ++i;
    }
}

}  // namespace kvgate::gates
