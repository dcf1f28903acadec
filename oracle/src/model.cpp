// Full-model forward, written from DESIGN.md and the stories260K README (see model.hpp).
#include "kvgate_oracle/model.hpp"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace kvgate_oracle {

namespace {

void need(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("oracle model: " + what);
}

void check_size(const std::vector<float>& v, size_t n, const std::string& name) {
    need(v.size() == n, name + " has " + std::to_string(v.size()) + " floats, expected " + std::to_string(n));
}

}  // namespace

void validate(const Transformer& t) {
    const ModelConfig& c = t.config;
    need(c.dim > 0 && c.hidden_dim > 0 && c.n_layers > 0 && c.n_heads > 0 && c.n_kv_heads > 0 &&
             c.vocab_size > 0 && c.seq_len > 0,
         "config fields must be positive");
    need(c.dim % c.n_heads == 0, "dim must be a multiple of n_heads");
    need(c.n_heads % c.n_kv_heads == 0, "n_heads must be a multiple of n_kv_heads");
    need(c.head_dim() % 2 == 0, "head_dim must be even (RoPE rotates pairs)");
    need(c.rms_eps > 0 && c.rope_theta > 0, "rms_eps and rope_theta must be positive");
    {
        const RopeSpec& r = c.rope;
        const int R = r.rotary_dim > 0 ? r.rotary_dim : c.head_dim();
        need(R >= 2 && R <= c.head_dim() && R % 2 == 0, "rope.rotary_dim must be even and within head_dim");
        if (r.kind != RopeKind::standard) need(r.factor > 0, "rope.factor must be positive");
        if (r.kind == RopeKind::ntk_dynamic) need(r.reference_len > 0, "rope.reference_len must be positive");
        if (r.kind == RopeKind::yarn || r.kind == RopeKind::llama3 || r.kind == RopeKind::longrope)
            need(r.original_len > 0, "rope.original_len must be positive");
        if (r.kind == RopeKind::llama3) need(r.high_freq_factor > r.low_freq_factor, "rope: high_freq_factor <= low_freq_factor");
        if (r.kind == RopeKind::longrope)
            need(r.short_factor.size() == size_t(R / 2) && r.long_factor.size() == size_t(R / 2),
                 "rope: short/long factors need rotary_dim/2 entries");
    }
    const size_t D = size_t(c.dim), F = size_t(c.hidden_dim), KV = size_t(c.kv_dim()), V = size_t(c.vocab_size);
    const Weights& w = t.weights;
    check_size(w.token_embedding, V * D, "token_embedding");
    need(w.layers.size() == size_t(c.n_layers), "layers: expected n_layers entries");
    for (size_t l = 0; l < w.layers.size(); ++l) {
        const LayerWeights& L = w.layers[l];
        const std::string p = "layer " + std::to_string(l) + " ";
        check_size(L.rms_att, D, p + "rms_att");
        check_size(L.wq, D * D, p + "wq");
        check_size(L.wk, KV * D, p + "wk");
        check_size(L.wv, KV * D, p + "wv");
        check_size(L.wo, D * D, p + "wo");
        check_size(L.rms_ffn, D, p + "rms_ffn");
        check_size(L.w1, F * D, p + "w1");
        check_size(L.w2, D * F, p + "w2");
        check_size(L.w3, F * D, p + "w3");
    }
    check_size(w.rms_final, D, "rms_final");
    if (!w.wcls.empty()) check_size(w.wcls, V * D, "wcls");
}

RopeAngles rope_angles(const RopeSpec& r, double theta, int head_dim, int seq_len) {
    const int R = r.rotary_dim > 0 ? r.rotary_dim : head_dim;
    const int pairs = R / 2;
    const double pi = std::acos(-1.0);
    RopeAngles a;
    a.freq.resize(size_t(pairs));
    // The standard frequencies theta^(-2j/R).
    auto standard = [&](double base, int j) { return std::pow(base, -2.0 * j / R); };
    for (int j = 0; j < pairs; ++j) a.freq[size_t(j)] = standard(theta, j);
    switch (r.kind) {
        case RopeKind::standard:
            break;
        case RopeKind::linear:  // position interpolation: every position divided by s
            for (double& f : a.freq) f /= r.factor;
            break;
        case RopeKind::ntk_dynamic:
            // NTK-aware: past the reference length L_r the base becomes
            // theta * (s * L / L_r - (s - 1))^(R / (R - 2)), L the current length.
            if (seq_len > r.reference_len) {
                const double g = r.factor * double(seq_len) / r.reference_len - (r.factor - 1);
                const double base = theta * std::pow(g, double(R) / (R - 2));
                for (int j = 0; j < pairs; ++j) a.freq[size_t(j)] = standard(base, j);
            }
            break;
        case RopeKind::yarn: {
            // YaRN: pair j interpolates (freq / s) below the ramp, keeps freq above it; the ramp runs
            // between the pairs that complete beta_fast and beta_slow turns over L0.
            auto pair_of = [&](double turns) {
                return R * std::log(r.original_len / (turns * 2 * pi)) / (2 * std::log(theta));
            };
            double lo = pair_of(r.beta_fast), hi = pair_of(r.beta_slow);
            if (r.round_ramp) lo = std::floor(lo), hi = std::ceil(hi);
            lo = std::max(lo, 0.0);
            hi = std::min(hi, double(R - 1));
            if (hi == lo) hi += 0.001;
            for (int j = 0; j < pairs; ++j) {
                const double t = std::clamp((j - lo) / (hi - lo), 0.0, 1.0);  // 0: keep, 1: interpolate
                const double f = a.freq[size_t(j)];
                a.freq[size_t(j)] = (1 - t) * f + t * f / r.factor;
            }
            a.cs_scale = r.attention_factor > 0 ? r.attention_factor : (r.factor > 1 ? 0.1 * std::log(r.factor) + 1 : 1.0);
            break;
        }
        case RopeKind::llama3: {
            // Llama 3.1: wavelengths beyond L0/low are divided by s, below L0/high kept, and in between
            // a linear blend in L0/wavelength from low (all scaled) to high (none scaled).
            const double lo_wl = r.original_len / r.low_freq_factor, hi_wl = r.original_len / r.high_freq_factor;
            for (double& f : a.freq) {
                const double wl = 2 * pi / f;
                if (wl > lo_wl) f /= r.factor;
                else if (wl >= hi_wl) {
                    const double t = (r.original_len / wl - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
                    f = (1 - t) * f / r.factor + t * f;
                }
            }
            break;
        }
        case RopeKind::longrope: {
            // LongRoPE: per-pair rescale factors, the long set once the sequence exceeds L0.
            const auto& ext = seq_len > r.original_len ? r.long_factor : r.short_factor;
            for (int j = 0; j < pairs; ++j) a.freq[size_t(j)] /= ext[size_t(j)];
            const double s = r.factor;
            a.cs_scale = r.attention_factor > 0 ? r.attention_factor
                                                : (s > 1 ? std::sqrt(1 + std::log(s) / std::log(double(r.original_len))) : 1.0);
            break;
        }
    }
    return a;
}

Transformer make_transformer(ModelConfig config, Weights weights) {
    Transformer t{config, std::move(weights)};
    validate(t);
    return t;
}

// ---- llama2.c legacy reader ------------------------------------------------------------------

Transformer load_llama2c(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("oracle: cannot open llama2.c checkpoint '" + path + "'");
    f.seekg(0, std::ios::end);
    const std::streamoff file_bytes = f.tellg();
    f.seekg(0);
    int32_t h[7];
    if (file_bytes < std::streamoff(sizeof h) || !f.read(reinterpret_cast<char*>(h), sizeof h))
        throw std::runtime_error("oracle: '" + path + "': shorter than the 28-byte llama2.c header");
    ModelConfig c;
    c.dim = h[0];
    c.hidden_dim = h[1];
    c.n_layers = h[2];
    c.n_heads = h[3];
    c.n_kv_heads = h[4];
    const bool shared = h[5] > 0;
    c.vocab_size = h[5] > 0 ? h[5] : (h[5] == std::numeric_limits<int32_t>::min() ? 0 : -h[5]);
    c.seq_len = h[6];
    const char* names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; ++i)
        if (h[i] == 0 || (i != 5 && h[i] < 0) || std::abs(int64_t(h[i])) > (int64_t(1) << 24))
            throw std::runtime_error("oracle: '" + path + "': header field " + names[i] + " = " +
                                     std::to_string(h[i]) + " is out of range");
    if (c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0)
        throw std::runtime_error("oracle: '" + path + "': dim/n_heads/n_kv_heads are inconsistent");

    const int64_t D = c.dim, F = c.hidden_dim, L = c.n_layers, KV = c.kv_dim(), V = c.vocab_size;
    const int64_t need_floats = V * D + L * (D + D * D + 2 * KV * D + D * D + D + 3 * F * D) + D +
                                int64_t(c.seq_len) * c.head_dim() + (shared ? 0 : V * D);
    if (file_bytes - 28 < need_floats * 4)
        throw std::runtime_error("oracle: '" + path + "': " + std::to_string(file_bytes) +
                                 " bytes, the header implies at least " + std::to_string(28 + need_floats * 4));

    auto read = [&](std::vector<float>& dst, int64_t n, const std::string& name) {
        dst.resize(size_t(n));
        if (!f.read(reinterpret_cast<char*>(dst.data()), std::streamsize(n * 4)))
            throw std::runtime_error("oracle: '" + path + "': short read in " + name);
    };
    Weights w;
    read(w.token_embedding, V * D, "token_embedding");
    w.layers.resize(size_t(L));
    // The file stores each tensor for all layers before the next tensor.
    for (auto& l : w.layers) read(l.rms_att, D, "rms_att");
    for (auto& l : w.layers) read(l.wq, D * D, "wq");
    for (auto& l : w.layers) read(l.wk, KV * D, "wk");
    for (auto& l : w.layers) read(l.wv, KV * D, "wv");
    for (auto& l : w.layers) read(l.wo, D * D, "wo");
    for (auto& l : w.layers) read(l.rms_ffn, D, "rms_ffn");
    for (auto& l : w.layers) read(l.w1, F * D, "w1");
    for (auto& l : w.layers) read(l.w2, D * F, "w2");
    for (auto& l : w.layers) read(l.w3, F * D, "w3");
    read(w.rms_final, D, "rms_final");
    f.seekg(std::streamoff(int64_t(c.seq_len) * c.head_dim() * 4), std::ios::cur);  // freq_cis_real/imag
    if (!shared) read(w.wcls, V * D, "wcls");
    return make_transformer(c, std::move(w));
}

// ---- batched forward (Eigen), binary32 or binary64 --------------------------------------------

namespace {

template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using FMap = Eigen::Map<const Mat<float>>;

template <typename T>
auto weight(const std::vector<float>& w, int rows, int cols) {
    return FMap(w.data(), rows, cols).template cast<T>();
}

// y = g ⊙ x / sqrt(mean(x²) + eps), per row.
template <typename T>
Mat<T> rmsnorm(const Mat<T>& x, const std::vector<float>& g, float eps) {
    Mat<T> y(x.rows(), x.cols());
    const auto gv = Eigen::Map<const Eigen::RowVectorXf>(g.data(), Eigen::Index(g.size())).template cast<T>();
    for (Eigen::Index i = 0; i < x.rows(); ++i) {
        const T ss = x.row(i).squaredNorm() / T(x.cols()) + T(eps);
        const T r = T(1) / std::sqrt(ss);
        y.row(i) = gv.cwiseProduct(x.row(i) * r);
    }
    return y;
}

// RoPE: in every head, pair j (adjacent dims (2j, 2j+1), or (j, j + R/2) with rotate_half) of
// position p turns by p * freq_j; dims past the rotated R stay. The angle and its cos/sin are
// computed in binary64, scaled, and rounded once to T.
template <typename T>
void rope(Mat<T>& m, int n_heads, int head_dim, const RopeAngles& a, const RopeSpec& r) {
    const int pairs = int(a.freq.size());
    for (Eigen::Index p = 0; p < m.rows(); ++p)
        for (int j = 0; j < pairs; ++j) {
            const double ang = double(p) * a.freq[size_t(j)];
            const T c = T(std::cos(ang) * a.cs_scale), s = T(std::sin(ang) * a.cs_scale);
            const int i0 = r.rotate_half ? j : 2 * j, i1 = r.rotate_half ? j + pairs : 2 * j + 1;
            for (int h = 0; h < n_heads; ++h) {
                T& x0 = m(p, h * head_dim + i0);
                T& x1 = m(p, h * head_dim + i1);
                const T a0 = x0, b0 = x1;
                x0 = a0 * c - b0 * s;
                x1 = a0 * s + b0 * c;
            }
        }
}

// Causal GQA attention, queries in tiles so that only visible keys are multiplied.
template <typename T>
Mat<T> attention(const Mat<T>& Q, const Mat<T>& K, const Mat<T>& V, int n_heads, int n_kv_heads, int hd) {
    const Eigen::Index n = Q.rows();
    const int group = n_heads / n_kv_heads;
    const T scale = T(1) / std::sqrt(T(hd));
    Mat<T> out(n, Eigen::Index(n_heads) * hd);
    constexpr Eigen::Index kTile = 128;
    for (int h = 0; h < n_heads; ++h) {
        const int g = h / group;
        for (Eigen::Index r0 = 0; r0 < n; r0 += kTile) {
            const Eigen::Index r1 = std::min(n, r0 + kTile), nr = r1 - r0;
            Mat<T> S = (Q.block(r0, h * hd, nr, hd) * K.block(0, g * hd, r1, hd).transpose()) * scale;
            for (Eigen::Index i = 0; i < nr; ++i) {
                const Eigen::Index vis = r0 + i + 1;  // keys 0..r0+i
                auto row = S.row(i).head(vis);
                const T mx = row.maxCoeff();
                row = (row.array() - mx).exp().matrix();
                row /= row.sum();
                S.row(i).tail(r1 - vis).setZero();
            }
            out.block(r0, h * hd, nr, hd) = S * V.block(0, g * hd, r1, hd);
        }
    }
    return out;
}

template <typename T>
Mat<T> forward_impl(const Transformer& t, std::span<const int> tokens, const KvHook* hook) {
    validate(t);
    const ModelConfig& c = t.config;
    const Eigen::Index n = Eigen::Index(tokens.size());
    need(n <= c.seq_len, std::to_string(n) + " tokens exceed seq_len " + std::to_string(c.seq_len));
    const int D = c.dim, F = c.hidden_dim, KV = c.kv_dim(), hd = c.head_dim(), Vc = c.vocab_size;
    const RopeAngles angles = rope_angles(c.rope, c.rope_theta, hd, int(n));
    Mat<T> x(n, D);
    for (Eigen::Index i = 0; i < n; ++i) {
        const int tok = tokens[size_t(i)];
        need(tok >= 0 && tok < Vc, "token id " + std::to_string(tok) + " out of range");
        x.row(i) = Eigen::Map<const Eigen::RowVectorXf>(t.weights.token_embedding.data() + size_t(tok) * D, D)
                       .template cast<T>();
    }
    for (int l = 0; l < c.n_layers; ++l) {
        const LayerWeights& L = t.weights.layers[size_t(l)];
        Mat<T> xn = rmsnorm<T>(x, L.rms_att, c.rms_eps);
        Mat<T> Q = xn * weight<T>(L.wq, D, D).transpose();
        Mat<T> K = xn * weight<T>(L.wk, KV, D).transpose();
        Mat<T> V = xn * weight<T>(L.wv, KV, D).transpose();
        rope<T>(Q, c.n_heads, hd, angles, c.rope);
        rope<T>(K, c.n_kv_heads, hd, angles, c.rope);
        if constexpr (std::is_same_v<T, float>) {
            if (hook && *hook) (*hook)(l, int(n), K.data(), V.data());
        }
        const Mat<T> att = attention<T>(Q, K, V, c.n_heads, c.n_kv_heads, hd);
        x += att * weight<T>(L.wo, D, D).transpose();
        xn = rmsnorm<T>(x, L.rms_ffn, c.rms_eps);
        Mat<T> h1 = xn * weight<T>(L.w1, F, D).transpose();
        const Mat<T> h3 = xn * weight<T>(L.w3, F, D).transpose();
        // SwiGLU: silu(h1) ⊙ h3, silu(a) = a / (1 + exp(-a)).
        h1 = (h1.array() / (T(1) + (-h1.array()).exp()) * h3.array()).matrix();
        x += h1 * weight<T>(L.w2, D, F).transpose();
    }
    const Mat<T> xf = rmsnorm<T>(x, t.weights.rms_final, c.rms_eps);
    return xf * FMap(t.classifier(), Vc, D).template cast<T>().transpose();
}

template <typename T>
std::vector<T> flatten(const Mat<T>& m) {
    return std::vector<T>(m.data(), m.data() + m.size());
}

}  // namespace

std::vector<float> forward_all(const Transformer& t, std::span<const int> tokens, const KvHook& kv_hook) {
    return flatten(forward_impl<float>(t, tokens, &kv_hook));
}

std::vector<double> forward_all_f64(const Transformer& t, std::span<const int> tokens) {
    return flatten(forward_impl<double>(t, tokens, nullptr));
}

// ---- naive token-at-a-time forward (run.c loop order) -----------------------------------------

namespace {

void matvec(const float* W, const float* x, float* y, int rows, int cols) {
    for (int r = 0; r < rows; ++r) {
        float s = 0;
        for (int j = 0; j < cols; ++j) s += W[size_t(r) * cols + j] * x[j];
        y[r] = s;
    }
}

void rmsnorm_vec(float* y, const float* x, const float* g, int n, float eps) {
    float ss = 0;
    for (int i = 0; i < n; ++i) ss += x[i] * x[i];
    ss = 1.0f / std::sqrt(ss / float(n) + eps);
    for (int i = 0; i < n; ++i) y[i] = g[i] * (ss * x[i]);
}

}  // namespace

std::vector<float> forward_all_naive(const Transformer& t, std::span<const int> tokens) {
    validate(t);
    const ModelConfig& c = t.config;
    const int n = int(tokens.size());
    need(n <= c.seq_len, "too many tokens");
    const int D = c.dim, F = c.hidden_dim, KV = c.kv_dim(), hd = c.head_dim(), V = c.vocab_size;
    const int group = c.n_heads / c.n_kv_heads;
    const RopeAngles angles = rope_angles(c.rope, c.rope_theta, hd, n);
    std::vector<float> kc(size_t(c.n_layers) * n * KV), vc(kc.size());
    std::vector<float> x(D), xb(D), xb2(D), q(D), hb(F), hb2(F), att(n), logits(size_t(n) * V);
    for (int pos = 0; pos < n; ++pos) {
        const int tok = tokens[size_t(pos)];
        need(tok >= 0 && tok < V, "token id out of range");
        std::copy_n(t.weights.token_embedding.data() + size_t(tok) * D, D, x.data());
        for (int l = 0; l < c.n_layers; ++l) {
            const LayerWeights& L = t.weights.layers[size_t(l)];
            float* k = kc.data() + (size_t(l) * n + pos) * KV;
            float* v = vc.data() + (size_t(l) * n + pos) * KV;
            rmsnorm_vec(xb.data(), x.data(), L.rms_att.data(), D, c.rms_eps);
            matvec(L.wq.data(), xb.data(), q.data(), D, D);
            matvec(L.wk.data(), xb.data(), k, KV, D);
            matvec(L.wv.data(), xb.data(), v, KV, D);
            for (int h0 = 0; h0 < D; h0 += hd)
                for (int j = 0; j < int(angles.freq.size()); ++j) {
                    const double ang = double(pos) * angles.freq[size_t(j)];
                    const float fc = float(std::cos(ang) * angles.cs_scale), fs = float(std::sin(ang) * angles.cs_scale);
                    const int i0 = h0 + (c.rope.rotate_half ? j : 2 * j);
                    const int i1 = h0 + (c.rope.rotate_half ? j + int(angles.freq.size()) : 2 * j + 1);
                    for (int which = 0; which < (h0 < KV ? 2 : 1); ++which) {
                        float* vec = which == 0 ? q.data() : k;
                        const float a = vec[i0], b = vec[i1];
                        vec[i0] = a * fc - b * fs;
                        vec[i1] = a * fs + b * fc;
                    }
                }
            std::fill(xb.begin(), xb.end(), 0.0f);
            for (int h = 0; h < c.n_heads; ++h) {
                const float* qh = q.data() + h * hd;
                const int g = h / group;
                float mx = -std::numeric_limits<float>::infinity();
                for (int tt = 0; tt <= pos; ++tt) {
                    const float* kt = kc.data() + (size_t(l) * n + tt) * KV + g * hd;
                    float s = 0;
                    for (int i = 0; i < hd; ++i) s += qh[i] * kt[i];
                    att[size_t(tt)] = s / std::sqrt(float(hd));
                    mx = std::max(mx, att[size_t(tt)]);
                }
                float sum = 0;
                for (int tt = 0; tt <= pos; ++tt) sum += (att[size_t(tt)] = std::exp(att[size_t(tt)] - mx));
                for (int tt = 0; tt <= pos; ++tt) {
                    const float a = att[size_t(tt)] / sum;
                    const float* vt = vc.data() + (size_t(l) * n + tt) * KV + g * hd;
                    for (int i = 0; i < hd; ++i) xb[size_t(h * hd + i)] += a * vt[i];
                }
            }
            matvec(L.wo.data(), xb.data(), xb2.data(), D, D);
            for (int i = 0; i < D; ++i) x[size_t(i)] += xb2[size_t(i)];
            rmsnorm_vec(xb.data(), x.data(), L.rms_ffn.data(), D, c.rms_eps);
            matvec(L.w1.data(), xb.data(), hb.data(), F, D);
            matvec(L.w3.data(), xb.data(), hb2.data(), F, D);
            for (int i = 0; i < F; ++i) {
                const float a = hb[size_t(i)];
                hb[size_t(i)] = a / (1.0f + std::exp(-a)) * hb2[size_t(i)];
            }
            matvec(L.w2.data(), hb.data(), xb2.data(), D, F);
            for (int i = 0; i < D; ++i) x[size_t(i)] += xb2[size_t(i)];
        }
        rmsnorm_vec(xb.data(), x.data(), t.weights.rms_final.data(), D, c.rms_eps);
        matvec(t.classifier(), xb.data(), logits.data() + size_t(pos) * V, V, D);
    }
    return logits;
}

}  // namespace kvgate_oracle
