// kvgate::load_model: picks the loader from the path; model fingerprint; weight-shape validation.
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <type_traits>

#include "kvgate/limits.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/tokenizer_bpe.hpp"
#include "kvgate/tokenizer_json.hpp"
#include "kvgate/tokenizer_sp.hpp"

namespace kvgate {

namespace {

std::string lower_ext(const std::string& path) {
  std::string e = std::filesystem::path(path).extension().string();
  for (char& ch : e) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return e;
}

bool starts_with_gguf_magic(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char m[4] = {};
  return f.read(m, 4) && std::memcmp(m, "GGUF", 4) == 0;
}

template <class T>  // std::vector<float> or Weight
void check_size(const std::string& path, const std::string& tensor, const T& v, std::size_t expect) {
  if (v.size() != expect)
    throw ModelError("model '" + path + "': tensor " + tensor + " has " + std::to_string(v.size()) +
                     " elements, the config implies " + std::to_string(expect));
}

}  // namespace

void check_config_limits(const std::string& path, const ModelConfig& c) {
  namespace L = limits;
  const std::string where = "model '" + path + "'";
  L::check_positive(L::kVocab, c.vocab_size, where, "vocab_size");
  L::check_positive(L::kLayers, c.n_layers, where, "n_layers (num_hidden_layers / block_count)");
  L::check_positive(L::kDim, c.dim, where, "dim (hidden_size / embedding_length)");
  L::check_positive(L::kHiddenDim, c.hidden_dim, where, "hidden_dim (intermediate_size / feed_forward_length)");
  L::check_positive(L::kHeads, c.n_heads, where, "n_heads (num_attention_heads / head_count)");
  L::check_positive(L::kHeads, c.n_kv_heads, where, "n_kv_heads (num_key_value_heads / head_count_kv)");
  L::check_positive(L::kHeadDim, c.head_dim, where, "head_dim");
  L::check_positive(L::kContext, c.max_seq_len, where, "max_seq_len (max_position_embeddings / context_length)");
  L::check(L::kExperts, c.moe.n_experts, where, "n_experts (num_local_experts / n_routed_experts)");
  L::check(L::kKvRow, static_cast<std::int64_t>(c.n_kv_heads) * c.head_dim, where, "n_kv_heads * head_dim");
  L::check(L::kKvRow, static_cast<std::int64_t>(c.n_heads) * c.head_dim, where, "n_heads * head_dim (q_dim)");
}

void validate_weights(const std::string& path, const ModelConfig& c, const ModelWeights& w) {
  if (c.dim <= 0 || c.hidden_dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
      c.vocab_size <= 0 || c.max_seq_len <= 0)
    throw ModelError("model '" + path + "': config has a non-positive size (dim, hidden_dim, layers, heads, kv_heads, "
                     "head_dim, vocab_size, max_seq_len must all be > 0)");
  if (c.n_heads % c.n_kv_heads != 0)
    throw ModelError("model '" + path + "': n_heads " + std::to_string(c.n_heads) + " is not a multiple of n_kv_heads " +
                     std::to_string(c.n_kv_heads));
  if (c.head_dim % 2 != 0) throw ModelError("model '" + path + "': head_dim " + std::to_string(c.head_dim) + " is odd");
  const std::size_t D = static_cast<std::size_t>(c.dim), F = static_cast<std::size_t>(c.hidden_dim),
                    Q = static_cast<std::size_t>(c.q_dim()), KV = static_cast<std::size_t>(c.kv_dim()),
                    V = static_cast<std::size_t>(c.vocab_size), HD = static_cast<std::size_t>(c.head_dim);
  check_size(path, "token_embeddings", w.tok_embeddings, V * D);
  check_size(path, "final_norm", w.final_norm, D);
  if (!w.classifier.empty()) check_size(path, "classifier", w.classifier, V * D);
  if (w.layers.size() != static_cast<std::size_t>(c.n_layers))
    throw ModelError("model '" + path + "': " + std::to_string(w.layers.size()) + " layers of weights, config says " +
                     std::to_string(c.n_layers));
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    check_size(path, p + "attn_norm", L.attn_norm, D);
    if (c.mla.any()) {  // latent attention projections
      const MlaConfig& a = c.mla;
      const std::size_t H = static_cast<std::size_t>(c.n_heads), QL = static_cast<std::size_t>(a.q_lora_rank),
                        KL = static_cast<std::size_t>(a.kv_lora_rank), R = static_cast<std::size_t>(a.rope_dim),
                        N = static_cast<std::size_t>(a.nope_dim), VD = static_cast<std::size_t>(a.v_dim);
      if (QL > 0) {
        check_size(path, p + "q_a_proj", L.wq_a, QL * D);
        check_size(path, p + "q_a_layernorm", L.q_a_norm, QL);
        check_size(path, p + "q_b_proj", L.wq, H * (N + R) * QL);
      } else {
        check_size(path, p + "q_proj", L.wq, H * (N + R) * D);
      }
      check_size(path, p + "kv_a_proj_with_mqa", L.wkv_a, (KL + R) * D);
      check_size(path, p + "kv_a_layernorm", L.kv_a_norm, KL);
      check_size(path, p + "kv_b_proj", L.wkv_b, H * (N + VD) * KL);
      check_size(path, p + "wo", L.wo, D * H * VD);
      if (HD != N + R || c.n_kv_heads != c.n_heads || VD > HD)
        throw ModelError("model '" + path + "': latent attention needs head_dim = nope + rope, one KV head per head "
                         "and v_head_dim <= head_dim");
    } else {
      check_size(path, p + "wq", L.wq, Q * D);
      check_size(path, p + "wk", L.wk, KV * D);
      check_size(path, p + "wv", L.wv, KV * D);
      check_size(path, p + "wo", L.wo, D * Q);
    }
    check_size(path, p + "ffn_norm", L.ffn_norm, D);
    if (c.moe.is_moe(static_cast<int>(l))) {  // routed experts instead of the dense MLP
      const std::size_t E = static_cast<std::size_t>(c.moe.n_experts), I = static_cast<std::size_t>(c.moe.expert_dim);
      check_size(path, p + "router", L.router, E * D);
      check_size(path, p + "experts w1", L.ew1, E * I * D);
      check_size(path, p + "experts w2", L.ew2, E * D * I);
      check_size(path, p + "experts w3", L.ew3, E * I * D);
      if (c.moe.router == MoeConfig::Router::sigmoid_groups) check_size(path, p + "router bias", L.router_bias, E);
      if (c.moe.shared_dim > 0) {
        const std::size_t S = static_cast<std::size_t>(c.moe.shared_dim);
        check_size(path, p + "shared w1", L.sw1, S * D);
        check_size(path, p + "shared w2", L.sw2, D * S);
        check_size(path, p + "shared w3", L.sw3, S * D);
      }
    } else {
      check_size(path, p + "w1", L.w1, F * D);
      check_size(path, p + "w2", L.w2, D * F);
      check_size(path, p + "w3", L.w3, F * D);
    }
    if (c.qkv_bias) {
      check_size(path, p + "bq", L.bq, Q);
      check_size(path, p + "bk", L.bk, KV);
      check_size(path, p + "bv", L.bv, KV);
    }
    if (c.qk_norm) {
      check_size(path, p + "q_norm", L.q_norm, HD);
      check_size(path, p + "k_norm", L.k_norm, HD);
    }
    if (c.post_norms) {
      check_size(path, p + "post_attn_norm", L.post_attn_norm, D);
      check_size(path, p + "post_ffn_norm", L.post_ffn_norm, D);
    }
  }
  if (!c.layer_window.empty()) {
    if (c.layer_window.size() != static_cast<std::size_t>(c.n_layers))
      throw ModelError("model '" + path + "': " + std::to_string(c.layer_window.size()) +
                       " per-layer attention windows for " + std::to_string(c.n_layers) + " layers");
    for (std::size_t l = 0; l < c.layer_window.size(); ++l)
      if (c.layer_window[l] < 0)
        throw ModelError("model '" + path + "': layer " + std::to_string(l) + " has attention window " +
                         std::to_string(c.layer_window[l]) + " (0 = full attention, else > 0)");
  }
  if (c.moe.any()) {
    const MoeConfig& m = c.moe;
    if (m.layer_moe.size() != static_cast<std::size_t>(c.n_layers) || m.expert_dim <= 0 || m.top_k < 1 ||
        m.top_k > m.n_experts)
      throw ModelError("model '" + path + "': mixture-of-experts config is inconsistent (" + std::to_string(m.n_experts) +
                       " experts, top-k " + std::to_string(m.top_k) + ", expert width " + std::to_string(m.expert_dim) +
                       ", " + std::to_string(m.layer_moe.size()) + " per-layer flags for " + std::to_string(c.n_layers) +
                       " layers)");
  }
  for (const float v : {c.embed_scale, c.attn_scale, c.attn_softcap, c.final_softcap})
    if (!(v >= 0.0f) || !std::isfinite(v))
      throw ModelError("model '" + path + "': embedding scale, attention scale and soft-caps must be finite and >= 0");
}

std::string model_fingerprint(const ModelConfig& c, const ModelWeights& w) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  char cfg[512];
  const int n = std::snprintf(cfg, sizeof cfg,
                              "kvgate-model-v1;arch=%s;dim=%d;hidden=%d;layers=%d;heads=%d;kv_heads=%d;head_dim=%d;"
                              "vocab=%d;eps=%a;theta=%a;rope=%s;qkv_bias=%d;qk_norm=%d;tied=%d;bos=%d;eos=%d;",
                              c.arch.c_str(), c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim,
                              c.vocab_size, static_cast<double>(c.rms_eps), static_cast<double>(c.rope_theta),
                              c.rope_style == RopeStyle::interleaved ? "interleaved" : "half", c.qkv_bias ? 1 : 0,
                              c.qk_norm ? 1 : 0, w.classifier.empty() ? 1 : 0, c.bos_id, c.eos_id);
  XXH64_update(st, cfg, static_cast<std::size_t>(n));
  // Architecture switches past the Llama family, hashed only when set (older fingerprints stay).
  const bool has_window = std::any_of(c.layer_window.begin(), c.layer_window.end(), [](int x) { return x > 0; });
  if (has_window || c.ffn_act != FfnAct::silu || c.post_norms || c.embed_scale > 0 || c.attn_scale > 0 ||
      c.attn_softcap > 0 || c.final_softcap > 0) {
    std::string arch = "arch-v2;act=" + std::to_string(static_cast<int>(c.ffn_act)) +
                       ";post_norms=" + std::to_string(c.post_norms ? 1 : 0) + ";windows=";
    for (int x : c.layer_window) arch += std::to_string(x) + ",";
    char f[160];
    std::snprintf(f, sizeof f, ";embed=%a;attn_scale=%a;attn_cap=%a;final_cap=%a;", static_cast<double>(c.embed_scale),
                  static_cast<double>(c.attn_scale), static_cast<double>(c.attn_softcap),
                  static_cast<double>(c.final_softcap));
    arch += f;
    XXH64_update(st, arch.data(), arch.size());
  }
  // RoPE variants (absent for the plain RoPE, so plain fingerprints are unchanged).
  for (const auto& [tag, r] : {std::pair<const char*, const RopeConfig*>{"rope_cfg=", &c.rope},
                               std::pair<const char*, const RopeConfig*>{"rope_local=", c.has_rope_local ? &c.rope_local : nullptr}}) {
    if (!r) continue;
    const std::string d = describe_rope(*r);
    if (d.empty() && r == &c.rope) continue;
    const std::string s = std::string(tag) + d + ";";
    XXH64_update(st, s.data(), s.size());
  }
  // Every tensor's FP32 values, whatever the storage: a model kept as stored and the same model
  // converted to FP32 have one fingerprint (KV files name it).
  std::vector<float> piece;
  auto add = [&](const auto& t) {
    const std::uint64_t sz = t.size();
    XXH64_update(st, &sz, sizeof sz);
    if (t.empty()) return;
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(t)>, Weight>) {
      if (!t.is_f32()) {
        const WeightView v = t.view();
        constexpr std::size_t kPiece = std::size_t{1} << 20;
        piece.resize(std::min(kPiece, v.n));
        for (std::size_t o = 0; o < v.n; o += kPiece) {
          const std::size_t n = std::min(kPiece, v.n - o);
          v.to_f32(o, n, piece.data());
          XXH64_update(st, piece.data(), n * sizeof(float));
        }
        return;
      }
    }
    XXH64_update(st, t.data(), t.size() * sizeof(float));
  };
  add(w.tok_embeddings);
  for (const LayerWeights& L : w.layers) {
    add(L.attn_norm);
    for (const auto* t : {&L.wq, &L.wk, &L.wv, &L.wo}) add(*t);
    for (const auto* t : {&L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm, &L.ffn_norm}) add(*t);
    for (const auto* t : {&L.w1, &L.w2, &L.w3}) add(*t);
  }
  for (const LayerWeights& L : w.layers)
    if (!L.post_attn_norm.empty() || !L.post_ffn_norm.empty()) {
      add(L.post_attn_norm);
      add(L.post_ffn_norm);
    }
  // Mixture of experts (absent for dense models, so their fingerprints are unchanged).
  if (c.moe.any()) {
    std::string moe = "moe-v1;experts=" + std::to_string(c.moe.n_experts) + ";top_k=" + std::to_string(c.moe.top_k) +
                      ";expert_dim=" + std::to_string(c.moe.expert_dim) + ";norm_topk=" +
                      std::to_string(c.moe.norm_topk ? 1 : 0) + ";layers=";
    for (auto v : c.moe.layer_moe) moe += v ? '1' : '0';
    XXH64_update(st, moe.data(), moe.size());
    for (const LayerWeights& L : w.layers)
    {
      add(L.router);
      for (const auto* t : {&L.ew1, &L.ew2, &L.ew3}) add(*t);
    }
    if (c.moe.router != MoeConfig::Router::softmax_topk || c.moe.shared_dim > 0) {
      char f[160];
      std::snprintf(f, sizeof f, "moe-v3;router=%d;groups=%d/%d;scale=%a;shared=%d;", static_cast<int>(c.moe.router),
                    c.moe.topk_group, c.moe.n_group, static_cast<double>(c.moe.routed_scale), c.moe.shared_dim);
      XXH64_update(st, f, std::strlen(f));
      for (const LayerWeights& L : w.layers)
      {
        add(L.router_bias);
        for (const auto* t : {&L.sw1, &L.sw2, &L.sw3}) add(*t);
      }
    }
  }
  if (c.mla.any()) {
    char f[160];
    std::snprintf(f, sizeof f, "mla-v1;q_lora=%d;kv_lora=%d;nope=%d;rope=%d;v=%d;interleave=%d;", c.mla.q_lora_rank,
                  c.mla.kv_lora_rank, c.mla.nope_dim, c.mla.rope_dim, c.mla.v_dim, c.mla.rope_interleave ? 1 : 0);
    XXH64_update(st, f, std::strlen(f));
    for (const LayerWeights& L : w.layers)
      for (const auto* t : {&L.wq_a, &L.q_a_norm, &L.wkv_a, &L.kv_a_norm, &L.wkv_b}) add(*t);
  }
  add(w.final_norm);
  add(w.classifier);
  const XXH64_hash_t h = XXH64_digest(st);
  XXH64_freeState(st);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::string kv_cache_layout(const ModelConfig& c) {
  if (!c.mla.any()) return "kv_heads";
  return "mla_expanded: per head K = [k_nope " + std::to_string(c.mla.nope_dim) + " | k_rope " +
         std::to_string(c.mla.rope_dim) + "], V = [v " + std::to_string(c.mla.v_dim) + " | zero pad " +
         std::to_string(c.head_dim - c.mla.v_dim) + "], " + std::to_string(c.n_kv_heads) +
         " heads; the latent c_kv (kv_lora_rank " + std::to_string(c.mla.kv_lora_rank) +
         ") is not cached, the K/V format applies to the expanded rows";
}

std::string kv_cache_layout_latent(const ModelConfig& c, const KvFormat& f) {
  return "mla_latent: per token the latent c_kv (kv_lora_rank " + std::to_string(c.mla.kv_lora_rank) + ") in " +
         std::string(name(f.k)) + " (the K half) and the shared rotated RoPE key (qk_rope_head_dim " +
         std::to_string(c.mla.rope_dim) + ") in " + std::string(name(f.v)) +
         " (the V half); attention absorbs kv_b_proj (W_UK into the queries, W_UV after the softmax)";
}

std::size_t ModelWeights::owned_bytes() const {
  std::size_t b = 0;
  for_each_tensor([&](const auto& t, bool) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(t)>, Weight>) b += t.mapped() ? 0 : t.bytes();
    else b += t.size() * sizeof(float);
  });
  return b;
}

std::size_t ModelWeights::mapped_bytes() const {
  std::size_t b = 0;
  for_each_tensor([&](const auto& t, bool) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(t)>, Weight>) b += t.mapped() ? t.bytes() : 0;
  });
  return b;
}

Model load_model(const std::string& path, const std::string& tokenizer_path, WeightStorage storage) {
  std::error_code ec;
  if (path.empty()) throw ModelError("model: no path given (--model PATH)");
  if (!std::filesystem::exists(path, ec))
    throw ModelError("model '" + path + "': no such file or directory");
  Model m;
  if (std::filesystem::is_directory(path, ec)) {
    m = load_hf(path, storage);
  } else if (starts_with_gguf_magic(path) || lower_ext(path) == ".gguf") {
    m = load_gguf(path);
  } else {
    return load_llama2c(path, tokenizer_path);  // takes the tokenizer path itself
  }
  if (!tokenizer_path.empty()) {  // explicit tokenizer overrides the embedded one
    if (lower_ext(tokenizer_path) == ".json")  // with the tokenizer_config.json beside it, if any
      m.tokenizer = load_tokenizer_json(
          tokenizer_path, m.config.bos_id, m.config.eos_id,
          (std::filesystem::path(tokenizer_path).parent_path() / "tokenizer_config.json").string());
    else
      m.tokenizer = SpTokenizer::from_llama2c_file(tokenizer_path, m.config.vocab_size, m.config.bos_id,
                                                   m.config.eos_id);
  }
  if (m.fingerprint.empty()) m.fingerprint = model_fingerprint(m.config, m.weights);
  if (m.path.empty()) m.path = path;
  return m;
}

}  // namespace kvgate
