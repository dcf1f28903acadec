// Paged KV store in device memory: per layer a pool of K pages and a pool of V pages whose bytes
// are laid out exactly as the CPU PagedKvStore's (docs/FORMATS.md), block tables per sequence,
// quantize-on-append through the CUDA store kernel, and decode attention over a batch of sequences.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvgate/cuda/ops.hpp"
#include "kvgate/kv_store.hpp"

namespace kvgate::cuda {

class CudaKvStore {
 public:
  // Allocates and zeroes every page; throws KvStoreError (unsupported format/geometry) or
  // std::runtime_error (CUDA error, e.g. out of device memory).
  explicit CudaKvStore(StoreConfig cfg);
  // A view over device pages another owner holds (the streamed window of a CudaDevicePool):
  // pools[layer * 2 + half] is the base of that layer's K (half 0) / V (half 1) pages, `stride`
  // bytes apart (a multiple of 256, >= the page bytes), `n_pages` of them per layer. Nothing is
  // allocated, zeroed or freed; the view has no free list, so a sequence's pages come from
  // set_sequence() only (extend() past its table throws). The forward runs on a view unchanged.
  struct External {
    std::vector<std::uint8_t*> pools;
    std::size_t stride = 0;
    int n_pages = 0;
  };
  CudaKvStore(StoreConfig cfg, External ext);
  ~CudaKvStore();
  CudaKvStore(const CudaKvStore&) = delete;
  CudaKvStore& operator=(const CudaKvStore&) = delete;

  const StoreConfig& config() const { return cfg_; }
  PageGeometry geometry() const { return cfg_.geometry(); }
  HalfFormat half_format(KvHalf h) const { return h == KvHalf::K ? cfg_.format.k : cfg_.format.v; }
  // The scale of each KV head of (layer, half): n_kv_heads entries, as PagedKvStore::head_scales
  // (StoreConfig::k_scale/v_scale are kept expanded to [n_layers * n_kv_heads], layer-major).
  std::span<const float> head_scales(int layer, KvHalf h) const;
  // True when some (layer, half) has scales that differ across KV heads.
  bool per_head_scales() const;
  // The one scale of (layer, half) for per-tensor readers; throws KvStoreError when its heads differ.
  float tensor_scale(int layer, KvHalf h) const;
  // What the kernels take for (layer, half) (StoreRowsArgs::tensor_scale/head_scales, DecodeArgs and
  // PrefillArgs k_/v_scale and k_/v_head_scales): head 0's scale, and the device copy of the layer's
  // n_kv_heads scales when they differ across its heads (null when they agree: the per-tensor path).
  struct KernelScales {
    float tensor = 1.0f;
    const float* heads = nullptr;
  };
  KernelScales kernel_scales(int layer, KvHalf h) const;

  SeqId create_sequence();
  void free_sequence(SeqId s);
  int length(SeqId s) const;
  int extend(SeqId s, int n);  // returns the first new position
  std::span<const int> block_table(SeqId s) const;
  bool external() const { return external_; }
  // View only: the sequence's table (page indices of the view) and length; `blocks` must cover it.
  // Leading kReleasedBlock entries are pages the host mirror released (release_before there).
  void set_sequence(SeqId s, std::vector<int> blocks, int length);

  // Sliding-window release, as PagedKvStore::release_before: every whole page of the sequence whose
  // positions all lie before `first_kept_pos` (never the page being filled) is zeroed and goes back
  // to the free list; its block-table entry becomes kReleasedBlock. Writing those positions, or an
  // attention call whose keys start before the kept ones, is refused afterwards. Stores that own
  // their pages only (a view's pages belong to its window: the host mirror releases). Returns the
  // pages released by this call.
  int release_before(SeqId s, int first_kept_pos);
  // Tokens [0, released_tokens) of the sequence have had their pages released.
  int released_tokens(SeqId s) const;
  static constexpr int kReleasedBlock = PagedKvStore::kReleasedBlock;
  // The first n entries of a block table as the kernels get them: a released entry becomes a live
  // page of the table (no kernel reads it: the kept pages start at the first key read), so even a
  // stray load stays inside the pool instead of at page -1.
  static void kernel_table(std::span<const int> table, int* dst, std::size_t n);

  // Byte copies of one page (persistence), queued on `stream`; the caller synchronizes `stream`
  // before it reads `dst` / reuses `src` (or frees it) and orders `stream` after the kernels that
  // write / read the page (the forward's stream: pass it).
  void upload_page(int layer, KvHalf h, int block, const std::uint8_t* src, cudaStream_t stream);
  void download_runs(int layer, KvHalf h, int block, std::span<const ByteRun> runs, std::uint8_t* dst,
                     cudaStream_t stream) const;

  // Quantize rows for positions [pos0, pos0+n) of `layer`: device rows, k + t*k_stride floats.
  void write(SeqId s, int layer, int pos0, int n, const float* d_k, std::size_t k_stride, const float* d_v,
             std::size_t v_stride, cudaStream_t stream = nullptr);
  // The same from host rows (uploads, then writes; synchronous).
  void write_host(SeqId s, int layer, int pos0, int n, const float* k, std::size_t k_stride, const float* v,
                  std::size_t v_stride);

  std::uint8_t* pool(int layer, KvHalf h) { return pools_[index(layer, h)]; }
  const std::uint8_t* pool(int layer, KvHalf h) const { return pools_[index(layer, h)]; }
  std::size_t page_stride(KvHalf h) const { return stride_[static_cast<int>(h)]; }
  std::size_t page_bytes(KvHalf h) const { return page_bytes_[static_cast<int>(h)]; }
  std::vector<std::uint8_t> download_page(int layer, KvHalf h, int block) const;

  int free_blocks() const { return static_cast<int>(free_list_.size()); }
  int total_blocks() const { return cfg_.n_blocks; }
  std::size_t pool_bytes() const;  // page bytes only, as PagedKvStore::pool_bytes()

  // Decode attention of one query token per sequence (its last position) over `layer`:
  // d_q/d_out [seqs.size()][n_heads][D] on the device. window > 0: the last `window` keys only;
  // softcap > 0: attention-logit soft-cap (DecodeArgs::softcap).
  DecodePlan decode(std::span<const SeqId> seqs, int layer, int n_heads, const float* d_q, float* d_out,
                    DecodeWorkspace& ws, float softmax_scale = 0.0f, int num_splits = 0,
                    cudaStream_t stream = nullptr, int window = 0, float softcap = 0.0f);

  // Bytes-moved accounting of the attention kernels (docs/CUDA.md "What a decode step reads on the
  // GPU"): while on, decode() and mla_attention() hand their kernels a device counter
  // (DecodeArgs::bytes_read / MlaDecodeArgs::bytes_read) to which every warp (MLA: every CTA) adds the
  // KV bytes its loop read from the pool; off (the default) they hand none and the kernels pay one
  // uniform branch. Turning it on allocates the counter and zeroes it; off frees it. prefill() is not
  // counted. The CUDA forward builds its own DecodeArgs / MlaDecodeArgs and hands its decode launches
  // read_counter() (its chunks' prefill launches are not counted).
  void set_read_counter(bool on);
  bool read_counter_on() const { return d_bytes_read_ != nullptr; }
  unsigned long long* read_counter() const { return d_bytes_read_; }  // the device counter; null when off
  // The bytes counted since the counter was turned on or last reset (0 when off); both synchronize
  // the device first, so every stream's counted kernels have finished.
  std::uint64_t read_bytes() const;
  void reset_read_bytes();

  // Causal prefill attention of the chunk at positions [pos0, pos0 + n_new) of sequence s over
  // `layer` (the chunk's K/V rows must already be written): d_q/d_out [n_new][n_heads][D]. window > 0:
  // each query sees its last `window` keys only. Returns the kernel that ran (supports_op's path:
  // "prefill(mma,D=128)" or "prefill(fp32)"; windowed calls run on the fp32 kernel).
  std::string prefill(SeqId s, int layer, int n_heads, int pos0, int n_new, const float* d_q, float* d_out,
                      float softmax_scale = 0.0f, cudaStream_t stream = nullptr, int window = 0,
                      float softcap = 0.0f);

  // Latent attention (MLA, weight-absorbed) over `layer` of a KvLayout::mla_latent store (ops.hpp
  // MlaDecodeArgs): query row i reads the first lens[i] tokens of sequence seqs[i] (lens empty: each
  // sequence's whole length; a decode batch). d_q [rows][n_heads][kv_lora + rope] (W_UK absorbed,
  // RoPE applied), d_out [rows][n_heads][kv_lora] (o_lat; the caller applies W_UV). Throws
  // KvStoreError on a kv_heads store, a length outside a sequence or released keys.
  DecodePlan mla_attention(std::span<const SeqId> seqs, std::span<const int> lens, int layer, int n_heads,
                           const float* d_q, float* d_out, DecodeWorkspace& ws, float softmax_scale,
                           int num_splits = 0, cudaStream_t stream = nullptr);

 private:
  struct Sequence {
    int length = 0;
    std::vector<int> blocks;
    int released = 0;  // leading block-table entries given back by release_before (kReleasedBlock)
  };
  std::size_t index(int layer, KvHalf h) const { return static_cast<std::size_t>(layer) * 2 + static_cast<int>(h); }
  Sequence& seq(SeqId s);
  const Sequence& seq(SeqId s) const;
  void* scratch(int which, std::size_t bytes);
  void free_page(int block);  // zeroed, then on the free list
  // Refuses an access of `what` starting at position `first` below the released prefix.
  void check_kept(SeqId s, const Sequence& q, int first, const std::string& what) const;

  // Expands the scales (normalize_kv_scales), refuses a per-head table for an nvfp4 half and copies
  // the tables of a store with per-head scales to the device (d_head_scales_).
  void init_scales();
  // The kernels' per-row block tables [rows][max_pages] (kernel_table of each row's sequence) and the
  // rows' lengths, copied to scratch slot 3 on `stream`: {tables, lengths} on the device.
  std::pair<int*, int*> upload_row_tables(std::span<const SeqId> seqs, const std::vector<int>& lens, int max_pages,
                                          cudaStream_t stream);
  // Refuses `what` (a K/V-heads reader) on an mla_latent store, naming mla_attention.
  void refuse_latent(const char* what) const;

  StoreConfig cfg_;
  float* d_head_scales_ = nullptr;  // [2 (K, V)][n_layers][n_kv_heads] on the device when per_head_scales()
  std::size_t page_bytes_[2]{}, stride_[2]{};
  std::vector<std::uint8_t*> pools_;
  std::vector<int> free_list_;
  std::map<SeqId, Sequence> seqs_;
  SeqId next_id_ = 0;
  bool external_ = false;
  unsigned long long* d_bytes_read_ = nullptr;  // set_read_counter
  void* scratch_[4]{};
  std::size_t scratch_bytes_[4]{};
};

// Sets an attention call's K and V scales (DecodeArgs / PrefillArgs: k_scale, k_head_scales, v_scale,
// v_head_scales) to what the store's kernels take for `layer` (CudaKvStore::kernel_scales).
template <class Args>
void set_kernel_scales(const CudaKvStore& st, int layer, Args& a) {
  const CudaKvStore::KernelScales k = st.kernel_scales(layer, KvHalf::K), v = st.kernel_scales(layer, KvHalf::V);
  a.k_scale = k.tensor;
  a.k_head_scales = k.heads;
  a.v_scale = v.tensor;
  a.v_head_scales = v.heads;
}

}  // namespace kvgate::cuda
