// MOD.hf.<case>: kvgate (CPU engine, f32 KV) against transformers' own logits and greedy ids on
// the project's reference directories (hf_ref_harness.hpp: layout, bounds, anti-vacuity). One test
// case per case and check, so each is reported on its own; a directory kvgate's loader refuses
// FAILS its case with the loader's message.
//
//  MOD.hf.<case>.logits   every teacher-forced position: no NaN, max |diff| <= 2B(p), NMSE <= bound;
//                         for RoPE-scaled / sliding cases the run passes the original length / window.
//  MOD.hf.<case>.greedy   greedy ids from prompt_ids == transformers' generate(do_sample=False) up
//                         to the first step whose reference top-2 margin is within 2B.
//  (MOD.hf.llama_default.logits also checks that the reference folder holds exactly these cases.)
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>

#include "catch_compat.hpp"
#include "hf_ref_harness.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/kv_file.hpp"
#include "kvgate/resolve.hpp"

using namespace kvgate;
using namespace kvgate::gates::hf_ref;

namespace {

const Loaded& loaded(const std::string& name) { return gates::hf_ref::loaded(name, "MOD.hf", "cpu"); }

// The reference folder holds exactly the cases of this table (checked inside
// MOD.hf.llama_default.logits, so a new reference directory cannot go untested unnoticed).
void check_inventory() {
  const fs::path models = fs::path(refs_root()) / "models";
  INFO("reference folder " << models.string());
  REQUIRE(fs::is_directory(models));
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(models))
    if (e.is_directory()) found.push_back(e.path().filename().string());
  for (const auto& f : found) {
    INFO("case '" << f << "' has a reference directory but no test case in gates/hf_reference");
    CHECK(std::find(case_names().begin(), case_names().end(), f) != case_names().end());
  }
  for (const auto& n : case_names()) {
    INFO("case '" << n << "' has no reference directory");
    CHECK(std::find(found.begin(), found.end(), n) != found.end());
  }
}

auto cpu_engine(const Model& m, MlaCache mla = MlaCache::expanded) {
  return [&m, mla](int n_tokens) {
    EngineOptions o = engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1);
    o.max_context = n_tokens;
    o.prefill_chunk = n_tokens;  // one forward over all given ids
    o.mla_cache = mla;
    return std::make_unique<Engine>(m, o);
  };
}

}  // namespace

#define HF_CASE(c)                                                                                     \
  TEST_CASE("MOD.hf." c ".logits transformers' teacher-forced logits, CPU engine f32 KV",               \
            "[gate:MOD][fmt:f32]") {                                                                   \
    if (std::string(c) == "llama_default") check_inventory();                                         \
    const Loaded& l = loaded(c);                                                                       \
    check_logits(l.rc, l.m, cpu_engine(l.m));                                                          \
  }                                                                                                    \
  TEST_CASE("MOD.hf." c ".greedy transformers' greedy ids, CPU engine f32 KV", "[gate:MOD][fmt:f32]") { \
    const Loaded& l = loaded(c);                                                                       \
    check_greedy(l.rc, l.m, cpu_engine(l.m));                                                          \
  }

HF_CASE("llama_default")
HF_CASE("llama3_rope")
HF_CASE("llama3_legacy")
HF_CASE("llama_linear")
HF_CASE("llama_dynamic")
HF_CASE("llama_sp")
HF_CASE("qwen2")
HF_CASE("qwen2_swa")
HF_CASE("qwen3")
HF_CASE("qwen3_yarn")
HF_CASE("mistral_swa")
HF_CASE("phi3")
HF_CASE("phi3_longrope")
HF_CASE("gemma2")
HF_CASE("gemma3")
HF_CASE("qwen3_moe")
HF_CASE("mixtral")
HF_CASE("deepseek_v3")
HF_CASE("deepseek_v3_qlora")

// MOD.hf.<case>.latent.*: the DeepSeek-V3 cases with the MLA latent cache (--mla-cache latent: the
// store holds c_kv and the RoPE key, attention in the weight-absorbed form), against the same
// transformers logits and greedy ids; the bound adds the absorbed chain (hf_ref_harness.hpp
// mla_latent_chain). The layout is checked to be the latent one, so a silent expanded run cannot pass.
#define HF_LATENT_CASE(c)                                                                                  \
  TEST_CASE("MOD.hf." c ".latent.logits transformers' teacher-forced logits, CPU engine, MLA latent cache f32", \
            "[gate:MOD][fmt:f32][mla]") {                                                                 \
    const Loaded& l = loaded(c);                                                                           \
    REQUIRE(cpu_engine(l.m, MlaCache::latent)(4)->stats().kv_layout.rfind("mla_latent", 0) == 0);         \
    check_logits(l.rc, l.m, cpu_engine(l.m, MlaCache::latent), false, true);                              \
  }                                                                                                        \
  TEST_CASE("MOD.hf." c ".latent.greedy transformers' greedy ids, CPU engine, MLA latent cache f32",       \
            "[gate:MOD][fmt:f32][mla]") {                                                                 \
    const Loaded& l = loaded(c);                                                                           \
    check_greedy(l.rc, l.m, cpu_engine(l.m, MlaCache::latent), false, true);                              \
  }

HF_LATENT_CASE("deepseek_v3")
HF_LATENT_CASE("deepseek_v3_qlora")


// STO.mla.latent_bytes: what the MLA latent cache holds, in bytes, on the DeepSeek-V3 case: per token
// and layer one K row of kv_lora_rank elements (the latent) and one V row of qk_rope_head_dim
// elements (the RoPE key), each in its own half format. Expected bytes are written out here from
// the format definitions (docs/FORMATS.md: f32 4 B, bf16 2 B, q8_0 34 B per 32 elements, int8 1 B
// per element + one f16 scale per row), not asked of kvgate's byte tables, and the whole pool and the
// held sequence are checked against them; the expanded cache of the same model is larger by
// H (nope + rope) * 2 / (kv_lora + rope) at f32, which is checked too (anti-vacuity: the two layouts
// differ, and the latent pool is the smaller).
TEST_CASE("STO.mla.latent_bytes the MLA latent cache holds kv_lora + rope elements per token and layer, each half "
          "in its format",
          "[gate:STO][mla]") {
  const Loaded& l = loaded("deepseek_v3");
  const ModelConfig& c = l.m.config;
  const int KL = c.mla.kv_lora_rank, R = c.mla.rope_dim, H = c.n_heads, QK = c.mla.nope_dim + c.mla.rope_dim;
  REQUIRE(KL % 32 == 0);
  struct Row {
    KvFormat f;
    double k_bytes_per_token, v_bytes_per_token;
  };
  const Row rows[] = {
      {{HalfFormat::f32, HalfFormat::f32}, 4.0 * KL, 4.0 * R},
      {{HalfFormat::bf16, HalfFormat::bf16}, 2.0 * KL, 2.0 * R},
      {{HalfFormat::q8_0, HalfFormat::bf16}, 34.0 * KL / 32, 2.0 * R},
      {{HalfFormat::int8, HalfFormat::f32}, 1.0 * KL + 2, 4.0 * R},
  };
  const int B = 16, n_tokens = 21;
  for (const Row& r : rows) {
    EngineOptions o = engine_options_for(r.f, 1);
    o.max_context = 64;
    o.block_size = B;
    o.mla_cache = MlaCache::latent;
    Engine e(l.m, o);
    const std::vector<int> ids(static_cast<std::size_t>(n_tokens), 5);
    (void)e.prefill(ids);
    const EngineStats st = e.stats();
    const double per_block = c.n_layers * B * (r.k_bytes_per_token + r.v_bytes_per_token);
    INFO(r.f.name() << ": layout '" << st.kv_layout << "', pool " << st.kv_pool_bytes << " bytes in " << st.n_blocks
                    << " blocks, sequence " << st.kv_bytes << " bytes");
    std::cout << "STO.mla.latent_bytes " << r.f.name() << ": " << (r.k_bytes_per_token + r.v_bytes_per_token)
              << " bytes per token and layer (kv_lora " << KL << ", rope " << R << "); pool " << st.kv_pool_bytes
              << ", sequence of " << n_tokens << " tokens " << st.kv_bytes << "\n";
    CHECK(st.kv_layout.rfind("mla_latent", 0) == 0);
    CHECK(st.kv_pool_bytes == static_cast<std::size_t>(per_block * st.n_blocks));
    CHECK(st.kv_bytes == static_cast<std::size_t>(per_block * ((n_tokens + B - 1) / B)));
  }
  EngineOptions ox = engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1);
  ox.max_context = 64;
  ox.block_size = B;
  EngineOptions ol = ox;
  ol.mla_cache = MlaCache::latent;
  const std::size_t expanded = Engine(l.m, ox).stats().kv_pool_bytes, latent = Engine(l.m, ol).stats().kv_pool_bytes;
  INFO("expanded pool " << expanded << " bytes, latent pool " << latent);
  CHECK(expanded * static_cast<std::size_t>(KL + R) == latent * static_cast<std::size_t>(2 * H * QK));
  CHECK(latent < expanded);
}

// STO.mla.latent_refusals: --mla-cache latent where it cannot apply is refused with the flag, the
// reason and the fix, never run as something else: a model without MLA, a per-layer map, the CUDA
// engine (gates/cuda), and an unknown --mla-cache value.
TEST_CASE("STO.mla.latent_refusals the latent cache is refused where it cannot apply, naming the flag and the fix",
          "[gate:STO][mla]") {
  auto refused = [](const std::function<void()>& f, std::initializer_list<const char*> words) {
    try {
      f();
    } catch (const std::exception& e) {
      const std::string m = e.what();
      INFO("message: " << m);
      for (const char* w : words) CHECK(m.find(w) != std::string::npos);
      return true;
    }
    return false;
  };
  const Loaded& ds = loaded("deepseek_v3");
  const Loaded& ll = loaded("llama_default");
  EngineOptions o = engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1);
  o.max_context = 32;
  o.mla_cache = MlaCache::latent;
  CHECK(refused([&] { Engine e(ll.m, o); }, {"--mla-cache latent", "kv_lora_rank", "drop the flag"}));
  EngineOptions map = o;
  map.kv_layers = KvLayerMap(static_cast<std::size_t>(ds.m.config.n_layers), KvFormat{HalfFormat::f32, HalfFormat::f32});
  map.kv_layers[0] = KvFormat{HalfFormat::bf16, HalfFormat::bf16};
  CHECK(refused([&] { Engine e(ds.m, map); }, {"--mla-cache latent", "--kv-layers"}));
  CHECK(refused([] { (void)parse_mla_cache("latnet", "--mla-cache"); }, {"--mla-cache", "latnet", "expanded", "latent"}));
  // Anti-vacuity: the same options without the latent cache are accepted on both models.
  EngineOptions plain = o;
  plain.mla_cache = MlaCache::expanded;
  CHECK_NOTHROW(Engine(ll.m, plain));
  CHECK_NOTHROW(Engine(ds.m, plain));
}

// PAR.mla.persist: a conversation over the MLA latent cache saved to a KV file (version 5: the
// layout and the RoPE row width in the header) and hydrated into a fresh engine continues with
// logits bitwise equal to the uninterrupted run, for f32, k=int8,v=bf16 and k=q8_0,v=fp8_e4m3 (a
// per-tensor RoPE scale that is not the latent's). The file records layout mla_latent and V rows of
// qk_rope_head_dim. A latent file hydrated into an expanded run of the same model (and an expanded
// file into a latent run) is refused naming the layout, and nothing is restored. Anti-vacuity: the
// continuation differs from the expanded layout's by more than rounding for the lossy pairs (a
// hydrate that silently ran expanded would be seen).
TEST_CASE("PAR.mla.persist the MLA latent cache saved and hydrated continues bitwise; a layout mismatch is refused",
          "[gate:PAR][mla]") {
  const Loaded& ds = loaded("deepseek_v3");
  const ModelConfig& c = ds.m.config;
  const std::vector<int> prompt = {5, 17, 3, 99, 42, 7, 250, 11, 64, 8, 300, 2, 19, 77};
  const int cut = 9;  // tokens in the file; the rest prefilled after the hydrate
  const fs::path dir = fs::temp_directory_path() / ("kvgate-mla-persist-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const KvFormat formats[] = {{HalfFormat::f32, HalfFormat::f32},
                              {HalfFormat::int8, HalfFormat::bf16},
                              {HalfFormat::q8_0, HalfFormat::fp8_e4m3}};
  for (const KvFormat& f : formats) {
    INFO("format " << f.name());
    EngineOptions o = engine_options_for(f, 1);
    o.max_context = 64;
    o.mla_cache = MlaCache::latent;
    o.k_scale = {0.75f};
    o.v_scale = {0.125f};
    // The uninterrupted run.
    Engine whole(ds.m, o);
    (void)whole.prefill(std::span<const int>(prompt).first(cut));
    const std::vector<float> want = whole.prefill(std::span<const int>(prompt).subspan(cut));
    // Saved after `cut` tokens, hydrated into a fresh engine, the rest prefilled.
    Engine first(ds.m, o);
    (void)first.prefill(std::span<const int>(prompt).first(cut));
    const std::string file = (dir / (f.name() + ".kv")).string();
    first.save_kv(file);
    const KvFile kf = read_kv_file(file);
    CHECK(kf.header.version == kKvFileVersion);
    CHECK(kf.header.layout == KvLayout::mla_latent);
    CHECK(kf.header.n_kv_heads == 1);
    CHECK(kf.header.head_dim == c.mla.kv_lora_rank);
    CHECK(kf.header.v_head_dim == c.mla.rope_dim);
    Engine second(ds.m, o);
    const int restored = second.hydrate(kf, prompt);
    CHECK(restored == cut);
    const std::vector<float> got = second.prefill(std::span<const int>(prompt).subspan(static_cast<std::size_t>(restored)));
    REQUIRE(got.size() == want.size());
    long differ = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      differ += std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]);
    std::cout << "PAR.mla.persist " << f.name() << ": " << cut << " tokens saved (" << fs::file_size(file)
              << " bytes), hydrated, " << prompt.size() - cut << " prefilled: " << differ
              << " logits differ bitwise from the uninterrupted run\n";
    CHECK(differ == 0);
    // The other layout refuses the file, naming it, and restores nothing.
    EngineOptions ox = o;
    ox.mla_cache = MlaCache::expanded;
    Engine expanded(ds.m, ox);
    std::string msg;
    try {
      (void)expanded.hydrate(kf, prompt);
    } catch (const KvFileError& e) {
      msg = e.what();
    }
    INFO("expanded run hydrating the latent file: " << msg);
    CHECK(msg.find("layout mla_latent") != std::string::npos);
    CHECK(msg.find("--mla-cache") != std::string::npos);
    CHECK(expanded.position() == 0);
    (void)expanded.prefill(std::span<const int>(prompt).first(cut));
    const std::string xfile = (dir / (f.name() + ".expanded.kv")).string();
    expanded.save_kv(xfile);
    Engine latent_again(ds.m, o);
    std::string msg2;
    try {
      (void)latent_again.hydrate(read_kv_file(xfile), prompt);
    } catch (const KvFileError& e) {
      msg2 = e.what();
    }
    INFO("latent run hydrating the expanded file: " << msg2);
    CHECK(msg2.find("layout kv_heads") != std::string::npos);
    CHECK(latent_again.position() == 0);
    if (f.k != HalfFormat::f32) {  // anti-vacuity: the expanded continuation is another computation
      const std::vector<float> other = expanded.prefill(std::span<const int>(prompt).subspan(cut));
      double d = 0;
      for (std::size_t i = 0; i < other.size(); ++i) d = std::max(d, std::fabs(double(other[i]) - want[i]));
      INFO("expanded vs latent continuation differ by " << d);
      CHECK(d > 1e-4);
    }
  }
  fs::remove_all(dir);
}

// PAR.mla.stream: the MLA latent cache streamed through a resident window (--kv-resident 16 over
// pages of 4 tokens: four blocks per layer on the simulated device, each slot a latent page and a
// RoPE page of its own size) gives logits bitwise equal to the resident run, prefill of 30 tokens
// then 10 decode steps, for f32, k=int8,v=bf16 and k=q4_0,v=fp8_e4m3. Each miss moves exactly one
// latent page and one RoPE page, sized from the format definitions here (a window that sized the RoPE
// page as a latent one moves more). Anti-vacuity: the window really missed and evicted, and the device
// copies equal the host mirror (check_stream_coherent).
TEST_CASE("PAR.mla.stream the MLA latent cache through a streamed window gives the resident run's logits bitwise",
          "[gate:PAR][mla]") {
  const Loaded& ds = loaded("deepseek_v3");
  std::vector<int> prompt;
  for (int i = 0; i < 30; ++i) prompt.push_back((i * 37 + 11) % 400 + 3);
  const int B = 4, KL = ds.m.config.mla.kv_lora_rank, R = ds.m.config.mla.rope_dim;
  REQUIRE(KL % 32 == 0);
  struct Row {
    KvFormat f;
    long block_bytes;  // one latent page + one RoPE page, from the format definitions (docs/FORMATS.md)
  };
  const Row rows[] = {{{HalfFormat::f32, HalfFormat::f32}, 4L * B * (KL + R)},
                      {{HalfFormat::int8, HalfFormat::bf16}, 1L * B * (KL + 2) + 2L * B * R},
                      {{HalfFormat::q4_0, HalfFormat::fp8_e4m3}, 18L * B * KL / 32 + 1L * B * R}};
  for (const auto& [f, block_bytes] : rows) {
    INFO("format " << f.name());
    EngineOptions o = engine_options_for(f, 1);
    o.max_context = 64;
    o.block_size = B;
    o.mla_cache = MlaCache::latent;
    o.v_scale = {0.125f};
    EngineOptions os = o;
    os.kv_resident = 16;
    Engine resident(ds.m, o), streamed(ds.m, os);
    REQUIRE(streamed.store().streaming());
    long differ = 0;
    auto compare = [&](const std::vector<float>& a, const std::vector<float>& b) {
      REQUIRE(a.size() == b.size());
      for (std::size_t i = 0; i < a.size(); ++i) differ += std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i]);
    };
    std::vector<float> a = resident.prefill(prompt), b = streamed.prefill(prompt);
    compare(a, b);
    for (int step = 0; step < 10; ++step) {
      const int next = static_cast<int>(std::max_element(a.begin(), a.end()) - a.begin());
      a = resident.decode(next);
      b = streamed.decode(next);
      compare(a, b);
    }
    const StreamCounters sc = streamed.store().stream_counters();
    std::cout << "PAR.mla.stream " << f.name() << ": 30 + 10 tokens through a 16-token window of 4-token pages: "
              << sc.misses << " misses, " << sc.evictions << " evictions, " << sc.bytes_moved << " bytes moved; "
              << differ << " logits differ bitwise from the resident run\n";
    CHECK(differ == 0);
    CHECK(sc.misses > 0);
    CHECK(sc.evictions > 0);
    CHECK(sc.bytes_moved == sc.misses * block_bytes);  // each miss moves the block's two pages, each its own size
    CHECK(streamed.store().check_stream_coherent().empty());
  }
}

// STO.mla.latent_resolve: with --mla-cache latent the KV format is resolved against the rows the
// latent cache holds (K: one latent row of kv_lora_rank, V: one RoPE row of qk_rope_head_dim), not
// the expanded heads. On the DeepSeek-V3 case (latent 32, RoPE key 8, expanded 4 x 24): q4_0 fits the
// latent but not an 8-wide RoPE row, so the V half falls back to f16 with the capability's reason and
// the requested format stays reported as requested; --strict-kv refuses it naming the RoPE key and
// --mla-cache latent. Anti-vacuity: the expanded resolution of the same request keeps q4_0 on both
// halves (96-element rows), so a resolver that ignored the layout would pass q4_0 to a store that
// cannot hold it.
TEST_CASE("STO.mla.latent_resolve the KV format is resolved against the latent cache's rows, a fallback names the RoPE key",
          "[gate:STO][mla]") {
  const Loaded& ds = loaded("deepseek_v3");
  KvRequest req;
  req.flag = KvFormat{HalfFormat::q4_0, HalfFormat::q4_0};
  req.mla_latent = true;
  const ResolvedKv r = resolve_kv(req, ds.m.config, 16);
  INFO("latent: requested " << r.requested.name() << ", effective " << r.effective.name() << ", reason " << r.fallback_reason);
  CHECK(r.requested.name() == "q4_0");
  CHECK(r.effective.k == HalfFormat::q4_0);
  CHECK(r.effective.v == HalfFormat::f16);
  CHECK(r.fallback_reason == "row_not_multiple_of_32");
  // The resolved format runs: the store holds what the resolution said.
  EngineOptions o = engine_options_for(r.effective, 1);
  o.kv = r;
  o.max_context = 16;
  o.mla_cache = MlaCache::latent;
  Engine e(ds.m, o);
  CHECK(e.stats().effective_kv == "k=q4_0,v=f16");
  req.strict = true;
  std::string msg;
  try {
    (void)resolve_kv(req, ds.m.config, 16);
  } catch (const KvResolveError& err) {
    msg = err.what();
  }
  INFO("strict: " << msg);
  CHECK(msg.find("V half (the RoPE key)") != std::string::npos);
  CHECK(msg.find("--mla-cache latent") != std::string::npos);
  KvRequest expanded = req;
  expanded.strict = false;
  expanded.mla_latent = false;
  const ResolvedKv x = resolve_kv(expanded, ds.m.config, 16);
  CHECK(x.effective.name() == "q4_0");
  CHECK_FALSE(x.fell_back());
}
