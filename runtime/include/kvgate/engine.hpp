// The CPU inference engine: one sequence over a PagedKvStore in any KV format. Batched prefill
// (a chunk of tokens through each layer), single-token decode, teacher-forced logits, generation
// with a seeded sampler, and the stats that reports print (requested vs effective KV format,
// backend, fallback reason, KV bytes, TTFT, prefill/decode tok/s).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvgate/kv_layer_map.hpp"
#include "kvgate/kv_store.hpp"
#include "kvgate/model.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate/sampler.hpp"

namespace kvgate {

struct KvFile;  // kv_file.hpp

class EngineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What an MLA model's KV cache holds (EngineOptions::mla_cache; --mla-cache).
//   expanded  per head K = [k_nope | k_rope] and V rows (the K/V format applies to them)
//   latent    per token the latent c_kv (format.k) and the shared RoPE key (format.v): the
//             KvLayout::mla_latent store, attention in the weight-absorbed form (attention_mla.hpp)
enum class MlaCache : std::uint8_t { expanded, latent };
const char* name(MlaCache m);
// "expanded" / "latent"; throws EngineError naming `flag` and the choices otherwise.
MlaCache parse_mla_cache(const std::string& s, const std::string& flag);

// The prefill chunk the CLI and the sign-off give an engine on `backend` when none is asked for:
// 128 tokens on "cpu" (EngineOptions' default), 512 on "cuda". On the GPU a 128-token chunk leaves
// most SMs idle in the attention and reads every weight four times as often: on an H100, the 32K-token
// TTFT of the Llama-3-8B shape is 13.4-17.1 s in chunks of 128 and 4.1-5.2 s in chunks of 512
// (bench/results/gate_proof_cuda_round26.md).
int default_prefill_chunk(std::string_view backend);

struct EngineOptions {
  ResolvedKv kv;                   // kv.effective is what the store holds; the rest goes to stats
  int block_size = 16;             // tokens per KV page
  int n_blocks = 0;                // pages per layer; 0: from kv_cache_memory, else enough for max_context
  std::size_t kv_cache_memory = 0; // bytes for the whole pool (all layers, K and V); used when n_blocks == 0
  // fp8 scales: one (every layer), [n_layers], or [n_layers * n_kv_heads] per KV head (l * H + h);
  // empty: the model's (ModelConfig), else 1.0. Chosen per half (K and V independently).
  std::vector<float> k_scale;
  std::vector<float> v_scale;
  int threads = 1;                 // 0: std::thread::hardware_concurrency()
  int max_context = 0;             // 0: the model's max_seq_len
  int prefill_chunk = 128;         // tokens per batched prefill step (the CLI: default_prefill_chunk)
  int kv_resident = 0;             // > 0: stream KV with a device window of this many tokens (kv_stream.hpp)
  // When every layer has a sliding window (Mistral-style, not Gemma's interleaved global layers),
  // the pages whose every position lies outside the window of all layers go back to the pool before
  // each forward step (PagedKvStore::release_before), so a run longer than the pool works. The
  // sequence can then no longer be saved, swapped or truncated below the released prefix.
  bool release_outside_window = true;
  // Pipeline (layer) split, laid out as a multi-GPU engine places layers on devices: stage s runs a
  // contiguous range of the model's layers over its OWN KV store (pool, --kv-resident window, host
  // mirror; StoreConfig::first_layer) and hands the chunk's activations to stage s + 1; the first
  // stage embeds, the last computes the logits. Every stage's pool has the unsplit pool's pages per
  // layer. The logits are bitwise those of the unsplit engine. 1: one store (the unsplit path).
  int pipeline_stages = 1;
  // Layers of each stage (pipeline_stages entries, each >= 1, summing to n_layers); empty: as even
  // as possible, the first n_layers % pipeline_stages stages one layer more.
  std::vector<int> pipeline_layers;
  // Tensor parallelism (kvgate/tensor_parallel.hpp; --tp N), laid out as a multi-GPU engine splits
  // every layer: rank r holds its share of the query and KV heads (with its OWN KV store of those
  // heads) and of the FFN rows; the ranks' block outputs are summed by an all-reduce. The logits
  // differ from the unsplit engine's by float reassociation only (PAR.tp). 1: no split. Refused
  // with a pipeline split, a per-layer KV map, the read hook, MLA and MoE models. KV files work:
  // they hold the unsplit layout (the ranks' pages are gathered into, and hydrated through, an
  // unsplit staging store; PAR.tp.persist), so a file moves between --tp N and an unsplit engine.
  int tensor_parallel = 1;
  // Per-layer KV formats (kvgate/kv_layer_map.hpp, --kv-layers): one per model layer; empty: every
  // layer holds kv.effective. Each run of layers with one format gets its own store (a pipeline
  // stage is cut further where the format changes). A map can be neither saved to nor hydrated
  // from a KV file (the file holds one format).
  KvLayerMap kv_layers;
  // MLA models only (ModelConfig::mla): what the cache holds. latent is refused for a model without
  // MLA, with a per-layer map, and by the CUDA engine; it streams (kv_resident) and its KV files
  // (version 5) record the layout.
  MlaCache mla_cache = MlaCache::expanded;
  // Diagnostics only (probe sensitivity): a hook on every store read of attention (KvReadHook);
  // null everywhere else. The CUDA engine refuses one (its kernels read the device pages directly).
  std::shared_ptr<const KvReadHook> kv_read_hook;
};

// Default options for a format: requested = effective = `fmt`, backend cpu, no fallback.
EngineOptions engine_options_for(const KvFormat& fmt, int threads = 1);

// The KV store of an engine (CPU and CUDA alike): the pool from n_blocks, else from the byte budget
// kv_cache_memory, else enough pages for max_ctx; per-layer fp8 scales from the options, else the
// model's (one value is repeated per layer). Throws EngineError, its message starting with `who`
// ("engine", "cuda engine"), for a block size < 1, a budget that buys no block, or a scale list
// that is neither one value nor one per layer.
StoreConfig make_store_config(const Model& m, const EngineOptions& o, int max_ctx, const std::string& who);

// The window the sliding-window release keeps (EngineOptions::release_outside_window; CPU and CUDA
// engines): the widest window when every layer has one; 0 when some layer attends to the whole
// prefix (nothing is released).
int widest_window_if_all(const ModelConfig& c);
// The model layers [first, second) of each pipeline stage (EngineOptions::pipeline_stages,
// pipeline_layers). Throws EngineError naming the option and the fix for a stage count < 1 or
// above the model's layers, or a layer list of the wrong length, with an empty stage, or whose sum
// is not the model's layers.
std::vector<std::pair<int, int>> pipeline_ranges(const ModelConfig& c, const EngineOptions& o);
// The store of a stage holding model layers [l0, l1): the whole model's config `full` with that range
// of layers (StoreConfig::first_layer l0), their format (the per-layer map's, else the engine's one)
// and their scales. The CPU split and the CUDA pipeline (kvgate/cuda/pipeline.hpp) build theirs with it.
StoreConfig stage_store_config(const StoreConfig& full, const EngineOptions& o, int l0, int l1);
// The KV format of model layer `layer`: EngineOptions::kv_layers[layer], else kv.effective.
const KvFormat& layer_kv_format(const EngineOptions& o, int layer);
// "single", or "pipeline:" and the stages' layer counts joined by '+', or "tensor:N" for N > 1
// tensor-parallel ranks.
std::string topology_name(const std::vector<int>& stage_layers, int tensor_parallel = 1);

struct EngineStats {
  std::string requested_kv;
  std::string requested_source;
  std::string effective_kv;
  std::string backend = "cpu";
  std::string fallback_reason;
  std::string kv_layout = "kv_heads";  // what the cache rows hold (kv_cache_layout): MLA says it is not the latent
  std::size_t kv_bytes = 0;        // bytes of the KV pages the sequence holds now (all layers, K+V)
  std::size_t kv_pool_bytes = 0;   // bytes of the whole pool
  int block_size = 0;
  int n_blocks = 0;
  int threads = 1;
  int prefill_chunk = 0;           // tokens per prefill step (EngineOptions::prefill_chunk, at most the context)
  // Topology: pipeline stages and the layers of each ("single", or "pipeline:2+3": stage layer counts).
  int pipeline_stages = 1;
  std::vector<int> stage_layers;
  std::string topology = "single";
  int tensor_parallel = 1;         // tensor-parallel ranks (topology "tensor:N")
  int devices = 0;                 // distinct CUDA devices the engine runs on (0: the CPU engine)
  // Per-layer KV (EngineOptions::kv_layers): the map's canonical name ("" when every layer holds
  // effective_kv), each layer's format and its KV bytes per token (K + V page bytes / block size).
  std::string kv_layer_map;
  std::vector<std::string> layer_kv;
  std::vector<double> layer_kv_bytes_per_token;
  int position = 0;                // tokens in the sequence
  // Timing since construction / reset() / the start of the last generate().
  double ttft_ms = 0;              // generate(): prompt prefill + first sampled token
  long long prefill_tokens = 0;
  double prefill_seconds = 0;
  long long decode_tokens = 0;
  double decode_seconds = 0;
  double prefill_tok_s() const { return prefill_seconds > 0 ? static_cast<double>(prefill_tokens) / prefill_seconds : 0; }
  double decode_tok_s() const { return decode_seconds > 0 ? static_cast<double>(decode_tokens) / decode_seconds : 0; }
  // Conversations (kv_file.hpp): tokens restored from a KV file by the last hydrate(), and its time
  // (read + verify + restore are the caller's and this call's; hydrate_ms covers restore only).
  int hydrated_tokens = 0;
  double hydrate_ms = 0;
  // Streaming (--kv-resident): window size, device pool bytes, and the window's counters since construction.
  int kv_resident_tokens = 0;
  std::size_t kv_device_bytes = 0;
  long long kv_block_lookups = 0;
  long long kv_block_misses = 0;
  long long kv_bytes_moved = 0;
};

struct GenerateResult {
  std::vector<int> tokens;  // generated ids (the stop token, if any, is not included)
  std::string stop_reason;  // "steps", "eos", "bos", "context_full"
};

class Engine {
 public:
  // Throws EngineError (bad options, pool too small for one block) or KvStoreError (format refused).
  Engine(const Model& model, EngineOptions opts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Appends tokens (batched) and returns the logits of the last one. The reference stays valid
  // until the next call on this engine.
  const std::vector<float>& prefill(std::span<const int> tokens);
  // Appends one token and returns its logits (same lifetime rule).
  const std::vector<float>& decode(int token);
  // Appends tokens (batched) and returns the logits of every one: [tokens.size()][vocab].
  std::vector<float> forward_all_logits(std::span<const int> tokens);

  // Prefill `prompt` (appended to the current sequence), then sample up to `steps` tokens. Stops
  // early on EOS, on BOS (llama2.c's sequence delimiter) or when the context is full. on_token is
  // called for every generated token as it is produced.
  GenerateResult generate(std::span<const int> prompt, int steps, const SamplerOptions& sampler,
                          const std::function<void(int)>& on_token = {});

  // --- conversations (kv_file.hpp) ------------------------------------------------------------
  // Token ids whose K/V rows the sequence holds, in order.
  std::span<const int> history() const;
  // Empties the sequence, then restores from `file` the longest prefix of `prompt` it holds, leaving
  // at least one prompt token to prefill. Refused (KvFileError) when the file does not match this
  // engine (model, format, rotation, shape, scales). Returns the tokens restored (= stats().hydrated_tokens).
  int hydrate(const KvFile& file, std::span<const int> prompt);
  // Writes every K/V row of the sequence and the transcript history() + pending (ids not yet in the
  // KV, e.g. the last sampled token) as a KV file, atomically.
  void save_kv(const std::string& path, std::span<const int> pending = {}) const;

  void reset();                 // empty the sequence and the timing stats
  void truncate(int n_tokens);  // keep the first n tokens
  int position() const;
  int max_context() const;
  int vocab_size() const;
  const EngineStats& stats() const;
  const Model& model() const;
  // The KV store of the first pipeline stage (the only one when unsplit) and its sequence.
  const PagedKvStore& store() const;
  PagedKvStore& store();
  SeqId sequence() const;
  // Pipeline stages (EngineOptions::pipeline_stages): their count, each stage's store and sequence
  // (stage 0's are store() and sequence()), and the model layers [first, second) each runs. With a
  // per-layer KV map (EngineOptions::kv_layers) a stage is cut further where the format changes:
  // these are then the stores, one per run of layers with one format.
  int stage_count() const;
  const PagedKvStore& stage_store(int stage) const;
  SeqId stage_sequence(int stage) const;
  std::pair<int, int> stage_layers(int stage) const;
  // Tensor-parallel ranks (EngineOptions::tensor_parallel; 1 when unsplit), each rank's KV store
  // (its KV heads of every layer) and sequence. Rank 0's are store() and sequence().
  int tp_ranks() const;
  const PagedKvStore& rank_store(int rank) const;
  SeqId rank_sequence(int rank) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvgate
