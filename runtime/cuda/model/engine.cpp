// CudaEngine: one sequence over a CudaKvStore, the CPU Engine's API subset the CLI needs.
#include <algorithm>
#include <chrono>

#include "kernels/common.cuh"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/generate_loop.hpp"

namespace kvgate::cuda {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

const Model& checked(const Model& m) {
  if (m.weights.layers.empty()) throw EngineError("cuda engine: the model has no weights loaded");
  const DeviceStatus& d = device_status();
  if (!d.available)
    throw EngineError("cuda engine: " + d.reason +
                      ". --device cuda needs an NVIDIA GPU (sm_90) with a working driver; run with --device cpu instead");
  return m;
}

}  // namespace

struct CudaEngine::Impl {
  const Model& model;
  CudaEngineOptions opts;
  int max_ctx;
  CudaModel weights;
  CudaKvStore store;
  SeqId seq;
  CudaForward fwd;
  std::vector<float> logits;
  EngineStats stats;

  Impl(const Model& m, CudaEngineOptions o)
      : model(checked(m)),
        opts(std::move(o)),
        max_ctx(opts.engine.max_context > 0 ? opts.engine.max_context : m.config.max_seq_len),
        weights(m, opts.weights),
        store(make_store_config(m, opts.engine, max_ctx, "cuda engine")),
        seq(store.create_sequence()),
        fwd(weights, store,
            CudaForwardOptions{std::max(1, std::min(opts.engine.prefill_chunk, max_ctx)), max_ctx, opts.cuda_graphs}),
        logits(static_cast<std::size_t>(m.config.vocab_size)) {
    if (opts.engine.kv_resident > 0)
      throw EngineError("cuda engine: --kv-resident (KV streaming) is a CPU-engine feature; drop it with --device cuda");
    stats.requested_kv = opts.engine.kv.requested.name();
    stats.requested_source = opts.engine.kv.requested_source;
    stats.effective_kv = opts.engine.kv.effective.name();
    stats.backend = "cuda";
    stats.fallback_reason = opts.engine.kv.fallback_reason;
    stats.block_size = store.config().block_size;
    stats.n_blocks = store.config().n_blocks;
    stats.kv_pool_bytes = store.pool_bytes();
    stats.kv_device_bytes = store.pool_bytes();
    stats.threads = 1;
  }

  void check_room(std::size_t n) const {
    const int pos = store.length(seq);
    if (static_cast<long long>(pos) + static_cast<long long>(n) > max_ctx)
      throw EngineError("cuda engine: " + std::to_string(n) + " more tokens at position " + std::to_string(pos) +
                        " exceed the context of " + std::to_string(max_ctx) + " tokens");
  }
  void refresh() {
    stats.position = store.length(seq);
    stats.kv_bytes = store.block_table(seq).size() * static_cast<std::size_t>(store.config().n_layers) *
                     (store.page_bytes(KvHalf::K) + store.page_bytes(KvHalf::V));
  }
  // Chunked prefill; `all` receives [n][vocab] when non-null; `argmax` the last token's greedy id.
  void run(std::span<const int> toks, float* all, int* argmax) {
    check_room(toks.size());
    const auto t0 = Clock::now();
    const int C = fwd.options().max_rows;
    const std::size_t V = logits.size();
    for (std::size_t i = 0; i < toks.size(); i += static_cast<std::size_t>(C)) {
      const int n = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(C), toks.size() - i));
      const bool last = i + static_cast<std::size_t>(n) == toks.size();
      if (all) fwd.forward_chunk(seq, toks.subspan(i, static_cast<std::size_t>(n)), all + i * V, true);
      else fwd.forward_chunk(seq, toks.subspan(i, static_cast<std::size_t>(n)), last && !argmax ? logits.data() : nullptr,
                             false, last ? argmax : nullptr);
    }
    stats.prefill_seconds += seconds_since(t0);
    stats.prefill_tokens += static_cast<long long>(toks.size());
    refresh();
  }
  // One decode step: logits downloaded, or only the greedy id when `argmax`.
  void step(int token, int* argmax) {
    check_room(1);
    const auto t0 = Clock::now();
    const SeqId s = seq;
    fwd.forward_decode(std::span<const SeqId>(&s, 1), std::span<const int>(&token, 1), argmax ? nullptr : logits.data(),
                       argmax);
    stats.decode_seconds += seconds_since(t0);
    stats.decode_tokens += 1;
  }
};

CudaEngine::CudaEngine(const Model& model, CudaEngineOptions opts) : impl_(std::make_unique<Impl>(model, std::move(opts))) {}
CudaEngine::~CudaEngine() = default;

const std::vector<float>& CudaEngine::prefill(std::span<const int> tokens) {
  if (tokens.empty()) throw EngineError("cuda engine: prefill of zero tokens");
  impl_->run(tokens, nullptr, nullptr);
  return impl_->logits;
}

const std::vector<float>& CudaEngine::decode(int token) {
  impl_->step(token, nullptr);
  return impl_->logits;
}

std::vector<float> CudaEngine::forward_all_logits(std::span<const int> tokens) {
  std::vector<float> out(tokens.size() * impl_->logits.size());
  if (tokens.empty()) return out;
  impl_->run(tokens, out.data(), nullptr);
  std::copy(out.end() - static_cast<std::ptrdiff_t>(impl_->logits.size()), out.end(), impl_->logits.begin());
  return out;
}

// As Engine::generate: greedy takes the GPU argmax (the CPU argmax's rule: lowest id of the
// largest logit) and downloads one id per step; otherwise the CPU's seeded Sampler runs on the
// downloaded logits, so identical logits give identical samples.
GenerateResult CudaEngine::generate(std::span<const int> prompt, int steps, const SamplerOptions& so,
                                    const std::function<void(int)>& on_token) {
  Impl& d = *impl_;
  Sampler sampler(vocab_size(), so);
  const bool greedy = so.greedy();
  int next_id = 0;  // the GPU argmax of the last forward (greedy only)
  GenerateResult r = generate_loop(
      "cuda engine", prompt.size(), steps, d.model.config.bos_id, d.model.config.eos_id, d.max_ctx, d.stats,
      [&] { d.run(prompt, nullptr, greedy ? &next_id : nullptr); },
      [&] { return greedy ? next_id : sampler.sample(d.logits); }, [&] { return d.store.length(d.seq); },
      [&](int t) { d.step(t, greedy ? &next_id : nullptr); }, on_token);
  d.refresh();
  return r;
}

void CudaEngine::reset() {
  Impl& d = *impl_;
  d.store.free_sequence(d.seq);
  d.seq = d.store.create_sequence();
  d.stats.ttft_ms = 0;
  d.stats.prefill_tokens = d.stats.decode_tokens = 0;
  d.stats.prefill_seconds = d.stats.decode_seconds = 0;
  d.refresh();
}

int CudaEngine::position() const { return impl_->store.length(impl_->seq); }
int CudaEngine::max_context() const { return impl_->max_ctx; }
int CudaEngine::vocab_size() const { return static_cast<int>(impl_->logits.size()); }
const EngineStats& CudaEngine::stats() const {
  impl_->refresh();
  return impl_->stats;
}
const Model& CudaEngine::model() const { return impl_->model; }
CudaKvStore& CudaEngine::store() { return impl_->store; }
CudaForward& CudaEngine::forward() { return impl_->fwd; }
SeqId CudaEngine::sequence() const { return impl_->seq; }

}  // namespace kvgate::cuda
