// llama2.c legacy checkpoints (run.c's format): header of 7 int32, then fp32 arrays in the order
// token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis_real/imag
// (skipped), and the classifier when vocab_size is negative in the header.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kvgate/limits.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/tokenizer_sp.hpp"

namespace kvgate {

namespace {

constexpr std::uint32_t kLlama2cV1Magic = 0x616b3432;  // "ak42": run.c's newer export versions

struct Reader {
  const std::string& path;
  std::ifstream f;
  std::uint64_t size = 0;
  std::uint64_t off = 0;

  explicit Reader(const std::string& p) : path(p), f(p, std::ios::binary) {
    if (!f) throw ModelError("model '" + path + "': cannot open the file");
    f.seekg(0, std::ios::end);
    size = static_cast<std::uint64_t>(f.tellg());
    f.seekg(0);
  }
  // The file size was checked against the header before any read (load_llama2c): a read past the
  // end cannot happen unless the file shrinks meanwhile, and that is the read error below.
  void floats(Weight& dst, std::uint64_t n, const std::string& field) { floats(dst.f32(), n, field); }
  void floats(std::vector<float>& dst, std::uint64_t n, const std::string& field) {
    dst.resize(static_cast<std::size_t>(n));
    f.read(reinterpret_cast<char*>(dst.data()), static_cast<std::streamsize>(n * 4));
    if (!f) throw ModelError("model '" + path + "': read error in " + field);
    off += n * 4;
  }
  // Per-layer arrays are stored as [L][n] contiguous blocks.
  template <class T>  // std::vector<float> or Weight
  void layered(std::vector<LayerWeights>& layers, T LayerWeights::*member, std::uint64_t n,
               const std::string& field) {
    for (std::size_t l = 0; l < layers.size(); ++l)
      floats(layers[l].*member, n, field + "[layer " + std::to_string(l) + "]");
  }
  void skip(std::uint64_t n_bytes) {
    off += n_bytes;
    f.seekg(static_cast<std::streamoff>(off));
  }
};

void check_field(const std::string& path, const char* field, std::int64_t v, std::int64_t lo, std::int64_t hi) {
  if (v < lo || v > hi)
    throw ModelError("model '" + path + "': llama2.c header field " + field + " = " + std::to_string(v) +
                     " is outside the plausible range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "] (not a llama2.c legacy checkpoint, or a corrupted header)");
}

}  // namespace

Model load_llama2c(const std::string& path, const std::string& tokenizer_path) {
  Reader r(path);
  if (r.size < 28)
    throw ModelError("model '" + path + "': truncated: " + std::to_string(r.size) +
                     " bytes, shorter than the 28-byte llama2.c header");
  std::int32_t h[7];
  r.f.read(reinterpret_cast<char*>(h), sizeof h);
  r.off = 28;
  if (static_cast<std::uint32_t>(h[0]) == kLlama2cV1Magic)
    throw ModelError("model '" + path + "': llama2.c export version " + std::to_string(h[1]) +
                     " (magic 'ak42') is not supported; export with the legacy (version 0) format or use GGUF");
  if (std::memcmp(h, "GGUF", 4) == 0)
    throw ModelError("model '" + path + "': this is a GGUF file; load it with a .gguf name (or via load_model)");
  const auto [dim, hidden, n_layers, n_heads, n_kv_heads, vocab_raw, seq_len] = h;
  // Every size field against its limit (runtime/limits) before anything is sized or multiplied by it.
  namespace lim = limits;
  const std::string where = "model '" + path + "'";
  const auto field = [&](const lim::Limit& l, std::int64_t v, const char* name) {
    lim::check_positive(l, v, where, std::string("llama2.c header field ") + name);
  };
  field(lim::kDim, dim, "dim");
  field(lim::kHiddenDim, hidden, "hidden_dim");
  field(lim::kLayers, n_layers, "n_layers");
  field(lim::kHeads, n_heads, "n_heads");
  field(lim::kHeads, n_kv_heads, "n_kv_heads");
  field(lim::kVocab, std::llabs(static_cast<long long>(vocab_raw)), "|vocab_size|");
  field(lim::kContext, seq_len, "seq_len");
  check_field(path, "n_kv_heads", n_kv_heads, 1, n_heads);
  if (dim % n_heads != 0)
    throw ModelError("model '" + path + "': header field dim = " + std::to_string(dim) +
                     " is not a multiple of n_heads = " + std::to_string(n_heads));
  if (n_heads % n_kv_heads != 0)
    throw ModelError("model '" + path + "': header field n_heads = " + std::to_string(n_heads) +
                     " is not a multiple of n_kv_heads = " + std::to_string(n_kv_heads));
  const bool shared = vocab_raw > 0;
  const std::int64_t vocab = std::llabs(static_cast<long long>(vocab_raw));
  const std::int64_t head_dim = dim / n_heads;
  if (head_dim % 2 != 0)
    throw ModelError("model '" + path + "': head_dim = dim/n_heads = " + std::to_string(head_dim) +
                     " is odd; RoPE needs pairs");
  const std::int64_t kv_dim = head_dim * n_kv_heads;

  // The exact file size this header implies (run.c maps the file and walks it the same way).
  const std::uint64_t L = static_cast<std::uint64_t>(n_layers), D = static_cast<std::uint64_t>(dim),
                      F = static_cast<std::uint64_t>(hidden), V = static_cast<std::uint64_t>(vocab),
                      KV = static_cast<std::uint64_t>(kv_dim);
  // Checked products: a limit raised by its override must not let the implied size wrap.
  const auto mul = [&](std::uint64_t a, std::uint64_t b) { return lim::mul(a, b, where, "the size implied by the header"); };
  const auto add = [&](std::uint64_t a, std::uint64_t b) { return lim::add(a, b, where, "the size implied by the header"); };
  const std::uint64_t per_layer = add(add(add(D, mul(D, D)), mul(mul(2, KV), D)), add(add(mul(D, D), D), mul(mul(3, F), D)));
  std::uint64_t n_floats = add(add(mul(V, D), mul(L, per_layer)), D);
  n_floats = add(add(n_floats, mul(static_cast<std::uint64_t>(seq_len), static_cast<std::uint64_t>(head_dim))),
                 shared ? 0 : mul(V, D));
  const std::uint64_t expect = add(28, mul(4, n_floats));
  if (r.size < expect)
    throw ModelError("model '" + path + "': truncated: the header (dim " + std::to_string(dim) + ", layers " +
                     std::to_string(n_layers) + ", vocab " + std::to_string(vocab) + ") implies " +
                     std::to_string(expect) + " bytes, the file has " + std::to_string(r.size));
  if (r.size > expect)
    throw ModelError("model '" + path + "': size mismatch: the header implies " + std::to_string(expect) +
                     " bytes, the file has " + std::to_string(r.size) + " (" + std::to_string(r.size - expect) +
                     " extra); not a llama2.c legacy checkpoint with this header");

  Model m;
  m.path = path;
  m.source_kind = "llama2c";
  ModelConfig& c = m.config;
  c.arch = "llama";
  c.dim = dim;
  c.hidden_dim = hidden;
  c.n_layers = n_layers;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = static_cast<int>(head_dim);
  c.vocab_size = static_cast<int>(vocab);
  c.max_seq_len = seq_len;
  c.rms_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.rope_style = RopeStyle::interleaved;
  c.tied_embeddings = shared;
  c.bos_id = 1;
  c.eos_id = 2;
  check_config_limits(path, c);

  ModelWeights& w = m.weights;
  w.layers.resize(L);
  r.floats(w.tok_embeddings, V * D, "token_embedding_table");
  r.layered(w.layers, &LayerWeights::attn_norm, D, "rms_att_weight");
  r.layered(w.layers, &LayerWeights::wq, D * D, "wq");
  r.layered(w.layers, &LayerWeights::wk, KV * D, "wk");
  r.layered(w.layers, &LayerWeights::wv, KV * D, "wv");
  r.layered(w.layers, &LayerWeights::wo, D * D, "wo");
  r.layered(w.layers, &LayerWeights::ffn_norm, D, "rms_ffn_weight");
  r.layered(w.layers, &LayerWeights::w1, F * D, "w1");
  r.layered(w.layers, &LayerWeights::w2, D * F, "w2");
  r.layered(w.layers, &LayerWeights::w3, F * D, "w3");
  r.floats(w.final_norm, D, "rms_final_weight");
  // freq_cis_real/imag: unused (the RoPE tables are computed).
  r.skip(4 * static_cast<std::uint64_t>(seq_len) * static_cast<std::uint64_t>(head_dim));
  if (!shared) r.floats(w.classifier, V * D, "wcls");

  validate_weights(path, c, w);

  // Tokenizer: explicit path, else tok<vocab>.bin, else tokenizer.bin beside the checkpoint.
  std::string tok = tokenizer_path;
  if (tok.empty()) {
    const auto dir = std::filesystem::path(path).parent_path();
    for (const auto& cand : {dir / ("tok" + std::to_string(vocab) + ".bin"), dir / "tokenizer.bin"})
      if (std::filesystem::is_regular_file(cand)) {
        tok = cand.string();
        break;
      }
  }
  if (!tok.empty()) m.tokenizer = SpTokenizer::from_llama2c_file(tok, c.vocab_size, c.bos_id, c.eos_id);
  m.fingerprint = model_fingerprint(c, w);
  return m;
}

}  // namespace kvgate
