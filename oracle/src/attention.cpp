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
    for (int i = 0; i < a.n_q; ++i) {
        const int n_vis = std::min(a.n_kv, a.q_pos0 + i + 1);  // causal window, existing keys only
        for (int j = 0; j < a.n_q_heads; ++j) {
            const int g = j / group;
            Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>> o(out + (size_t(i) * a.n_q_heads + j) * D, D);
            if (n_vis <= 0) { o.setZero(); continue; }
            Vec qv = Eigen::Map<const Eigen::VectorXf>(q + (size_t(i) * a.n_q_heads + j) * D, D).template cast<T>();
            // K_g, V_g: [n_vis][D] views with row stride n_kv_heads·D.
            RowMat K = Strided(k + size_t(g) * D, n_vis, D, Eigen::OuterStride<>(a.n_kv_heads * D)).template cast<T>();
            RowMat V = Strided(v + size_t(g) * D, n_vis, D, Eigen::OuterStride<>(a.n_kv_heads * D)).template cast<T>();
            Vec s = (K * qv) * scale;
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

}  // namespace kvgate_oracle
