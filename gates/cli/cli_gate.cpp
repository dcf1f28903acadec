// CLI gates: the flags of the shipped `kvgate run` / `kvgate chat` reach the engine. Each gate runs
// the built kvgate binary (a child process, the command line a user types) and compares what it
// reports with the runtime library called directly with the options the flag means. The class it
// closes: a flag parsed but not passed on, passed into the wrong field, or a JSON field wired to
// the wrong counter (cli/ was compiled into no gate, so such bugs were "noop" to the mutation proof).
//
// Bounds: token ids and counters are exact (the same deterministic engine, --threads 1 on both
// sides). Anti-vacuity: for every flag, the library run *without* the flag (or with the value in the
// wrong field) gives a different result, so a dropped or misrouted flag cannot pass by accident.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvgate/build_paths.hpp"
#include "catch_compat.hpp"
#include "limit_fixtures.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/model.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate/synth.hpp"
#include "model_fixtures.hpp"
#include "models.hpp"
#include "scratch_dir.hpp"

using namespace kvgate;
using nlohmann::json;
namespace fs = std::filesystem;

#ifndef KVGATE_CLI_BIN
#error "KVGATE_CLI_BIN (the kvgate binary under test) must be defined by the build"
#endif

namespace {

struct Scratch {  // a temp folder removed at scope exit (gates/common/scratch_dir.hpp)
  kvgate::gates::ScratchDir s{"kvgate-cli-gate"};
  fs::path dir = s.path();
};

std::string q(const std::string& s) {  // single-quoted for /bin/sh
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

struct Run {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Run kvgate_cli(const std::string& args, const std::string& stdin_text = "") {
  static int n = 0;
  static Scratch io;
  const fs::path in = io.dir / ("in" + std::to_string(n)), out = io.dir / ("out" + std::to_string(n)),
                 err = io.dir / ("err" + std::to_string(n));
  ++n;
  std::ofstream(in) << stdin_text;
  const std::string cmd = q(KVGATE_CLI_BIN) + " " + args + " <" + q(in.string()) + " >" + q(out.string()) + " 2>" + q(err.string());
  const int st = std::system(cmd.c_str());
  Run r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

json run_json(const std::string& args) {
  const Run r = kvgate_cli("run " + args + " --threads 1 --json");
  INFO("kvgate run " << args << "\nstderr: " << r.err);
  REQUIRE(r.rc == 0);
  return json::parse(r.out);
}

struct Stories {
  std::string bin, tok;
  Model model;
};
const Stories& stories() {
  static const Stories s = [] {
    Stories x;
    const auto b = gates::find_model("stories260K/stories260K.bin");
    const auto t = gates::find_model("stories260K/tok512.bin");
    if (!b.found()) FAIL(b.message);
    if (!t.found()) FAIL(t.message);
    x.bin = b.path;
    x.tok = t.path;
    x.model = load_model(x.bin, x.tok);
    return x;
  }();
  return s;
}
std::string model_args() { return "--model " + q(stories().bin) + " --tokenizer " + q(stories().tok); }

EngineOptions lib_options(const std::string& preset) {
  KvRequest req;
  req.flag = parse_kv_format(preset);
  EngineOptions eo;
  eo.kv = resolve_kv(req, stories().model.config, 16);
  eo.threads = 1;
  return eo;
}

std::vector<int> lib_generate(const EngineOptions& eo, const SamplerOptions& so, const std::vector<int>& prompt, int steps,
                              EngineStats* st = nullptr) {
  Engine e(stories().model, eo);
  const GenerateResult r = e.generate(prompt, steps, so);
  if (st) *st = e.stats();
  return r.tokens;
}

}  // namespace

TEST_CASE("CLI.run.sampler --temperature/--top-k/--top-p/--seed reach the sampler", "[gate:CLI][fmt:f32]") {
  const json j = run_json(model_args() + " --kv f32 --steps 48 --temperature 1.6 --top-k 8 --top-p 0.85 --seed 7");
  const std::vector<int> prompt = j["prompt_ids"], got = j["generated_ids"];
  SamplerOptions so;
  so.temperature = 1.6f;
  so.top_k = 8;
  so.top_p = 0.85f;
  so.seed = 7;
  const EngineOptions eo = lib_options("f32");
  CHECK(got == lib_generate(eo, so, prompt, 48));
  // Anti-vacuity: each flag changes the ids, so dropping any one of them shows.
  SamplerOptions no_p = so, no_k = so, no_seed = so, t1 = so;
  no_p.top_p = 1.0f;
  no_k.top_k = 0;
  no_seed.seed = 42;
  t1.temperature = 1.0f;
  CHECK(lib_generate(eo, no_p, prompt, 48) != got);
  CHECK(lib_generate(eo, no_k, prompt, 48) != got);
  CHECK(lib_generate(eo, no_seed, prompt, 48) != got);
  CHECK(lib_generate(eo, t1, prompt, 48) != got);
}

TEST_CASE("CLI.run.scales --k-scale and --v-scale reach their own half", "[gate:CLI][fmt:fp8]") {
  // Power-of-two scales far from 1 (2^-8 for K: K/s saturates at 448; 2^6 for V: most V/s fall into
  // the subnormal range). A power-of-two scale inside the normal range would change no rounding, so
  // each half is pushed past an edge of the e4m3 grid.
  const json j = run_json(model_args() + " --kv fp8 --steps 40 --k-scale 0.00390625 --v-scale 64");
  const std::vector<int> prompt = j["prompt_ids"], got = j["generated_ids"];
  EngineOptions eo = lib_options("fp8");
  eo.k_scale = {0.00390625f};
  eo.v_scale = {64.0f};
  CHECK(got == lib_generate(eo, SamplerOptions{}, prompt, 40));
  // Anti-vacuity: V's scale in K's field (and K at 1), or either scale dropped, gives other ids.
  EngineOptions swapped = lib_options("fp8"), no_v = lib_options("fp8"), no_k = lib_options("fp8");
  swapped.k_scale = {64.0f};
  no_v.k_scale = {0.00390625f};
  no_k.v_scale = {64.0f};
  CHECK(lib_generate(swapped, SamplerOptions{}, prompt, 40) != got);
  CHECK(lib_generate(no_v, SamplerOptions{}, prompt, 40) != got);
  CHECK(lib_generate(no_k, SamplerOptions{}, prompt, 40) != got);
}

TEST_CASE("CLI.run.kv_scales --kv-scales FILE gives every layer and KV head its own scale; --k-scale overrides its "
          "half; a bad file is refused naming the file and the field",
          "[gate:CLI][fmt:fp8]") {
  const ModelConfig& c = stories().model.config;
  const int L = c.n_layers, H = c.n_kv_heads;
  // Scales far from 1 on some heads (as CLI.run.scales: K / 2^-8 saturates e4m3, V / 64 is mostly
  // subnormal), others near the data's range, distinct per layer: whether each head gets its own
  // scale then changes the greedy ids.
  std::vector<float> ks, vs;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      ks.push_back((h % 2 ? 0.00390625f : 0.37f) * (1.0f + 0.125f * static_cast<float>(l)));
      vs.push_back(((h + l) % 2 ? 64.0f : 0.0213f) * (1.0f + 0.125f * static_cast<float>(l)));
    }
  json layers = json::array();
  for (int l = 0; l < L; ++l) {
    json k = json::array(), v = json::array();
    for (int h = 0; h < H; ++h) k.push_back(ks[static_cast<std::size_t>(l * H + h)]), v.push_back(vs[static_cast<std::size_t>(l * H + h)]);
    layers.push_back({{"k", l == 2 ? json(0.00390625) : k}, {"v", v}});  // layer 2's K: one number for every head
  }
  Scratch sc;
  const fs::path file = sc.dir / "scales.json";
  std::ofstream(file) << json{{"schema", "kvgate.kv-scales/1"}, {"layers", layers}}.dump(1);
  const json j = run_json(model_args() + " --kv fp8 --steps 40 --kv-scales " + q(file.string()));
  const std::vector<int> prompt = j["prompt_ids"], got = j["generated_ids"];
  EngineOptions eo = lib_options("fp8");
  eo.k_scale = ks;
  eo.v_scale = vs;
  for (int h = 0; h < H; ++h) eo.k_scale[static_cast<std::size_t>(2 * H + h)] = 0.00390625f;
  CHECK(got == lib_generate(eo, SamplerOptions{}, prompt, 40));
  // --k-scale wins over the file for K; V stays the file's.
  const json jk = run_json(model_args() + " --kv fp8 --steps 40 --k-scale 0.5 --kv-scales " + q(file.string()));
  EngineOptions ek = eo;
  ek.k_scale = {0.5f};
  CHECK(std::vector<int>(jk["generated_ids"]) == lib_generate(ek, SamplerOptions{}, prompt, 40));
  // Anti-vacuity: head 0's scale on every head (per layer), K and V swapped, or layer 2's one number
  // on its head 0 only (1.0 on the others) give other ids.
  EngineOptions head0 = eo, swapped = eo, layer2_head0 = eo;
  for (int h = 1; h < H; ++h) layer2_head0.k_scale[static_cast<std::size_t>(2 * H + h)] = 1.0f;
  CHECK(lib_generate(layer2_head0, SamplerOptions{}, prompt, 40) != got);
  for (auto* s : {&head0.k_scale, &head0.v_scale})
    for (std::size_t i = 0; i < s->size(); ++i) (*s)[i] = (*s)[i / static_cast<std::size_t>(H) * static_cast<std::size_t>(H)];
  std::swap(swapped.k_scale, swapped.v_scale);
  CHECK(lib_generate(head0, SamplerOptions{}, prompt, 40) != got);
  CHECK(lib_generate(swapped, SamplerOptions{}, prompt, 40) != got);
  CHECK(std::vector<int>(jk["generated_ids"]) != got);
  // Refusals name the file, the field and the fix.
  auto refused = [&](const json& doc, const std::string& field, const std::string& what) {
    const fs::path bad = sc.dir / "bad.json";
    std::ofstream(bad) << doc.dump();
    const Run r = kvgate_cli("run " + model_args() + " --kv fp8 --steps 2 --kv-scales " + q(bad.string()));
    INFO(r.err);
    CHECK(r.rc != 0);
    CHECK_THAT(r.err, kvgate_catch::contains(bad.string()));
    CHECK_THAT(r.err, kvgate_catch::contains("field '" + field + "'"));
    CHECK_THAT(r.err, kvgate_catch::contains(what));
  };
  json short_heads = layers;
  short_heads[1]["k"] = json::array({0.5, 0.5});
  refused({{"schema", "kvgate.kv-scales/1"}, {"layers", short_heads}}, "layers[1].k", "give one scale per KV head (" + std::to_string(H) + ")");
  json missing = layers;
  missing.erase(missing.size() - 1);
  refused({{"schema", "kvgate.kv-scales/1"}, {"layers", missing}}, "layers", "the model has " + std::to_string(L) + " layers");
  json neg = layers;
  neg[0]["v"][1] = -0.5;
  refused({{"schema", "kvgate.kv-scales/1"}, {"layers", neg}}, "layers[0].v[1]", "not a finite KV scale > 0");
  json huge = layers;
  huge[3]["k"] = 1e300;  // inf in binary32
  refused({{"schema", "kvgate.kv-scales/1"}, {"layers", huge}}, "layers[3].k", "not a finite KV scale > 0");
  refused({{"layers", layers}}, "schema", "kvgate.kv-scales/1");
}

TEST_CASE("CLI.run.pool --kv-cache-memory and --block-size size the pool", "[gate:CLI][fmt:int8]") {
  // 96 KiB for int8 at block 8: the engine's own arithmetic decides the page count; the CLI must
  // report the same pool as the library given the same bytes, and not the default (context-sized) pool.
  const json j = run_json(model_args() + " --kv int8 --steps 4 --block-size 8 --kv-cache-memory 98304");
  EngineOptions eo = lib_options("int8");
  eo.block_size = 8;
  eo.kv_cache_memory = 98304;
  EngineStats st, def;
  lib_generate(eo, SamplerOptions{}, j["prompt_ids"].get<std::vector<int>>(), 4, &st);
  EngineOptions d = lib_options("int8");
  d.block_size = 8;
  lib_generate(d, SamplerOptions{}, j["prompt_ids"].get<std::vector<int>>(), 4, &def);
  CHECK(j["stats"]["n_blocks"].get<int>() == st.n_blocks);
  CHECK(j["stats"]["kv_pool_bytes"].get<std::size_t>() == st.kv_pool_bytes);
  CHECK(j["stats"]["block_size"].get<int>() == 8);
  CHECK(st.n_blocks != def.n_blocks);  // anti-vacuity: the budget changes the pool
  CHECK(st.kv_pool_bytes <= 98304u);
}

TEST_CASE("CLI.run.flag_limits --top-k, --threads, --block-size, --prefill-chunk and --kv-cache-memory over their limits "
          "are refused",
          "[gate:CLI][fmt:f16]") {
  // Bound: TOP_K, THREADS, BLOCK_SIZE, PREFILL_CHUNK and KV_POOL_BYTES of runtime/limits, lowered through their
  // override (inherited by the child) to exactly the value given: at the limit the run succeeds, one
  // over it exits 1 naming the flag, the value, the limit and the override -- the flag check's own
  // message, before the model is loaded or the engine sees the value.
  struct Case {
    const char* limit;
    const char* flag;
    std::uint64_t at;
  };
  for (const Case& c : {Case{"TOP_K", "--top-k", 8}, Case{"THREADS", "--threads", 2}, Case{"BLOCK_SIZE", "--block-size", 16},
                        Case{"PREFILL_CHUNK", "--prefill-chunk", 4}, Case{"KV_POOL_BYTES", "--kv-cache-memory", 1u << 20}}) {
    INFO("KVGATE_LIMIT_" << c.limit << ", " << c.flag);
    const gates::ScopedLimit lim(c.limit, c.at);
    const std::string base = "run " + model_args() + " --kv f16 --prompt Once --steps 2 " +
                             (std::string(c.flag) == "--threads" ? "" : "--threads 1 ") + c.flag + " ";
    const Run ok = kvgate_cli(base + std::to_string(c.at));
    INFO("at the limit: " << ok.err);
    CHECK(ok.rc == 0);
    const Run over = kvgate_cli(base + std::to_string(c.at + 1));
    INFO("over: " << over.err);
    CHECK(over.rc == 1);
    CHECK(over.err.find(std::string(c.flag) + ": value = " + std::to_string(c.at + 1) + " exceeds the limit " +
                        std::to_string(c.at) + " on the ") != std::string::npos);
    CHECK(over.err.find(std::string("KVGATE_LIMIT_") + c.limit + "=N") != std::string::npos);
  }
}

TEST_CASE("CLI.run.prefill_chunk --prefill-chunk reaches the engine; without it the device's default (cpu 128)",
          "[gate:CLI][fmt:f16]") {
  // The CPU run without the flag takes default_prefill_chunk("cpu") = 128 (reported as stats.prefill_chunk,
  // and the library engine with EngineOptions' default gives the same greedy ids); with --prefill-chunk 5
  // the prompt is prefilled in chunks of 5 (the stats say so, and the ids are the library engine's with
  // prefill_chunk = 5). A negative value is refused naming the flag.
  const json def = run_json(model_args() + " --kv f16 --steps 12");
  CHECK(def["stats"]["prefill_chunk"].get<int>() == default_prefill_chunk("cpu"));
  CHECK(default_prefill_chunk("cpu") == EngineOptions{}.prefill_chunk);
  CHECK(default_prefill_chunk("cuda") == 512);  // the GPU's default (docs/CUDA.md: TTFT in chunks of 128 vs 512)
  const json five = run_json(model_args() + " --kv f16 --steps 12 --prefill-chunk 5");
  CHECK(five["stats"]["prefill_chunk"].get<int>() == 5);
  EngineOptions eo = lib_options("f16");
  eo.prefill_chunk = 5;
  CHECK(five["generated_ids"].get<std::vector<int>>() ==
        lib_generate(eo, SamplerOptions{}, five["prompt_ids"].get<std::vector<int>>(), 12));
  const Run neg = kvgate_cli("run " + model_args() + " --steps 1 --prefill-chunk -1");
  CHECK(neg.rc != 0);
  CHECK_THAT(neg.err, kvgate_catch::contains("--prefill-chunk = -1 must be >= 0"));
  // --device cuda (where a device is): the GPU's default reaches the CUDA engine.
  const Run cuda = kvgate_cli("run " + model_args() + " --kv f16 --steps 1 --device cuda --json");
  if (cuda.rc == 0)  // at most the context
    CHECK(json::parse(cuda.out)["stats"]["prefill_chunk"].get<int>() == std::min(512, stories().model.config.max_seq_len));
}

TEST_CASE("CLI.run.stream --kv-resident streams and --json reports the window's own counters", "[gate:CLI][fmt:f16]") {
  const json j = run_json(model_args() + " --kv f16 --steps 60 --kv-resident 32");
  EngineOptions eo = lib_options("f16");
  eo.kv_resident = 32;
  EngineStats st;
  const std::vector<int> ids = lib_generate(eo, SamplerOptions{}, j["prompt_ids"].get<std::vector<int>>(), 60, &st);
  const json& s = j["stats"];
  CHECK(j["generated_ids"].get<std::vector<int>>() == ids);
  CHECK(s["kv_resident_tokens"].get<int>() == 32);
  CHECK(s["kv_block_lookups"].get<long long>() == st.kv_block_lookups);
  CHECK(s["kv_block_misses"].get<long long>() == st.kv_block_misses);
  CHECK(s["kv_bytes_moved"].get<long long>() == st.kv_bytes_moved);
  CHECK(s["kv_device_bytes"].get<std::size_t>() == st.kv_device_bytes);
  // Anti-vacuity: 62 tokens through a 32-token window miss, but far fewer times than they look up,
  // so every counter has its own value.
  CHECK(st.kv_block_misses > 0);
  CHECK(st.kv_block_misses < st.kv_block_lookups);
  CHECK(st.kv_bytes_moved != st.kv_block_lookups);
}

TEST_CASE("CLI.run.pp --pp / --pp-layers split the engine into pipeline stages; --json reports the topology",
          "[gate:CLI][fmt:int8]") {
  // The split generates the unsplit engine's tokens (PAR.split.* proves the logits bitwise).
  const json j = run_json(model_args() + " --kv int8 --steps 30 --pp-layers 1,3,1");
  EngineOptions eo = lib_options("int8");
  EngineStats st;
  const std::vector<int> ids = lib_generate(eo, SamplerOptions{}, j["prompt_ids"].get<std::vector<int>>(), 30, &st);
  const json& s = j["stats"];
  CHECK(j["generated_ids"].get<std::vector<int>>() == ids);
  CHECK(s["pipeline_stages"].get<int>() == 3);
  CHECK(s["stage_layers"].get<std::vector<int>>() == std::vector<int>{1, 3, 1});
  CHECK(s["topology"].get<std::string>() == "pipeline:1+3+1");
  CHECK(s["kv_pool_bytes"].get<std::size_t>() == st.kv_pool_bytes);  // the stages' pools add up to one
  CHECK(st.topology == "single");
  const json two = run_json(model_args() + " --kv int8 --steps 4 --pp 2");
  CHECK(two["stats"]["stage_layers"].get<std::vector<int>>() == std::vector<int>{3, 2});
  const Run bad = kvgate_cli("run " + model_args() + " --steps 1 --pp 2 --pp-layers 4,2");
  CHECK(bad.rc != 0);
  CHECK_THAT(bad.err, kvgate_catch::contains("--pp-layers 4,2 does not split the model's 5 layers"));
}

TEST_CASE("CLI.run.tp --tp splits the engine into tensor-parallel ranks; --json reports the topology",
          "[gate:CLI][fmt:int8]") {
  // The CLI's ranks generate what the library's engine with the same split generates (PAR.tp.*
  // bounds the split against the unsplit pass).
  const json j = run_json(model_args() + " --kv int8 --steps 24 --tp 2");
  EngineOptions eo = lib_options("int8");
  eo.tensor_parallel = 2;
  EngineStats st;
  const std::vector<int> ids = lib_generate(eo, SamplerOptions{}, j["prompt_ids"].get<std::vector<int>>(), 24, &st);
  const json& s = j["stats"];
  CHECK(j["generated_ids"].get<std::vector<int>>() == ids);
  CHECK(s["tensor_parallel"].get<int>() == 2);
  CHECK(s["topology"].get<std::string>() == "tensor:2");
  CHECK(s["kv_pool_bytes"].get<std::size_t>() == st.kv_pool_bytes);
  CHECK(st.topology == "tensor:2");
  // Anti-vacuity: without the flag the run is unsplit.
  CHECK(run_json(model_args() + " --kv int8 --steps 2")["stats"]["topology"].get<std::string>() == "single");
  const Run three = kvgate_cli("run " + model_args() + " --steps 1 --tp 3");
  CHECK(three.rc != 0);
  CHECK_THAT(three.err, kvgate_catch::contains("--tp 3 does not divide the model's 4 KV heads"));
  const Run zero = kvgate_cli("run " + model_args() + " --steps 1 --tp 0");
  CHECK(zero.rc != 0);
  CHECK_THAT(zero.err, kvgate_catch::contains("--tp = 0 must be >= 1"));
  {  // --conv-id with --tp on the CPU: the second turn hydrates the first turn's file (PAR.tp.persist
     // checks the bytes); the file moves to an unsplit run too.
    Scratch sc;
    const std::string conv = model_args() + " --kv int8 --steps 4 --conv-id tp --kv-cache-dir " + q((sc.dir / "kv").string());
    const json t1 = run_json(conv + " --tp 2 --prompt " + q("Once upon a time"));
    CHECK(t1["stats"]["hydrated_tokens"].get<int>() == 0);
    const json t2 = run_json(conv + " --tp 2 --prompt " + q(" there was"));
    CHECK(t2["stats"]["hydrated_tokens"].get<int>() > 0);
    CHECK(t2["stats"]["topology"].get<std::string>() == "tensor:2");
    const json t3 = run_json(conv + " --prompt " + q(" a fox"));
    CHECK(t3["stats"]["hydrated_tokens"].get<int>() > t2["stats"]["hydrated_tokens"].get<int>());
  }
  // --device cuda: the CUDA engine splits too (PAR.cuda.tp.*); what it refuses is refused before anything
  // loads, naming both options and the fix, on any machine (with or without a GPU or the CUDA backend).
  const Run cuda_pp = kvgate_cli("run " + model_args() + " --steps 1 --tp 2 --pp 2 --device cuda");
  CHECK(cuda_pp.rc != 0);
  CHECK_THAT(cuda_pp.err, kvgate_catch::contains("--tp 2 with --device cuda and a layer split (--pp)"));
  CHECK_THAT(cuda_pp.err, kvgate_catch::contains("drop one of --tp and --pp"));
  // Anti-vacuity: --tp 2 alone with --device cuda is not refused by the split checks, nor with
  // --kv-resident (each rank streams its own window: PAR.cuda.tp.stream.*) or --conv-id (KV files with
  // the split: PAR.cuda.tp.persist.*); they fail only where no CUDA backend or device is (and run where
  // one is).
  Scratch cuda_sc;
  const std::string cuda_conv = " --conv-id tp --kv-cache-dir " + q((cuda_sc.dir / "kv").string());
  for (const std::string& extra : {std::string(), std::string(" --kv-resident 64"), cuda_conv}) {
    const Run cuda = kvgate_cli("run " + model_args() + " --steps 1 --tp 2 --device cuda" + extra);
    INFO("--tp 2 --device cuda" << extra << ": " << cuda.err);
    CHECK(cuda.err.find("--tp 2 with --device cuda and") == std::string::npos);
    if (cuda.rc != 0) CHECK_THAT(cuda.err, kvgate_catch::contains("--device cuda"));
  }
}

TEST_CASE("CLI.chat.stream kvgate chat --kv-resident streams the conversation's KV", "[gate:CLI][fmt:f16]") {
  const Run r = kvgate_cli("chat " + model_args() + " --kv f16 --steps 40 --threads 1 --kv-resident 32",
                           "Once upon\n/stats\n/quit\n");
  INFO("stderr: " << r.err);
  REQUIRE(r.rc == 0);
  // /stats prints "block lookups L, misses M, bytes moved B": a streaming engine looks pages up and
  // misses some (43 tokens through a 32-token window); a resident one reports 0 lookups.
  const auto at = r.err.find("block lookups ");
  REQUIRE(at != std::string::npos);
  long long lookups = -1, misses = -1;
  REQUIRE(std::sscanf(r.err.c_str() + at, "block lookups %lld, misses %lld", &lookups, &misses) == 2);
  CHECK(lookups > 0);
  CHECK(misses > 0);
  // Anti-vacuity: without the flag the same chat looks nothing up.
  const Run plain = kvgate_cli("chat " + model_args() + " --kv f16 --steps 40 --threads 1", "Once upon\n/stats\n/quit\n");
  REQUIRE(plain.rc == 0);
  CHECK(plain.err.find("block lookups 0, misses 0") != std::string::npos);
}

TEST_CASE("CLI.run.strict --strict-kv refuses a fallback that the plain run takes", "[gate:CLI][fmt:q8_0][fmt:k8v4]") {
  // A model whose rows (2 KV heads x head_dim 12 = 24) are no multiple of 32 and whose head_dim is
  // no power of two: q8_0 and k8v4 fall back on it (docs/FORMATS.md, capability rules).
  Scratch s;
  SynthOptions so = kvgate::gates::odd_geometry_options(1, 64);  // gates/common/model_fixtures.hpp
  so.out = (s.dir / "m").string();
  synth_hf(so);
  for (const char* f : {"q8_0", "k8v4"}) {
    INFO("format " << f);
    const Run plain = kvgate_cli("run --model " + q(so.out) + " --kv " + f + " --steps 2 --threads 1 --json");
    INFO("plain stderr: " << plain.err);
    REQUIRE(plain.rc == 0);
    const json j = json::parse(plain.out);
    CHECK(j["stats"]["effective_kv"] != f);  // anti-vacuity: it really falls back
    CHECK_FALSE(j["stats"]["fallback_reason"].get<std::string>().empty());
    const Run strict = kvgate_cli("run --model " + q(so.out) + " --kv " + f + " --steps 2 --threads 1 --json --strict-kv");
    INFO("strict stderr: " << strict.err);
    CHECK(strict.rc != 0);
    CHECK(strict.out.find("generated_ids") == std::string::npos);
    CHECK(strict.err.find(f) != std::string::npos);  // the refusal names the format
  }
}

TEST_CASE("CLI.run.conversation_full a turn that overflows the context is refused with how to go on; the file is kept",
          "[gate:CLI][fmt:f16]") {
  // stories260K's context is 512 tokens. Turn 1 (BOS + 100 x "Once upon a time " = 402 tokens, plus
  // the sampled one) fits; turn 2 adds 120 more and cannot. The refusal names the conversation, its
  // file, the counts and the ways on (a shorter prompt with its maximum, a new --conv-id, deleting the
  // file), exits non-zero and leaves the file byte-identical, so turn 3 with a short prompt still works.
  Scratch s;
  const std::string conv = " --conv-id full --kv-cache-dir " + q(s.dir.string()) + " --kv f16 --threads 1";
  std::string long_text, more;
  for (int i = 0; i < 100; ++i) long_text += "Once upon a time ";
  for (int i = 0; i < 30; ++i) more += "Once upon a time ";
  const Run t1 = kvgate_cli("run " + model_args() + conv + " --steps 1 --prompt " + q(long_text));
  INFO("turn 1 stderr: " << t1.err);
  REQUIRE(t1.rc == 0);
  const fs::path file = s.dir / "full.kvf";
  REQUIRE(fs::is_regular_file(file));
  const std::string before = slurp(file);

  const Run t2 = kvgate_cli("run " + model_args() + conv + " --steps 4 --prompt " + q(more));
  INFO("turn 2 stderr: " << t2.err);
  CHECK(t2.rc != 0);
  CHECK(t2.rc < 128);  // refused, not a crash
  CHECK(t2.err.find("conversation 'full'") != std::string::npos);
  CHECK(t2.err.find(file.string()) != std::string::npos);
  CHECK(t2.err.find("holds 403 tokens") != std::string::npos);  // 402 prompt ids + the sampled one
  CHECK(t2.err.find("exceed the context of 512 tokens") != std::string::npos);
  CHECK(t2.err.find("at most 109 tokens") != std::string::npos);
  CHECK(t2.err.find("--conv-id") != std::string::npos);
  CHECK(t2.out.find("Once upon") == std::string::npos);  // refused before the prompt is echoed
  CHECK(slurp(file) == before);

  // Anti-vacuity: a turn that fits goes on from the same file.
  const Run t3 = kvgate_cli("run " + model_args() + conv + " --steps 2 --prompt " + q(" The end"));
  INFO("turn 3 stderr: " << t3.err);
  CHECK(t3.rc == 0);
  CHECK(slurp(file) != before);
}

// ---- kvgate formats --json: every number against the format traits ------------------------------------

namespace {
// One preset row of `kvgate formats` (the table), by name: its page-bytes column.
std::size_t table_page_bytes(const std::string& table, const std::string& preset) {
  std::istringstream in(table);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream w(line);
    std::string name, k, v;
    double kc = 0, vc = 0, c = 0;
    std::size_t page = 0;
    if ((w >> name >> k >> v >> kc >> vc >> c >> page) && name == preset) return page;
  }
  return 0;
}
}  // namespace

TEST_CASE("CLI.formats.json page and cell bytes of each half == the format traits (K != V on asymmetric presets)",
          "[gate:CLI][fmt:k8v4][fmt:int8][fmt:q4_0][fmt:f16]") {
  // The reference is the runtime's traits (page_bytes, bytes_per_cell, page_runs of one half), which
  // STO.bytes proves equal to the docs/FORMATS.md formulas written apart from the runtime tables;
  // this gate proves the CLI reports them per half and does not derive one half from the other.
  // The class it closes: a JSON or table field wired to the wrong half (2 x the K page, V's cell
  // bytes from K), which every symmetric preset hides. Bound: exact (integers; the cell bytes are
  // page / (B x H), exact binary64 quotients of small integers).
  struct Geo {
    int D, H, B;
  };
  int asymmetric = 0;
  for (const Geo g : {Geo{128, 8, 16}, Geo{64, 4, 32}, Geo{256, 2, 8}}) {
    const std::string args = " --head-dim " + std::to_string(g.D) + " --kv-heads " + std::to_string(g.H) +
                             " --block-size " + std::to_string(g.B);
    const Run r = kvgate_cli("formats --json" + args);
    INFO("kvgate formats --json" << args << "\nstderr: " << r.err);
    REQUIRE(r.rc == 0);
    const json arr = json::parse(r.out);
    const Run t = kvgate_cli("formats" + args);
    REQUIRE(t.rc == 0);
    const PageGeometry pg{g.B, g.H, g.D};
    REQUIRE(arr.size() == presets().size());
    for (const Preset& p : presets()) {
      const std::string pname(p.name);
      INFO("preset " << pname);
      const json* row = nullptr;
      for (const json& x : arr)
        if (x.value("name", "") == pname) row = &x;
      REQUIRE(row != nullptr);
      const std::size_t kp = page_bytes(p.fmt.k, pg), vp = page_bytes(p.fmt.v, pg);
      CHECK((*row)["k"].get<std::string>() == std::string(name(p.fmt.k)));
      CHECK((*row)["v"].get<std::string>() == std::string(name(p.fmt.v)));
      CHECK((*row)["k_page_bytes"].get<std::size_t>() == kp);
      CHECK((*row)["v_page_bytes"].get<std::size_t>() == vp);
      CHECK((*row)["page_bytes"].get<std::size_t>() == kp + vp);
      CHECK((*row)["k_bytes_per_cell"].get<double>() == bytes_per_cell(p.fmt.k, pg));
      CHECK((*row)["v_bytes_per_cell"].get<double>() == bytes_per_cell(p.fmt.v, pg));
      CHECK((*row)["bytes_per_cell"].get<double>() == bytes_per_cell(p.fmt.k, pg) + bytes_per_cell(p.fmt.v, pg));
      CHECK((*row)["supported"].get<bool>() == (supports(p.fmt.k, pg).ok && supports(p.fmt.v, pg).ok));
      // Each half's page runs tile exactly its own page.
      for (const char* half : {"k_half", "v_half"}) {
        std::size_t sum = 0;
        for (const json& run : (*row)[half]["page_runs"]) sum += run["bytes"].get<std::size_t>();
        CHECK(sum == (half[0] == 'k' ? kp : vp));
      }
      CHECK(table_page_bytes(t.out, pname) == kp + vp);
      asymmetric += kp != vp;
    }
  }
  CHECK(asymmetric >= 3);  // anti-vacuity: k8v4 (int8 K, q4_0_rot V) at each geometry
}

// ---- kvgate run --conv-id: a continued turn gets no BOS in the middle ----------------------------------

TEST_CASE("CLI.run.conv a continued --conv-id turn appends the new text without a BOS; the first turn starts with one",
          "[gate:CLI][fmt:f16]") {
  // The rule (docs/KV_FILE.md "Prompt = the file's transcript + the new text (no BOS)"): the tokenizer's
  // BOS starts the transcript once; each later turn appends encode(text) without specials, so the
  // transcript equals the one-shot encoding of the turns in order. Bound: exact ids.
  Scratch s;
  const std::string conv = model_args() + " --kv f16 --steps 6 --conv-id gate --kv-cache-dir " + q((s.dir / "kv").string());
  const json t1 = run_json(conv + " --prompt " + q("Once upon a time"));
  const json t2 = run_json(conv + " --prompt " + q(" there was"));
  const Model& m = stories().model;
  const std::vector<int> first = m.tokenizer->encode("Once upon a time", true);
  REQUIRE(!first.empty());
  REQUIRE(first.front() == m.config.bos_id);  // anti-vacuity: the tokenizer adds a BOS with specials
  CHECK(t1["prompt_ids"].get<std::vector<int>>() == first);
  std::vector<int> expect = t1["prompt_ids"].get<std::vector<int>>();
  for (int id : t1["generated_ids"].get<std::vector<int>>()) expect.push_back(id);
  const std::vector<int> fresh = m.tokenizer->encode(" there was", false);
  REQUIRE(!fresh.empty());
  REQUIRE(fresh.front() != m.config.bos_id);
  expect.insert(expect.end(), fresh.begin(), fresh.end());
  CHECK(t2["prompt_ids"].get<std::vector<int>>() == expect);
  const std::vector<int> ids2 = t2["prompt_ids"].get<std::vector<int>>();
  CHECK(std::count(ids2.begin(), ids2.end(), m.config.bos_id) == 1);
}

TEST_CASE("CLI.run.kv_aliases vLLM --kv-cache-dtype and llama.cpp -ctk/-ctv name the same formats as --kv",
          "[gate:CLI][fmt:fp8][fmt:fp8_e5m2][fmt:bf16][fmt:q8_0][fmt:q4_0]") {
  // The mapping (docs/FORMATS.md "Flag aliases", cli/kv_aliases.hpp) is checked against what the
  // other engines' documentation says each value is, written here by hand: vLLM fp8 and fp8_e4m3 are
  // E4M3 with a per-tensor scale (kvgate fp8), fp8_e5m2 is E5M2, bfloat16 is bf16, auto is the model's
  // own KV (no --kv); llama.cpp's -ctk/-ctv name one half each, the other staying f16. Each alias run
  // must report the same requested and effective format and generate the same ids as the --kv run.
  // Anti-vacuity: the expected formats differ pairwise (fp8 vs fp8_e5m2, q8_0/q4_0 vs their swap), so
  // an alias mapped to a neighbour fails.
  struct Case {
    std::string alias, kv;
  };
  const std::vector<Case> cases = {
      {"--kv-cache-dtype fp8", "--kv fp8"},
      {"--kv-cache-dtype fp8_e4m3", "--kv fp8"},
      {"--kv-cache-dtype fp8_e5m2", "--kv fp8_e5m2"},
      {"--kv-cache-dtype bfloat16", "--kv bf16"},
      {"--kv-cache-dtype auto", ""},
      {"-ctk q8_0 -ctv q4_0", "--kv k=q8_0,v=q4_0"},
      {"--cache-type-k=q4_0 --cache-type-v=q8_0", "--kv k=q4_0,v=q8_0"},
      {"-ctk q8_0", "--kv k=q8_0,v=f16"},
      {"-ctv=q4_0", "--kv k=f16,v=q4_0"},
  };
  const std::string a = model_args() + " --steps 12 --prompt " + q("Once upon a time");
  std::vector<std::string> effective;
  for (const Case& c : cases) {
    const json x = run_json(a + " " + c.alias), y = run_json(a + " " + c.kv);
    INFO(c.alias << " vs '" << c.kv << "'");
    CHECK(x["stats"]["requested_kv"] == y["stats"]["requested_kv"]);
    CHECK(x["stats"]["effective_kv"] == y["stats"]["effective_kv"]);
    CHECK(x["generated_ids"] == y["generated_ids"]);
    effective.push_back(x["stats"]["effective_kv"].get<std::string>());
  }
  CHECK(effective[0] != effective[2]);  // fp8 != fp8_e5m2
  CHECK(effective[5] != effective[6]);  // k=q8_0,v=q4_0 != its swap
  CHECK(effective[7] != effective[8]);

  // No exact equivalent: refused as a usage error naming the flag, the value and the nearest format.
  struct Refusal {
    std::string args, needle;
  };
  for (const Refusal& r : {Refusal{"-ctk q5_1", "--cache-type-k q5_1 has no exact kvgate equivalent; the nearest is q8_0"},
                           Refusal{"--cache-type-v iq4_nl", "--cache-type-v iq4_nl has no exact kvgate equivalent; the nearest is q4_0"},
                           Refusal{"--kv-cache-dtype fp8_ds_mla", "the nearest is k=fp8_block128,v=bf16 with --mla-cache latent"},
                           Refusal{"--kv-cache-dtype fp9", "is not a value --kv-cache-dtype takes"},
                           Refusal{"--kv fp8 --kv-cache-dtype fp8", "name the KV format one way"},
                           Refusal{"--kv-cache-dtype fp8 -ctk q8_0", "name the KV format one way"}}) {
    const Run run = kvgate_cli("run " + a + " --threads 1 " + r.args);
    INFO(r.args << "\nstderr: " << run.err);
    CHECK(run.rc != 0);
    CHECK(run.rc < 128);
    CHECK(run.err.find(r.needle) != std::string::npos);
    CHECK(run.out.find("generated_ids") == std::string::npos);
  }
}

TEST_CASE("CLI.run.kv_layers --kv-layers and vLLM's --kv-cache-dtype-skip-layers reach the engine as the per-layer map",
          "[gate:CLI][fmt:int8][fmt:fp8][fmt:f16][fmt:q4_0]") {
  // The flags as docs/FORMATS.md ("Per-layer maps") says: --kv-layers names every layer's format
  // (instead of --kv); --kv-cache-dtype-skip-layers keeps the listed layers on the model's own KV
  // (stories260K declares none: f16) and gives the others the --kv-cache-dtype format. The run's JSON
  // stats carry the map, each layer's format and KV bytes per token (K + V page bytes / block, from
  // the page sizes), and kv_bytes adds the layers' pages. A map with one format everywhere runs as
  // --kv of that format (same ids, no map). Anti-vacuity: the mapped run's ids or KV bytes differ
  // from the uniform runs of either of its formats. Exact.
  const std::string a = model_args() + " --steps 12 --prompt " + q("Once upon a time");
  const json m = run_json(a + " --kv-layers " + q("0-1:f32,*:q4_0"));
  const json& st = m["stats"];
  CHECK(st["effective_kv"] == "0-1:f32,2-4:q4_0");
  CHECK(st["requested_source"] == "flag:--kv-layers");
  REQUIRE(st.contains("kv_layers"));
  CHECK(st["kv_layers"]["map"] == "0-1:f32,2-4:q4_0");
  CHECK(st["kv_layers"]["formats"] == json({"f32", "f32", "q4_0", "q4_0", "q4_0"}));
  const PageGeometry g{16, 4, 8};  // stories260K: 4 KV heads of 8
  const double f32b = static_cast<double>(2 * page_bytes(HalfFormat::f32, g)) / 16.0;
  const double q4b = static_cast<double>(2 * page_bytes(HalfFormat::q4_0, g)) / 16.0;
  CHECK(st["kv_layers"]["kv_bytes_per_token"] == json({f32b, f32b, q4b, q4b, q4b}));
  const json f32run = run_json(a + " --kv f32"), q4run = run_json(a + " --kv q4_0");
  CHECK(f32run["stats"]["kv_bytes"].get<double>() / 5 * 2 + q4run["stats"]["kv_bytes"].get<double>() / 5 * 3 ==
        st["kv_bytes"].get<double>());
  CHECK(st["kv_bytes"] != f32run["stats"]["kv_bytes"]);
  CHECK(st["kv_bytes"] != q4run["stats"]["kv_bytes"]);
  CHECK(!f32run["stats"].contains("kv_layers"));

  const json skip = run_json(a + " --kv-cache-dtype fp8 --kv-cache-dtype-skip-layers 0,4");
  CHECK(skip["stats"]["kv_layers"]["formats"] == json({"f16", "fp8", "fp8", "fp8", "f16"}));
  CHECK(skip["stats"]["effective_kv"] == "0:f16,1-3:fp8,4:f16");
  const json uniform = run_json(a + " --kv-layers " + q("*:int8")), int8run = run_json(a + " --kv int8");
  CHECK(uniform["stats"]["effective_kv"] == "int8");
  CHECK(uniform["generated_ids"] == int8run["generated_ids"]);
  CHECK(!uniform["stats"].contains("kv_layers"));

  struct Refusal {
    std::string args, needle;
  };
  for (const Refusal& r : {Refusal{"--kv-layers " + q("0-1:f32,1:q4_0"), "--kv-layers: layer 1 is named twice"},
                           Refusal{"--kv-layers " + q("0-2:int8"), "layers 3,4 have no format"},
                           Refusal{"--kv-layers " + q("0-7:int8"), "layer 7 is out of range: the model has 5 layers"},
                           Refusal{"--kv int8 --kv-layers " + q("*:int8"), "put the rest in the map as '*:int8'"},
                           Refusal{"--kv-cache-dtype-skip-layers 0", "without a KV format for the other layers"},
                           Refusal{"--kv-layers " + q("*:int8") + " --kv-cache-dtype-skip-layers 0", "name the per-layer map one way"}}) {
    const Run run = kvgate_cli("run " + a + " " + r.args);
    INFO(r.args << "\nstderr: " << run.err);
    CHECK(run.rc != 0);
    CHECK(run.rc < 128);
    CHECK(run.err.find(r.needle) != std::string::npos);
    CHECK(run.out.find("generated_ids") == std::string::npos);
  }
}

// The DeepSeek-V3 transformers reference (an MLA model) in the source tree (KVGATE_SOURCE_DIR, else
// the tree this gate was built from).
std::string deepseek_v3_ref() {
  std::string src;
  if (const char* e = std::getenv("KVGATE_SOURCE_DIR"); e && *e) src = e;
  if (src.empty()) src = KVGATE_SOURCE_DIR_DEFAULT;
  return (fs::path(src) / "datasets/models/hf_refs/models/deepseek_v3").string();
}

// A quick sign-off fixture: a tiny synthetic model whose KV rows are no multiple of 32 (2 KV heads x
// head_dim 12), a corpus of `n_ids` token ids and an empty gates folder. Returns the model folder.
std::string tiny_signoff_setup(const Scratch& s, int n_ids) {
  SynthOptions so = kvgate::gates::odd_geometry_options(1, 96);
  so.out = (s.dir / "m").string();
  synth_hf(so);
  std::ofstream ids(s.dir / "ids.txt");
  for (int i = 0; i < n_ids; ++i) ids << (3 + (i * 37) % 290) << (i + 1 < n_ids ? " " : "\n");
  fs::create_directories(s.dir / "no_gates");
  return so.out;
}
// `kvgate signoff <args> --quick ...` on that fixture, the report in s.dir/out.
std::string tiny_signoff_command(const Scratch& s, const std::string& args, const std::string& model, const std::string& out) {
  return "signoff " + args + " --quick --no-timing --no-sensitivity --threads 1 --model " + q(model) +
         " --probe-model none --no-project-corpus --corpus " + q((s.dir / "ids.txt").string()) + " --gates-dir " +
         q((s.dir / "no_gates").string()) + " --out " + q((s.dir / out).string());
}

TEST_CASE("CLI.signoff.fallback a format the device would hold as another is not measured under its name; the others are",
          "[gate:CLI][fmt:q8_0][fmt:int8][fmt:nvfp4]") {
  // On a model whose token rows (2 KV heads x head_dim 12 = 24) are no multiple of 32, q8_0 falls
  // back to f16 on the CPU backend (docs/FORMATS.md, capability rules). A sign-off that measured it
  // anyway would report f16's quality as q8_0's, and q8_0 could FIT on numbers it never produced.
  // Expected: q8_0 conformance NOT-VALIDATED naming the fallback, every fit line NOT-MEASURED with
  // the reason, no quality record and no matrix entry for it; int8 (held as asked) measured.
  // On --device cuda (a CUDA build; no device needed for the resolution) every half format has CUDA
  // kernels (nvfp4: the generic decode kernel), so on stories260K nvfp4 and int8 are both held as
  // asked and neither is flagged: a format marked unsupported on CUDA again would show here.
  Scratch s;
  const std::string model = tiny_signoff_setup(s, 80);
  auto signoff = [&](const std::string& device, const std::string& fmts, const std::string& m, const std::string& out) {
    const Run r = kvgate_cli(tiny_signoff_command(s, "--device " + device + " " + fmts, m, out));
    INFO("kvgate signoff --device " << device << " " << fmts << "\nstderr: " << r.err);
    REQUIRE((r.rc == 3 || r.rc == 4 || r.rc == 0));
    return json::parse(slurp(s.dir / out / "signoff.json"));
  };
  auto verdict_of = [](const json& rec, const std::string& f) {
    for (const auto& v : rec["verdicts"])
      if (v["format"] == f) return v;
    FAIL("no verdict for " << f);
    return json();
  };
  auto names_fallback = [](const json& v) {
    bool conf = false;
    for (const auto& r : v["conformance"]["reasons"]) conf = conf || r.get<std::string>().find("falls back to f16") != std::string::npos;
    return conf;
  };
  const json cpu = signoff("cpu", "--format q8_0 --format int8", model, "cpu");
  const json q8 = verdict_of(cpu, "q8_0"), i8 = verdict_of(cpu, "int8");
  CHECK(names_fallback(q8));
  CHECK(q8["fit"]["verdict"] == "NOT-MEASURED");
  CHECK(q8["quality"].is_null());
  int open_lines = 0;
  for (const auto& l : q8["fit"]["lines"]) {
    INFO(l.dump());
    if (l["status"] == "not_applicable") continue;  // e.g. decode_speedup: a cuda-only budget
    ++open_lines;
    CHECK(l["status"] == "not_measured");
    CHECK(l["reason"].get<std::string>().find("the engine holds f16") != std::string::npos);
  }
  CHECK(open_lines > 0);
  const json mj = json::parse(slurp(s.dir / "cpu" / "matrix.json"));
  for (const auto& fe : mj["formats"]) CHECK(fe["format"] != "q8_0");
  // anti-vacuity: the format held as asked is measured and not flagged
  CHECK_FALSE(names_fallback(i8));
  CHECK(i8["quality"].is_object());
  CHECK(i8["fit"]["verdict"] != "NOT-MEASURED");

  const json cu = signoff("cuda", "--format nvfp4 --format int8", stories().bin, "cuda");
  if (!cu["provenance"].value("cuda_build", false)) {
    WARN("CLI.signoff.fallback: this build has no CUDA backend: the --device cuda half is not checked");
    return;
  }
  CHECK_FALSE(names_fallback(verdict_of(cu, "nvfp4")));
  CHECK_FALSE(names_fallback(verdict_of(cu, "int8")));
}

// kvgate signoff --mla-cache latent on the DeepSeek-V3 reference (an MLA model): the matrix, the
// probes and the quality engines all run the latent cache (EngineOptions::mla_cache), so the format
// signed off is the one that holds the latent c_kv and the RoPE key. Expected: the record says so
// (provenance mla_cache, a note on the format), the matrix's int8 row holds the latent bytes per token
// from the format definitions (per layer the latent row in int8, 1 B each + an f16 scale, and the RoPE
// row likewise: L x ((kv_lora_rank + 2) + (rope_dim + 2))), and the quality differs from the expanded
// cache's (anti-vacuity: the quality engines really ran another cache). fp8_ds_mla on a synthesized
// 512-wide latent is measured as asked, not as the expanded cache's fallback. On a model without MLA
// the flag is refused before anything is written, naming the way out.
TEST_CASE("CLI.signoff.mla_cache --mla-cache latent signs off the latent cache; refused without MLA",
          "[gate:CLI][fmt:int8][fmt:fp8_block128][mla]") {
  const std::string ds = deepseek_v3_ref();
  const Model m = load_model(ds);
  REQUIRE(m.config.mla.any());
  const int L = m.config.n_layers, KL = m.config.mla.kv_lora_rank, R = m.config.mla.rope_dim;
  Scratch s;
  const std::string tiny = tiny_signoff_setup(s, 80);  // the corpus ids fit the reference's vocabulary
  REQUIRE(m.config.vocab_size > 293);
  auto signoff = [&](const std::string& cache) {
    const Run r = kvgate_cli(tiny_signoff_command(s, "--format int8 --mla-cache " + cache, ds, cache));
    INFO("kvgate signoff --mla-cache " << cache << "\nstderr: " << r.err);
    REQUIRE((r.rc == 3 || r.rc == 4 || r.rc == 0));
    return std::make_pair(json::parse(slurp(s.dir / cache / "signoff.json")), json::parse(slurp(s.dir / cache / "matrix.json")));
  };
  auto int8_of = [](const json& list, const char* key) {
    for (const auto& x : list)
      if (x[key] == "int8") return x;
    FAIL("no int8 entry");
    return json();
  };
  const auto [lat, lat_m] = signoff("latent");
  const auto [exp, exp_m] = signoff("expanded");
  CHECK(lat["provenance"].value("mla_cache", "") == "latent");
  CHECK_FALSE(exp["provenance"].contains("mla_cache"));
  const json lat_v = int8_of(lat["verdicts"], "format");
  bool noted = false;
  for (const auto& n : lat_v["notes"]) noted = noted || n.get<std::string>().find("MLA latent cache") != std::string::npos;
  INFO(lat_v["notes"].dump());
  CHECK(noted);
  CHECK(lat_m["config"]["mla_cache"] == "latent");
  CHECK(int8_of(lat_m["formats"], "format")["kv_bytes_per_token"] == L * ((KL + 2) + (R + 2)));
  CHECK(int8_of(exp_m["formats"], "format")["kv_bytes_per_token"] != int8_of(lat_m["formats"], "format")["kv_bytes_per_token"]);
  const json ql = int8_of(lat["verdicts"], "format")["quality"]["all"], qe = int8_of(exp["verdicts"], "format")["quality"]["all"];
  REQUIRE(ql.is_object());
  REQUIRE(qe.is_object());
  CHECK(ql["positions"].get<int>() > 0);
  CHECK(ql["kl_mean"].get<double>() != qe["kl_mean"].get<double>());
  // The format is resolved against the latent's rows, not the expanded heads: on a model with
  // DeepSeek-V3's latent widths (kvgate synth --arch deepseek_v3: kv_lora 512, rope 64, 2 heads of
  // nope 32 + rope 64) fp8_ds_mla (k=fp8_block128,v=bf16) holds the latent in 128-element tiles,
  // while an expanded token row (2 x 96 = 192) is no multiple of 128. With --mla-cache latent it is
  // measured as asked (656 B per token and layer); with the expanded cache it is the fallback's
  // (anti-vacuity: the two resolutions differ). A sign-off that resolved against the expanded heads
  // reported the latent run "not measured: the engine holds k=f16,v=bf16".
  {
    SynthOptions so = kvgate::gates::deepseek_latent512_options();  // gates/common/model_fixtures.hpp
    so.out = (s.dir / "ds512").string();
    synth_hf(so);
    auto ds_signoff = [&](const std::string& cache) {
      const std::string out = "ds512_" + cache;
      const Run r = kvgate_cli(tiny_signoff_command(s, "--format k=fp8_block128,v=bf16 --baseline f32 --mla-cache " + cache, so.out, out));
      INFO("stderr: " << r.err);
      REQUIRE((r.rc == 3 || r.rc == 4 || r.rc == 0));
      const json sj = json::parse(slurp(s.dir / out / "signoff.json")), mj = json::parse(slurp(s.dir / out / "matrix.json"));
      json v, row;
      for (const auto& x : sj["verdicts"])
        if (x["format"] == "k=fp8_block128,v=bf16") v = x;
      for (const auto& x : mj["formats"])
        if (x["format"] == "k=fp8_block128,v=bf16") row = x;
      return std::make_pair(v, row);
    };
    const auto [lv, lrow] = ds_signoff("latent");
    INFO("latent: " << lv.dump().substr(0, 1500));
    REQUIRE(lv.is_object());
    REQUIRE(lrow.is_object());  // the matrix measured the format itself
    CHECK(lv.dump().find("the engine holds") == std::string::npos);
    CHECK(lrow["kv_bytes_per_token"] == 2 * 656);
    CHECK(lv["quality"]["all"].is_object());
    const auto [ev, erow] = ds_signoff("expanded");
    INFO("expanded: " << ev.dump().substr(0, 1500));
    CHECK(ev.dump().find("the engine holds k=f16,v=bf16") != std::string::npos);
    CHECK(ev.dump().find("row_not_multiple_of_128") != std::string::npos);
    CHECK_FALSE(erow.is_object());
  }
  // Refused on a model without MLA, before any file is written.
  const Run bad = kvgate_cli(tiny_signoff_command(s, "--format int8 --mla-cache latent", tiny, "refused"));
  INFO("stderr: " << bad.err);
  CHECK(bad.rc != 0);
  CHECK(bad.rc < 128);
  CHECK(bad.err.find("--mla-cache latent applies to multi-head latent attention models") != std::string::npos);
  CHECK(bad.err.find("drop the flag") != std::string::npos);
  CHECK_FALSE(fs::exists(s.dir / "refused" / "signoff.json"));
  // And on --device cuda, whose sign-off of the latent cache is not offered yet (refused up front,
  // device or not).
  const Run cu = kvgate_cli(tiny_signoff_command(s, "--device cuda --format int8 --mla-cache latent", ds, "refused_cuda"));
  INFO("stderr: " << cu.err);
  CHECK(cu.rc != 0);
  CHECK(cu.rc < 128);
  CHECK(cu.err.find("a CUDA sign-off of the latent cache is not offered yet") != std::string::npos);
  CHECK_FALSE(fs::exists(s.dir / "refused_cuda" / "signoff.json"));
}

TEST_CASE("CLI.signoff.coverage --coverage puts the gate suite's coverage into signoff.json and index.md; a bad summary is refused",
          "[gate:CLI][fmt:int8]") {
  // The flag's plumbing end to end: a coverage folder written by hand (gcovr's JSON summary, its text
  // table, the scope with the commit) -> signoff.json `coverage` with the runtime/ part summed from
  // its files (by hand: 190 + 9 = 199 of 200 + 10 = 210 lines, 94.76%: missed), the bar status, the
  // unreached file with its line numbers, and the index's section; without --coverage the record
  // says "not measured". A summary without counts exits 1 naming the file and the field, and writes
  // no report.
  Scratch s;
  const std::string model = tiny_signoff_setup(s, 40);
  fs::create_directories(s.dir / "cov");
  {
    const json doc = {{"files", json::array({{{"filename", "runtime/src/a.cpp"}, {"line_covered", 190}, {"line_total", 200},
                                              {"branch_covered", 40}, {"branch_total", 50}},
                                             {{"filename", "runtime/src/b.cpp"}, {"line_covered", 9}, {"line_total", 10},
                                              {"branch_covered", 2}, {"branch_total", 2}},
                                             {{"filename", "cli/x.cpp"}, {"line_covered", 1}, {"line_total", 4},
                                              {"branch_covered", 0}, {"branch_total", 0}}})}};
    std::ofstream(s.dir / "cov" / "coverage.json") << doc.dump(1);
    std::ofstream(s.dir / "cov" / "summary.txt") << "runtime/src/a.cpp   200   190   95%   11-20\nruntime/src/b.cpp   10   9   90%   7\n";
    std::ofstream(s.dir / "cov" / "scope.txt") << "commit: feedbeef\ntargets: all\ntests: all\n";
  }
  auto signoff = [&](const std::string& extra, const std::string& out) {
    return kvgate_cli(tiny_signoff_command(s, "--format int8 " + extra, model, out));
  };
  const Run r = signoff("--coverage " + q((s.dir / "cov").string()), "with");
  INFO("stderr: " << r.err);
  REQUIRE((r.rc == 0 || r.rc == 3 || r.rc == 4));
  const json rec = json::parse(slurp(s.dir / "with" / "signoff.json"));
  const json& cov = rec["coverage"];
  INFO(cov.dump(1));
  CHECK(cov["measured"] == true);
  CHECK(cov["commit"] == "feedbeef");
  CHECK(cov["bar"]["status"] == "missed");
  REQUIRE(cov["parts"].size() == 2);
  CHECK(cov["parts"][0]["part"] == "runtime/");
  CHECK(cov["parts"][0]["lines_covered"] == 199);
  CHECK(cov["parts"][0]["lines_total"] == 210);
  CHECK(cov["total"]["lines_total"] == 214);
  REQUIRE(cov["runtime_unreached"].size() == 2);
  CHECK(cov["runtime_unreached"][0]["file"] == "runtime/src/a.cpp");
  CHECK(cov["runtime_unreached"][0]["missing"] == "11-20");
  const std::string md = slurp(s.dir / "with" / "index.md");
  CHECK(md.find("Bar: at least 95% of runtime/ lines reached by the gate suite: missed (94.8%).") != std::string::npos);
  CHECK(md.find("| runtime/src/a.cpp | 10 | 95.0% | 11-20 |") != std::string::npos);

  const Run plain = signoff("", "without");
  REQUIRE((plain.rc == 0 || plain.rc == 3 || plain.rc == 4));
  const json rec2 = json::parse(slurp(s.dir / "without" / "signoff.json"));
  CHECK(rec2["coverage"]["measured"] == false);
  CHECK(rec2["coverage"]["bar"]["status"] == "not measured");

  std::ofstream(s.dir / "bad.json") << R"({"files": [{"filename": "runtime/a.cpp", "line_covered": 3}]})";
  const Run bad = signoff("--coverage " + q((s.dir / "bad.json").string()), "bad");
  INFO("bad stderr: " << bad.err);
  CHECK(bad.rc == 1);
  CHECK(bad.err.find("bad.json") != std::string::npos);
  CHECK(bad.err.find("files[0].line_total") != std::string::npos);
  CHECK_FALSE(fs::exists(s.dir / "bad" / "signoff.json"));
}

// CLI.mla_cache: --mla-cache reaches the engine from `kvgate run` (--json: stats.kv_layout names the
// latent and the RoPE key with their half formats) and the A/B matrix from `kvgate bench`
// (config.mla_cache; every format's kv_bytes_per_token is the latent cache's: n_layers x (latent
// row + RoPE row), written out here from the format definitions for f32, int8 (1 B + an f16 scale per
// row) and k=q8_0,v=bf16 (34 B per 32 elements; 2 B)); the expanded cache's bytes differ (anti-vacuity).
// On a model without MLA both refuse the flag, naming it.
TEST_CASE("CLI.mla_cache --mla-cache latent reaches kvgate run and kvgate bench; refused without MLA",
          "[gate:CLI][fmt:f32][fmt:int8][mla]") {
  const std::string ds = deepseek_v3_ref();
  const Model m = load_model(ds);
  const int L = m.config.n_layers, KL = m.config.mla.kv_lora_rank, R = m.config.mla.rope_dim;
  REQUIRE(KL % 32 == 0);
  const json j = run_json("--model " + q(ds) + " --prompt hello --steps 2 --mla-cache latent --kv k=int8,v=bf16");
  const std::string layout = j["stats"]["kv_layout"].get<std::string>();
  INFO("kv_layout: " << layout);
  CHECK(layout.rfind("mla_latent", 0) == 0);
  CHECK(layout.find("in int8 (the K half)") != std::string::npos);
  CHECK(layout.find("in bf16 (the V half)") != std::string::npos);
  Scratch s;
  auto bench = [&](const std::string& extra) {
    const fs::path out = s.dir / ("bench" + std::to_string(std::hash<std::string>{}(extra) % 100000));
    const Run r = kvgate_cli("bench --model " + q(ds) + " --formats int8,k=q8_0,v=bf16 --quick --no-probes --no-timing "
                             "--corpus none --out " + q(out.string()) + " " + extra);
    INFO("kvgate bench " << extra << "\nstderr: " << r.err);
    REQUIRE(r.rc == 0);
    return json::parse(slurp(out / "matrix.json"));
  };
  const json lat = bench("--mla-cache latent"), exp = bench("");
  CHECK(lat["config"]["mla_cache"] == "latent");
  CHECK(exp["config"]["mla_cache"] == "expanded");
  std::map<std::string, long> want{{"f32", 4L * L * (KL + R)},
                                   {"int8", 1L * L * (KL + 2 + R + 2)},
                                   {"k=q8_0,v=bf16", 1L * L * (34 * KL / 32 + 2 * R)}};
  for (const auto& f : lat["formats"]) {
    const std::string n = f["format"].get<std::string>();
    INFO("format " << n);
    REQUIRE(want.count(n));
    CHECK(f["kv_bytes_per_token"].get<long>() == want[n]);
    CHECK(f["effective"] == f["requested"]);
  }
  for (const auto& f : exp["formats"]) CHECK(f["kv_bytes_per_token"].get<long>() != want[f["format"].get<std::string>()]);
  // The engines really ran the latent cache: each row's pool (from the engine's own stats) holds as
  // many tokens as the expanded run's row, each at its layout's bytes per token.
  int compared = 0;
  for (const auto& lr : lat["rows"])
    for (const auto& er : exp["rows"])
      if (lr["format"] == er["format"] && lr["context"] == er["context"] && lr["window"] == er["window"] &&
          lr["device"] == er["device"] && lr["pool_bytes"].is_number() && er["pool_bytes"].is_number()) {
        INFO("row " << lr["format"] << " context " << lr["context"] << ": latent pool " << lr["pool_bytes"]
                    << ", expanded pool " << er["pool_bytes"]);
        CHECK(lr["pool_bytes"].get<long>() * er["kv_bytes_per_token"].get<long>() ==
              er["pool_bytes"].get<long>() * lr["kv_bytes_per_token"].get<long>());
        ++compared;
      }
  CHECK(compared > 0);
  const Run rr = kvgate_cli("run " + model_args() + " --prompt hi --steps 1 --mla-cache latent");
  INFO("run without MLA: " << rr.err);
  CHECK(rr.rc != 0);
  CHECK(rr.err.find("--mla-cache latent") != std::string::npos);
  const Run rb = kvgate_cli("bench " + model_args() + " --formats int8 --quick --no-probes --no-timing --corpus none --out " +
                            q((s.dir / "nomla").string()) + " --mla-cache latent");
  INFO("bench without MLA: " << rb.err);
  CHECK(rb.rc != 0);
  CHECK(rb.err.find("--mla-cache latent") != std::string::npos);
}
