// `kvgate run`: load a model, resolve the KV format, generate, print the text (or JSON with stats).
// --device cuda runs the whole forward on the GPU (kvgate::cuda::CudaEngine) when the CUDA backend
// is built (compile definition KVGATE_WITH_CUDA_MODEL); the KV format is then resolved against
// backend "cuda" (what the CUDA ops can run).
#include <algorithm>
#include <chrono>
#include <fstream>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "commands.hpp"
#include "kv_flags.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/kv_cache_dir.hpp"
#include "kvgate/model.hpp"
#include "kvgate/resolve.hpp"
#ifdef KVGATE_WITH_CUDA_MODEL
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/cuda/ops.hpp"
#endif

namespace kvgate::cli {

namespace {

struct RunOpts : EngineFlags {  // the flags shared with `kvgate chat` (kv_flags.hpp), and:
  std::string kv_k, kv_v, prompt;
  int steps = 256;
  bool json = false;
  bool no_bos = false;
  std::string device = "cpu";
  bool cuda_graphs = true;
  std::string weights = "as-stored";  // 16-bit checkpoint weights: as stored (mapped) or converted to f32
  std::string cuda_weights = "f32";   // --device cuda: weights on the GPU
  std::string devices;                // --devices 0,1: the CUDA device of each pipeline stage
};

// --devices "0,1" -> {0, 1}; empty -> {}. Indices are checked against the machine by the engine.
std::vector<int> parse_devices(const std::string& s) {
  return parse_int_list("--devices", s, 0, "a device index",
                        "CUDA device indices separated by commas, e.g. --devices 0,1");
}

WeightStorage weight_storage(const std::string& v) {
  if (v == "as-stored") return WeightStorage::as_stored;
  if (v == "f32") return WeightStorage::f32;
  throw std::invalid_argument("--weights must be as-stored or f32, got '" + v + "'");
}

std::optional<KvFormat> requested_format(const RunOpts& o) {
  if (!o.kv.empty() && (!o.kv_k.empty() || !o.kv_v.empty()))
    throw std::invalid_argument("give either --kv PRESET or --kv-k/--kv-v, not both");
  if (!o.kv.empty()) {
    auto f = parse_kv_format(o.kv);
    if (!f) throw std::invalid_argument("unknown KV format '" + o.kv + "' (" + known_formats_text() + ")");
    return f;
  }
  if (o.kv_k.empty() != o.kv_v.empty()) throw std::invalid_argument("--kv-k and --kv-v must be given together");
  if (!o.kv_k.empty()) {
    const auto k = parse_half(o.kv_k), v = parse_half(o.kv_v);
    if (!k) throw std::invalid_argument("unknown K half format '" + o.kv_k + "' (" + known_formats_text() + ")");
    if (!v) throw std::invalid_argument("unknown V half format '" + o.kv_v + "' (" + known_formats_text() + ")");
    return KvFormat{*k, *v};
  }
  return std::nullopt;
}

template <class E>
int generate_and_print(const RunOpts& o, const Model& model, E& engine);

// The process's memory from /proc/self/status (kB lines): peak resident set, and the resident set now
// split into anonymous pages (copies the process made, e.g. FP32 weights) and file-backed ones (the
// mapped checkpoint). Absent fields are left out (not Linux).
nlohmann::json process_memory() {
  nlohmann::json j = nlohmann::json::object();
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    std::string rest;
    std::getline(f, rest);
    for (const auto& [k, name] : {std::pair<const char*, const char*>{"VmHWM:", "peak_rss_bytes"},
                                  {"RssAnon:", "rss_anon_bytes"},
                                  {"RssFile:", "rss_file_bytes"}})
      if (key == k) j[name] = std::strtoull(rest.c_str(), nullptr, 10) * 1024ull;
  }
  return j;
}

// Tokens whose K/V rows the engine holds (both engines keep the history for conversations).
template <class E>
std::size_t tokens_in_kv(E& engine) {
  return engine.history().size();
}

int run_run(const RunOpts& o) {
  if (o.steps < 0) throw std::invalid_argument("--steps must be >= 0");
  check_engine_flags(o);
  if (o.device != "cpu" && o.device != "cuda")
    throw std::invalid_argument("--device must be cpu or cuda, got '" + o.device + "'");
  const bool cuda = o.device == "cuda";
  const std::vector<int> devices = parse_devices(o.devices);
  if (!cuda && !devices.empty())
    throw std::invalid_argument("--devices " + o.devices + ": CUDA devices of the pipeline stages or tensor-parallel "
                                "ranks; give --device cuda, or leave --devices out");
  if (cuda && o.tp > 1) {  // the CUDA engine's tensor parallelism (kvgate/cuda/tensor_parallel.hpp): what it refuses,
                           // before anything loads (the engine refuses the same by name)
    const std::string tp = "--tp " + std::to_string(o.tp) + " with --device cuda";
    if ((o.pp && *o.pp > 1) || parse_pp_layers(o.pp_layers).size() > 1)
      throw std::invalid_argument(tp + " and a layer split (--pp): the CUDA engine splits one way at a time; drop one "
                                  "of --tp and --pp");
  }
  const std::optional<KvFormat> flag = requested_format(o);  // before loading: a typo fails fast
  if (cuda) {
#ifndef KVGATE_WITH_CUDA_MODEL
    throw std::runtime_error(
        "--device cuda: this kvgate was built without the CUDA backend; rebuild with the CUDA toolkit (nvcc) and "
        "-DKVGATE_CUDA=ON, or run with --device cpu");
#else
    const cuda::DeviceStatus& ds = cuda::device_status();
    if (!ds.available)
      throw std::runtime_error("--device cuda: " + ds.reason +
                               "; run on a machine with an NVIDIA GPU (sm_90, e.g. H100/H200) and a working driver, "
                               "or run with --device cpu");
    cuda::register_capability();  // backend "cuda" refuses what the CUDA ops cannot run
#endif
  }
  const WeightStorage storage = weight_storage(o.weights);
  if (o.cuda_weights != "f32" && o.cuda_weights != "bf16")
    throw std::invalid_argument("--cuda-weights must be f32 or bf16, got '" + o.cuda_weights + "'");
  const Model model = load_model(o.model, o.tokenizer, storage);

  KvRequest req;
  req.flag = flag;
  req.strict = o.strict;
  req.backend = o.device;
  req.mla_latent = o.mla_cache == "latent";
  const EngineOptions eo = engine_options(o, resolve_kv(req, model.config, o.block_size), model.config);
  if (cuda && eo.kv.fell_back())  // allowed without --strict-kv, but never silent
    std::fprintf(stderr, "kvgate run: KV format %s cannot run on device cuda (%s); using %s (--strict-kv refuses)\n",
                 eo.kv.requested.name().c_str(), eo.kv.fallback_reason.c_str(), eo.kv.effective.name().c_str());
#ifdef KVGATE_WITH_CUDA_MODEL
  if (cuda) {
    cuda::CudaEngineOptions co;
    co.engine = eo;
    co.cuda_graphs = o.cuda_graphs;
    co.weights = o.cuda_weights == "bf16" ? cuda::WeightType::bf16 : cuda::WeightType::f32;
    co.devices = devices;
    cuda::CudaEngine engine(model, co);
    return generate_and_print(o, model, engine);
  }
#endif
  Engine engine(model, eo);
  return generate_and_print(o, model, engine);
}

template <class E>
int generate_and_print(const RunOpts& o, const Model& model, E& engine) {
  // Conversation (--conv-id): lock it, read and verify its file; the turn continues its transcript.
  using SteadyClock = std::chrono::steady_clock;
  const auto t_load = SteadyClock::now();
  std::optional<KvCacheDir> cache_dir;
  std::optional<Conversation> conv;
  if (!o.cache.conv_id.empty()) {
    cache_dir.emplace(open_kv_cache(o.cache));
    conv.emplace(*cache_dir, o.cache.conv_id);
  }
  const std::vector<int> transcript = conv ? conv->transcript() : std::vector<int>{};

  const Tokenizer* tok = model.tokenizer.get();
  std::vector<int> prompt_ids = transcript;
  const bool continuing = !transcript.empty();
  if (tok) {
    const std::vector<int> fresh = tok->encode(o.prompt, !o.no_bos && !continuing);
    prompt_ids.insert(prompt_ids.end(), fresh.begin(), fresh.end());
  } else {
    if (!o.prompt.empty())
      throw ModelError("model '" + o.model + "' has no tokenizer; pass --tokenizer PATH to encode a prompt");
    if (!o.no_bos && !continuing) prompt_ids.push_back(model.config.bos_id);
  }
  // Nothing to start from (an empty prompt on a tokenizer that adds no BOS, e.g. Qwen): start from
  // the model's declared BOS, as transformers' generate() does for an empty input.
  if (prompt_ids.empty() && !o.no_bos && model.config.bos_id >= 0) prompt_ids.push_back(model.config.bos_id);
  if (prompt_ids.empty()) throw std::invalid_argument("the prompt encodes to no tokens (use a BOS or a prompt)");
  if (conv) check_conversation_room(*conv, transcript.size(), prompt_ids.size(), engine.max_context());
  int hydrated = 0;
  if (conv)
    hydrated = conv->hydrate([&engine](const KvFile& f, std::span<const int> p) { return engine.hydrate(f, p); },
                             prompt_ids);
  const double kv_load_ms = conv ? std::chrono::duration<double, std::milli>(SteadyClock::now() - t_load).count() : 0.0;

  std::string text;
  int prev = prompt_ids.back();
  const bool stream = !o.json;
  const std::size_t echo_from = transcript.size();  // a conversation echoes the new turn only
  if (stream && tok) {  // echo the prompt as run.c does
    for (std::size_t i = std::max<std::size_t>(1, echo_from); i < prompt_ids.size(); ++i) {
      const std::string p = tok->decode_piece(prompt_ids[i - 1], prompt_ids[i]);
      if (printable_piece(p)) std::fwrite(p.data(), 1, p.size(), stdout);
    }
    if (prompt_ids.size() == 1 && prompt_ids[0] != tok->bos_id() && prompt_ids[0] != model.config.bos_id) {
      const std::string p = tok->decode_piece(-1, prompt_ids[0]);
      if (printable_piece(p)) std::fwrite(p.data(), 1, p.size(), stdout);
    }
    std::fflush(stdout);
  }
  const SamplerOptions so = sampler_options(o);
  const std::span<const int> to_prefill = std::span<const int>(prompt_ids).subspan(static_cast<std::size_t>(hydrated));
  const GenerateResult r = engine.generate(to_prefill, o.steps, so, [&](int id) {
    if (!tok) return;
    const std::string p = tok->decode_piece(prev, id);
    prev = id;
    text += p;
    if (stream && printable_piece(p)) {
      std::fwrite(p.data(), 1, p.size(), stdout);
      std::fflush(stdout);
    }
  });
  // Save the turn: every K/V row, plus the ids sampled but not yet in the KV (the last one).
  KvBudgetReport budget;
  if (conv) {
    std::vector<int> full = prompt_ids;
    full.insert(full.end(), r.tokens.begin(), r.tokens.end());
    const std::size_t in_kv = engine.history().size();
    const std::span<const int> pending = std::span<const int>(full).subspan(std::min(in_kv, full.size()));
    budget = conv->save([&engine, pending](const std::string& path) { engine.save_kv(path, pending); });
    if (!budget.message.empty()) std::fputs(budget.message.c_str(), stderr);
  }
  const EngineStats& st = engine.stats();
  if (o.json) {
    nlohmann::json j;
    j["text"] = text;
    j["prompt"] = o.prompt;
    j["prompt_ids"] = prompt_ids;
    j["generated_ids"] = r.tokens;
    j["stop_reason"] = r.stop_reason;
    j["model"] = {{"path", model.path},
                  {"source", model.source_kind},
                  {"fingerprint", model.fingerprint},
                  {"arch", model.config.arch},
                  {"n_layers", model.config.n_layers},
                  {"n_heads", model.config.n_heads},
                  {"n_kv_heads", model.config.n_kv_heads},
                  {"head_dim", model.config.head_dim},
                  {"vocab_size", model.config.vocab_size},
                  {"weights", {{"storage", o.weights},
                               {"owned_bytes", model.weights.owned_bytes()},
                               {"mapped_bytes", model.weights.mapped_bytes()}}}};
    j["sampler"] = {{"temperature", o.temperature}, {"top_k", o.top_k}, {"top_p", o.top_p}, {"seed", o.seed}};
    j["stats"] = {{"requested_kv", st.requested_kv},
                  {"requested_source", st.requested_source},
                  {"effective_kv", st.effective_kv},
                  {"backend", st.backend},
                  {"fallback_reason", st.fallback_reason},
                  {"kv_layout", st.kv_layout},
                  {"kv_bytes", st.kv_bytes},
                  {"kv_pool_bytes", st.kv_pool_bytes},
                  {"block_size", st.block_size},
                  {"n_blocks", st.n_blocks},
                  {"threads", st.threads},
                  {"prefill_chunk", st.prefill_chunk},
                  {"pipeline_stages", st.pipeline_stages},
                  {"stage_layers", st.stage_layers},
                  {"topology", st.topology},
                  {"tensor_parallel", st.tensor_parallel},
                  {"ttft_ms", st.ttft_ms},
                  {"prefill_tokens", st.prefill_tokens},
                  {"prefill_tok_s", st.prefill_tok_s()},
                  {"decode_tokens", st.decode_tokens},
                  {"decode_tok_s", st.decode_tok_s()},
                  {"hydrated_tokens", st.hydrated_tokens},
                  {"kv_load_ms", kv_load_ms},
                  {"ttft_total_ms", kv_load_ms + st.ttft_ms},
                  {"kv_resident_tokens", st.kv_resident_tokens},
                  {"kv_device_bytes", st.kv_device_bytes},
                  {"kv_block_lookups", st.kv_block_lookups},
                  {"kv_block_misses", st.kv_block_misses},
                  {"kv_bytes_moved", st.kv_bytes_moved}};
    j["process"] = process_memory();  // what the weights cost the host: anonymous vs file-backed pages
    if (!st.layer_kv.empty())  // a per-layer map (--kv-layers): the map, each layer's format and bytes
      j["stats"]["kv_layers"] = {{"map", st.kv_layer_map},
                                 {"formats", st.layer_kv},
                                 {"kv_bytes_per_token", st.layer_kv_bytes_per_token}};
    if (conv) {
      nlohmann::json ev = nlohmann::json::array();
      for (const auto& e : budget.evicted) ev.push_back({{"conv_id", e.conv_id}, {"bytes", e.bytes}});
      j["conversation"] = {{"conv_id", conv->conv_id()},
                           {"kv_file", conv->path()},
                           {"transcript_tokens", transcript.size()},
                           {"saved_tokens", tokens_in_kv(engine)},
                           {"cache_budget", budget.budget},
                           {"cache_bytes", budget.bytes_after},
                           {"evicted", ev},
                           {"over_budget", budget.over_budget}};
    }
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::printf("\n");
    std::fprintf(stderr,
                 "kv %s (requested %s%s%s), backend %s, kv_bytes %zu, ttft %.3f ms, prefill %.1f tok/s, decode %.1f "
                 "tok/s, stop: %s\n",
                 st.effective_kv.c_str(), st.requested_kv.c_str(), st.fallback_reason.empty() ? "" : ", fallback: ",
                 st.fallback_reason.c_str(), st.backend.c_str(), st.kv_bytes, st.ttft_ms, st.prefill_tok_s(),
                 st.decode_tok_s(), r.stop_reason.c_str());
    if (st.kv_layout != "kv_heads") std::fprintf(stderr, "kv layout: %s\n", st.kv_layout.c_str());
    if (st.pipeline_stages > 1) std::fprintf(stderr, "topology: %s (%d pipeline stages, each its own KV store)\n", st.topology.c_str(), st.pipeline_stages);
    if (st.tensor_parallel > 1)
      std::fprintf(stderr, "topology: %s (%d tensor-parallel ranks, each its KV heads in its own KV store)\n",
                   st.topology.c_str(), st.tensor_parallel);
    if (!st.kv_layer_map.empty()) {
      std::fprintf(stderr, "kv layers: %s; KV bytes per token by layer:", st.kv_layer_map.c_str());
      for (std::size_t l = 0; l < st.layer_kv_bytes_per_token.size(); ++l)
        std::fprintf(stderr, " %zu:%g", l, st.layer_kv_bytes_per_token[l]);
      std::fprintf(stderr, "\n");
    }
    if (conv)
      std::fprintf(stderr, "conversation %s: hydrated %d of %zu prompt tokens (kv load %.3f ms), prefilled %lld, saved %zu to %s\n",
                   conv->conv_id().c_str(), st.hydrated_tokens, prompt_ids.size(), kv_load_ms, st.prefill_tokens,
                   tokens_in_kv(engine), conv->path().c_str());
    if (st.kv_resident_tokens > 0)
      std::fprintf(stderr, "kv streaming: window %d tokens (%zu device bytes), block lookups %lld, misses %lld, %lld bytes moved\n",
                   st.kv_resident_tokens, st.kv_device_bytes, st.kv_block_lookups, st.kv_block_misses, st.kv_bytes_moved);
  }
  return 0;
}

}  // namespace

void register_run(CLI::App& app) {
  auto o = std::make_shared<RunOpts>();
  auto* sub = app.add_subcommand("run", "Generate text with a model through a KV format (CPU, or CUDA with --device cuda)");
  add_model_flags(sub, *o);
  sub->add_option("--kv-k", o->kv_k, "K half format (with --kv-v)");
  sub->add_option("--kv-v", o->kv_v, "V half format (with --kv-k)");
  sub->add_option("--prompt", o->prompt, "prompt text (empty: start from BOS)")->capture_default_str();
  sub->add_option("--steps", o->steps, "tokens to generate")->capture_default_str();
  add_engine_flags(sub, *o);
  sub->add_flag("--no-bos", o->no_bos, "do not add the tokenizer's special tokens (its BOS) to the prompt");
  sub->add_flag("--json", o->json, "print one JSON object (text, ids, stats)");
  sub->add_option("--device", o->device, "cpu, or cuda (the whole forward on the GPU; needs a CUDA build and device)")
      ->capture_default_str();
  sub->add_flag("!--no-cuda-graphs", o->cuda_graphs, "--device cuda: plain kernel launches for decode (no CUDA graph)");
  sub->add_option("--weights", o->weights,
                  "16-bit (bf16/f16) safetensors weights: as-stored (read in place from the mapped files) or f32 "
                  "(converted copies)")
      ->capture_default_str();
  sub->add_option("--devices", o->devices,
                  "--device cuda with --pp: the CUDA device of each pipeline stage, e.g. 0,1 (a device may repeat; "
                  "default: stage i on device i modulo the device count); with --tp: the device of each rank "
                  "(default: every rank on the current device)");
  sub->add_option("--cuda-weights", o->cuda_weights, "--device cuda: weight matrices on the GPU, f32 | bf16")
      ->capture_default_str();
  add_kv_cache_flags(sub, o->cache);
  on_run(sub, [o] { return run_run(*o); });
}

}  // namespace kvgate::cli
