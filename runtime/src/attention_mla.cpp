// Latent attention in the weight-absorbed form (attention_mla.hpp).
#include "kvgate/attention_mla.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kvgate/attention.hpp"

namespace kvgate {

namespace {

void check_mla_store(const PagedKvStore& store, SeqId s, const MlaDims& d, const MlaAttentionArgs& a) {
  const StoreConfig& c = store.config();
  if (c.layout != KvLayout::mla_latent)
    throw KvStoreError(std::string("mla_latent_attention: the store's layout is ") + name(c.layout) +
                       ", not mla_latent (the latent cache): read it with attention()");
  if (d.n_heads < 1 || d.nope < 0 || d.rope < 0 || d.v_dim < 1 || d.kv_lora < 1)
    throw KvStoreError("mla_latent_attention: MLA dimensions must be positive (heads " + std::to_string(d.n_heads) +
                       ", nope " + std::to_string(d.nope) + ", rope " + std::to_string(d.rope) + ", v " +
                       std::to_string(d.v_dim) + ", kv_lora " + std::to_string(d.kv_lora) + ")");
  if (c.head_dim != d.kv_lora || c.half_geometry(KvHalf::V).head_dim != d.rope)
    throw KvStoreError("mla_latent_attention: the store holds latent rows of " + std::to_string(c.head_dim) +
                       " and RoPE rows of " + std::to_string(c.half_geometry(KvHalf::V).head_dim) +
                       ", the model kv_lora_rank " + std::to_string(d.kv_lora) + " and qk_rope_head_dim " +
                       std::to_string(d.rope));
  if (!(a.softmax_scale > 0)) throw KvStoreError("mla_latent_attention: softmax_scale must be > 0 (the model's)");
  if (a.n_q < 1 || a.pos0 < 0 || a.pos0 + a.n_q > store.length(s))
    throw KvStoreError("mla_latent_attention: queries [" + std::to_string(a.pos0) + ", " +
                       std::to_string(a.pos0 + a.n_q) + ") reach past the sequence (length " +
                       std::to_string(store.length(s)) + ")");
}

// sum_j a[j] b[j] in eight interleaved partial sums (lane j % 8), then the lanes in order: a fixed
// association (the same result on every machine and build) that the compiler can vectorize without
// reassociating (the runtime is compiled without -ffast-math).
float dot8(const float* __restrict a, const float* __restrict b, int n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) lane[l] += a[j + l] * b[j + l];
  for (; j < n; ++j) lane[j % 8] += a[j] * b[j];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

}  // namespace

void mla_latent_attention(const PagedKvStore& store, SeqId s, int layer, const MlaDims& d, const MlaAttentionArgs& a,
                          const float* q, const float* wkv_b, float* out) {
  check_mla_store(store, s, d, a);
  const int H = d.n_heads, N = d.nope, R = d.rope, VD = d.v_dim, KL = d.kv_lora, QK = N + R;
  const std::size_t rows = static_cast<std::size_t>(a.n_q) * H;
  // 1. Absorb W_UK into the queries: q_lat[i][h] = W_UK_h^T q_nope[i][h].
  std::vector<float> q_lat(rows * KL, 0.0f);
  for (std::size_t r = 0; r < rows; ++r) {
    const int h = static_cast<int>(r % H);
    const float* qn = q + r * QK;
    float* ql = q_lat.data() + r * KL;
    for (int n = 0; n < N; ++n) {
      const float* wuk = wkv_b + (static_cast<std::size_t>(h) * (N + VD) + n) * KL;
      const float qv = qn[n];
      for (int j = 0; j < KL; ++j) ql[j] += qv * wuk[j];
    }
  }
  // 2. Online softmax over the latent, page by page (each page dequantized once for every row).
  std::vector<float> m(rows, -std::numeric_limits<float>::infinity()), l(rows, 0.0f), o_lat(rows * KL, 0.0f);
  const StoreConfig& sc = store.config();
  const int B = sc.block_size;
  const PageGeometry gk = sc.half_geometry(KvHalf::K), gv = sc.half_geometry(KvHalf::V);
  const auto table = store.block_table(s);
  const HalfFormat kf = store.half_format(KvHalf::K), vf = store.half_format(KvHalf::V);
  const auto ks = store.head_scales(layer, KvHalf::K), vs = store.head_scales(layer, KvHalf::V);
  std::vector<float> lat(static_cast<std::size_t>(B) * KL), rk(static_cast<std::size_t>(B) * std::max(R, 1));
  const int n_ctx = a.pos0 + a.n_q;
  for (int p = 0; p * B < n_ctx; ++p) {
    const int j0 = p * B, n = std::min(B, n_ctx - j0);
    const int block = table[static_cast<std::size_t>(p)];
    dequantize_rows(kf, gk, n, store.page(layer, KvHalf::K, block), ks, lat.data());
    if (R > 0) dequantize_rows(vf, gv, n, store.page(layer, KvHalf::V, block), vs, rk.data());
    if (const KvReadHook* hook = store.read_hook()) {
      hook->on_read(layer, KvHalf::K, j0, n, KL, lat.data());
      if (R > 0) hook->on_read(layer, KvHalf::V, j0, n, R, rk.data());
    }
    for (std::size_t r = 0; r < rows; ++r) {
      const int i = static_cast<int>(r / H);
      const int last = std::min(n, a.pos0 + i + 1 - j0);  // keys j0 .. j0 + last - 1 are visible
      if (last <= 0) continue;
      const float* ql = q_lat.data() + r * KL;
      const float* qr = q + r * QK + N;
      float* ol = o_lat.data() + r * KL;
      for (int t = 0; t < last; ++t) {
        const float* c = lat.data() + static_cast<std::size_t>(t) * KL;
        const float* kr = rk.data() + static_cast<std::size_t>(t) * R;
        float sdot = dot8(ql, c, KL);
        for (int j = 0; j < R; ++j) sdot += qr[j] * kr[j];
        const float sc_ = sdot * a.softmax_scale;
        if (sc_ > m[r]) {
          const float corr = std::exp(m[r] - sc_);  // exp(-inf) = 0 on the first key
          l[r] *= corr;
          for (int j = 0; j < KL; ++j) ol[j] *= corr;
          m[r] = sc_;
        }
        const float w = std::exp(sc_ - m[r]);
        l[r] += w;
        for (int j = 0; j < KL; ++j) ol[j] += w * c[j];
      }
    }
  }
  // 3. Normalize and apply W_UV per head: out[i][h][v] = W_UV_h[v] . o_lat / l.
  for (std::size_t r = 0; r < rows; ++r) {
    const int h = static_cast<int>(r % H);
    const float inv = 1.0f / l[r];
    const float* ol = o_lat.data() + r * KL;
    float* o = out + r * VD;
    for (int v = 0; v < VD; ++v) {
      const float* wuv = wkv_b + (static_cast<std::size_t>(h) * (N + VD) + N + v) * KL;
      o[v] = dot8(wuv, ol, KL) * inv;
    }
  }
}

}  // namespace kvgate
