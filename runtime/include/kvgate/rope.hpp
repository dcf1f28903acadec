// Rotary position embeddings beyond the plain one: the RoPE variants of transformers'
// ROPE_INIT_FUNCTIONS (modeling_rope_utils.py) -- default, linear, dynamic (NTK), yarn, llama3,
// longrope -- plus partial rotary (only the first rotary_dim dims of a head turn) and GGUF's
// per-frequency divisors (the llama3 `rope_freqs` tensor).
//
// A RopeConfig holds every parameter; rope_frequencies() turns it into the inverse frequencies of
// the rotated pairs and the attention scaling that multiplies cos and sin (so q.k, the logit, is
// scaled by its square), for a given sequence length. Two variants depend on that length:
//   dynamic   base = theta * ((factor * L / max_position) - (factor - 1)) ^ (dim / (dim - 2))
//             when L > max_position (transformers' config.max_position_embeddings), else plain;
//   longrope  long_factor when L > original_max, else short_factor.
// transformers recomputes both with L = the longest sequence seen (max(position_ids) + 1 of the
// forward call, growing during cached generation); the forward passes use the chunk's last
// position + 1, which is the same thing for a sequence that only grows.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvgate {

enum class RopeType : std::uint8_t { plain, linear, dynamic, yarn, llama3, longrope };

// transformers' names ("default" for plain).
const char* rope_type_name(RopeType t);

struct RopeConfig {
  RopeType type = RopeType::plain;
  double theta = 0;          // base; 0: the model's ModelConfig::rope_theta
  int rotary_dim = 0;        // dims rotated per head (partial_rotary_factor); 0: all of head_dim
  double factor = 1;         // linear, dynamic, yarn, llama3, longrope
  int original_max = 0;      // original_max_position_embeddings (yarn, llama3, longrope)
  int max_position = 0;      // max_position_embeddings (dynamic's reference length; yarn/longrope default factor)
  double attention_factor = 0;  // yarn, longrope: as given; 0: derived from factor (and mscale)
  double beta_fast = 32, beta_slow = 1;     // yarn
  double mscale = 0, mscale_all_dim = 0;    // yarn (DeepSeek style); 0: not given
  bool truncate = true;                     // yarn: floor/ceil the correction range
  double low_freq_factor = 1, high_freq_factor = 4;  // llama3
  std::vector<float> short_factor, long_factor;      // longrope, rotary_dim / 2 each
  std::vector<float> freq_divisors;  // GGUF rope_freqs: inv_freq[i] /= freq_divisors[i] (empty: none)

  bool is_plain() const { return type == RopeType::plain && rotary_dim == 0 && freq_divisors.empty(); }
  // The frequencies change with the sequence length (dynamic, longrope).
  bool length_dependent() const { return type == RopeType::dynamic || type == RopeType::longrope; }
};

struct RopeFrequencies {
  std::vector<float> inv_freq;   // [rotary_dim / 2]
  float attention_scaling = 1.0f;  // multiplies cos and sin
};

// Rotated dims of a head: rotary_dim, or head_dim when 0.
int rope_rotary_dim(const RopeConfig& r, int head_dim);

// Inverse frequencies and attention scaling at sequence length `seq_len` (the longest position
// + 1 the forward has reached). `model_theta` is used when r.theta == 0. The plain type computes
// 1 / theta^(2i / dim) in binary32 exactly as llama2.c run.c; the others follow transformers'
// float32 arithmetic (intermediate scalars in double, as Python computes them).
RopeFrequencies rope_frequencies(const RopeConfig& r, float model_theta, int head_dim, int seq_len);

// Checks a RopeConfig for a model with `head_dim` (factor > 0, original length present, factor
// arrays of rotary_dim / 2, an even rotary_dim...). Throws ModelError naming `where` (the file),
// `field` and the fix.
void validate_rope(const RopeConfig& r, int head_dim, const std::string& where, const std::string& field);

// One-line description ("llama3 factor=8 low=1 high=4 original=8192") for reports and fingerprints;
// empty for the plain RoPE.
std::string describe_rope(const RopeConfig& r);

// The RoPE of layer `layer`: rope_local for a sliding-window layer when the model has one (Gemma 3),
// else rope. A layer is sliding when ModelConfig::layer_window[layer] > 0 (per-layer windows,
// 0 = full attention); a ModelConfig without that member has no sliding layers.
namespace rope_detail {
template <class C>
auto layer_windowed(const C& c, int l, int) -> decltype(c.layer_window.empty(), bool()) {
  return !c.layer_window.empty() && c.layer_window[static_cast<std::size_t>(l)] > 0;
}
template <class C>
bool layer_windowed(const C&, int, long) {
  return false;
}
}  // namespace rope_detail

template <class C>
const RopeConfig& rope_for_layer(const C& c, int layer) {
  return c.has_rope_local && rope_detail::layer_windowed(c, layer, 0) ? c.rope_local : c.rope;
}
template <class C>
bool layer_uses_local_rope(const C& c, int layer) {
  return c.has_rope_local && rope_detail::layer_windowed(c, layer, 0);
}

}  // namespace kvgate
