#include "kvgate/engine.hpp"
#include "kvgate/generate_loop.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include "forward_cpu.hpp"
#include "kvgate/kv_file.hpp"
#include "kvgate/limits.hpp"
#include "thread_pool.hpp"

namespace kvgate {

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

StoreConfig make_store_config(const Model& m, const EngineOptions& o, int max_ctx, const std::string& who) {
  const ModelConfig& c = m.config;
  StoreConfig sc;
  sc.format = o.kv.effective;
  sc.n_layers = c.n_layers;
  sc.n_kv_heads = c.n_kv_heads;
  sc.head_dim = c.head_dim;
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
  if (o.n_blocks > 0) {
    sc.n_blocks = o.n_blocks;
  } else if (o.kv_cache_memory > 0) {
    sc.n_blocks = blocks_for_budget(sc.format, sc.geometry(), c.n_layers, o.kv_cache_memory);
    if (sc.n_blocks < 1)
      throw EngineError(who + ": --kv-cache-memory " + std::to_string(o.kv_cache_memory) + " bytes buys no KV block of " +
                        sc.format.name() + " (one block of all layers needs " +
                        std::to_string(static_cast<std::size_t>(c.n_layers) *
                                       (page_bytes(sc.format.k, sc.geometry()) + page_bytes(sc.format.v, sc.geometry()))) +
                        " bytes)");
  } else {
    const std::uint64_t ctx = limits::check(limits::kContext, max_ctx, who, "context length (max_position_embeddings)");
    const std::uint64_t bs = static_cast<std::uint64_t>(o.block_size);
    sc.n_blocks = static_cast<int>((ctx + bs - 1) / bs);
  }
  // The pool is allocated (and zero-filled) up front: refuse what the machine does not have.
  {
    const PageGeometry g = sc.geometry();
    const std::uint64_t per_block =
        limits::mul(static_cast<std::uint64_t>(c.n_layers), page_bytes(sc.format.k, g) + page_bytes(sc.format.v, g), who,
                    "KV bytes per block");
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
    if (static_cast<int>(s.size()) != c.n_layers)
      throw EngineError(who + ": " + which + " has " + std::to_string(s.size()) +
                        " entries; give one, or one per layer (" + std::to_string(c.n_layers) + ")");
    return s;
  };
  sc.k_scale = scales(o.k_scale, c.k_scale, "k_scale");
  sc.v_scale = scales(o.v_scale, c.v_scale, "v_scale");
  return sc;
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

struct Engine::Impl {
  const Model& model;
  EngineOptions opts;
  int max_ctx;
  detail::ThreadPool pool;
  PagedKvStore store;
  SeqId seq;
  detail::CpuForward fwd;
  std::vector<float> logits;
  EngineStats stats;
  std::vector<int> history;  // token ids of the sequence (conversations save them)
  int release_window = 0;    // > 0: every layer is windowed; the widest window (pages before it are released)

  Impl(const Model& m, EngineOptions o)
      : model(m),
        opts(std::move(o)),
        max_ctx(opts.max_context > 0 ? opts.max_context : m.config.max_seq_len),
        pool(resolve_threads(opts.threads)),
        store(make_store_config(m, opts, max_ctx, "engine")),
        seq(store.create_sequence()),
        fwd(m, std::max(1, std::min(opts.prefill_chunk, max_ctx)), pool),
        logits(static_cast<std::size_t>(m.config.vocab_size)) {
    stats.requested_kv = opts.kv.requested.name();
    stats.requested_source = opts.kv.requested_source;
    stats.effective_kv = opts.kv.effective.name();
    stats.backend = opts.kv.backend.empty() ? "cpu" : opts.kv.backend;
    stats.fallback_reason = opts.kv.fallback_reason;
    stats.kv_layout = kv_cache_layout(m.config);
    stats.block_size = store.config().block_size;
    stats.n_blocks = store.config().n_blocks;
    stats.kv_pool_bytes = store.pool_bytes();
    stats.threads = pool.size();
    if (opts.kv_resident < 0) throw EngineError("engine: --kv-resident must be >= 0 tokens (0 = off)");
    if (opts.kv_resident > 0) store.set_streaming(opts.kv_resident);
    if (opts.kv_read_hook) store.set_read_hook(opts.kv_read_hook);
    stats.kv_resident_tokens = opts.kv_resident;
    stats.kv_device_bytes = store.window() ? store.window()->device_bytes() : store.pool_bytes();
    if (opts.release_outside_window) release_window = widest_window_if_all(m.config);
  }

  // Before a forward step of queries from position `pos0`: the keys any layer reads start at
  // pos0 - window + 1, so the whole pages before it go back to the pool.
  void release_outside_window() {
    if (release_window > 0) store.release_before(seq, store.length(seq) - release_window + 1);
  }

  void check_room(std::size_t n) const {
    const int pos = store.length(seq);
    if (static_cast<long long>(pos) + static_cast<long long>(n) > max_ctx)
      throw EngineError("engine: " + std::to_string(n) + " more tokens at position " + std::to_string(pos) +
                        " exceed the context of " + std::to_string(max_ctx) + " tokens");
  }
  void refresh() {
    stats.position = store.length(seq);
    stats.kv_bytes = store.sequence_bytes(seq);
    const StreamCounters sc = store.stream_counters();
    stats.kv_block_lookups = sc.lookups;
    stats.kv_block_misses = sc.misses;
    stats.kv_bytes_moved = sc.bytes_moved;
  }
  // Batched prefill in chunks; `all` receives [n][vocab] when non-null.
  void run(std::span<const int> toks, float* all) {
    check_room(toks.size());
    history.insert(history.end(), toks.begin(), toks.end());
    const auto t0 = Clock::now();
    const int C = fwd.max_chunk();
    const std::size_t V = logits.size();
    for (std::size_t i = 0; i < toks.size(); i += static_cast<std::size_t>(C)) {
      const int n = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(C), toks.size() - i));
      release_outside_window();
      if (all) fwd.forward(store, seq, toks.data() + i, n, all + i * V, true);
      else fwd.forward(store, seq, toks.data() + i, n, logits.data(), false);  // the last chunk's wins
    }
    stats.prefill_seconds += seconds_since(t0);
    stats.prefill_tokens += static_cast<long long>(toks.size());
    refresh();
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
  d.fwd.forward(d.store, d.seq, &token, 1, d.logits.data(), false);
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
      [&] { d.run(prompt, nullptr); }, [&] { return sampler.sample(d.logits); }, [&] { return d.store.length(d.seq); }, [&](int t) { decode(t); },
      on_token);
  d.refresh();
  return r;
}

void Engine::reset() {
  Impl& d = *impl_;
  d.store.free_sequence(d.seq);
  d.seq = d.store.create_sequence();
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
  d.stats.kv_resident_tokens = keep.kv_resident_tokens;
  d.stats.kv_device_bytes = keep.kv_device_bytes;
  d.refresh();
}

void Engine::truncate(int n_tokens) {
  impl_->store.truncate(impl_->seq, n_tokens);
  impl_->history.resize(static_cast<std::size_t>(n_tokens));
  impl_->refresh();
}

std::span<const int> Engine::history() const { return impl_->history; }

int Engine::hydrate(const KvFile& file, std::span<const int> prompt) {
  Impl& d = *impl_;
  check_kv_file_compatible(file, d.store, d.model.fingerprint);  // refuse before touching the sequence
  const int n = hydratable_prefix(file, prompt);
  if (n > d.max_ctx) throw EngineError("engine: the KV file holds more tokens than the context");
  reset();
  const auto t0 = Clock::now();
  restore_kv_file(file, d.store, d.seq, n, d.model.fingerprint);
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
  save_kv_file(path, d.store, d.seq, d.store.length(d.seq), transcript, d.model.fingerprint);
}

int Engine::position() const { return impl_->store.length(impl_->seq); }
int Engine::max_context() const { return impl_->max_ctx; }
int Engine::vocab_size() const { return static_cast<int>(impl_->logits.size()); }
const EngineStats& Engine::stats() const {
  impl_->refresh();
  return impl_->stats;
}
const Model& Engine::model() const { return impl_->model; }
const PagedKvStore& Engine::store() const { return impl_->store; }
PagedKvStore& Engine::store() { return impl_->store; }
SeqId Engine::sequence() const { return impl_->seq; }

}  // namespace kvgate
