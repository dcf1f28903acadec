// The quality measurement of the sign-off: every format against the baseline on the CPU engine.
#include <memory>

#include "kvgate/engine.hpp"
#include "kvgate/model.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate/signoff.hpp"

namespace kvgate::signoff {

QualityRun measure_quality(const Model& model, const std::vector<std::string>& formats, const std::string& baseline,
                           const std::vector<std::vector<int>>& corpus, int threads, const std::vector<DepthBucket>& buckets,
                           const std::function<void(const std::string&)>& progress) {
  const int block = 16;
  auto eo_for = [&](const std::string& f, int chunk) {
    const auto k = parse_kv_format(f);
    if (!k) throw PolicyError("unknown KV format '" + f + "'; known: " + known_formats_text());
    KvRequest req;
    req.flag = *k;
    EngineOptions eo;
    eo.kv = resolve_kv(req, model.config, block);
    eo.threads = threads;
    eo.block_size = block;
    eo.prefill_chunk = chunk;
    return eo;
  };
  const std::string other = baseline == "f32" ? "f16" : "f32";
  Engine base(model, eo_for(baseline, 128));
  Engine base_tok(model, eo_for(baseline, 1));
  Engine other_e(model, eo_for(other, 128));
  std::vector<std::unique_ptr<Engine>> engines;
  QualityRun run;
  for (const auto& f : formats) {
    engines.push_back(std::make_unique<Engine>(model, eo_for(f, 128)));
    run.effective[f] = engines.back()->stats().effective_kv;
  }
  std::vector<std::vector<PositionMetrics>> pm(formats.size());
  std::vector<PositionMetrics> noise_other, noise_tok;
  const int vocab = model.config.vocab_size;
  auto logits = [](Engine& e, std::span<const int> t) {
    e.reset();
    return e.forward_all_logits(t);
  };
  for (std::size_t s = 0; s < corpus.size(); ++s) {
    const auto& seq = corpus[s];
    const std::size_t n = std::min<std::size_t>(seq.size(), static_cast<std::size_t>(base.max_context()));
    if (n == 0) continue;
    const std::span<const int> t(seq.data(), n);
    const std::vector<std::vector<int>> toks = {std::vector<int>(seq.begin(), seq.begin() + static_cast<std::ptrdiff_t>(n))};
    if (progress) progress("quality: sequence " + std::to_string(s + 1) + "/" + std::to_string(corpus.size()) + " (" + std::to_string(n) + " tokens)");
    const std::vector<std::vector<float>> bl = {logits(base, t)};
    for (std::size_t f = 0; f < formats.size(); ++f) {
      const std::vector<std::vector<float>> g = {logits(*engines[f], t)};
      const auto m = compare_sequences(bl, g, toks, vocab);
      pm[f].insert(pm[f].end(), m.begin(), m.end());
    }
    {
      const std::vector<std::vector<float>> g = {logits(other_e, t)};
      const auto m = compare_sequences(bl, g, toks, vocab);
      noise_other.insert(noise_other.end(), m.begin(), m.end());
    }
    {
      const std::vector<std::vector<float>> g = {logits(base_tok, t)};
      const auto m = compare_sequences(bl, g, toks, vocab);
      noise_tok.insert(noise_tok.end(), m.begin(), m.end());
    }
    run.positions += static_cast<std::int64_t>(n);
    ++run.sequences;
  }
  for (std::size_t f = 0; f < formats.size(); ++f) run.by_format[formats[f]] = bucket_quality(pm[f], buckets);
  run.noise.runs.push_back({other + " vs " + baseline + " (both chunked prefill)", bucket_quality(noise_other, buckets)});
  run.noise.runs.push_back({baseline + " token by token (prefill chunk 1) vs " + baseline + " chunked prefill (chunk 128)",
                            bucket_quality(noise_tok, buckets)});
  return run;
}

}  // namespace kvgate::signoff
