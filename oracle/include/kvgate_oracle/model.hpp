// Full-model forward of a llama2.c-style transformer, written from DESIGN.md and the stories260K
// README only (never from runtime/): its own reader of the legacy llama2.c `.bin`, RMSNorm
// (eps 1e-5), interleaved RoPE (theta 10000, adjacent pairs over each head), GQA causal attention,
// SwiGLU FFN, shared or separate classifier. The KV is plain float/double arrays (no quantization);
// a hook lets a caller perturb K and V (after RoPE, before attention) to model a KV format's error.
#pragma once
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace kvgate_oracle {

// Rotary position embedding variants, from their published formulas (RoPE; position
// interpolation "linear"; NTK-aware "dynamic" scaling; YaRN; Llama 3.1's banded scaling; LongRoPE),
// evaluated in binary64. `seq_len` below is the length of the forward (the number of tokens).
enum class RopeKind { standard, linear, ntk_dynamic, yarn, llama3, longrope };

struct RopeSpec {
    RopeKind kind = RopeKind::standard;
    double factor = 1;        // scaling factor s
    int original_len = 0;     // pre-training context L0 (yarn, llama3, longrope)
    int reference_len = 0;    // ntk_dynamic: the length beyond which the base grows
    double attention_factor = 0;  // yarn/longrope: multiplies cos and sin; 0: the paper's default
    double beta_fast = 32, beta_slow = 1;  // yarn: rotation counts bounding the ramp
    bool round_ramp = true;   // yarn: floor/ceil the ramp ends
    double low_freq_factor = 1, high_freq_factor = 4;  // llama3
    std::vector<double> short_factor, long_factor;     // longrope, one per rotated pair
    int rotary_dim = 0;       // rotated dims per head (0: all); the rest pass through unchanged
    bool rotate_half = false; // pairs (i, i + rotary_dim/2) instead of adjacent (2i, 2i+1)
};

struct ModelConfig {
    int dim = 0;         // model width
    int hidden_dim = 0;  // FFN width
    int n_layers = 0;
    int n_heads = 0;     // query heads; head_dim = dim / n_heads (llama2.c)
    int n_kv_heads = 0;  // KV heads (GQA); n_heads % n_kv_heads == 0
    int vocab_size = 0;
    int seq_len = 0;     // the longest sequence forward_all accepts
    float rms_eps = 1e-5f;
    float rope_theta = 10000.0f;
    RopeSpec rope;
    int head_dim() const { return n_heads > 0 ? dim / n_heads : 0; }
    int kv_dim() const { return n_kv_heads * head_dim(); }
};

// Row-major [out][in] matrices, as in the llama2.c file.
struct LayerWeights {
    std::vector<float> rms_att;  // [dim]
    std::vector<float> wq;       // [dim][dim]
    std::vector<float> wk;       // [kv_dim][dim]
    std::vector<float> wv;       // [kv_dim][dim]
    std::vector<float> wo;       // [dim][dim]
    std::vector<float> rms_ffn;  // [dim]
    std::vector<float> w1;       // [hidden][dim]  gate
    std::vector<float> w2;       // [dim][hidden]  down
    std::vector<float> w3;       // [hidden][dim]  up
};

struct Weights {
    std::vector<float> token_embedding;  // [vocab][dim]
    std::vector<LayerWeights> layers;    // [n_layers]
    std::vector<float> rms_final;        // [dim]
    std::vector<float> wcls;             // [vocab][dim]; empty: shared with token_embedding
};

struct Transformer {
    ModelConfig config;
    Weights weights;
    const float* classifier() const {
        return weights.wcls.empty() ? weights.token_embedding.data() : weights.wcls.data();
    }
};

// Per rotated pair i < rotary_dim/2: the angular frequency (radians per position) and the factor on
// cos/sin, for a forward over seq_len tokens.
struct RopeAngles {
    std::vector<double> freq;
    double cs_scale = 1;
};
RopeAngles rope_angles(const RopeSpec& r, double theta, int head_dim, int seq_len);

// Throws std::invalid_argument naming the first inconsistent field or tensor.
void validate(const Transformer& t);

// From in-memory weights (e.g. a seeded random model built by a gate); validated.
Transformer make_transformer(ModelConfig config, Weights weights);

// llama2.c legacy (version 0) checkpoint: int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads,
// vocab_size (negative: a separate classifier is stored at the end), seq_len; then fp32
// token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, the legacy
// freq_cis_real/imag (seq_len * head_dim floats, skipped), [wcls]. Throws std::runtime_error
// naming the file and the field on a bad header or a short file.
Transformer load_llama2c(const std::string& path);

// Called once per layer with that layer's K and V rows of every token, [n][kv_dim] (head-major
// within a row), after RoPE and before attention; it may modify them in place.
using KvHook = std::function<void(int layer, int n_tokens, float* k, float* v)>;

// Logits of every position for `tokens` fed at positions 0..n-1 (teacher forcing):
// [n][vocab]. binary32 throughout (Eigen GEMMs, max-subtracted softmax). Throws
// std::invalid_argument on an out-of-range token or n > seq_len.
std::vector<float> forward_all(const Transformer& t, std::span<const int> tokens,
                               const KvHook& kv_hook = {});

// The same forward with weights widened exactly and every operation in binary64 (the reference
// for the FP32 error of either implementation).
std::vector<double> forward_all_f64(const Transformer& t, std::span<const int> tokens);

// The same formula, one token at a time, plain loops in binary32 over a growing float KV cache
// (llama2.c run.c's loop order). A structurally different second implementation for the
// oracle's self-test; slow, meant for short sequences.
std::vector<float> forward_all_naive(const Transformer& t, std::span<const int> tokens);

}  // namespace kvgate_oracle
