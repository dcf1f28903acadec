// Model-level gates on the real stories260K model (../shared/models or $KVGATE_MODELS):
//   MOD.greedy.stories260K.{bin,gguf}  f32 KV reproduces the README's 64 verified greedy token ids
//   MOD.engine.*                       batched prefill == token-by-token decode, thread-count
//                                      invariance, .bin == .gguf logits, every preset runs
//   MOD.tokenizer.*                    SentencePiece encode/decode as llama2.c run.c
//   MOD.loader.*                       corrupted checkpoints give one clear ModelError naming the
//                                      file and the field, never a crash
//   ORA.dequant_rows.*                 attention's vectorized page read == dequantize_token
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "gguf_writer.hpp"
#include "kvgate/attention.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/limits.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/model.hpp"
#include "kvgate/numeric.hpp"
#include "kvgate/sampler.hpp"
#include "kvgate/tokenizer_bpe.hpp"
#include "kvgate/tokenizer_sp.hpp"
#include "models.hpp"
#include "populations.hpp"

using namespace kvgate;
using kvgate::gates::GgufWriter;
using kvgate::gates::SynthTensor;
namespace fs = std::filesystem;

namespace {

const std::vector<int>& kGreedy64 = gates::kStories260KGreedy64;
const char* const kGreedyText = gates::kStories260KGreedyText;

std::string need_model(const std::string& rel) {
  const auto lk = gates::find_model(rel);
  if (!lk.found()) FAIL(lk.message);
  return lk.path;
}

const Model& stories(const std::string& file) {
  static std::map<std::string, std::unique_ptr<Model>> cache;
  auto& m = cache[file];
  if (!m) m = std::make_unique<Model>(load_model(need_model("stories260K/" + file)));
  return *m;
}

EngineOptions opts(const KvFormat& f, int threads = 1) { return engine_options_for(f, threads); }

// Greedy decoding that ignores stop tokens (as the README's run.c run did for 64 tokens).
std::vector<int> greedy(Engine& e, int bos, int n) {
  std::vector<int> out;
  int next = argmax(e.prefill(std::span<const int>(&bos, 1)));
  for (int i = 0; i < n; ++i) {
    out.push_back(next);
    if (i + 1 < n) next = argmax(e.decode(next));
  }
  return out;
}

void check_greedy(const std::string& file) {
  const Model& m = stories(file);
  REQUIRE(m.tokenizer != nullptr);
  Engine e(m, opts(KvFormat{HalfFormat::f32, HalfFormat::f32}));
  const auto ids = greedy(e, m.config.bos_id, 64);
  CHECK(ids == kGreedy64);
  // The same through generate() (stops only on EOS/BOS, none of which occurs in these 64).
  e.reset();
  const int bos = m.config.bos_id;
  const GenerateResult r = e.generate(std::span<const int>(&bos, 1), 64, SamplerOptions{});
  CHECK(r.tokens == kGreedy64);
  CHECK(r.stop_reason == "steps");
  std::string text;
  int prev = bos;
  for (int id : r.tokens) {
    text += m.tokenizer->decode_piece(prev, id);
    prev = id;
  }
  CHECK(text == kGreedyText);
  CHECK(e.stats().effective_kv == "f32");
  CHECK(e.stats().decode_tokens == 63);
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

}  // namespace

TEST_CASE("MOD.greedy.stories260K.bin f32 KV reproduces the verified greedy output", "[gate:MOD][fmt:f32]") {
  check_greedy("stories260K.bin");
}

TEST_CASE("MOD.greedy.stories260K.gguf f32 KV reproduces the verified greedy output", "[gate:MOD][fmt:f32]") {
  check_greedy("stories260K.gguf");
}

TEST_CASE("MOD.engine.bin_equals_gguf the two files give bit-identical logits", "[gate:MOD][fmt:f32]") {
  const Model& a = stories("stories260K.bin");
  const Model& b = stories("stories260K.gguf");
  CHECK(a.config.dim == b.config.dim);
  CHECK(a.config.n_kv_heads == b.config.n_kv_heads);
  CHECK(a.config.head_dim == b.config.head_dim);
  CHECK(b.config.max_seq_len == 2048);  // the converter's default, not 512 (README)
  Engine ea(a, opts(KvFormat{HalfFormat::f32, HalfFormat::f32}));
  Engine eb(b, opts(KvFormat{HalfFormat::f32, HalfFormat::f32}));
  std::vector<int> toks{1};
  toks.insert(toks.end(), kGreedy64.begin(), kGreedy64.end());
  CHECK(ea.forward_all_logits(toks) == eb.forward_all_logits(toks));
}

TEST_CASE("MOD.engine.prefill_equals_decode batched prefill == token-by-token decode", "[gate:MOD]") {
  const Model& m = stories("stories260K.bin");
  std::vector<int> toks{1};
  for (int r = 0; r < 3; ++r) toks.insert(toks.end(), kGreedy64.begin(), kGreedy64.end());  // 193 tokens
  for (const char* p : {"f32", "int8", "k8v4"}) {
    INFO("preset " << p);
    const KvFormat f = *parse_kv_format(p);
    EngineOptions o1 = opts(f);
    o1.prefill_chunk = 48;  // chunks that cross pages and end mid-page
    Engine batched(m, o1);
    const std::vector<float> all = batched.forward_all_logits(toks);
    Engine step(m, opts(f));
    const std::size_t V = static_cast<std::size_t>(m.config.vocab_size);
    float worst = 0;
    for (std::size_t i = 0; i < toks.size(); ++i) {
      const std::vector<float>& l = i == 0 ? step.prefill(std::span<const int>(&toks[0], 1)) : step.decode(toks[i]);
      const std::vector<float> row(all.begin() + static_cast<std::ptrdiff_t>(i * V),
                                   all.begin() + static_cast<std::ptrdiff_t>((i + 1) * V));
      worst = std::max(worst, max_abs_diff(row, l));
    }
    // Every output element is computed by the same code in both paths: bit-identical.
    CHECK(worst == 0.0f);
    CHECK(batched.position() == static_cast<int>(toks.size()));
  }
}

TEST_CASE("MOD.engine.threads logits do not depend on the thread count", "[gate:MOD]") {
  const Model& m = stories("stories260K.bin");
  std::vector<int> toks{1};
  toks.insert(toks.end(), kGreedy64.begin(), kGreedy64.end());
  Engine e1(m, opts(KvFormat{HalfFormat::int8, HalfFormat::int8}, 1));
  Engine e3(m, opts(KvFormat{HalfFormat::int8, HalfFormat::int8}, 3));
  CHECK(e3.stats().threads == 3);
  CHECK(e1.forward_all_logits(toks) == e3.forward_all_logits(toks));
}

TEST_CASE("MOD.engine.presets every KV preset decodes stories260K (head_dim 8)", "[gate:MOD]") {
  const Model& m = stories("stories260K.bin");
  REQUIRE(m.config.head_dim == 8);
  Engine ref(m, opts(KvFormat{HalfFormat::f32, HalfFormat::f32}));
  const auto ref_ids = greedy(ref, 1, 32);
  for (const Preset& p : presets()) {
    INFO("preset " << p.name);
    Engine e(m, opts(p.fmt));
    CHECK(e.stats().effective_kv == std::string(p.name));
    const auto ids = greedy(e, 1, 32);
    // A quantized store holds fewer bytes than f32 for the same tokens.
    REQUIRE(e.position() == ref.position());
    const std::size_t f32_bytes = ref.stats().kv_bytes;
    if (p.fmt.k == HalfFormat::f32 && p.fmt.v == HalfFormat::f32) CHECK(e.stats().kv_bytes == f32_bytes);
    else CHECK(e.stats().kv_bytes < f32_bytes);
    const auto& l = e.decode(ids.back());
    for (float x : l) REQUIRE(std::isfinite(x));
    // The first tokens of the story survive every format on this model.
    CHECK(std::vector<int>(ids.begin(), ids.begin() + 4) == std::vector<int>(ref_ids.begin(), ref_ids.begin() + 4));
  }
}

TEST_CASE("MOD.engine.sampler seeded sampling is reproducible and respects top-k", "[gate:MOD]") {
  const Model& m = stories("stories260K.bin");
  Engine e(m, opts(KvFormat{HalfFormat::f32, HalfFormat::f32}));
  SamplerOptions so;
  so.temperature = 1.0f;
  so.top_p = 0.9f;
  so.seed = 1234;
  const int bos = 1;
  const auto a = e.generate(std::span<const int>(&bos, 1), 40, so);
  e.reset();
  const auto b = e.generate(std::span<const int>(&bos, 1), 40, so);
  CHECK(a.tokens == b.tokens);
  so.seed = 99;
  e.reset();
  const auto c = e.generate(std::span<const int>(&bos, 1), 40, so);
  CHECK(a.tokens != c.tokens);
  // top_k = 1 is greedy whatever the temperature.
  so.top_k = 1;
  so.top_p = 1.0f;
  e.reset();
  const auto d = e.generate(std::span<const int>(&bos, 1), 20, so);
  CHECK(d.tokens == std::vector<int>(kGreedy64.begin(), kGreedy64.begin() + 20));

  // top_k = k admits exactly the k most probable ids. Logits 10, 9.9, 9.8, 9.7, then a cliff: at
  // temperature 1 the 4th id carries ~23% of the mass, so a k+1 sampler draws it within a few of the
  // 2000 draws (probability of missing it < 1e-200); a correct k = 3 sampler never does.
  std::vector<float> logits(64, -20.0f);
  logits[7] = 10.0f;
  logits[3] = 9.9f;
  logits[50] = 9.8f;
  logits[11] = 9.7f;
  SamplerOptions tk;
  tk.temperature = 1.0f;
  tk.top_k = 3;
  tk.seed = 2024;
  Sampler s(64, tk);
  std::map<int, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[s.sample(logits)];
  INFO("top_k=3 over logits {7:10, 3:9.9, 50:9.8, 11:9.7, rest -20}, seed 2024, 2000 draws");
  CHECK(seen.count(11) == 0);
  CHECK(seen.size() == 3);  // anti-vacuity: the sampler is not greedy, all three admitted ids appear
}

// MOD.engine.options_refused: engine options that cannot describe a KV pool, and a generate with
// no prompt, are refused with an EngineError naming the option and the numbers (bound: the exact
// text); the accepted neighbours (one block's bytes, one scale per layer) construct.
TEST_CASE("MOD.engine.options_refused a pool budget buying no block, per-layer scales of the wrong count, no prompt",
          "[gate:MOD]") {
  const Model& m = stories("stories260K.bin");
  auto has_text = [](const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; };
  auto refused = [&](const EngineOptions& o) -> std::string {
    try {
      Engine e(m, o);
    } catch (const EngineError& e) {
      return e.what();
    }
    return "<no EngineError>";
  };
  const KvFormat f32 = *parse_kv_format("f32");
  EngineOptions o = opts(f32);
  o.kv_cache_memory = 100;
  const std::string small = refused(o);
  INFO(small);
  const std::size_t block = static_cast<std::size_t>(m.config.n_layers) * 2 *
                            page_bytes(HalfFormat::f32, {o.block_size, m.config.n_kv_heads, m.config.head_dim});
  CHECK(has_text(small, "--kv-cache-memory 100 bytes buys no KV block of f32 (one block of all layers needs " +
                            std::to_string(block) + " bytes)"));
  o.kv_cache_memory = block;
  CHECK(Engine(m, o).store().config().n_blocks == 1);
  o = opts(f32);
  o.k_scale = {1.0f, 2.0f};
  CHECK(has_text(refused(o), "k_scale has 2 entries; give one, or one per layer (" + std::to_string(m.config.n_layers) + ")"));
  o.k_scale.assign(static_cast<std::size_t>(m.config.n_layers), 1.0f);
  Engine e(m, o);
  const std::vector<int> none;
  std::string msg;
  try {
    e.generate(none, 4, SamplerOptions{});
  } catch (const EngineError& x) {
    msg = x.what();
  }
  CHECK(has_text(msg, ": generate needs at least one prompt token (e.g. BOS)"));
  CHECK(e.generate(std::vector<int>{1}, 2, SamplerOptions{}).tokens.size() == 2);
}

TEST_CASE("MOD.engine.context generation stops at the context, prefill past it is refused", "[gate:MOD]") {
  const Model& m = stories("stories260K.bin");
  EngineOptions o = opts(KvFormat{HalfFormat::f32, HalfFormat::f32});
  o.max_context = 40;
  Engine e(m, o);
  const int bos = 1;
  const auto r = e.generate(std::span<const int>(&bos, 1), 100, SamplerOptions{});
  CHECK(r.stop_reason == "context_full");
  CHECK(e.position() == 40);
  std::vector<int> more(5, 300);
  CHECK_THROWS_AS(e.prefill(more), EngineError);
  CHECK_THROWS_AS(e.decode(-1), EngineError);

  // The boundary itself: a prefill that ends exactly at the context is accepted, one token more is not.
  Engine f(m, o);
  std::vector<int> fill(39, 300);
  fill[0] = bos;
  f.prefill(fill);
  std::vector<int> two(2, 300);
  CHECK_THROWS_AS(f.prefill(two), EngineError);
  CHECK(f.position() == 39);
  std::vector<int> one(1, 300);
  CHECK_NOTHROW(f.prefill(one));
  CHECK(f.position() == 40);
}

TEST_CASE("MOD.tokenizer.sp encode/decode as llama2.c run.c (tok512.bin and GGUF metadata)", "[gate:MOD]") {
  for (const char* file : {"stories260K.bin", "stories260K.gguf"}) {
    INFO("model " << file);
    const Model& m = stories(file);
    REQUIRE(m.tokenizer != nullptr);
    const Tokenizer& t = *m.tokenizer;
    CHECK(t.vocab_size() == 512);
    CHECK(t.bos_id() == 1);
    CHECK(t.eos_id() == 2);
    // ' Once',' upon',' a',' time' are ids 403 407 261 378 (README).
    CHECK(t.encode("Once upon a time", true) == std::vector<int>{1, 403, 407, 261, 378});
    CHECK(t.encode("Once upon a time", false) == std::vector<int>{403, 407, 261, 378});
    CHECK(t.encode("", true) == std::vector<int>{1});
    // Byte fallback: a newline is the raw byte token <0x0A> (id 3 + 10), decoded to the byte.
    const auto nl = t.encode("\n", false);
    CHECK(std::find(nl.begin(), nl.end(), 13) != nl.end());
    CHECK(t.decode_piece(426, 13) == "\n");
    // Leading space stripped after BOS only.
    CHECK(t.decode_piece(1, 403) == "Once");
    CHECK(t.decode_piece(426, 403) == " Once");
    // Round trip of text that needs merges and byte fallback (UTF-8 outside the vocab).
    const std::string s = "Lily saw a big red ball. \xC3\xA9t\xC3\xA9!";
    const auto ids = t.encode(s, true);
    std::string back;
    for (std::size_t i = 1; i < ids.size(); ++i) back += t.decode_piece(ids[i - 1], ids[i]);
    CHECK(back == s);
  }
}

// ---- loader robustness ------------------------------------------------------------------------

namespace {

std::vector<std::uint8_t> slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<std::uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() / ("kvgate_gate_model_" + std::to_string(::getpid()));
    fs::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string write(const std::string& name, const std::vector<std::uint8_t>& bytes) const {
    const fs::path p = dir / name;
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return p.string();
  }
};

template <class T>
void put(std::vector<std::uint8_t>& b, std::size_t off, T v) {
  REQUIRE(off + sizeof(T) <= b.size());
  std::memcpy(b.data() + off, &v, sizeof(T));
}
template <class T>
T get(const std::vector<std::uint8_t>& b, std::size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;
}

// Offset of the GGUF string (u64 length + bytes) equal to `s`; the file holds it exactly once.
std::size_t find_gguf_string(const std::vector<std::uint8_t>& b, const std::string& s) {
  std::vector<std::uint8_t> pat(8 + s.size());
  const std::uint64_t n = s.size();
  std::memcpy(pat.data(), &n, 8);
  std::memcpy(pat.data() + 8, s.data(), s.size());
  std::size_t found = 0, count = 0;
  for (auto it = std::search(b.begin(), b.end(), pat.begin(), pat.end()); it != b.end();
       it = std::search(it + 1, b.end(), pat.begin(), pat.end())) {
    found = static_cast<std::size_t>(it - b.begin());
    ++count;
  }
  REQUIRE(count == 1);
  return found;
}

// Tensor info fields after the name: n_dims u32, dims u64[n], type u32, offset u64.
struct TensorInfoAt {
  std::size_t n_dims, dims, type, offset;
};
TensorInfoAt tensor_info(const std::vector<std::uint8_t>& b, const std::string& name) {
  const std::size_t p = find_gguf_string(b, name) + 8 + name.size();
  const auto nd = get<std::uint32_t>(b, p);
  REQUIRE(nd >= 1);
  REQUIRE(nd <= 4);
  return {p, p + 4, p + 4 + 8 * nd, p + 8 + 8 * nd};
}

// Runs the loader and returns the ModelError message, or the LimitError one of a size over its
// limit (fails the test on no error / another type).
std::string load_error(const std::string& path, const std::string& tok = {}) {
  try {
    (void)load_model(path, tok);
  } catch (const ModelError& e) {
    return e.what();
  } catch (const limits::LimitError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected ModelError, got another exception: " << e.what());
  }
  FAIL("expected ModelError for " << path << ", the file loaded");
  return {};
}

void check_message(const std::string& msg, const std::string& path, const std::string& field) {
  INFO("message: " << msg);
  CHECK(msg.find(path) != std::string::npos);
  CHECK(msg.find(field) != std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);  // one line
}

}  // namespace

TEST_CASE("MOD.loader.llama2c corrupted llama2.c checkpoints and tokenizers give clear errors", "[gate:MOD][loader]") {
  const std::string bin = need_model("stories260K/stories260K.bin");
  const std::string tok = need_model("stories260K/tok512.bin");
  const auto good = slurp(bin);
  REQUIRE(good.size() == 1056540);
  TempDir td;
  SECTION("truncated") {
    auto b = good;
    b.resize(b.size() / 2);
    const auto p = td.write("trunc.bin", b);
    check_message(load_error(p), p, "truncated");
  }
  SECTION("header only") {
    const auto p = td.write("hdr.bin", std::vector<std::uint8_t>(good.begin(), good.begin() + 20));
    check_message(load_error(p), p, "28-byte llama2.c header");
  }
  SECTION("absurd dim") {
    auto b = good;
    put<std::int32_t>(b, 0, 1 << 30);
    const auto p = td.write("dim.bin", b);
    check_message(load_error(p), p, "dim");
  }
  SECTION("negative n_layers") {
    auto b = good;
    put<std::int32_t>(b, 8, -5);
    const auto p = td.write("layers.bin", b);
    check_message(load_error(p), p, "n_layers");
  }
  SECTION("n_heads not a multiple of n_kv_heads") {
    auto b = good;
    put<std::int32_t>(b, 16, 3);
    const auto p = td.write("kvh.bin", b);
    check_message(load_error(p), p, "n_kv_heads");
  }
  SECTION("extra bytes (size mismatch)") {
    auto b = good;
    b.resize(b.size() + 12, 0);
    const auto p = td.write("extra.bin", b);
    check_message(load_error(p), p, "size mismatch");
  }
  SECTION("newer export version") {
    auto b = good;
    put<std::uint32_t>(b, 0, 0x616b3432);
    put<std::int32_t>(b, 4, 1);
    const auto p = td.write("v1.bin", b);
    check_message(load_error(p), p, "version");
  }
  SECTION("missing file") {
    const auto p = (td.dir / "nope.bin").string();
    check_message(load_error(p), p, "no such file");
  }
  SECTION("tokenizer truncated") {
    auto t = slurp(tok);
    t.resize(t.size() - 100);
    const auto tp = td.write("tok_trunc.bin", t);
    check_message(load_error(bin, tp), tp, "truncated");
  }
  SECTION("tokenizer absurd token length") {
    auto t = slurp(tok);
    put<std::int32_t>(t, 4 + 4, 1 << 20);  // length of token 0
    const auto tp = td.write("tok_len.bin", t);
    check_message(load_error(bin, tp), tp, "length");
  }
  SECTION("tokenizer for another vocab (trailing bytes)") {
    auto t = slurp(tok);
    t.insert(t.end(), 9, 0);
    const auto tp = td.write("tok_more.bin", t);
    check_message(load_error(bin, tp), tp, "trailing bytes");
  }
}

TEST_CASE("MOD.loader.gguf corrupted GGUF files give clear errors", "[gate:MOD][loader]") {
  const std::string gguf = need_model("stories260K/stories260K.gguf");
  const auto good = slurp(gguf);
  REQUIRE(good.size() == 1185376);
  TempDir td;
  SECTION("wrong magic") {
    auto b = good;
    std::memcpy(b.data(), "GGUX", 4);
    const auto p = td.write("magic.gguf", b);
    check_message(load_error(p), p, "wrong magic");
  }
  SECTION("unsupported version") {
    auto b = good;
    put<std::uint32_t>(b, 4, 1);
    const auto p = td.write("v1.gguf", b);
    check_message(load_error(p), p, "version 1");
  }
  SECTION("truncated in the metadata") {
    const auto p = td.write("trunc_meta.gguf", std::vector<std::uint8_t>(good.begin(), good.begin() + 3000));
    check_message(load_error(p), p, "truncated");
  }
  SECTION("truncated in the tensor data") {
    const auto p = td.write("trunc_data.gguf", std::vector<std::uint8_t>(good.begin(), good.end() - 1000));
    check_message(load_error(p), p, "past the end");
  }
  SECTION("tensor offset past the end") {
    auto b = good;
    const auto ti = tensor_info(b, "blk.2.ffn_up.weight");
    put<std::uint64_t>(b, ti.offset, std::uint64_t{1} << 40);
    const auto p = td.write("offset.gguf", b);
    const auto msg = load_error(p);
    check_message(msg, p, "past the end");
    CHECK(msg.find("blk.2.ffn_up.weight") != std::string::npos);
  }
  SECTION("misaligned tensor offset") {
    auto b = good;
    const auto ti = tensor_info(b, "blk.1.attn_q.weight");
    put<std::uint64_t>(b, ti.offset, get<std::uint64_t>(b, ti.offset) + 4);
    const auto p = td.write("align.gguf", b);
    check_message(load_error(p), p, "alignment");
  }
  SECTION("absurd tensor count") {
    auto b = good;
    put<std::uint64_t>(b, 8, std::uint64_t{1} << 62);
    const auto p = td.write("count.gguf", b);
    check_message(load_error(p), p, "tensor_count");
  }
  SECTION("absurd metadata array length") {
    auto b = good;
    const std::string key = "tokenizer.ggml.tokens";
    const std::size_t v = find_gguf_string(b, key) + 8 + key.size();
    REQUIRE(get<std::uint32_t>(b, v) == 9);      // array
    REQUIRE(get<std::uint32_t>(b, v + 4) == 8);  // of strings
    put<std::uint64_t>(b, v + 8, std::uint64_t{1} << 60);
    const auto p = td.write("array.gguf", b);
    check_message(load_error(p), p, "tokenizer.ggml.tokens");
  }
  SECTION("absurd string length") {
    auto b = good;
    const std::size_t k = find_gguf_string(b, "general.architecture");
    put<std::uint64_t>(b, k, std::uint64_t{1} << 50);
    const auto p = td.write("strlen.gguf", b);
    check_message(load_error(p), p, "claims");
  }
  SECTION("absurd tensor dimension") {
    auto b = good;
    const auto ti = tensor_info(b, "output_norm.weight");
    put<std::uint64_t>(b, ti.dims, std::uint64_t{1} << 55);
    const auto p = td.write("dim.gguf", b);
    check_message(load_error(p), p, "output_norm.weight");
  }
  SECTION("missing tensor") {
    auto b = good;
    const std::size_t at = find_gguf_string(b, "blk.3.attn_v.weight") + 8;
    b[at + 11] = 'X';  // blk.3.attn_X.weight
    const auto p = td.write("missing.gguf", b);
    const auto msg = load_error(p);
    check_message(msg, p, "blk.3.attn_v.weight");
    CHECK(msg.find("missing") != std::string::npos);
  }
  SECTION("mismatched shape") {
    auto b = good;
    const auto ti = tensor_info(b, "blk.0.attn_k.weight");
    REQUIRE(get<std::uint64_t>(b, ti.dims + 8) == 32);
    put<std::uint64_t>(b, ti.dims + 8, 16);  // [64, 32] -> [64, 16]
    const auto p = td.write("shape.gguf", b);
    const auto msg = load_error(p);
    check_message(msg, p, "blk.0.attn_k.weight");
    CHECK(msg.find("expected [64, 32]") != std::string::npos);
  }
  SECTION("unsupported tensor type") {
    auto b = good;
    const auto ti = tensor_info(b, "blk.4.ffn_down.weight");
    put<std::uint32_t>(b, ti.type, 12);  // Q4_K
    const auto p = td.write("type.gguf", b);
    check_message(load_error(p), p, "Q4_K");
  }
  SECTION("wrong architecture") {
    auto b = good;
    const std::string key = "general.architecture";
    const std::size_t v = find_gguf_string(b, key) + 8 + key.size() + 4 + 8;  // type u32, len u64
    std::memcpy(b.data() + v, "mamba", 5);
    const auto p = td.write("arch.gguf", b);
    check_message(load_error(p), p, "general.architecture");
  }
}

TEST_CASE("MOD.loader.gguf_types F16/BF16/Q8_0/Q4_0 tensors load and dequantize as ggml", "[gate:MOD][loader]") {
  // Rewrites the F32 GGUF with one tensor converted, then compares against the exact dequantization.
  const std::string gguf = need_model("stories260K/stories260K.gguf");
  const auto good = slurp(gguf);
  const Model& ref = stories("stories260K.gguf");
  TempDir td;
  // blk.0.ffn_gate.weight: ne = [64, 172], F32; the data offset is relative to the data section.
  const auto ti = tensor_info(good, "blk.0.ffn_gate.weight");
  const std::uint64_t rel = get<std::uint64_t>(good, ti.offset);
  // The data section starts at the first 32-aligned byte after the last tensor info; find it from
  // the known F32 bytes of the tensor.
  const std::vector<float>& w = ref.weights.layers[0].w1;
  REQUIRE(w.size() == 64u * 172u);
  const auto* wb = reinterpret_cast<const std::uint8_t*>(w.data());
  const auto it = std::search(good.begin(), good.end(), wb, wb + w.size() * 4);
  REQUIRE(it != good.end());
  const std::size_t abs = static_cast<std::size_t>(it - good.begin());
  REQUIRE(abs >= rel);
  struct Case {
    std::uint32_t type;
    const char* name;
  };
  for (const Case c : {Case{1, "F16"}, Case{30, "BF16"}, Case{8, "Q8_0"}, Case{2, "Q4_0"}}) {
    INFO("type " << c.name);
    auto b = good;
    put<std::uint32_t>(b, ti.type, c.type);
    std::vector<float> expect(w.size());
    std::vector<std::uint8_t> enc;
    if (c.type == 1 || c.type == 30) {
      for (std::size_t i = 0; i < w.size(); ++i) {
        const std::uint16_t h = c.type == 1 ? f32_to_f16_rne(w[i]) : f32_to_bf16_rne(w[i]);
        enc.push_back(static_cast<std::uint8_t>(h & 0xFF));
        enc.push_back(static_cast<std::uint8_t>(h >> 8));
        expect[i] = c.type == 1 ? f16_to_f32(h) : bf16_to_f32(h);
      }
    } else {
      // The KV codecs produce llama.cpp block_q8_0 / block_q4_0 bytes (docs/FORMATS.md).
      const HalfFormat hf = c.type == 8 ? HalfFormat::q8_0 : HalfFormat::q4_0;
      const PageGeometry g{1, 1, 64};
      std::vector<std::uint8_t> page(page_bytes(hf, g));
      for (std::size_t r = 0; r < 172; ++r) {
        quantize_token(hf, g, 0, w.data() + r * 64, 1.0f, page.data());
        enc.insert(enc.end(), page.begin(), page.end());
        dequantize_token(hf, g, 0, page.data(), 1.0f, expect.data() + r * 64);
      }
    }
    std::copy(enc.begin(), enc.end(), b.begin() + static_cast<std::ptrdiff_t>(abs));
    const auto p = td.write(std::string("t_") + c.name + ".gguf", b);
    const Model m = load_model(p);
    CHECK(m.weights.layers[0].w1 == expect);
    CHECK(m.weights.layers[0].w3 == ref.weights.layers[0].w3);  // neighbours untouched
    CHECK(m.fingerprint != ref.fingerprint);
  }
}

TEST_CASE("MOD.loader.fingerprint same weights, same fingerprint; any change, another", "[gate:MOD][loader]") {
  const Model& a = stories("stories260K.bin");
  const Model& b = stories("stories260K.gguf");
  CHECK(a.fingerprint.size() == 16);
  // Same weights, but the GGUF says context 2048 and ships output.weight (a separate classifier).
  CHECK(model_fingerprint(a.config, a.weights) == a.fingerprint);
  ModelWeights w = a.weights;
  w.layers[3].wv[17] = std::nextafter(w.layers[3].wv[17], 1.0f);
  CHECK(model_fingerprint(a.config, w) != a.fingerprint);
  ModelConfig c = a.config;
  c.rope_theta = 500000.0f;
  CHECK(model_fingerprint(c, a.weights) != a.fingerprint);
  CHECK(!b.fingerprint.empty());
}

// ---- attention's page read --------------------------------------------------------------------

TEST_CASE("ORA.dequant_rows attention's vectorized page read == dequantize_token, every half format",
          "[gate:ORA]") {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Small pages, and the directed geometries (gates/common/populations.hpp: up to 16 KV heads and
  // head_dim 512, pages of 16 and 32): pages of more than 256 cells (token x KV head), where a reader
  // that works through a page's per-cell scales in chunks must move to each chunk's own scales.
  std::vector<PageGeometry> geos = {{16, 4, 8}, {16, 8, 64}, {8, 2, 128}, {4, 3, 32}, {16, 1, 256}, {5, 4, 16}};
  for (const gates::DirectedGeometry dg : gates::kDirectedGeometries)
    for (const int B : gates::kDirectedBlocks) geos.push_back({B, dg.n_kv_heads, dg.head_dim});
  int big_pages = 0;
  for (HalfFormat f : all_half_formats())
    for (const PageGeometry& g : geos) {
      if (!supports(f, g).ok) continue;
      big_pages += f == HalfFormat::int8 && g.block_size * g.n_kv_heads > 256;
      INFO("format " << name(f) << " B=" << g.block_size << " H=" << g.n_kv_heads << " D=" << g.head_dim);
      const int HD = g.row_elems();
      std::vector<std::uint8_t> page(page_bytes(f, g));
      std::vector<float> row(static_cast<std::size_t>(HD));
      const float ts = 0.37f;
      for (int t = 0; t < g.block_size; ++t) {
        for (int i = 0; i < HD; ++i) row[static_cast<std::size_t>(i)] = nd(rng) * (1.0f + static_cast<float>(i % 7));
        if (t == 2) row[3] = 0.0f, row[4] = -0.0f, row[5] = 6e-8f;  // zero, negative zero, f16 subnormal
        quantize_token(f, g, t, row.data(), ts, page.data());
      }
      for (int n : {1, g.block_size / 2, g.block_size}) {
        if (n < 1) continue;
        std::vector<float> fast(static_cast<std::size_t>(n) * HD), ref(fast.size());
        dequantize_rows(f, g, n, page.data(), ts, fast.data());
        for (int t = 0; t < n; ++t) dequantize_token(f, g, t, page.data(), ts, ref.data() + static_cast<std::size_t>(t) * HD);
        CHECK(std::memcmp(fast.data(), ref.data(), fast.size() * sizeof(float)) == 0);
      }
    }
  CHECK(big_pages >= 2);  // int8 read pages of more than 256 cells
  // Every fp8 code (subnormals, -0, NaN, e5m2's inf) read by the vectorized loader == the scalar
  // decode, at tensor scales 1 and 0.37, bitwise.
  for (HalfFormat f : {HalfFormat::fp8_e4m3, HalfFormat::fp8_e5m2})
    for (float ts : {1.0f, 0.37f}) {
      INFO("all 256 codes of " << name(f) << ", tensor scale " << ts);
      const PageGeometry g8{1, 1, 256};
      std::vector<std::uint8_t> codes(256);
      for (int i = 0; i < 256; ++i) codes[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i);
      std::vector<float> fast(256), ref(256);
      dequantize_rows(f, g8, 1, codes.data(), ts, fast.data());
      dequantize_token(f, g8, 0, codes.data(), ts, ref.data());
      CHECK(std::memcmp(fast.data(), ref.data(), fast.size() * sizeof(float)) == 0);
    }
  // int8 pages at head_dim 8 (the AVX2 and AVX-512 kernels of that shape) whose cell scales run
  // through all 65536 binary16 codes (subnormals, inf, every NaN payload, signaling or quiet): the
  // vectorized read == dequantize_token, bitwise (a NaN scale gives the same NaN product however
  // it was widened). Pages of 16 x 4 cells: the AVX-512 kernel's 16-cell groups, whole.
  {
    const PageGeometry g8{16, 4, 8};
    std::vector<std::uint8_t> page(page_bytes(HalfFormat::int8, g8));
    const std::size_t codes_bytes = static_cast<std::size_t>(g8.block_size) * g8.row_elems();
    std::size_t differ = 0;
    for (int base = 0; base < 65536; base += 64) {
      for (std::size_t i = 0; i < codes_bytes; ++i) page[i] = static_cast<std::uint8_t>((i * 37 + base) % 255);
      for (int c = 0; c < 64; ++c) {
        page[codes_bytes + 2 * static_cast<std::size_t>(c)] = static_cast<std::uint8_t>((base + c) & 0xFF);
        page[codes_bytes + 2 * static_cast<std::size_t>(c) + 1] = static_cast<std::uint8_t>((base + c) >> 8);
      }
      std::vector<float> fast(codes_bytes), ref(codes_bytes);
      dequantize_rows(HalfFormat::int8, g8, g8.block_size, page.data(), 1.0f, fast.data());
      for (int t = 0; t < g8.block_size; ++t)
        dequantize_token(HalfFormat::int8, g8, t, page.data(), 1.0f, ref.data() + static_cast<std::size_t>(t) * g8.row_elems());
      differ += std::memcmp(fast.data(), ref.data(), fast.size() * sizeof(float)) != 0;
    }
    INFO("int8 pages (head_dim 8) over every scale code whose vectorized read differs in its bits: " << differ);
    CHECK(differ == 0);
  }
  // The f16 widening over all 65536 codes (incl. subnormals, inf, NaN payloads) is exact.
  const PageGeometry g{1, 1, 65536};
  std::vector<std::uint8_t> page(65536 * 2);
  for (int i = 0; i < 65536; ++i) {
    page[static_cast<std::size_t>(2 * i)] = static_cast<std::uint8_t>(i & 0xFF);
    page[static_cast<std::size_t>(2 * i + 1)] = static_cast<std::uint8_t>(i >> 8);
  }
  std::vector<float> fast(65536), ref(65536);
  dequantize_rows(HalfFormat::f16, g, 1, page.data(), 1.0f, fast.data());
  dequantize_token(HalfFormat::f16, g, 0, page.data(), 1.0f, ref.data());
  CHECK(std::memcmp(fast.data(), ref.data(), fast.size() * sizeof(float)) == 0);
}

// ---- a GGUF written from scratch: v2, non-default alignment, F16/Q8_0/Q4_0 weights, gpt2 BPE --

namespace {

SynthTensor make_tensor(const std::string& name, std::vector<std::uint64_t> ne, std::uint32_t type, std::mt19937& rng,
                        float amp) {
  std::normal_distribution<float> nd(0.0f, amp);
  std::size_t n = 1;
  for (auto e : ne) n *= e;
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  if (name.find("norm") != std::string::npos)
    for (auto& v : x) v = 1.0f + 0.1f * v;
  SynthTensor t{name, ne, type, {}, std::vector<float>(n)};
  if (type == 0) {
    t.data.resize(n * 4);
    std::memcpy(t.data.data(), x.data(), n * 4);
    t.expect = x;
  } else if (type == 1) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t h = f32_to_f16_rne(x[i]);
      t.data.push_back(static_cast<std::uint8_t>(h & 0xFF));
      t.data.push_back(static_cast<std::uint8_t>(h >> 8));
      t.expect[i] = f16_to_f32(h);
    }
  } else {
    const HalfFormat hf = type == 8 ? HalfFormat::q8_0 : HalfFormat::q4_0;
    const int row = static_cast<int>(ne[0]);
    const PageGeometry g{1, 1, row};
    std::vector<std::uint8_t> page(page_bytes(hf, g));
    for (std::size_t r = 0; r < n / static_cast<std::size_t>(row); ++r) {
      quantize_token(hf, g, 0, x.data() + r * row, 1.0f, page.data());
      t.data.insert(t.data.end(), page.begin(), page.end());
      dequantize_token(hf, g, 0, page.data(), 1.0f, t.expect.data() + r * row);
    }
  }
  return t;
}

// The nine tensors of llama layer `p` ("blk.N.") of dim 32, 2 KV heads of 8, FFN 64, in the order
// attn_norm, q, k, v, output, ffn_norm, gate, up, down, with the ggml types `type` in that order.
void push_llama_layer(std::vector<SynthTensor>& ts, const std::string& p, const std::uint32_t (&type)[9], std::mt19937& rng) {
  ts.push_back(make_tensor(p + "attn_norm.weight", {32}, type[0], rng, 1.0f));
  ts.push_back(make_tensor(p + "attn_q.weight", {32, 32}, type[1], rng, 0.2f));
  ts.push_back(make_tensor(p + "attn_k.weight", {32, 16}, type[2], rng, 0.2f));
  ts.push_back(make_tensor(p + "attn_v.weight", {32, 16}, type[3], rng, 0.2f));
  ts.push_back(make_tensor(p + "attn_output.weight", {32, 32}, type[4], rng, 0.2f));
  ts.push_back(make_tensor(p + "ffn_norm.weight", {32}, type[5], rng, 1.0f));
  ts.push_back(make_tensor(p + "ffn_gate.weight", {32, 64}, type[6], rng, 0.2f));
  ts.push_back(make_tensor(p + "ffn_up.weight", {32, 64}, type[7], rng, 0.2f));
  ts.push_back(make_tensor(p + "ffn_down.weight", {64, 32}, type[8], rng, 0.2f));
}

}  // namespace

TEST_CASE("MOD.loader.gguf_synthetic GGUF v2, alignment 64, F16/Q8_0/Q4_0 weights, gpt2 byte-level BPE",
          "[gate:MOD][loader]") {
  const int dim = 32, hidden = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 8;
  // Byte-level vocabulary: 256 byte tokens, merges spelling "hello" and " world", two specials.
  std::vector<std::string> vocab;
  for (int c = 0; c < 256; ++c) vocab.push_back(byte_to_unicode_utf8(static_cast<std::uint8_t>(c)));
  const std::string G = byte_to_unicode_utf8(' ');
  const std::vector<std::string> merges = {"h e",     "he l",      "hel l",       "hell o",       G + " w",
                                           G + "w o", G + "wo r",  G + "wor l",   G + "worl d"};
  for (const auto& m : merges) vocab.push_back(m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1));
  vocab.push_back("<s>");
  vocab.push_back("</s>");
  const int V = static_cast<int>(vocab.size()), bos = V - 2, eos = V - 1;
  std::vector<std::int32_t> types(static_cast<std::size_t>(V), 1);
  types[static_cast<std::size_t>(bos)] = types[static_cast<std::size_t>(eos)] = 3;  // control

  std::mt19937 rng(11);
  std::vector<SynthTensor> ts;
  ts.push_back(make_tensor("token_embd.weight", {32, static_cast<std::uint64_t>(V)}, 8, rng, 0.5f));
  ts.push_back(make_tensor("output_norm.weight", {32}, 0, rng, 1.0f));
  for (int l = 0; l < layers; ++l) push_llama_layer(ts, "blk." + std::to_string(l) + ".", {0, 1, 1, 2, 8, 0, 1, 1, 8}, rng);
  constexpr std::size_t kAlign = 64;
  GgufWriter w;
  w.header(2, ts.size(), 17);
  w.kv_str("general.architecture", "llama");
  w.kv_u32("general.alignment", kAlign);
  w.llama_shape(dim, hidden, layers, heads, kv_heads, 64, 500000.0f);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  w.kv_str("tokenizer.ggml.model", "gpt2");
  w.kv_str("tokenizer.ggml.pre", "gpt2");
  w.kv_strs("tokenizer.ggml.tokens", vocab);
  w.kv_i32s("tokenizer.ggml.token_type", types);
  w.kv_strs("tokenizer.ggml.merges", merges);
  w.kv_u32("tokenizer.ggml.bos_token_id", static_cast<std::uint32_t>(bos));
  w.kv_bool("tokenizer.ggml.add_bos_token", true);  // flipped to false below
  w.tensors(ts, kAlign);
  TempDir td;
  const auto path = td.write("synthetic.gguf", w.b);
  const Model m = load_model(path);
  CHECK(m.source_kind == "gguf");
  CHECK(m.config.dim == dim);
  CHECK(m.config.hidden_dim == hidden);
  CHECK(m.config.n_layers == layers);
  CHECK(m.config.n_kv_heads == kv_heads);
  CHECK(m.config.head_dim == head_dim);
  CHECK(m.config.vocab_size == V);
  CHECK(m.config.max_seq_len == 64);
  CHECK(m.config.rope_theta == 500000.0f);
  CHECK(m.config.rms_eps == 1e-6f);
  CHECK(m.config.rope_style == RopeStyle::interleaved);
  CHECK(m.config.tied_embeddings);
  CHECK(m.config.bos_id == bos);
  CHECK(m.weights.tok_embeddings == ts[0].expect);
  CHECK(m.weights.final_norm == ts[1].expect);
  CHECK(m.weights.layers[1].wq == ts[2 + 9 + 1].expect);
  CHECK(m.weights.layers[1].wv == ts[2 + 9 + 3].expect);
  CHECK(m.weights.layers[1].w2 == ts[2 + 9 + 8].expect);
  // gpt2 byte-level BPE from the metadata: merges, specials, byte round trip.
  REQUIRE(m.tokenizer != nullptr);
  const Tokenizer& tok = *m.tokenizer;
  const auto id_of = [&](const std::string& s) {
    return static_cast<int>(std::find(vocab.begin(), vocab.end(), s) - vocab.begin());
  };
  CHECK(tok.encode("hello world", true) == std::vector<int>{bos, id_of("hello"), id_of(G + "world")});
  const std::string text = "hello worlds, caf\xC3\xA9!";
  const auto ids = tok.encode(text, false);
  std::string back;
  for (std::size_t i = 0; i < ids.size(); ++i) back += tok.decode_piece(i ? ids[i - 1] : -1, ids[i]);
  CHECK(back == text);
  // And the model runs through a quantized store.
  Engine e(m, opts(*parse_kv_format("int8")));
  const auto& l = e.prefill(tok.encode("hello world", true));
  for (float x : l) REQUIRE(std::isfinite(x));
  // tokenizer.ggml.add_bos_token = false: no BOS although bos_token_id is declared (llama.cpp's rule).
  {
    auto nobos = w.b;
    const std::string k = "tokenizer.ggml.add_bos_token";
    const std::size_t at = find_gguf_string(nobos, k) + 8 + k.size() + 4;  // the bool's byte
    REQUIRE(nobos.at(at) == 1);
    nobos[at] = 0;
    const Model mn = load_model(td.write("nobos.gguf", nobos));
    REQUIRE(mn.tokenizer);
    CHECK(mn.config.bos_id == bos);
    CHECK_FALSE(mn.tokenizer->adds_bos());
    CHECK(mn.tokenizer->encode("hello world", true) == std::vector<int>{id_of("hello"), id_of(G + "world")});
    CHECK(tok.adds_bos());
  }
  // Version 3 of the same file loads identically; an alignment that is not a power of two is refused.
  auto v3 = w.b;
  put<std::uint32_t>(v3, 4, 3);
  CHECK(load_model(td.write("v3.gguf", v3)).fingerprint == m.fingerprint);
  auto bad = w.b;
  const std::string key = "general.alignment";
  put<std::uint32_t>(bad, find_gguf_string(bad, key) + 8 + key.size() + 4, 48);
  const auto bp = td.write("align48.gguf", bad);
  check_message(load_error(bp), bp, "general.alignment");
}

TEST_CASE("ORA.attn_read attention over a quantized store == attention over f32 rows of its dequantized values",
          "[gate:ORA]") {
  // The fused page readers (K read and transposed in one pass, V rows) must hand attention exactly
  // the values dequantize_token gives: the same attention over an f32 store holding those values
  // is then bit-identical. A wrong scale, head, block or nibble in a reader shows up here.
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Geo {
    int B, H, D;
  };
  for (const Geo geo : {Geo{16, 4, 8}, Geo{16, 2, 64}, Geo{8, 8, 32}, Geo{12, 4, 16}, Geo{16, 1, 128}})
    for (HalfFormat f : all_half_formats()) {
      const PageGeometry g{geo.B, geo.H, geo.D};
      if (!supports(f, g).ok) continue;
      INFO("format " << name(f) << " B=" << geo.B << " H=" << geo.H << " D=" << geo.D);
      const int n_ctx = 3 * geo.B + 5, HD = geo.H * geo.D;
      StoreConfig cq;
      cq.format = {f, f};
      cq.n_layers = 1;
      cq.n_kv_heads = geo.H;
      cq.head_dim = geo.D;
      cq.block_size = geo.B;
      cq.n_blocks = 8;
      cq.k_scale = {0.3f};
      cq.v_scale = {0.05f};
      StoreConfig cf = cq;
      cf.format = {HalfFormat::f32, HalfFormat::f32};
      PagedKvStore sq(cq), sf(cf);
      const SeqId a = sq.create_sequence(), b = sf.create_sequence();
      sq.extend(a, n_ctx);
      sf.extend(b, n_ctx);
      std::vector<float> k(static_cast<std::size_t>(n_ctx) * HD), v(k.size());
      for (std::size_t i = 0; i < k.size(); ++i) k[i] = nd(rng) * (1.0f + static_cast<float>(i % 5)), v[i] = nd(rng);
      sq.write(a, 0, 0, n_ctx, k.data(), HD, v.data(), HD);
      std::vector<float> kd(k.size()), vd(v.size());
      sq.read(a, 0, KvHalf::K, 0, n_ctx, kd.data());
      sq.read(a, 0, KvHalf::V, 0, n_ctx, vd.data());
      sf.write(b, 0, 0, n_ctx, kd.data(), HD, vd.data(), HD);
      for (int n_q : {1, 7}) {
        const int Hq = 2 * geo.H;
        std::vector<float> q(static_cast<std::size_t>(n_q) * Hq * geo.D);
        for (auto& x : q) x = nd(rng);
        const AttentionArgs args{n_q, Hq, n_ctx - n_q, 0.0f};
        std::vector<float> oq(q.size()), of(q.size());
        attention(sq, a, 0, args, q.data(), oq.data());
        attention(sf, b, 0, args, q.data(), of.data());
        CHECK(std::memcmp(oq.data(), of.data(), oq.size() * sizeof(float)) == 0);
      }
    }
}

// ---- GGUF RoPE metadata: rope.scaling.*, rope.dimension_count, the rope_freqs tensor ----------

namespace {

// A tiny F32 llama GGUF (dim 32, 4 heads of 8, 2 KV heads, 1 layer, a 16-token byte-less vocab):
// general.architecture, then the `n_kv` keys `kv` writes, the tensors (`extra` appended).
std::vector<std::uint8_t> tiny_gguf(int n_kv, const std::function<void(GgufWriter&)>& kv,
                                    std::vector<SynthTensor> extra = {}) {
  std::mt19937 rng(5);
  std::vector<SynthTensor> ts;
  ts.push_back(make_tensor("token_embd.weight", {32, 16}, 0, rng, 0.5f));
  ts.push_back(make_tensor("output_norm.weight", {32}, 0, rng, 1.0f));
  const std::string p = "blk.0.";
  for (const auto& [n, a, b] : std::vector<std::tuple<std::string, std::uint64_t, std::uint64_t>>{
           {"attn_q.weight", 32, 32}, {"attn_k.weight", 32, 16}, {"attn_v.weight", 32, 16}, {"attn_output.weight", 32, 32},
           {"ffn_gate.weight", 32, 64}, {"ffn_up.weight", 32, 64}, {"ffn_down.weight", 64, 32}})
    ts.push_back(make_tensor(p + n, {a, b}, 0, rng, 0.2f));
  ts.push_back(make_tensor(p + "attn_norm.weight", {32}, 0, rng, 1.0f));
  ts.push_back(make_tensor(p + "ffn_norm.weight", {32}, 0, rng, 1.0f));
  for (auto& t : extra) ts.push_back(std::move(t));
  GgufWriter w;
  w.header(3, ts.size(), 1 + static_cast<std::uint64_t>(n_kv));
  w.kv_str("general.architecture", "llama");
  kv(w);
  w.tensors(ts, 32);
  return w.b;
}

// tiny_gguf with its seven shape keys; `kv` adds metadata (count given), `extra` tensors.
std::vector<std::uint8_t> rope_gguf(int n_extra_kv, const std::function<void(GgufWriter&)>& kv,
                                    std::vector<SynthTensor> extra = {}) {
  return tiny_gguf(
      7 + n_extra_kv,
      [&](GgufWriter& w) {
        w.llama_shape(32, 64, 1, 4, 2, 64, 10000.0f);
        kv(w);
      },
      std::move(extra));
}

}  // namespace

TEST_CASE("MOD.loader.gguf_rope rope.scaling linear/yarn, partial rotary and rope_freqs read from GGUF", "[gate:MOD][loader]") {
  TempDir td;
  const Model plain = load_model(td.write("plain.gguf", rope_gguf(0, [](GgufWriter&) {})));
  CHECK(plain.config.rope.is_plain());
  const Model lin = load_model(td.write("linear.gguf", rope_gguf(2, [](GgufWriter& w) {
    w.kv_str("llama.rope.scaling.type", "linear");
    w.kv_f32("llama.rope.scaling.factor", 4.0f);
  })));
  CHECK(lin.config.rope.type == RopeType::linear);
  CHECK(lin.config.rope.factor == 4.0);
  CHECK(lin.fingerprint != plain.fingerprint);
  const Model yarn = load_model(td.write("yarn.gguf", rope_gguf(3, [](GgufWriter& w) {
    w.kv_str("llama.rope.scaling.type", "yarn");
    w.kv_f32("llama.rope.scaling.factor", 4.0f);
    w.kv_u32("llama.rope.scaling.original_context_length", 16);
  })));
  CHECK(yarn.config.rope.type == RopeType::yarn);
  CHECK(yarn.config.rope.original_max == 16);
  CHECK(std::fabs(yarn.config.rope.attention_factor - (0.1 * std::log(4.0) + 1)) < 1e-6);  // llama.cpp's mscale
  const Model part = load_model(td.write("partial.gguf", rope_gguf(1, [](GgufWriter& w) {
    w.kv_u32("llama.rope.dimension_count", 4);
  })));
  CHECK(part.config.rope.rotary_dim == 4);
  // llama3 scaling as llama.cpp's converter writes it: rope_freqs.weight, one divisor per pair.
  SynthTensor ff{"rope_freqs.weight", {4}, 0, {}, {1.0f, 1.0f, 3.0f, 8.0f}};
  ff.data.resize(16);
  std::memcpy(ff.data.data(), ff.expect.data(), 16);
  const Model l3 = load_model(td.write("l3.gguf", rope_gguf(0, [](GgufWriter&) {}, {ff})));
  CHECK(l3.config.rope.freq_divisors == ff.expect);
  const RopeFrequencies f3 = rope_frequencies(l3.config.rope, 1e4f, 8, 1), fp = rope_frequencies(plain.config.rope, 1e4f, 8, 1);
  REQUIRE(f3.inv_freq.size() == 4);
  CHECK(f3.inv_freq[0] == fp.inv_freq[0]);
  CHECK(f3.inv_freq[3] == fp.inv_freq[3] / 8.0f);
  // Refusals name the key: an unsupported type, a missing factor, a missing original length.
  const auto bad_type = td.write("bad_type.gguf", rope_gguf(2, [](GgufWriter& w) {
    w.kv_str("llama.rope.scaling.type", "longrope");
    w.kv_f32("llama.rope.scaling.factor", 4.0f);
  }));
  check_message(load_error(bad_type), bad_type, "rope.scaling.type");
  const auto no_factor = td.write("no_factor.gguf", rope_gguf(1, [](GgufWriter& w) {
    w.kv_str("llama.rope.scaling.type", "linear");
  }));
  check_message(load_error(no_factor), no_factor, "rope.scaling.factor");
  const auto no_orig = td.write("no_orig.gguf", rope_gguf(2, [](GgufWriter& w) {
    w.kv_str("llama.rope.scaling.type", "yarn");
    w.kv_f32("llama.rope.scaling.factor", 4.0f);
  }));
  check_message(load_error(no_orig), no_orig, "original_context_length");
}

// MOD.loader.gguf_refusals: each GGUF metadata value, key type, shape key and tensor the loader checks
// is refused naming the file and the key or tensor, with the reason (bound: exact substrings, one
// line). Anti-vacuity: the unedited tiny file loads, and so does every integer / float key written in
// each other GGUF scalar type (the same config and fingerprint).
TEST_CASE("MOD.loader.gguf_refusals bad metadata types, shape keys and tensors are refused by name", "[gate:MOD][loader]") {
  TempDir td;
  const Model plain = load_model(td.write("plain.gguf", rope_gguf(0, [](GgufWriter&) {})));
  // Every integer key in another integer type, the float keys in f64: the same model.
  const Model typed = load_model(td.write("typed.gguf", tiny_gguf(9, [](GgufWriter& w) {
    w.kv_typed<std::uint16_t>("llama.embedding_length", 2, 32);
    w.kv_typed<std::uint64_t>("llama.feed_forward_length", 10, 64);
    w.kv_typed<std::uint8_t>("llama.block_count", 0, 1);
    w.kv_typed<std::int8_t>("llama.attention.head_count", 1, 4);
    w.kv_typed<std::int16_t>("llama.attention.head_count_kv", 3, 2);
    w.kv_typed<std::int64_t>("llama.context_length", 11, 64);
    w.kv_typed<double>("llama.rope.freq_base", 12, 10000.0);
    w.kv_typed<double>("llama.attention.layer_norm_rms_epsilon", 12, 1e-5);
    // An array of arrays (an unread key: parsed, then ignored).
    w.str("general.nested"), w.pod<std::uint32_t>(9), w.pod<std::uint32_t>(9), w.pod<std::uint64_t>(2);
    for (int k = 0; k < 2; ++k) w.pod<std::uint32_t>(4), w.pod<std::uint64_t>(1), w.pod<std::uint32_t>(7);
  })));
  CHECK(typed.config.dim == 32);
  CHECK(typed.config.hidden_dim == 64);
  CHECK(typed.config.n_layers == 1);
  CHECK(typed.config.n_heads == 4);
  CHECK(typed.config.n_kv_heads == 2);
  CHECK(typed.config.max_seq_len == 64);
  CHECK(typed.fingerprint == plain.fingerprint);

  const std::vector<std::uint64_t> shape = {32, 64, 1, 4, 2, 64};
  struct Bad {
    const char* name;
    const char* why;
    std::vector<std::uint8_t> bytes;
  };
  auto one = [](const std::function<void(GgufWriter&)>& f) { return rope_gguf(1, f); };
  auto shaped = [](std::uint32_t dim, std::uint32_t heads, std::uint32_t kv, std::function<void(GgufWriter&)> f = {},
                   int n = 0) {
    return tiny_gguf(7 + n, [=](GgufWriter& w) {
      w.llama_shape(dim, 64, 1, heads, kv, 64, 10000.0f);
      if (f) f(w);
    });
  };
  std::mt19937 rng(9);
  std::vector<Bad> bad = {
      {"elem_type", "'general.x': array element type 13 is not a GGUF type", one([](GgufWriter& w) {
         w.str("general.x"), w.pod<std::uint32_t>(9), w.pod<std::uint32_t>(13), w.pod<std::uint64_t>(0);
       })},
      {"value_type", "'general.x': value type 99 is not a GGUF type",
       one([](GgufWriter& w) { w.kv_typed<std::uint32_t>("general.x", 99, 0); })},
      {"int_type", "'llama.rope.dimension_count' has type string, expected an integer",
       one([](GgufWriter& w) { w.kv_str("llama.rope.dimension_count", "8"); })},
      {"float_type", "'llama.attention.layer_norm_rms_epsilon' has type string, expected a number",
       one([](GgufWriter& w) { w.kv_str("llama.attention.layer_norm_rms_epsilon", "1e-5"); })},
      {"string_type", "'llama.rope.scaling.type' has type u32, expected a string",
       one([](GgufWriter& w) { w.kv_u32("llama.rope.scaling.type", 1); })},
      {"align_type", "'general.alignment' has type f32, expected u32",
       one([](GgufWriter& w) { w.kv_f32("general.alignment", 32.0f); })},
      {"range", "'llama.block_count' = 5000 is outside the plausible range [1, 1024]",
       tiny_gguf(7, [](GgufWriter& w) { w.llama_shape(32, 64, 5000, 4, 2, 64, 10000.0f); })},
      {"kv_divides", "'llama.attention.head_count' = 4 is not a multiple of 'llama.attention.head_count_kv' = 3",
       shaped(32, 4, 3)},
      {"dim_divides", "'llama.embedding_length' = 32 is not a multiple of 'llama.attention.head_count' = 3",
       shaped(32, 3, 1)},
      {"value_length", "'llama.attention.value_length' differs from key_length; not supported",
       shaped(32, 4, 2, [](GgufWriter& w) {
         w.kv_u32("llama.attention.key_length", 8);
         w.kv_u32("llama.attention.value_length", 16);
       }, 2)},
      {"rope_dims", "'llama.rope.dimension_count' = 3 must be an even count in [2, head_dim 8]",
       one([](GgufWriter& w) { w.kv_u32("llama.rope.dimension_count", 3); })},
      {"eps", "rms epsilon and rope.freq_base must be > 0",
       one([](GgufWriter& w) { w.kv_f32("llama.attention.layer_norm_rms_epsilon", 0.0f); })},
      {"vocab_size", "'llama.vocab_size' = 20 but token_embd.weight has 16 rows",
       one([](GgufWriter& w) { w.kv_u32("llama.vocab_size", 20); })},
      {"yarn_attn", "'llama.rope.scaling.yarn_attn_factor' must be > 0 (1 when absent)", rope_gguf(4, [](GgufWriter& w) {
         w.kv_str("llama.rope.scaling.type", "yarn");
         w.kv_f32("llama.rope.scaling.factor", 4.0f);
         w.kv_u32("llama.rope.scaling.original_context_length", 16);
         w.kv_f32("llama.rope.scaling.yarn_attn_factor", 0.0f);
       })},
      {"dup_tensor", "duplicate tensor 'blk.0.attn_norm.weight'",
       rope_gguf(0, [](GgufWriter&) {}, {make_tensor("blk.0.attn_norm.weight", {32}, 0, rng, 1.0f)})},
      {"bias", "layer 0 has some but not all of attn_q/k/v.bias",
       rope_gguf(0, [](GgufWriter&) {}, {make_tensor("blk.0.attn_q.bias", {32}, 0, rng, 0.1f)})},
      {"longrope_type", "rope_factors_long / _short (longrope) together with 'llama.rope.scaling.type' = linear",
       rope_gguf(2, [](GgufWriter& w) {
         w.kv_str("llama.rope.scaling.type", "linear");
         w.kv_f32("llama.rope.scaling.factor", 2.0f);
       }, {make_tensor("rope_factors_long.weight", {4}, 0, rng, 1.0f), make_tensor("rope_factors_short.weight", {4}, 0, rng, 1.0f)})},
      {"longrope_orig", "'llama.rope.scaling.original_context_length' is missing or outside [1, context_length]",
       rope_gguf(0, [](GgufWriter&) {},
                 {make_tensor("rope_factors_long.weight", {4}, 0, rng, 1.0f), make_tensor("rope_factors_short.weight", {4}, 0, rng, 1.0f)})},
  };
  {  // the metadata count (after magic, version and tensor count) far past what the file holds
    auto b = rope_gguf(0, [](GgufWriter&) {});
    put<std::uint64_t>(b, 16, std::uint64_t{1} << 40);
    bad.push_back({"kv_count", "metadata_kv_count = 1099511627776 cannot fit in the file", b});
  }
  {  // token_embd.weight [16, 16] where the model is 32 wide
    auto b = rope_gguf(0, [](GgufWriter&) {});
    put<std::uint64_t>(b, tensor_info(b, "token_embd.weight").dims, 16);
    put<std::uint64_t>(b, tensor_info(b, "token_embd.weight").dims + 8, 32);
    bad.push_back({"embd_shape", "tensor 'token_embd.weight' has shape [16, 32], expected [32, vocab]", b});
  }
  {  // an F32 [32] tensor relabelled Q8_0 [16, 2]: rows of 16 are no whole Q8_0 block
    auto b = rope_gguf(0, [](GgufWriter&) {});
    const auto ti = tensor_info(b, "output_norm.weight");
    put<std::uint64_t>(b, ti.dims, 16);
    b.insert(b.begin() + static_cast<std::ptrdiff_t>(ti.dims + 8), 8, 0);  // a second dimension
    put<std::uint32_t>(b, ti.n_dims, 2);
    put<std::uint64_t>(b, ti.dims + 8, 2);
    put<std::uint32_t>(b, ti.dims + 16, 8);
    bad.push_back({"q8_row", "tensor 'output_norm.weight' of type Q8_0 (8) has ne[0] = 16, not a multiple of 32", b});
  }
  {  // cut right after the tensor infos, before the aligned data start: the first tensor whose bytes
     // exceed the whole file is refused as its info is read (STO.loader.gguf_dims)
    auto b = rope_gguf(0, [](GgufWriter&) {});
    const std::size_t end = tensor_info(b, "blk.0.ffn_norm.weight").offset + 8;
    REQUIRE(end % 32 != 0);
    b.resize(end);
    bad.push_back({"data_start", "more than the whole file: truncated file or corrupted dims", b});
  }
  for (const Bad& b : bad) {
    const auto p = td.write(std::string(b.name) + ".gguf", b.bytes);
    const std::string msg = load_error(p);
    INFO(b.name);
    check_message(msg, "model '" + p + "': ", b.why);
  }
  // A directory is not a GGUF file (load_model would take it as a Hugging Face folder).
  fs::create_directories(td.dir / "dir.gguf");
  std::string msg;
  try {
    load_gguf((td.dir / "dir.gguf").string());
  } catch (const ModelError& e) {
    msg = e.what();
  }
  CHECK(msg == "model '" + (td.dir / "dir.gguf").string() + "': not a regular file");
}

// MOD.loader.gguf_tokenizer: a gpt2 GGUF vocabulary's tokenizer.ggml.pre picks the split (exact ids
// per pre-tokenizer, all four different on the same text), and the tokenizer keys are checked
// against each other and the model (refusals by name).
TEST_CASE("MOD.loader.gguf_tokenizer tokenizer.ggml.pre picks the split; inconsistent tokenizer keys are refused",
          "[gate:MOD][loader]") {
  TempDir td;
  // 16 tokens (the tiny model's vocab): merges "a 1" (rank 0) and "1 2".
  std::vector<std::string> vocab = {"a", "1", "2", "\xC4\xA0", "a1", "12", "<s>", "</s>"};
  while (vocab.size() < 16) vocab.push_back("x" + std::to_string(vocab.size()));
  const int a = 0, one = 1, two = 2, a1 = 4, twelve = 5;
  auto file = [&](const std::string& name, int n_kv, const std::function<void(GgufWriter&)>& kv) {
    return td.write(name + ".gguf", rope_gguf(2 + n_kv, [&](GgufWriter& w) {
      w.kv_strs("tokenizer.ggml.tokens", vocab);
      w.kv_strs("tokenizer.ggml.merges", {"a 1", "1 2"});
      kv(w);
    }));
  };
  auto gpt2 = [&](const std::string& pre) {
    return file("pre_" + (pre.empty() ? std::string("absent") : pre), pre.empty() ? 1 : 2, [&](GgufWriter& w) {
      w.kv_str("tokenizer.ggml.model", "gpt2");
      if (!pre.empty()) w.kv_str("tokenizer.ggml.pre", pre);
    });
  };
  using V = std::vector<int>;
  struct Want {
    const char* pre;
    V a12, n1212;
  };
  for (const Want& c : {Want{"", {a, twelve}, {twelve, twelve}}, Want{"gpt2", {a, twelve}, {twelve, twelve}},
                        Want{"llama-bpe", {a, twelve}, {twelve, one, two}}, Want{"qwen2", {a, one, two}, {one, two, one, two}},
                        Want{"none", {a1, two}, {twelve, twelve}}}) {
    const Model m = load_model(gpt2(c.pre));
    REQUIRE(m.tokenizer);
    INFO("tokenizer.ggml.pre = " << c.pre);
    CHECK(m.tokenizer->encode("a12", false) == c.a12);
    CHECK(m.tokenizer->encode("1212", false) == c.n1212);
  }
  struct Bad {
    const char* name;
    const char* why;
    int n_kv;
    std::function<void(GgufWriter&)> kv;
  };
  const std::vector<Bad> bad = {
      {"pre", "metadata key 'tokenizer.ggml.pre' = 'tekken' is a pre-tokenizer kvgate does not implement", 2,
       [](GgufWriter& w) { w.kv_str("tokenizer.ggml.model", "gpt2"), w.kv_str("tokenizer.ggml.pre", "tekken"); }},
      {"model", "metadata key 'tokenizer.ggml.model' = 'bert' is not supported (llama, gpt2)", 1,
       [](GgufWriter& w) { w.kv_str("tokenizer.ggml.model", "bert"); }},
      {"types", "'tokenizer.ggml.token_type' has 3 entries, 'tokenizer.ggml.tokens' has 16", 2,
       [](GgufWriter& w) { w.kv_str("tokenizer.ggml.model", "gpt2"), w.kv_i32s("tokenizer.ggml.token_type", {1, 1, 1}); }},
      {"types_kind", "'tokenizer.ggml.token_type' has type array of string, expected an array of numbers", 2,
       [](GgufWriter& w) { w.kv_str("tokenizer.ggml.model", "gpt2"), w.kv_strs("tokenizer.ggml.token_type", {"1"}); }},
      {"scores", "'tokenizer.ggml.scores' has 2 entries, 'tokenizer.ggml.tokens' has 16", 2,
       [](GgufWriter& w) { w.kv_str("tokenizer.ggml.model", "llama"), w.kv_i32s("tokenizer.ggml.scores", {0, 0}); }},
      {"add_bos", "metadata key 'tokenizer.ggml.add_bos_token' has type u32, expected a bool", 2,
       [](GgufWriter& w) { w.kv_str("tokenizer.ggml.model", "gpt2"), w.kv_u32("tokenizer.ggml.add_bos_token", 1); }},
  };
  for (const Bad& b : bad) {
    const auto p = file(std::string("bad_") + b.name, b.n_kv, b.kv);
    INFO(b.name);
    check_message(load_error(p), "model '" + p + "': ", b.why);
  }
  vocab.pop_back();  // 15 tokens for a vocab of 16
  const auto p = file("short", 1, [](GgufWriter& w) { w.kv_str("tokenizer.ggml.model", "gpt2"); });
  check_message(load_error(p), "model '" + p + "': ", "'tokenizer.ggml.tokens' has 15 entries, the model's vocab (token_embd) has 16");
}

// MOD.loader.gguf_added_tokens: a GGUF gpt2 vocabulary's added tokens, control (type 3) and
// user-defined (type 4, llama.cpp's USER_DEFINED), are matched whole in the text, never split into
// byte pieces; a normal token (type 1) spelled like one is not. The class it closes: a token type the
// loader drops from the added-token list (user-defined tokens of chat templates, e.g. "<|user|>").
// Exact ids. Anti-vacuity: without the added-token rule the same text encodes to its bytes (the
// plain pieces are checked to be longer than one id).
TEST_CASE("MOD.loader.gguf_added_tokens control and user-defined GGUF tokens are matched whole", "[gate:MOD][loader]") {
  std::vector<std::string> vocab;
  for (int c = 0; c < 256; ++c) vocab.push_back(byte_to_unicode_utf8(static_cast<std::uint8_t>(c)));
  vocab.push_back("<|user|>");   // user-defined
  vocab.push_back("<|ctl|>");    // control
  vocab.push_back("<|a|>");      // user-defined, a prefix of the next one
  vocab.push_back("<|a|>b");     // user-defined
  vocab.push_back("<s>");
  vocab.push_back("</s>");
  const int V = static_cast<int>(vocab.size()), user = 256, ctl = 257, a_tok = 258, ab_tok = 259, bos = V - 2;
  std::vector<std::int32_t> types(static_cast<std::size_t>(V), 1);
  types[static_cast<std::size_t>(user)] = types[static_cast<std::size_t>(a_tok)] = types[static_cast<std::size_t>(ab_tok)] = 4;
  types[static_cast<std::size_t>(ctl)] = types[static_cast<std::size_t>(bos)] = types[static_cast<std::size_t>(V - 1)] = 3;
  std::mt19937 rng(12);
  std::vector<SynthTensor> ts;
  ts.push_back(make_tensor("token_embd.weight", {32, static_cast<std::uint64_t>(V)}, 0, rng, 0.5f));
  ts.push_back(make_tensor("output_norm.weight", {32}, 0, rng, 1.0f));
  push_llama_layer(ts, "blk.0.", {0, 0, 0, 0, 0, 0, 0, 0, 0}, rng);
  GgufWriter w;
  w.header(3, ts.size(), 15);
  w.kv_str("general.architecture", "llama");
  w.llama_shape(32, 64, 1, 4, 2, 64, 10000.0f);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  w.kv_str("tokenizer.ggml.model", "gpt2");
  w.kv_str("tokenizer.ggml.pre", "gpt2");
  w.kv_strs("tokenizer.ggml.tokens", vocab);
  w.kv_i32s("tokenizer.ggml.token_type", types);
  w.kv_strs("tokenizer.ggml.merges", {});
  w.kv_u32("tokenizer.ggml.bos_token_id", static_cast<std::uint32_t>(bos));
  w.tensors(ts, 32);
  TempDir td;
  const Model m = load_model(td.write("added.gguf", w.b));
  REQUIRE(m.tokenizer != nullptr);
  const Tokenizer& tok = *m.tokenizer;
  const auto byte_id = [](char c) { return static_cast<int>(static_cast<unsigned char>(c)); };
  const std::vector<int> ids = tok.encode("a<|user|>b<|ctl|>c", false);
  CHECK(ids == std::vector<int>{byte_id('a'), user, byte_id('b'), ctl, byte_id('c')});
  // Added tokens that prefix each other: the longest one wins where both match.
  CHECK(tok.encode("<|a|>b<|a|>c", false) == std::vector<int>{ab_tok, a_tok, byte_id('c')});
  // Anti-vacuity: as plain text the token would be 8 byte pieces.
  CHECK(tok.encode("<|us", false).size() == 4);
}

// MOD.loader.gguf_arch_keys: the per-architecture GGUF keys (llama.cpp's names) are read, and bad
// values are refused naming the file and the key. Exact: config fields equal the written values.
// The class it closes: a key silently ignored (the window, its pattern, YaRN's betas) or a bad value
// loaded as a default. Anti-vacuity: each positive case differs from the plain file's config.
TEST_CASE("MOD.loader.gguf_arch_keys sliding window, its pattern, yarn betas read; bad values named",
          "[gate:MOD][loader]") {
  TempDir td;
  auto bools = [](GgufWriter& w, const std::string& k, const std::vector<bool>& v) {
    w.str(k), w.pod<std::uint32_t>(9), w.pod<std::uint32_t>(7), w.pod<std::uint64_t>(v.size());
    for (bool x : v) w.pod<std::uint8_t>(x ? 1 : 0);
  };
  const Model plain = load_model(td.write("plain.gguf", rope_gguf(0, [](GgufWriter&) {})));
  CHECK(plain.config.layer_window.empty());
  const Model win = load_model(td.write("win.gguf", rope_gguf(1, [](GgufWriter& w) {
    w.kv_u32("llama.attention.sliding_window", 16);
  })));
  CHECK(win.config.layer_window == std::vector<int>{16});
  const Model pat = load_model(td.write("pat.gguf", rope_gguf(2, [&](GgufWriter& w) {
    w.kv_u32("llama.attention.sliding_window", 16);
    bools(w, "llama.attention.sliding_window_pattern", {false});
  })));
  CHECK(pat.config.layer_window == std::vector<int>{0});
  const Model yarn = load_model(td.write("yarn.gguf", rope_gguf(5, [](GgufWriter& w) {
    w.kv_str("llama.rope.scaling.type", "yarn");
    w.kv_f32("llama.rope.scaling.factor", 4.0f);
    w.kv_u32("llama.rope.scaling.original_context_length", 16);
    w.kv_f32("llama.rope.scaling.yarn_beta_fast", 16.0f);
    w.kv_f32("llama.rope.scaling.yarn_attn_factor", 0.5f);
  })));
  CHECK(yarn.config.rope.beta_fast == 16.0);
  CHECK(std::fabs(yarn.config.rope.attention_factor - 0.5 * (0.1 * std::log(4.0) + 1)) < 1e-6);
  struct Bad {
    std::string field;
    int n_kv;
    std::function<void(GgufWriter&)> kv;
  };
  const std::vector<Bad> bad = {
      {"sliding_window_pattern", 2, [&](GgufWriter& w) {
         w.kv_u32("llama.attention.sliding_window", 16);
         bools(w, "llama.attention.sliding_window_pattern", {true, false});
       }},
      {"attention.sliding_window", 1, [](GgufWriter& w) {
         w.kv_u32("llama.attention.sliding_window", 100);  // context_length is 64
       }},
      {"attn_logit_softcapping", 1, [](GgufWriter& w) {
         w.kv_f32("llama.attn_logit_softcapping", 50.0f);
       }},
      {"yarn_ext_factor", 4, [](GgufWriter& w) {
         w.kv_str("llama.rope.scaling.type", "yarn");
         w.kv_f32("llama.rope.scaling.factor", 4.0f);
         w.kv_u32("llama.rope.scaling.original_context_length", 16);
         w.kv_f32("llama.rope.scaling.yarn_ext_factor", 0.5f);
       }},
      {"attention.scale", 1, [](GgufWriter& w) {
         w.kv_f32("llama.attention.scale", -1.0f);
       }},
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    const auto p = td.write("bad" + std::to_string(i) + ".gguf", rope_gguf(bad[i].n_kv, bad[i].kv));
    INFO("bad key " << bad[i].field);
    check_message(load_error(p), p, bad[i].field);
  }
  // longrope needs both factor tensors.
  SynthTensor lf{"rope_factors_long.weight", {4}, 0, {}, {1.0f, 2.0f, 3.0f, 4.0f}};
  lf.data.resize(16);
  std::memcpy(lf.data.data(), lf.expect.data(), 16);
  const auto half_lr = td.write("half_longrope.gguf", rope_gguf(0, [](GgufWriter&) {}, {lf}));
  check_message(load_error(half_lr), half_lr, "rope_factors_short");
}

// MOD.engine.window_release: with a sliding window on every layer (Mistral-style), the pages wholly
// outside every layer's window go back to the pool, so a run of 200 tokens works in a pool of 7
// pages of 8 tokens (56 tokens), and its logits are bit-identical to the same run in an unbounded pool
// without the release, at every position (prefill chunks of 16, then decode). Exact: the attention
// reads the same page contents in the same order. Anti-vacuity: the run is longer than the pool, the
// release happened (released tokens > 0, held KV bytes below the run's), the same small pool without
// the release runs out of blocks, and a model with one full-attention layer releases nothing.
TEST_CASE("MOD.engine.window_release pages outside every window return to the pool; logits unchanged",
          "[gate:MOD][fmt:f32]") {
  const Model& base = stories("stories260K.bin");
  auto windowed = [&](std::vector<int> windows) {
    auto m = std::make_unique<Model>();
    m->path = base.path;
    m->source_kind = base.source_kind;
    m->config = base.config;
    m->weights = base.weights;
    m->config.layer_window = std::move(windows);
    m->fingerprint = base.fingerprint;
    return m;
  };
  constexpr int kWindow = 24, kRun = 200, kPrefill = 40, kBlock = 8, kPoolBlocks = 7;
  REQUIRE(kRun > kPoolBlocks * kBlock);
  const auto m = windowed(std::vector<int>(static_cast<std::size_t>(base.config.n_layers), kWindow));
  std::mt19937 rng(7);
  std::vector<int> ids(kRun);
  for (int& t : ids) t = static_cast<int>(rng() % static_cast<unsigned>(base.config.vocab_size));
  auto make = [&](const Model& mm, int n_blocks, bool release) {
    EngineOptions o = opts(KvFormat{HalfFormat::f32, HalfFormat::f32});
    o.block_size = kBlock;
    o.n_blocks = n_blocks;
    o.prefill_chunk = 16;
    o.max_context = kRun;
    o.release_outside_window = release;
    return std::make_unique<Engine>(mm, o);
  };
  // Logits of every position: the prefill's, then one decode step per token.
  auto run = [&](Engine& e) {
    std::vector<float> all = e.forward_all_logits(std::span<const int>(ids.data(), kPrefill));
    for (int i = kPrefill; i < kRun; ++i) {
      const std::vector<float>& z = e.decode(ids[static_cast<std::size_t>(i)]);
      all.insert(all.end(), z.begin(), z.end());
    }
    return all;
  };
  auto ref_engine = make(*m, (kRun + kBlock - 1) / kBlock, false);
  const std::vector<float> ref = run(*ref_engine);
  auto small = make(*m, kPoolBlocks, true);
  const std::vector<float> got = run(*small);
  REQUIRE(got.size() == ref.size());
  REQUIRE(got.size() == static_cast<std::size_t>(kRun) * static_cast<std::size_t>(base.config.vocab_size));
  std::size_t first_diff = got.size();
  for (std::size_t i = 0; i < got.size() && first_diff == got.size(); ++i)
    if (std::memcmp(&got[i], &ref[i], sizeof(float)) != 0) first_diff = i;
  INFO("first differing logit at position " << first_diff / static_cast<std::size_t>(base.config.vocab_size));
  CHECK(first_diff == got.size());
  const int released = small->store().released_tokens(small->sequence());
  std::cout << "MOD.engine.window_release: " << kRun << " tokens, window " << kWindow << " on all "
            << base.config.n_layers << " layers, pool " << kPoolBlocks << " x " << kBlock << " tokens; released "
            << released << " tokens, held " << small->stats().kv_bytes << " KV bytes (unbounded pool holds "
            << ref_engine->stats().kv_bytes << ")\n";
  CHECK(released > 0);
  CHECK(released <= kRun - kWindow);
  CHECK(small->stats().kv_bytes < ref_engine->stats().kv_bytes);
  CHECK(small->stats().kv_bytes <= small->stats().kv_pool_bytes);
  // A released prefix cannot be saved, and names why.
  {
    TempDir td;
    std::string msg;
    try {
      small->save_kv((td.dir / "w.kvc").string());
    } catch (const std::exception& e) {
      msg = e.what();
    }
    INFO("save_kv message: " << msg);
    CHECK(msg.find("released") != std::string::npos);
  }
  // Control: the same pool without the release runs out of blocks.
  auto no_release = make(*m, kPoolBlocks, false);
  CHECK_THROWS_AS(run(*no_release), KvStoreError);
  // One full-attention layer (Gemma-style interleaving): nothing is released.
  std::vector<int> mixed(static_cast<std::size_t>(base.config.n_layers), kWindow);
  mixed[0] = 0;
  const auto mm = windowed(mixed);
  auto full = make(*mm, (kRun + kBlock - 1) / kBlock, true);
  (void)full->forward_all_logits(std::span<const int>(ids.data(), kRun));
  CHECK(full->store().released_tokens(full->sequence()) == 0);
}
