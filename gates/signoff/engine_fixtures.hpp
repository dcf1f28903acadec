// Shared by the sources of gate_signoff_engine: stories260K loaded once, the committed corpus, and
// the small probe specs the sensitivity gates run.
#pragma once
#include <filesystem>
#include <memory>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/matrix.hpp"
#include "kvgate/model.hpp"
#include "kvgate/resolve.hpp"
#include "models.hpp"

namespace kvgate::gates::signoff_engine {

inline const Model& stories() {
  static std::unique_ptr<Model> m;
  if (!m) {
    const auto lk = kvgate::gates::find_model("stories260K/stories260K.bin");
    if (!lk.found()) FAIL(lk.message);
    m = std::make_unique<Model>(load_model(lk.path));
  }
  return *m;
}

// The first `n` sequences of datasets/corpora/stories260K_tf.json (256 tokens each).
inline std::vector<std::vector<int>> corpus_sequences(std::size_t n) {
  const auto p = std::filesystem::path(kvgate::gates::gate_source_dir()) / "datasets" / "corpora" / "stories260K_tf.json";
  const auto c = matrix::load_corpus(p.string());
  REQUIRE(c.sequences.size() >= n);
  return {c.sequences.begin(), c.sequences.begin() + static_cast<std::ptrdiff_t>(n)};
}

// Needle (512 tokens at `needle_depths`, seed 1), counting (length 10), echo (seeds 1, 2).
inline std::vector<matrix::ProbeSpec> sensitivity_specs(const std::vector<double>& needle_depths) {
  std::vector<matrix::ProbeSpec> specs(3);
  specs[0].kind = probes::ProbeKind::needle;
  specs[0].lengths = {512};
  specs[0].depths = needle_depths;
  specs[0].seeds = {1};
  specs[1].kind = probes::ProbeKind::counting;
  specs[1].lengths = {10};
  specs[2].kind = probes::ProbeKind::echo;
  specs[2].seeds = {1, 2};
  return specs;
}

// The probe model (datasets/models/probe) and engine options at f16 KV, every core.
struct ProbeSubject {
  Model model;
  EngineOptions eo;
};
inline ProbeSubject probe_subject_f16() {
  const std::string path = matrix::find_probe_model(kvgate::gates::gate_source_dir());
  if (path.empty()) FAIL("the probe model (datasets/models/probe) was not found under " << kvgate::gates::gate_source_dir());
  ProbeSubject s{load_model(path), {}};
  KvRequest req;
  req.flag = *parse_kv_format("f16");
  s.eo.kv = resolve_kv(req, s.model.config, 16);
  s.eo.threads = 0;
  return s;
}

}  // namespace kvgate::gates::signoff_engine
