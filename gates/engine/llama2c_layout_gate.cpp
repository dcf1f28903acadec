// MOD.loader.llama2c_regions: every region of a llama2.c checkpoint is read from its own offset and
// reaches the model fingerprint. The class it closes: a loader that mis-walks the file layout
// (a region skipped by the wrong length, an unshared classifier read from the wrong offset) and a
// fingerprint that omits a tensor (a KV file restored into a model that differs in that tensor).
//
// Layout (llama2.c run.c, docs/MODELS.md): 7 int32 header fields (dim, hidden, layers, heads,
// kv_heads, vocab, seq_len; vocab < 0 = unshared classifier), then float32 regions in order:
// token_embedding [V*D], rms_att [L*D], wq [L*D*D], wk [L*KV*D], wv [L*KV*D], wo [L*D*D],
// rms_ffn [L*D], w1 [L*F*D], w2 [L*D*F], w3 [L*F*D], rms_final [D], freq_cis_real + imag
// [seq_len*head_dim] (skipped), then wcls [V*D] when unshared.
// Checks are exact: a region's first float is set to a value found nowhere in the checkpoint and
// must appear at that tensor's index 0 in the loaded weights, and change the fingerprint.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/model.hpp"
#include "models.hpp"

using namespace kvgate;

namespace {

std::vector<char> slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void spit(const std::string& p, const std::vector<char>& b) { std::ofstream(p, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size())); }

struct TmpFile {
  std::string path;
  explicit TmpFile(const std::string& name) : path((std::filesystem::temp_directory_path() / ("kvgate-l2c-" + std::to_string(::getpid()) + "-" + name)).string()) {}
  ~TmpFile() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};


}  // namespace

TEST_CASE("MOD.loader.llama2c_regions every region read from its offset, every tensor in the fingerprint", "[gate:MOD][loader]") {
  const auto lk = gates::find_model("stories260K/stories260K.bin");
  const auto tk = gates::find_model("stories260K/tok512.bin");
  if (!lk.found()) FAIL(lk.message);
  if (!tk.found()) FAIL(tk.message);
  const std::vector<char> base = slurp(lk.path);
  std::int32_t h[7];
  std::memcpy(h, base.data(), sizeof h);
  const std::uint64_t D = h[0], F = h[1], L = h[2], H = h[3], KVH = h[4], V = static_cast<std::uint64_t>(h[5] < 0 ? -h[5] : h[5]),
                      S = h[6], HD = D / H, KV = HD * KVH;
  REQUIRE(h[5] > 0);  // stories260K shares its classifier; the unshared case is built below
  const Model ref = load_model(lk.path, tk.path);

  // Offsets (floats after the header) of each region, and the loaded tensor its first float lands in.
  struct R {
    const char* name;
    std::uint64_t off;
    const std::vector<float>& (*get)(const Model&);
  };
  std::uint64_t o = 0;
  auto next = [&](std::uint64_t n) {
    const std::uint64_t at = o;
    o += n;
    return at;
  };
  const std::vector<R> regions = {
      {"token_embedding", next(V * D), [](const Model& m) -> const std::vector<float>& { return m.weights.tok_embeddings; }},
      {"rms_att", next(L * D), [](const Model& m) -> const std::vector<float>& { return m.weights.layers[0].attn_norm; }},
      {"wq", next(L * D * D), [](const Model& m) -> const std::vector<float>& { return m.weights.layers[0].wq; }},
      {"wk", next(L * KV * D), [](const Model& m) -> const std::vector<float>& { return m.weights.layers[0].wk; }},
      {"wv", next(L * KV * D), [](const Model& m) -> const std::vector<float>& { return m.weights.layers[0].wv; }},
      {"wo", next(L * D * D), [](const Model& m) -> const std::vector<float>& { return m.weights.layers[0].wo; }},
      {"rms_ffn", next(L * D), [](const Model& m) -> const std::vector<float>& { return m.weights.layers[0].ffn_norm; }},
      {"w1", next(L * F * D), [](const Model& m) -> const std::vector<float>& { return m.weights.layers[0].w1; }},
      {"w2", next(L * D * F), [](const Model& m) -> const std::vector<float>& { return m.weights.layers[0].w2; }},
      {"w3", next(L * F * D), [](const Model& m) -> const std::vector<float>& { return m.weights.layers[0].w3; }},
      {"rms_final", next(D), [](const Model& m) -> const std::vector<float>& { return m.weights.final_norm; }},
  };
  next(S * HD);  // freq_cis_real + imag
  REQUIRE(28 + 4 * o == base.size());  // anti-vacuity: the layout above is the whole file
  const float mark = 12345.678f;       // a value no weight of stories260K has
  for (const R& r : regions) {
    INFO("region " << r.name << " at float " << r.off);
    std::vector<char> b = base;
    std::memcpy(b.data() + 28 + 4 * r.off, &mark, 4);
    TmpFile f(std::string(r.name) + ".bin");
    spit(f.path, b);
    const Model m = load_model(f.path, tk.path);
    REQUIRE(!r.get(m).empty());
    CHECK(r.get(m)[0] == mark);
    CHECK(r.get(ref)[0] != mark);
    CHECK(m.fingerprint != ref.fingerprint);  // every tensor reaches the fingerprint
  }

  // Unshared classifier: vocab < 0 and wcls appended after the freq_cis tables. The classifier must
  // be exactly the appended floats (distinct from the embeddings: the embeddings scaled by -0.5).
  {
    std::vector<char> b = base;
    const std::int32_t neg = -h[5];
    std::memcpy(b.data() + 20, &neg, 4);
    std::vector<float> wcls(V * D);
    std::memcpy(wcls.data(), base.data() + 28, 4 * V * D);
    for (float& x : wcls) x *= -0.5f;
    b.insert(b.end(), reinterpret_cast<const char*>(wcls.data()), reinterpret_cast<const char*>(wcls.data() + wcls.size()));
    TmpFile f("unshared.bin");
    spit(f.path, b);
    const Model m = load_model(f.path, tk.path);
    CHECK_FALSE(m.config.tied_embeddings);
    REQUIRE(m.weights.classifier.size() == wcls.size());
    CHECK(m.weights.classifier == wcls);
    CHECK(m.weights.tok_embeddings == ref.weights.tok_embeddings);
    CHECK(m.fingerprint != ref.fingerprint);
  }
}
