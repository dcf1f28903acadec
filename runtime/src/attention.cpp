#include "kvgate/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kvgate {

void attention(const PagedKvStore& store, SeqId s, int layer, const AttentionArgs& a, const float* q, float* out) {
  const PageGeometry g = store.geometry();
  const int D = g.head_dim;
  const int H = g.n_kv_heads;
  const int B = g.block_size;
  const int HD = H * D;
  if (a.n_heads % H != 0)
    throw KvStoreError("attention: n_heads (" + std::to_string(a.n_heads) + ") must be a multiple of n_kv_heads (" +
                       std::to_string(H) + ")");
  const int group = a.n_heads / H;
  const int n_ctx = a.pos0 + a.n_q;
  if (n_ctx > store.length(s)) throw KvStoreError("attention: queries reach past the end of the sequence");
  const float scale = a.softmax_scale > 0 ? a.softmax_scale : 1.0f / std::sqrt(static_cast<float>(D));
  const auto table = store.block_table(s);
  const HalfFormat kf = store.half_format(KvHalf::K), vf = store.half_format(KvHalf::V);
  const float ks = store.tensor_scale(layer, KvHalf::K), vs = store.tensor_scale(layer, KvHalf::V);

  // Online-softmax state per (query, head).
  const std::size_t nqh = static_cast<std::size_t>(a.n_q) * a.n_heads;
  std::vector<float> m(nqh, -std::numeric_limits<float>::infinity()), l(nqh, 0.0f);
  std::vector<float> acc(nqh * D, 0.0f);
  std::vector<float> ktile(static_cast<std::size_t>(B) * HD), vtile(static_cast<std::size_t>(B) * HD);
  std::vector<float> score(static_cast<std::size_t>(B));

  const int n_pages = (n_ctx + B - 1) / B;
  for (int p = 0; p < n_pages; ++p) {
    const int t0 = p * B;
    const int nt = std::min(B, n_ctx - t0);
    const std::uint8_t* kp = store.page(layer, KvHalf::K, table[static_cast<std::size_t>(p)]);
    const std::uint8_t* vp = store.page(layer, KvHalf::V, table[static_cast<std::size_t>(p)]);
    for (int t = 0; t < nt; ++t) {
      dequantize_token(kf, g, t, kp, ks, ktile.data() + static_cast<std::size_t>(t) * HD);
      dequantize_token(vf, g, t, vp, vs, vtile.data() + static_cast<std::size_t>(t) * HD);
    }
    for (int i = 0; i < a.n_q; ++i) {
      const int last = a.pos0 + i;  // causal: keys [0, last]
      if (t0 > last) continue;
      const int ntq = std::min(nt, last - t0 + 1);
      for (int hq = 0; hq < a.n_heads; ++hq) {
        const int hk = hq / group;
        const float* qv = q + (static_cast<std::size_t>(i) * a.n_heads + hq) * D;
        const std::size_t st = static_cast<std::size_t>(i) * a.n_heads + hq;
        float mx = m[st];
        for (int t = 0; t < ntq; ++t) {
          const float* kv = ktile.data() + static_cast<std::size_t>(t) * HD + static_cast<std::size_t>(hk) * D;
          float dot = 0.0f;
          for (int d = 0; d < D; ++d) dot += qv[d] * kv[d];
          score[static_cast<std::size_t>(t)] = dot * scale;
          mx = std::max(mx, score[static_cast<std::size_t>(t)]);
        }
        const float corr = std::exp(m[st] - mx);  // exp(-inf) = 0 on the first page
        float* ac = acc.data() + st * D;
        float lsum = l[st] * corr;
        for (int d = 0; d < D; ++d) ac[d] *= corr;
        for (int t = 0; t < ntq; ++t) {
          const float w = std::exp(score[static_cast<std::size_t>(t)] - mx);
          lsum += w;
          const float* vv = vtile.data() + static_cast<std::size_t>(t) * HD + static_cast<std::size_t>(hk) * D;
          for (int d = 0; d < D; ++d) ac[d] += w * vv[d];
        }
        m[st] = mx;
        l[st] = lsum;
      }
    }
  }
  for (std::size_t st = 0; st < nqh; ++st) {
    const float inv = 1.0f / l[st];
    for (int d = 0; d < D; ++d) out[st * D + d] = acc[st * D + d] * inv;
  }
}

}  // namespace kvgate
