// CudaForward: the whole model on the device, step for step as runtime/src/forward_cpu.cpp.
//
// A forward call runs R "rows" (one token of one sequence each) through every layer. Their
// metadata (token ids, positions, store slots, per-row block tables and attention lengths) is
// staged once per call in one pinned host block and copied in one transfer; every layer reads it
// from the device. Attention is the CUDA decode kernel over the paged store with one query row
// per "sequence": row r of a chunk attends to its own sequence's first pos_r + 1 tokens, which is
// exactly causal attention (the chunk's rows are stored before attention reads them), and a
// decode batch is the same call with one row per sequence. Nothing in a layer depends on the
// host, so a decode batch is captured once as a CUDA graph and replayed.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "kernels.hpp"
#include "kernels/common.cuh"
#include "kvgate/cuda/engine.hpp"

namespace kvgate::cuda {

namespace mk = model_kernels;

namespace {

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLAS error ") + std::to_string(static_cast<int>(s)) + " in " + what);
}

constexpr std::size_t kCublasWorkspace = 32u << 20;  // explicit: no allocation inside graph capture

template <class T>
T* dmalloc(std::size_t n) {
  void* p = nullptr;
  KVGATE_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(1, n) * sizeof(T)));
  return static_cast<T*>(p);
}

}  // namespace

CudaForward::CudaForward(const CudaModel& model, CudaKvStore& store, CudaForwardOptions opts)
    : m_(model), store_(store), opts_(opts), c_(model.config()) {
  const StoreConfig& sc = store.config();
  latent_ = sc.layout == KvLayout::mla_latent;
  // A pipeline stage (CudaModel::range) keeps the KV of its own layers only: store layer l - first.
  const int n_stage_layers = m_.range().end_of(c_) - m_.range().first;
  int dev = 0;
  KVGATE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev != m_.device())
    throw EngineError("cuda forward: the current device is " + std::to_string(dev) + " but the weights live on device " +
                      std::to_string(m_.device()) + "; call cudaSetDevice(" + std::to_string(m_.device()) +
                      ") before making the forward");
  if (latent_) {  // the MLA latent cache: one latent row (kv_lora) and one RoPE key (rope) per token
    if (!c_.mla.any())
      throw EngineError("cuda forward: the KV store holds the MLA latent cache (layout mla_latent), but the model has "
                        "no latent attention; build the store with layout kv_heads");
    if (sc.n_layers != n_stage_layers || sc.n_kv_heads != 1 || sc.head_dim != c_.mla.kv_lora_rank ||
        sc.half_geometry(KvHalf::V).head_dim != c_.mla.rope_dim)
      throw EngineError("cuda forward: the latent KV store's shape (layers " + std::to_string(sc.n_layers) + ", latent " +
                        std::to_string(sc.head_dim) + ", RoPE key " + std::to_string(sc.half_geometry(KvHalf::V).head_dim) +
                        ") does not match the model's (layers " + std::to_string(n_stage_layers) + ", kv_lora_rank " +
                        std::to_string(c_.mla.kv_lora_rank) + ", qk_rope_head_dim " + std::to_string(c_.mla.rope_dim) + ")");
    for (int l = 0; l < c_.n_layers; ++l)
      if (c_.window(l) > 0)
        throw EngineError("cuda forward: layer " + std::to_string(l) + " has a sliding window, which the latent kernel "
                          "does not read; run the MLA model with --mla-cache expanded");
  } else if (sc.n_layers != n_stage_layers || sc.n_kv_heads != c_.n_kv_heads || sc.head_dim != c_.head_dim) {
    throw EngineError("cuda forward: the KV store's shape (layers " + std::to_string(sc.n_layers) + ", kv heads " +
                      std::to_string(sc.n_kv_heads) + ", head_dim " + std::to_string(sc.head_dim) +
                      ") does not match the model's (layers " + std::to_string(n_stage_layers) +
                      (n_stage_layers != c_.n_layers ? " of this pipeline stage" : "") + ", kv heads " +
                      std::to_string(c_.n_kv_heads) + ", head_dim " + std::to_string(c_.head_dim) + ")");
  }
  const OpSupport sup = latent_ ? supports_op(Op::decode, sc, c_.n_heads)
                                : supports_op(Op::decode, sc.format, sc.geometry(), c_.n_heads);
  if (!sup.ok)
    throw KvStoreError("cuda forward: attention over KV format '" + sc.format.name() + "' is not supported here (" +
                       sup.reason + "): " + sup.detail);
  if (opts_.max_rows < 1) throw EngineError("cuda forward: max_rows must be >= 1");
  max_ctx_ = opts_.max_context > 0 ? opts_.max_context : c_.max_seq_len;
  if (max_ctx_ < 1) throw EngineError("cuda forward: the context must be >= 1 token");
  table_stride_ = (max_ctx_ + sc.block_size - 1) / sc.block_size;
  // A blocking stream: it orders with the legacy default stream the store uses for page zeroing
  // (cudaMemset in the constructor and free_sequence) and page downloads.
  KVGATE_CUDA_CHECK(cudaStreamCreate(&stream_));
  cublasHandle_t h = nullptr;
  cublas_check(cublasCreate(&h), "cublasCreate");
  cublas_ = h;
  cublas_check(cublasSetStream(h, stream_), "cublasSetStream");
  // f32 weights: no TF32 (pedantic keeps every product and sum in binary32, the FP32 bound's model).
  cublas_check(cublasSetMathMode(h, m_.weight_type() == WeightType::f32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH),
               "cublasSetMathMode");
  KVGATE_CUDA_CHECK(cudaMalloc(&cublas_ws_, kCublasWorkspace));
  cublas_check(cublasSetWorkspace(h, cublas_ws_, kCublasWorkspace), "cublasSetWorkspace");

  const std::size_t R = static_cast<std::size_t>(opts_.max_rows);
  const std::size_t dim = c_.dim, qd = c_.q_dim(), kvd = c_.kv_dim(),
                    hid = std::max<std::size_t>({static_cast<std::size_t>(c_.hidden_dim),
                                                 c_.moe.any() ? static_cast<std::size_t>(c_.moe.expert_dim) : 0u,
                                                 static_cast<std::size_t>(c_.moe.shared_dim)});
  x_ = dmalloc<float>(R * dim);
  xb_ = dmalloc<float>(R * std::max(dim, qd));
  q_ = dmalloc<float>(R * qd);
  k_ = dmalloc<float>(R * kvd);
  v_ = dmalloc<float>(R * kvd);
  att_ = dmalloc<float>(R * qd);
  hb_ = dmalloc<float>(R * hid);
  hb2_ = dmalloc<float>(R * hid);
  if (c_.post_norms) post_ = dmalloc<float>(R * dim);
  if (c_.moe.any()) {
    const std::size_t E = static_cast<std::size_t>(c_.moe.n_experts);
    moe_logits_ = dmalloc<float>(R * E);
    moe_gate_ = dmalloc<float>(R * E);
    moe_acc_ = dmalloc<float>(R * dim);
    moe_y_ = dmalloc<float>(R * dim);
  }
  if (c_.mla.any()) {
    const MlaConfig& a = c_.mla;
    const std::size_t H = static_cast<std::size_t>(c_.n_heads);
    mla_qa_ = dmalloc<float>(R * static_cast<std::size_t>(std::max(1, a.q_lora_rank)));
    mla_ckv_ = dmalloc<float>(R * static_cast<std::size_t>(a.kv_lora_rank + a.rope_dim));
    mla_lat_ = dmalloc<float>(R * static_cast<std::size_t>(a.kv_lora_rank));
    mla_kvb_ = dmalloc<float>(R * H * static_cast<std::size_t>(a.nope_dim + a.v_dim));
    mla_att_ = dmalloc<float>(R * H * static_cast<std::size_t>(a.v_dim));
    if (latent_) {
      mla_qlat_ = dmalloc<float>(R * H * static_cast<std::size_t>(a.kv_lora_rank + a.rope_dim));
      mla_olat_ = dmalloc<float>(R * H * static_cast<std::size_t>(a.kv_lora_rank));
    }
  }
  logits_ = dmalloc<float>(R * static_cast<std::size_t>(c_.vocab_size));
  if (m_.weight_type() == WeightType::bf16)  // every GEMM input: also MLA's q_lora and kv_lora rows
    act16_ = dmalloc<std::uint16_t>(R * std::max({dim, qd, hid, static_cast<std::size_t>(c_.mla.q_lora_rank),
                                                  static_cast<std::size_t>(c_.mla.kv_lora_rank)}));
  d_argmax_ = dmalloc<int>(R);
  KVGATE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_argmax_), R * sizeof(int)));
  // Metadata block: tokens, positions, slots, lengths [R] each, then block tables [R][table_stride].
  meta_ints_ = 4 * R + R * static_cast<std::size_t>(table_stride_);
  meta_ = dmalloc<int>(meta_ints_);
  KVGATE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&meta_host_), meta_ints_ * sizeof(int)));
  d_tokens_ = meta_;
  d_pos_ = meta_ + R;
  d_slot_ = meta_ + 2 * R;
  d_lens_ = meta_ + 3 * R;
  d_tables_ = meta_ + 4 * R;

  // RoPE tables: the CPU's angles, pos * freq_i in binary32 (rope.hpp: freq_i = 1 / theta^(2i/d) as
  // run.c for the plain RoPE, the variant's frequencies otherwise), and the CPU's std::cos/std::sin
  // of them times the attention scaling (yarn, longrope); a few spare positions for the offset knob.
  const int half = c_.head_dim / 2;
  const std::size_t n_pos = static_cast<std::size_t>(max_ctx_) + 8;
  rot_ = rope_rotary_dim(c_.rope, c_.head_dim);
  rot_l_ = c_.has_rope_local ? rope_rotary_dim(c_.rope_local, c_.head_dim) : rot_;
  // The RoPE turns head_dim dims, or MLA's qk_rope_head_dim (tables keep the head_dim / 2 stride).
  const int rope_w = c_.mla.any() ? c_.mla.rope_dim : c_.head_dim;
  auto table = [&](const RopeConfig& r, float** d_cos, float** d_sin) {
    const RopeFrequencies f = rope_frequencies(r, c_.rope_theta, rope_w, 0);
    std::vector<float> cs(n_pos * half), sn(n_pos * half);
    for (std::size_t p = 0; p < n_pos; ++p)
      for (std::size_t i = 0; i < f.inv_freq.size(); ++i) {
        const float val = static_cast<float>(p) * f.inv_freq[i];
        float fc = std::cos(val), fs = std::sin(val);
        if (f.attention_scaling != 1.0f) fc *= f.attention_scaling, fs *= f.attention_scaling;
        cs[p * half + i] = fc;
        sn[p * half + i] = fs;
      }
    *d_cos = dmalloc<float>(cs.size());
    *d_sin = dmalloc<float>(sn.size());
    KVGATE_CUDA_CHECK(cudaMemcpy(*d_cos, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
    KVGATE_CUDA_CHECK(cudaMemcpy(*d_sin, sn.data(), sn.size() * 4, cudaMemcpyHostToDevice));
  };
  if (c_.rope.length_dependent()) {  // per-row tables, staged with each call
    const std::size_t n = 2 * R * static_cast<std::size_t>(half);
    rope_row_cos_ = dmalloc<float>(n);
    rope_row_sin_ = dmalloc<float>(n);
    KVGATE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&rope_row_host_), 2 * n * sizeof(float)));
    std::fill(rope_row_host_, rope_row_host_ + 2 * n, 0.0f);
    std::vector<int> idx(R);
    for (std::size_t r = 0; r < R; ++r) idx[r] = static_cast<int>(r);
    d_row_idx_ = dmalloc<int>(R);
    KVGATE_CUDA_CHECK(cudaMemcpy(d_row_idx_, idx.data(), R * sizeof(int), cudaMemcpyHostToDevice));
  } else {
    table(c_.rope, &rope_cos_, &rope_sin_);
  }
  if (c_.has_rope_local) {
    if (c_.rope_local.length_dependent())
      throw EngineError("cuda forward: a length-dependent RoPE (dynamic/longrope) on the sliding layers is not supported");
    table(c_.rope_local, &rope_cos_l_, &rope_sin_l_);
  }
}

// Length-dependent RoPE (dynamic NTK, longrope): each row's frequencies for its sequence's length
// after this call (the longest position reached + 1, as the CPU forward and transformers' cached
// generation: a chunk uses its last position + 1; a decode row its own position + 1).
void CudaForward::stage_rope_rows(const std::vector<SeqId>& row_seq, const std::vector<int>& row_pos) {
  const std::size_t R = row_seq.size(), maxR = static_cast<std::size_t>(opts_.max_rows);
  const int half = c_.head_dim / 2;
  std::map<SeqId, int> len;
  for (std::size_t r = 0; r < R; ++r) len[row_seq[r]] = std::max(len[row_seq[r]], row_pos[r] + 1);
  float* hc = rope_row_host_;
  float* hs = rope_row_host_ + 2 * maxR * half;
  int have_len = -1;
  RopeFrequencies f;
  for (std::size_t r = 0; r < R; ++r) {
    const int L = len[row_seq[r]];
    if (L != have_len)
      f = rope_frequencies(c_.rope, c_.rope_theta, c_.mla.any() ? c_.mla.rope_dim : c_.head_dim, L), have_len = L;
    for (int which = 0; which < 2; ++which) {  // q at pos, k at pos + offset
      const float p = static_cast<float>(row_pos[r] + (which ? k_rope_offset_ : 0));
      const std::size_t row = which ? maxR + r : r;
      for (std::size_t i = 0; i < f.inv_freq.size(); ++i) {
        const float val = p * f.inv_freq[i];
        float fc = std::cos(val), fs = std::sin(val);
        if (f.attention_scaling != 1.0f) fc *= f.attention_scaling, fs *= f.attention_scaling;
        hc[row * half + i] = fc;
        hs[row * half + i] = fs;
      }
    }
  }
  const std::size_t bytes = 2 * maxR * half * sizeof(float);
  KVGATE_CUDA_CHECK(cudaMemcpyAsync(rope_row_cos_, hc, bytes, cudaMemcpyHostToDevice, stream_));
  KVGATE_CUDA_CHECK(cudaMemcpyAsync(rope_row_sin_, hs, bytes, cudaMemcpyHostToDevice, stream_));
}

CudaForward::~CudaForward() {
  for (auto& [b, g] : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  if (cublas_) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  for (void* p : {static_cast<void*>(x_), static_cast<void*>(xb_), static_cast<void*>(q_), static_cast<void*>(k_),
                  static_cast<void*>(v_), static_cast<void*>(att_), static_cast<void*>(hb_), static_cast<void*>(hb2_),
                  static_cast<void*>(logits_), static_cast<void*>(post_), static_cast<void*>(rope_cos_), static_cast<void*>(rope_sin_), act16_,
                  static_cast<void*>(rope_cos_l_), static_cast<void*>(rope_sin_l_), static_cast<void*>(rope_row_cos_),
                  static_cast<void*>(rope_row_sin_), static_cast<void*>(d_row_idx_),
                  static_cast<void*>(meta_), static_cast<void*>(d_argmax_), cublas_ws_,
                  static_cast<void*>(moe_logits_), static_cast<void*>(moe_gate_), static_cast<void*>(moe_acc_),
                  static_cast<void*>(moe_y_), static_cast<void*>(mla_qa_), static_cast<void*>(mla_ckv_),
                  static_cast<void*>(mla_lat_), static_cast<void*>(mla_kvb_), static_cast<void*>(mla_att_), damage_prev_,
                  static_cast<void*>(mla_qlat_), static_cast<void*>(mla_olat_), static_cast<void*>(tp_partial_)})
    if (p) cudaFree(p);
  if (meta_host_) cudaFreeHost(meta_host_);
  if (rope_row_host_) cudaFreeHost(rope_row_host_);
  if (h_argmax_) cudaFreeHost(h_argmax_);
  if (stream_) cudaStreamDestroy(stream_);
}

// out[r][o] (+)= sum_i W[o][i] x[r][i]: column-major, out^T (n_out x rows) = W^T(col) * x^T.
void CudaForward::gemm(const void* W, const float* x, float* out, int rows, int n_in, int n_out, bool accumulate) {
  auto h = static_cast<cublasHandle_t>(cublas_);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if (m_.weight_type() == WeightType::f32) {
    cublas_check(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, rows, n_in, &alpha, static_cast<const float*>(W), n_in,
                             x, n_in, &beta, out, n_out),
                 "cublasSgemm");
  } else {
    mk::to_bf16(x, act16_, static_cast<std::size_t>(rows) * n_in, stream_);
    cublas_check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, rows, n_in, &alpha, W, CUDA_R_16BF, n_in, act16_,
                              CUDA_R_16BF, n_in, &beta, out, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  }
}

void CudaForward::stage(const std::vector<SeqId>& row_seq, const std::vector<int>& row_pos, std::span<const int> tokens,
                        int table_stride) {
  const std::size_t R = row_seq.size(), maxR = static_cast<std::size_t>(opts_.max_rows);
  const int B = store_.config().block_size;
  int* h = meta_host_;
  for (std::size_t r = 0; r < R; ++r) {
    const auto table = store_.block_table(row_seq[r]);
    const int pos = row_pos[r];
    h[r] = tokens[r];
    h[maxR + r] = pos;
    h[2 * maxR + r] = table[static_cast<std::size_t>(pos / B)] * B + pos % B;
    h[3 * maxR + r] = pos + 1;  // the row attends to its sequence's tokens 0..pos
    int* t = h + 4 * maxR + r * static_cast<std::size_t>(table_stride);
    const std::size_t n = std::min<std::size_t>(table.size(), static_cast<std::size_t>(table_stride));
    CudaKvStore::kernel_table(table, t, n);  // released pages (window release) read as a live one
    std::fill(t + n, t + table_stride, 0);
  }
  KVGATE_CUDA_CHECK(cudaMemcpyAsync(meta_, meta_host_, (4 * maxR + R * static_cast<std::size_t>(table_stride)) * sizeof(int),
                                    cudaMemcpyHostToDevice, stream_));
  if (rope_row_cos_) stage_rope_rows(row_seq, row_pos);
}

// Every layer over R staged rows. plan: a fixed decode plan (graph capture), else planned per call
// from the rows' longest attention span.
void CudaForward::layers(int R, int table_stride, int max_len, bool chunk, const DecodePlan* plan, DecodeWorkspace& ws,
                         const std::map<int, DecodePlan>* window_plans) {
  const ModelConfig& c = c_;
  const int dim = c.dim, qd = c.q_dim(), hid = c.hidden_dim, hd = c.head_dim;
  begin_layers(R);
  for (int l = m_.range().first; l < m_.range().end_of(c); ++l) {
    const CudaModel::Layer& L = m_.layer(l);
    // Attention block: xb = rmsnorm(x); q, k, v = xb Wq, xb Wk, xb Wv (+ bias).
    mk::rmsnorm(xb_, x_, L.attn_norm, R, dim, c.rms_eps, stream_);
    const std::size_t n_x = static_cast<std::size_t>(R) * dim;
    if (latent_) {  // MLA over the latent cache: x += o_proj(W_UV latent attention)
      mla_latent_block(L, l, R, table_stride, max_len, plan, ws);
      gemm(L.wo, mla_att_, x_, R, c.n_heads * c.mla.v_dim, dim, true);
    } else {
    attend(l, R, table_stride, max_len, chunk, plan, ws, window_plans);
    // x += att Wo (Gemma: x += rmsnorm_post(att Wo))
    if (c.mla.any()) {  // the heads' v outputs (the first v_head_dim of each padded head) feed o_proj
      const std::size_t VD = static_cast<std::size_t>(c.mla.v_dim);
      KVGATE_CUDA_CHECK(cudaMemcpy2DAsync(mla_att_, VD * sizeof(float), att_, static_cast<std::size_t>(hd) * sizeof(float),
                                          VD * sizeof(float), static_cast<std::size_t>(R) * c.n_heads,
                                          cudaMemcpyDeviceToDevice, stream_));
      gemm(L.wo, mla_att_, x_, R, c.n_heads * c.mla.v_dim, dim, true);
    } else if (c.post_norms) {
      gemm(L.wo, att_, post_, R, qd, dim, false);
      mk::rmsnorm(post_, post_, L.post_attn_norm, R, dim, c.rms_eps, stream_);
      mk::add(x_, post_, n_x, stream_);
    } else {
      gemm(L.wo, att_, x_, R, qd, dim, true);
    }
    }  // not the latent cache
    // FFN block: x += W2 (act(xb W1) * (xb W3)), xb = rmsnorm(x); act = SiLU, or the tanh GELU (Gemma).
    mk::rmsnorm(xb_, x_, L.ffn_norm, R, dim, c.rms_eps, stream_);
    if (c.moe.is_moe(l)) {  // routed experts: x += sum_e gate_e expert_e(xb)
      moe_ffn(L, R);
      mk::add(x_, moe_acc_, static_cast<std::size_t>(R) * dim, stream_);
      continue;
    }
    ffn_hidden_rows(L, R);
    if (c.post_norms) {
      gemm(L.w2, hb_, post_, R, hid, dim, false);
      mk::rmsnorm(post_, post_, L.post_ffn_norm, R, dim, c.rms_eps, stream_);
      mk::add(x_, post_, n_x, stream_);
    } else {
      gemm(L.w2, hb_, x_, R, hid, dim, true);
    }
  }
}

// The residual rows' start of a call (layers() and the tensor-parallel steps): the embedding of the
// staged tokens (a later pipeline stage: the rows its input stage left), and the K/V capture buffers.
void CudaForward::begin_layers(int R) {
  const ModelConfig& c = c_;
  const int dim = c.dim, kvd = c.kv_dim();
  if (m_.range().embeds()) {
    mk::embed(m_.tok_embeddings(), m_.weight_type() == WeightType::bf16, d_tokens_, x_, R, dim, stream_);
    if (c.embed_scale > 0) mk::scale(x_, static_cast<std::size_t>(R) * dim, c.embed_scale, stream_);  // Gemma
  } else {  // a later pipeline stage: the residual rows the previous stage left (on its device)
    KVGATE_CUDA_CHECK(cudaMemcpyAsync(x_, input_->x_, static_cast<std::size_t>(R) * dim * sizeof(float),
                                      cudaMemcpyDefault, stream_));
  }
  if (capture_kv_) {
    cap_k_.assign(static_cast<std::size_t>(c.n_layers) * R * kvd, 0.0f);
    cap_v_.assign(cap_k_.size(), 0.0f);
  }
}

// Layer l's attention of the R staged rows (xb_ normed, not the latent cache): q, k, v (MLA: its
// projections), bias, QK-norm, RoPE, the K/V capture, the store kernel, the damage, then attention
// from the store into att_ [R][q_dim]. The Wo GEMM is the caller's (layers(): accumulated into x_;
// the tensor-parallel step: into the partial buffer).
void CudaForward::attend(int l, int R, int table_stride, int max_len, bool chunk, const DecodePlan* plan,
                         DecodeWorkspace& ws, const std::map<int, DecodePlan>* window_plans) {
  const ModelConfig& c = c_;
  const int dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hd = c.head_dim;
  const bool interleaved = c.rope_style == RopeStyle::interleaved;
  const StoreConfig& sc = store_.config();
  const PageGeometry g = sc.geometry();
  const CudaModel::Layer& L = m_.layer(l);
    if (c.mla.any()) {
      mla_qkv(L, R);
    } else {
    gemm(L.wq, xb_, q_, R, dim, qd, false);
    gemm(L.wk, xb_, k_, R, dim, kvd, false);
    gemm(L.wv, xb_, v_, R, dim, kvd, false);
    if (c.qkv_bias) {
      mk::add_bias(q_, L.bq, R, qd, stream_);
      mk::add_bias(k_, L.bk, R, kvd, stream_);
      mk::add_bias(v_, L.bv, R, kvd, stream_);
    }
    if (c.qk_norm) {  // qwen3: RMSNorm over each head of q and k, before RoPE
      mk::rmsnorm(q_, q_, L.q_norm, R * c.n_heads, hd, c.rms_eps, stream_);
      mk::rmsnorm(k_, k_, L.k_norm, R * c.n_kv_heads, hd, c.rms_eps, stream_);
    }
    if (layer_uses_local_rope(c, l)) {  // Gemma 3 sliding layers: their own base
      mk::rope(q_, d_pos_, 0, R, c.n_heads, hd, rot_l_, interleaved, rope_cos_l_, rope_sin_l_, stream_);
      mk::rope(k_, d_pos_, k_rope_offset_, R, c.n_kv_heads, hd, rot_l_, interleaved, rope_cos_l_, rope_sin_l_, stream_);
    } else if (rope_row_cos_) {  // length-dependent RoPE: the rows staged with this call
      const int maxR = opts_.max_rows;
      mk::rope(q_, d_row_idx_, 0, R, c.n_heads, hd, rot_, interleaved, rope_row_cos_, rope_row_sin_, stream_);
      mk::rope(k_, d_row_idx_, maxR, R, c.n_kv_heads, hd, rot_, interleaved, rope_row_cos_, rope_row_sin_, stream_);
    } else {
      mk::rope(q_, d_pos_, 0, R, c.n_heads, hd, rot_, interleaved, rope_cos_, rope_sin_, stream_);
      mk::rope(k_, d_pos_, k_rope_offset_, R, c.n_kv_heads, hd, rot_, interleaved, rope_cos_, rope_sin_, stream_);
    }
    }  // not MLA
    if (capture_kv_) {
      const std::size_t off = static_cast<std::size_t>(l) * R * kvd;
      KVGATE_CUDA_CHECK(cudaMemcpyAsync(cap_k_.data() + off, k_, static_cast<std::size_t>(R) * kvd * 4,
                                        cudaMemcpyDeviceToHost, stream_));
      KVGATE_CUDA_CHECK(cudaMemcpyAsync(cap_v_.data() + off, v_, static_cast<std::size_t>(R) * kvd * 4,
                                        cudaMemcpyDeviceToHost, stream_));
    }
    // K/V rows go through the KV format (the CUDA store kernel); attention reads them back.
    for (KvHalf half : {KvHalf::K, KvHalf::V}) {
      StoreRowsArgs a;
      a.rows = half == KvHalf::K ? k_ : v_;
      a.row_stride = static_cast<std::size_t>(kvd);
      a.slot_mapping = d_slot_;
      a.n_tokens = R;
      a.pool = store_.pool(store_layer(l), half);
      a.page_stride = store_.page_stride(half);
      const CudaKvStore::KernelScales ks = store_.kernel_scales(store_layer(l), half);
      a.tensor_scale = ks.tensor;
      a.head_scales = ks.heads;
      store_rows(store_.half_format(half), g, a, stream_);
    }
    if (damage_) damage_rows(l, R);  // diagnostics: before attention reads the rows
    if (chunk && R > 1 && opts_.prefill_kernel) {  // one sequence's chunk: the causal prefill kernel
      PrefillArgs pa;
      pa.format = sc.format;
      pa.geometry = g;
      pa.n_heads = c.n_heads;
      pa.k_pool = store_.pool(store_layer(l), KvHalf::K);
      pa.v_pool = store_.pool(store_layer(l), KvHalf::V);
      pa.k_page_stride = store_.page_stride(KvHalf::K);
      pa.v_page_stride = store_.page_stride(KvHalf::V);
      pa.block_table = d_tables_;  // row 0: the sequence's pages
      pa.n_past = max_len - R;
      pa.n_new = R;
      pa.q = q_;
      pa.out = att_;
      set_kernel_scales(store_, store_layer(l), pa);
      pa.softmax_scale = c.attn_scale;  // Gemma: query_pre_attn_scalar^-0.5 (0: 1/sqrt(head_dim))
      pa.window = c.window(l);          // sliding layers read only their window
      pa.softcap = c.attn_softcap;      // Gemma 2: attn_logit_softcapping (0: none)
      prefill_attention(pa, stream_);
    } else {  // one query row per "sequence" (decode batch, or a chunk's rows with lengths pos+1)
    DecodeArgs da;
    da.format = sc.format;
    da.geometry = g;
    da.n_heads = c.n_heads;
    da.batch = R;
    da.k_pool = store_.pool(store_layer(l), KvHalf::K);
    da.v_pool = store_.pool(store_layer(l), KvHalf::V);
    da.k_page_stride = store_.page_stride(KvHalf::K);
    da.v_page_stride = store_.page_stride(KvHalf::V);
    da.block_tables = d_tables_;
    da.table_stride = table_stride;
    da.seq_lens = d_lens_;
    da.max_seq_len = max_len;
    da.q = q_;
    da.out = att_;
    set_kernel_scales(store_, store_layer(l), da);
    da.softmax_scale = c.attn_scale;
    da.window = c.window(l);
    da.softcap = c.attn_softcap;
    da.bytes_read = store_.read_counter();  // null unless the store counts (STO.cuda.bytes_read.forward)
    // Under a graph, a sliding layer takes the plan made for its window (splits over the window's keys),
    // not full attention's (whose splits would leave the whole window to one CTA per head).
    const DecodePlan* lp = plan;
    if (plan && da.window > 0 && window_plans)
      if (const auto it = window_plans->find(da.window); it != window_plans->end()) lp = &it->second;
    if (lp) decode_attention(da, *lp, ws, stream_);
    else decode_attention(da, ws, stream_);
    }
}

// The dense FFN's hidden rows of the R rows (xb_ normed): hb_ = act(xb W1) * (xb W3) [R][hidden];
// act = SiLU, or the tanh GELU (Gemma). The W2 GEMM is the caller's.
void CudaForward::ffn_hidden_rows(const CudaModel::Layer& L, int R) {
  const ModelConfig& c = c_;
  const int dim = c.dim, hid = c.hidden_dim;
    gemm(L.w1, xb_, hb_, R, dim, hid, false);
    gemm(L.w3, xb_, hb2_, R, dim, hid, false);
    if (c.ffn_act == FfnAct::gelu_tanh) mk::geglu(hb_, hb2_, static_cast<std::size_t>(R) * hid, stream_);
    else mk::swiglu(hb_, hb2_, static_cast<std::size_t>(R) * hid, stream_);
}

// Mixture-of-experts FFN of the R rows (xb_ normed): router GEMM, the route kernel (dense gate
// weights, 0 for experts a row did not pick), then every expert in increasing index over all rows
// and its output added with the row's weight where the row picked it. Every expert runs on every row
// (no host round trip, so decode graphs capture it); the sum per row runs over its experts in index
// order, as the CPU's. Simple, not fast: compute grows with the expert count.
void CudaForward::moe_ffn(const CudaModel::Layer& L, int R) {
  const MoeConfig& m = c_.moe;
  const int dim = c_.dim, E = m.n_experts, I = m.expert_dim;
  gemm(L.router, xb_, moe_logits_, R, dim, E, false);
  if (m.router == MoeConfig::Router::sigmoid_groups)
    mk::moe_route_groups(moe_logits_, L.router_bias, moe_gate_, R, E, m.top_k, m.n_group, m.topk_group, m.norm_topk,
                         m.routed_scale, stream_);
  else
    mk::moe_route(moe_logits_, moe_gate_, R, E, m.top_k, m.norm_topk, stream_);
  KVGATE_CUDA_CHECK(cudaMemsetAsync(moe_acc_, 0, static_cast<std::size_t>(R) * dim * sizeof(float), stream_));
  for (int e = 0; e < E; ++e) {
    const auto ue = static_cast<std::size_t>(e);
    gemm(L.ew1[ue], xb_, hb_, R, dim, I, false);
    gemm(L.ew3[ue], xb_, hb2_, R, dim, I, false);
    mk::swiglu(hb_, hb2_, static_cast<std::size_t>(R) * I, stream_);
    gemm(L.ew2[ue], hb_, moe_y_, R, I, dim, false);
    mk::moe_accumulate(moe_acc_, moe_y_, moe_gate_, e, E, R, dim, stream_);
  }
  if (m.shared_dim > 0) {  // DeepSeek's shared expert, added to the routed sum
    const int S = m.shared_dim;
    gemm(L.sw1, xb_, hb_, R, dim, S, false);
    gemm(L.sw3, xb_, hb2_, R, dim, S, false);
    mk::swiglu(hb_, hb2_, static_cast<std::size_t>(R) * S, stream_);
    gemm(L.sw2, hb_, moe_y_, R, S, dim, false);
    mk::add(moe_acc_, moe_y_, static_cast<std::size_t>(R) * dim, stream_);
  }
}

// MLA projections of the R rows (xb_ normed) into q_, k_, v_ as the CPU forward's mla_attention:
// q (q_proj, or q_b(rmsnorm(q_a))), the latent rmsnorm(kv_a[:kv_lora]) through kv_b, and the
// assemble kernel (RoPE of the rope parts, expanded K [k_nope | k_rope] and V [v | 0] per head).
void CudaForward::mla_qkv(const CudaModel::Layer& L, int R) {
  const MlaConfig& a = c_.mla;
  const int H = c_.n_heads, KL = a.kv_lora_rank;
  mla_project(L, R);
  gemm(L.wkv_b, mla_lat_, mla_kvb_, R, KL, H * (a.nope_dim + a.v_dim), false);
  const float* cs = rope_row_cos_ ? rope_row_cos_ : rope_cos_;
  const float* sn = rope_row_sin_ ? rope_row_sin_ : rope_sin_;
  mk::mla_assemble(q_, mla_ckv_, mla_kvb_, k_, v_, rope_row_cos_ ? d_row_idx_ : d_pos_, R, H, a.nope_dim, a.rope_dim,
                   a.v_dim, KL, a.rope_interleave, cs, sn, c_.head_dim / 2, stream_);
}

// MLA over the latent cache (the CPU forward's latent branch): q and the latent as mla_project, the
// RoPE of q's rope parts and of the shared key, the rows stored (latent in the K half, the turned key
// in the V half, each through its half format), W_UK absorbed into q, the latent kernel over the rows'
// tables and lengths (decode: one row per sequence; a chunk: lengths pos + 1), then W_UV: mla_att_.
void CudaForward::mla_latent_block(const CudaModel::Layer& L, int l, int R, int table_stride, int max_len,
                                   const DecodePlan* plan, DecodeWorkspace& ws) {
  const MlaConfig& a = c_.mla;
  const int H = c_.n_heads, N = a.nope_dim, Rd = a.rope_dim, VD = a.v_dim, KL = a.kv_lora_rank;
  const bool bf16 = m_.weight_type() == WeightType::bf16;
  mla_project(L, R);
  const float* cs = rope_row_cos_ ? rope_row_cos_ : rope_cos_;
  const float* sn = rope_row_sin_ ? rope_row_sin_ : rope_sin_;
  mk::mla_rope_latent(q_, mla_ckv_, rope_row_cos_ ? d_row_idx_ : d_pos_, R, H, N, Rd, KL, a.rope_interleave, cs, sn,
                      c_.head_dim / 2, stream_);
  const StoreConfig& sc = store_.config();
  for (KvHalf half : {KvHalf::K, KvHalf::V}) {
    StoreRowsArgs sa;
    sa.rows = half == KvHalf::K ? mla_lat_ : mla_ckv_ + KL;
    sa.row_stride = static_cast<std::size_t>(half == KvHalf::K ? KL : KL + Rd);
    sa.slot_mapping = d_slot_;
    sa.n_tokens = R;
    sa.pool = store_.pool(store_layer(l), half);
    sa.page_stride = store_.page_stride(half);
    sa.tensor_scale = store_.kernel_scales(store_layer(l), half).tensor;  // one KV "head": no per-head table
    store_rows(store_.half_format(half), sc.half_geometry(half), sa, stream_);
  }
  mk::mla_absorb(q_, L.wkv_b, bf16, mla_qlat_, R, H, N, Rd, VD, KL, stream_);
  MlaDecodeArgs ma = mla_args(R, max_len);
  ma.k_pool = store_.pool(store_layer(l), KvHalf::K);
  ma.v_pool = store_.pool(store_layer(l), KvHalf::V);
  ma.block_tables = d_tables_;
  ma.table_stride = table_stride;
  ma.seq_lens = d_lens_;
  ma.q = mla_qlat_;
  ma.out = mla_olat_;
  ma.k_scale = store_.tensor_scale(store_layer(l), KvHalf::K);
  ma.v_scale = store_.tensor_scale(store_layer(l), KvHalf::V);
  ma.bytes_read = store_.read_counter();  // null unless the store counts
  if (plan) mla_decode_attention(ma, *plan, ws, stream_);
  else mla_decode_attention(ma, ws, stream_);
  mk::mla_up_v(mla_olat_, L.wkv_b, bf16, mla_att_, R, H, N, VD, KL, stream_);
}

// The latent kernel's arguments that depend on the model and the call's shape only (a graph's plan is
// made from them).
MlaDecodeArgs CudaForward::mla_args(int rows, int max_len) const {
  const MlaConfig& a = c_.mla;
  const StoreConfig& sc = store_.config();
  MlaDecodeArgs ma;
  ma.format = sc.format;
  ma.block_size = sc.block_size;
  ma.kv_lora = a.kv_lora_rank;
  ma.rope = a.rope_dim;
  ma.n_heads = c_.n_heads;
  ma.rows = rows;
  ma.k_page_stride = store_.page_stride(KvHalf::K);
  ma.v_page_stride = store_.page_stride(KvHalf::V);
  ma.max_seq_len = max_len;
  // The CPU forward's: the model's attention scale, else qk_head_dim^-0.5.
  ma.softmax_scale = c_.attn_scale > 0 ? c_.attn_scale : 1.0f / std::sqrt(static_cast<float>(a.nope_dim + a.rope_dim));
  return ma;
}

// q (q_proj, or q_b(rmsnorm(q_a))), kv_a into mla_ckv_ and the latent rmsnorm(kv_a[:kv_lora]) into
// mla_lat_, for the R rows (xb_ normed).
void CudaForward::mla_project(const CudaModel::Layer& L, int R) {
  const MlaConfig& a = c_.mla;
  const int dim = c_.dim, H = c_.n_heads, QK = a.nope_dim + a.rope_dim, KL = a.kv_lora_rank;
  if (a.q_lora_rank > 0) {
    gemm(L.wq_a, xb_, mla_qa_, R, dim, a.q_lora_rank, false);
    mk::rmsnorm(mla_qa_, mla_qa_, L.q_a_norm, R, a.q_lora_rank, c_.rms_eps, stream_);
    gemm(L.wq, mla_qa_, q_, R, a.q_lora_rank, H * QK, false);
  } else {
    gemm(L.wq, xb_, q_, R, dim, H * QK, false);
  }
  gemm(L.wkv_a, xb_, mla_ckv_, R, dim, KL + a.rope_dim, false);
  KVGATE_CUDA_CHECK(cudaMemcpy2DAsync(mla_lat_, static_cast<std::size_t>(KL) * sizeof(float), mla_ckv_,
                                      static_cast<std::size_t>(KL + a.rope_dim) * sizeof(float),
                                      static_cast<std::size_t>(KL) * sizeof(float), static_cast<std::size_t>(R),
                                      cudaMemcpyDeviceToDevice, stream_));
  mk::rmsnorm(mla_lat_, mla_lat_, L.kv_a_norm, R, KL, c_.rms_eps, stream_);
}

// Final norm and classifier of rows [first, first + n): logits_[0..n), greedy ids d_argmax_[0..n).
void CudaForward::head(int first, int n) {
  const int dim = c_.dim;
  mk::rmsnorm(xb_, x_ + static_cast<std::size_t>(first) * dim, m_.final_norm(), n, dim, c_.rms_eps, stream_);
  gemm(m_.classifier(), xb_, logits_, n, dim, c_.vocab_size, false);
  if (c_.final_softcap > 0)  // Gemma 2: final_logit_softcapping
    mk::softcap(logits_, static_cast<std::size_t>(n) * c_.vocab_size, c_.final_softcap, stream_);
  mk::argmax_rows(logits_, n, c_.vocab_size, d_argmax_, stream_);
}

void CudaForward::download(int n_logit_rows, float* logits, int n_argmax, int* argmax) {
  if (logits && n_logit_rows > 0)
    KVGATE_CUDA_CHECK(cudaMemcpyAsync(logits, logits_, static_cast<std::size_t>(n_logit_rows) * c_.vocab_size * 4,
                                      cudaMemcpyDeviceToHost, stream_));
  if (argmax && n_argmax > 0)
    KVGATE_CUDA_CHECK(cudaMemcpyAsync(h_argmax_, d_argmax_, static_cast<std::size_t>(n_argmax) * sizeof(int),
                                      cudaMemcpyDeviceToHost, stream_));
  KVGATE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (argmax && n_argmax > 0) std::copy(h_argmax_, h_argmax_ + n_argmax, argmax);
}

void CudaForward::set_k_rope_position_offset(int off) {
  if (off < 0 || off >= 8) throw EngineError("cuda forward: the K RoPE position offset must be in [0, 8)");
  k_rope_offset_ = off;
}

void CudaForward::drop_graphs() {
  for (auto& [b, g] : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
}

void CudaForward::set_capture_kv(bool on) {
  if (on && latent_)
    throw EngineError("cuda forward: K/V row capture reads expanded K/V rows; the MLA latent cache has none (run with "
                      "--mla-cache expanded)");
  capture_kv_ = on;
}

void CudaForward::set_damage(const std::optional<KvDamage>& d) {
  if (d && latent_)
    throw EngineError("cuda engine: KV damage (probe sensitivity) is applied to expanded K/V rows; the MLA latent cache "
                      "has none (run the sensitivity with --mla-cache expanded, or on the CPU engine)");
  if (d) {
    const HalfFormat f = store_.half_format(damaged_half(d->kind));
    const char* half = damaged_half(d->kind) == KvHalf::K ? "K" : "V";
    if (f != HalfFormat::f32 && f != HalfFormat::f16 && f != HalfFormat::bf16)
      throw EngineError(std::string("cuda engine: KV damage (probe sensitivity) is applied to the stored rows of a float KV "
                                    "half, but the ") +
                        half + " half is " + std::string(name(f)) + "; run the sensitivity on a f32, f16 or bf16 baseline, or on the CPU engine");
    if (!(d->size >= 0) || !std::isfinite(d->size) || !(d->envelope >= 0) || !std::isfinite(d->envelope) ||
        d->pos0 > d->pos1)
      throw EngineError("cuda engine: KV damage needs a finite size >= 0, a finite envelope >= 0 and pos0 <= pos1");
    if (!damage_prev_) {
      const StoreConfig& sc = store_.config();
      const std::size_t bytes = static_cast<std::size_t>(sc.n_layers) * sc.n_kv_heads * sc.head_dim * sizeof(float);
      KVGATE_CUDA_CHECK(cudaMalloc(&damage_prev_, bytes));
      KVGATE_CUDA_CHECK(cudaMemset(damage_prev_, 0, bytes));
    }
  }
  damage_ = d;
  drop_graphs();
}

void CudaForward::damage_rows(int layer, int R) {
  const KvDamage& d = *damage_;
  const KvHalf h = damaged_half(d.kind);
  const HalfFormat f = store_.half_format(h);
  const StoreConfig& sc = store_.config();
  mk::KvDamageLaunch a;
  a.damage = d;
  a.layer = layer;
  a.format = f == HalfFormat::f32 ? 0 : f == HalfFormat::f16 ? 1 : 2;
  a.pool = store_.pool(store_layer(layer), h);
  a.page_stride = store_.page_stride(h);
  a.block_size = sc.block_size;
  a.n_kv_heads = sc.n_kv_heads;
  a.head_dim = sc.head_dim;
  a.d_pos = d_pos_;
  a.d_slot = d_slot_;
  a.rows = R;
  const std::size_t row_bytes = static_cast<std::size_t>(sc.n_kv_heads) * sc.head_dim * (f == HalfFormat::f32 ? 4 : 2);
  a.prev = static_cast<std::uint8_t*>(damage_prev_) + static_cast<std::size_t>(store_layer(layer)) * row_bytes;
  mk::kv_damage(a, stream_);
}

namespace {
void check_tokens(std::span<const int> tokens, int vocab) {
  for (int t : tokens)
    if (t < 0 || t >= vocab)
      throw EngineError("token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
}
}  // namespace

// A pipeline stage's call: a stage without the head returns no logits or ids; a stage after the
// first reads the rows its input stage left (set_input), which must hold as many.
void CudaForward::check_stage_call(bool wants_outputs, int rows) const {
  if (wants_outputs && !m_.range().has_head(c_))
    throw EngineError("cuda forward: this pipeline stage (layers " + std::to_string(m_.range().first) + ".." +
                      std::to_string(m_.range().end_of(c_) - 1) + ") has no classifier; ask the last stage for logits");
  if (!m_.range().embeds()) {
    if (!input_)
      throw EngineError("cuda forward: this pipeline stage starts at layer " + std::to_string(m_.range().first) +
                        " and has no input stage; call set_input with the stage before it");
    if (rows > input_->opts_.max_rows)
      throw EngineError("cuda forward: " + std::to_string(rows) + " rows exceed the input stage's max_rows " +
                        std::to_string(input_->opts_.max_rows));
  }
}

void CudaForward::set_input(const CudaForward* prev) {
  if (m_.range().embeds())
    throw EngineError("cuda forward: the first pipeline stage embeds its tokens; it takes no input stage");
  if (!prev || prev->m_.range().end_of(prev->c_) != m_.range().first || prev->c_.dim != c_.dim)
    throw EngineError("cuda forward: the input stage must end where this stage starts (layer " +
                      std::to_string(m_.range().first) + ") and have the same model width");
  input_ = prev;
  drop_graphs();  // captured graphs bake the input rows' address
}

// A chunk's checks (forward_chunk, tp_begin_chunk): 1..max_rows tokens, ids in the vocabulary, room
// in the context. Returns the token count.
int CudaForward::check_chunk(SeqId s, std::span<const int> tokens) const {
  const int T = static_cast<int>(tokens.size());
  if (T < 1 || T > opts_.max_rows)
    throw EngineError("cuda forward: chunk of " + std::to_string(T) + " tokens (max " + std::to_string(opts_.max_rows) + ")");
  check_tokens(tokens, c_.vocab_size);
  if (store_.length(s) + T > max_ctx_)
    throw EngineError("cuda forward: " + std::to_string(T) + " more tokens at position " + std::to_string(store_.length(s)) +
                      " exceed the context of " + std::to_string(max_ctx_) + " tokens");
  return T;
}

// The sequence extended by the chunk and its rows staged; returns the chunk's first position.
int CudaForward::stage_chunk(SeqId s, std::span<const int> tokens) {
  const int T = static_cast<int>(tokens.size());
  const int pos0 = store_.extend(s, T);
  std::vector<SeqId> rs(static_cast<std::size_t>(T), s);
  std::vector<int> rp(static_cast<std::size_t>(T));
  for (int t = 0; t < T; ++t) rp[static_cast<std::size_t>(t)] = pos0 + t;
  stage(rs, rp, tokens, table_stride_);
  return pos0;
}

// The classifier over a chunk's last row (every row when all_logits), the logits downloaded, and
// the last row's argmax when asked.
void CudaForward::chunk_logits(int T, float* logits, bool all_logits, int* argmax) {
  const int first = all_logits ? 0 : T - 1;
  head(first, T - first);
  download(T - first, logits, 0, nullptr);
  if (argmax) {  // the last row's id sits at index T - 1 - first
    KVGATE_CUDA_CHECK(cudaMemcpy(h_argmax_, d_argmax_ + (T - 1 - first), sizeof(int), cudaMemcpyDeviceToHost));
    *argmax = h_argmax_[0];
  }
}

void CudaForward::forward_chunk(SeqId s, std::span<const int> tokens, float* logits, bool all_logits, int* argmax) {
  const int T = check_chunk(s, tokens);
  check_stage_call(logits != nullptr || argmax != nullptr, T);
  const int pos0 = stage_chunk(s, tokens);
  layers(T, table_stride_, pos0 + T, true, nullptr, ws_);
  if (!m_.range().has_head(c_)) {  // a pipeline stage before the last: its rows feed the next stage
    KVGATE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  chunk_logits(T, logits, all_logits, argmax);
}

// A decode batch's checks (forward_decode, tp_begin_decode): 1..max_rows sequences, one token each,
// ids in the vocabulary, every sequence below the context limit. Returns the batch size.
int CudaForward::check_decode_batch(std::span<const SeqId> seqs, std::span<const int> tokens) const {
  const int B = static_cast<int>(seqs.size());
  if (B < 1 || B > opts_.max_rows || tokens.size() != seqs.size())
    throw EngineError("cuda forward: decode batch of " + std::to_string(B) + " sequences / " +
                      std::to_string(tokens.size()) + " tokens (max " + std::to_string(opts_.max_rows) + ")");
  check_tokens(tokens, c_.vocab_size);
  for (SeqId s : seqs)
    if (store_.length(s) + 1 > max_ctx_)
      throw EngineError("cuda forward: sequence " + std::to_string(s) + " is at the context limit of " +
                        std::to_string(max_ctx_) + " tokens");
  return B;
}

// Every sequence of the batch extended by one token and the rows staged; returns the longest
// attention span (the planner's max_len).
int CudaForward::stage_decode(std::span<const SeqId> seqs, std::span<const int> tokens) {
  const int B = static_cast<int>(seqs.size());
  std::vector<SeqId> rs(seqs.begin(), seqs.end());
  std::vector<int> rp(static_cast<std::size_t>(B));
  int max_len = 1;
  for (int b = 0; b < B; ++b) {
    rp[static_cast<std::size_t>(b)] = store_.extend(seqs[static_cast<std::size_t>(b)], 1);
    max_len = std::max(max_len, rp[static_cast<std::size_t>(b)] + 1);
  }
  stage(rs, rp, tokens, table_stride_);
  return max_len;
}

void CudaForward::forward_decode(std::span<const SeqId> seqs, std::span<const int> tokens, float* logits, int* argmax) {
  const int B = check_decode_batch(seqs, tokens);
  check_stage_call(logits != nullptr || argmax != nullptr, B);
  if (damage_ && B > 1)
    throw EngineError("cuda forward: KV damage (diagnostics) runs one sequence at a time; got a decode batch of " +
                      std::to_string(B) + " sequences");
  const int max_len = stage_decode(seqs, tokens);
  const bool use_graph = opts_.cuda_graphs && !capture_kv_ && k_rope_offset_ == 0;
  const bool has_head = m_.range().has_head(c_);
  if (!use_graph) {
    layers(B, table_stride_, max_len, false, nullptr, ws_);
    if (has_head) head(0, B);
  } else {
    // A captured graph bakes the store's read counter address (null when the store does not count):
    // the graphs captured under another counter are dropped and captured again.
    if (store_.read_counter() != graph_counter_) {
      drop_graphs();
      graph_counter_ = store_.read_counter();
    }
    auto it = graphs_.find(B);
    if (it == graphs_.end()) {
      // One plan for every length up to the context (empty splits exit at once), so the captured
      // launch configuration stays valid as the sequences grow.
      Graph gr;
      DecodeArgs pa;
      pa.format = store_.config().format;
      pa.geometry = store_.geometry();
      pa.n_heads = c_.n_heads;
      pa.batch = B;
      pa.max_seq_len = max_ctx_;
      gr.plan = latent_ ? plan_mla_decode(mla_args(B, max_ctx_)) : plan_decode(pa);
      std::size_t ws_need = gr.plan.workspace_bytes;
      for (int l = 0; l < c_.n_layers; ++l)
        if (const int w = c_.window(l); w > 0 && !gr.window_plans.count(w)) {
          DecodeArgs wa = pa;
          wa.window = w;
          ws_need = std::max(ws_need, gr.window_plans.emplace(w, plan_decode(wa)).first->second.workspace_bytes);
        }
      // Graphs bake the workspace address: their own workspace, never reallocated under a live
      // graph (a larger need drops the captured graphs; they are captured again on use).
      if (ws_need > graph_ws_bytes_) {
        drop_graphs();
        graph_ws_.reserve(ws_need);
        graph_ws_bytes_ = ws_need;
      }
      cudaGraph_t graph = nullptr;
      KVGATE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      try {
        layers(B, table_stride_, max_ctx_, false, &gr.plan, graph_ws_, &gr.window_plans);
        if (has_head) head(0, B);
      } catch (...) {
        cudaStreamEndCapture(stream_, &graph);
        if (graph) cudaGraphDestroy(graph);
        throw;
      }
      KVGATE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
      const cudaError_t e = cudaGraphInstantiate(&gr.exec, graph, 0);
      cudaGraphDestroy(graph);
      KVGATE_CUDA_CHECK(e);
      ++graph_captures_;
      it = graphs_.emplace(B, gr).first;
    }
    KVGATE_CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream_));
    ++graph_replays_;
  }
  download(B, logits, argmax ? B : 0, argmax);  // a stage before the last: nothing, then the stream sync
}

// --- the tensor-parallel rank's steps (kvgate/cuda/tensor_parallel.hpp) ------------------------------

void CudaForward::tp_check(const char* step) const {
  auto refuse = [&](const std::string& what) {
    throw EngineError(std::string("cuda forward: ") + step + ": " + what +
                      " is not split by tensor parallelism in this version; run it unsplit (drop --tp) or on the CPU "
                      "engine (--device cpu)");
  };
  if (latent_) refuse("the MLA latent cache");
  if (c_.mla.any()) refuse("latent attention (MLA)");
  if (c_.moe.any()) refuse("a mixture-of-experts layer");
  if (!m_.range().embeds() || !m_.range().has_head(c_)) refuse("a pipeline stage (--pp)");
  if (damage_) refuse("KV damage (probe sensitivity)");
}

float* CudaForward::tp_partial() {
  if (!tp_partial_) tp_partial_ = dmalloc<float>(static_cast<std::size_t>(opts_.max_rows) * c_.dim);
  return tp_partial_;
}

int CudaForward::tp_begin_chunk(SeqId s, std::span<const int> tokens) {
  tp_check("tp_begin_chunk");
  const int T = check_chunk(s, tokens);
  tp_partial();
  const int pos0 = stage_chunk(s, tokens);
  begin_layers(T);
  tp_ = TpCall{T, pos0 + T, true, true};
  return pos0;
}

void CudaForward::tp_begin_decode(std::span<const SeqId> seqs, std::span<const int> tokens) {
  tp_check("tp_begin_decode");
  const int B = check_decode_batch(seqs, tokens);
  tp_partial();
  const int max_len = stage_decode(seqs, tokens);
  begin_layers(B);
  tp_ = TpCall{B, max_len, false, true};
}

void CudaForward::tp_attention_partial(int l) {
  if (!tp_.active) throw EngineError("cuda forward: tp_attention_partial before tp_begin_chunk / tp_begin_decode");
  const CudaModel::Layer& L = m_.layer(l);
  const int R = tp_.rows;
  mk::rmsnorm(xb_, x_, L.attn_norm, R, c_.dim, c_.rms_eps, stream_);
  attend(l, R, table_stride_, tp_.max_len, tp_.chunk, nullptr, ws_, nullptr);
  gemm(L.wo, att_, tp_partial_, R, c_.q_dim(), c_.dim, false);
}

void CudaForward::tp_ffn_partial(int l) {
  if (!tp_.active) throw EngineError("cuda forward: tp_ffn_partial before tp_begin_chunk / tp_begin_decode");
  const CudaModel::Layer& L = m_.layer(l);
  const int R = tp_.rows;
  mk::rmsnorm(xb_, x_, L.ffn_norm, R, c_.dim, c_.rms_eps, stream_);
  ffn_hidden_rows(L, R);
  gemm(L.w2, hb_, tp_partial_, R, c_.hidden_dim, c_.dim, false);
}

void CudaForward::tp_add_partial(const float* post_norm) {
  if (!tp_.active) throw EngineError("cuda forward: tp_add_partial before tp_begin_chunk / tp_begin_decode");
  const int R = tp_.rows;
  if (post_norm) mk::rmsnorm(tp_partial_, tp_partial_, post_norm, R, c_.dim, c_.rms_eps, stream_);
  mk::add(x_, tp_partial_, static_cast<std::size_t>(R) * c_.dim, stream_);
}

void CudaForward::tp_finish(float* logits, bool all_logits, int* argmax) {
  if (!tp_.active) throw EngineError("cuda forward: tp_finish before tp_begin_chunk / tp_begin_decode");
  const int R = tp_.rows;
  tp_.active = false;
  if (!tp_.chunk) {  // a decode batch: every row's logits and ids
    head(0, R);
    download(R, logits, argmax ? R : 0, argmax);
    return;
  }
  chunk_logits(R, logits, all_logits, argmax);
}

}  // namespace kvgate::cuda
