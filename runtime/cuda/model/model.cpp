// CudaModel: the weights on the device, uploaded once (f32, or bf16 for the big synthetic model).
#include <cuda_bf16.h>

#include <cmath>
#include <cstring>

#include "kernels.hpp"
#include "kernels/common.cuh"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"

namespace kvgate::cuda {

const char* name(WeightType w) { return w == WeightType::bf16 ? "bf16" : "f32"; }

std::string forward_unsupported_reason(const ModelConfig& c) {
  if (c.dim < 1 || c.n_layers < 1 || c.n_heads < 1 || c.n_kv_heads < 1 || c.head_dim < 2 || c.vocab_size < 1 ||
      c.hidden_dim < 1)
    return "the model config has a zero dimension";
  if (c.head_dim % 2 != 0) return "RoPE needs an even head_dim (got " + std::to_string(c.head_dim) + ")";
  if (c.n_heads % c.n_kv_heads != 0)
    return "n_heads (" + std::to_string(c.n_heads) + ") is not a multiple of n_kv_heads (" +
           std::to_string(c.n_kv_heads) + ")";
  if (c.arch != "llama" && c.arch != "mistral" && c.arch != "qwen2" && c.arch != "qwen3" && c.arch != "gemma2" &&
      c.arch != "gemma3" && c.arch != "phi3")
    return "architecture '" + c.arch +
           "' is not one the forward implements (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3)";
  return {};
}

CudaModel::CudaModel(const ModelConfig& c, WeightType wt) : c_(c), wt_(wt) {
  if (const std::string why = forward_unsupported_reason(c); !why.empty())
    throw ModelError("cuda forward: " + why);
  const DeviceStatus& d = device_status();
  if (!d.available) throw std::runtime_error("cuda forward: " + d.reason);
}

CudaModel::~CudaModel() {
  for (void* p : allocs_) cudaFree(p);
}

void* CudaModel::alloc(std::size_t n, bool matrix) {
  const std::size_t bytes = std::max<std::size_t>(1, n) * (matrix && wt_ == WeightType::bf16 ? 2 : 4);
  void* p = nullptr;
  KVGATE_CUDA_CHECK(cudaMalloc(&p, bytes));
  allocs_.push_back(p);
  bytes_ += bytes;
  return p;
}

void* CudaModel::upload(const std::vector<float>& v, bool matrix) {
  if (v.empty()) return nullptr;
  void* p = alloc(v.size(), matrix);
  if (matrix && wt_ == WeightType::bf16) {
    std::vector<__nv_bfloat16> h(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) h[i] = __float2bfloat16_rn(v[i]);
    KVGATE_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  } else {
    KVGATE_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  }
  return p;
}

CudaModel::CudaModel(const Model& m, WeightType wt) : CudaModel(m.config, wt) {
  const ModelConfig& c = m.config;
  const ModelWeights& w = m.weights;
  if (static_cast<int>(w.layers.size()) != c.n_layers) throw ModelError("cuda forward: the model has no weights loaded");
  auto need = [&](const std::vector<float>& v, std::size_t n, const char* what) {
    if (v.size() != n)
      throw ModelError(std::string("cuda forward: tensor ") + what + " has " + std::to_string(v.size()) +
                       " elements, expected " + std::to_string(n));
  };
  const std::size_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim, hd = c.head_dim;
  need(w.tok_embeddings, static_cast<std::size_t>(c.vocab_size) * dim, "tok_embeddings");
  try {
    emb_ = upload(w.tok_embeddings, true);
    cls_ = w.classifier.empty() ? emb_ : upload(w.classifier, true);
    final_norm_ = static_cast<const float*>(upload(w.final_norm, false));
    for (const LayerWeights& L : w.layers) {
      need(L.wq, qd * dim, "wq");
      need(L.wk, kvd * dim, "wk");
      need(L.wv, kvd * dim, "wv");
      need(L.wo, dim * qd, "wo");
      need(L.w1, hid * dim, "w1");
      need(L.w2, dim * hid, "w2");
      need(L.w3, hid * dim, "w3");
      Layer d;
      d.attn_norm = static_cast<const float*>(upload(L.attn_norm, false));
      d.ffn_norm = static_cast<const float*>(upload(L.ffn_norm, false));
      d.wq = upload(L.wq, true);
      d.wk = upload(L.wk, true);
      d.wv = upload(L.wv, true);
      d.wo = upload(L.wo, true);
      d.w1 = upload(L.w1, true);
      d.w2 = upload(L.w2, true);
      d.w3 = upload(L.w3, true);
      if (c.qkv_bias) {
        need(L.bq, qd, "bq");
        need(L.bk, kvd, "bk");
        need(L.bv, kvd, "bv");
        d.bq = static_cast<const float*>(upload(L.bq, false));
        d.bk = static_cast<const float*>(upload(L.bk, false));
        d.bv = static_cast<const float*>(upload(L.bv, false));
      }
      if (c.post_norms) {
        need(L.post_attn_norm, dim, "post_attn_norm");
        need(L.post_ffn_norm, dim, "post_ffn_norm");
        d.post_attn_norm = static_cast<const float*>(upload(L.post_attn_norm, false));
        d.post_ffn_norm = static_cast<const float*>(upload(L.post_ffn_norm, false));
      }
      if (c.qk_norm) {
        need(L.q_norm, hd, "q_norm");
        need(L.k_norm, hd, "k_norm");
        d.q_norm = static_cast<const float*>(upload(L.q_norm, false));
        d.k_norm = static_cast<const float*>(upload(L.k_norm, false));
      }
      layers_.push_back(d);
    }
  } catch (...) {
    for (void* p : allocs_) cudaFree(p);
    allocs_.clear();
    throw;
  }
}

std::unique_ptr<CudaModel> CudaModel::random(const ModelConfig& c, WeightType wt, std::uint64_t seed) {
  std::unique_ptr<CudaModel> m(new CudaModel(c, wt));
  const bool bf = wt == WeightType::bf16;
  std::uint64_t stream_id = 0;
  auto mat = [&](std::size_t n_out, std::size_t n_in) {
    void* p = m->alloc(n_out * n_in, true);
    model_kernels::fill_uniform(p, bf, n_out * n_in, seed * 0x9E3779B97F4A7C15ull + ++stream_id,
                                1.0f / std::sqrt(static_cast<float>(n_in)), nullptr);
    return p;
  };
  auto gains = [&](std::size_t n) {
    auto* p = static_cast<float*>(m->alloc(n, false));
    model_kernels::fill_const(p, n, 1.0f, nullptr);
    return p;
  };
  const std::size_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim, V = c.vocab_size;
  void* emb = m->alloc(V * dim, true);
  model_kernels::fill_uniform(emb, bf, V * dim, seed * 0x9E3779B97F4A7C15ull + ++stream_id, 1.0f, nullptr);
  m->emb_ = emb;
  m->cls_ = c.tied_embeddings ? emb : mat(V, dim);
  m->final_norm_ = gains(dim);
  for (int l = 0; l < c.n_layers; ++l) {
    Layer d;
    d.attn_norm = gains(dim);
    d.ffn_norm = gains(dim);
    d.wq = mat(qd, dim);
    d.wk = mat(kvd, dim);
    d.wv = mat(kvd, dim);
    d.wo = mat(dim, qd);
    d.w1 = mat(hid, dim);
    d.w2 = mat(dim, hid);
    d.w3 = mat(hid, dim);
    if (c.qkv_bias) {
      auto z = [&](std::size_t n) {
        auto* p = static_cast<float*>(m->alloc(n, false));
        model_kernels::fill_const(p, n, 0.0f, nullptr);
        return p;
      };
      d.bq = z(qd);
      d.bk = z(kvd);
      d.bv = z(kvd);
    }
    if (c.qk_norm) {
      d.q_norm = gains(c.head_dim);
      d.k_norm = gains(c.head_dim);
    }
    if (c.post_norms) {  // Gemma-shaped: the two sandwich norms (stored as 1 + w: unit gains)
      d.post_attn_norm = gains(dim);
      d.post_ffn_norm = gains(dim);
    }
    m->layers_.push_back(d);
  }
  KVGATE_CUDA_CHECK(cudaDeviceSynchronize());
  return m;
}

}  // namespace kvgate::cuda
