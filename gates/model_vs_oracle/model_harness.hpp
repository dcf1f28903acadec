// Plumbing of the model-level gates (ORA.model, MOD): where the models and corpora are, the
// deterministic random-weight model (fed to the runtime as a kvgate::Model and to the oracle as its
// own struct), per-position comparison metrics, and the envelope-noise KV hook that gives each
// format its reference perturbation (gates/common/bounds.hpp "MOD").
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvgate/build_paths.hpp"
#include "bounds.hpp"
#include "kvgate/blocks.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/model.hpp"
#include "kvgate_oracle/formats.hpp"
#include "kvgate_oracle/metrics.hpp"
#include "kvgate_oracle/model.hpp"
#include "kvgate_oracle/scalar.hpp"
#include "models.hpp"
#include "populations.hpp"

namespace kvgate::gates::model_level {

namespace fs = std::filesystem;
namespace ko = kvgate_oracle;

// ---- where things are ------------------------------------------------------------------------

// The source tree (for the committed corpus): $KVGATE_SOURCE_DIR (ctest sets it), else the tree
// this was built from. Models are found by gates/common/models.hpp (find_model).
inline std::string source_dir() {
  if (const char* s = std::getenv("KVGATE_SOURCE_DIR"); s && *s) return s;
  return KVGATE_SOURCE_DIR_DEFAULT;  // compile definition (gates/model_vs_oracle/CMakeLists.txt)
}

inline std::string corpus_path() { return (fs::path(source_dir()) / "datasets" / "corpora" / "stories260K_tf.json").string(); }

struct Corpus {
  std::vector<std::vector<int>> sequences;
  std::vector<std::uint64_t> seeds;
  nlohmann::json meta;
};

inline Corpus load_corpus(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("teacher-forcing corpus not found at '" + path +
                                   "' (generate it with kvgate_gen_tf_corpus, see datasets/corpora/README.md)");
  Corpus c;
  c.meta = nlohmann::json::parse(f);
  for (const auto& s : c.meta.at("sequences")) {
    c.seeds.push_back(s.at("seed").get<std::uint64_t>());
    c.sequences.push_back(s.at("tokens").get<std::vector<int>>());
  }
  return c;
}

// ---- the deterministic random-weight model ---------------------------------------------------

struct RandomModelSpec {
  // head_dim 64: every format applies (q4_0_rot needs a power of two, 32-blocks lie inside a head),
  // and an int8 cell (64) differs from a q8_0 block (32), so the two formats are told apart.
  int dim = 256, hidden_dim = 512, n_layers = 4, n_heads = 4, n_kv_heads = 2, vocab = 512, seq_len = 2048;
  std::uint64_t seed = 20240611;
  // Scales (std of the N(0, s^2) entries), chosen so every activation is O(1): x·W with W ~
  // N(0, g^2/fan_in) keeps the RMS at g. Queries get g = 2 so attention is not uniform
  // (score std ~ 2); the classifier g = 3 gives logits with a std of ~3 (a
  // top-1 probability well above 1/vocab, so KL and top-1 flips are meaningful).
  double q_gain = 2.0, kv_gain = 1.0, o_gain = 1.0, ffn_gain = 1.0, cls_gain = 3.0;
};

inline std::vector<float> randn(Rng& r, std::size_t n, double std) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.normal() * std);
  return v;
}

inline std::vector<float> norm_gains(Rng& r, std::size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(1.0 + 0.1 * r.normal());
  return v;
}

inline ko::Transformer random_oracle_model(const RandomModelSpec& s) {
  ko::ModelConfig c;
  c.dim = s.dim;
  c.hidden_dim = s.hidden_dim;
  c.n_layers = s.n_layers;
  c.n_heads = s.n_heads;
  c.n_kv_heads = s.n_kv_heads;
  c.vocab_size = s.vocab;
  c.seq_len = s.seq_len;
  const std::size_t D = s.dim, F = s.hidden_dim, KV = static_cast<std::size_t>(c.kv_dim()), V = s.vocab;
  Rng r(s.seed);
  ko::Weights w;
  w.token_embedding = randn(r, V * D, 1.0);
  for (int l = 0; l < s.n_layers; ++l) {
    ko::LayerWeights L;
    L.rms_att = norm_gains(r, D);
    L.wq = randn(r, D * D, s.q_gain / std::sqrt(double(D)));
    L.wk = randn(r, KV * D, s.kv_gain / std::sqrt(double(D)));
    L.wv = randn(r, KV * D, s.kv_gain / std::sqrt(double(D)));
    L.wo = randn(r, D * D, s.o_gain / std::sqrt(double(D)));
    L.rms_ffn = norm_gains(r, D);
    L.w1 = randn(r, F * D, s.ffn_gain / std::sqrt(double(D)));
    L.w2 = randn(r, D * F, s.ffn_gain / std::sqrt(double(F)));
    L.w3 = randn(r, F * D, s.ffn_gain / std::sqrt(double(D)));
    w.layers.push_back(std::move(L));
  }
  w.rms_final = norm_gains(r, D);
  w.wcls = randn(r, V * D, s.cls_gain / std::sqrt(double(D)));
  return ko::make_transformer(c, std::move(w));
}

// The same weights as a runtime Model, field by field (the runtime's loaders are not involved).
inline Model runtime_model_from(const ko::Transformer& t, const std::string& name) {
  Model m;
  m.path = name;
  m.source_kind = "memory";
  ModelConfig& c = m.config;
  c.arch = "llama";
  c.dim = t.config.dim;
  c.hidden_dim = t.config.hidden_dim;
  c.n_layers = t.config.n_layers;
  c.n_heads = t.config.n_heads;
  c.n_kv_heads = t.config.n_kv_heads;
  c.head_dim = t.config.head_dim();
  c.vocab_size = t.config.vocab_size;
  c.max_seq_len = t.config.seq_len;
  c.rms_eps = t.config.rms_eps;
  c.rope_theta = t.config.rope_theta;
  c.rope_style = RopeStyle::interleaved;
  c.tied_embeddings = t.weights.wcls.empty();
  ModelWeights& w = m.weights;
  w.tok_embeddings = t.weights.token_embedding;
  for (const auto& L : t.weights.layers) {
    LayerWeights R;
    R.attn_norm = L.rms_att;
    R.wq = L.wq;
    R.wk = L.wk;
    R.wv = L.wv;
    R.wo = L.wo;
    R.ffn_norm = L.rms_ffn;
    R.w1 = L.w1;
    R.w2 = L.w2;
    R.w3 = L.w3;
    w.layers.push_back(std::move(R));
  }
  w.final_norm = t.weights.rms_final;
  w.classifier = t.weights.wcls;
  validate_weights(name, c, w);
  m.fingerprint = model_fingerprint(c, w);
  return m;
}

// Teacher-forcing tokens from a seeded PRNG (uniform over the vocabulary).
inline std::vector<int> random_tokens(int n, int vocab, std::uint64_t seed) {
  Rng r(seed);
  std::vector<int> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = static_cast<int>(r.next() % static_cast<std::uint64_t>(vocab));
  return t;
}

// ---- runtime runs ----------------------------------------------------------------------------

struct RuntimeRun {
  std::vector<float> logits;  // [n][vocab]
  EngineStats stats;
};

inline RuntimeRun runtime_logits(const Model& m, const KvFormat& f, std::span<const int> tokens, int threads = 1,
                                 int prefill_chunk = 128) {
  EngineOptions o = engine_options_for(f, threads);
  o.max_context = static_cast<int>(tokens.size());
  o.prefill_chunk = prefill_chunk;
  Engine e(m, o);
  RuntimeRun r;
  r.logits = e.forward_all_logits(tokens);
  r.stats = e.stats();
  return r;
}

// ---- per-position comparison -----------------------------------------------------------------

struct Comparison {
  std::vector<double> kl;  // per position, KL(P_ref || P_test)
  long positions = 0;
  long top1_disagree = 0;
  long nonfinite = 0;
  double max_abs = 0;      // max |logit difference|
  double mean_kl() const {
    double s = 0;
    for (double x : kl) s += x;
    return kl.empty() ? 0 : s / double(kl.size());
  }
  // The p-quantile by the nearest-rank rule: the ceil(p·n)-th smallest value.
  double quantile_kl(double p) const {
    if (kl.empty()) return 0;
    std::vector<double> s = kl;
    std::sort(s.begin(), s.end());
    const std::size_t k = static_cast<std::size_t>(std::ceil(p * double(s.size())));
    return s[std::min(s.size() - 1, k == 0 ? 0 : k - 1)];
  }
  double top1_rate() const { return positions ? 1.0 - double(top1_disagree) / double(positions) : 1.0; }
  void add(std::span<const float> ref, std::span<const float> test, int vocab) {
    nonfinite += static_cast<long>(ko::count_nonfinite(test));
    for (std::size_t p = 0; p * vocab < ref.size(); ++p) {
      const auto a = ref.subspan(p * vocab, vocab), b = test.subspan(p * vocab, vocab);
      kl.push_back(ko::kl_divergence_from_logits(a, b));
      top1_disagree += !ko::top1_agree(a, b);
      max_abs = std::max(max_abs, ko::max_abs_diff(a, b));
      ++positions;
    }
  }
  std::string text() const {
    std::ostringstream o;
    o << "mean KL " << mean_kl() << ", p99 KL " << quantile_kl(0.99) << ", top-1 agreement " << top1_rate()
      << " (" << top1_disagree << " of " << positions << " differ), max |dlogit| " << max_abs;
    return o.str();
  }
};

// ---- the envelope-noise reference perturbation (bounds.hpp "MOD") ----------------------------

inline ko::Half to_oracle(HalfFormat h) {
  const auto o = ko::parse_half(name(h));
  if (!o) throw std::logic_error("oracle does not know half format " + std::string(name(h)));
  return *o;
}

// Adds to each element of one token row (H cells of D) a random sign times the format's envelope
// at that element (docs/FORMATS.md), computed from the row as the format would: the cell scale
// (int8, fp8_per_token_head, int8_per_token_head), the 128-tile scale (fp8_block128), the 32-block scale (q8_0, q4_0; q4_0_rot in the
// rotated domain, mapped back by the orthonormal Hadamard), the per-tensor scale (fp8), or |x| (f16, bf16).
inline void add_envelope_noise(HalfFormat h, float* row, int H, int D, float tensor_scale, Rng& rng) {
  const int HD = H * D;
  auto sign = [&]() { return (rng.next() >> 63) ? 1.0 : -1.0; };
  switch (h) {
    case HalfFormat::f32: return;
    case HalfFormat::f16:
      for (int i = 0; i < HD; ++i) row[i] = float(row[i] + sign() * f16_bound(row[i]));
      return;
    case HalfFormat::bf16:
      for (int i = 0; i < HD; ++i) row[i] = float(row[i] + sign() * bf16_bound(row[i]));
      return;
    case HalfFormat::fp8_e4m3:
    case HalfFormat::fp8_e5m2: {
      const bool e4 = h == HalfFormat::fp8_e4m3;
      const double s = tensor_scale, ymax = e4 ? kE4m3Max : kE5m2Max;
      for (int i = 0; i < HD; ++i) {
        const double ax = std::fabs(row[i]);
        double env = e4 ? 0x1p-4 * ax + 0x1p-10 * s : 0x1p-3 * ax + 0x1p-17 * s;
        if (ax > ymax * s) env = ax - ymax * s;  // saturated: the error is the excess
        row[i] = float(row[i] + sign() * env);
      }
      return;
    }
    case HalfFormat::int8:
      for (int c = 0; c < H; ++c) {
        float* x = row + c * D;
        float amax = 0;
        for (int i = 0; i < D; ++i) amax = std::max(amax, std::fabs(x[i]));
        const double s = ko::from_f16(ko::f16_min_scale(amax, 127));
        for (int i = 0; i < D; ++i) x[i] = float(x[i] + sign() * s / 2);
      }
      return;
    case HalfFormat::fp8_per_token_head:
    case HalfFormat::int8_per_token_head:
      // Per cell, s = amax/448 (fp8: 2^-4|x| + 2^-10 s) or amax/127 (int8, round to nearest: s/2), in
      // binary32 as the page stores it (FORMATS.md; s = 1 for a cell whose quotient is zero).
      for (int c = 0; c < H; ++c) {
        float* x = row + c * D;
        float amax = 0;
        for (int i = 0; i < D; ++i) amax = std::max(amax, std::fabs(x[i]));
        const bool fp8 = h == HalfFormat::fp8_per_token_head;
        float s = amax / (fp8 ? 448.0f : 127.0f);
        if (s == 0.0f) s = 1.0f;
        for (int i = 0; i < D; ++i) {
          const double env = fp8 ? 0x1p-4 * std::fabs(x[i]) + 0x1p-10 * double(s) : double(s) / 2;
          x[i] = float(x[i] + sign() * env);
        }
      }
      return;
    case HalfFormat::fp8_block128:
      // Per 128-element tile of the row, s = amax/448 in binary32 (FORMATS.md): 2^-4|x| + 2^-10 s.
      for (int b = 0; b + kTileBlock <= HD; b += kTileBlock) {
        float amax = 0;
        for (int i = 0; i < kTileBlock; ++i) amax = std::max(amax, std::fabs(row[b + i]));
        float s = amax / 448.0f;
        if (s == 0.0f) s = 1.0f;
        for (int i = 0; i < kTileBlock; ++i)
          row[b + i] = float(row[b + i] + sign() * (0x1p-4 * std::fabs(row[b + i]) + 0x1p-10 * double(s)));
      }
      return;
    case HalfFormat::q8_0:
      for (int b = 0; b + 32 <= HD; b += 32) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(row[b + i]));
        const double d = ko::from_f16(ko::f16_min_scale(amax, 127));
        for (int i = 0; i < 32; ++i) row[b + i] = float(row[b + i] + sign() * d / 2);
      }
      return;
    case HalfFormat::mxfp8:
    case HalfFormat::mxfp4:
      // Per 32-block, X from the block's amax (bounds.hpp mx_scale); a saturated mxfp8 element's
      // error is its excess over 448 X.
      for (int b = 0; b + 32 <= HD; b += 32) {
        double amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double(row[b + i])));
        for (int i = 0; i < 32; ++i) {
          const double x = row[b + i];
          const double env = h == HalfFormat::mxfp4           ? mxfp4_bound(x, amax)
                             : mxfp8_saturated(x, amax) ? std::fabs(x) - 448.0 * mx_scale(amax, kMxfp8Emax)
                                                        : mxfp8_bound(x, amax);
          row[b + i] = float(x + sign() * env);
        }
      }
      return;
    case HalfFormat::nvfp4:
      // Per 16-block: S as the page stores it (oracle scalars, FORMATS.md nvfp4); the grid envelope
      // 2^-2|x| + 2^-2 S, a saturated element's error is its excess over 6 S.
      for (int b = 0; b + 16 <= HD; b += 16) {
        float amax = 0;
        for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(row[b + i]));
        const double S = double(ko::from_e4m3(ko::to_e4m3(amax / 6.0f / tensor_scale)) * tensor_scale);
        for (int i = 0; i < 16; ++i) {
          const double x = row[b + i];
          const double env = std::fabs(x) > 6 * S ? std::fabs(x) - 6 * S : 0x1p-2 * std::fabs(x) + 0x1p-2 * S;
          row[b + i] = float(x + sign() * env);
        }
      }
      return;
    case HalfFormat::q4_0:
    case HalfFormat::q4_0_rot: {
      // Error vector in the (rotated, for q4_0_rot) domain of the stored row.
      std::vector<float> y(row, row + HD), e(static_cast<std::size_t>(HD), 0.0f);
      if (h == HalfFormat::q4_0_rot)
        for (int c = 0; c < H; ++c) ko::hadamard(y.data() + c * D, D);
      for (int b = 0; b + 32 <= HD; b += 32) {
        int mi = b;
        for (int i = b; i < b + 32; ++i)
          if (std::fabs(y[i]) > std::fabs(y[mi])) mi = i;
        const double m = y[mi], d = ko::from_f16(ko::f16_min_scale(std::fabs(y[mi]), 8));
        for (int i = b; i < b + 32; ++i) {
          const bool clamped = double(y[i]) * m < 0 && std::fabs(y[i]) > 7.5 * d;
          e[i] = float(sign() * (clamped ? d : d / 2));
        }
      }
      if (h == HalfFormat::q4_0_rot)
        for (int c = 0; c < H; ++c) ko::hadamard(e.data() + c * D, D);  // orthonormal: back to the original domain
      for (int i = 0; i < HD; ++i) row[i] += e[i];
      return;
    }
  }
}

// Oracle KV hook: K rows get the K half's envelope noise, V rows the V half's, every layer.
inline ko::KvHook envelope_noise_hook(const KvFormat& f, int n_kv_heads, int head_dim, std::vector<float> k_scale,
                                      std::vector<float> v_scale, std::uint64_t seed) {
  return [=](int layer, int n, float* k, float* v) {
    Rng rng(seed * 1000003ull + static_cast<std::uint64_t>(layer));
    const float ks = k_scale.empty() ? 1.0f : k_scale[layer], vs = v_scale.empty() ? 1.0f : v_scale[layer];
    const std::size_t HD = static_cast<std::size_t>(n_kv_heads * head_dim);
    for (int t = 0; t < n; ++t) {
      add_envelope_noise(f.k, k + t * HD, n_kv_heads, head_dim, ks, rng);
      add_envelope_noise(f.v, v + t * HD, n_kv_heads, head_dim, vs, rng);
    }
  };
}

}  // namespace kvgate::gates::model_level
