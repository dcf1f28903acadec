// Reading the transformers reference directories (datasets/models/hf_refs/models/<case>: config.json,
// model.safetensors, ref.json, logits.f32; made by datasets/tools/make_hf_refs.py) and the bound
// the gates hold kvgate's logits to (the ORA.model forward bound, bounds.hpp). Shared by
// MOD.hf_arch (CPU) and MOD.cuda.hf_arch (GPU).
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvgate/build_paths.hpp"
#include "bounds.hpp"
#include "catch_compat.hpp"
#include "kvgate/model.hpp"

namespace kvgate::gates::hf_arch {

namespace fs = std::filesystem;


inline fs::path refs_root() {
  std::string src;
  if (const char* s = std::getenv("KVGATE_SOURCE_DIR"); s && *s) src = s;
#ifdef KVGATE_SOURCE_DIR_DEFAULT
  if (src.empty()) src = KVGATE_SOURCE_DIR_DEFAULT;
#endif
  return fs::path(src) / "datasets" / "models" / "hf_refs" / "models";
}

inline std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) FAIL("cannot read " << p.string() << " (the transformers reference directories are committed under "
                                              "datasets/models/hf_refs; run through ctest or set KVGATE_SOURCE_DIR)");
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// The model only (config.json + model.safetensors, linked into a fresh folder): the gate is about
// the network, the tokenizer files have gates of their own.
inline Model load_network(const fs::path& dir) {
  const fs::path tmp = fs::temp_directory_path() / ("kvgate_hf_arch_" + dir.filename().string() + "_" +
                                                    std::to_string(static_cast<long long>(::getpid())));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  for (const char* f : {"config.json", "model.safetensors"}) fs::create_symlink(fs::absolute(dir / f), tmp / f);
  Model m = load_model(tmp.string());
  fs::remove_all(tmp, ec);
  return m;
}

struct Ref {
  nlohmann::json j;
  std::vector<float> logits;
  int vocab = 0;
};

inline Ref read_ref(const fs::path& dir) {
  Ref r;
  r.j = nlohmann::json::parse(slurp(dir / "ref.json"));
  const std::string b = slurp(dir / "logits.f32");
  r.logits.resize(b.size() / 4);
  std::memcpy(r.logits.data(), b.data(), r.logits.size() * 4);
  r.vocab = r.j.at("vocab_size").get<int>();
  return r;
}

// The ORA.model bound (bounds.hpp forward_rounding_chain / forward_f32_logit_bound) of one position,
// with the Gemma extras on the chain: per layer the two sandwich norms (dim + 3 each) and their adds,
// the soft-capped score (divide, tanh, multiply: 3) and GeGLU's tanh GELU (6 operations instead of
// SiLU's 4); then the embedding scale (1) and the final soft-cap (3). Both transformers and kvgate
// are binary32 evaluations of the same function, each within the bound of the exact value: their
// difference is within twice the bound.
inline double position_bound(const ModelConfig& c, int pos, double zmax, double extra_chain = 0) {
  double chain = forward_rounding_chain(c.n_layers, c.dim, c.hidden_dim, c.head_dim, c.q_dim(), pos);
  if (c.post_norms) chain += c.n_layers * (2.0 * (c.dim + 3) + 2 + 3 + 2) + 1 + 3;
  return 2 * forward_f32_logit_bound(chain + extra_chain, zmax);
}

struct TfResult {
  double nmse = 0, nmse_bound = 0;
  int top1_agree = 0, top1_unexplained = 0, positions = 0;
};

inline TfResult compare(const ModelConfig& c, const std::vector<float>& got, const float* ref, int T, int V,
                 double (*extra_chain)(int pos) = nullptr) {
  TfResult r;
  double num = 0, den = 0, bnum = 0;
  for (int p = 0; p < T; ++p) {
    const float* z = ref + static_cast<std::size_t>(p) * V;
    const float* g = got.data() + static_cast<std::size_t>(p) * V;
    double zmax = 0;
    for (int v = 0; v < V; ++v) zmax = std::max(zmax, std::fabs(double(z[v])));
    const double b = position_bound(c, p, zmax, extra_chain ? extra_chain(p) : 0.0);
    int az = 0, ag = 0;
    for (int v = 0; v < V; ++v) {
      num += (double(g[v]) - z[v]) * (double(g[v]) - z[v]);
      den += double(z[v]) * z[v];
      if (z[v] > z[az]) az = v;
      if (g[v] > g[ag]) ag = v;
    }
    bnum += double(V) * b * b;
    if (az == ag) ++r.top1_agree;
    else if (double(z[az]) - z[ag] > 2 * b) ++r.top1_unexplained;
  }
  r.nmse = num / den;
  r.nmse_bound = bnum / den;
  r.positions = T;
  return r;
}

}  // namespace kvgate::gates::hf_arch
