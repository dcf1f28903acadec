// The CUDA backend's operations over the paged KV layout of docs/FORMATS.md (same page bytes as
// the CPU store): quantize + append ("store rows") and split-K decode attention. Every K/V half
// format pair is supported; supports_op() says why a (format, geometry, arch) combination is not.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kvgate/format.hpp"
#include "kvgate/kv_store.hpp"

namespace kvgate::cuda {

enum class Op : std::uint8_t { store, decode, prefill };

struct OpSupport {
  bool ok = true;
  std::string reason;  // stable code: "row_not_multiple_of_32", "head_dim_not_power_of_two",
                       // "gqa_ratio_invalid", "head_dim_unsupported", "row_too_large", "arch_unsupported",
                       // "format_unsupported", "per_head_scales_unsupported"
  std::string detail;  // one human sentence
  std::string path;    // which kernel runs: "fast(D=128)", "generic", "store"
};

// Static capability (format x geometry x query heads); when a device is present its compute
// capability is checked too (the kernels are built for sm_90a + compute_90 PTX).
OpSupport supports_op(Op op, const KvFormat& f, const PageGeometry& g, int n_heads = 0);

// The same for a store configuration, its scales included: fp8 halves take scales per KV head (a
// [n_layers * n_kv_heads] StoreConfig::k_scale/v_scale whose heads differ), an nvfp4 half's are
// refused with reason "per_head_scales_unsupported" (its global scale is one per (layer, K|V), as on
// the CPU store; no device needed).
OpSupport supports_op(Op op, const StoreConfig& c, int n_heads = 0);

// Registers the CUDA capability with kvgate::resolve_kv as backend "cuda" (runtime/cuda/capability.cpp):
// resolve_kv(backend "cuda") then refuses what these ops cannot run, with supports_op's reason.
void register_capability();

// ---- store ---------------------------------------------------------------------------------
struct StoreRowsArgs {
  const float* rows = nullptr;        // device, [n_tokens][row_stride] floats, row = H*D head-major
  std::size_t row_stride = 0;         // floats between rows (>= H*D)
  const int* slot_mapping = nullptr;  // device, [n_tokens]: block*block_size + slot; < 0 skips the row
  int n_tokens = 0;
  std::uint8_t* pool = nullptr;       // device pool of one (layer, half): page p at pool + p*page_stride
  std::size_t page_stride = 0;
  float tensor_scale = 1.0f;          // fp8 per-tensor scale (nvfp4: the global scale)
  const float* head_scales = nullptr; // fp8: device [n_kv_heads], the layer's scale per KV head (docs/FORMATS.md
                                      // "Static scales per KV head"); null: tensor_scale on every head
};
// Quantizes each row into its slot, bit-identical to kvgate::quantize_token. Throws on an
// unsupported format/geometry or a CUDA error.
void store_rows(HalfFormat f, const PageGeometry& g, const StoreRowsArgs& a, cudaStream_t stream = nullptr);

// ---- decode attention --------------------------------------------------------------------------
struct DecodeArgs {
  KvFormat format;
  PageGeometry geometry;
  int n_heads = 0;  // query heads, a multiple of n_kv_heads
  int batch = 0;
  const std::uint8_t* k_pool = nullptr;  // device pools of one layer
  const std::uint8_t* v_pool = nullptr;
  std::size_t k_page_stride = 0, v_page_stride = 0;
  const int* block_tables = nullptr;  // device [batch][table_stride] page ids
  int table_stride = 0;
  const int* seq_lens = nullptr;  // device [batch], >= 1
  int max_seq_len = 0;            // host-side upper bound of seq_lens (sizes the split)
  const float* q = nullptr;       // device [batch][n_heads][D]; query at position seq_len-1
  float* out = nullptr;           // device [batch][n_heads][D]
  float k_scale = 1.0f, v_scale = 1.0f;  // per-tensor scales (fp8 halves)
  const float* k_head_scales = nullptr;  // fp8 halves: device [n_kv_heads], the layer's scale per KV head
  const float* v_head_scales = nullptr;  // (StoreRowsArgs::head_scales); null: k_scale / v_scale on every head
  float softmax_scale = 0.0f;            // <= 0: 1/sqrt(D)
  int num_splits = 0;                    // 0: chosen from the device's occupancy
  int window = 0;                        // > 0: sliding window, the query sees the last `window` keys
  float softcap = 0.0f;                  // > 0: attention-logit soft-cap, s -> softcap * tanh(s / softcap)
                                         // after the scale, before the mask (Gemma 2's attn_logit_softcapping)
  // Bytes-moved accounting (docs/CUDA.md "What a decode step reads on the GPU"): device counter, null =
  // off (the default; the kernels then pay one uniform branch per warp). When set, the attention
  // kernel adds the KV bytes its loops read: the cells (token x KV head) each warp copied from the
  // pool, times (K + V page bytes) / (block_size x n_kv_heads), rounded up where a scale block spans
  // heads (head_dim below the block). A head chunk re-reads its KV head's cells (group > 4: counted
  // once per chunk). The caller zeroes it and reads it after the stream; CudaKvStore::set_read_counter.
  unsigned long long* bytes_read = nullptr;
};

struct DecodePlan {
  std::string path;
  int splits = 1, tokens_per_split = 0, head_chunks = 1;
  int ctas = 0, resident_ctas = 0;  // grid size and how many fit on the device at once
  int smem_bytes = 0;
  std::size_t workspace_bytes = 0;
};

// Device scratch for the split partials; grows on demand, reused across calls (one stream).
class DecodeWorkspace {
 public:
  DecodeWorkspace() = default;
  DecodeWorkspace(const DecodeWorkspace&) = delete;
  DecodeWorkspace& operator=(const DecodeWorkspace&) = delete;
  ~DecodeWorkspace();
  void* reserve(std::size_t bytes);

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

DecodePlan plan_decode(const DecodeArgs& a);
// out = softmax(q K^T * scale) V over each sequence's first seq_len tokens (the decode query sees
// its whole context). Throws on an unsupported combination (supports_op's reason) or CUDA error.
DecodePlan decode_attention(const DecodeArgs& a, DecodeWorkspace& ws, cudaStream_t stream = nullptr);
// The same with a plan made earlier by plan_decode for the same shapes (no host-side planning:
// what a benchmark or a CUDA graph capture wants; the workspace must already be large enough
// when capturing).
DecodePlan decode_attention(const DecodeArgs& a, const DecodePlan& plan, DecodeWorkspace& ws,
                            cudaStream_t stream = nullptr);
// Whether decode_attention launches its split-K combine as the decode kernel's programmatic
// dependent (Hopper PDL): yes unless the environment sets KVGATE_CUDA_PDL=0 (read once).
bool decode_combine_pdl();
// Whether the pipelined decode kernels (fast, tensor-core) may read a step (16 tokens, 2 to 16 on
// the fast kernel) as one page's tile (one table entry per step, no per-token lookups;
// kernels/decode.cuh WarpKvPipe) where the block size and the split allow it: yes unless the
// environment sets KVGATE_CUDA_PAGE_TILES=0 (read once; the A/B of the two ways in one binary).
bool decode_page_tiles();
// Overrides that choice for the decode calls launched after it, process-wide (the gates' twin that
// runs every case both ways, PAR.cuda.decode.page_tiles).
void set_decode_page_tiles(bool on);

// ---- prefill attention (runtime/cuda/prefill.cu, kernels/prefill.cuh) ------------------------------
// Causal attention of a chunk of n_new query tokens of one sequence at positions
// [n_past, n_past + n_new) over that sequence's first n_past + n_new tokens in the paged store (the
// chunk's own K/V rows are already stored): query i sees tokens 0 .. n_past + i.
struct PrefillArgs {
  KvFormat format;
  PageGeometry geometry;
  int n_heads = 0;                        // query heads, a multiple of n_kv_heads
  const std::uint8_t* k_pool = nullptr;   // device pools of one layer
  const std::uint8_t* v_pool = nullptr;
  std::size_t k_page_stride = 0, v_page_stride = 0;
  const int* block_table = nullptr;       // device, the sequence's page ids (>= ceil((n_past+n_new)/block_size))
  int n_past = 0;                         // tokens before the chunk
  int n_new = 0;                          // query tokens in the chunk (>= 1)
  const float* q = nullptr;               // device [n_new][n_heads][D]
  float* out = nullptr;                   // device [n_new][n_heads][D]
  float k_scale = 1.0f, v_scale = 1.0f;   // per-tensor scales (fp8 halves)
  const float* k_head_scales = nullptr;   // fp8 halves: device [n_kv_heads] scales per KV head, as
  const float* v_head_scales = nullptr;   // DecodeArgs; null: k_scale / v_scale on every head
  float softmax_scale = 0.0f;             // <= 0: 1/sqrt(D)
  int window = 0;                         // > 0: sliding window, query i sees keys n_past+i-window+1 .. n_past+i
  float softcap = 0.0f;                   // > 0: attention-logit soft-cap, as DecodeArgs::softcap
};
// Throws on an unsupported combination (supports_op(Op::prefill, ...)'s reason) or a CUDA error.
void prefill_attention(const PrefillArgs& a, cudaStream_t stream = nullptr);
// The first key position prefill_attention loads for a chunk starting at n_past under a sliding
// window (0 without one): its 32-key tiles start on multiples of 32, so the first tile may hold
// masked keys before n_past - window + 1. Keys before it are read by no query of the chunk (nor by a
// decode step at n_past, which starts at n_past - window + 1); the engine's window release keeps
// the pages from here on (CudaKvStore::release_before).
int prefill_first_key(int n_past, int window);
// The tensor-core prefill kernel (runtime/cuda/prefill_mma.cu, kernels/prefill_mma.cuh) serves
// every pair without an f32 half at head_dim 64, 128, 256; prefill_attention runs it for those and
// the CUDA-core kernel for the rest (supports_op(Op::prefill).path names which: "prefill(mma,D=N)"
// or "prefill(fp32)"). prefill_attention_mma returns false, launching nothing, where it does not apply.
bool prefill_mma_applies(const KvFormat& f, const PageGeometry& g);
bool prefill_attention_mma(const PrefillArgs& a, cudaStream_t stream = nullptr);

// ---- latent attention (MLA, weight-absorbed; runtime/cuda/mla_decode.cu, kernels/mla_decode.cuh) ----
// The KvLayout::mla_latent store (kv_store.hpp): per token one latent row c (kv_lora elements, the K
// half, its half format and tensor scale) and one RoPE key r (rope elements, the V half). Query row i
// (one token of a sequence: its block table and how many of the sequence's tokens it sees) and head h
// carry q = [q_lat | q_rope] with W_UK already absorbed into q_lat (attention_mla.hpp) and RoPE applied:
//   s_j   = softmax_scale * (q_lat . c_j + q_rope . r_j)       j < seq_lens[i]
//   o_lat = sum_j softmax(s)_j c_j                             (FP32, online softmax over split-K)
// and the caller applies W_UV. A decode batch is one row per sequence; a prefill chunk one row per
// token with lengths pos + 1 (causal), the layout CudaForward stages for every call.
struct MlaDecodeArgs {
  KvFormat format;  // k: the latent's half format, v: the RoPE key's
  int block_size = 16;
  int kv_lora = 0;  // latent width (the store's head_dim)
  int rope = 0;     // RoPE key width (the store's v_head_dim)
  int n_heads = 0;  // query heads
  int rows = 0;     // query rows
  const std::uint8_t* k_pool = nullptr;  // device pools of one layer: latent pages, RoPE-key pages
  const std::uint8_t* v_pool = nullptr;
  std::size_t k_page_stride = 0, v_page_stride = 0;
  const int* block_tables = nullptr;  // device [rows][table_stride] page ids
  int table_stride = 0;
  const int* seq_lens = nullptr;  // device [rows], >= 1: the keys row i sees
  int max_seq_len = 0;            // host-side upper bound of seq_lens (sizes the split)
  const float* q = nullptr;       // device [rows][n_heads][kv_lora + rope]
  float* out = nullptr;           // device [rows][n_heads][kv_lora]: o_lat, normalized
  float k_scale = 1.0f, v_scale = 1.0f;  // tensor scales of the halves (fp8; nvfp4: its global scale)
  float softmax_scale = 0.0f;            // the model's (> 0): qk_head_dim^-0.5 (x YaRN's mscale^2)
  int num_splits = 0;                    // 0: chosen from the device's occupancy
  // Bytes-moved accounting as DecodeArgs::bytes_read: each CTA adds the tokens it staged times the
  // latent's plus the RoPE key's token bytes (every 16-head chunk stages the row's tokens again).
  unsigned long long* bytes_read = nullptr;
};
// Static capability of the latent kernel: reason codes as supports_op's ("row_too_large": kv_lora >
// 512 or rope > 64; "format_unsupported": a rotated half, whose inverse transform this kernel does not
// apply; "arch_unsupported"). path: "mla(fp32)".
OpSupport supports_mla(const KvFormat& f, int kv_lora, int rope, int n_heads);
// Throws on an unsupported combination (supports_mla's reason) or a CUDA error. Returns the plan
// (splits, grid, shared memory, workspace bytes); the workspace grows on demand as decode's.
DecodePlan plan_mla_decode(const MlaDecodeArgs& a);
DecodePlan mla_decode_attention(const MlaDecodeArgs& a, DecodeWorkspace& ws, cudaStream_t stream = nullptr);
DecodePlan mla_decode_attention(const MlaDecodeArgs& a, const DecodePlan& plan, DecodeWorkspace& ws,
                                cudaStream_t stream = nullptr);

}  // namespace kvgate::cuda
