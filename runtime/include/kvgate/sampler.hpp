// Token sampling as llama2.c run.c does it (greedy argmax, temperature, top-p nucleus, xorshift
// RNG), plus top-k. Deterministic for a given seed.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace kvgate {

struct SamplerOptions {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties)
  int top_k = 0;             // <= 0 or >= vocab: off
  float top_p = 1.0f;        // <= 0 or >= 1: off
  std::uint64_t seed = 42;   // xorshift state; 0 is mapped to a fixed non-zero constant
  bool greedy() const { return temperature <= 0.0f; }
};

// run.c's xorshift64* generator.
std::uint32_t random_u32(std::uint64_t& state);
float random_f32(std::uint64_t& state);  // [0, 1)

class Sampler {
 public:
  Sampler(int vocab_size, SamplerOptions opts);
  // Samples one token id from raw logits (not modified).
  int sample(std::span<const float> logits);
  const SamplerOptions& options() const { return opts_; }

 private:
  struct ProbIndex {
    float prob;
    int index;
  };
  SamplerOptions opts_;
  std::uint64_t state_;
  std::vector<float> probs_;
  std::vector<ProbIndex> cand_;
};

int argmax(std::span<const float> v);

}  // namespace kvgate
