// The CUDA forward of the whole model and the CUDA engine (library kvgate::cuda_model, docs/CUDA.md).
//
//  CudaModel    the weights on the device, uploaded once: f32 (cuBLAS SGEMM, pedantic math: no
//               TF32) or bf16 (cublasGemmEx, FP32 accumulate; activations rounded to bf16 at the
//               GEMM input). A random-weight model can be generated on the device (benchmarks).
//  CudaForward  forward(rows) reads like the math of runtime/src/forward_cpu.cpp: embedding
//               gather, per layer RMSNorm, Q/K/V GEMMs (+qwen2 bias, +qwen3 QK-norm), RoPE (the
//               CPU's binary32 angle and cos/sin values, tabulated on the host), quantize-on-append
//               through the CUDA store kernel, attention from the paged store, Wo + residual,
//               FFN RMSNorm, W1/W3 + SwiGLU, W2 + residual, final norm, classifier. A "row" is one
//               token of one sequence: a chunk of one sequence (causal over its own rows) or a
//               decode batch (one token of each of B sequences) run through the same code.
//               A decode batch can replay a captured CUDA graph (inputs staged in fixed buffers).
//  CudaEngine   the subset of kvgate::Engine's API the CLI needs (prefill, decode,
//               forward_all_logits, generate with the CPU's seeded Sampler on downloaded logits,
//               or a GPU argmax when greedy, conversations: hydrate / save_kv of KV files) and
//               EngineStats with backend "cuda". With kv_resident > 0 the KV is streamed: every
//               page in a page-locked host mirror, a window of kv_resident tokens' pages per layer
//               on the device (stream_pool.hpp), the forward unchanged over a view of the window.
//               With the layer split (EngineOptions::pipeline_stages, kvgate/cuda/pipeline.hpp) each
//               stage has its own store (and, streaming, its own mirror and window on its device);
//               KV files are saved from and hydrated into every stage, byte-identical to unsplit.
//               With tensor parallelism (EngineOptions::tensor_parallel, kvgate/cuda/tensor_parallel.hpp)
//               each rank has its sliced weights, its own store of its KV heads and its own forward,
//               and, streaming, its own host mirror and device window of its KV heads (each rank
//               streams as a pipeline stage does); KV files and KV damage are refused with it.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/kv_damage.hpp"
#include "kvgate/model.hpp"

namespace kvgate::cuda {

enum class WeightType : std::uint8_t { f32, bf16 };
const char* name(WeightType w);

// Why the CUDA forward cannot run this model config (empty: it can). Checked by CudaModel.
std::string forward_unsupported_reason(const ModelConfig& c);

// A pipeline stage's share of the model (the layer split, CudaPipeline): layers [first, end). The
// stage that starts at layer 0 holds the embeddings and embeds the tokens; the one that ends at the
// last layer holds the final norm and the classifier (and the embeddings too when they are tied).
struct LayerRange {
  int first = 0, end = -1;  // end -1: through the model's last layer
  int end_of(const ModelConfig& c) const { return end < 0 ? c.n_layers : end; }
  bool embeds() const { return first == 0; }
  bool has_head(const ModelConfig& c) const { return end_of(c) == c.n_layers; }
  bool holds(const ModelConfig& c, int layer) const { return layer >= first && layer < end_of(c); }
};

class CudaModel {
 public:
  // Uploads `m`'s weights (converted to bf16 when asked), on the current device; `range`: only the
  // layers of a pipeline stage (layer(l) of another layer is empty). Throws ModelError (unsupported
  // config or range) or std::runtime_error (CUDA error, e.g. out of device memory).
  explicit CudaModel(const Model& m, WeightType wt = WeightType::f32, LayerRange range = {});
  // A random-weight model of config `c`, generated on the device (no host copy): matrices uniform
  // with standard deviation 1/sqrt(fan_in), embeddings unit variance, norm gains 1. For benchmarks.
  static std::unique_ptr<CudaModel> random(const ModelConfig& c, WeightType wt, std::uint64_t seed);
  // Device bytes `w` takes once uploaded as `wt` (what the constructor checks against cudaMemGetInfo);
  // `range`: a pipeline stage's share.
  static std::size_t device_bytes(const ModelWeights& w, WeightType wt);
  static std::size_t device_bytes(const ModelWeights& w, const ModelConfig& c, WeightType wt, LayerRange range);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  struct Layer {
    const void *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;  // [out][in], f32 or bf16
    const void *w1 = nullptr, *w2 = nullptr, *w3 = nullptr;
    const float *attn_norm = nullptr, *ffn_norm = nullptr;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr;  // qwen2, else null
    const float *q_norm = nullptr, *k_norm = nullptr;         // qwen3, else null
    const float *post_attn_norm = nullptr, *post_ffn_norm = nullptr;  // Gemma (post_norms), else null
    // Mixture-of-experts layer (ModelConfig::moe.is_moe): the router [E][dim] and each expert's
    // matrices, in the weight type; w1/w2/w3 are null then.
    const void* router = nullptr;
    std::vector<const void*> ew1, ew2, ew3;  // [E]: [expert_dim][dim], [dim][expert_dim], [expert_dim][dim]
    const float* router_bias = nullptr;      // DeepSeek e_score_correction_bias [E] (f32)
    const void *sw1 = nullptr, *sw2 = nullptr, *sw3 = nullptr;  // shared expert
    // MLA (ModelConfig::mla): wq = q_proj or q_b_proj; wk/wv null.
    const void *wq_a = nullptr, *wkv_a = nullptr, *wkv_b = nullptr;
    const float *q_a_norm = nullptr, *kv_a_norm = nullptr;
  };
  const ModelConfig& config() const { return c_; }
  WeightType weight_type() const { return wt_; }
  const LayerRange& range() const { return range_; }
  int device() const { return device_; }  // the CUDA device the weights live on
  const Layer& layer(int l) const { return layers_[static_cast<std::size_t>(l)]; }
  const void* tok_embeddings() const { return emb_; }
  const void* classifier() const { return cls_; }  // == tok_embeddings() when tied
  const float* final_norm() const { return final_norm_; }
  std::size_t weight_bytes() const { return bytes_; }

 private:
  CudaModel(const ModelConfig& c, WeightType wt, LayerRange range = {});
  void* alloc(std::size_t n_elems, bool matrix);  // matrix: weight type, else f32
  void* upload(const std::vector<float>& v, bool matrix);
  void* upload(const WeightView& v, bool matrix);  // FP32 or 16-bit host weights
  void* upload(const Weight& w, bool matrix) { return upload(w.view(), matrix); }
  class Bf16Staging;  // the bf16 upload's page-locked double buffer (model.cpp), during construction only

  ModelConfig c_;
  WeightType wt_;
  LayerRange range_;
  int device_ = 0;
  std::vector<Layer> layers_;  // [n_layers]; empty outside range_
  const void* emb_ = nullptr;
  const void* cls_ = nullptr;
  const float* final_norm_ = nullptr;
  std::vector<void*> allocs_;
  std::size_t bytes_ = 0;
  std::unique_ptr<Bf16Staging> staging_;
};

struct CudaForwardOptions {
  int max_rows = 128;     // tokens per forward call (chunk length or decode batch)
  int max_context = 0;    // 0: the model's max_seq_len (sizes the RoPE tables and block tables)
  bool cuda_graphs = true;  // decode batches replay a captured graph
  bool prefill_kernel = true;  // chunks: the causal prefill kernel; false: the decode kernel per row
};

class CudaForward {
 public:
  CudaForward(const CudaModel& model, CudaKvStore& store, CudaForwardOptions opts);
  ~CudaForward();
  CudaForward(const CudaForward&) = delete;
  CudaForward& operator=(const CudaForward&) = delete;

  // T tokens of sequence s at positions store.length(s).. (extends it by T): causal attention over
  // the sequence. Logits of the last row ([vocab]) or of every row ([T][vocab]) to host `logits`
  // (null: none downloaded); `argmax` (host, nullable) receives the last row's greedy id.
  void forward_chunk(SeqId s, std::span<const int> tokens, float* logits, bool all_logits, int* argmax = nullptr);
  // One token for each of B sequences (each extended by 1): logits [B][vocab] to host `logits`
  // (nullable), greedy ids [B] to host `argmax` (nullable). Replays a CUDA graph when enabled.
  void forward_decode(std::span<const SeqId> seqs, std::span<const int> tokens, float* logits, int* argmax = nullptr);

  // Device copies of the post-RoPE K/V rows of every layer of the last forward call, for gates that
  // compare the store's bytes against the CPU quantizer on the same rows: [n_layers][rows][kv_dim].
  // K/V rows of every layer as computed (diagnostics); a latent-cache forward has none and refuses.
  void set_capture_kv(bool on);
  const std::vector<float>& captured_k() const { return cap_k_; }
  const std::vector<float>& captured_v() const { return cap_v_; }
  // K rows rotated at position + offset (0 in use; queries keep theirs). Anti-vacuity gates inject a
  // wrong-position bug with it (a uniform shift of q and k would cancel: RoPE is relative).
  void set_k_rope_position_offset(int off);
  // Diagnostics (probe sensitivity): injected KV damage (kvgate/kv_damage.hpp) applied to the rows
  // each call stores, right after the store kernel, before attention reads them (kv_damage in
  // kernels.hpp); nullopt: none. The damaged half must be f32, f16 or bf16 (EngineError otherwise);
  // the calls must append consecutive positions of one sequence (a decode batch of one), and v_repeat
  // needs them in order from position 0 (the undamaged last row of one call feeds the next).
  // Drops the captured decode graphs (they bake the damage in).
  void set_damage(const std::optional<KvDamage>& d);
  const std::optional<KvDamage>& damage() const { return damage_; }

  // Pipeline stages (CudaModel::range, CudaPipeline): a stage that starts after layer 0 reads the
  // residual rows [rows][dim] that `prev` (the stage ending where it starts, on any device) left
  // from the same call; the caller runs the stages in order, each after the one before returned.
  void set_input(const CudaForward* prev);
  const CudaModel& model() const { return m_; }

  // --- the steps of a tensor-parallel rank (CudaTensorParallel, kvgate/cuda/tensor_parallel.hpp) -------
  // A call over the rank's own store: tp_begin_chunk / tp_begin_decode (the checks of forward_chunk /
  // forward_decode, the rank's sequences extended, the rows' metadata staged for its store, the
  // embedding), then per layer tp_attention_partial + tp_add_partial and tp_ffn_partial +
  // tp_add_partial, then tp_finish (head, download, stream sync). Dense layers only (MLA, MoE, the
  // latent cache, a pipeline stage and KV damage are refused: EngineError). No CUDA graph: every step
  // launches eagerly on stream(); attention plans per call as a graph-less decode does.
  int tp_begin_chunk(SeqId s, std::span<const int> tokens);  // returns the chunk's first position
  void tp_begin_decode(std::span<const SeqId> seqs, std::span<const int> tokens);
  // xb = rmsnorm(x), attention of layer l over the rank's heads (the steps of layers()), then
  // partial = att Wo (beta 0: the Wo GEMM alone, no residual): [rows][dim].
  void tp_attention_partial(int l);
  // xb = rmsnorm(x), hidden = act(xb W1) * (xb W3), partial = hidden W2 (beta 0): [rows][dim].
  void tp_ffn_partial(int l);
  // x += rmsnorm_post(partial) (post_norm: the layer's Gemma post-norm) or x += partial.
  void tp_add_partial(const float* post_norm);
  // Final norm and classifier over the call's rows (all_logits: every row, else the last), logits and
  // the last row's greedy id downloaded (both nullable); then the stream is synchronised.
  void tp_finish(float* logits, bool all_logits, int* argmax);
  int tp_rows() const { return tp_.rows; }
  // Device buffers of the rank (valid for the current call's tp_rows() rows, on stream()'s device):
  float* tp_partial();                          // [max_rows][dim]: the block's partial / the all-reduced sum
  float* residual() { return x_; }              // [max_rows][dim]: the residual rows
  const float* normed_rows() const { return xb_; }       // [rows][dim]: the last rmsnorm's rows (block input)
  const float* attention_out() const { return att_; }    // [rows][q_dim]: the heads' attention outputs
  const float* ffn_hidden() const { return hb_; }        // [rows][hidden_dim]: act(xb W1) * (xb W3)

  cudaStream_t stream() const { return stream_; }
  const CudaForwardOptions& options() const { return opts_; }
  int graph_captures() const { return graph_captures_; }
  int graph_replays() const { return graph_replays_; }

 private:
  int check_decode_batch(std::span<const SeqId> seqs, std::span<const int> tokens) const;
  int check_chunk(SeqId s, std::span<const int> tokens) const;
  int stage_chunk(SeqId s, std::span<const int> tokens);
  void chunk_logits(int T, float* logits, bool all_logits, int* argmax);
  int stage_decode(std::span<const SeqId> seqs, std::span<const int> tokens);
  void stage(const std::vector<SeqId>& row_seq, const std::vector<int>& row_pos, std::span<const int> tokens,
             int table_stride);
  void layers(int R, int table_stride, int max_len, bool chunk, const DecodePlan* plan, DecodeWorkspace& ws,
              const std::map<int, DecodePlan>* window_plans = nullptr);
  // layers()' named steps, shared with the tensor-parallel steps (same arguments, same launches):
  void begin_layers(int R);  // embedding (or the input stage's rows) and the K/V capture buffers
  void attend(int l, int R, int table_stride, int max_len, bool chunk, const DecodePlan* plan, DecodeWorkspace& ws,
              const std::map<int, DecodePlan>* window_plans);  // q/k/v .. attention into att_
  void ffn_hidden_rows(const CudaModel::Layer& L, int R);    // hb_ = act(xb W1) * (xb W3)
  void tp_check(const char* step) const;                      // what the tensor-parallel steps refuse
  struct TpCall {
    int rows = 0, max_len = 0;  // rows of the call; the longest attention span (keys)
    bool chunk = false, active = false;
  } tp_;
  float* tp_partial_ = nullptr;  // [max_rows][dim], allocated by the first tensor-parallel step
  void head(int first_row, int n_rows);
  void gemm(const void* W, const float* x, float* out, int rows, int n_in, int n_out, bool accumulate);
  void download(int n_logit_rows, float* logits, int n_argmax, int* argmax);
  void check_stage_call(bool wants_outputs, int rows) const;
  int store_layer(int l) const { return l - m_.range().first; }  // a pipeline stage's store holds its layers
  const CudaForward* input_ = nullptr;  // the previous pipeline stage (set_input), else null

  const CudaModel& m_;
  CudaKvStore& store_;
  CudaForwardOptions opts_;
  ModelConfig c_;
  int max_ctx_ = 0, table_stride_ = 0;
  cudaStream_t stream_ = nullptr;
  void* cublas_ = nullptr;  // cublasHandle_t
  void* cublas_ws_ = nullptr;
  // device activations
  float *x_ = nullptr, *xb_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *att_ = nullptr;
  float *hb_ = nullptr, *hb2_ = nullptr, *logits_ = nullptr, *rope_cos_ = nullptr, *rope_sin_ = nullptr;
  float* post_ = nullptr;  // [rows][dim]: an attention / FFN output before its Gemma post-norm
  // Mixture of experts: router logits and dense gate weights [rows][E], the weighted expert sum and
  // one expert's output [rows][dim].
  float *moe_logits_ = nullptr, *moe_gate_ = nullptr, *moe_acc_ = nullptr, *moe_y_ = nullptr;
  // MLA scratch: q_a [rows][q_lora], kv_a output [rows][kv_lora + rope], latent [rows][kv_lora],
  // kv_b output [rows][H][nope + v], the heads' v outputs [rows][H * v].
  float *mla_qa_ = nullptr, *mla_ckv_ = nullptr, *mla_lat_ = nullptr, *mla_kvb_ = nullptr, *mla_att_ = nullptr;
  void mla_qkv(const CudaModel::Layer& L, int R);
  void mla_project(const CudaModel::Layer& L, int R);
  // The MLA latent cache (store layout mla_latent): absorbed q [rows][H][kv_lora + rope] and the
  // latent kernel's o_lat [rows][H][kv_lora].
  bool latent_ = false;
  float *mla_qlat_ = nullptr, *mla_olat_ = nullptr;
  void mla_latent_block(const CudaModel::Layer& L, int l, int R, int table_stride, int max_len, const DecodePlan* plan,
                        DecodeWorkspace& ws);
  MlaDecodeArgs mla_args(int rows, int max_len) const;
  void moe_ffn(const CudaModel::Layer& L, int R);
  void* act16_ = nullptr;  // bf16 copy of a GEMM input (bf16 weights)
  // device metadata (one block, staged from pinned host memory in one copy)
  int* meta_ = nullptr;
  int* meta_host_ = nullptr;
  std::size_t meta_ints_ = 0;
  int *d_tokens_ = nullptr, *d_pos_ = nullptr, *d_slot_ = nullptr, *d_lens_ = nullptr, *d_tables_ = nullptr;
  int* d_argmax_ = nullptr;
  int* h_argmax_ = nullptr;  // pinned
  DecodeWorkspace ws_;        // plain launches
  DecodeWorkspace graph_ws_;  // captured graphs
  std::size_t graph_ws_bytes_ = 0;
  int k_rope_offset_ = 0;
  // RoPE variants (rope.hpp). Length-dependent ones (dynamic NTK, longrope) get per-row cos/sin
  // staged with each call: rows [0, max_rows) for q at pos, [max_rows, 2 max_rows) for k at
  // pos + offset, read through the identity index d_row_idx_. The sliding layers' own RoPE (Gemma 3)
  // has its own position tables.
  float *rope_cos_l_ = nullptr, *rope_sin_l_ = nullptr;
  float *rope_row_cos_ = nullptr, *rope_row_sin_ = nullptr, *rope_row_host_ = nullptr;  // host: pinned
  int* d_row_idx_ = nullptr;
  int rot_ = 0, rot_l_ = 0;
  void stage_rope_rows(const std::vector<SeqId>& row_seq, const std::vector<int>& row_pos);
  bool capture_kv_ = false;
  std::vector<float> cap_k_, cap_v_;
  std::optional<KvDamage> damage_;
  void* damage_prev_ = nullptr;  // v_repeat: per layer the undamaged last stored row of the last call
  void damage_rows(int layer, int R);
  void drop_graphs();
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    DecodePlan plan;                         // full-attention layers
    std::map<int, DecodePlan> window_plans;  // sliding layers, by window: splits over the window's keys
  };
  std::map<int, Graph> graphs_;  // by batch size
  const unsigned long long* graph_counter_ = nullptr;  // the store's read counter the graphs were captured with
  int graph_captures_ = 0, graph_replays_ = 0;
};

struct CudaEngineOptions {
  EngineOptions engine;          // kv (resolved with backend "cuda"), block_size, n_blocks,
                                 // kv_cache_memory, k/v scales, max_context, prefill_chunk,
                                 // kv_resident (streaming window in tokens; 0: all resident)
  WeightType weights = WeightType::f32;
  bool cuda_graphs = true;       // batch-1 decode replays a captured CUDA graph
  // Weights already on the device, shared by several engines (the sign-off keeps one engine per KV
  // format alive; one upload of an 8B model serves them all). Null: the engine uploads its own
  // (`weights` type). Must have been made from the same model (checked: config shape).
  std::shared_ptr<const CudaModel> shared_weights;
  // The layer split (engine.pipeline_stages / pipeline_layers > 1 stage, kvgate/cuda/pipeline.hpp):
  // the CUDA device of each stage, in layer order (a device may repeat); empty: stage i on device i
  // modulo the device count. Unsplit: empty, or the current device.
  std::vector<int> devices;
  // Diagnostics only (probe sensitivity): KV damage on the stored rows (CudaForward::set_damage);
  // the CPU engine's counterpart is EngineOptions::kv_read_hook (refused here). Nothing in a release
  // path sets it.
  std::optional<KvDamage> damage;
};

class CudaEngine {
 public:
  // Throws EngineError (bad options / no device), ModelError (unsupported arch), KvStoreError.
  CudaEngine(const Model& model, CudaEngineOptions opts);
  ~CudaEngine();
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  const std::vector<float>& prefill(std::span<const int> tokens);
  const std::vector<float>& decode(int token);
  std::vector<float> forward_all_logits(std::span<const int> tokens);
  GenerateResult generate(std::span<const int> prompt, int steps, const SamplerOptions& sampler,
                          const std::function<void(int)>& on_token = {});

  // --- conversations (kv_file.hpp), as kvgate::Engine ----------------------------------------
  // Token ids whose K/V rows the sequence holds, in order.
  std::span<const int> history() const;
  // Empties the sequence, then restores from `file` the longest prefix of `prompt` it holds (at least
  // one prompt token is left to prefill): a byte copy of the file's pages into the device store
  // (streaming: into the host mirror); with the layer split, each stage's layers into its store. Refused
  // (KvFileError) when the file does not match this engine (model, format, rotation, shape, scales). A
  // file the CPU engine wrote hydrates here and vice versa; a file saved split hydrates unsplit and
  // the reverse (the file does not depend on the split).
  int hydrate(const KvFile& file, std::span<const int> prompt);
  // Every K/V row of the sequence (the device pages read back) and the transcript history() +
  // pending as a KV file, atomically.
  void save_kv(const std::string& path, std::span<const int> pending = {}) const;

  void reset();
  // Replaces the damage (CudaEngineOptions::damage) for the rows written from now on; call reset()
  // before the next case so every row of it carries the new damage.
  void set_damage(const std::optional<KvDamage>& d);
  int position() const;
  int max_context() const;
  int vocab_size() const;
  const EngineStats& stats() const;
  const Model& model() const;
  // Streaming (--kv-resident): the forward runs on a view over the device window's slots (store());
  // every page lives in the host mirror (with the layer split: every stage its own window and mirror;
  // with tensor parallelism: every rank its own window and mirror of its KV heads).
  // Empty when every resident device copy of every stage (rank) equals its mirror page (or when not
  // streaming); else what differs, per stage ("stage i: ...") or per rank ("rank r: ...").
  std::string check_stream_coherent() const;
  const PagedKvStore* host_mirror() const;  // null when not streaming; split: stage 0's / rank 0's
  CudaKvStore& store();      // with the layer split: stage 0's (kvgate/cuda/pipeline.hpp); with --tp rank 0's
  CudaForward& forward();    // with the layer split: stage 0's; with --tp rank 0's
  SeqId sequence() const;
  // The layer split's stages (1 when unsplit; with tensor parallelism the ranks, in rank order): stage
  // i's device store (streaming: the view over its window), its host mirror (null when not streaming)
  // and its CUDA device.
  int n_stages() const;
  CudaKvStore& stage_store(int i);
  const PagedKvStore* stage_host_mirror(int i) const;
  int stage_device(int i) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvgate::cuda
