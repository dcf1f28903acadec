// The stories260K subject of the gate_cuda sources that drive the CUDA engine on a real model
// (cuda_engine_gate.cpp, cuda_pipeline_gate.cpp): the model and corpus sequence 0 (256 ids of the
// committed model-level corpus), loaded once for the whole executable.
#pragma once
#include <memory>
#include <vector>

#include "../model_vs_oracle/model_harness.hpp"
#include "catch_compat.hpp"
#include "kvgate/loaders.hpp"
#include "models.hpp"

namespace kvgate::gates::cuda_gate {

struct StoriesSubject {
  Model m;
  std::vector<int> tokens;  // corpus sequence 0
};

// Fails the calling case (naming where the model is looked for) when stories260K is missing.
inline const StoriesSubject& stories_subject() {
  static std::unique_ptr<StoriesSubject> s;
  if (s) return *s;
  const ModelLookup lk = find_model("stories260K/stories260K.bin");
  if (!lk.found()) FAIL(lk.message);
  auto st = std::make_unique<StoriesSubject>();
  st->m = load_model(lk.path);
  const auto c = model_level::load_corpus(model_level::corpus_path());
  REQUIRE(!c.sequences.empty());
  st->tokens = c.sequences[0];
  s = std::move(st);
  return *s;
}

}  // namespace kvgate::gates::cuda_gate
