// The model the conformance gates run: stories260K, loaded once per process and per layout of
// sliding windows (a copy of the model with per-layer windows set; none by default).
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/model.hpp"
#include "models.hpp"

namespace kvgate::gates {

inline const Model& stories260k(const std::vector<int>& windows = {}) {
  static std::map<std::vector<int>, std::unique_ptr<Model>> cache;
  auto& m = cache[windows];
  if (!m) {
    const auto lk = find_model("stories260K/stories260K.bin");
    if (!lk.found()) FAIL(lk.message);
    m = std::make_unique<Model>(load_model(lk.path));
    if (!windows.empty()) m->config.layer_window = windows;
  }
  return *m;
}

}  // namespace kvgate::gates
