// Tensor parallelism of the CUDA forward (kvgate/cuda/tensor_parallel.hpp): every rank a CudaForward
// over the CPU's sliced model and its own store; the all-reduce sums the ranks' block outputs in rank
// order on rank 0's device.
#include "kvgate/cuda/tensor_parallel.hpp"

#include <cuda_runtime_api.h>

#include <set>
#include <string>

#include "kernels.hpp"
#include "kernels/common.cuh"
#include "kvgate/cuda/pipeline.hpp"  // DeviceScope, check_device_indices, the parts-in-step helpers

namespace kvgate::cuda {

namespace mk = model_kernels;

CudaTensorParallel::CudaTensorParallel(const Model& m, TensorParallelOptions o) : m_(m) {
  const ModelConfig& c = m.config;
  const int n = o.ranks;
  const std::string tp = "cuda tensor parallel (--tp " + std::to_string(n) + "): ";
  if (const std::string why = tensor_parallel_refusal(c, n); !why.empty())
    throw EngineError(tp + why + "; run it unsplit (drop --tp) or with a rank count the model divides");
  if (o.store.n_layers != c.n_layers || o.store.n_kv_heads != c.n_kv_heads)
    throw EngineError(tp + "the store config is not the unsplit model's (layers " + std::to_string(o.store.n_layers) +
                      ", KV heads " + std::to_string(o.store.n_kv_heads) + "); give make_store_config's");
  if (o.store.layout == KvLayout::mla_latent)
    throw EngineError(tp + "the MLA latent cache (--mla-cache latent) is not split; drop --tp");
  if (o.devices.empty()) {
    int cur = 0;
    KVGATE_CUDA_CHECK(cudaGetDevice(&cur));
    o.devices.assign(static_cast<std::size_t>(n), cur);
  }
  if (static_cast<int>(o.devices.size()) != n)
    throw EngineError(tp + "--devices names " + std::to_string(o.devices.size()) + " devices for " + std::to_string(n) +
                      " ranks; give one device per rank (a device may repeat), or leave --devices out");
  check_device_indices(o.devices, tp);
  o.forward.cuda_graphs = false;  // the split runs eagerly
  max_rows_ = static_cast<std::size_t>(o.forward.max_rows);
  ranks_.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    Rank rk;
    rk.device = o.devices[static_cast<std::size_t>(r)];
    rk.slice = tensor_parallel_slice(c, n, r);
    rk.model = tensor_parallel_model(m, n, r);
    ranks_.push_back(std::move(rk));
    Rank& k = ranks_.back();
    DeviceScope on(k.device);
    k.weights = std::make_unique<CudaModel>(k.model, o.weights);
    const StoreConfig rank_sc = tensor_parallel_store_config(o.store, c, n, r);
    k.store = o.make_store ? o.make_store(r, rank_sc) : std::make_unique<CudaKvStore>(rank_sc);
    k.forward = std::make_unique<CudaForward>(*k.weights, *k.store, o.forward);
    (void)k.forward->tp_partial();  // allocated on the rank's device now
    KVGATE_CUDA_CHECK(cudaEventCreateWithFlags(&k.partial_done, cudaEventDisableTiming));
  }
  DeviceScope on(ranks_[0].device);
  const std::size_t rows = max_rows_ * static_cast<std::size_t>(c.dim);
  KVGATE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&gather_), static_cast<std::size_t>(n) * rows * sizeof(float)));
  KVGATE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&sum_), rows * sizeof(float)));
  KVGATE_CUDA_CHECK(cudaEventCreateWithFlags(&sum_done_, cudaEventDisableTiming));
}

CudaTensorParallel::~CudaTensorParallel() {
  int caller = 0;
  const bool restore = cudaGetDevice(&caller) == cudaSuccess;
  if (!ranks_.empty()) {
    (void)cudaSetDevice(ranks_[0].device);
    if (gather_) cudaFree(gather_);
    if (sum_) cudaFree(sum_);
    if (sum_done_) cudaEventDestroy(sum_done_);
  }
  for (auto it = ranks_.rbegin(); it != ranks_.rend(); ++it) {  // each rank's parts on its device
    (void)cudaSetDevice(it->device);
    if (it->partial_done) cudaEventDestroy(it->partial_done);
    it->forward.reset();
    it->store.reset();
    it->weights.reset();
  }
  if (restore) (void)cudaSetDevice(caller);
}

std::vector<DeviceStore> CudaTensorParallel::stores() const {
  std::vector<DeviceStore> v;
  for (const Rank& k : ranks_) v.push_back({k.device, k.store.get()});
  return v;
}

SeqId CudaTensorParallel::create_sequence() {
  return create_sequence_in_step(stores(), "cuda tensor parallel: ", "rank");
}
void CudaTensorParallel::free_sequence(SeqId s) { free_sequence_in_step(stores(), s); }
int CudaTensorParallel::release_before(SeqId s, int first_kept_pos) {
  return release_before_in_step(stores(), s, first_kept_pos);
}

int CudaTensorParallel::begin_chunk(SeqId s, std::span<const int> tokens) {
  int pos0 = -1;
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    DeviceScope on(ranks_[r].device);
    const int p = ranks_[r].forward->tp_begin_chunk(s, tokens);
    if (r == 0) pos0 = p;
    else if (p != pos0)
      throw EngineError("cuda tensor parallel: rank " + std::to_string(r) + "'s sequence is at position " +
                        std::to_string(p) + ", rank 0's at " + std::to_string(pos0) + " (out of step)");
  }
  return pos0;
}

void CudaTensorParallel::begin_decode(std::span<const SeqId> seqs, std::span<const int> tokens) {
  for (Rank& k : ranks_) {
    DeviceScope on(k.device);
    k.forward->tp_begin_decode(seqs, tokens);
  }
}

// The all-reduce of the ranks' partials (each rank's tp_partial(), written on its stream):
//   1. every rank records partial_done on its stream; rank 0's stream waits for all of them;
//   2. on rank 0's stream: gather[r] = partial_r (cudaMemcpyDefault: a peer or host-staged copy when
//      the rank is on another device), sum = gather[0], then sum += gather[r] for r = 1.. in rank order;
//   3. sum_done recorded on rank 0's stream; every rank's stream waits for it and copies the sum into
//      its partial buffer (which tp_add_partial then adds to its residual replica).
// The next block's partial GEMM on a rank's stream follows its copy-back, and rank 0 overwrites the
// gather and sum buffers only after waiting for every rank's next partial_done: no buffer is written
// while another stream may still read it.
void CudaTensorParallel::all_reduce() {
  const std::size_t n_x = static_cast<std::size_t>(rows()) * static_cast<std::size_t>(m_.config.dim);
  const std::size_t bytes = n_x * sizeof(float);
  Rank& r0 = ranks_[0];
  for (Rank& k : ranks_) {
    DeviceScope on(k.device);
    KVGATE_CUDA_CHECK(cudaEventRecord(k.partial_done, k.forward->stream()));
  }
  {
    DeviceScope on(r0.device);
    const cudaStream_t s0 = r0.forward->stream();
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      KVGATE_CUDA_CHECK(cudaStreamWaitEvent(s0, ranks_[r].partial_done, 0));
      KVGATE_CUDA_CHECK(cudaMemcpyAsync(gather_ + r * max_rows_ * static_cast<std::size_t>(m_.config.dim),
                                        ranks_[r].forward->tp_partial(), bytes, cudaMemcpyDefault, s0));
    }
    KVGATE_CUDA_CHECK(cudaMemcpyAsync(sum_, gather_, bytes, cudaMemcpyDeviceToDevice, s0));
    for (int r = 1; r < ranks(); ++r)  // the sum, in rank order: ((p0 + p1) + p2) + ...
      mk::add(sum_, gather_ + static_cast<std::size_t>(r) * max_rows_ * static_cast<std::size_t>(m_.config.dim), n_x, s0);
    KVGATE_CUDA_CHECK(cudaEventRecord(sum_done_, s0));
  }
  for (Rank& k : ranks_) {
    DeviceScope on(k.device);
    KVGATE_CUDA_CHECK(cudaStreamWaitEvent(k.forward->stream(), sum_done_, 0));
    KVGATE_CUDA_CHECK(cudaMemcpyAsync(k.forward->tp_partial(), sum_, bytes, cudaMemcpyDefault, k.forward->stream()));
  }
}

void CudaTensorParallel::attention(int l) {
  for (Rank& k : ranks_) {
    DeviceScope on(k.device);
    k.forward->tp_attention_partial(l);
  }
  all_reduce();  // attention block
}

void CudaTensorParallel::ffn(int l) {
  for (Rank& k : ranks_) {
    DeviceScope on(k.device);
    k.forward->tp_ffn_partial(l);
  }
  all_reduce();  // FFN block
}

void CudaTensorParallel::add_block(int l, bool attention_block) {
  for (Rank& k : ranks_) {
    DeviceScope on(k.device);
    const CudaModel::Layer& L = k.weights->layer(l);
    const float* post = !m_.config.post_norms ? nullptr : attention_block ? L.post_attn_norm : L.post_ffn_norm;
    k.forward->tp_add_partial(post);
  }
}

void CudaTensorParallel::sync_all() {
  for (Rank& k : ranks_) {
    DeviceScope on(k.device);
    KVGATE_CUDA_CHECK(cudaStreamSynchronize(k.forward->stream()));
  }
}

void CudaTensorParallel::finish(float* logits, bool all_logits, int* argmax) {
  for (std::size_t r = ranks_.size(); r-- > 0;) {  // rank 0 last: its head gives the logits
    DeviceScope on(ranks_[r].device);
    ranks_[r].forward->tp_finish(r == 0 ? logits : nullptr, all_logits, r == 0 ? argmax : nullptr);
  }
  sync_all();
}

void CudaTensorParallel::forward_chunk(SeqId s, std::span<const int> tokens, float* logits, bool all_logits, int* argmax) {
  begin_chunk(s, tokens);
  for (int l = 0; l < m_.config.n_layers; ++l) {
    attention(l);
    add_block(l, true);
    ffn(l);
    add_block(l, false);
  }
  finish(logits, all_logits, argmax);
}

void CudaTensorParallel::forward_decode(std::span<const SeqId> seqs, std::span<const int> tokens, float* logits,
                                        int* argmax) {
  begin_decode(seqs, tokens);
  for (int l = 0; l < m_.config.n_layers; ++l) {
    attention(l);
    add_block(l, true);
    ffn(l);
    add_block(l, false);
  }
  finish(logits, false, argmax);
}

int CudaTensorParallel::rows() const { return ranks_.at(0).forward->tp_rows(); }

namespace {
std::vector<float> download_rows(int device, cudaStream_t s, const float* src, std::size_t n) {
  DeviceScope on(device);
  std::vector<float> out(n);
  KVGATE_CUDA_CHECK(cudaMemcpyAsync(out.data(), src, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  KVGATE_CUDA_CHECK(cudaStreamSynchronize(s));
  return out;
}
}  // namespace

std::vector<float> CudaTensorParallel::block_sum() {
  sync_all();
  const Rank& k = ranks_[0];
  return download_rows(k.device, k.forward->stream(), sum_, static_cast<std::size_t>(rows()) * m_.config.dim);
}
std::vector<float> CudaTensorParallel::residual(int r) {
  sync_all();
  Rank& k = rank(r);
  return download_rows(k.device, k.forward->stream(), k.forward->residual(),
                       static_cast<std::size_t>(rows()) * m_.config.dim);
}
std::vector<float> CudaTensorParallel::normed_rows(int r) {
  sync_all();
  const Rank& k = rank(r);
  return download_rows(k.device, k.forward->stream(), k.forward->normed_rows(),
                       static_cast<std::size_t>(rows()) * m_.config.dim);
}
std::vector<float> CudaTensorParallel::attention_out(int r) {
  sync_all();
  const Rank& k = rank(r);
  return download_rows(k.device, k.forward->stream(), k.forward->attention_out(),
                       static_cast<std::size_t>(rows()) * k.model.config.q_dim());
}
std::vector<float> CudaTensorParallel::ffn_hidden(int r) {
  sync_all();
  const Rank& k = rank(r);
  return download_rows(k.device, k.forward->stream(), k.forward->ffn_hidden(),
                       static_cast<std::size_t>(rows()) * k.model.config.hidden_dim);
}
void CudaTensorParallel::set_residual(std::span<const float> x) {
  const std::size_t n = static_cast<std::size_t>(rows()) * m_.config.dim;
  if (x.size() != n)
    throw EngineError("cuda tensor parallel: set_residual of " + std::to_string(x.size()) + " values; the call has " +
                      std::to_string(n) + " ([rows][dim])");
  sync_all();
  for (Rank& k : ranks_) {
    DeviceScope on(k.device);
    KVGATE_CUDA_CHECK(cudaMemcpyAsync(k.forward->residual(), x.data(), n * sizeof(float), cudaMemcpyHostToDevice,
                                      k.forward->stream()));
    KVGATE_CUDA_CHECK(cudaStreamSynchronize(k.forward->stream()));
  }
}

std::size_t CudaTensorParallel::pool_bytes() const {
  std::size_t b = 0;
  for (const Rank& k : ranks_) b += k.store->pool_bytes();
  return b;
}

int CudaTensorParallel::n_devices() const {
  std::set<int> used;
  for (const Rank& k : ranks_) used.insert(k.device);
  return static_cast<int>(used.size());
}

std::string CudaTensorParallel::topology() const {
  std::string t = "tensor:" + std::to_string(ranks_.size()) + " (ranks on ";
  for (std::size_t r = 0; r < ranks_.size(); ++r) t += std::string(r ? "," : "") + "cuda:" + std::to_string(ranks_[r].device);
  return t + ")";
}

}  // namespace kvgate::cuda
