// The CPU forward pass, written to read like the math (llama2.c run.c forward(), batched over a
// chunk of tokens). Hot loops keep fixed-width lane accumulators so the compiler vectorizes them
// without -ffast-math; the kernels are compiled for AVX2 and baseline x86-64 and picked at run time
// (no FMA contraction in either, so both give bit-identical results).
#include "forward_cpu.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "kvgate/attention.hpp"
#include "kvgate/attention_mla.hpp"
#include "kvgate/engine.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(KVGATE_NO_TARGET_CLONES)
#define KVGATE_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define KVGATE_MULTIVERSION
#endif

// v8f values never cross a non-inlined call boundary between differently compiled code.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace kvgate::detail {

namespace {

// GCC vector types: each clone lowers them to its own ISA with the same lane arithmetic.
typedef float v8f __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));

__attribute__((always_inline)) inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Lanes (16 = two vectors, then one vector for 8 more) reduced as a fixed tree, then the scalar
// tail: the summation order of every dot product in the forward pass.
__attribute__((always_inline)) inline float reduce16(v8f lo, v8f hi, float tail) {
  const v8f v = lo + hi;
  const v8f h = v + __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
  return ((h[0] + h[1]) + (h[2] + h[3])) + tail;
}

__attribute__((always_inline)) inline float dot(const float* __restrict a, const float* __restrict b, int n) {
  v8f lo = {}, hi = {};
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    lo += load8(a + i) * load8(b + i);
    hi += load8(a + i + 8) * load8(b + i + 8);
  }
  if (i + 8 <= n) {
    lo += load8(a + i) * load8(b + i);
    i += 8;
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return reduce16(lo, hi, tail);
}

// Four rows of W against one x (x loaded once), each with dot()'s summation order.
__attribute__((always_inline)) inline void dot4(const float* __restrict w0, const float* __restrict w1,
                                                const float* __restrict w2, const float* __restrict w3,
                                                const float* __restrict x, int n, float out[4]) {
  v8f l0 = {}, h0 = {}, l1 = {}, h1 = {}, l2 = {}, h2 = {}, l3 = {}, h3 = {};
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const v8f xl = load8(x + i), xh = load8(x + i + 8);
    l0 += load8(w0 + i) * xl;
    h0 += load8(w0 + i + 8) * xh;
    l1 += load8(w1 + i) * xl;
    h1 += load8(w1 + i + 8) * xh;
    l2 += load8(w2 + i) * xl;
    h2 += load8(w2 + i + 8) * xh;
    l3 += load8(w3 + i) * xl;
    h3 += load8(w3 + i + 8) * xh;
  }
  if (i + 8 <= n) {
    const v8f xl = load8(x + i);
    l0 += load8(w0 + i) * xl;
    l1 += load8(w1 + i) * xl;
    l2 += load8(w2 + i) * xl;
    l3 += load8(w3 + i) * xl;
    i += 8;
  }
  float t0 = 0.0f, t1 = 0.0f, t2 = 0.0f, t3 = 0.0f;
  for (; i < n; ++i) {
    t0 += w0[i] * x[i];
    t1 += w1[i] * x[i];
    t2 += w2[i] * x[i];
    t3 += w3[i] * x[i];
  }
  out[0] = reduce16(l0, h0, t0);
  out[1] = reduce16(l1, h1, t1);
  out[2] = reduce16(l2, h2, t2);
  out[3] = reduce16(l3, h3, t3);
}

KVGATE_MULTIVERSION
void matmul_rows(float* __restrict out, const float* __restrict x, const float* __restrict W,
                 const float* __restrict bias, int T, int n_in, int n_out, bool accumulate, int r0, int r1) {
  int i = r0;
  for (; i + 4 <= r1; i += 4) {
    const float* w = W + static_cast<std::size_t>(i) * n_in;
    for (int t = 0; t < T; ++t) {
      float r[4];
      dot4(w, w + n_in, w + 2 * static_cast<std::size_t>(n_in), w + 3 * static_cast<std::size_t>(n_in),
           x + static_cast<std::size_t>(t) * n_in, n_in, r);
      float* o = out + static_cast<std::size_t>(t) * n_out + i;
      for (int k = 0; k < 4; ++k) {
        const float v = bias ? r[k] + bias[i + k] : r[k];
        o[k] = accumulate ? o[k] + v : v;
      }
    }
  }
  for (; i < r1; ++i) {
    const float* w = W + static_cast<std::size_t>(i) * n_in;
    for (int t = 0; t < T; ++t) {
      float v = dot(w, x + static_cast<std::size_t>(t) * n_in, n_in);
      if (bias) v += bias[i];
      float& o = out[static_cast<std::size_t>(t) * n_out + i];
      o = accumulate ? o + v : v;
    }
  }
}

KVGATE_MULTIVERSION
void rmsnorm_impl(float* o, const float* x, const float* w, int n, float eps) {
  float ss = dot(x, x, n);
  ss /= static_cast<float>(n);
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  for (int j = 0; j < n; ++j) o[j] = w[j] * (ss * x[j]);
}

KVGATE_MULTIVERSION
void swiglu(float* __restrict h, const float* __restrict up, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    float val = h[i];
    val *= 1.0f / (1.0f + std::exp(-val));  // silu
    h[i] = val * up[i];
  }
}

// GeGLU (Gemma): gelu_tanh(gate) * up, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// as PyTorch's gelu(approximate="tanh").
KVGATE_MULTIVERSION
void geglu(float* __restrict h, const float* __restrict up, std::size_t n) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;  // sqrt(2/pi)
  for (std::size_t i = 0; i < n; ++i) {
    const float x = h[i];
    const float inner = k0 * (x + k1 * x * x * x);
    h[i] = 0.5f * x * (1.0f + std::tanh(inner)) * up[i];
  }
}

}  // namespace

void matmul(ThreadPool& pool, float* out, const float* x, WeightView W, const float* bias, int T, int n_in, int n_out,
            bool accumulate) {
  if (W.n < static_cast<std::size_t>(n_out) * static_cast<std::size_t>(n_in))
    throw std::logic_error("matmul: a weight of " + std::to_string(W.n) + " elements read as [" +
                           std::to_string(n_out) + "][" + std::to_string(n_in) + "]");
  // Below ~32K multiply-adds per thread the dispatch costs more than it saves.
  const long long work_per_row = static_cast<long long>(n_in) * T;
  const int min_rows = static_cast<int>(std::max<long long>(4, 32768 / std::max<long long>(1, work_per_row)));
  if (W.dtype == WeightDtype::f32) {
    const float* w = W.f32();
    pool.parallel_for(
        n_out,
        [&](int r0, int r1) { matmul_rows(out, x, w, bias, T, n_in, n_out, accumulate, r0, r1); },
        min_rows);
    return;
  }
  // 16-bit weights: each range of rows is converted (exactly) into a per-thread FP32 buffer of at
  // most kRows rows, then multiplied by the same matmul_rows, so the sums are bit for bit the FP32
  // path's (matmul_rows groups rows by 4 from the range's start: ranges stay multiples of 4 apart).
  constexpr int kRows = 64;
  pool.parallel_for(
      n_out,
      [&](int r0, int r1) {
        thread_local std::vector<float> buf;
        const std::size_t cap = static_cast<std::size_t>(kRows) * static_cast<std::size_t>(n_in);
        if (buf.size() < cap) buf.resize(cap);
        for (int a = r0; a < r1; a += kRows) {
          const int b = std::min(r1, a + kRows);
          W.to_f32(static_cast<std::size_t>(a) * n_in, static_cast<std::size_t>(b - a) * n_in, buf.data());
          // Rows [a, b) of W are rows [0, b - a) of buf: shift the output and bias to match.
          float* o = out + a;
          matmul_rows(o, x, buf.data(), bias ? bias + a : nullptr, T, n_in, n_out, accumulate, 0, b - a);
        }
      },
      min_rows);
}

void rmsnorm(float* o, const float* x, const float* w, int n, float eps) { rmsnorm_impl(o, x, w, n, eps); }

CpuForward::CpuForward(const Model& model, int max_chunk, ThreadPool& pool)
    : m_(model), c_(model.config), max_chunk_(std::max(1, max_chunk)), pool_(pool) {
  const int half = c_.head_dim / 2;
  {  // plain RoPE: as run.c, 1 / theta^(2i / head_dim) in binary32 (rope.cpp); variants: rope.hpp
    RopeFrequencies f = rope_frequencies(c_.rope, c_.rope_theta, rope_width(), 0);
    freq_ = std::move(f.inv_freq);
    rope_scale_ = f.attention_scaling;
    rot_ = rope_rotary_dim(c_.rope, rope_width());
    if (c_.has_rope_local) {
      RopeFrequencies fl = rope_frequencies(c_.rope_local, c_.rope_theta, c_.head_dim, 0);
      freq_l_ = std::move(fl.inv_freq);
      rope_scale_l_ = fl.attention_scaling;
      rot_l_ = rope_rotary_dim(c_.rope_local, c_.head_dim);
    }
  }
  const std::size_t C = static_cast<std::size_t>(max_chunk_);
  x_.resize(C * c_.dim);
  xb_.resize(C * std::max(c_.dim, c_.q_dim()));
  xb2_.resize(C * c_.dim);
  q_.resize(C * c_.q_dim());
  k_.resize(C * c_.kv_dim());
  v_.resize(C * c_.kv_dim());
  att_.resize(C * c_.q_dim());
  hb_.resize(C * c_.hidden_dim);
  hb2_.resize(C * c_.hidden_dim);
  cos_.resize(C * half);
  sin_.resize(C * half);
  if (c_.mla.any()) {
    const MlaConfig& a = c_.mla;
    const std::size_t H = static_cast<std::size_t>(c_.n_heads);
    qa_.resize(C * static_cast<std::size_t>(std::max(1, a.q_lora_rank)));
    ckv_.resize(C * static_cast<std::size_t>(a.kv_lora_rank + a.rope_dim));
    lat_.resize(C * static_cast<std::size_t>(a.kv_lora_rank));
    kvb_.resize(C * H * static_cast<std::size_t>(a.nope_dim + a.v_dim));
    attc_.resize(C * H * static_cast<std::size_t>(a.v_dim));
  }
  if (c_.moe.any()) {
    const std::size_t E = static_cast<std::size_t>(c_.moe.n_experts), K = static_cast<std::size_t>(c_.moe.top_k),
                      I = static_cast<std::size_t>(std::max(c_.moe.expert_dim, c_.moe.shared_dim));
    rl_.resize(C * E);
    rw_.resize(C * K);
    rsel_.resize(C * K);
    grow_.resize(C);
    xg_.resize(C * c_.dim);
    hg_.resize(C * I);
    hg2_.resize(C * I);
    yg_.resize(C * c_.dim);
    moe_.resize(C * c_.dim);
  }
  if (c_.has_rope_local) {
    cos_l_.resize(C * half);
    sin_l_.resize(C * half);
  }
}

// Dynamic NTK and longrope depend on the sequence length: as transformers' cached generation,
// the length is the longest position reached + 1, i.e. this chunk's last position + 1. A prompt
// prefilled in one chunk of T tokens therefore rotates every position with the scaling for T (as
// transformers' single forward over T tokens); a chunked prefill rotates each chunk with the
// scaling for its own end, and the K rows already stored keep the rotation they were written with
// (as transformers' KV cache keeps them when the length grows).
void CpuForward::rope_angles(const RopeConfig& r, std::vector<float>& freq, float& scaling, int pos0, int T, float* cs,
                             float* sn) const {
  if (r.length_dependent()) {
    RopeFrequencies f = rope_frequencies(r, c_.rope_theta, rope_width(), pos0 + T);
    freq = std::move(f.inv_freq);
    scaling = f.attention_scaling;
  }
  const int half = c_.head_dim / 2, n = static_cast<int>(freq.size());
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < n; ++i) {
      const float val = static_cast<float>(pos0 + t) * freq[static_cast<std::size_t>(i)];
      float fc = std::cos(val), fs = std::sin(val);
      if (scaling != 1.0f) fc *= scaling, fs *= scaling;  // yarn / longrope attention factor
      cs[static_cast<std::size_t>(t) * half + i] = fc;
      sn[static_cast<std::size_t>(t) * half + i] = fs;
    }
}

void CpuForward::rope(float* v, int T, int n_heads, bool local) const {
  const int D = c_.head_dim, half = D / 2;
  const int rh = (local ? rot_l_ : rot_) / 2;  // rotated pairs; dims past rotary_dim pass through
  const float* cs = local ? cos_l_.data() : cos_.data();
  const float* sn = local ? sin_l_.data() : sin_.data();
  for (int t = 0; t < T; ++t) {
    const float* fc = cs + static_cast<std::size_t>(t) * half;
    const float* fs = sn + static_cast<std::size_t>(t) * half;
    for (int h = 0; h < n_heads; ++h) {
      float* x = v + (static_cast<std::size_t>(t) * n_heads + h) * D;
      if (c_.rope_style == RopeStyle::interleaved) {
        for (int i = 0; i < rh; ++i) {  // adjacent pairs (x[2i], x[2i+1])
          const float v0 = x[2 * i], v1 = x[2 * i + 1];
          x[2 * i] = v0 * fc[i] - v1 * fs[i];
          x[2 * i + 1] = v0 * fs[i] + v1 * fc[i];
        }
      } else {
        for (int i = 0; i < rh; ++i) {  // rotate-half pairs (x[i], x[i + rotary_dim/2])
          const float v0 = x[i], v1 = x[i + rh];
          x[i] = v0 * fc[i] - v1 * fs[i];
          x[i + rh] = v1 * fc[i] + v0 * fs[i];
        }
      }
    }
  }
}

// Causal attention of the chunk. Queries are independent, so a long chunk is split into one
// contiguous query range per thread, cut where the causal work (keys per query) is balanced. The
// per-query arithmetic is the same whatever the split. A streamed store is read from one thread
// (its page lookups move the resident window).
void CpuForward::attend(const PagedKvStore& store, SeqId s, int layer, int store_layer, int T, int pos0) {
  const int qd = c_.q_dim();
  AttentionArgs aa;
  aa.n_heads = c_.n_heads;
  aa.window = c_.window(layer);        // sliding layers read only their window
  aa.softcap = c_.attn_softcap;        // Gemma 2 attention-logit soft-cap
  aa.softmax_scale = c_.attn_scale;    // Gemma: query_pre_attn_scalar^-0.5 (0: 1/sqrt(head_dim))
  for_query_parts(T, pos0, aa.window, store.streaming(), [&](int i0, int n) {
    AttentionArgs part = aa;
    part.n_q = n;
    part.pos0 = pos0 + i0;
    attention(store, s, store_layer, part, q_.data() + static_cast<std::size_t>(i0) * qd,
              att_.data() + static_cast<std::size_t>(i0) * qd);
  });
}

void CpuForward::for_query_parts(int T, int pos0, int window, bool serial, const std::function<void(int, int)>& run) {
  const int parts = std::min(pool_.size(), T / 8);
  if (parts <= 1 || serial) {
    run(0, T);
    return;
  }
  int bounds[65];
  const int P = std::min(parts, 64);
  // Keys read by queries [0, i): sum of (pos0 + j + 1), each capped at the window on a sliding layer.
  const double W = window > 0 ? static_cast<double>(window) : 0.0;
  auto work = [&](int i) {
    // The first c queries see all their keys (pos0 + j + 1 <= W), the rest W each.
    const double c = W == 0 ? i : std::clamp(W - pos0, 0.0, static_cast<double>(i));
    return c * pos0 + 0.5 * c * (c + 1) + (i - c) * W;
  };
  const double total = work(T);
  bounds[0] = 0;
  for (int k = 1; k < P; ++k) {
    const double target = total * k / P;
    int i = bounds[k - 1];
    while (i < T && work(i) < target) ++i;
    bounds[k] = i;
  }
  bounds[P] = T;
  pool_.parallel_for(P, [&](int b, int e) {
    for (int k = b; k < e; ++k)
      if (bounds[k + 1] > bounds[k]) run(bounds[k], bounds[k + 1] - bounds[k]);
  });
}

void CpuForward::forward(PagedKvStore& store, SeqId s, const int* tokens, int T, float* logits, bool all_logits) {
  check_chunk(tokens, T);
  const int pos0 = store.extend(s, T);
  embed(tokens, T, pos0);
  run_layers(store, s, 0, c_.n_layers, T, pos0);
  head(T, logits, all_logits);
}

void CpuForward::check_chunk(const int* tokens, int T) const {
  if (T < 1 || T > max_chunk_) throw EngineError("forward: chunk of " + std::to_string(T) + " tokens (max " +
                                                 std::to_string(max_chunk_) + ")");
  for (int t = 0; t < T; ++t)
    if (tokens[t] < 0 || tokens[t] >= c_.vocab_size)
      throw EngineError("token id " + std::to_string(tokens[t]) + " is outside the vocabulary [0, " +
                        std::to_string(c_.vocab_size) + ")");
}

void CpuForward::prepare_chunk(int pos0, int T) {
  const ModelConfig& c = c_;
  rope_angles(c.rope, freq_, rope_scale_, pos0, T, cos_.data(), sin_.data());
  if (c.has_rope_local) rope_angles(c.rope_local, freq_l_, rope_scale_l_, pos0, T, cos_l_.data(), sin_l_.data());
}

void CpuForward::embed(const int* tokens, int T, int pos0) {
  const ModelConfig& c = c_;
  const int dim = c.dim;
  // Token embeddings -> residual stream x[T][dim] (Gemma: times sqrt(hidden)).
  for (int t = 0; t < T; ++t)
    m_.weights.tok_embeddings.view().to_f32(static_cast<std::size_t>(tokens[t]) * dim, static_cast<std::size_t>(dim),
                                            x_.data() + static_cast<std::size_t>(t) * dim);
  if (c.embed_scale > 0)
    for (std::size_t i = 0; i < static_cast<std::size_t>(T) * dim; ++i) x_[i] *= c.embed_scale;
  prepare_chunk(pos0, T);
}

void CpuForward::receive(const float* x, int T, int pos0) {
  if (T < 1 || T > max_chunk_) throw EngineError("forward: chunk of " + std::to_string(T) + " tokens (max " +
                                                 std::to_string(max_chunk_) + ")");
  std::memcpy(x_.data(), x, sizeof(float) * static_cast<std::size_t>(T) * static_cast<std::size_t>(c_.dim));
  prepare_chunk(pos0, T);
}

void CpuForward::run_layers(PagedKvStore& store, SeqId s, int l0, int l1, int T, int pos0) {
  const ModelConfig& c = c_;
  const int dim = c.dim;
  for (int l = l0; l < l1; ++l) {
    const int sl = l - l0;  // the layer's slot in this store
    const LayerWeights& L = m_.weights.layers[static_cast<std::size_t>(l)];
    if (c.mla.any()) {
      for (int t = 0; t < T; ++t)
        rmsnorm(xb_.data() + static_cast<std::size_t>(t) * dim, x_.data() + static_cast<std::size_t>(t) * dim,
                L.attn_norm.data(), dim, c.rms_eps);
      mla_attention(store, s, L, l, sl, T, pos0);
    } else {
      attention_block(store, s, l, sl, T, pos0);
      add_block(c.post_norms ? L.post_attn_norm.data() : nullptr, T);
    }
    if (c.moe.is_moe(l)) {  // routed experts: x += sum_e p_e expert_e(rmsnorm(x))
      for (int t = 0; t < T; ++t)
        rmsnorm(xb_.data() + static_cast<std::size_t>(t) * dim, x_.data() + static_cast<std::size_t>(t) * dim,
                L.ffn_norm.data(), dim, c.rms_eps);
      moe_ffn(L, T);
      for (std::size_t i = 0; i < static_cast<std::size_t>(T) * dim; ++i) x_[i] += moe_[i];
      continue;
    }
    ffn_block(l, T);
    add_block(c.post_norms ? L.post_ffn_norm.data() : nullptr, T);
    check_finite(l, T, pos0);
  }
}

void CpuForward::attention_block(PagedKvStore& store, SeqId s, int l, int sl, int T, int pos0) {
  const ModelConfig& c = c_;
  const LayerWeights& L = m_.weights.layers[static_cast<std::size_t>(l)];
  const int dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hd = c.head_dim;
  // xb = rmsnorm(x); q, k, v = xb Wq, xb Wk, xb Wv (+ bias).
  for (int t = 0; t < T; ++t)
    rmsnorm(xb_.data() + static_cast<std::size_t>(t) * dim, x_.data() + static_cast<std::size_t>(t) * dim,
            L.attn_norm.data(), dim, c.rms_eps);
  matmul(pool_, q_.data(), xb_.data(), L.wq, c.qkv_bias ? L.bq.data() : nullptr, T, dim, qd, false);
  matmul(pool_, k_.data(), xb_.data(), L.wk, c.qkv_bias ? L.bk.data() : nullptr, T, dim, kvd, false);
  matmul(pool_, v_.data(), xb_.data(), L.wv, c.qkv_bias ? L.bv.data() : nullptr, T, dim, kvd, false);
  if (c.qk_norm) {  // qwen3: RMSNorm over each head of q and k, before RoPE
    for (int i = 0; i < T * c.n_heads; ++i)
      rmsnorm(q_.data() + static_cast<std::size_t>(i) * hd, q_.data() + static_cast<std::size_t>(i) * hd,
              L.q_norm.data(), hd, c.rms_eps);
    for (int i = 0; i < T * c.n_kv_heads; ++i)
      rmsnorm(k_.data() + static_cast<std::size_t>(i) * hd, k_.data() + static_cast<std::size_t>(i) * hd,
              L.k_norm.data(), hd, c.rms_eps);
  }
  const bool local_rope = layer_uses_local_rope(c, l);
  rope(q_.data(), T, c.n_heads, local_rope);
  rope(k_.data(), T, c.n_kv_heads, local_rope);
  // K/V rows go through the KV format; attention reads them back from the store.
  store.write(s, sl, pos0, T, k_.data(), static_cast<std::size_t>(kvd), v_.data(), static_cast<std::size_t>(kvd));
  attend(store, s, l, sl, T, pos0);
  // The block's output: att Wo.
  matmul(pool_, xb2_.data(), att_.data(), L.wo, nullptr, T, qd, dim, false);
}

void CpuForward::ffn_block(int l, int T) {
  const ModelConfig& c = c_;
  const LayerWeights& L = m_.weights.layers[static_cast<std::size_t>(l)];
  const int dim = c.dim, hid = c.hidden_dim;
  // xb = rmsnorm(x); the block's output: W2 (act(xb W1) * (xb W3)); act = SiLU, or the tanh GELU (Gemma).
  for (int t = 0; t < T; ++t)
    rmsnorm(xb_.data() + static_cast<std::size_t>(t) * dim, x_.data() + static_cast<std::size_t>(t) * dim,
            L.ffn_norm.data(), dim, c.rms_eps);
  matmul(pool_, hb_.data(), xb_.data(), L.w1, nullptr, T, dim, hid, false);
  matmul(pool_, hb2_.data(), xb_.data(), L.w3, nullptr, T, dim, hid, false);
  if (c.ffn_act == FfnAct::gelu_tanh) geglu(hb_.data(), hb2_.data(), static_cast<std::size_t>(T) * hid);
  else swiglu(hb_.data(), hb2_.data(), static_cast<std::size_t>(T) * hid);
  matmul(pool_, xb2_.data(), hb_.data(), L.w2, nullptr, T, hid, dim, false);
}

void CpuForward::add_block(const float* post_norm, int T) {
  // x += y (Gemma: x += rmsnorm_post(y)); the same single rounding as a matmul accumulating into x.
  if (post_norm) {
    add_normed(post_norm, T);
    return;
  }
  for (std::size_t i = 0; i < static_cast<std::size_t>(T) * c_.dim; ++i) x_[i] += xb2_[i];
}

void CpuForward::set_residual(const float* x, int T) {
  std::memcpy(x_.data(), x, sizeof(float) * static_cast<std::size_t>(T) * static_cast<std::size_t>(c_.dim));
}

void CpuForward::check_finite(int l, int T, int pos0) const {
  // NaN/inf in weights or KV would otherwise reach the logits (and greedy argmax gives token 0):
  // the first layer whose output is not finite is named, O(T*dim) per layer.
  const int dim = c_.dim;
  for (std::size_t i = 0; i < static_cast<std::size_t>(T) * dim; ++i)
    if (!std::isfinite(x_[i]))
      throw EngineError("forward: layer " + std::to_string(l) + " produced a non-finite value (" +
                        std::to_string(x_[i]) + ") at position " + std::to_string(pos0 + static_cast<int>(i / dim)) +
                        ", element " + std::to_string(i % dim) +
                        ": the model's weights or the KV cache hold NaN/inf (check the model file)");
}

void CpuForward::head(int T, float* logits, bool all_logits) {
  const ModelConfig& c = c_;
  const ModelWeights& w = m_.weights;
  const int dim = c.dim;
  // Final norm and classifier: every row, or the last one only.
  const int first = all_logits ? 0 : T - 1;
  const int n_rows = T - first;
  for (int t = first; t < T; ++t)
    rmsnorm(xb_.data() + static_cast<std::size_t>(t - first) * dim, x_.data() + static_cast<std::size_t>(t) * dim,
            w.final_norm.data(), dim, c.rms_eps);
  matmul(pool_, logits, xb_.data(), w.output_matrix(), nullptr, n_rows, dim, c.vocab_size, false);
  if (c.final_softcap > 0) {  // Gemma 2: logits -> tanh(z / cap) * cap
    const float cap = c.final_softcap;
    for (std::size_t i = 0; i < static_cast<std::size_t>(n_rows) * c.vocab_size; ++i)
      logits[i] = std::tanh(logits[i] / cap) * cap;
  }
  for (std::size_t i = 0; i < static_cast<std::size_t>(n_rows) * c.vocab_size; ++i)
    if (!std::isfinite(logits[i]))
      throw EngineError("forward: the final norm / classifier produced a non-finite logit (" + std::to_string(logits[i]) +
                        ") for token id " + std::to_string(i % static_cast<std::size_t>(c.vocab_size)) +
                        ": the model's final_norm or output weights hold NaN/inf (check the model file)");
}

// Router of one token, as transformers' Qwen3-MoE / Mixtral routers: probabilities = softmax of the
// logits in f32 (max subtracted), the top_k largest (torch.topk: descending; equal values: the lower
// expert index first), divided by their sum when norm_topk (Mixtral always).
void CpuForward::route(const float* logits, int* sel, float* weight) const {
  const MoeConfig& m = c_.moe;
  const int E = m.n_experts, K = m.top_k;
  float mx = logits[0];
  for (int e = 1; e < E; ++e) mx = std::max(mx, logits[e]);
  float p[1024];
  std::vector<float> big;
  float* pr = p;
  if (E > 1024) big.resize(static_cast<std::size_t>(E)), pr = big.data();
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) sum += (pr[e] = std::exp(logits[e] - mx));
  for (int e = 0; e < E; ++e) pr[e] /= sum;
  for (int k = 0; k < K; ++k) {  // selection: K passes (K is small)
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int j = 0; j < k; ++j) taken |= sel[j] == e;
      if (!taken && (best < 0 || pr[e] > pr[best])) best = e;
    }
    sel[k] = best;
    weight[k] = pr[best];
  }
  if (m.norm_topk) {
    float s = 0.0f;
    for (int k = 0; k < K; ++k) s += weight[k];
    for (int k = 0; k < K; ++k) weight[k] /= s;
  }
}

// Every token routed, then expert by expert in increasing index (transformers' loop over the hit
// experts): the expert's tokens gathered, act(x W1_e) * (x W3_e) W2_e, times the token's weight,
// added into moe_ (zero first). Each token's sum therefore runs over its experts in index order.
void CpuForward::moe_ffn(const LayerWeights& L, int T) {
  const MoeConfig& m = c_.moe;
  const int dim = c_.dim, E = m.n_experts, K = m.top_k, I = m.expert_dim;
  matmul(pool_, rl_.data(), xb_.data(), L.router, nullptr, T, dim, E, false);
  for (int t = 0; t < T; ++t) {
    const float* lg = rl_.data() + static_cast<std::size_t>(t) * E;
    int* sel = rsel_.data() + static_cast<std::size_t>(t) * K;
    float* wt = rw_.data() + static_cast<std::size_t>(t) * K;
    if (m.router == MoeConfig::Router::sigmoid_groups) route_groups(lg, L.router_bias.data(), sel, wt);
    else route(lg, sel, wt);
  }
  std::fill(moe_.begin(), moe_.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(T) * dim), 0.0f);
  const std::size_t blk = static_cast<std::size_t>(I) * dim;
  for (int e = 0; e < E; ++e) {
    int n = 0;
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k)
        if (rsel_[static_cast<std::size_t>(t) * K + k] == e) {
          grow_[static_cast<std::size_t>(n)] = t * K + k;
          std::memcpy(xg_.data() + static_cast<std::size_t>(n) * dim, xb_.data() + static_cast<std::size_t>(t) * dim,
                      sizeof(float) * dim);
          ++n;
        }
    if (n == 0) continue;
    matmul(pool_, hg_.data(), xg_.data(), L.ew1.view(e * blk, blk), nullptr, n, dim, I, false);
    matmul(pool_, hg2_.data(), xg_.data(), L.ew3.view(e * blk, blk), nullptr, n, dim, I, false);
    swiglu(hg_.data(), hg2_.data(), static_cast<std::size_t>(n) * I);
    matmul(pool_, yg_.data(), hg_.data(), L.ew2.view(e * blk, blk), nullptr, n, I, dim, false);
    for (int j = 0; j < n; ++j) {
      const int tk = grow_[static_cast<std::size_t>(j)];
      const float w = rw_[static_cast<std::size_t>(tk)];
      float* o = moe_.data() + static_cast<std::size_t>(tk / K) * dim;
      const float* y = yg_.data() + static_cast<std::size_t>(j) * dim;
      for (int i = 0; i < dim; ++i) o[i] += y[i] * w;
    }
  }
  // Shared expert (DeepSeek): a dense gated MLP on every token, added to the routed sum.
  if (m.shared_dim > 0) {
    const int S = m.shared_dim;
    matmul(pool_, hg_.data(), xb_.data(), L.sw1, nullptr, T, dim, S, false);
    matmul(pool_, hg2_.data(), xb_.data(), L.sw3, nullptr, T, dim, S, false);
    swiglu(hg_.data(), hg2_.data(), static_cast<std::size_t>(T) * S);
    matmul(pool_, yg_.data(), hg_.data(), L.sw2, nullptr, T, S, dim, false);
    for (std::size_t i = 0; i < static_cast<std::size_t>(T) * dim; ++i) moe_[i] += yg_[i];
  }
}

// DeepSeek-V3 (transformers' DeepseekV3MoE.route_tokens_to_experts): s = sigmoid(logits) in f32;
// the choice uses s + bias; each group of E / n_group experts is scored by the sum of its two best
// biased scores; the topk_group best groups (ties: lower index) stay, the other groups' experts are
// out of the choice; the top_k best biased scores among those (ties: lower index) are selected;
// weights = the selected unbiased s, divided by (their sum + 1e-20) when norm_topk, times
// routed_scaling_factor.
void CpuForward::route_groups(const float* logits, const float* bias, int* sel, float* weight) const {
  const MoeConfig& m = c_.moe;
  const int E = m.n_experts, K = m.top_k, G = m.n_group, per = E / G;
  std::vector<float> sc(static_cast<std::size_t>(E)), ch(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e) {
    sc[static_cast<std::size_t>(e)] = 1.0f / (1.0f + std::exp(-logits[e]));
    ch[static_cast<std::size_t>(e)] = sc[static_cast<std::size_t>(e)] + bias[e];
  }
  std::vector<float> gs(static_cast<std::size_t>(G));
  for (int g = 0; g < G; ++g) {  // the two largest biased scores of the group, larger first
    float b1 = -INFINITY, b2 = -INFINITY;
    for (int j = 0; j < per; ++j) {
      const float v = ch[static_cast<std::size_t>(g * per + j)];
      if (v > b1) b2 = b1, b1 = v;
      else if (v > b2) b2 = v;
    }
    gs[static_cast<std::size_t>(g)] = b1 + b2;
  }
  std::vector<char> keep(static_cast<std::size_t>(G), 0);
  for (int k = 0; k < m.topk_group; ++k) {
    int best = -1;
    for (int g = 0; g < G; ++g)
      if (!keep[static_cast<std::size_t>(g)] && (best < 0 || gs[static_cast<std::size_t>(g)] > gs[static_cast<std::size_t>(best)]))
        best = g;
    keep[static_cast<std::size_t>(best)] = 1;
  }
  for (int k = 0; k < K; ++k) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (!keep[static_cast<std::size_t>(e / per)]) continue;
      bool taken = false;
      for (int j = 0; j < k; ++j) taken |= sel[j] == e;
      if (!taken && (best < 0 || ch[static_cast<std::size_t>(e)] > ch[static_cast<std::size_t>(best)])) best = e;
    }
    sel[k] = best;
    weight[k] = sc[static_cast<std::size_t>(best)];
  }
  if (m.norm_topk) {
    float s = 0.0f;
    for (int k = 0; k < K; ++k) s += weight[k];
    s += 1e-20f;
    for (int k = 0; k < K; ++k) weight[k] /= s;
  }
  for (int k = 0; k < K; ++k) weight[k] *= m.routed_scale;
}

// MLA, expanded (transformers' DeepseekV3Attention, non-absorbed): per token the latent
// c = rmsnorm(kv_a(x)[:kv_lora]) and the shared k_rope = kv_a(x)[kv_lora:]; per head
// [k_nope | v] = kv_b(c); q = q_proj(x) or q_b(rmsnorm(q_a(x))). The rope parts of q and k turn by
// the RoPE of width qk_rope_head_dim (rope_interleave: pairs (2i, 2i+1) written de-interleaved, as
// transformers' apply_rotary_pos_emb_interleave; else rotate-half). Each head's key [k_nope | k_rope]
// and value [v | 0 ... 0] (zero-padded to the key width) go to the store as an ordinary K/V head, so
// the KV format applies to those expanded rows (not to a latent); attention's v outputs feed o_proj.
void CpuForward::mla_attention(PagedKvStore& store, SeqId s, const LayerWeights& L, int l, int store_layer, int T,
                               int pos0) {
  const ModelConfig& c = c_;
  const MlaConfig& a = c.mla;
  const int dim = c.dim, H = c.n_heads, N = a.nope_dim, R = a.rope_dim, VD = a.v_dim, QK = N + R,
            KL = a.kv_lora_rank, QL = a.q_lora_rank;
  if (QL > 0) {
    matmul(pool_, qa_.data(), xb_.data(), L.wq_a, nullptr, T, dim, QL, false);
    for (int t = 0; t < T; ++t)
      rmsnorm(qa_.data() + static_cast<std::size_t>(t) * QL, qa_.data() + static_cast<std::size_t>(t) * QL,
              L.q_a_norm.data(), QL, c.rms_eps);
    matmul(pool_, q_.data(), qa_.data(), L.wq, nullptr, T, QL, H * QK, false);
  } else {
    matmul(pool_, q_.data(), xb_.data(), L.wq, nullptr, T, dim, H * QK, false);
  }
  matmul(pool_, ckv_.data(), xb_.data(), L.wkv_a, nullptr, T, dim, KL + R, false);
  for (int t = 0; t < T; ++t)
    rmsnorm(lat_.data() + static_cast<std::size_t>(t) * KL, ckv_.data() + static_cast<std::size_t>(t) * (KL + R),
            L.kv_a_norm.data(), KL, c.rms_eps);
  const bool latent = store.layout() == KvLayout::mla_latent;
  if (!latent) matmul(pool_, kvb_.data(), lat_.data(), L.wkv_b, nullptr, T, KL, H * (N + VD), false);
  const int half = c.head_dim / 2, rh = R / 2;
  auto turn = [&](float* x, int t) {  // the rope part of one head (or the shared key) at token t
    const float* fc = cos_.data() + static_cast<std::size_t>(t) * half;
    const float* fs = sin_.data() + static_cast<std::size_t>(t) * half;
    float tmp[512];
    if (a.rope_interleave) {  // de-interleave: [x0, x2, ..., x1, x3, ...]
      for (int i = 0; i < rh; ++i) tmp[i] = x[2 * i], tmp[rh + i] = x[2 * i + 1];
    } else {
      for (int i = 0; i < R; ++i) tmp[i] = x[i];
    }
    for (int i = 0; i < rh; ++i) {
      const float v0 = tmp[i], v1 = tmp[i + rh];
      x[i] = v0 * fc[i] - v1 * fs[i];
      x[i + rh] = v1 * fc[i] + v0 * fs[i];
    }
  };
  if (latent) {  // the cache holds the latent (K half) and the rotated shared RoPE key (V half)
    for (int t = 0; t < T; ++t) {
      turn(ckv_.data() + static_cast<std::size_t>(t) * (KL + R) + KL, t);
      for (int h = 0; h < H; ++h) turn(q_.data() + (static_cast<std::size_t>(t) * H + h) * QK + N, t);
    }
    store.write(s, store_layer, pos0, T, lat_.data(), static_cast<std::size_t>(KL), ckv_.data() + KL,
                static_cast<std::size_t>(KL + R));
    const MlaDims d{H, N, R, VD, KL};
    const float scale = c.attn_scale > 0 ? c.attn_scale : 1.0f / std::sqrt(static_cast<float>(QK));
    for_query_parts(T, pos0, 0, store.streaming(), [&](int i0, int n) {
      MlaAttentionArgs ma;
      ma.n_q = n;
      ma.pos0 = pos0 + i0;
      ma.softmax_scale = scale;
      mla_latent_attention(store, s, store_layer, d, ma, q_.data() + static_cast<std::size_t>(i0) * H * QK,
                           L.wkv_b.data(), attc_.data() + static_cast<std::size_t>(i0) * H * VD);
    });
    matmul(pool_, x_.data(), attc_.data(), L.wo, nullptr, T, H * VD, dim, true);
    return;
  }
  for (int t = 0; t < T; ++t) {
    float* kr = ckv_.data() + static_cast<std::size_t>(t) * (KL + R) + KL;
    turn(kr, t);
    for (int h = 0; h < H; ++h) {
      float* qh = q_.data() + (static_cast<std::size_t>(t) * H + h) * QK;
      turn(qh + N, t);
      const float* kv = kvb_.data() + (static_cast<std::size_t>(t) * H + h) * (N + VD);
      float* kh = k_.data() + (static_cast<std::size_t>(t) * H + h) * QK;
      float* vh = v_.data() + (static_cast<std::size_t>(t) * H + h) * QK;
      std::memcpy(kh, kv, sizeof(float) * N);
      std::memcpy(kh + N, kr, sizeof(float) * R);
      std::memcpy(vh, kv + N, sizeof(float) * VD);
      std::fill(vh + VD, vh + QK, 0.0f);
    }
  }
  const std::size_t kvd = static_cast<std::size_t>(c.kv_dim());
  store.write(s, store_layer, pos0, T, k_.data(), kvd, v_.data(), kvd);
  attend(store, s, l, store_layer, T, pos0);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      std::memcpy(attc_.data() + (static_cast<std::size_t>(t) * H + h) * VD,
                  att_.data() + (static_cast<std::size_t>(t) * H + h) * QK, sizeof(float) * VD);
  matmul(pool_, x_.data(), attc_.data(), L.wo, nullptr, T, H * VD, dim, true);
}

// x[t] += rmsnorm(xb2[t]) * w for the chunk (Gemma's post-attention / post-FFN norms).
void CpuForward::add_normed(const float* norm_w, int T) {
  const int dim = c_.dim;
  for (int t = 0; t < T; ++t) {
    float* o = xb2_.data() + static_cast<std::size_t>(t) * dim;
    rmsnorm(o, o, norm_w, dim, c_.rms_eps);
    float* x = x_.data() + static_cast<std::size_t>(t) * dim;
    for (int i = 0; i < dim; ++i) x[i] += o[i];
  }
}

}  // namespace kvgate::detail
