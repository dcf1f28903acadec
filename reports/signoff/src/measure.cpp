// The quality measurement of the sign-off: every format against the baseline, teacher-forced on the
// decode path of the engine of --device, in windows, in step.
#include <algorithm>
#include <memory>
#include <thread>

#include "engine_logits.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/model.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate/signoff.hpp"

namespace kvgate::signoff {

const char* to_string(QualityPath p) { return p == QualityPath::chunked_prefill ? "chunked_prefill" : "decode_steps"; }

namespace {

using CpuLogits = detail::EngineLogits<Engine, EngineOptions>;

// Per-position metrics of rows [0, n) of one window, positions depth0.., in parallel over rows.
std::vector<PositionMetrics> compare_window(const std::vector<float>& base, const std::vector<float>& got,
                                            std::span<const int> targets, std::int64_t depth0, int vocab, int threads) {
  const std::size_t V = static_cast<std::size_t>(vocab);
  const std::size_t n = std::min(base.size(), got.size()) / V;
  std::vector<PositionMetrics> out(n);
  auto work = [&](std::size_t a, std::size_t b) {
    for (std::size_t t = a; t < b; ++t)
      out[t] = compare_position(base.data() + t * V, got.data() + t * V, vocab, t < targets.size() ? targets[t] : -1,
                                depth0 + static_cast<std::int64_t>(t));
  };
  const std::size_t T = threads > 0 ? static_cast<std::size_t>(threads) : std::max(1u, std::thread::hardware_concurrency());
  if (T <= 1 || n * V < (std::size_t(1) << 20)) {
    work(0, n);
    return out;
  }
  std::vector<std::thread> pool;
  const std::size_t per = (n + T - 1) / T;
  for (std::size_t a = 0; a < n; a += per) pool.emplace_back(work, a, std::min(n, a + per));
  for (auto& th : pool) th.join();
  return out;
}

}  // namespace

EngineFactory cpu_engine_factory(const Model& model, int threads, int chunk, int max_context, bool mla_latent) {
  return [&model, threads, chunk, max_context, mla_latent](const std::string& f, QualityPath path) -> std::unique_ptr<LogitsEngine> {
    EngineOptions eo = detail::quality_engine_options(model, f, path, chunk, max_context, "cpu", mla_latent);
    eo.threads = threads;
    return std::make_unique<CpuLogits>(model, eo, path);
  };
}

QualityRun measure_quality(const EngineFactory& make, const std::vector<std::string>& formats, const std::string& baseline,
                           const std::vector<std::vector<int>>& corpus, const std::vector<DepthBucket>& buckets,
                           const QualityOptions& qo, const std::function<void(const std::string&)>& progress) {
  if (qo.window < 1) throw PolicyError("quality: the comparison window must be at least one position");
  const std::string other = baseline == "f32" ? "f16" : "f32";
  auto base = make(baseline, QualityPath::chunked_prefill);
  auto base_dec = make(baseline, QualityPath::decode_steps);
  // When the other float KV is one of the formats, its engine serves as the noise run too (the same
  // engine on the same tokens: the same logits), so it is not run twice.
  const auto other_at = std::find(formats.begin(), formats.end(), other);
  const bool other_shared = other_at != formats.end();
  std::unique_ptr<LogitsEngine> other_e = other_shared ? nullptr : make(other, QualityPath::chunked_prefill);
  std::vector<std::unique_ptr<LogitsEngine>> engines;
  QualityRun run;
  run.device = qo.device;
  for (const auto& f : formats) {
    // The baseline among the formats is the baseline's engine itself (same engine, same tokens).
    engines.push_back(f == baseline ? nullptr : make(f, QualityPath::chunked_prefill));
    run.effective[f] = (engines.back() ? engines.back() : base)->effective();
  }
  std::vector<std::vector<PositionMetrics>> pm(formats.size());
  std::size_t n_engines = 2 + (other_e ? 1 : 0);  // the baseline's two paths, the other float KV
  for (const auto& e : engines) n_engines += e ? 1 : 0;
  std::vector<PositionMetrics> noise_other, noise_dec;
  auto add = [](std::vector<PositionMetrics>& to, const std::vector<PositionMetrics>& m) { to.insert(to.end(), m.begin(), m.end()); };
  // The vocabulary of the logits rows: one window of the first sequence tells (the engines agree).
  int vocab = 0;
  for (std::size_t s = 0; s < corpus.size(); ++s) {
    const auto& seq = corpus[s];
    std::size_t n = std::min<std::size_t>(seq.size(), static_cast<std::size_t>(base->max_context()));
    if (qo.max_tokens > 0) n = std::min<std::size_t>(n, static_cast<std::size_t>(qo.max_tokens));
    if (n == 0) continue;
    const std::size_t dec_n = qo.decode_path_tokens > 0 ? std::min<std::size_t>(n, static_cast<std::size_t>(qo.decode_path_tokens)) : n;
    if (progress)
      progress("quality (" + qo.device + "): sequence " + std::to_string(s + 1) + "/" + std::to_string(corpus.size()) + " (" +
               std::to_string(n) + " tokens, " + std::to_string(n_engines) + " engines)");
    base->reset();
    base_dec->reset();
    if (other_e) other_e->reset();
    for (auto& e : engines)
      if (e) e->reset();
    for (std::size_t p0 = 0; p0 < n; p0 += static_cast<std::size_t>(qo.window)) {
      const std::size_t w = std::min<std::size_t>(static_cast<std::size_t>(qo.window), n - p0);
      const std::span<const int> toks(seq.data() + p0, w);
      // Targets: the next token of each position (the last position of the sequence has none).
      const std::span<const int> targets(seq.data() + p0 + 1, std::min(w, seq.size() - p0 - 1));
      const std::vector<float> bl = base->append(toks);
      if (vocab == 0) vocab = static_cast<int>(bl.size() / w);
      const auto depth0 = static_cast<std::int64_t>(p0);
      for (std::size_t f = 0; f < formats.size(); ++f)
        add(pm[f], compare_window(bl, engines[f] ? engines[f]->append(toks) : bl, targets, depth0, vocab, qo.compare_threads));
      if (other_e) add(noise_other, compare_window(bl, other_e->append(toks), targets, depth0, vocab, qo.compare_threads));
      if (p0 < dec_n) {
        const std::size_t dw = std::min(w, dec_n - p0);
        std::vector<float> d = base_dec->append(toks.first(dw));
        add(noise_dec, compare_window(bl, d, targets.first(std::min(dw, targets.size())), depth0, vocab, qo.compare_threads));
      }
    }
    run.positions += static_cast<std::int64_t>(n);
    run.decode_path_positions += static_cast<std::int64_t>(dec_n);
    ++run.sequences;
  }
  if (other_shared) noise_other = pm[static_cast<std::size_t>(other_at - formats.begin())];
  for (std::size_t f = 0; f < formats.size(); ++f) run.by_format[formats[f]] = bucket_quality(pm[f], buckets);
  run.noise.runs.push_back({other + " vs " + baseline + " (both chunked prefill, " + qo.device + ")", bucket_quality(noise_other, buckets)});
  run.noise.runs.push_back({baseline + " on the decode path (one decode step per token) vs " + baseline + " chunked prefill (chunk " +
                                std::to_string(qo.prefill_chunk) + ", " + qo.device + ")",
                            bucket_quality(noise_dec, buckets)});
  return run;
}

QualityRun measure_quality(const Model& model, const std::vector<std::string>& formats, const std::string& baseline,
                           const std::vector<std::vector<int>>& corpus, int threads, const std::vector<DepthBucket>& buckets,
                           const std::function<void(const std::string&)>& progress) {
  QualityOptions qo;
  qo.compare_threads = 1;
  return measure_quality(cpu_engine_factory(model, threads, qo.prefill_chunk), formats, baseline, corpus, buckets, qo, progress);
}

#if !KVGATE_SIGNOFF_CUDA
EngineFactory device_engine_factory(const Model& model, const std::string& device, int threads, int chunk, int max_context,
                                    const std::string& cuda_weights, bool mla_latent) {
  (void)cuda_weights;
  if (device == "cpu") return cpu_engine_factory(model, threads, chunk, max_context, mla_latent);
  if (device == "cuda")
    throw PolicyError("--device cuda: this build has no CUDA backend, so quality cannot be measured on the GPU "
                      "(configure with -DKVGATE_CUDA=ON where nvcc is installed)");
  throw PolicyError("--device must be cpu or cuda, not '" + device + "'");
}
#endif

}  // namespace kvgate::signoff
