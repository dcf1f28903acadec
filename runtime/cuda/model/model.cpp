// CudaModel: the weights on the device, uploaded once (f32, or bf16 for the big synthetic model).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels.hpp"
#include "kernels/common.cuh"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/memory_info.hpp"
#include "kvgate/numeric.hpp"
#include "kvgate/parallel.hpp"

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
      c.arch != "gemma3" && c.arch != "phi3" && c.arch != "qwen3_moe" && c.arch != "mixtral" &&
      c.arch != "deepseek_v3")
    return "architecture '" + c.arch +
           "' is not one the forward implements (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, qwen3_moe, "
           "mixtral, deepseek_v3)";
  if (c.mla.any() && c.n_heads > 64)
    return "latent attention with more than 64 heads is not supported by the CUDA assemble kernel";
  if (c.moe.any() && c.moe.top_k > 64)
    return "num_experts_per_tok = " + std::to_string(c.moe.top_k) + " is above the CUDA router kernel's 64";
  return {};
}

// The bf16 weight upload: f32 host weights are rounded (RNE, __float2bfloat16_rn) on all cores
// into one of two page-locked staging buffers while the other one is copied to the device, so the
// conversion of a piece overlaps the copy of the previous one (also across tensors). Without
// page-locked memory (cudaMallocHost refused) it converts into a pageable buffer and copies
// synchronously: the same bytes arrive either way.
class CudaModel::Bf16Staging {
 public:
  static constexpr std::size_t kElems = std::size_t{1} << 23;  // per buffer: 16 MB of bf16

  Bf16Staging() {
    try {
      for (int b = 0; b < 2; ++b) {
        if (cudaMallocHost(&buf_[b], kElems * sizeof(__nv_bfloat16)) != cudaSuccess) {
          (void)cudaGetLastError();  // clear the (non-sticky) error of the refused allocation
          buf_[b] = nullptr;
          release();
          pageable_.resize(kElems);
          return;
        }
        KVGATE_CUDA_CHECK(cudaEventCreateWithFlags(&done_[b], cudaEventDisableTiming));
      }
      KVGATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    } catch (...) {
      release();
      throw;
    }
  }
  ~Bf16Staging() {
    if (stream_) (void)cudaStreamSynchronize(stream_);
    release();
  }
  Bf16Staging(const Bf16Staging&) = delete;
  Bf16Staging& operator=(const Bf16Staging&) = delete;

  // Queues dst[0, n) = bf16(src[0, n)) for an FP32 or 16-bit source (16-bit bf16: the bits as
  // stored; f16: through its exact FP32 value); the copies may still run on return (finish() waits).
  void put(void* dst, const WeightView& src, std::size_t n) {
    if (src.dtype == WeightDtype::f32) return put(dst, src.f32(), n);
    const bool bf = src.dtype == WeightDtype::bf16;
    put_with(dst, n, [&](__nv_bfloat16* h, std::size_t done, std::size_t m) {
      const std::uint16_t* s = src.half() + done;
      parallel_ranges(m, std::size_t{1} << 20, 0, [&](std::size_t b, std::size_t e) {
        if (bf) {
          std::memcpy(h + b, s + b, (e - b) * sizeof(std::uint16_t));
        } else {
          for (std::size_t i = b; i < e; ++i) h[i] = __float2bfloat16_rn(f16_to_f32(s[i]));
        }
      });
    });
  }
  void put(void* dst, const float* src, std::size_t n) {
    put_with(dst, n, [&](__nv_bfloat16* h, std::size_t done, std::size_t m) {
      const float* s = src + done;
      parallel_ranges(m, std::size_t{1} << 20, 0, [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) h[i] = __float2bfloat16_rn(s[i]);
      });
    });
  }
  template <class Fill>  // fill(h, done, m): h[0, m) = bf16 of source elements [done, done + m)
  void put_with(void* dst, std::size_t n, Fill&& fill) {
    auto* d = static_cast<__nv_bfloat16*>(dst);
    for (std::size_t done = 0; done < n;) {
      const std::size_t m = std::min(kElems, n - done);
      __nv_bfloat16* h = pageable_.empty() ? buf_[cur_] : pageable_.data();
      if (pageable_.empty()) KVGATE_CUDA_CHECK(cudaEventSynchronize(done_[cur_]));  // its last copy is over
      fill(h, done, m);
      if (pageable_.empty()) {
        KVGATE_CUDA_CHECK(cudaMemcpyAsync(d + done, h, m * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice, stream_));
        KVGATE_CUDA_CHECK(cudaEventRecord(done_[cur_], stream_));
        cur_ ^= 1;
      } else {
        KVGATE_CUDA_CHECK(cudaMemcpy(d + done, h, m * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
      }
      done += m;
    }
  }
  void finish() {
    if (stream_) KVGATE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  void release() {
    for (int b = 0; b < 2; ++b) {
      if (done_[b]) (void)cudaEventDestroy(done_[b]);
      if (buf_[b]) (void)cudaFreeHost(buf_[b]);
      done_[b] = nullptr;
      buf_[b] = nullptr;
    }
    if (stream_) (void)cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  __nv_bfloat16* buf_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {nullptr, nullptr};
  cudaStream_t stream_ = nullptr;
  int cur_ = 0;
  std::vector<__nv_bfloat16> pageable_;
};

CudaModel::CudaModel(const ModelConfig& c, WeightType wt, LayerRange range) : c_(c), wt_(wt), range_(range) {
  if (const std::string why = forward_unsupported_reason(c); !why.empty())
    throw ModelError("cuda forward: " + why);
  if (range.first < 0 || range.end_of(c) > c.n_layers || range.first >= range.end_of(c))
    throw ModelError("cuda forward: the layer range [" + std::to_string(range.first) + ", " +
                     std::to_string(range.end_of(c)) + ") is not a non-empty range of the model's " +
                     std::to_string(c.n_layers) + " layers");
  range_.end = range.end_of(c);
  const DeviceStatus& d = device_status();
  if (!d.available) throw std::runtime_error("cuda forward: " + d.reason);
  KVGATE_CUDA_CHECK(cudaGetDevice(&device_));
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
  return upload(WeightView::of_f32(v.data(), v.size()), matrix);
}

void* CudaModel::upload(const WeightView& v, bool matrix) {
  if (v.empty()) return nullptr;
  const std::size_t n = v.n;
  void* p = alloc(n, matrix);
  if (matrix && wt_ == WeightType::bf16) {
    if (!staging_) staging_ = std::make_unique<Bf16Staging>();
    staging_->put(p, v, n);
  } else if (v.dtype == WeightDtype::f32) {
    KVGATE_CUDA_CHECK(cudaMemcpy(p, v.f32(), n * 4, cudaMemcpyHostToDevice));
  } else {  // a 16-bit weight for FP32 device weights: converted (exactly) a piece at a time
    constexpr std::size_t kPiece = std::size_t{1} << 22;
    std::vector<float> piece(std::min(kPiece, n));
    for (std::size_t o = 0; o < n; o += kPiece) {
      const std::size_t m = std::min(kPiece, n - o);
      parallel_ranges(m, std::size_t{1} << 20, 0,
                      [&](std::size_t b, std::size_t e) { v.to_f32(o + b, e - b, piece.data() + b); });
      KVGATE_CUDA_CHECK(cudaMemcpy(static_cast<float*>(p) + o, piece.data(), m * 4, cudaMemcpyHostToDevice));
    }
  }
  return p;
}

// Device bytes the weights take once uploaded: matrices at the weight type's width, the rest FP32.
std::size_t CudaModel::device_bytes(const ModelWeights& w, WeightType wt) {
  const std::size_t mb = wt == WeightType::bf16 ? 2 : 4;
  std::size_t b = 0;
  w.for_each_tensor([&](const auto& t, bool matrix) { b += t.size() * (matrix ? mb : 4); });
  return b;
}

std::size_t CudaModel::device_bytes(const ModelWeights& w, const ModelConfig& c, WeightType wt, LayerRange r) {
  const std::size_t mb = wt == WeightType::bf16 ? 2 : 4;
  std::size_t b = 0;
  auto add = [&](const auto& t, bool matrix) { b += t.size() * (matrix ? mb : 4); };
  if (r.embeds() || (r.has_head(c) && w.classifier.empty())) add(w.tok_embeddings, true);
  if (r.has_head(c)) {
    add(w.classifier, true);
    add(w.final_norm, false);
  }
  for (int l = r.first; l < r.end_of(c) && l < static_cast<int>(w.layers.size()); ++l)
    w.layers[static_cast<std::size_t>(l)].for_each_tensor(add);
  return b;
}

CudaModel::CudaModel(const Model& m, WeightType wt, LayerRange range) : CudaModel(m.config, wt, range) {
  const ModelConfig& c = m.config;
  const ModelWeights& w = m.weights;
  if (static_cast<int>(w.layers.size()) != c.n_layers) throw ModelError("cuda forward: the model has no weights loaded");
  // Refused before any allocation when the device cannot hold the weights.
  {
    const std::size_t want = device_bytes(w, c, wt_, range_);
    std::size_t free_b = 0, total_b = 0;
    KVGATE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (want > free_b)
      throw ModelError("cuda forward: the weights need " + format_bytes_exact(want) + " on the device as " + name(wt_) +
                       " matrices, but the device has " + format_bytes_exact(free_b) + " free of " + format_bytes_exact(total_b) +
                       " (cudaMemGetInfo)" +
                       (wt_ == WeightType::f32 ? "; upload them as bf16 (--cuda-weights bf16), " : "; ") +
                       "use a GPU with more memory, or free it");
  }
  auto need = [&](const auto& v, std::size_t n, const char* what) {
    if (v.size() != n)
      throw ModelError(std::string("cuda forward: tensor ") + what + " has " + std::to_string(v.size()) +
                       " elements, expected " + std::to_string(n));
  };
  const std::size_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim, hd = c.head_dim;
  need(w.tok_embeddings, static_cast<std::size_t>(c.vocab_size) * dim, "tok_embeddings");
  try {
    const bool head = range_.has_head(c);
    if (range_.embeds() || (head && w.classifier.empty())) emb_ = upload(w.tok_embeddings, true);
    if (head) {
      cls_ = w.classifier.empty() ? emb_ : upload(w.classifier, true);
      final_norm_ = static_cast<const float*>(upload(w.final_norm, false));
    }
    for (std::size_t li = 0; li < w.layers.size(); ++li) {
      const LayerWeights& L = w.layers[li];
      Layer d;
      if (!range_.holds(c, static_cast<int>(li))) {  // another pipeline stage's layer
        layers_.push_back(d);
        continue;
      }
      if (c.mla.any()) {  // latent attention projections (validate_weights checked their sizes)
        const MlaConfig& a = c.mla;
        const std::size_t H = static_cast<std::size_t>(c.n_heads), QK = static_cast<std::size_t>(a.nope_dim + a.rope_dim);
        need(L.wkv_a, static_cast<std::size_t>(a.kv_lora_rank + a.rope_dim) * dim, "kv_a_proj_with_mqa");
        need(L.wkv_b, H * static_cast<std::size_t>(a.nope_dim + a.v_dim) * a.kv_lora_rank, "kv_b_proj");
        need(L.wq, H * QK * (a.q_lora_rank > 0 ? static_cast<std::size_t>(a.q_lora_rank) : dim), "q_proj / q_b_proj");
        need(L.wo, dim * H * a.v_dim, "wo");
        if (a.q_lora_rank > 0) {
          d.wq_a = upload(L.wq_a, true);
          d.q_a_norm = static_cast<const float*>(upload(L.q_a_norm, false));
        }
        d.wkv_a = upload(L.wkv_a, true);
        d.kv_a_norm = static_cast<const float*>(upload(L.kv_a_norm, false));
        d.wkv_b = upload(L.wkv_b, true);
      } else {
        need(L.wq, qd * dim, "wq");
        need(L.wk, kvd * dim, "wk");
        need(L.wv, kvd * dim, "wv");
        need(L.wo, dim * qd, "wo");
      }
      if (c.moe.is_moe(static_cast<int>(li))) {  // router + every expert, one allocation per matrix
        const std::size_t E = static_cast<std::size_t>(c.moe.n_experts), I = static_cast<std::size_t>(c.moe.expert_dim);
        need(L.router, E * dim, "router");
        need(L.ew1, E * I * dim, "experts w1");
        need(L.ew2, E * dim * I, "experts w2");
        need(L.ew3, E * I * dim, "experts w3");
        d.router = upload(L.router, true);
        for (std::size_t e = 0; e < E; ++e) {
          d.ew1.push_back(upload(L.ew1.view(e * I * dim, I * dim), true));
          d.ew2.push_back(upload(L.ew2.view(e * I * dim, I * dim), true));
          d.ew3.push_back(upload(L.ew3.view(e * I * dim, I * dim), true));
        }
        if (c.moe.router == MoeConfig::Router::sigmoid_groups) {
          need(L.router_bias, E, "router bias");
          d.router_bias = static_cast<const float*>(upload(L.router_bias, false));
        }
        if (c.moe.shared_dim > 0) {
          const std::size_t S = static_cast<std::size_t>(c.moe.shared_dim);
          need(L.sw1, S * dim, "shared w1");
          need(L.sw2, dim * S, "shared w2");
          need(L.sw3, S * dim, "shared w3");
          d.sw1 = upload(L.sw1, true);
          d.sw2 = upload(L.sw2, true);
          d.sw3 = upload(L.sw3, true);
        }
      } else {
        need(L.w1, hid * dim, "w1");
        need(L.w2, dim * hid, "w2");
        need(L.w3, hid * dim, "w3");
        d.w1 = upload(L.w1, true);
        d.w2 = upload(L.w2, true);
        d.w3 = upload(L.w3, true);
      }
      d.attn_norm = static_cast<const float*>(upload(L.attn_norm, false));
      d.ffn_norm = static_cast<const float*>(upload(L.ffn_norm, false));
      d.wq = upload(L.wq, true);
      d.wk = upload(L.wk, true);
      d.wv = upload(L.wv, true);
      d.wo = upload(L.wo, true);
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
    if (staging_) staging_->finish();  // every queued copy has landed before the model is used
    staging_.reset();
  } catch (...) {
    staging_.reset();  // waits for the queued copies before their buffers are freed
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
  auto zeros = [&](std::size_t n) {
    auto* p = static_cast<float*>(m->alloc(n, false));
    model_kernels::fill_const(p, n, 0.0f, nullptr);
    return p;
  };
  // A refused cudaMalloc (out of device memory) throws from alloc() as "CUDA error: out of memory
  // (cudaMalloc...)"; say what was being allocated and how far it got (m frees what it holds).
  try {
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
      if (c.mla.any()) {  // latent attention: the shapes the checkpoint constructor uploads (wk/wv null)
        const MlaConfig& a = c.mla;
        const std::size_t H = static_cast<std::size_t>(c.n_heads), QK = static_cast<std::size_t>(a.nope_dim + a.rope_dim),
                          KL = static_cast<std::size_t>(a.kv_lora_rank), QL = static_cast<std::size_t>(a.q_lora_rank);
        if (a.q_lora_rank > 0) {
          d.wq_a = mat(QL, dim);
          d.q_a_norm = gains(QL);
          d.wq = mat(H * QK, QL);  // q_b_proj
        } else {
          d.wq = mat(H * QK, dim);  // q_proj
        }
        d.wkv_a = mat(KL + static_cast<std::size_t>(a.rope_dim), dim);
        d.kv_a_norm = gains(KL);
        d.wkv_b = mat(H * static_cast<std::size_t>(a.nope_dim + a.v_dim), KL);
        d.wo = mat(dim, H * static_cast<std::size_t>(a.v_dim));
      } else {
        d.wq = mat(qd, dim);
        d.wk = mat(kvd, dim);
        d.wv = mat(kvd, dim);
        d.wo = mat(dim, qd);
      }
      if (c.moe.is_moe(l)) {  // router + one allocation per expert matrix (w1/w2/w3 null)
        const std::size_t E = static_cast<std::size_t>(c.moe.n_experts), I = static_cast<std::size_t>(c.moe.expert_dim);
        d.router = mat(E, dim);
        for (std::size_t e = 0; e < E; ++e) {
          d.ew1.push_back(mat(I, dim));
          d.ew2.push_back(mat(dim, I));
          d.ew3.push_back(mat(I, dim));
        }
        if (c.moe.router == MoeConfig::Router::sigmoid_groups) d.router_bias = zeros(E);  // no correction
        if (c.moe.shared_dim > 0) {
          const std::size_t S = static_cast<std::size_t>(c.moe.shared_dim);
          d.sw1 = mat(S, dim);
          d.sw2 = mat(dim, S);
          d.sw3 = mat(S, dim);
        }
      } else {
        d.w1 = mat(hid, dim);
        d.w2 = mat(dim, hid);
        d.w3 = mat(hid, dim);
      }
      if (c.qkv_bias) {
        d.bq = zeros(qd);
        d.bk = zeros(kvd);
        d.bv = zeros(kvd);
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
  } catch (const std::exception& e) {
    std::size_t free_b = 0, total_b = 0;
    const bool info = cudaMemGetInfo(&free_b, &total_b) == cudaSuccess;
    if (!info) (void)cudaGetLastError();
    throw std::runtime_error("cuda forward: generating random " + std::string(name(wt)) + " weights failed after " +
                             format_bytes_exact(m->bytes_) + " had been allocated (layers done: " +
                             std::to_string(m->layers_.size()) + " of " + std::to_string(c.n_layers) + ")" +
                             (info ? "; with those held, the device has " + format_bytes_exact(free_b) + " free of " +
                                         format_bytes_exact(total_b) + " (cudaMemGetInfo)"
                                   : std::string()) +
                             ": " + e.what());
  }
  return m;
}

}  // namespace kvgate::cuda
