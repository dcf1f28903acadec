// The generation loop both engines share (kvgate::Engine, kvgate::cuda::CudaEngine): prefill the
// prompt, then emit up to `steps` tokens. The stop rules (EOS; BOS, llama2.c's sequence delimiter;
// a full context) and the TTFT clock live here once, so the CPU and CUDA backends cannot drift apart.
#pragma once
#include <chrono>
#include <functional>
#include <string>

#include "kvgate/engine.hpp"

namespace kvgate {

// who: the engine's name in error messages. prompt_size/steps: checked (a prompt needs at least one
// token, steps >= 0). stats: the timing fields are reset, ttft_ms set when the first token is known
// (prompt prefill + first sample). prefill(): runs the prompt. next_token(): the token to emit now
// (sampled from the current logits). position(): tokens in the sequence. advance(t): appends t.
template <class Prefill, class NextToken, class Position, class Advance>
GenerateResult generate_loop(const char* who, std::size_t prompt_size, int steps, int bos_id, int eos_id,
                             int max_context, EngineStats& stats, Prefill&& prefill, NextToken&& next_token,
                             Position&& position, Advance&& advance, const std::function<void(int)>& on_token) {
  if (prompt_size == 0)
    throw EngineError(std::string(who) + ": generate needs at least one prompt token (e.g. BOS)");
  if (steps < 0) throw EngineError(std::string(who) + ": steps must be >= 0");
  stats.ttft_ms = 0;
  stats.prefill_tokens = stats.decode_tokens = 0;
  stats.prefill_seconds = stats.decode_seconds = 0;
  double& ttft_ms = stats.ttft_ms;
  GenerateResult r;
  r.stop_reason = "steps";
  r.tokens.reserve(static_cast<std::size_t>(steps));
  const auto t0 = std::chrono::steady_clock::now();
  prefill();
  for (int i = 0; i < steps; ++i) {
    const int next = next_token();
    if (i == 0) ttft_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (next == eos_id) {
      r.stop_reason = "eos";
      break;
    }
    if (next == bos_id) {
      r.stop_reason = "bos";
      break;
    }
    r.tokens.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 == steps) break;
    if (position() >= max_context) {
      r.stop_reason = "context_full";
      break;
    }
    advance(next);
  }
  return r;
}

}  // namespace kvgate
