// Flags shared by `kvgate run` and `kvgate chat`, registered and checked once here so the two
// commands cannot drift: the model, KV pool and sampling flags (EngineFlags), and those of
// persistent conversations and streamed KV (--conv-id, --kv-cache-dir, --kv-cache-budget,
// --kv-resident).
#pragma once
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv_aliases.hpp"
#include "kv_scales_file.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/kv_cache_dir.hpp"
#include "kvgate/kv_layer_map.hpp"
#include "kvgate/limits.hpp"
#include "kvgate/sampler.hpp"

namespace kvgate::cli {

struct KvCacheFlags {
  std::string conv_id;
  std::string cache_dir;
  std::string budget = "1GiB";
  int resident = 0;
};

// $KVGATE_KV_CACHE_DIR, else $XDG_CACHE_HOME/kvgate/kv, else ~/.cache/kvgate/kv, else ./.kvgate-kv.
inline std::string default_kv_cache_dir() {
  if (const char* e = std::getenv("KVGATE_KV_CACHE_DIR"); e && *e) return e;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/kvgate/kv";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kvgate/kv";
  return ".kvgate-kv";
}

inline void add_kv_cache_flags(CLI::App* sub, KvCacheFlags& f) {
  sub->add_option("--conv-id", f.conv_id,
                  "conversation id: hydrate the saved KV of this conversation, prefill only the new tokens, save "
                  "after the turn");
  sub->add_option("--kv-cache-dir", f.cache_dir,
                  "folder of conversation KV files (default $KVGATE_KV_CACHE_DIR, $XDG_CACHE_HOME/kvgate/kv or "
                  "~/.cache/kvgate/kv)");
  sub->add_option("--kv-cache-budget", f.budget,
                  "byte budget of the folder; least recently used files are evicted (e.g. 1GiB, 256MiB)")
      ->capture_default_str();
  sub->add_option("--kv-resident", f.resident,
                  "stream the KV: keep a window of N tokens' blocks per layer in the device pool and every block in "
                  "a host mirror (0 = all resident)")
      ->capture_default_str();
}

inline KvCacheDir open_kv_cache(const KvCacheFlags& f) {
  return KvCacheDir(f.cache_dir.empty() ? default_kv_cache_dir() : f.cache_dir, parse_byte_size(f.budget));
}

// What `run` and `chat` both take; each command's options struct derives from it.
struct EngineFlags {
  std::string model, tokenizer, kv;
  std::string kv_cache_dtype, cache_type_k, cache_type_v;  // other engines' spellings (kv_aliases.hpp)
  std::string kv_layers;       // --kv-layers "0-1:bf16,*:fp8" (kvgate/kv_layer_map.hpp)
  std::string kv_skip_layers;  // vLLM's --kv-cache-dtype-skip-layers "0,1": those keep the model's own KV
  std::optional<float> k_scale, v_scale;
  std::string kv_scales;  // --kv-scales FILE (kv_scales_file.hpp)
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  std::uint64_t seed = 42;
  bool strict = false;
  int threads = 0;
  int block_size = 16;
  int prefill_chunk = 0;  // --prefill-chunk; 0: the device's (default_prefill_chunk: cpu 128, cuda 512)
  std::size_t kv_cache_memory = 0;
  std::optional<int> pp;  // --pp: pipeline stages (not given: 1, or the count of --pp-layers)
  std::string pp_layers;  // --pp-layers: layers per stage, comma separated
  int tp = 1;             // --tp: tensor-parallel ranks (CPU engine, or the CUDA engine)
  std::string mla_cache = "expanded";  // --mla-cache expanded|latent (MLA models: EngineOptions::mla_cache)
  KvCacheFlags cache;
};

// A comma-separated list of integers >= `min` ("2,3" -> {2, 3}; empty -> {}): each item digits alone,
// else invalid_argument naming the flag, the item, what it must be (`what`) and an example.
inline std::vector<int> parse_int_list(const std::string& flag, const std::string& s, int min, const std::string& what,
                                       const std::string& example) {
  std::vector<int> out;
  if (s.empty()) return out;
  std::size_t i = 0;
  while (i <= s.size()) {
    const std::size_t j = std::min(s.find(',', i), s.size());
    const std::string item = s.substr(i, j - i);
    std::size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || n < min)
      throw std::invalid_argument(flag + " '" + s + "': '" + item + "' is not " + what + "; give " + example);
    out.push_back(n);
    i = j + 1;
  }
  return out;
}

// --pp-layers "2,3" -> {2, 3}; empty -> {}. Counts are checked against the model by the engine.
inline std::vector<int> parse_pp_layers(const std::string& s) {
  return parse_int_list("--pp-layers", s, 1, "a layer count >= 1",
                        "the layers of each pipeline stage separated by commas, e.g. --pp-layers 2,3");
}

// --model, --tokenizer, --kv (the presets and halves listed from the format table), --k-scale, --v-scale.
inline void add_model_flags(CLI::App* sub, EngineFlags& f) {
  sub->add_option("--model", f.model, "llama2.c .bin, .gguf, or a Hugging Face directory")->required();
  sub->add_option("--tokenizer", f.tokenizer, "tokenizer (llama2.c tokenizer.bin or tokenizer.json)");
  sub->add_option("--kv", f.kv, "KV format, a preset or k=<K>,v=<V> (" + known_formats_text() + ")")
      ->check([](const std::string& s) {  // an empty value is a mistake, not "the default"
        return s.empty() ? std::string("--kv is empty: name a format (" + known_formats_text() + ") or leave --kv out")
                         : std::string();
      });
  sub->add_option("--kv-cache-dtype", f.kv_cache_dtype,
                  "vLLM's spelling of the KV format (" + alias_choices(kVllmKvCacheDtype) + "; docs/FORMATS.md)");
  sub->add_option("--cache-type-k", f.cache_type_k,
                  "llama.cpp's -ctk: the K half (" + alias_choices(kLlamaCacheType) + "; V defaults to f16)");
  sub->add_option("--cache-type-v", f.cache_type_v,
                  "llama.cpp's -ctv: the V half (" + alias_choices(kLlamaCacheType) + "; K defaults to f16)");
  sub->add_option("--kv-layers", f.kv_layers,
                  "a KV format per layer, e.g. \"0-1:bf16,*:fp8\" (N, N-M or * : a preset or K/V halves; CPU "
                  "engine; instead of --kv; docs/FORMATS.md)");
  sub->add_option("--kv-cache-dtype-skip-layers", f.kv_skip_layers,
                  "vLLM's spelling: these layers (e.g. 0,1 or 0-1) keep the model's own KV, the others hold the --kv "
                  "/ --kv-cache-dtype format");
  sub->add_option("--mla-cache", f.mla_cache,
                  "MLA models (DeepSeek-V2/V3): expanded = per-head K/V rows in the KV format; latent = the latent "
                  "c_kv in the K half format and the RoPE key in the V half format, absorbed attention (CPU)")
      ->capture_default_str();
  sub->add_option("--k-scale", f.k_scale, "per-tensor K scale for fp8 halves (all layers)");
  sub->add_option("--v-scale", f.v_scale, "per-tensor V scale for fp8 halves (all layers)");
  sub->add_option("--kv-scales", f.kv_scales,
                  "JSON file of the fp8 KV scales per layer, K and V, one per layer or per KV head "
                  "(schema reports/schema/kv-scales.schema.json); --k-scale/--v-scale override its half");
  // The aliases become the --kv value once the command line is read (a refusal is a usage error).
  sub->parse_complete_callback([&f] {
    try {
      f.kv = kv_from_aliases(f.kv, f.kv_cache_dtype, f.cache_type_k, f.cache_type_v);
    } catch (const std::invalid_argument& e) {
      throw CLI::ValidationError(e.what());
    }
  });
}

// --temperature, --top-k, --top-p, --seed, --strict-kv, --threads, --block-size, --kv-cache-memory.
inline void add_engine_flags(CLI::App* sub, EngineFlags& f) {
  sub->add_option("--temperature", f.temperature, "0 = greedy")->capture_default_str();
  sub->add_option("--top-k", f.top_k, "0 = off")->capture_default_str();
  sub->add_option("--top-p", f.top_p, "1 = off")->capture_default_str();
  sub->add_option("--seed", f.seed, "sampler seed")->capture_default_str();
  sub->add_flag("--strict-kv,--no-kv-fallback", f.strict, "fail instead of falling back to another KV format");
  sub->add_option("--threads", f.threads, "CPU threads (0 = all cores)")->capture_default_str();
  sub->add_option("--block-size", f.block_size, "tokens per KV page")->capture_default_str();
  sub->add_option("--prefill-chunk", f.prefill_chunk,
                  "tokens per batched prefill step (0 = the device's default: 128 on cpu, 512 on cuda)")
      ->capture_default_str();
  sub->add_option("--kv-cache-memory", f.kv_cache_memory, "KV pool bytes (0 = enough for the model's context)");
  sub->add_option("--pp", f.pp,
                  "pipeline (layer) split into N stages, each with its own KV store (CPU engine, or CUDA with --devices; "
                  "default 1 = unsplit, or the count of --pp-layers)");
  sub->add_option("--pp-layers", f.pp_layers, "layers of each pipeline stage, e.g. 2,3 (default: as even as possible)");
  sub->add_option("--tp", f.tp,
                  "tensor-parallel split into N ranks, each with its share of the heads (and its own KV store of them) "
                  "and of the FFN, block outputs summed by an all-reduce (CPU engine, or CUDA: ranks on the current GPU or one "
                  "per --devices entry; with --kv-resident each rank streams its own KV window; --conv-id saves the unsplit "
                  "file layout; with --device cuda refused with --pp; default 1 = unsplit)")
      ->capture_default_str();
}

// The checks both commands make before loading anything.
inline void check_engine_flags(const EngineFlags& f) {
  // NaN fails every comparison, so each check is written to reject it.
  if (!(f.temperature >= 0) || !std::isfinite(f.temperature))
    throw std::invalid_argument("--temperature = " + std::to_string(f.temperature) + " must be a finite number >= 0");
  if (f.top_k < 0) throw std::invalid_argument("--top-k = " + std::to_string(f.top_k) + " must be >= 0 (0 = off)");
  limits::check(limits::kTopK, f.top_k, "--top-k", "value");
  if (!(f.top_p >= 0 && f.top_p <= 1))
    throw std::invalid_argument("--top-p = " + std::to_string(f.top_p) + " must be in [0, 1] (1 = off)");
  if (f.threads < 0) throw std::invalid_argument("--threads = " + std::to_string(f.threads) + " must be >= 0 (0 = all cores)");
  limits::check(limits::kThreads, f.threads, "--threads", "value");
  if (f.block_size < 1) throw std::invalid_argument("--block-size = " + std::to_string(f.block_size) + " must be >= 1");
  limits::check(limits::kBlockSize, f.block_size, "--block-size", "value");
  if (f.prefill_chunk < 0)
    throw std::invalid_argument("--prefill-chunk = " + std::to_string(f.prefill_chunk) +
                                " must be >= 0 (0 = the device's default: 128 on cpu, 512 on cuda)");
  limits::check(limits::kPrefillChunk, f.prefill_chunk, "--prefill-chunk", "value");
  limits::check(limits::kKvPoolBytes, f.kv_cache_memory, "--kv-cache-memory", "value");
  if (f.k_scale && !(*f.k_scale > 0)) throw std::invalid_argument("--k-scale must be > 0");
  if (f.v_scale && !(*f.v_scale > 0)) throw std::invalid_argument("--v-scale must be > 0");
  if (f.cache.resident < 0) throw std::invalid_argument("--kv-resident must be >= 0");
  if (f.pp && *f.pp < 1) throw std::invalid_argument("--pp = " + std::to_string(*f.pp) + " must be >= 1 (pipeline stages)");
  if (f.tp < 1) throw std::invalid_argument("--tp = " + std::to_string(f.tp) + " must be >= 1 (tensor-parallel ranks)");
  const std::vector<int> layers = parse_pp_layers(f.pp_layers);
  if (f.pp && !layers.empty() && static_cast<int>(layers.size()) != *f.pp)
    throw std::invalid_argument("--pp " + std::to_string(*f.pp) + " with --pp-layers " + f.pp_layers + " (" +
                                std::to_string(layers.size()) + " stages): give one count per stage, or leave --pp out");
}

// The per-layer KV map of --kv-layers or --kv-cache-dtype-skip-layers (empty: neither given). `kv` is
// the format --kv resolved to; the skipped layers keep what the model gets without --kv. A map that
// gives every layer one format is that format (the engine then runs as with --kv).
inline KvLayerMap kv_layer_map_of_flags(const EngineFlags& f, const ResolvedKv& kv, const ModelConfig& c) {
  if (!f.kv_layers.empty() && !f.kv_skip_layers.empty())
    throw std::invalid_argument("--kv-layers and --kv-cache-dtype-skip-layers both given: name the per-layer map one way");
  if (!f.kv_layers.empty()) {
    if (!f.kv.empty())
      throw std::invalid_argument("--kv-layers with --kv " + f.kv + ": the map names every layer's format; put the rest "
                                  "in the map as '*:" + f.kv + "' and leave --kv out");
    return parse_kv_layer_map(f.kv_layers, c.n_layers);
  }
  if (!f.kv_skip_layers.empty()) {
    if (f.kv.empty())
      throw std::invalid_argument("--kv-cache-dtype-skip-layers " + f.kv_skip_layers +
                                  " without a KV format for the other layers: add --kv-cache-dtype (or --kv)");
    KvRequest none;
    none.backend = kv.backend.empty() ? "cpu" : kv.backend;
    const ResolvedKv own = resolve_kv(none, c, f.block_size);
    return kv_skip_layers_map(f.kv_skip_layers, c.n_layers, own.effective, kv.effective);
  }
  return {};
}

// The engine options of the flags, for the KV format resolved against the model (`mc`: the layers of
// a per-layer map). Scales of each half: --k-scale / --v-scale, else --kv-scales FILE, else the
// checkpoint's, else 1.0 (docs/FORMATS.md).
inline EngineOptions engine_options(const EngineFlags& f, const ResolvedKv& kv, const ModelConfig& mc) {
  EngineOptions eo;
  eo.kv = kv;
  if (KvLayerMap map = kv_layer_map_of_flags(f, kv, mc); !map.empty()) {
    eo.kv.requested = eo.kv.effective = map.front();
    eo.kv.requested_source = f.kv_layers.empty() ? "flag:--kv-cache-dtype-skip-layers" : "flag:--kv-layers";
    eo.kv.fallback_reason.clear();
    if (!kv_layer_map_uniform(map)) eo.kv_layers = std::move(map);
  }
  eo.block_size = f.block_size;
  eo.prefill_chunk = f.prefill_chunk > 0 ? f.prefill_chunk : default_prefill_chunk(kv.backend.empty() ? "cpu" : kv.backend);
  eo.kv_cache_memory = f.kv_cache_memory;
  eo.threads = f.threads;
  eo.kv_resident = f.cache.resident;
  eo.mla_cache = parse_mla_cache(f.mla_cache, "--mla-cache");
  eo.pipeline_layers = parse_pp_layers(f.pp_layers);
  eo.pipeline_stages = f.pp ? *f.pp : std::max<int>(1, static_cast<int>(eo.pipeline_layers.size()));
  eo.tensor_parallel = f.tp;
  // A conversation is saved whole after the turn (its KV file holds every row), so its pages stay
  // even where every layer's sliding window has passed them.
  eo.release_outside_window = f.cache.conv_id.empty();
  if (!f.kv_scales.empty()) {
    const KvScalesFile file = load_kv_scales_file(f.kv_scales);
    eo.k_scale = kv_scales_for_model(file, true, mc.n_layers, mc.n_kv_heads);
    eo.v_scale = kv_scales_for_model(file, false, mc.n_layers, mc.n_kv_heads);
  }
  if (f.k_scale) eo.k_scale = {*f.k_scale};
  if (f.v_scale) eo.v_scale = {*f.v_scale};
  return eo;
}

inline SamplerOptions sampler_options(const EngineFlags& f) {
  SamplerOptions so;
  so.temperature = f.temperature;
  so.top_k = f.top_k;
  so.top_p = f.top_p;
  so.seed = f.seed;
  return so;
}

// run.c's safe_printf: drop single non-printable bytes (raw byte tokens), keep whitespace.
inline bool printable_piece(const std::string& p) {
  if (p.size() != 1) return !p.empty();
  const unsigned char c = static_cast<unsigned char>(p[0]);
  return (c >= 32 && c != 127) || c == '\n' || c == '\t' || c == '\r' || c >= 128;
}

// A conversation turn whose prompt (the saved transcript plus the new text) does not fit the
// context: the refusal says how full the conversation is and how to go on, before anything is
// printed or saved (the file stays as it was).
inline void check_conversation_room(const Conversation& conv, std::size_t transcript, std::size_t prompt,
                                    int max_context) {
  if (prompt <= static_cast<std::size_t>(max_context)) return;
  const std::size_t room = transcript < static_cast<std::size_t>(max_context) ? max_context - transcript : 0;
  throw std::invalid_argument(
      "conversation '" + conv.conv_id() + "' (" + conv.path() + ") holds " + std::to_string(transcript) +
      " tokens and this turn adds " + std::to_string(prompt - transcript) + ": " + std::to_string(prompt) +
      " exceed the context of " + std::to_string(max_context) + " tokens. " +
      (room > 0 ? "Give a prompt of at most " + std::to_string(room) + " tokens, or s" : "It is full: s") +
      "tart another conversation (a new --conv-id), or delete " + conv.path() + " to start this one afresh");
}

}  // namespace kvgate::cli
