// The sign-off's quality engine over one engine type: kvgate::Engine on the CPU (measure.cpp) and
// kvgate::cuda::CudaEngine on the GPU (measure_cuda.cpp, compiled only with the CUDA backend) share
// this adapter and the per-format engine options. Private to reports/signoff/src.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvgate/engine.hpp"
#include "kvgate/model.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate/signoff.hpp"

namespace kvgate::signoff::detail {

// E is an engine with reset(), forward_all_logits(span), prefill(span), decode(int), position(),
// vocab_size(), max_context() and stats().effective_kv; Options is what its constructor takes.
template <class E, class Options>
class EngineLogits final : public LogitsEngine {
 public:
  EngineLogits(const Model& m, Options o, QualityPath path) : e_(m, std::move(o)), path_(path) {}
  void reset() override { e_.reset(); }
  std::vector<float> append(std::span<const int> t) override {
    if (path_ == QualityPath::chunked_prefill) return e_.forward_all_logits(t);
    const std::size_t V = static_cast<std::size_t>(e_.vocab_size());
    std::vector<float> out(t.size() * V);
    for (std::size_t i = 0; i < t.size(); ++i) {
      // The first token of the sequence is a one-row prefill (no context to decode against); every
      // later one takes the engine's decode step, the path generation runs.
      const std::vector<float>& l = e_.position() == 0 ? e_.prefill(t.subspan(i, 1)) : e_.decode(t[i]);
      std::copy(l.begin(), l.end(), out.begin() + static_cast<std::ptrdiff_t>(i * V));
    }
    return out;
  }
  int max_context() const override { return e_.max_context(); }
  std::string effective() const override { return e_.stats().effective_kv; }

 private:
  E e_;
  QualityPath path_;
};

// The engine options of format `f` on `backend` ("cpu" or "cuda"): block size 16, the KV resolved for
// that backend, the context cap, and the prefill chunk of the path (one token on the decode path).
// mla_latent: an MLA model's cache holds the latent and the RoPE key (EngineOptions::mla_cache).
inline EngineOptions quality_engine_options(const Model& model, const std::string& f, QualityPath path, int chunk,
                                            int max_context, const std::string& backend, bool mla_latent = false) {
  const auto k = parse_kv_format(f);
  if (!k) throw PolicyError("unknown KV format '" + f + "'; known: " + known_formats_text());
  EngineOptions eo;
  eo.block_size = 16;
  KvRequest req;
  req.flag = *k;
  req.backend = backend;
  req.mla_latent = mla_latent && model.config.mla.any();
  eo.kv = resolve_kv(req, model.config, eo.block_size);
  eo.mla_cache = req.mla_latent ? MlaCache::latent : MlaCache::expanded;
  eo.max_context = max_context;
  eo.prefill_chunk = path == QualityPath::chunked_prefill ? chunk : 1;
  return eo;
}

}  // namespace kvgate::signoff::detail
