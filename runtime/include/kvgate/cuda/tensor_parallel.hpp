// Tensor parallelism of the CUDA forward (docs/CUDA.md "Tensor parallelism"): the CPU split of
// kvgate/tensor_parallel.hpp (Megatron style) with every rank a CudaForward of its own.
//
//   rank r of N holds   a CudaModel of the CPU's sliced model (tensor_parallel_model: its query heads'
//                       rows of Wq and their KV heads' rows of Wk/Wv, the Wo columns that read them,
//                       FFN rows of W1/W3 and the W2 columns; embeddings, norms and the head
//                       replicated), its OWN CudaKvStore of its KV heads (tensor_parallel_store_config:
//                       n_kv_heads = Hkv / N and the per-(layer, KV head) scales of its heads), its own
//                       CudaForward (stream, cuBLAS handle, residual replica), on devices[r].
//   a block             every rank's partial output [rows][dim] (tp_attention_partial: att Wo;
//                       tp_ffn_partial: hidden W2, each with beta 0), then the all-reduce: on rank 0's
//                       device the partials are copied (cudaMemcpyDefault) into a gather buffer and
//                       summed in rank order, sum = ((p0 + p1) + p2) + ... (mk::add, one rounding per
//                       term), the sum copied back into every rank's partial buffer, and each rank adds
//                       it to its residual replica (through the post-norm on a post-norm model).
//
// Streams: each rank's CudaForward launches on its own stream. Rank 0's stream waits (event) for every
// rank's partial before it gathers; every rank's stream waits (event) for the sum before it copies it
// back. Two ranks on one GPU therefore order through events exactly as ranks on two GPUs do. A call
// ends with every rank's stream synchronised (the pinned metadata of the next call is host-written).
// No CUDA graph: decode runs eagerly (attention planned per call, as a graph-less decode).
//
// The f32 weights of a rank are the unsplit weights' slices (the CPU slices are FP32 copies converted
// exactly; bf16 device weights made from them are the unsplit bf16 weights' slices bit for bit).
// The column splits (q, k, v, W1, W3) compute the same dot products as the unsplit pass; the row splits
// (Wo, W2) and the all-reduce reassociate one sum per block (gate PAR.cuda.tp, gates/cuda/cuda_tp_gate.cpp).
//
// Streaming (--kv-resident) works per rank: TensorParallelOptions::make_store makes each rank's device
// store (as PipelineOptions::make_store per stage), and CudaEngine passes one that gives every rank its
// own host mirror (a PagedKvStore of the rank's StoreConfig: its KV heads, every layer) and its own
// device window, returning the view over the window; the engine streams each rank's pages in before the
// ranks' forward call and out after it, exactly as per pipeline stage (gate PAR.cuda.tp.stream.<fmt>,
// gates/cuda/cuda_tp_stream_gate.cpp). KV files go through the engine too: CudaEngine::save_kv gathers
// the ranks' pages (device or mirror) into one unsplit host store and writes the unsplit file;
// hydrate restores a file into one and scatters each rank's heads (gate PAR.cuda.tp.persist.<fmt>).
// This class itself has no streaming or persistence.
//
// Refused by name (EngineError, naming the option and the fix): what tensor_parallel_refusal refuses
// (MLA, MoE, a rank count that does not divide the KV heads or the FFN width), a pipeline split at the
// same time, KV damage and shared device weights; KV files only for a format whose rank pages are
// head slices of the unsplit page (tensor_parallel_file_refusal, by CudaEngine).
#pragma once
#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvgate/cuda/engine.hpp"
#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/cuda/pipeline.hpp"  // DeviceStore, the parts-in-step helpers
#include "kvgate/engine.hpp"
#include "kvgate/model.hpp"
#include "kvgate/tensor_parallel.hpp"

namespace kvgate::cuda {

struct TensorParallelOptions {
  int ranks = 2;
  std::vector<int> devices;  // one CUDA device per rank (repeats allowed); empty: every rank on the current device
  WeightType weights = WeightType::f32;
  StoreConfig store;         // the unsplit store (make_store_config); each rank takes its KV heads
  CudaForwardOptions forward;  // cuda_graphs is ignored (no graphs in the split)
  // Makes rank r's device store from its config (tensor_parallel_store_config: its KV heads and their
  // scales), called with the rank's device current, before its forward is made. The engine's streaming
  // (--kv-resident) returns a view over the rank's own device window here (the window and its host
  // mirror stay the caller's; they must outlive this object). Null: a CudaKvStore of its own.
  std::function<std::unique_ptr<CudaKvStore>(int rank, const StoreConfig& cfg)> make_store;
};

class CudaTensorParallel {
 public:
  // Throws EngineError (a refused model or option, a device index the machine lacks), KvStoreError (a
  // rank's store cannot hold the format), ModelError / std::runtime_error as the rank parts do.
  CudaTensorParallel(const Model& m, TensorParallelOptions o);
  ~CudaTensorParallel();
  CudaTensorParallel(const CudaTensorParallel&) = delete;
  CudaTensorParallel& operator=(const CudaTensorParallel&) = delete;

  // A sequence in every rank's store (the same id in each: the stores are created and used in step).
  SeqId create_sequence();
  void free_sequence(SeqId s);
  // CudaKvStore::release_before on every rank's store; returns rank 0's count.
  int release_before(SeqId s, int first_kept_pos);
  // As CudaForward::forward_chunk / forward_decode over the whole model (rank 0's head gives the logits).
  void forward_chunk(SeqId s, std::span<const int> tokens, float* logits, bool all_logits, int* argmax = nullptr);
  void forward_decode(std::span<const SeqId> seqs, std::span<const int> tokens, float* logits, int* argmax = nullptr);

  // --- the pass in steps (forward_* run them; PAR.cuda.tp drives them one block at a time) -----------
  int begin_chunk(SeqId s, std::span<const int> tokens);  // every rank: checks, extends, stages, embeds; pos0
  void begin_decode(std::span<const SeqId> seqs, std::span<const int> tokens);
  void attention(int l);  // every rank's attention partial of layer l, then the all-reduce
  void ffn(int l);        // every rank's FFN partial of layer l, then the all-reduce
  // Every rank adds the all-reduced sum to its residual replica (through the layer's post-norm on a
  // post-norm model: post_attn_norm for the attention block, else post_ffn_norm).
  void add_block(int l, bool attention_block);
  void finish(float* logits, bool all_logits, int* argmax);  // rank 0's head; every rank's stream synchronised
  // Host copies (every rank's stream synchronised first), rows of the current call:
  std::vector<float> block_sum();           // [rows][dim]: the last all-reduce's sum (rank 0's device)
  std::vector<float> residual(int r);       // [rows][dim]: rank r's replica
  std::vector<float> normed_rows(int r);    // [rows][dim]: rank r's last rmsnorm rows (the block input)
  std::vector<float> attention_out(int r);  // [rows][q_heads * head_dim] of rank r
  std::vector<float> ffn_hidden(int r);     // [rows][ffn] of rank r
  void set_residual(std::span<const float> x);  // [rows][dim] into every rank's replica (teacher forcing)
  int rows() const;

  struct Rank {
    int device = 0;
    TpSlice slice;
    Model model;  // the rank's sliced weights (FP32, tensor_parallel_model)
    std::unique_ptr<CudaModel> weights;
    std::unique_ptr<CudaKvStore> store;
    std::unique_ptr<CudaForward> forward;
    cudaEvent_t partial_done = nullptr;  // recorded on the rank's stream after its partial GEMM
  };
  int ranks() const { return static_cast<int>(ranks_.size()); }
  const Rank& rank(int r) const { return ranks_.at(static_cast<std::size_t>(r)); }
  Rank& rank(int r) { return ranks_.at(static_cast<std::size_t>(r)); }
  std::size_t pool_bytes() const;  // every rank's store
  int n_devices() const;           // distinct devices of the ranks
  // "tensor:2 (ranks on cuda:0,cuda:0)" for reports.
  std::string topology() const;

 private:
  std::vector<DeviceStore> stores() const;
  void all_reduce();
  void sync_all();
  const Model& m_;
  std::vector<Rank> ranks_;
  float* gather_ = nullptr;   // rank 0's device: [ranks][max_rows][dim], the partials gathered
  float* sum_ = nullptr;      // rank 0's device: [max_rows][dim], the all-reduced block output
  cudaEvent_t sum_done_ = nullptr;  // rank 0's device: recorded on rank 0's stream after the sum
  std::size_t max_rows_ = 0;
};

}  // namespace kvgate::cuda
