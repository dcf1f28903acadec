#include "kvgate/engine.hpp"
#include "kvgate/generate_loop.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include "forward_cpu.hpp"
#include "kvgate/kv_file.hpp"
#include "kvgate/limits.hpp"
#include "kvgate/tensor_parallel.hpp"
#include "thread_pool.hpp"

namespace kvgate {

int default_prefill_chunk(std::string_view backend) { return backend == "cuda" ? 512 : 128; }

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int resolve_threads(int t) {
  if (t > 0) return t;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

}  // namespace

// MemAvailable of /proc/meminfo in bytes (0 when unknown: no check is made then).
static std::uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

const KvFormat& layer_kv_format(const EngineOptions& o, int layer) {
  return o.kv_layers.empty() ? o.kv.effective : o.kv_layers.at(static_cast<std::size_t>(layer));
}

namespace {

// K + V page bytes of every layer: one block of the whole pool (the per-layer map's formats).
std::uint64_t pool_bytes_per_block(const EngineOptions& o, const ModelConfig& c, const StoreConfig& sc,
                                   const std::string& who) {
  const PageGeometry gk = sc.half_geometry(KvHalf::K), gv = sc.half_geometry(KvHalf::V);
  std::uint64_t sum = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const KvFormat& f = layer_kv_format(o, l);
    sum = limits::add(sum, page_bytes(f.k, gk) + page_bytes(f.v, gv), who, "KV bytes per block");
  }
  return sum;
}

// A per-layer map must give every layer a format its pages can hold (no silent fallback per layer).
void check_layer_map(const EngineOptions& o, const ModelConfig& c, const PageGeometry& g, const std::string& who) {
  if (o.kv_layers.empty()) return;
  if (static_cast<int>(o.kv_layers.size()) != c.n_layers)
    throw EngineError(who + ": the per-layer KV map gives " + std::to_string(o.kv_layers.size()) +
                      " formats for a model of " + std::to_string(c.n_layers) + " layers (--kv-layers: one per layer)");
  for (const KvLayerRun& r : kv_layer_runs(o.kv_layers))
    for (const HalfFormat h : {r.format.k, r.format.v})
      if (const Capability cap = supports(h, g); !cap.ok)
        throw EngineError(who + ": --kv-layers: layers " + std::to_string(r.first) + "-" + std::to_string(r.end - 1) +
                          " hold " + r.format.name() + ", whose " + std::string(name(h)) +
                          " half cannot store this model's KV rows (" + cap.reason + ": " + cap.detail +
                          "); give those layers another format");
}

}  // namespace

StoreConfig make_store_config(const Model& m, const EngineOptions& o, int max_ctx, const std::string& who) {
  const ModelConfig& c = m.config;
  StoreConfig sc;
  sc.format = o.kv.effective;
  sc.n_layers = c.n_layers;
  sc.n_kv_heads = c.n_kv_heads;
  sc.head_dim = c.head_dim;
  if (o.mla_cache == MlaCache::latent) {
    if (!c.mla.any())
      throw EngineError(who + ": --mla-cache latent applies to multi-head latent attention models (DeepSeek-V2/V3: "
                        "kv_lora_rank in config.json); this model (" + c.arch + ") has none: drop the flag");
    if (!o.kv_layers.empty())
      throw EngineError(who + ": --mla-cache latent with a per-layer KV map (--kv-layers) is not supported; give one "
                        "format (--kv, e.g. k=int8,v=bf16: K for the latent, V for the RoPE key)");
    sc.layout = KvLayout::mla_latent;
    const HalfGeometries g = kv_half_geometries(c, o.block_size, true);
    sc.n_kv_heads = g.k.n_kv_heads;
    sc.head_dim = g.k.head_dim;
    sc.v_head_dim = g.v.head_dim;
  }
  if (o.block_size < 1) throw EngineError(who + ": block_size must be >= 1, got " + std::to_string(o.block_size));
  // Sizes from flags and model files, checked before any product or allocation (kvgate/limits.hpp).
  limits::check(limits::kBlockSize, o.block_size, who, "--block-size");
  limits::check_positive(limits::kKvRow,
                         limits::mul(limits::check_positive(limits::kHeads, c.n_kv_heads, who, "n_kv_heads"),
                                     limits::check_positive(limits::kHeadDim, c.head_dim, who, "head_dim"), who,
                                     "n_kv_heads * head_dim"),
                         who, "n_kv_heads * head_dim");
  limits::check(limits::kKvPoolBytes, o.kv_cache_memory, who, "--kv-cache-memory");
  sc.block_size = o.block_size;
  check_layer_map(o, c, sc.geometry(), who);
  if (o.n_blocks > 0) {
    sc.n_blocks = o.n_blocks;
  } else if (o.kv_cache_memory > 0) {
    const std::uint64_t per_block = pool_bytes_per_block(o, c, sc, who);
    sc.n_blocks = o.kv_layers.empty() ? blocks_for_budget(sc, o.kv_cache_memory)
                                      : static_cast<int>(o.kv_cache_memory / per_block);  // as blocks_for_budget
    if (sc.n_blocks < 1)
      throw EngineError(who + ": --kv-cache-memory " + std::to_string(o.kv_cache_memory) + " bytes buys no KV block of " +
                        (o.kv_layers.empty() ? sc.format.name() : kv_layer_map_name(o.kv_layers)) +
                        " (one block of all layers needs " + std::to_string(per_block) + " bytes)");
  } else {
    const std::uint64_t ctx = limits::check(limits::kContext, max_ctx, who, "context length (max_position_embeddings)");
    const std::uint64_t bs = static_cast<std::uint64_t>(o.block_size);
    sc.n_blocks = static_cast<int>((ctx + bs - 1) / bs);
  }
  // The pool is allocated (and zero-filled) up front: refuse what the machine does not have.
  {
    const std::uint64_t per_block = pool_bytes_per_block(o, c, sc, who);
    const std::uint64_t pool = limits::mul(per_block, static_cast<std::uint64_t>(sc.n_blocks), who, "KV pool bytes");
    const std::uint64_t avail = available_memory_bytes();
    if (avail > 0 && pool > avail)
      throw EngineError(who + ": the KV pool needs " + std::to_string(pool) + " bytes (" + std::to_string(sc.n_blocks) +
                        " blocks of " + std::to_string(o.block_size) + " tokens for a context of " +
                        std::to_string(max_ctx) + ") but the machine has " + std::to_string(avail) +
                        " bytes available; pass --kv-cache-memory BYTES for a smaller pool (or lower the model's "
                        "context length)");
  }
  auto scales = [&](const std::vector<float>& opt, const std::vector<float>& model_s, const char* which) {
    const std::vector<float>& s = !opt.empty() ? opt : model_s;
    if (s.empty()) return std::vector<float>{};
    if (s.size() == 1) return std::vector<float>(static_cast<std::size_t>(c.n_layers), s[0]);
    const std::size_t per_head = static_cast<std::size_t>(c.n_layers) * static_cast<std::size_t>(c.n_kv_heads);
    if (static_cast<int>(s.size()) != c.n_layers && s.size() != per_head)
      throw EngineError(who + ": " + which + " has " + std::to_string(s.size()) +
                        " entries; give one, or one per layer (" + std::to_string(c.n_layers) +
                        "), or one per layer and KV head (" + std::to_string(per_head) + ")");
    return s;
  };
  sc.k_scale = scales(o.k_scale, c.k_scale, "k_scale");
  sc.v_scale = scales(o.v_scale, c.v_scale, "v_scale");
  return sc;
}

const char* name(MlaCache m) { return m == MlaCache::latent ? "latent" : "expanded"; }

MlaCache parse_mla_cache(const std::string& s, const std::string& flag) {
  if (s == "expanded") return MlaCache::expanded;
  if (s == "latent") return MlaCache::latent;
  throw EngineError(flag + ": '" + s + "' is not an MLA cache layout; give expanded (per-head K/V rows) or latent "
                    "(the compressed latent and the RoPE key per token)");
}

EngineOptions engine_options_for(const KvFormat& fmt, int threads) {
  EngineOptions o;
  o.kv.requested = fmt;
  o.kv.requested_source = "engine_options_for";
  o.kv.effective = fmt;
  o.kv.backend = "cpu";
  o.threads = threads;
  return o;
}

int widest_window_if_all(const ModelConfig& c) {
  int w = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    if (c.window(l) <= 0) return 0;
    w = std::max(w, c.window(l));
  }
  return w;
}

std::vector<std::pair<int, int>> pipeline_ranges(const ModelConfig& c, const EngineOptions& o) {
  const int L = c.n_layers, S = o.pipeline_stages;
  if (S < 1 || S > L)
    throw EngineError("engine: --pp " + std::to_string(S) + " pipeline stages for a model of " + std::to_string(L) +
                      " layers: give 1 (no split) to " + std::to_string(L) + " (one layer per stage)");
  std::vector<int> counts = o.pipeline_layers;
  if (counts.empty()) {
    for (int i = 0; i < S; ++i) counts.push_back(L / S + (i < L % S ? 1 : 0));
  } else {
    std::string list;
    long long sum = 0;
    bool empty_stage = false;
    for (int n : counts) {
      list += (list.empty() ? "" : ",") + std::to_string(n);
      sum += n;
      empty_stage |= n < 1;
    }
    if (static_cast<int>(counts.size()) != S || empty_stage || sum != L)
      throw EngineError("engine: --pp-layers " + list + " does not split the model's " + std::to_string(L) +
                        " layers into " + std::to_string(S) + " stages: give " + std::to_string(S) +
                        " counts, each >= 1, summing to " + std::to_string(L));
  }
  std::vector<std::pair<int, int>> ranges;
  int first = 0;
  for (int n : counts) {
    ranges.push_back({first, first + n});
    first += n;
  }
  return ranges;
}

std::string topology_name(const std::vector<int>& stage_layers, int tensor_parallel) {
  if (tensor_parallel > 1) return "tensor:" + std::to_string(tensor_parallel);
  if (stage_layers.size() <= 1) return "single";
  std::string t = "pipeline:";
  for (std::size_t i = 0; i < stage_layers.size(); ++i) t += (i ? "+" : "") + std::to_string(stage_layers[i]);
  return t;
}

namespace {

// One pipeline stage: its model layers, its own KV store and sequence, its own forward scratch (as
// each device of a split would hold them).
struct Stage {
  int layer0, layer1;  // model layers [layer0, layer1)
  PagedKvStore store;
  SeqId seq;
  detail::CpuForward fwd;
  Stage(const Model& m, StoreConfig sc, int l0, int l1, int chunk, detail::ThreadPool& pool)
      : layer0(l0), layer1(l1), store(std::move(sc)), seq(store.create_sequence()), fwd(m, chunk, pool) {}
};


// The stores' layer ranges: the pipeline stages, each cut further where the per-layer map changes
// format (a stage boundary is always a store boundary; a map without changes cuts nothing).
std::vector<std::pair<int, int>> store_ranges(const std::vector<std::pair<int, int>>& stages, const KvLayerMap& map) {
  if (map.empty()) return stages;
  std::vector<std::pair<int, int>> out;
  for (const auto& [l0, l1] : stages) {
    int first = l0;
    for (int l = l0 + 1; l < l1; ++l)
      if (!(map[static_cast<std::size_t>(l)] == map[static_cast<std::size_t>(l - 1)])) {
        out.push_back({first, l});
        first = l;
      }
    out.push_back({first, l1});
  }
  return out;
}

}  // namespace

StoreConfig stage_store_config(const StoreConfig& full, const EngineOptions& o, int l0, int l1) {
  StoreConfig sc = full;
  sc.format = layer_kv_format(o, l0);
  sc.n_layers = l1 - l0;
  sc.first_layer = l0;
  // [n_layers] per layer or [n_layers * n_kv_heads] per KV head: the stage's layers either way.
  auto slice = [&](const std::vector<float>& v) {
    const std::size_t per = v.size() / static_cast<std::size_t>(full.n_layers);
    return v.empty() ? v
                     : std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(per * static_cast<std::size_t>(l0)),
                                          v.begin() + static_cast<std::ptrdiff_t>(per * static_cast<std::size_t>(l1)));
  };
  sc.k_scale = slice(full.k_scale);
  sc.v_scale = slice(full.v_scale);
  return sc;
}

struct Engine::Impl {
  const Model& model;
  EngineOptions opts;
  int max_ctx;
  detail::ThreadPool pool;
  std::vector<std::unique_ptr<Stage>> stages;  // one when unsplit; none with tensor parallelism
  std::unique_ptr<TensorParallelForward> tp;   // tensor parallelism (opts.tensor_parallel > 1)
  int chunk = 1;                               // tokens per forward step (prefill chunk)
  std::vector<float> logits;
  EngineStats stats;
  std::vector<int> history;  // token ids of the sequence (conversations save them)
  int release_window = 0;    // > 0: every layer is windowed; the widest window (pages before it are released)
  StoreConfig full_config;   // the unsplit store's config (make_store_config): KV files with --tp go through one

  Impl(const Model& m, EngineOptions o)
      : model(m),
        opts(std::move(o)),
        max_ctx(opts.max_context > 0 ? opts.max_context : m.config.max_seq_len),
        pool(resolve_threads(opts.threads)),
        logits(static_cast<std::size_t>(m.config.vocab_size)) {
    const std::vector<std::pair<int, int>> ranges = pipeline_ranges(m.config, opts);
    const StoreConfig full = make_store_config(m, opts, max_ctx, "engine");
    full_config = full;
    chunk = std::max(1, std::min(opts.prefill_chunk, max_ctx));
    if (opts.tensor_parallel != 1) {
      check_tensor_parallel(ranges);
      tp = std::make_unique<TensorParallelForward>(m, opts.tensor_parallel, full, chunk, pool);
    } else {
      for (const auto& [l0, l1] : store_ranges(ranges, opts.kv_layers))
        stages.push_back(std::make_unique<Stage>(m, stage_store_config(full, opts, l0, l1), l0, l1, chunk, pool));
    }
    if (!opts.kv_layers.empty()) {
      if (!kv_layer_map_uniform(opts.kv_layers)) stats.kv_layer_map = kv_layer_map_name(opts.kv_layers);
      for (int l = 0; l < m.config.n_layers; ++l) {
        const KvFormat& f = layer_kv_format(opts, l);
        stats.layer_kv.push_back(f.name());
        stats.layer_kv_bytes_per_token.push_back(
            static_cast<double>(page_bytes(f.k, full.geometry()) + page_bytes(f.v, full.geometry())) / full.block_size);
      }
    }
    stats.requested_kv = opts.kv.requested.name();
    stats.requested_source = opts.kv.requested_source;
    stats.effective_kv = opts.kv.effective.name();
    // A per-layer map is what the stores hold: its name (or its one format when uniform).
    if (!opts.kv_layers.empty())
      stats.effective_kv = stats.kv_layer_map.empty() ? opts.kv_layers.front().name() : stats.kv_layer_map;
    if (!stats.kv_layer_map.empty()) stats.requested_kv = stats.kv_layer_map;
    stats.backend = opts.kv.backend.empty() ? "cpu" : opts.kv.backend;
    stats.fallback_reason = opts.kv.fallback_reason;
    stats.kv_layout = full.layout == KvLayout::mla_latent ? kv_cache_layout_latent(m.config, full.format)
                                                          : kv_cache_layout(m.config);
    stats.block_size = full.block_size;
    stats.n_blocks = full.n_blocks;
    stats.threads = pool.size();
    stats.prefill_chunk = chunk;
    if (opts.kv_resident < 0) throw EngineError("engine: --kv-resident must be >= 0 tokens (0 = off)");
    stats.pipeline_stages = static_cast<int>(ranges.size());
    for (const auto& [l0, l1] : ranges) stats.stage_layers.push_back(l1 - l0);
    for_each_store([&](PagedKvStore& st, SeqId&) {
      if (opts.kv_resident > 0) st.set_streaming(opts.kv_resident);
      if (opts.kv_read_hook) st.set_read_hook(opts.kv_read_hook);
      stats.kv_pool_bytes += st.pool_bytes();
      stats.kv_device_bytes += st.window() ? st.window()->device_bytes() : st.pool_bytes();
    });
    stats.tensor_parallel = opts.tensor_parallel;
    stats.topology = topology_name(stats.stage_layers, opts.tensor_parallel);
    stats.kv_resident_tokens = opts.kv_resident;
    if (opts.release_outside_window) release_window = widest_window_if_all(m.config);
  }

  // What tensor parallelism does not split, refused naming the option and the fix.
  void check_tensor_parallel(const std::vector<std::pair<int, int>>& ranges) const {
    auto refuse = [&](const std::string& what) {
      throw EngineError("engine: tensor parallelism (--tp " + std::to_string(opts.tensor_parallel) + ") with " + what +
                        " is not supported in this version; drop one of them");
    };
    if (ranges.size() > 1) refuse("a pipeline split (--pp)");
    if (!opts.kv_layers.empty()) refuse("a per-layer KV map (--kv-layers)");
    if (opts.kv_read_hook) refuse("KV damage (probe sensitivity)");
    if (opts.mla_cache == MlaCache::latent) refuse("--mla-cache latent");
  }
  // Every KV store of the engine with its sequence: the pipeline stages' (one when unsplit), or the
  // tensor-parallel ranks'.
  template <class F>
  void for_each_store(F&& f) {
    if (tp) {
      for (int r = 0; r < tp->ranks(); ++r) {
        SeqId s = tp->sequence(r);
        f(tp->store(r), s);
      }
      return;
    }
    for (auto& st : stages) f(st->store, st->seq);
  }
  Stage& first() { return *stages.front(); }
  const Stage& first() const { return *stages.front(); }
  const PagedKvStore& store0() const { return tp ? tp->store(0) : first().store; }
  SeqId seq0() const { return tp ? tp->sequence(0) : first().seq; }
  int length() const { return store0().length(seq0()); }
  // KV files with tensor parallelism go through an unsplit staging store (the file's layout is the
  // unsplit engine's): every format whose rank pages are head slices of the unsplit page
  // (tensor_parallel_file_refusal, kvgate/tensor_parallel.hpp) is supported; another is refused by name.
  void refuse_files_with_tp(const char* what) const {
    if (!tp) return;
    if (const std::string why = tensor_parallel_file_refusal(full_config, model.config, tp->ranks()); !why.empty())
      throw EngineError(std::string("engine: conversations (--conv-id: ") + what + " a KV file) with tensor "
                        "parallelism (--tp " + std::to_string(tp->ranks()) + ") and " + why +
                        " (a rank's pages are not head slices of the unsplit page); drop --tp or pick another --kv format");
  }
  // An unsplit store (the engine's full config, with the blocks of n tokens) and a sequence of n
  // tokens' pages: what a --tp engine saves from and hydrates into.
  std::unique_ptr<PagedKvStore> staging_store(int n) const {
    StoreConfig sc = full_config;
    sc.n_blocks = std::max(1, (n + sc.block_size - 1) / sc.block_size);
    return std::make_unique<PagedKvStore>(std::move(sc));
  }
  // The ranks' stores and sequences, in rank order (gather_rank_pages / scatter_rank_pages).
  std::vector<KvStageView> rank_views() const {
    std::vector<KvStageView> v;
    for (int r = 0; r < tp->ranks(); ++r) v.push_back({&tp->store(r), tp->sequence(r)});
    return v;
  }
  std::vector<KvStageTarget> rank_targets() {
    std::vector<KvStageTarget> v;
    for (int r = 0; r < tp->ranks(); ++r) v.push_back({&tp->store(r), tp->sequence(r)});
    return v;
  }

  // Before a forward step of queries from position `pos0`: the keys any layer reads start at
  // pos0 - window + 1, so the whole pages before it go back to the pool (every stage's).
  void release_outside_window() {
    if (release_window <= 0) return;
    const int keep_from = length() - release_window + 1;
    for_each_store([&](PagedKvStore& st, SeqId& s) { st.release_before(s, keep_from); });
  }

  void check_room(std::size_t n) const {
    const int pos = length();
    if (static_cast<long long>(pos) + static_cast<long long>(n) > max_ctx)
      throw EngineError("engine: " + std::to_string(n) + " more tokens at position " + std::to_string(pos) +
                        " exceed the context of " + std::to_string(max_ctx) + " tokens");
  }
  void refresh() {
    stats.position = length();
    stats.kv_bytes = 0;
    StreamCounters sc;
    for_each_store([&](const PagedKvStore& st, SeqId s) {
      stats.kv_bytes += st.sequence_bytes(s);
      const StreamCounters c = st.stream_counters();
      sc.lookups += c.lookups;
      sc.misses += c.misses;
      sc.bytes_moved += c.bytes_moved;
    });
    stats.kv_block_lookups = sc.lookups;
    stats.kv_block_misses = sc.misses;
    stats.kv_bytes_moved = sc.bytes_moved;
  }
  // One chunk through every layer. Unsplit: the single-store pass. Split: every stage's sequence
  // grows by n; the first stage embeds, each stage runs its layers over its own store and hands the
  // activations to the next; the last computes the logits.
  void forward(const int* toks, int n, float* out, bool all) {
    if (tp) {
      tp->forward(toks, n, out, all);
      return;
    }
    if (stages.size() == 1) {
      Stage& st = first();
      st.fwd.forward(st.store, st.seq, toks, n, out, all);
      return;
    }
    first().fwd.check_chunk(toks, n);
    const int pos0 = length();
    for (auto& st : stages)
      if (st->store.extend(st->seq, n) != pos0)
        throw EngineError("engine: pipeline stage of layers " + std::to_string(st->layer0) + "-" +
                          std::to_string(st->layer1 - 1) + " is out of step with the first stage");
    for (std::size_t i = 0; i < stages.size(); ++i) {
      Stage& st = *stages[i];
      if (i == 0) st.fwd.embed(toks, n, pos0);
      else st.fwd.receive(stages[i - 1]->fwd.activations(), n, pos0);  // the activations handed over
      st.fwd.run_layers(st.store, st.seq, st.layer0, st.layer1, n, pos0);
    }
    stages.back()->fwd.head(n, out, all);
  }
  // Batched prefill in chunks; `all` receives [n][vocab] when non-null.
  void run(std::span<const int> toks, float* all) {
    check_room(toks.size());
    history.insert(history.end(), toks.begin(), toks.end());
    const auto t0 = Clock::now();
    const int C = chunk;
    const std::size_t V = logits.size();
    for (std::size_t i = 0; i < toks.size(); i += static_cast<std::size_t>(C)) {
      const int n = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(C), toks.size() - i));
      release_outside_window();
      if (all) forward(toks.data() + i, n, all + i * V, true);
      else forward(toks.data() + i, n, logits.data(), false);  // the last chunk's wins
    }
    stats.prefill_seconds += seconds_since(t0);
    stats.prefill_tokens += static_cast<long long>(toks.size());
    refresh();
  }
  // The stages' stores (a --tp engine saves and hydrates through staging_store instead).
  std::vector<KvStageView> views() const {
    if (tp) throw EngineError("engine: internal error: KV file views of a tensor-parallel engine");
    std::vector<KvStageView> v;
    for (const auto& st : stages) v.push_back({&st->store, st->seq});
    return v;
  }
  std::vector<KvStageTarget> targets() {
    if (tp) throw EngineError("engine: internal error: KV file targets of a tensor-parallel engine");
    std::vector<KvStageTarget> v;
    for (auto& st : stages) v.push_back({&st->store, st->seq});
    return v;
  }
  const Stage& stage(int i) const {
    if (tp) throw EngineError("engine: tensor parallelism (--tp) has no pipeline stages; read its ranks (rank_store)");
    if (i < 0 || i >= static_cast<int>(stages.size()))
      throw EngineError("engine: no pipeline stage " + std::to_string(i) + " (the engine has " +
                        std::to_string(stages.size()) + ")");
    return *stages[static_cast<std::size_t>(i)];
  }
};

Engine::Engine(const Model& model, EngineOptions opts) {
  if (model.weights.layers.empty()) throw EngineError("engine: the model has no weights loaded");
  impl_ = std::make_unique<Impl>(model, std::move(opts));
}

Engine::~Engine() = default;

const std::vector<float>& Engine::prefill(std::span<const int> tokens) {
  if (tokens.empty()) throw EngineError("engine: prefill of zero tokens");
  impl_->run(tokens, nullptr);
  return impl_->logits;
}

const std::vector<float>& Engine::decode(int token) {
  Impl& d = *impl_;
  d.check_room(1);
  d.history.push_back(token);
  const auto t0 = Clock::now();
  d.release_outside_window();
  d.forward(&token, 1, d.logits.data(), false);
  d.stats.decode_seconds += seconds_since(t0);
  d.stats.decode_tokens += 1;
  return d.logits;
}

std::vector<float> Engine::forward_all_logits(std::span<const int> tokens) {
  std::vector<float> out(tokens.size() * impl_->logits.size());
  if (!tokens.empty()) impl_->run(tokens, out.data());
  if (!tokens.empty())
    std::copy(out.end() - static_cast<std::ptrdiff_t>(impl_->logits.size()), out.end(), impl_->logits.begin());
  return out;
}

GenerateResult Engine::generate(std::span<const int> prompt, int steps, const SamplerOptions& so,
                                const std::function<void(int)>& on_token) {
  Impl& d = *impl_;
  Sampler sampler(vocab_size(), so);
  GenerateResult r = generate_loop(
      "engine", prompt.size(), steps, d.model.config.bos_id, d.model.config.eos_id, d.max_ctx, d.stats,
      [&] { d.run(prompt, nullptr); }, [&] { return sampler.sample(d.logits); }, [&] { return d.length(); }, [&](int t) { decode(t); },
      on_token);
  d.refresh();
  return r;
}

void Engine::reset() {
  Impl& d = *impl_;
  if (d.tp) d.tp->reset_sequences();
  for (auto& st : d.stages) {
    st->store.free_sequence(st->seq);
    st->seq = st->store.create_sequence();
  }
  d.history.clear();
  const EngineStats keep = d.stats;
  d.stats = EngineStats{};
  d.stats.requested_kv = keep.requested_kv;
  d.stats.requested_source = keep.requested_source;
  d.stats.effective_kv = keep.effective_kv;
  d.stats.backend = keep.backend;
  d.stats.fallback_reason = keep.fallback_reason;
  d.stats.kv_layout = keep.kv_layout;
  d.stats.block_size = keep.block_size;
  d.stats.n_blocks = keep.n_blocks;
  d.stats.kv_pool_bytes = keep.kv_pool_bytes;
  d.stats.threads = keep.threads;
  d.stats.prefill_chunk = keep.prefill_chunk;
  d.stats.pipeline_stages = keep.pipeline_stages;
  d.stats.stage_layers = keep.stage_layers;
  d.stats.topology = keep.topology;
  d.stats.tensor_parallel = keep.tensor_parallel;
  d.stats.kv_layer_map = keep.kv_layer_map;
  d.stats.layer_kv = keep.layer_kv;
  d.stats.layer_kv_bytes_per_token = keep.layer_kv_bytes_per_token;
  d.stats.kv_resident_tokens = keep.kv_resident_tokens;
  d.stats.kv_device_bytes = keep.kv_device_bytes;
  d.refresh();
}

void Engine::truncate(int n_tokens) {
  impl_->for_each_store([&](PagedKvStore& st, SeqId& s) { st.truncate(s, n_tokens); });
  impl_->history.resize(static_cast<std::size_t>(n_tokens));
  impl_->refresh();
}

std::span<const int> Engine::history() const { return impl_->history; }


int Engine::hydrate(const KvFile& file, std::span<const int> prompt) {
  Impl& d = *impl_;
  d.refuse_files_with_tp("hydrating");
  if (d.tp) {  // the file is checked against, and restored into, an unsplit staging store
    const std::unique_ptr<PagedKvStore> shape = d.staging_store(0);
    const KvStageView one[1] = {{shape.get(), 0}};
    check_kv_file_compatible(file, one, d.model.fingerprint);  // refuse before touching the sequences
  } else {
    check_kv_file_compatible(file, d.views(), d.model.fingerprint);  // refuse before touching the sequence
  }
  const int n = hydratable_prefix(file, prompt);
  if (n > d.max_ctx) throw EngineError("engine: the KV file holds more tokens than the context");
  auto t0 = Clock::now();
  if (d.tp) {  // restored into the staging store before the ranks are touched (a refusal loses nothing)
    const std::unique_ptr<PagedKvStore> staging = d.staging_store(n);
    const SeqId sseq = staging->create_sequence();
    const KvStageTarget one[1] = {{staging.get(), sseq}};
    restore_kv_file(file, one, n, d.model.fingerprint);
    reset();
    scatter_rank_pages(*staging, sseq, n, d.model.config, d.rank_targets());
  } else {
    reset();
    t0 = Clock::now();
    restore_kv_file(file, d.targets(), n, d.model.fingerprint);
  }
  d.history.assign(prompt.begin(), prompt.begin() + n);
  d.stats.hydrated_tokens = n;
  d.stats.hydrate_ms = seconds_since(t0) * 1e3;
  d.refresh();
  return n;
}

void Engine::save_kv(const std::string& path, std::span<const int> pending) const {
  const Impl& d = *impl_;
  std::vector<int> transcript(d.history);
  transcript.insert(transcript.end(), pending.begin(), pending.end());
  if (d.tp) {  // the ranks' pages gathered into one unsplit store: the file an unsplit engine writes
    d.refuse_files_with_tp("saving");
    const int n = d.length();
    const std::unique_ptr<PagedKvStore> staging = d.staging_store(n);
    const SeqId sseq = staging->create_sequence();
    gather_rank_pages(d.rank_views(), d.model.config, *staging, sseq, n);
    const KvStageView one[1] = {{staging.get(), sseq}};
    save_kv_file(path, one, n, transcript, d.model.fingerprint);
    return;
  }
  save_kv_file(path, d.views(), d.length(), transcript, d.model.fingerprint);
}

int Engine::position() const { return impl_->length(); }
int Engine::max_context() const { return impl_->max_ctx; }
int Engine::vocab_size() const { return static_cast<int>(impl_->logits.size()); }
const EngineStats& Engine::stats() const {
  impl_->refresh();
  return impl_->stats;
}
const Model& Engine::model() const { return impl_->model; }
const PagedKvStore& Engine::store() const { return impl_->store0(); }
PagedKvStore& Engine::store() { return const_cast<PagedKvStore&>(impl_->store0()); }
SeqId Engine::sequence() const { return impl_->seq0(); }
int Engine::stage_count() const { return impl_->tp ? 1 : static_cast<int>(impl_->stages.size()); }
const PagedKvStore& Engine::stage_store(int stage) const { return impl_->stage(stage).store; }
SeqId Engine::stage_sequence(int stage) const { return impl_->stage(stage).seq; }
std::pair<int, int> Engine::stage_layers(int stage) const {
  const Stage& st = impl_->stage(stage);
  return {st.layer0, st.layer1};
}

int Engine::tp_ranks() const { return impl_->tp ? impl_->tp->ranks() : 1; }
const PagedKvStore& Engine::rank_store(int rank) const {
  if (!impl_->tp) {
    if (rank != 0) throw EngineError("engine: no tensor-parallel rank " + std::to_string(rank) + " (the engine is not split by --tp)");
    return impl_->store0();
  }
  if (rank < 0 || rank >= impl_->tp->ranks())
    throw EngineError("engine: no tensor-parallel rank " + std::to_string(rank) + " (the engine has " +
                      std::to_string(impl_->tp->ranks()) + ")");
  return impl_->tp->store(rank);
}
SeqId Engine::rank_sequence(int rank) const {
  rank_store(rank);  // the same refusals
  return impl_->tp ? impl_->tp->sequence(rank) : impl_->seq0();
}

}  // namespace kvgate
