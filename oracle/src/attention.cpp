#include "kvgate_oracle/attention.hpp"

#include <Eigen/Dense>

#include <cmath>
#include <stdexcept>

namespace kvgate_oracle {

// One templated body, T = float or double: for each (query i, head j)
//   s_t = scale · q·k_t  (t visible),  p = softmax(s),  out = Σ p_t v_t.
template <typename T>
static void sdpa(const AttnShape& a, const float* q, const float* k, const float* v, T* out) {
    using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;
    using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using FRowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using Strided = Eigen::Map<const FRowMat, 0, Eigen::OuterStride<>>;
    if (a.n_q < 0 || a.n_kv < 0 || a.head_dim <= 0 || a.n_kv_heads <= 0 || a.n_q_heads <= 0 ||
        a.n_q_heads % a.n_kv_heads != 0 || a.q_pos0 < 0)
        throw std::invalid_argument("sdpa: bad AttnShape");
    const int D = a.head_dim, group = a.n_q_heads / a.n_kv_heads;
    const T scale = a.softmax_scale > 0 ? T(a.softmax_scale) : T(1) / std::sqrt(T(D));
    if (a.window < 0 || !(a.softcap >= 0)) throw std::invalid_argument("sdpa: bad window or softcap");
    for (int i = 0; i < a.n_q; ++i) {
        const int qpos = a.q_pos0 + i;
        const int n_vis = std::min(a.n_kv, qpos + 1);  // causal, existing keys only
        // Sliding window: the first visible key is the smallest t with qpos - t < window.
        int t_begin = 0;
        if (a.window > 0)
            while (t_begin < n_vis && qpos - t_begin >= a.window) ++t_begin;
        const int n_win = n_vis - t_begin;
        for (int j = 0; j < a.n_q_heads; ++j) {
            const int g = j / group;
            Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>> o(out + (size_t(i) * a.n_q_heads + j) * D, D);
            if (n_win <= 0) { o.setZero(); continue; }
            Vec qv = Eigen::Map<const Eigen::VectorXf>(q + (size_t(i) * a.n_q_heads + j) * D, D).template cast<T>();
            // K_g, V_g: [n_win][D] views (rows t_begin..n_vis-1) with row stride n_kv_heads·D.
            const size_t row0 = size_t(t_begin) * a.n_kv_heads * D + size_t(g) * D;
            RowMat K = Strided(k + row0, n_win, D, Eigen::OuterStride<>(a.n_kv_heads * D)).template cast<T>();
            RowMat V = Strided(v + row0, n_win, D, Eigen::OuterStride<>(a.n_kv_heads * D)).template cast<T>();
            Vec s = (K * qv) * scale;
            if (a.softcap > 0) {
                const T cap = T(a.softcap);
                s = (s.array() / cap).tanh().matrix() * cap;
            }
            Vec p = (s.array() - s.maxCoeff()).exp().matrix();
            o = (V.transpose() * p) / p.sum();
        }
    }
}

void sdpa_f32(const AttnShape& a, const float* q, const float* k, const float* v, float* out) {
    sdpa<float>(a, q, k, v, out);
}

void sdpa_f64(const AttnShape& a, const float* q, const float* k, const float* v, double* out) {
    sdpa<double>(a, q, k, v, out);
}

void mla_attention_f64(const MlaShape& a, const float* q, const float* latent, const float* rope_k, const float* wkv_b,
                       double* out) {
    const int H = a.n_heads, N = a.nope, R = a.rope, VD = a.v_dim, KL = a.kv_lora, QK = N + R;
    using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const Mat C = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
                      latent, a.n_kv, KL).cast<double>();
    const Mat Rk = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
                       rope_k, a.n_kv, R).cast<double>();
    const Mat W = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
                      wkv_b, size_t(H) * (N + VD), KL).cast<double>();
    for (int h = 0; h < H; ++h) {
        // Expanded keys [n_kv][N + R] and values [n_kv][VD] of head h.
        Mat K(a.n_kv, QK);
        K.leftCols(N) = C * W.middleRows(size_t(h) * (N + VD), N).transpose();
        K.rightCols(R) = Rk;
        const Mat V = C * W.middleRows(size_t(h) * (N + VD) + N, VD).transpose();
        for (int i = 0; i < a.n_q; ++i) {
            const int n_vis = std::min(a.n_kv, a.q_pos0 + i + 1);
            Eigen::Map<Eigen::VectorXd> o(out + (size_t(i) * H + h) * VD, VD);
            if (n_vis <= 0) { o.setZero(); continue; }
            const Eigen::VectorXd qv =
                Eigen::Map<const Eigen::VectorXf>(q + (size_t(i) * H + h) * QK, QK).cast<double>();
            const Eigen::VectorXd s = (K.topRows(n_vis) * qv) * a.softmax_scale;
            const Eigen::VectorXd p = (s.array() - s.maxCoeff()).exp().matrix();
            o = (V.topRows(n_vis).transpose() * p) / p.sum();
        }
    }
}

}  // namespace kvgate_oracle
