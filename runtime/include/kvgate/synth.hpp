// Deterministic random-weight Hugging Face model directories (`kvgate synth`): config.json,
// model.safetensors (or shards + index), tokenizer.json (byte-level BPE). load_hf reads them back.
//
// Determinism: every chunk of a tensor draws from its own xoshiro256** stream seeded through
// splitmix64 (see below); normals come from Box-Muller with a hand-written log/sin/cos made of IEEE
// basic operations only (compiled without FP contraction), so the bytes are identical on every
// machine and compiler for the same options. A tensor is cut into chunks of 2^20 elements, each
// with its own stream seeded from (seed, tensor name, chunk index); the chunks are generated on a
// pool of threads and written in order through a bounded window (2 chunks per thread), so the
// bytes do not depend on the thread count and nothing is held in memory twice. Every file is
// written to a temporary name, fsynced and renamed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvgate {

struct SynthOptions {
  std::string arch = "llama";  // llama | mistral | qwen2 | qwen3 | deepseek_v3 (MLA attention, dense MLP)
  int layers = 2;
  int hidden = 64;      // hidden_size
  int ffn = 172;        // intermediate_size
  int heads = 4;        // num_attention_heads
  int kv_heads = 2;     // num_key_value_heads
  int head_dim = 0;     // 0: hidden / heads
  int vocab = 512;      // >= 258: 256 byte tokens, merges, and two specials (bos = vocab-2, eos = vocab-1)
  std::uint64_t seed = 1;
  int max_seq_len = 2048;  // max_position_embeddings
  std::string dtype = "f32";  // f32 | f16 | bf16 (tensor dtype in the safetensors file)
  std::string kv_algo;        // empty: no KV declaration; else written verbatim (e.g. "FP8", "INT8")
  std::string kv_algo_file = "config";  // config (quantization_config) | hf_quant_config (legacy file)
  float kv_scale = 0.0f;      // > 0: write per-layer self_attn.k_scale / v_scale tensors with this value
  // With kv_scale > 0: the tensors are [kv_heads] per-head scales instead, layer i head h:
  // K = kv_scale * (1 + i/8) * (1 + h/4), V = 0.75 * that (distinct per head and layer, K != V).
  bool kv_scale_per_head = false;
  bool tie_embeddings = false;
  double rope_theta = 0.0;    // 0: 10000 (llama, mistral) or 1000000 (qwen2, qwen3)
  std::string rope;           // empty: plain RoPE; "llama3": Llama 3.1's rope_parameters (factor 8,
                              // low/high_freq_factor 1/4, original_max_position_embeddings 8192)
  // deepseek_v3 only (DeepseekV3Config's MLA: no q LoRA, every layer dense, first_k_dense_replace =
  // layers): the latent width, and the per-head RoPE / no-RoPE query-key and value widths. head_dim and
  // kv_heads are ignored (config.json's head_dim is the RoPE width; one KV head per query head).
  int kv_lora_rank = 512;
  int qk_rope_head_dim = 64;
  int qk_nope_head_dim = 32;
  int v_head_dim = 32;
  int shards = 1;             // > 1: model-0000i-of-0000n.safetensors + model.safetensors.index.json
  int threads = 0;            // generator threads (0: all cores); the bytes do not depend on it
  std::string out;            // output directory (created if missing)
};

struct SynthResult {
  std::uint64_t n_params = 0;
  std::uint64_t bytes_written = 0;
  std::vector<std::string> files;  // paths written
};

// Throws std::invalid_argument for bad options, std::runtime_error for I/O errors.
SynthResult synth_hf(const SynthOptions& opts);

// The generator's primitives, exposed for tests.
struct SynthRng {
  explicit SynthRng(std::uint64_t seed);
  std::uint64_t next();
  double uniform();  // [0, 1)
  std::uint64_t s[4];
};
// Fills `n` N(0, std^2) floats from `rng` (Box-Muller, deterministic).
void synth_normals(SynthRng& rng, float stddev, float* out, std::size_t n);

}  // namespace kvgate
