// The CUDA-vs-CPU f32 logits bound of the GPU model gates (MOD.cuda.logits.f32, MOD.cuda.window_release):
// per position |gpu - cpu| <= B_gpu(p) + B_cpu(p), B = forward_f32_logit_bound (bounds.hpp, the binary32
// rounding chain of the forward, gamma_N * max|z|). The GPU's chain is the CPU's plus, per layer,
// 8 + n_ctx roundings: the q prescale by scale*log2(e) (1), exp2/expf approximations of <= 2 ulp
// (softmax, SiLU: 4), the split/tile merge (3), and at most one online-softmax rescale per key (n_ctx;
// a sliding window reads fewer keys, so the count stays an upper bound). cuBLAS sums the same terms in
// another order: the chain counts n roundings per length-n dot product whatever the order. NMSE <= the
// NMSE of the bound; a top-1 difference only where the CPU's top-2 gap is within 2x the bound.
#pragma once
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "bounds.hpp"
#include "kvgate/model.hpp"
#include "kvgate/sampler.hpp"

namespace kvgate::gates::cuda_gate {

struct F32Check {
  double worst_ratio = 0, max_abs = 0, max_bound = 0, nmse = 0, nmse_bound = 0, rms = 0, min_std = 1e30;
  int worst_pos = 0, over = 0, positions = 0, top1_agree = 0, top1_unexplained = 0;
  long nonfinite = 0;
};

inline constexpr double kGpuExtraPerLayer = 8;  // + n_ctx per layer (see the header)

inline F32Check check_f32(const std::vector<std::vector<float>>& cpu, const std::vector<std::vector<float>>& gpu,
                          const ModelConfig& c) {
  F32Check r;
  const int V = c.vocab_size;
  double num = 0, den = 0, bnum = 0, sum_sq = 0;
  long n_vals = 0;
  for (std::size_t s = 0; s < cpu.size(); ++s) {
    const int n = static_cast<int>(cpu[s].size() / V);
    for (int p = 0; p < n; ++p) {
      const float* a = cpu[s].data() + static_cast<std::size_t>(p) * V;
      const float* b = gpu[s].data() + static_cast<std::size_t>(p) * V;
      double zmax = 0, mean = 0, e = 0;
      for (int v = 0; v < V; ++v) {
        if (!std::isfinite(b[v])) ++r.nonfinite;
        zmax = std::max(zmax, std::fabs(double(a[v])));
        mean += a[v];
      }
      mean /= V;
      double var = 0;
      for (int v = 0; v < V; ++v) var += (a[v] - mean) * (a[v] - mean);
      r.min_std = std::min(r.min_std, std::sqrt(var / V));
      const double chain_cpu = forward_rounding_chain(c.n_layers, c.dim, c.hidden_dim, c.head_dim, c.q_dim(), p);
      const double chain_gpu = chain_cpu + c.n_layers * (kGpuExtraPerLayer + (p + 1.0));
      const double bound = forward_f32_logit_bound(chain_cpu, zmax) + forward_f32_logit_bound(chain_gpu, zmax);
      r.max_bound = std::max(r.max_bound, bound);
      for (int v = 0; v < V; ++v) {
        const double d = double(b[v]) - double(a[v]);
        e = std::max(e, std::fabs(d));
        num += d * d;
        den += double(a[v]) * a[v];
        sum_sq += double(a[v]) * a[v];
        ++n_vals;
      }
      bnum += double(V) * bound * bound;
      r.max_abs = std::max(r.max_abs, e);
      if (e > bound) ++r.over;
      if (e / bound > r.worst_ratio) r.worst_ratio = e / bound, r.worst_pos = p;
      const int ia = argmax(std::span<const float>(a, V)), ib = argmax(std::span<const float>(b, V));
      if (ia == ib) ++r.top1_agree;
      else if (double(a[ia]) - double(a[ib]) > 2 * bound) ++r.top1_unexplained;
      ++r.positions;
    }
  }
  r.nmse = num / den;
  r.nmse_bound = bnum / den;
  r.rms = std::sqrt(sum_sq / double(n_vals));
  return r;
}

inline std::string describe(const F32Check& r) {
  std::ostringstream o;
  o << std::setprecision(4) << "nonfinite " << r.nonfinite << ", NMSE " << r.nmse << " (bound " << r.nmse_bound
    << "), max-abs " << r.max_abs << " (largest bound " << r.max_bound << "), worst max-abs/bound " << r.worst_ratio
    << " at position " << r.worst_pos << ", positions over the bound " << r.over << "/" << r.positions << ", top-1 "
    << r.top1_agree << "/" << r.positions << " agree (" << r.top1_unexplained << " unexplained)";
  return o.str();
}

}  // namespace kvgate::gates::cuda_gate
