// The individual model loaders behind kvgate::load_model (model.hpp). Each returns a Model (FP32
// weights, or 16-bit matrices as stored for Hugging Face directories) with config, weights, tokenizer (when found) and fingerprint filled, or throws ModelError with a
// message naming the file and the field at fault (limits::LimitError, with the limit and its
// override too, for a count or size over the limits policy).
#pragma once
#include <string>

#include "kvgate/model.hpp"

namespace kvgate {

// llama2.c legacy (version 0) checkpoint: 7 int32 header fields, then fp32 arrays; a negative
// vocab_size means a separate classifier follows. Tokenizer from `tokenizer_path`, or, when empty,
// tok<vocab>.bin or tokenizer.bin beside the checkpoint (none found: Model::tokenizer stays null).
Model load_llama2c(const std::string& path, const std::string& tokenizer_path = {});

// GGUF v2/v3, architectures `llama` (Mistral ships as llama), `qwen2`, `qwen3`, `phi3`, `gemma2`,
// `gemma3` with llama.cpp's key and tensor names (load_gguf.cpp lists each one's conventions);
// tensor types F32, F16, BF16, Q8_0, Q4_0 (dequantized to FP32); tokenizer from metadata (`llama`
// SentencePiece scores, or `gpt2` byte-level BPE with merges).
Model load_gguf(const std::string& path);

// Hugging Face directory: config.json + model.safetensors (or a sharded index) + tokenizer.json.
// Implemented in runtime/src/load_hf.cpp. The files are memory-mapped; BF16/F16 weight matrices stay
// as stored (read in place, no FP32 copy) unless `storage` is WeightStorage::f32; norms, biases,
// routers and MoE experts are converted to FP32.
Model load_hf(const std::string& dir, WeightStorage storage = WeightStorage::as_stored);

// xxHash64 over a canonical text of the config and every tensor's FP32 bytes, as 16 hex digits.
std::string model_fingerprint(const ModelConfig& cfg, const ModelWeights& w);

// Checks that every tensor of `w` has the size `cfg` implies; throws ModelError naming `path` and
// the tensor otherwise. Loaders call it before returning.
void validate_weights(const std::string& path, const ModelConfig& cfg, const ModelWeights& w);

// Checks every size of `cfg` against the limits of runtime/limits (vocabulary, layers, dims, heads,
// head_dim, context, experts, the KV row): throws LimitError naming `path`, the field, the value,
// the limit and its override. Loaders call it once the config is read, before any weight is allocated.
void check_config_limits(const std::string& path, const ModelConfig& cfg);

}  // namespace kvgate
