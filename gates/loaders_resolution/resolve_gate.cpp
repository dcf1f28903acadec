// STO.resolve gates: KV format resolution (field notes 002/004).
//  - precedence: --kv flag > config.json quantization_config.kv_cache_quant_algo > legacy
//    hf_quant_config.json quantization.kv_cache_quant_algo > default f16, on directories this
//    test writes (synth + hand-edited JSON) and loads through load_hf;
//  - every fallback reason, with the effective format (never the requested one) reported;
//  - strict mode turns a fallback into an error that names the format, the reason and the fix;
//  - an unknown declaration is refused naming the file and the field;
//  - the backend capability hook (the CUDA backend plugs in there).
#include <string>

#include "catch_compat.hpp"
#include "fixtures.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/resolve.hpp"

using namespace kvgate;
using namespace kvgate::gates;

namespace {

template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "<no exception>";
}


KvFormat fmt(const char* s) {
  auto f = parse_kv_format(s);
  REQUIRE(f.has_value());
  return *f;
}

ModelConfig geometry(int n_kv_heads, int head_dim) {
  ModelConfig c;
  c.n_kv_heads = n_kv_heads;
  c.n_heads = n_kv_heads;
  c.head_dim = head_dim;
  return c;
}

KvRequest flag(const char* f, bool strict = false, const char* backend = "cpu") {
  KvRequest r;
  r.flag = fmt(f);
  r.strict = strict;
  r.backend = backend;
  return r;
}

// Writes a synth model, then applies the declarations: inline (config.json) and legacy
// (hf_quant_config.json); empty strings mean "absent". `inline_null` writes
// quantization_config with kv_cache_quant_algo: null.
std::string model_dir(const TempDir& t, const std::string& name, const std::string& inline_algo,
                      const std::string& legacy_algo, bool inline_null = false) {
  SynthOptions o = tiny_options(t.sub(name));
  synth_hf(o);
  const auto dir = t.path() / name;
  if (!inline_algo.empty() || inline_null) {
    auto cj = read_json_file(dir / "config.json");
    cj["quantization_config"] = {{"quant_method", "modelopt"}};
    if (inline_null)
      cj["quantization_config"]["kv_cache_quant_algo"] = nullptr;
    else
      cj["quantization_config"]["kv_cache_quant_algo"] = inline_algo;
    write_json_file(dir / "config.json", cj);
  }
  if (!legacy_algo.empty())
    write_json_file(dir / "hf_quant_config.json",
                    {{"producer", {{"name", "modelopt"}}},
                     {"quantization", {{"quant_algo", "FP8"}, {"kv_cache_quant_algo", legacy_algo}}}});
  return dir.string();
}

}  // namespace

// ---- precedence -----------------------------------------------------------------------------------

TEST_CASE("STO.resolve.precedence.default no flag and no declaration resolves to f16 from 'default'",
          "[gate:STO][fmt:f16]") {
  TempDir t;
  const Model m = load_hf(model_dir(t, "plain", "", ""));
  CHECK(m.config.declared_kv.empty());
  const ResolvedKv r = resolve_kv(KvRequest{}, m.config, 16);
  CHECK(r.requested == fmt("f16"));
  CHECK(r.effective == fmt("f16"));
  CHECK(r.requested_source == "default");
  CHECK_FALSE(r.fell_back());
  CHECK(r.backend == "cpu");
}

TEST_CASE("STO.resolve.precedence.inline config.json quantization_config.kv_cache_quant_algo is honoured",
          "[gate:STO][fmt:fp8]") {
  TempDir t;
  const std::string dir = model_dir(t, "inline", "FP8", "");
  const Model m = load_hf(dir);
  CHECK(m.config.declared_kv == "fp8");
  CHECK(has(m.config.declared_kv_source, "config.json:quantization_config.kv_cache_quant_algo"));
  const ResolvedKv r = resolve_kv(KvRequest{}, m.config, 16);
  CHECK(r.requested == fmt("fp8"));
  CHECK(r.effective == fmt("fp8"));
  CHECK(r.requested_source == "checkpoint:" + dir + "/config.json:quantization_config.kv_cache_quant_algo");
  CHECK_FALSE(r.fell_back());
}

TEST_CASE("STO.resolve.precedence.legacy hf_quant_config.json is read when config.json declares nothing",
          "[gate:STO][fmt:int8]") {
  TempDir t;
  const std::string dir = model_dir(t, "legacy", "", "INT8");
  const Model m = load_hf(dir);
  CHECK(m.config.declared_kv == "int8");
  const ResolvedKv r = resolve_kv(KvRequest{}, m.config, 16);
  CHECK(r.requested == fmt("int8"));
  CHECK(r.effective == fmt("int8"));
  CHECK(r.requested_source == "checkpoint:" + dir + "/hf_quant_config.json:quantization.kv_cache_quant_algo");
}

TEST_CASE("STO.resolve.precedence.legacy_null a null inline declaration falls through to hf_quant_config.json",
          "[gate:STO][fmt:int8]") {
  TempDir t;
  const Model m = load_hf(model_dir(t, "null_inline", "", "INT8", /*inline_null=*/true));
  CHECK(m.config.declared_kv == "int8");
  CHECK(has(m.config.declared_kv_source, "hf_quant_config.json"));
}

TEST_CASE("STO.resolve.precedence.inline_over_legacy config.json outranks hf_quant_config.json",
          "[gate:STO][fmt:fp8][fmt:int8]") {
  TempDir t;
  // Both files declare, and they disagree: the inline document wins.
  const std::string dir = model_dir(t, "both", "FP8", "INT8");
  const Model m = load_hf(dir);
  CHECK(m.config.declared_kv == "fp8");
  const ResolvedKv r = resolve_kv(KvRequest{}, m.config, 16);
  CHECK(r.requested == fmt("fp8"));
  CHECK(has(r.requested_source, "config.json:quantization_config"));
  CHECK_FALSE(has(r.requested_source, "hf_quant_config"));
  // The same with the roles swapped.
  const Model m2 = load_hf(model_dir(t, "both2", "INT8", "FP8"));
  CHECK(resolve_kv(KvRequest{}, m2.config, 16).requested == fmt("int8"));
}

TEST_CASE("STO.resolve.precedence.flag the flag outranks both declarations", "[gate:STO][fmt:q8_0]") {
  TempDir t;
  const Model m = load_hf(model_dir(t, "flagged", "FP8", "INT8"));
  const ResolvedKv r = resolve_kv(flag("q8_0"), m.config, 16);
  CHECK(r.requested == fmt("q8_0"));
  CHECK(r.effective == fmt("q8_0"));
  CHECK(r.requested_source == "flag");
  // An explicit K/V pair is a flag too.
  const ResolvedKv r2 = resolve_kv(flag("k=int8,v=q4_0"), m.config, 16);
  CHECK(r2.requested == (KvFormat{HalfFormat::int8, HalfFormat::q4_0}));
  CHECK(r2.requested_source == "flag");
}

TEST_CASE("STO.resolve.precedence.values FP8 -> fp8, INT8 -> int8, others lowercased", "[gate:STO][fmt:fp8_e5m2]") {
  TempDir t;
  CHECK(load_hf(model_dir(t, "a", "FP8", "")).config.declared_kv == "fp8");
  CHECK(load_hf(model_dir(t, "b", "INT8", "")).config.declared_kv == "int8");
  const Model m = load_hf(model_dir(t, "c", "FP8_E5M2", ""));
  CHECK(m.config.declared_kv == "fp8_e5m2");
  CHECK(resolve_kv(KvRequest{}, m.config, 16).effective == fmt("fp8_e5m2"));
}

TEST_CASE("STO.resolve.precedence.synth synth --kv-algo writes either declaration site", "[gate:STO][fmt:fp8]") {
  TempDir t;
  SynthOptions o = tiny_options(t.sub("inline"));
  o.kv_algo = "FP8";
  synth_hf(o);
  Model m = load_hf(o.out);
  CHECK(m.config.declared_kv == "fp8");
  CHECK(has(m.config.declared_kv_source, "config.json"));
  o.out = t.sub("legacy");
  o.kv_algo = "INT8";
  o.kv_algo_file = "hf_quant_config";
  synth_hf(o);
  m = load_hf(o.out);
  CHECK(m.config.declared_kv == "int8");
  CHECK(has(m.config.declared_kv_source, "hf_quant_config.json"));
  // Re-synth without a declaration removes the stale legacy file.
  o.kv_algo.clear();
  synth_hf(o);
  CHECK(load_hf(o.out).config.declared_kv.empty());
}

// ---- unknown declarations ------------------------------------------------------------------------

TEST_CASE("STO.resolve.unknown.inline an unknown inline declaration is refused naming config.json and the field",
          "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string dir = model_dir(t, "int4", "INT4", "");
  const Model m = load_hf(dir);  // loading records it; resolution refuses it
  CHECK(m.config.declared_kv == "int4");
  const std::string msg = error_of<KvResolveError>([&] { resolve_kv(KvRequest{}, m.config, 16); });
  INFO(msg);
  CHECK(has(msg, dir + "/config.json"));
  CHECK(has(msg, "quantization_config.kv_cache_quant_algo"));
  CHECK(has(msg, "int4"));
  CHECK(has(msg, "--kv"));
  // A flag makes the declaration irrelevant.
  CHECK(resolve_kv(flag("int8"), m.config, 16).effective == fmt("int8"));
  // Anti-vacuity: a ModelOpt NVFP4 declaration is a known format now, kept as declared.
  const std::string nv = model_dir(t, "nvfp4", "NVFP4", "");
  CHECK(resolve_kv(KvRequest{}, load_hf(nv).config, 16).effective == fmt("nvfp4"));
}

TEST_CASE("STO.resolve.unknown.legacy an unknown legacy declaration is refused naming hf_quant_config.json",
          "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string dir = model_dir(t, "w4", "", "W4A16_AWQ");
  const Model m = load_hf(dir);
  const std::string msg = error_of<KvResolveError>([&] { resolve_kv(KvRequest{}, m.config, 16); });
  INFO(msg);
  CHECK(has(msg, dir + "/hf_quant_config.json"));
  CHECK(has(msg, "quantization.kv_cache_quant_algo"));
  CHECK(has(msg, "w4a16_awq"));
}

TEST_CASE("STO.resolve.unknown.malformed a malformed declaration is a load error naming the file", "[gate:STO][fmt:none]") {
  TempDir t;
  const std::string dir = model_dir(t, "bad", "", "");
  auto cj = read_json_file(std::filesystem::path(dir) / "config.json");
  cj["quantization_config"] = {{"kv_cache_quant_algo", 8}};
  write_json_file(std::filesystem::path(dir) / "config.json", cj);
  std::string msg = error_of<ModelError>([&] { load_hf(dir); });
  INFO(msg);
  CHECK(has(msg, "config.json"));
  CHECK(has(msg, "quantization_config.kv_cache_quant_algo"));

  const std::string dir2 = model_dir(t, "bad2", "", "");
  write_bytes(std::filesystem::path(dir2) / "hf_quant_config.json", "{\"quantization\": ");
  msg = error_of<ModelError>([&] { load_hf(dir2); });
  INFO(msg);
  CHECK(has(msg, "hf_quant_config.json"));
}

// ---- fallback reasons -----------------------------------------------------------------------------

TEST_CASE("STO.resolve.fallback.row_not_multiple_of_32 32-block formats on a 24-element token row",
          "[gate:STO][fmt:q8_0][fmt:q4_0][fmt:k8v4]") {
  const ModelConfig c = geometry(3, 8);  // H*D = 24
  for (const char* f : {"q8_0", "q4_0"}) {
    INFO(f);
    const ResolvedKv r = resolve_kv(flag(f), c, 16);
    CHECK(r.requested == fmt(f));
    CHECK(r.effective == fmt("f16"));
    CHECK(r.effective.name() == "f16");  // reported as what it is
    CHECK(r.fallback_reason == "row_not_multiple_of_32");
    CHECK(r.fell_back());
  }
  // k8v4: the int8 K half is kept, the q4_0_rot V half falls back.
  const ResolvedKv r = resolve_kv(flag("k8v4"), c, 16);
  CHECK(r.effective == (KvFormat{HalfFormat::int8, HalfFormat::f16}));
  CHECK(r.fallback_reason == "row_not_multiple_of_32");
  CHECK(r.effective.name() == "k=int8,v=f16");
}

TEST_CASE("STO.resolve.fallback.head_dim_not_power_of_two q4_0_rot on head_dim 48", "[gate:STO][fmt:k8v4]") {
  const ModelConfig c = geometry(2, 48);  // row 96: a multiple of 32, head_dim not a power of two
  const ResolvedKv r = resolve_kv(flag("k8v4"), c, 16);
  CHECK(r.requested == fmt("k8v4"));
  CHECK(r.effective == (KvFormat{HalfFormat::int8, HalfFormat::f16}));
  CHECK(r.fallback_reason == "head_dim_not_power_of_two");
  // q4_0 itself is fine there.
  CHECK_FALSE(resolve_kv(flag("q4_0"), c, 16).fell_back());
}

TEST_CASE("STO.resolve.fallback.checkpoint a declared format falls back too, and is reported as the fallback",
          "[gate:STO][fmt:q4_0]") {
  TempDir t;
  SynthOptions o = tiny_options(t.sub("odd"));
  o.hidden = 24;
  o.heads = 3;
  o.kv_heads = 3;
  o.head_dim = 8;  // row 24
  o.kv_algo = "q4_0";
  synth_hf(o);
  const Model m = load_hf(o.out);
  const ResolvedKv r = resolve_kv(KvRequest{}, m.config, 16);
  CHECK(r.requested == fmt("q4_0"));
  CHECK(has(r.requested_source, "checkpoint:"));
  CHECK(r.effective == fmt("f16"));
  CHECK(r.fallback_reason == "row_not_multiple_of_32");
}

TEST_CASE("STO.resolve.fallback.none every preset resolves to itself where it is supported", "[gate:STO][fmt:all]") {
  const ModelConfig c = geometry(8, 128);
  for (const Preset& p : presets()) {
    INFO(p.name);
    const ResolvedKv r = resolve_kv(flag(std::string(p.name).c_str()), c, 16);
    CHECK(r.effective == p.fmt);
    CHECK(r.fallback_reason.empty());
    // Strict mode is silent when nothing falls back.
    CHECK_NOTHROW(resolve_kv(flag(std::string(p.name).c_str(), true), c, 16));
  }
}

TEST_CASE("STO.resolve.fallback.invalid_geometry no half format at all is an error", "[gate:STO][fmt:f16]") {
  const ModelConfig c = geometry(2, 0);
  const std::string msg = error_of<KvResolveError>([&] { resolve_kv(KvRequest{}, c, 16); });
  INFO(msg);
  CHECK(has(msg, "invalid_geometry"));
}

// ---- strict mode -----------------------------------------------------------------------------------

TEST_CASE("STO.resolve.strict a fallback under --strict-kv is an error naming format, reason and fix",
          "[gate:STO][fmt:q4_0][fmt:k8v4]") {
  const ModelConfig c = geometry(3, 8);
  std::string msg = error_of<KvResolveError>([&] { resolve_kv(flag("q4_0", true), c, 16); });
  INFO(msg);
  CHECK(has(msg, "'q4_0'"));
  CHECK(has(msg, "row_not_multiple_of_32"));
  CHECK(has(msg, "drop --strict-kv"));
  CHECK(has(msg, "--kv"));
  CHECK(has(msg, "int8"));  // a format that does work here is suggested
  CHECK_FALSE(has(msg, "q8_0,"));  // and refused ones are not

  msg = error_of<KvResolveError>([&] { resolve_kv(flag("k8v4", true), geometry(2, 48), 16); });
  INFO(msg);
  CHECK(has(msg, "'k8v4'"));
  CHECK(has(msg, "head_dim_not_power_of_two"));
  CHECK(has(msg, "V half"));

  // Strict applies to a checkpoint declaration as well.
  ModelConfig d = geometry(3, 8);
  d.declared_kv = "q8_0";
  d.declared_kv_source = "/m/config.json:quantization_config.kv_cache_quant_algo";
  KvRequest strict;
  strict.strict = true;
  msg = error_of<KvResolveError>([&] { resolve_kv(strict, d, 16); });
  INFO(msg);
  CHECK(has(msg, "'q8_0'"));
  CHECK(has(msg, "checkpoint:/m/config.json"));
}

// ---- backend capability hook -------------------------------------------------------------------------

namespace {
Capability fake_cuda(HalfFormat f, const PageGeometry&) {
  if (f == HalfFormat::fp8_e5m2) return {false, "cuda_no_e5m2_kernel", "no e5m2 attention kernel"};
  if (f == HalfFormat::int8) return {false, "cuda_int8_unimplemented", ""};
  return {};
}
Capability fake_cuda_f32_only(HalfFormat f, const PageGeometry&) {
  if (f == HalfFormat::f32) return {};
  return {false, "cuda_f32_only", ""};
}
// A hook that refuses q4_0 without giving a reason (a backend written elsewhere): the refusal must
// still be reported as a fallback with a reason, never as an empty one that looks like none.
Capability fake_cuda_no_reason(HalfFormat f, const PageGeometry&) {
  if (f == HalfFormat::q4_0) return {false, "", ""};
  return {};
}
struct HookGuard {
  explicit HookGuard(BackendCapability fn) { register_backend_capability("cuda", fn); }
  ~HookGuard() { register_backend_capability("cuda", nullptr); }
};
}  // namespace

TEST_CASE("STO.resolve.backend the cuda capability hook refuses halves with its own reason (a default one when it gives none)",
          "[gate:STO][fmt:fp8_e5m2][fmt:int8][fmt:q4_0]") {
  const ModelConfig c = geometry(8, 128);
  {
    HookGuard g(fake_cuda);
    ResolvedKv r = resolve_kv(flag("fp8_e5m2", false, "cuda"), c, 16);
    CHECK(r.backend == "cuda");
    CHECK(r.effective == fmt("f16"));
    CHECK(r.fallback_reason == "cuda_no_e5m2_kernel");
    // The CPU backend is unaffected by the CUDA hook.
    CHECK_FALSE(resolve_kv(flag("fp8_e5m2"), c, 16).fell_back());
    // Different reasons per half are both reported.
    r = resolve_kv(flag("k=int8,v=q4_0_rot", false, "cuda"), geometry(2, 48), 16);
    CHECK(r.effective == fmt("f16"));
    CHECK(r.fallback_reason == "k:cuda_int8_unimplemented;v:head_dim_not_power_of_two");
    const std::string msg = error_of<KvResolveError>([&] { resolve_kv(flag("int8", true, "cuda"), c, 16); });
    INFO(msg);
    CHECK(has(msg, "cuda_int8_unimplemented"));
    CHECK(has(msg, "backend 'cuda'"));
  }
  {
    HookGuard g(fake_cuda_f32_only);  // f16 refused as well: the fallback is f32
    const ResolvedKv r = resolve_kv(flag("q8_0", false, "cuda"), c, 16);
    CHECK(r.effective == fmt("f32"));
    CHECK(r.fallback_reason == "cuda_f32_only");
  }
  {
    HookGuard g(fake_cuda_no_reason);  // a refusal without a reason gets "<backend>_unsupported"
    const Capability cap = backend_supports("cuda", HalfFormat::q4_0, PageGeometry{16, 8, 128});
    CHECK_FALSE(cap.ok);
    CHECK(cap.reason == "cuda_unsupported");
    const ResolvedKv r = resolve_kv(flag("q4_0", false, "cuda"), c, 16);
    CHECK(r.fell_back());
    CHECK(r.effective == fmt("f16"));
    CHECK(r.fallback_reason == "cuda_unsupported");
    const std::string msg = error_of<KvResolveError>([&] { resolve_kv(flag("q4_0", true, "cuda"), c, 16); });
    INFO(msg);
    CHECK(has(msg, "cuda_unsupported"));
  }
  // Without a registered hook the cuda backend is refused rather than assumed capable.
  const std::string msg = error_of<KvResolveError>([&] { resolve_kv(flag("int8", false, "cuda"), c, 16); });
  INFO(msg);
  CHECK(has(msg, "no registered capability"));
  CHECK(has(error_of<KvResolveError>([&] { resolve_kv(flag("int8", false, "tpu"), c, 16); }), "unknown KV backend"));
}
