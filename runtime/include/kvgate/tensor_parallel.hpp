// Tensor parallelism of the CPU forward pass, laid out as a multi-GPU engine splits every layer
// (Megatron style) so that the split is tested on a CPU machine before it runs on several GPUs:
//
//   rank r of N holds   query heads [r H/N, (r+1) H/N) and their KV heads [r Hkv/N, (r+1) Hkv/N)
//                       (a GQA group never straddles ranks), with its OWN KV store of those heads;
//                       the rows of Wq/Wk/Wv (and biases) of its heads and the columns of Wo that
//                       read them; FFN rows [r F/N, (r+1) F/N) of W1/W3 and the columns of W2.
//   every rank holds    the embeddings, the norms, the head and a replica of the residual stream.
//
// A block (attention, FFN) leaves on every rank a partial output [T][dim] (its heads' or FFN
// slice's share of the block's matmul); the all-reduce sums the partials in rank order
// (((y_0 + y_1) + y_2) + ...) and every rank adds the sum to its replica of the residual. Column
// splits (q, k, v, W1, W3) compute every output element with the same dot product as the unsplit
// pass, so each rank's K/V rows, attention outputs and FFN hidden rows are bitwise the unsplit
// ones' slices (given the same residual); the row splits (Wo, W2) and the all-reduce reassociate
// one sum per block, so the block outputs differ from the unsplit ones by float rounding only
// (PAR.tp's derived bound). With N = 1 the pass is bitwise the unsplit engine's.
//
// Not split (refused by name): MLA and MoE layers, per-layer KV maps, a pipeline split at the same
// time and the probe read hook. The rank stores stream (kv_resident) and keep the host-mirror rule
// each on its own. KV files (save/hydrate, the engine) keep the unsplit layout: a rank's page is
// its heads' slice of the unsplit page (copy_head_slice, kvgate/format.hpp), so the engine gathers
// the ranks' pages into an unsplit staging store to save, and scatters a restored one to hydrate.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvgate/kv_file.hpp"  // KvStageView, KvStageTarget
#include "kvgate/kv_store.hpp"
#include "kvgate/model.hpp"

namespace kvgate {

namespace detail {
class ThreadPool;  // the CPU forward's worker threads (internal)
}

// What rank r of a tensor-parallel split holds (TensorParallelForward::slice).
struct TpSlice {
  int q_head0 = 0, q_heads = 0;    // query heads [q_head0, q_head0 + q_heads)
  int kv_head0 = 0, kv_heads = 0;  // KV heads [kv_head0, kv_head0 + kv_heads)
  int ffn0 = 0, ffn = 0;           // FFN rows [ffn0, ffn0 + ffn)
};

// Why `m` cannot be split over `ranks` tensor-parallel ranks, or "" when it can.
std::string tensor_parallel_refusal(const ModelConfig& c, int ranks);
// Rank r's slice of the model (heads, KV heads, FFN rows): an even split.
TpSlice tensor_parallel_slice(const ModelConfig& c, int ranks, int r);
// Rank r's share of the weights (TensorParallelForward's ranks, the CUDA engine's CudaTensorParallel):
// the config with the rank's heads, KV heads (and their per-head scales) and FFN rows; the rows of
// Wq/Wk/Wv (+ biases) and W1/W3, the columns of Wo and W2; embeddings, norms and the head replicated.
// Every matrix is an FP32 copy, 16-bit storage converted exactly (so a bf16 upload of a slice is the
// unsplit bf16 upload's slice bit for bit). The caller checks tensor_parallel_refusal first.
Model tensor_parallel_model(const Model& m, int ranks, int r);
// Rank r's KV store: `full` (the unsplit store) with the rank's KV heads and their per-head scales.
StoreConfig tensor_parallel_store_config(const StoreConfig& full, const ModelConfig& c, int ranks, int r);

// --- KV files with tensor parallelism (the CPU and the CUDA engine's save / hydrate) ----------------
// A file keeps the unsplit layout; rank r's page is its KV heads' slice of the unsplit page
// (copy_head_slice, kvgate/format.hpp). Why the formats of `full` (the unsplit store) cannot be cut so
// for `ranks` ranks of model `c`, as "the <format> <K|V> half: <reason>", or "" when every rank's can.
std::string tensor_parallel_file_refusal(const StoreConfig& full, const ModelConfig& c, int ranks);
// Gather (save): every rank's pages of tokens [0, n) (ranks[r]: rank r's store and sequence, in rank
// order) placed at the rank's heads of the pages of `full`'s sequence fseq, which this extends to n
// tokens (an empty sequence of an unsplit store: make_store_config's config).
void gather_rank_pages(std::span<const KvStageView> ranks, const ModelConfig& c, PagedKvStore& full, SeqId fseq, int n);
// Scatter (hydrate): each rank's empty sequence gets n tokens whose pages are its heads' slices of
// the pages of `full`'s sequence fseq (import_pages: a streaming store's mirror and device copy both).
void scatter_rank_pages(const PagedKvStore& full, SeqId fseq, int n, const ModelConfig& c,
                        std::span<const KvStageTarget> ranks);

class TensorParallelForward {
 public:
  // Throws EngineError (kvgate/engine.hpp) when the model cannot be split (tensor_parallel_refusal)
  // or KvStoreError when a rank's store cannot hold the format (e.g. a 32-block wider than a rank's
  // row). `full` is the unsplit engine's StoreConfig (make_store_config). The ranks run one after
  // the other on one pool of worker threads: the caller's (the engine's; it must outlive this), or
  // one of `threads` workers of its own.
  TensorParallelForward(const Model& m, int ranks, const StoreConfig& full, int max_chunk, detail::ThreadPool& pool);
  TensorParallelForward(const Model& m, int ranks, const StoreConfig& full, int max_chunk, int threads);
  ~TensorParallelForward();
  TensorParallelForward(const TensorParallelForward&) = delete;
  TensorParallelForward& operator=(const TensorParallelForward&) = delete;

  int ranks() const;
  TpSlice slice(int r) const;
  const Model& rank_model(int r) const;  // the rank's weights (sliced copies; FP32)
  PagedKvStore& store(int r);
  const PagedKvStore& store(int r) const;
  SeqId sequence(int r) const;
  void reset_sequences();  // every rank's sequence freed and made anew

  // One chunk (T tokens at the sequences' end) through every layer; the logits of the last token
  // ([vocab]) or of every token ([T][vocab]) when all_logits. The steps below, in this order.
  void forward(const int* tokens, int T, float* logits, bool all_logits);

  // --- the pass in steps (forward() runs them; PAR.tp drives them one block at a time) ----------
  // Checks the chunk, extends every rank's sequence by T, embeds on every rank; returns pos0.
  int begin_chunk(const int* tokens, int T);
  // Every rank's attention block of layer l (its heads over its own store), then the all-reduce:
  // block_sum() = sum over ranks of the partial outputs.
  void attention(int l, int T, int pos0);
  // Every rank's FFN block of layer l, then the all-reduce.
  void ffn(int l, int T);
  // Every rank adds block_sum() to its residual replica (through the layer's post-norm on a post-norm
  // model: attention_block picks post_attn_norm, else post_ffn_norm); then the NaN/inf check.
  void add_block(int l, bool attention_block, int T, int pos0);
  // The final norm and the classifier (rank 0's replica).
  void head(int T, float* logits, bool all_logits);

  const float* block_sum() const;               // [T][dim]
  const float* partial(int r) const;            // [T][dim]: rank r's partial of the last block
  const float* attention_rows(int r) const;     // [T][q_heads * head_dim] of rank r
  const float* ffn_hidden(int r) const;         // [T][ffn] of rank r
  const float* residual(int r) const;           // [T][dim]: rank r's replica
  void set_residual(const float* x, int T);     // overwrite every rank's replica (teacher forcing)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvgate
