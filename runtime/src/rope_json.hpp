// The config.json RoPE reader (private to the runtime; rope.cpp). Both spellings: transformers 5
// `rope_parameters` (flat, or per layer type {"full_attention": {...}, "sliding_attention": {...}})
// and the legacy `rope_scaling` (`type` or `rope_type`) with top-level `rope_theta`;
// `partial_rotary_factor` (top level or inside the dict); top-level
// `original_max_position_embeddings` (Phi-3); Gemma 3's legacy `rope_local_base_freq`.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "kvgate/model.hpp"

namespace kvgate {

// Fills c.rope_theta, c.rope, c.rope_local / c.has_rope_local from config.json `cj` (c.head_dim
// must be set). Throws ModelError naming `path`, the field and the fix.
void read_hf_rope(const nlohmann::json& cj, const std::string& path, ModelConfig& c);

}  // namespace kvgate
