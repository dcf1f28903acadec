// Refusals and lookups below the loaders, each checked by its exact message:
//   STO.limits.checks      the limits policy's helpers (override variable, negative / non-positive
//                          values, overflowing products, doubles out of an integer range)
//   STO.limits.json        JSON_BYTES and JSON_DEPTH (brackets inside strings do not count)
//   STO.limits.engine      the engine's own checks: BLOCK_SIZE, KV_ROW, KV_POOL_BYTES, CONTEXT
//   STO.paths.lookup       where a missing test model was looked for, and the first existing folder
//   STO.loader.llama2c_header  llama2.c header fields that cannot describe a model
//   STO.loader.validate    validate_weights: every config/weights inconsistency a loader could hand it
//   STO.loader.tokenizer_override  load_model(path, tokenizer): a tokenizer.json or tokenizer.bin
//                          replaces the embedded tokenizer
// Bound: the message names the file (or the variable) and the field, and says what is wrong (exact
// substrings); the accepted neighbours of every refused value are accepted (anti-vacuity).
#include <cmath>
#include <cstring>
#include <functional>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "fixtures.hpp"
#include "limit_fixtures.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/json_limits.hpp"
#include "kvgate/limits.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/model_paths.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate/rope.hpp"
#include "kvgate/tokenizer_sp.hpp"
#include "models.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace fs = std::filesystem;

namespace {

template <class F>
std::string limit_error(F&& f) {
  try {
    f();
  } catch (const limits::LimitError& e) {
    return e.what();
  }
  return "<no LimitError>";
}

// Sets an environment variable for the scope, restoring the old value after.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* o = std::getenv(name)) old_ = o, had_ = true;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~EnvVar() {
    if (had_) ::setenv(name_.c_str(), old_.c_str(), 1);
    else ::unsetenv(name_.c_str());
  }
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// A tiny synth Hugging Face folder whose config.json the case edits; refusal(j) loads it with j.
struct ConfigDir {
  TempDir t;
  std::string dir = t.sub("m");
  fs::path cfg = fs::path(dir) / "config.json";
  nlohmann::json good;
  ConfigDir() {
    synth_hf(tiny_options(dir));
    good = read_json_file(cfg);
  }
  std::string refusal(const nlohmann::json& j) {
    write_json_file(cfg, j);
    return model_error([&] { load_hf(dir); });
  }
};

}  // namespace

TEST_CASE("STO.limits.checks override variable, negative and zero values, overflow, doubles out of range",
          "[gate:STO][fmt:none]") {
  namespace L = limits;
  {
    EnvVar v("KVGATE_LIMIT_LAYERS", nullptr);
    CHECK(L::max_of(L::kLayers) == 1024);
  }
  for (const char* bad : {"abc", "12x", "0", "-5", " 7", ""}) {  // not a positive integer: the default stays
    EnvVar v("KVGATE_LIMIT_LAYERS", bad);
    INFO("KVGATE_LIMIT_LAYERS=" << bad);
    CHECK(L::max_of(L::kLayers) == 1024);
  }
  {
    EnvVar v("KVGATE_LIMIT_LAYERS", "5");
    CHECK(L::max_of(L::kLayers) == 5);
    CHECK(L::check(L::kLayers, 5, "f.json", "n_layers") == 5);
    const std::string m = limit_error([] { L::check(L::kLayers, 6, "f.json", "n_layers"); });
    CHECK(m == "f.json: n_layers = 6 exceeds the limit 5 on the number of layers (set KVGATE_LIMIT_LAYERS=N to allow more)");
  }
  CHECK(limit_error([] { L::check(L::kVocab, -3, "cfg", "vocab_size"); }) ==
        "cfg: vocab_size = -3 is negative (it is a vocabulary size)");
  CHECK(L::check(L::kVocab, 0, "cfg", "vocab_size") == 0);
  CHECK(limit_error([] { L::check_positive(L::kHeads, 0, "cfg", "n_heads"); }) ==
        "cfg: n_heads = 0 must be >= 1 (the number of attention heads)");
  CHECK(L::check_positive(L::kHeads, 1, "cfg", "n_heads") == 1);
  CHECK(limit_error([] { L::check_positive(L::kHeads, std::uint64_t{0}, "cfg", "n_heads"); }) ==
        "cfg: n_heads = 0 must be >= 1 (the number of attention heads)");
  const std::uint64_t big = std::uint64_t{1} << 32;
  CHECK(L::mul(big - 1, big + 1, "t", "rows * cols") == big * big - 1);
  CHECK(limit_error([&] { L::mul(big, big, "t", "rows * cols"); }) ==
        "t: rows * cols = 4294967296 * 4294967296 overflows 64 bits");
  CHECK(limit_error([] { L::add(~std::uint64_t{0}, 1, "t", "offset"); }) ==
        "t: offset = 18446744073709551615 + 1 overflows 64 bits");
  int out = -7;
  CHECK(L::double_to_int(2147483647.0, 0, std::numeric_limits<int>::max(), &out));
  CHECK(out == std::numeric_limits<int>::max());
  CHECK(L::double_to_int(-1.0, -1, 5, &out));
  CHECK(out == -1);
  const double inf = std::numeric_limits<double>::infinity();
  for (double d : {2147483648.0, -1.5, std::nan(""), inf, -inf}) {
    out = 42;
    INFO(d);
    CHECK_FALSE(L::double_to_int(d, 0, std::numeric_limits<int>::max(), &out));
    CHECK(out == 42);  // untouched
  }
}

TEST_CASE("STO.limits.json JSON_BYTES and JSON_DEPTH refuse a document before it is parsed", "[gate:STO][fmt:none]") {
  // Bound: JSON_BYTES and JSON_DEPTH of runtime/limits, lowered through their override to exactly
  // what a small document holds: at the limit it parses, one below it is refused naming the file,
  // the value, the limit and the override; at the default depth (128), 128 nested arrays parse and
  // 129 (or 100000) are refused without recursion.
  namespace L = limits;
  // Depth 5 ({ [ { [ [), and a string full of brackets and an escaped quote that must not count.
  const std::string doc = R"({"a": [1, {"b": [[2]]}], "s": "\"[[[[[[[[[[{{{{"})";
  const auto parse = [&](const std::string& text) { return limit_refusal([&] { (void)L::parse_json(text, "d.json"); }); };
  CHECK(L::parse_json(doc, "d.json")["a"][1]["b"][0][0] == 2);
  {
    const ScopedLimit at("JSON_DEPTH", 5);
    CHECK(parse(doc) == "<ok>");
  }
  {
    const ScopedLimit below("JSON_DEPTH", 4);
    CHECK(parse(doc) == "d.json: nesting depth = 5 or more exceeds the limit 4 on the JSON nesting depth (set "
                        "KVGATE_LIMIT_JSON_DEPTH=N to allow more)");
  }
  {
    const ScopedLimit at("JSON_BYTES", doc.size());
    CHECK(parse(doc) == "<ok>");
  }
  {
    const ScopedLimit below("JSON_BYTES", doc.size() - 1);
    CHECK(parse(doc) == "d.json: size = " + std::to_string(doc.size()) + " bytes exceeds the limit " +
                            std::to_string(doc.size() - 1) +
                            " on the bytes of a JSON document (set KVGATE_LIMIT_JSON_BYTES=N to allow more)");
  }
  const auto nested = [](std::size_t n) { return std::string(n, '[') + std::string(n, ']'); };
  CHECK(parse(nested(128)) == "<ok>");
  CHECK(has(parse(nested(129)), "d.json: nesting depth = 129 or more exceeds the limit 128"));
  CHECK(has(parse(nested(100000)), "KVGATE_LIMIT_JSON_DEPTH"));
}

TEST_CASE("STO.limits.engine block size, KV row, pool bytes and context are checked when the engine is built",
          "[gate:STO][fmt:f16]") {
  // Bound: BLOCK_SIZE, KV_ROW, KV_POOL_BYTES and CONTEXT of runtime/limits, lowered through their
  // override to exactly what the engine is asked for (after the model is loaded): at the limit the
  // engine is built, one below it is refused naming the option or the product, the value and the
  // override -- the engine's own checks, for callers of the library that pass no CLI flag check.
  TempDir t;
  synth_hf(tiny_options(t.sub("m")));
  const Model m = load_hf(t.sub("m"));
  KvRequest req;
  req.flag = parse_kv_format("f16");
  EngineOptions base;
  base.kv = resolve_kv(req, m.config, 16);
  base.block_size = 16;
  const std::uint64_t row = static_cast<std::uint64_t>(m.config.n_kv_heads) * m.config.head_dim;
  const std::uint64_t ctx = static_cast<std::uint64_t>(m.config.max_seq_len);
  REQUIRE(row > 1);
  REQUIRE(ctx > 1);
  struct Case {
    const char* limit;
    std::uint64_t held;
    std::string field;
    std::size_t pool;  // kv_cache_memory (0: sized from the context)
  };
  for (const Case& c : {Case{"BLOCK_SIZE", 16, "--block-size", 0}, Case{"KV_ROW", row, "n_kv_heads * head_dim", 0},
                        Case{"KV_POOL_BYTES", 1u << 20, "--kv-cache-memory", 1u << 20},
                        Case{"CONTEXT", ctx, "context length (max_position_embeddings)", 0}}) {
    INFO("KVGATE_LIMIT_" << c.limit);
    EngineOptions eo = base;
    eo.kv_cache_memory = c.pool;
    {
      const ScopedLimit at(c.limit, c.held);
      CHECK(limit_refusal([&] { Engine e(m, eo); }) == "<ok>");
    }
    const ScopedLimit below(c.limit, c.held - 1);
    const std::string msg = limit_refusal([&] { Engine e(m, eo); });
    INFO(msg);
    CHECK(has(msg, c.field + " = " + std::to_string(c.held) + " exceeds the limit " + std::to_string(c.held - 1)));
    CHECK(has(msg, std::string("KVGATE_LIMIT_") + c.limit + "=N"));
  }
}

TEST_CASE("STO.paths.lookup a missing model names every folder looked at and the fix", "[gate:STO][fmt:none]") {
  TempDir t;
  const fs::path models = t.path() / "models", src = t.path() / "src";
  fs::create_directories(models / "tiny");
  fs::create_directories(src);
  write_bytes(models / "tiny" / "m.bin", "x");
  {
    EnvVar v("KVGATE_MODELS", models.string().c_str());
    const ModelLookup hit = kvgate::find_model("tiny/m.bin", src.string());
    CHECK(hit.found());
    CHECK(hit.path == (models / "tiny" / "m.bin").string());
    const ModelLookup miss = kvgate::find_model("tiny/none.bin", src.string());
    CHECK_FALSE(miss.found());
    const std::string shared = (t.path() / "shared" / "models" / "tiny" / "none.bin").string();
    CHECK(miss.message == "model 'tiny/none.bin' not found; looked at: " + (models / "tiny" / "none.bin").string() +
                              ", " + shared + ", " + (src / ".models" / "tiny" / "none.bin").string() +
                              ". Set KVGATE_MODELS to the folder that holds tiny/.");
    CHECK(existing_model_dir(src.string()) == models.string());
  }
  {
    EnvVar v("KVGATE_MODELS", nullptr);
    CHECK(kvgate::find_model("tiny/m.bin", "").message ==
          "model 'tiny/m.bin' not found; looked at: (nowhere). Set KVGATE_MODELS to the folder that holds tiny/.");
    CHECK(existing_model_dir("").empty());
    CHECK(existing_model_dir(src.string()).empty());  // neither ../shared/models nor .models exists
    fs::create_directories(src / ".models");
    CHECK(existing_model_dir(src.string()) == (src / ".models").string());
  }
}

TEST_CASE("STO.loader.llama2c_header header fields that describe no model are refused by name", "[gate:STO][fmt:none]") {
  TempDir t;
  auto header = [&](const std::string& name, std::vector<std::int32_t> h) {
    const fs::path p = t.path() / name;
    write_bytes(p, std::string(reinterpret_cast<const char*>(h.data()), h.size() * 4));
    return p.string();
  };
  //                     dim hidden layers heads kv vocab seq
  const auto p1 = header("m1.bin", {10, 8, 1, 3, 1, 16, 8});
  CHECK(model_error([&] { load_llama2c(p1); }) ==
        "model '" + p1 + "': header field dim = 10 is not a multiple of n_heads = 3");
  const auto p2 = header("m2.bin", {6, 8, 1, 2, 1, 16, 8});
  CHECK(model_error([&] { load_llama2c(p2); }) == "model '" + p2 + "': head_dim = dim/n_heads = 3 is odd; RoPE needs pairs");
  const auto p3 = header("m3.bin", {8, 8, 1, 2, 1, 16, 8});  // a valid header: only the size is wrong
  CHECK(has(model_error([&] { load_llama2c(p3); }), "': truncated: the header (dim 8, layers 1, vocab 16) implies "));
  std::vector<std::int32_t> g = {0, 3, 0, 0, 0, 0, 0};
  std::memcpy(g.data(), "GGUF", 4);
  const auto p4 = header("m4.bin", g);
  CHECK(model_error([&] { load_llama2c(p4); }) ==
        "model '" + p4 + "': this is a GGUF file; load it with a .gguf name (or via load_model)");
}

TEST_CASE("STO.loader.validate every config/weights inconsistency is refused naming the model", "[gate:STO][fmt:none]") {
  TempDir t;
  synth_hf(tiny_options(t.sub("m")));
  const Model m = load_hf(t.sub("m"));
  REQUIRE_NOTHROW(validate_weights("x", m.config, m.weights));  // the loaded model is consistent
  struct Bad {
    const char* why;
    std::function<void(ModelConfig&, ModelWeights&)> edit;
  };
  const std::vector<Bad> bad = {
      {"config has a non-positive size (dim, hidden_dim, layers, heads, kv_heads, head_dim, vocab_size, max_seq_len "
       "must all be > 0)",
       [](ModelConfig& c, ModelWeights&) { c.head_dim = 0; }},
      {"n_heads 2 is not a multiple of n_kv_heads 3", [](ModelConfig& c, ModelWeights&) { c.n_kv_heads = 3; }},
      {"head_dim 15 is odd", [](ModelConfig& c, ModelWeights&) { c.head_dim = 15; }},
      {"tensor final_norm has 31 elements, the config implies 32",
       [](ModelConfig&, ModelWeights& w) { w.final_norm.pop_back(); }},
      {"tensor layer 1 w2 has 0 elements, the config implies 1536",
       [](ModelConfig&, ModelWeights& w) { w.layers[1].w2.clear(); }},
      {"1 layers of weights, config says 2", [](ModelConfig&, ModelWeights& w) { w.layers.pop_back(); }},
      {"1 per-layer attention windows for 2 layers", [](ModelConfig& c, ModelWeights&) { c.layer_window = {0}; }},
      {"layer 1 has attention window -4 (0 = full attention, else > 0)",
       [](ModelConfig& c, ModelWeights&) { c.layer_window = {0, -4}; }},
      // Layer 0 routed over 2 experts of width 0 (its router present, its empty experts the right size).
      {"mixture-of-experts config is inconsistent (2 experts, top-k 0, expert width 0, 2 per-layer flags for 2 layers)",
       [](ModelConfig& c, ModelWeights& w) {
         c.moe.n_experts = 2;
         c.moe.layer_moe = {1, 0};
         w.layers[0].router.assign(2 * 32, 0.0f);
       }},
      {"embedding scale, attention scale and soft-caps must be finite and >= 0",
       [](ModelConfig& c, ModelWeights&) { c.attn_softcap = -1.0f; }},
      {"embedding scale, attention scale and soft-caps must be finite and >= 0",
       [](ModelConfig& c, ModelWeights&) { c.embed_scale = INFINITY; }},
  };
  for (const Bad& b : bad) {
    ModelConfig c = m.config;
    ModelWeights w = m.weights;
    b.edit(c, w);
    const std::string msg = model_error([&] { validate_weights("dir/m", c, w); });
    INFO(msg);
    CHECK(msg == std::string("model 'dir/m': ") + b.why);
  }
  ModelConfig c = m.config;  // the accepted neighbours: windows 0 and > 0, zero scales
  c.layer_window = {0, 4};
  c.attn_softcap = 0.0f;
  CHECK_NOTHROW(validate_weights("dir/m", c, m.weights));
}

TEST_CASE("STO.loader.tokenizer_override an explicit tokenizer replaces the embedded one", "[gate:STO][fmt:none]") {
  const ModelLookup gguf = find_model("stories260K/stories260K.gguf"), tok = find_model("stories260K/tok512.bin");
  REQUIRE(gguf.found());
  REQUIRE(tok.found());
  const Model embedded = load_model(gguf.path), over = load_model(gguf.path, tok.path);
  REQUIRE(embedded.tokenizer);
  REQUIRE(over.tokenizer);
  CHECK(dynamic_cast<const SpTokenizer*>(over.tokenizer.get()) != nullptr);
  CHECK(over.tokenizer.get() != embedded.tokenizer.get());
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  const std::vector<int> ids = over.tokenizer->encode(text, true);
  CHECK(ids == embedded.tokenizer->encode(text, true));  // the same vocabulary, two readers
  CHECK(ids.front() == 1);
  // A synth Hugging Face folder with a second folder's tokenizer.json (a different vocabulary).
  TempDir t;
  SynthOptions a = tiny_options(t.sub("a")), b = tiny_options(t.sub("b"));
  b.vocab = 280;
  synth_hf(a);
  synth_hf(b);
  const std::string bt = (fs::path(t.sub("b")) / "tokenizer.json").string();
  const Model ma = load_model(t.sub("a")), mb = load_model(t.sub("a"), bt);
  CHECK(ma.tokenizer->vocab_size() == 300);
  CHECK(mb.tokenizer->vocab_size() == 280);
  CHECK(mb.tokenizer->encode("hello world", true) == load_model(t.sub("b")).tokenizer->encode("hello world", true));
}

// STO.rope.refusals: the RoPE fields of config.json and the RopeConfig checks behind every loader,
// each refused value named with its field and the reason (bound: the exact message).
TEST_CASE("STO.rope.refusals bad RoPE fields in config.json and RopeConfig values are refused by name",
          "[gate:STO][fmt:none]") {
  ConfigDir d;
  const fs::path& cfg = d.cfg;
  const nlohmann::json& good = d.good;
  REQUIRE_NOTHROW(load_hf(d.dir));
  using J = nlohmann::json;
  const J yarn = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
  const auto yarn_with = [&](const J& extra) {
    J y = yarn;
    y.update(extra);
    return y;
  };
  struct Bad {
    const char* msg;  // after "'<config.json>': field "
    J edit;           // merged into config.json
  };
  const std::vector<Bad> bad = {
      {"'rope_scaling.original_max_position_embeddings' = \"x\" must be a positive integer (a context length in tokens)",
       {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", "x"}}}}},
      {"'rope_scaling.short_factor' has a non-number entry \"a\"",
       {{"rope_scaling", {{"rope_type", "longrope"}, {"short_factor", {"a"}}, {"long_factor", {1.0}}}}}},
      {"'original_max_position_embeddings' = 0 must be a positive integer",
       {{"original_max_position_embeddings", 0}, {"rope_scaling", yarn}}},
      {"'rope_scaling.truncate' is not a boolean", {{"rope_scaling", yarn_with({{"truncate", "yes"}})}}},
      {"'partial_rotary_factor' = 1.500000 must be in (0, 1]", {{"partial_rotary_factor", 1.5}}},
      {"'rope_theta' must be a positive finite number", {{"rope_theta", -1.0}}},
      {"'partial_rotary_factor' is not a number", {{"partial_rotary_factor", "half"}}},
      {"'rope_parameters' is per layer type but has no 'full_attention' object",
       {{"rope_parameters", {{"sliding_attention", {{"rope_type", "default"}}}}}}},
      {"'rope_parameters.sliding_attention' is not an object",
       {{"rope_parameters", {{"full_attention", {{"rope_type", "default"}}}, {"sliding_attention", 3}}}}},
      {"'rope_local_base_freq' must be a positive number", {{"rope_local_base_freq", -5.0}}},
  };
  for (const Bad& b : bad) {
    J j = good;
    j.update(b.edit);
    const std::string msg = d.refusal(j);
    INFO(msg);
    CHECK(msg == "'" + cfg.string() + "': field " + b.msg);
  }
  {  // the accepted neighbour of the truncate refusal
    J j = good;
    j["rope_scaling"] = yarn_with({{"truncate", false}});
    write_json_file(cfg, j);
    const Model m = load_hf(d.dir);
    CHECK(m.config.rope.type == RopeType::yarn);
    CHECK_FALSE(m.config.rope.truncate);
  }
  // RopeConfig values no config.json spelling reaches (GGUF and defaults feed validate_rope too).
  auto rope = [](RopeType ty, double factor, int orig, int max_pos) {
    RopeConfig r;
    r.type = ty;
    r.factor = factor;
    r.original_max = orig;
    r.max_position = max_pos;
    return r;
  };
  struct BadRope {
    const char* msg;  // after "'w': field 'f"
    RopeConfig r;
  };
  std::vector<BadRope> rb = {
      {".factor' = 0.000000 must be a finite number > 0 for rope_type \"linear\" (the scaling factor; 1 means no scaling)",
       rope(RopeType::linear, 0, 0, 64)},
      {".factor' = -1.000000 must be a finite number > 0 (or absent: max / original length)", rope(RopeType::yarn, -1, 16, 64)},
      {"' rope_type \"dynamic\" needs max_position_embeddings >= 1 (its reference length); add it to config.json",
       rope(RopeType::dynamic, 2, 0, 0)},
      {".factor' is missing and no max_position_embeddings gives the default (max / original length)",
       rope(RopeType::yarn, 0, 16, 0)},
      {".beta_fast' and beta_slow must be > 0 (defaults 32 and 1)", rope(RopeType::yarn, 2, 16, 64)},
      {".low_freq_factor' and high_freq_factor must be > 0 (Llama 3.1: 1 and 4)", rope(RopeType::llama3, 8, 16, 64)},
      {".partial_rotary_factor' gives 3 rotated dims of head_dim 16; it must be an even count in [2, head_dim] (fix "
       "partial_rotary_factor)",
       rope(RopeType::plain, 0, 0, 64)},
      {".rope_freqs' has 3 entries, expected rotary_dim / 2 = 8", rope(RopeType::plain, 0, 0, 64)},
  };
  rb[4].r.beta_fast = 0;
  rb[5].r.low_freq_factor = 0;
  rb[6].r.rotary_dim = 3;
  rb[7].r.freq_divisors = {1, 1, 1};
  for (const BadRope& b : rb) {
    const std::string msg = model_error([&] { validate_rope(b.r, 16, "w", "f"); });
    INFO(msg);
    CHECK(msg == std::string("'w': field 'f") + b.msg);
  }
  CHECK_NOTHROW(validate_rope(rope(RopeType::yarn, 2, 16, 64), 16, "w", "f"));  // the same yarn with its betas
}

// STO.loader.config_fields: config.json architecture and shape fields refused by exact message;
// model_type stands in for a missing architectures list; an index whose weight_map is broken is
// refused naming the index; F16 / BF16 weights load within their rounding (bound: half an ulp,
// 2^-11 / 2^-8 relative, plus the f16 subnormal step 2^-25) and do differ from the f32 file.
TEST_CASE("STO.loader.config_fields architecture, head and bias fields, shard index and weight dtypes",
          "[gate:STO][fmt:none]") {
  ConfigDir d;
  const TempDir& t = d.t;
  const fs::path& cfg = d.cfg;
  const nlohmann::json& good = d.good;
  const Model base = load_hf(d.dir);
  using J = nlohmann::json;
  struct Bad {
    const char* msg;  // after "'<config.json>': field "
    std::function<void(J&)> edit;
  };
  const std::vector<Bad> bad = {
      {"'architectures' is not a non-empty list of names", [](J& j) { j["architectures"] = "LlamaForCausalLM"; }},
      {"'architectures' is missing (and no model_type)", [](J& j) { j.erase("architectures"), j.erase("model_type"); }},
      {"'num_key_value_heads' = 3 does not divide num_attention_heads = 4",
       [](J& j) { j["num_attention_heads"] = 4, j["num_key_value_heads"] = 3; }},
      {"'hidden_size' = 33 is not a multiple of num_attention_heads = 2 (and no head_dim is given)",
       [](J& j) { j.erase("head_dim"), j["hidden_size"] = 33; }},
      {"'attention_bias' is true: biases on q/k/v/o projections are supported for Qwen2 (q/k/v) only",
       [](J& j) { j["attention_bias"] = true; }},
  };
  for (const Bad& b : bad) {
    J j = good;
    b.edit(j);
    const std::string msg = d.refusal(j);
    INFO(msg);
    CHECK(msg == "'" + cfg.string() + "': field " + b.msg);
  }
  {
    J j = good;
    j.erase("architectures");
    j["model_type"] = "llama";
    write_json_file(cfg, j);
    const Model m = load_hf(d.dir);
    CHECK(m.config.arch == "llama");
    CHECK(m.fingerprint == base.fingerprint);
    write_json_file(cfg, good);
  }
  // A sharded checkpoint: the index must be JSON with a weight_map of file names.
  const fs::path dir = d.dir, index = dir / "model.safetensors.index.json";
  fs::rename(dir / "model.safetensors", dir / "model-00001-of-00001.safetensors");
  J map = J::object();
  const J shard_header = read_st(dir / "model-00001-of-00001.safetensors").header;
  for (auto it = shard_header.begin(); it != shard_header.end(); ++it)
    if (it.key() != "__metadata__") map[it.key()] = "model-00001-of-00001.safetensors";
  write_json_file(index, {{"weight_map", map}});
  CHECK(load_hf(dir.string()).fingerprint == base.fingerprint);  // the same weights through the index
  write_bytes(index, "{\"weight_map\": ");
  CHECK(has(model_error([&] { load_hf(dir.string()); }), "'" + index.string() + "': not valid JSON ("));
  write_json_file(index, {{"metadata", J::object()}});
  CHECK(model_error([&] { load_hf(dir.string()); }) == "'" + index.string() + "': field 'weight_map' is missing or not an object");
  J m2 = map;
  m2["lm_head.weight"] = 7;
  write_json_file(index, {{"weight_map", m2}});
  CHECK(model_error([&] { load_hf(dir.string()); }) == "'" + index.string() + "': weight_map[\"lm_head.weight\"] is not a file name");
  // Half-precision weights.
  for (const char* dt : {"f16", "bf16"}) {
    SynthOptions o = tiny_options(t.sub(dt));
    o.dtype = dt;
    synth_hf(o);
    const Model h = load_hf(t.sub(dt), WeightStorage::f32);  // the converted values (as stored: STO.loader.weights_as_stored)
    const bool bf = std::string(dt) == "bf16";
    const double rel = bf ? 0x1p-8 : 0x1p-11, abs_floor = bf ? 0.0 : 0x1p-25;
    const auto& a = base.weights.layers[1].wq;
    const auto& b = h.weights.layers[1].wq;
    REQUIRE(a.size() == b.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO(dt << " wq[" << i << "] " << a[i] << " vs " << b[i]);
      CHECK(std::fabs(static_cast<double>(a[i]) - b[i]) <= rel * std::fabs(static_cast<double>(a[i])) + abs_floor);
      differ += a[i] != b[i];
    }
    CHECK(differ > a.size() / 2);  // rounded, not copied
  }
  // A weight of a dtype kvgate does not read (the bytes still tile the data section).
  const fs::path st = fs::path(t.sub("f16")) / "model.safetensors";
  StFile f = read_st(st);
  f.header["model.layers.0.mlp.up_proj.weight"]["dtype"] = "I16";
  write_st_raw(st, f);
  CHECK(has(model_error([&] { load_hf(t.sub("f16")); }),
            "tensor 'model.layers.0.mlp.up_proj.weight' field 'dtype' = I16 is not supported for weights (kvgate reads F32, "
            "F16 and BF16)"));
}
