// Plumbing of the transformers-reference gates (gates/hf_reference: MOD.hf.<case>.*, and its
// [cuda] twin in gates/cuda): one reference directory per case, made by transformers
// (datasets/tools/make_hf_refs.py: tiny random-weight f32 models, eager attention), under
// $KVGATE_HF_REFS, else <source>/datasets/models/hf_refs:
//
//   models/<case>/config.json, model.safetensors, tokenizer.json ...   the checkpoint
//   models/<case>/ref.json     teacher_forced [{name, ids, offset, T}], greedy [{name, prompt_ids,
//                              generated, top2_margin}], rope_type, architecture ...
//   models/<case>/logits.f32   float32 LE [T][vocab] per teacher-forced sequence, at `offset` floats
//
// Bounds (gates/common/bounds.hpp, "ORA.model"): transformers' float32 forward and kvgate's are each
// within B(p) = gamma_N(p) * max|z_p| of the exact logits (N = forward_rounding_chain, with the RoPE
// variant's extra frequency roundings), so they differ by at most 2 B(p) at position p. Checked:
// no NaN/Inf first, then max |kvgate - ref| <= 2 B(p) at every position, and NMSE <= the NMSE of
// the bound, sum_p V (2 B(p))^2 / sum z^2. Greedy: ids identical up to the first step whose
// reference top-1/top-2 margin is within 2 B (there the two float32 evaluations may rank differently).
// The engine is fed ids (never a tokenizer), so no BOS is added to the reference's ids.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kvgate/build_paths.hpp"
#include "bounds.hpp"
#include "catch_compat.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/model.hpp"
#include "kvgate/rope.hpp"

namespace kvgate::gates::hf_ref {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Every case the reference generator writes; MOD.hf.inventory checks the directory against it.
inline const std::vector<std::string>& case_names() {
  static const std::vector<std::string> n = {
      "llama_default", "llama3_rope", "llama3_legacy", "llama_linear", "llama_dynamic",
      "llama_sp",      "qwen2",       "qwen2_swa",     "qwen3",        "qwen3_yarn",
      "mistral_swa",   "phi3",        "phi3_longrope", "gemma2",       "gemma3",
      "qwen3_moe",     "mixtral",     "deepseek_v3",   "deepseek_v3_qlora"};
  return n;
}

inline std::string refs_root() {
  if (const char* e = std::getenv("KVGATE_HF_REFS"); e && *e) return e;
  std::string src;
  if (const char* s = std::getenv("KVGATE_SOURCE_DIR"); s && *s) src = s;
#ifdef KVGATE_SOURCE_DIR_DEFAULT
  if (src.empty()) src = KVGATE_SOURCE_DIR_DEFAULT;
#endif
  return (fs::path(src) / "datasets" / "models" / "hf_refs").string();
}

inline json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error("cannot open '" + p.string() + "'");
  return json::parse(f);
}

struct TfSeq {
  std::string name;
  std::vector<int> ids;
  std::size_t offset = 0;
  int T = 0;
};
struct GreedySeq {
  std::string name;
  std::vector<int> prompt, generated;
  std::vector<double> margin;
};

struct RefCase {
  std::string name, dir;
  json config, ref;
  std::vector<TfSeq> tf;
  std::vector<GreedySeq> greedy;
  std::vector<float> logits;  // the whole logits.f32
  int vocab = 0;
  int must_pass = 0;          // anti-vacuity: the run must reach positions >= this (0: no demand)
  std::string must_pass_why;
};

// The position a case's run must reach (config.json): past max_position_embeddings for dynamic NTK,
// past original_max_position_embeddings for yarn / longrope / llama3, past the window for sliding
// attention (sliding_window, unless use_sliding_window is false).
inline void demand_from_config(RefCase& c) {
  const json& cj = c.config;
  auto num = [](const json& o, const char* k) -> long long {
    return o.is_object() && o.contains(k) && o[k].is_number_integer() ? o[k].get<long long>() : 0;
  };
  const json* rp = nullptr;
  for (const char* k : {"rope_scaling", "rope_parameters"})
    if (cj.contains(k) && cj[k].is_object() && !cj[k].empty()) {
      rp = &cj[k];
      break;
    }
  if (rp && rp->contains("full_attention") && (*rp)["full_attention"].is_object()) rp = &(*rp)["full_attention"];
  std::string type = "default";
  if (rp) type = rp->value("rope_type", rp->value("type", std::string("default")));
  if (type == "dynamic") {
    c.must_pass = static_cast<int>(num(cj, "max_position_embeddings"));
    c.must_pass_why = "max_position_embeddings (dynamic NTK grows past it)";
  } else if (type == "yarn" || type == "longrope" || type == "llama3" || type == "su") {
    long long o = num(cj, "original_max_position_embeddings");
    if (o == 0 && rp) o = num(*rp, "original_max_position_embeddings");
    c.must_pass = static_cast<int>(o);
    c.must_pass_why = "original_max_position_embeddings (" + type + ")";
  }
  const bool sw_on = !(cj.contains("use_sliding_window") && cj["use_sliding_window"].is_boolean() &&
                       !cj["use_sliding_window"].get<bool>());
  const long long sw = num(cj, "sliding_window");
  if (sw_on && sw > 0 && sw > c.must_pass) {
    c.must_pass = static_cast<int>(sw);
    c.must_pass_why = "sliding_window";
  }
}

// Loads a case's reference data (not the model). Throws std::runtime_error naming the file.
inline RefCase load_case(const std::string& name) {
  RefCase c;
  c.name = name;
  const fs::path dir = fs::path(refs_root()) / "models" / name;
  c.dir = dir.string();
  if (!fs::is_directory(dir))
    throw std::runtime_error("reference directory '" + c.dir +
                             "' is missing: it is made by datasets/tools/make_hf_refs.py (transformers, on the GPU "
                             "machine) and committed under datasets/models/hf_refs; set KVGATE_HF_REFS to another copy");
  c.config = read_json(dir / "config.json");
  c.ref = read_json(dir / "ref.json");
  c.vocab = c.ref.at("vocab_size").get<int>();
  for (const auto& t : c.ref.at("teacher_forced"))
    c.tf.push_back({t.at("name").get<std::string>(), t.at("ids").get<std::vector<int>>(), t.at("offset").get<std::size_t>(),
                    t.at("T").get<int>()});
  for (const auto& g : c.ref.at("greedy"))
    c.greedy.push_back({g.at("name").get<std::string>(), g.at("prompt_ids").get<std::vector<int>>(),
                        g.at("generated").get<std::vector<int>>(), g.at("top2_margin").get<std::vector<double>>()});
  const fs::path lp = dir / "logits.f32";
  std::ifstream f(lp, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open '" + lp.string() + "'");
  f.seekg(0, std::ios::end);
  const auto bytes = static_cast<std::size_t>(f.tellg());
  f.seekg(0);
  c.logits.resize(bytes / 4);
  f.read(reinterpret_cast<char*>(c.logits.data()), static_cast<std::streamsize>(c.logits.size() * 4));
  for (const auto& t : c.tf)
    if (t.T != static_cast<int>(t.ids.size()) || t.offset + static_cast<std::size_t>(t.T) * c.vocab > c.logits.size())
      throw std::runtime_error("'" + (dir / "ref.json").string() + "': teacher_forced '" + t.name + "' (T " +
                               std::to_string(t.T) + ", offset " + std::to_string(t.offset) + ") does not fit " +
                               lp.string() + " (" + std::to_string(c.logits.size()) + " floats, vocab " +
                               std::to_string(c.vocab) + ")");
  demand_from_config(c);
  return c;
}

// Rounding operations per inverse frequency of the model's RoPE (bounds.hpp forward_rounding_chain).
inline int rope_freq_ops(const RopeConfig& r) {
  switch (r.type) {
    case RopeType::plain: return 1;
    case RopeType::linear: return 2;
    case RopeType::longrope: return 3;
    case RopeType::dynamic: return 4;
    case RopeType::yarn: return 6;
    case RopeType::llama3: return 8;
  }
  return 8;
}

// The FFN's share of the chain: the dense MLP's width, or for a mixture of experts the widest of the
// dense and expert widths plus the routing path's roundings (router dot product dim + 1, softmax
// E + 3, top-k renormalisation K + 2, the weighted sum over the K experts 2K + 2). The routing
// decision itself is not a rounding: a token whose k-th and (k+1)-th probabilities tie within
// rounding would pick another expert, which this bound does not cover (the cases print no such
// position; a failure there would show as a large local difference).
// Latent attention (MLA) adds its low-rank chain before the attention: q_a (dim + 1), its norm
// (q_lora + 3), q_b (q_lora + 1); kv_a (dim + 1), its norm (kv_lora + 3), kv_b (kv_lora + 1); and the
// shared expert its own gated MLP (shared_dim + 1 past the routed sum).
inline int ffn_chain_width(const ModelConfig& c) {
  int w = c.hidden_dim;
  if (c.moe.any()) {
    const MoeConfig& m = c.moe;
    w = std::max({c.hidden_dim, m.expert_dim, m.shared_dim}) + c.dim + m.n_experts + 3 * m.top_k + 8 +
        (m.shared_dim > 0 ? 2 : 0) + (m.router == MoeConfig::Router::sigmoid_groups ? m.n_experts / m.n_group + 4 : 0);
  }
  if (c.mla.any()) w += 2 * c.dim + 2 * c.mla.q_lora_rank + 2 * c.mla.kv_lora_rank + 10;
  return w;
}

inline double chain_at(const ModelConfig& c, int pos) {
  const bool scaled = c.rope.type == RopeType::yarn || c.rope.type == RopeType::longrope;
  return forward_rounding_chain(c.n_layers, c.dim, ffn_chain_width(c), c.head_dim, c.q_dim(), pos,
                                rope_freq_ops(c.rope), scaled);
}

// The combined bound at position p for logits of magnitude zmax: transformers' B(p) plus the
// engine's. The CUDA forward's chain is the CPU's plus, per layer, 8 + n_ctx roundings (the
// q prescale, exp2/expf approximations, the split merge, one online-softmax rescale per key:
// gates/cuda/cuda_model_gate.cpp).
// The CPU engine over the MLA latent cache (--mla-cache latent, attention_mla.hpp) computes each
// layer's attention in the absorbed form: per layer it adds the absorb dot product (nope + 1), the
// latent score over kv_lora + rope (+ 1) and the W_UV dot product (kv_lora + 1) to the expanded chain
// (which it keeps counting: an upper bound, bounds.hpp mla_absorbed_f32_max_abs).
inline double mla_latent_chain(const ModelConfig& c) {
  return (c.mla.nope_dim + 1.0) + (c.mla.kv_lora_rank + c.mla.rope_dim + 1.0) + (c.mla.kv_lora_rank + 1.0);
}

inline double pair_bound(const ModelConfig& c, int pos, double zmax, bool gpu, bool latent = false) {
  const double ref = forward_f32_logit_bound(chain_at(c, pos), zmax);
  const double mine = chain_at(c, pos) + (gpu ? c.n_layers * (8.0 + pos + 1) : 0.0) +
                      (latent ? c.n_layers * mla_latent_chain(c) : 0.0);
  return ref + forward_f32_logit_bound(mine, zmax);
}

inline void print_case(const RefCase& rc, const Model& m, const char* device) {
  const ModelConfig& c = m.config;
  std::cout << "MOD." << (std::string(device) == "cuda" ? "cuda." : "") << "hf." << rc.name << " [" << device << "]: " << rc.ref.value("architecture", std::string("?"))
            << " (kvgate arch " << c.arch << "), layers " << c.n_layers << ", heads " << c.n_heads << "/" << c.n_kv_heads
            << ", head_dim " << c.head_dim << ", vocab " << c.vocab_size << ", RoPE "
            << (describe_rope(c.rope).empty() ? "default" : describe_rope(c.rope)) << " theta " << c.rope_theta
            << (c.has_rope_local ? ", local RoPE " + describe_rope(c.rope_local) : std::string()) << "; teacher-forced";
  for (const auto& t : rc.tf) std::cout << " " << t.name << ":" << t.T;
  std::cout << ", greedy";
  for (const auto& g : rc.greedy) std::cout << " " << g.name << ":" << g.prompt.size() << "+" << g.generated.size();
  if (rc.must_pass > 0) std::cout << "; must reach past " << rc.must_pass << " (" << rc.must_pass_why << ")";
  std::cout << "; transformers " << rc.ref.value("transformers_version", std::string("?")) << "\n";
}

// The model of a case through kvgate's own loader; a refusal FAILS the case with the loader's words.
inline Model load_case_model(const RefCase& rc) {
  try {
    return load_model(rc.dir);
  } catch (const std::exception& e) {
    FAIL("MOD.hf." << rc.name << ": kvgate's loader refuses '" << rc.dir << "': " << e.what());
  }
  return {};
}

// A case and its model, loaded once per program (the CPU and CUDA gates each run several test cases
// over one directory). `id` prefixes a refusal ("MOD.hf", "MOD.cuda.hf"); `device` is printed.
struct Loaded {
  RefCase rc;
  Model m;
};

inline const Loaded& loaded(const std::string& name, const char* id, const char* device) {
  static std::map<std::string, std::unique_ptr<Loaded>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return *it->second;
  auto l = std::make_unique<Loaded>();
  try {
    l->rc = load_case(name);
  } catch (const std::exception& e) {
    FAIL(id << "." << name << ": " << e.what());
  }
  l->m = load_case_model(l->rc);
  print_case(l->rc, l->m, device);
  return *cache.emplace(name, std::move(l)).first->second;
}

inline int argmax_row(const float* z, int V) {
  int a = 0;
  for (int v = 1; v < V; ++v)
    if (z[v] > z[a]) a = v;
  return a;
}

// Teacher-forced logits of every sequence, one forward over all ids each (as transformers'
// use_cache=False reference: dynamic NTK and longrope see the whole length). Engine: kvgate::Engine
// or kvgate::cuda::CudaEngine; make(max_tokens) builds one with f32 KV.
template <class MakeEngine>
void check_logits(const RefCase& rc, const Model& m, MakeEngine&& make, bool gpu = false, bool latent = false) {
  const std::string id = "MOD.hf." + rc.name + (latent ? ".latent" : "");
  const int V = m.config.vocab_size;
  REQUIRE(V == rc.vocab);
  REQUIRE(!rc.tf.empty());
  int reached = 0;
  for (const auto& t : rc.tf) {
    auto e = make(t.T);
    REQUIRE(e->stats().effective_kv == "f32");
    const std::vector<float> got = e->forward_all_logits(t.ids);
    REQUIRE(got.size() == static_cast<std::size_t>(t.T) * V);
    const float* ref = rc.logits.data() + t.offset;
    // NaN/Inf first.
    long bad = 0;
    for (float x : got) bad += !std::isfinite(x);
    INFO(id << " " << t.name << ": " << bad << " non-finite kvgate logits");
    REQUIRE(bad == 0);
    double num = 0, den = 0, bnum = 0, worst = 0, max_abs = 0, max_bound = 0;
    int worst_pos = 0, top1 = 0, top1_unexplained = 0;
    for (int p = 0; p < t.T; ++p) {
      const float* r = ref + static_cast<std::size_t>(p) * V;
      const float* g = got.data() + static_cast<std::size_t>(p) * V;
      double zmax = 0, e = 0;
      for (int v = 0; v < V; ++v) zmax = std::max(zmax, std::fabs(double(r[v])));
      const double b2 = pair_bound(m.config, p, zmax, gpu, latent);
      max_bound = std::max(max_bound, b2);
      for (int v = 0; v < V; ++v) {
        const double d = double(g[v]) - r[v];
        e = std::max(e, std::fabs(d));
        num += d * d;
        den += double(r[v]) * r[v];
      }
      bnum += double(V) * b2 * b2;
      max_abs = std::max(max_abs, e);
      if (e / b2 > worst) worst = e / b2, worst_pos = p;
      const int ar = argmax_row(r, V), ag = argmax_row(g, V);
      if (ar == ag) ++top1;
      else if (double(r[ar]) - r[ag] > b2) ++top1_unexplained;
    }
    reached = std::max(reached, t.T);
    const double nmse = num / den, bnmse = bnum / den, rms = std::sqrt(den / (double(t.T) * V));
    std::cout << std::setprecision(4) << id << ".logits " << t.name << ": " << t.T
              << " positions, NMSE " << nmse << " (bound " << bnmse << "), max |kvgate - transformers| " << max_abs
              << " (worst position " << worst_pos << " at " << worst << " of 2B), top-1 " << top1 << "/" << t.T
              << ", largest 2B " << max_bound << ", logit RMS " << rms << "\n";
    INFO(id << " " << t.name << ": NMSE " << nmse << " (bound " << bnmse << "), worst |diff|/2B "
                   << worst << " at position " << worst_pos);
    CHECK(nmse <= bnmse);
    CHECK(worst <= 1.0);
    CHECK(top1_unexplained == 0);
    // Anti-vacuity: the bound is far below the logits (a forward bug of kOraSensitivity of the RMS
    // goes red) and the reference is not constant.
    CHECK(max_bound <= kOraSensitivity * rms);
    CHECK(rms > 0);
  }
  if (rc.must_pass > 0) {
    INFO(id << ": the teacher-forced run reaches " << reached << " tokens; it must pass "
                   << rc.must_pass << " (" << rc.must_pass_why << ")");
    CHECK(reached > rc.must_pass);
  }
}

// Greedy from prompt_ids: the prompt in one chunk (transformers' prefill), then one token per step,
// kvgate's own argmax fed back. Ids must equal the reference's up to the first step whose reference
// top-2 margin is within 2B (then the comparison stops there, and that is printed).
template <class MakeEngine>
void check_greedy(const RefCase& rc, const Model& m, MakeEngine&& make, bool gpu = false, bool latent = false) {
  const std::string id = "MOD.hf." + rc.name + (latent ? ".latent" : "");
  const int V = m.config.vocab_size;
  REQUIRE(!rc.greedy.empty());
  for (const auto& g : rc.greedy) {
    REQUIRE(!g.prompt.empty());
    REQUIRE(g.margin.size() >= g.generated.size());
    const int P = static_cast<int>(g.prompt.size()), n = static_cast<int>(g.generated.size());
    auto e = make(P + n + 1);
    REQUIRE(e->stats().effective_kv == "f32");
    std::vector<float> z = e->prefill(g.prompt);
    int compared = 0, stop_step = -1;
    std::vector<int> mine;
    for (int k = 0; k < n; ++k) {
      double zmax = 0;
      for (int v = 0; v < V; ++v) zmax = std::max(zmax, std::fabs(double(z[static_cast<std::size_t>(v)])));
      const double b2 = pair_bound(m.config, P - 1 + k, zmax, gpu, latent);
      if (g.margin[static_cast<std::size_t>(k)] <= b2) {
        stop_step = k;
        break;
      }
      const int id = argmax_row(z.data(), V);
      mine.push_back(id);
      ++compared;
      if (id != g.generated[static_cast<std::size_t>(k)]) break;
      if (k + 1 < n) z = e->decode(id);
    }
    std::ostringstream ids;
    for (std::size_t i = 0; i < mine.size(); ++i) ids << (i ? "," : "") << mine[i];
    std::cout << id << ".greedy " << g.name << ": prompt " << P << ", " << compared << " of " << n
              << " steps compared"
              << (stop_step >= 0 ? " (stopped at step " + std::to_string(stop_step) + ": reference top-2 margin within 2B)"
                                 : std::string())
              << ", reaches position " << P - 1 + compared << "\n";
    INFO(id << " greedy " << g.name << ": kvgate ids " << ids.str());
    for (int k = 0; k < compared; ++k) CHECK(mine[static_cast<std::size_t>(k)] == g.generated[static_cast<std::size_t>(k)]);
    // Anti-vacuity: a comparison happened at all.
    CHECK(compared > 0);
  }
}

}  // namespace kvgate::gates::hf_ref
