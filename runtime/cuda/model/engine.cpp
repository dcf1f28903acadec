// CudaEngine: one sequence over a CudaKvStore, the CPU Engine's API subset the CLI needs.
#include <algorithm>
#include <set>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/common.cuh"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/cuda/pipeline.hpp"
#include "kvgate/cuda/stream_pool.hpp"
#include "kvgate/cuda/tensor_parallel.hpp"
#include "kvgate/generate_loop.hpp"
#include "kvgate/kv_file.hpp"

namespace kvgate::cuda {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

const Model& checked(const Model& m) {
  if (m.weights.layers.empty()) throw EngineError("cuda engine: the model has no weights loaded");
  const DeviceStatus& d = device_status();
  if (!d.available)
    throw EngineError("cuda engine: " + d.reason +
                      ". --device cuda needs an NVIDIA GPU (sm_90) with a working driver; run with --device cpu instead");
  return m;
}

int pages_for(int tokens, int block_size) { return (tokens + block_size - 1) / block_size; }

// The window's upload stream (streaming only). Non-blocking: nothing orders it implicitly with the
// forward's stream or the legacy stream; the engine orders them explicitly (stream_in / stream_out).
struct OwnedStream {
  cudaStream_t s = nullptr;
  explicit OwnedStream(bool make) {
    if (make) KVGATE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  ~OwnedStream() {
    if (s) cudaStreamDestroy(s);
  }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
};

// --kv-resident N: the host mirror (a PagedKvStore holding every page, its pools page-locked in
// place) whose window of N tokens' pages per layer lives in a CudaDevicePool (stream_pool.hpp).
struct Streamed {
  std::unique_ptr<PagedKvStore> host;
  CudaDevicePool* pool = nullptr;  // owned by *host (its window)
};

Streamed make_streamed(const StoreConfig& sc, int resident, cudaStream_t upload_stream) {
  Streamed st;
  if (resident < 0) throw EngineError("cuda engine: --kv-resident must be >= 0 tokens (0 = off), got " + std::to_string(resident));
  if (resident == 0) return st;
  st.host = std::make_unique<PagedKvStore>(sc);
  st.pool = &stream_on_device(*st.host, resident, upload_stream);
  return st;
}

// The device store the forward runs on: its own pools (resident), or a view over the window's slots
// (streaming: layer l's K pages at slot base + l * window_blocks * slot_bytes, V pages kv_slot_v_offset
// further, slot_bytes apart; the view's page indices are the layer's window slots 0..window_blocks-1).
std::unique_ptr<CudaKvStore> make_device_store(const StoreConfig& sc, const Streamed& st) {
  if (!st.host) return std::make_unique<CudaKvStore>(sc);
  const KvWindow& w = *st.host->window();
  const int W = w.window_blocks();
  CudaKvStore::External ext;
  ext.stride = st.pool->slot_bytes();
  ext.n_pages = W;
  for (int l = 0; l < sc.n_layers; ++l) {
    // The forward's store kernel writes these slots (quantize-on-append); stream_out then copies the
    // written pages back to the host mirror. The pool hands out const pointers because the window
    // logic itself only uploads into them.
    auto* base = const_cast<std::uint8_t*>(st.pool->base()) + static_cast<std::size_t>(l) * W * ext.stride;
    ext.pools.push_back(base);
    ext.pools.push_back(base + w.v_offset());
  }
  return std::make_unique<CudaKvStore>(sc, std::move(ext));
}

// What the CUDA engine refuses whether it is split or not.
void check_options(const CudaEngineOptions& o) {
  if (o.engine.kv_resident < 0)
    throw EngineError("cuda engine: --kv-resident must be >= 0 tokens (0 = off), got " + std::to_string(o.engine.kv_resident));
  if (!kv_layer_map_uniform(o.engine.kv_layers))
    throw EngineError("cuda engine: a per-layer KV map (--kv-layers " + kv_layer_map_name(o.engine.kv_layers) +
                      ") runs on the CPU engine only: the CUDA kernels take one format for every layer; run it with "
                      "--device cpu, or give one --kv format");
  if (o.engine.mla_cache == MlaCache::latent && o.engine.kv_resident > 0)
    throw EngineError("cuda engine: --mla-cache latent with --kv-resident (a streamed window over the latent cache) "
                      "runs on the CPU engine only in this version; run it with --device cpu, or drop --kv-resident");
  if (o.engine.kv_read_hook)
    throw EngineError("cuda engine: a KV read hook (diagnostics) is a CPU-engine feature: the CUDA kernels read the "
                      "device pages directly; set CudaEngineOptions::damage (the damage on the stored rows) instead");
}

// The layer split (EngineOptions::pipeline_stages > 1): every stage's weights, store and forward on
// its device (CudaEngineOptions::devices; default stage i on device i modulo the device count);
// `make_store` makes each stage's device store (the engine's: its own pages, or with --kv-resident a
// view over the stage's own window). KV files and streaming go through every stage (CudaEngine::Impl);
// KV damage and shared device weights are single-model paths and are refused with the split.
std::unique_ptr<CudaPipeline> make_pipeline(const Model& m, const CudaEngineOptions& o, const StoreConfig& sc,
                                            int max_ctx,
                                            std::function<std::unique_ptr<CudaKvStore>(int, const StoreConfig&)> make_store) {
  check_options(o);  // first: the engine's initializers call this before the weights are made
  const EngineOptions& e = o.engine;
  if (e.pipeline_stages <= 1 && e.pipeline_layers.size() <= 1) {
    if (o.devices.size() > 1)
      throw EngineError("cuda engine: " + std::to_string(o.devices.size()) +
                        " devices given (--devices) for an unsplit engine; give one, or split the layers with --pp " +
                        std::to_string(o.devices.size()));
    if (o.devices.size() == 1) {  // only the current device (no device query otherwise: CudaModel says why)
      int cur = 0;
      KVGATE_CUDA_CHECK(cudaGetDevice(&cur));
      if (o.devices[0] != cur)
        throw EngineError("cuda engine: --devices " + std::to_string(o.devices[0]) + " for an unsplit engine whose " +
                          "current device is " + std::to_string(cur) + "; select the GPU with CUDA_VISIBLE_DEVICES");
    }
    return nullptr;
  }
  const int stages = e.pipeline_layers.empty() ? e.pipeline_stages : static_cast<int>(e.pipeline_layers.size());
  auto refuse = [&](const std::string& what) {
    throw EngineError("cuda engine: " + what + " with the layer split (--pp) is not supported on the CUDA engine in "
                      "this version (its stages each hold their own store); run it with --device cpu, or drop --pp");
  };
  if (o.damage) refuse("KV damage (probe sensitivity)");
  if (o.shared_weights) refuse("shared device weights");
  PipelineOptions po;
  po.devices = o.devices;
  if (po.devices.empty()) {
    int n_dev = 1;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) n_dev = 1;
    for (int i = 0; i < stages; ++i) po.devices.push_back(i % n_dev);
  } else if (static_cast<int>(po.devices.size()) != stages) {
    throw EngineError("cuda engine: --devices names " + std::to_string(po.devices.size()) + " devices for " +
                      std::to_string(stages) + " pipeline stages; give one device per stage (a device may repeat)");
  }
  po.stage_layers = e.pipeline_layers;
  po.weights = o.weights;
  po.store = sc;
  po.forward = CudaForwardOptions{std::max(1, std::min(e.prefill_chunk, max_ctx)), max_ctx, o.cuda_graphs};
  po.make_store = std::move(make_store);
  return std::make_unique<CudaPipeline>(m, std::move(po));
}

// Tensor parallelism (EngineOptions::tensor_parallel > 1, kvgate/cuda/tensor_parallel.hpp): every
// rank's sliced weights, store and forward on its device (CudaEngineOptions::devices: one per rank;
// default every rank on the current device); `make_store` makes each rank's device store from its
// StoreConfig (its KV heads), as make_pipeline's does per stage (with --kv-resident a view over the
// rank's own window over its own host mirror). What the split does not carry is refused by name.
std::unique_ptr<CudaTensorParallel> make_tensor_parallel(
    const Model& m, const CudaEngineOptions& o, const StoreConfig& sc, int max_ctx,
    std::function<std::unique_ptr<CudaKvStore>(int, const StoreConfig&)> make_store) {
  const EngineOptions& e = o.engine;
  if (e.tensor_parallel == 1) return nullptr;
  check_options(o);  // first, as make_pipeline
  const std::string tp = "--tp " + std::to_string(e.tensor_parallel);
  if (e.tensor_parallel < 1) throw EngineError("cuda engine: " + tp + ": give 1 (no split) or more ranks");
  auto refuse = [&](const std::string& what, const std::string& fix) {
    throw EngineError("cuda engine: tensor parallelism (" + tp + ") with " + what +
                      " is not supported on the CUDA engine in this version; " + fix);
  };
  if (e.pipeline_stages > 1 || e.pipeline_layers.size() > 1)
    refuse("a layer split (--pp)", "drop one of --tp and --pp");
  if (o.damage) refuse("KV damage (probe sensitivity)", "run it unsplit (drop --tp)");
  if (o.shared_weights) refuse("shared device weights", "let the engine upload its ranks' weights (no shared_weights)");
  if (e.mla_cache == MlaCache::latent) refuse("--mla-cache latent", "drop --tp");
  TensorParallelOptions to;
  to.ranks = e.tensor_parallel;
  to.devices = o.devices;
  to.weights = o.weights;
  to.store = sc;
  to.forward = CudaForwardOptions{std::max(1, std::min(e.prefill_chunk, max_ctx)), max_ctx, false};
  to.make_store = std::move(make_store);
  return std::make_unique<CudaTensorParallel>(m, std::move(to));
}

}  // namespace

static std::shared_ptr<const CudaModel> own_or_shared(const Model& m, const CudaEngineOptions& o) {
  if (!o.shared_weights) return std::make_shared<const CudaModel>(m, o.weights);
  const ModelConfig& a = o.shared_weights->config();
  const ModelConfig& b = m.config;
  if (a.n_layers != b.n_layers || a.dim != b.dim || a.hidden_dim != b.hidden_dim || a.vocab_size != b.vocab_size ||
      a.n_kv_heads != b.n_kv_heads || a.head_dim != b.head_dim)
    throw EngineError("cuda engine: the shared device weights were made from another model shape than '" + m.path + "'");
  return o.shared_weights;
}

namespace {

// Streaming (--kv-resident): one stage's host mirror and device window, on the stage's device (one per
// pipeline stage or tensor-parallel rank, as every GPU has its own pool; one when unsplit). The stage's
// forward runs on a view over the window's slots; every page lives in the mirror. A rank's mirror and
// window hold its KV heads (its StoreConfig: tensor_parallel_store_config) for every layer.
struct StageWindow {
  int device = 0;
  OwnedStream upload;  // the window's stream (declared before `streamed`: destroyed after it)
  Streamed streamed;   // host mirror + device window
  SeqId hseq = 0;      // the sequence in the host mirror (same tokens as the engine's)
  StageWindow(int dev, const StoreConfig& c, int resident)
      : device(dev), upload(true), streamed(make_streamed(c, resident, upload.s)) {}
};

// One pipeline stage's KV as the engine moves it (one stage when unsplit; with --tp one per rank): its
// device, its device store (resident: its own pages; streaming: the view over its window), its forward,
// and its window when streaming. Stage i's store holds model layers [first_layer, first_layer +
// n_layers) at slots 0..; rank r's store every layer of its KV heads.
struct KvStage {
  int device = 0;
  CudaKvStore* store = nullptr;
  CudaForward* fwd = nullptr;
  StageWindow* win = nullptr;  // streaming only
};

}  // namespace

struct CudaEngine::Impl {
  const Model& model;
  CudaEngineOptions opts;
  int max_ctx;
  StoreConfig sc;
  // Streaming: every stage's (or tensor-parallel rank's) window and host mirror, in stage / rank order
  // (made by make_stage_store; declared before the stores that view them, so destroyed after them).
  // Empty when resident.
  std::vector<std::unique_ptr<StageWindow>> windows;
  // The layer split (--pp): the stages' weights, stores and forwards; `weights`, `store` and `fwd` are
  // then stage 0's (positions and sequences are kept in step in every stage), and run/step go through
  // the pipeline. Null: the unsplit engine, which owns the three below.
  std::unique_ptr<CudaPipeline> pipe;
  // Tensor parallelism (--tp): the ranks' weights, stores and forwards; `weights`, `store` and `fwd`
  // are then rank 0's (sequences kept in step in every rank's store), run/step go through the ranks.
  // Not with `pipe` (refused). Declared after `pipe`: made after it (make_pipeline returns null then).
  std::unique_ptr<CudaTensorParallel> tp;
  std::shared_ptr<const CudaModel> weights_holder;  // opts.shared_weights, else this engine's own upload
  const CudaModel& weights;
  std::unique_ptr<CudaKvStore> own_store;
  CudaKvStore& store;  // stage 0's: resident, its KV; streaming, the view over its window's slots
  SeqId seq;           // the sequence, the same id in every stage's store
  std::unique_ptr<CudaForward> own_fwd;
  CudaForward& fwd;
  std::vector<KvStage> stages;  // every stage in layer order (one when unsplit; the ranks with --tp): saves, hydrates, streaming
  std::vector<float> logits;
  EngineStats stats;
  std::vector<int> history;  // token ids whose K/V rows the sequence holds (conversations save them)
  int release_window = 0;    // > 0: every layer is windowed; the widest window (pages before it are released)

  Impl(const Model& m, CudaEngineOptions o)
      : model(checked(m)),
        opts(std::move(o)),
        max_ctx(opts.engine.max_context > 0 ? opts.engine.max_context : m.config.max_seq_len),
        sc(make_store_config(m, opts.engine, max_ctx, "cuda engine")),
        pipe(opts.engine.tensor_parallel != 1
                 ? nullptr
                 : make_pipeline(m, opts, sc, max_ctx, [this](int, const StoreConfig& c) { return make_stage_store(c); })),
        tp(make_tensor_parallel(m, opts, sc, max_ctx,
                                [this](int, const StoreConfig& c) { return make_stage_store(c); })),
        weights_holder(pipe || tp ? nullptr : own_or_shared(m, opts)),
        weights(pipe ? *pipe->stage(0).model : tp ? *tp->rank(0).weights : *weights_holder),
        own_store(pipe || tp ? nullptr : make_stage_store(sc)),
        store(pipe ? *pipe->stage(0).store : tp ? *tp->rank(0).store : *own_store),
        seq(pipe ? pipe->create_sequence() : tp ? tp->create_sequence() : store.create_sequence()),
        own_fwd(pipe || tp ? nullptr
                     : std::make_unique<CudaForward>(
                           weights, store,
                           CudaForwardOptions{std::max(1, std::min(opts.engine.prefill_chunk, max_ctx)), max_ctx,
                                              opts.cuda_graphs})),
        fwd(pipe ? *pipe->stage(0).forward : tp ? *tp->rank(0).forward : *own_fwd),
        logits(static_cast<std::size_t>(m.config.vocab_size)) {
    if (pipe) {
      for (int i = 0; i < pipe->n_stages(); ++i) {
        CudaPipeline::Stage& ps = pipe->stage(i);
        stages.push_back({ps.device, ps.store.get(), ps.forward.get(), nullptr});
      }
    } else if (tp) {  // every rank, in rank order: pool_bytes() adds their pools; streaming, saves and hydrates per rank
      for (int r = 0; r < tp->ranks(); ++r) {
        CudaTensorParallel::Rank& rk = tp->rank(r);
        stages.push_back({rk.device, rk.store.get(), rk.forward.get(), nullptr});
      }
    } else {
      stages.push_back({weights.device(), &store, &fwd, nullptr});
    }
    if (streaming()) {
      if (windows.size() != stages.size())
        throw std::logic_error("cuda engine: " + std::to_string(windows.size()) + " streamed windows for " +
                               std::to_string(stages.size()) + " stages");
      for (std::size_t i = 0; i < stages.size(); ++i) {
        stages[i].win = windows[i].get();
        windows[i]->hseq = windows[i]->streamed.host->create_sequence();
      }
    }
    if (opts.damage) fwd.set_damage(opts.damage);
    stats.requested_kv = opts.engine.kv.requested.name();
    stats.requested_source = opts.engine.kv.requested_source;
    stats.effective_kv = opts.engine.kv.effective.name();
    stats.backend = "cuda";
    stats.kv_layout = sc.layout == KvLayout::mla_latent ? kv_cache_layout_latent(m.config, sc.format)
                                                        : kv_cache_layout(m.config);
    stats.fallback_reason = opts.engine.kv.fallback_reason;
    stats.block_size = sc.block_size;
    stats.n_blocks = sc.n_blocks;
    stats.prefill_chunk = fwd.options().max_rows;  // the chunk run() steps by
    if (streaming()) {  // every stage's mirror (the whole KV) and device window
      for (const auto& w : windows) {
        stats.kv_pool_bytes += w->streamed.host->pool_bytes();
        stats.kv_device_bytes += w->streamed.host->window()->device_bytes();
      }
    } else {
      stats.kv_pool_bytes = stats.kv_device_bytes = pool_bytes();
    }
    if (pipe) {
      stats.pipeline_stages = pipe->n_stages();
      for (int i = 0; i < pipe->n_stages(); ++i)
        stats.stage_layers.push_back(pipe->stage(i).range.end - pipe->stage(i).range.first);
      stats.topology = topology_name(stats.stage_layers);
    }
    if (tp) {
      stats.tensor_parallel = tp->ranks();
      stats.topology = tp->topology();
    }
    // The distinct CUDA devices the engine runs on (matrix rows and field reports: "gpus").
    stats.devices = 1;
    if (pipe) {
      std::set<int> used;
      for (int i = 0; i < pipe->n_stages(); ++i) used.insert(pipe->stage(i).device);
      stats.devices = static_cast<int>(used.size());
    }
    if (tp) stats.devices = tp->n_devices();
    stats.kv_resident_tokens = std::max(0, opts.engine.kv_resident);
    stats.threads = 1;
    if (opts.engine.release_outside_window) release_window = widest_window_if_all(m.config);
  }
  ~Impl() {
    // The views and forwards first, then each stage's window and mirror with its device current; the
    // caller's device is current again afterwards. (Nothing here may throw.)
    int caller = 0;
    const bool restore = cudaGetDevice(&caller) == cudaSuccess;
    own_fwd.reset();
    own_store.reset();
    pipe.reset();
    tp.reset();
    for (auto& w : windows) {
      (void)cudaSetDevice(w->device);
      w.reset();
    }
    if (restore) (void)cudaSetDevice(caller);
  }

  bool streaming() const { return !windows.empty(); }
  // KV files with tensor parallelism keep the unsplit layout (the file an unsplit engine writes): a
  // rank's pages are its heads' slices of the unsplit pages (tensor_parallel_file_refusal,
  // kvgate/tensor_parallel.hpp); another format is refused by name, before anything is touched.
  void refuse_files_with_tp(const char* what) const {
    if (!tp) return;
    if (const std::string why = tensor_parallel_file_refusal(sc, model.config, tp->ranks()); !why.empty())
      throw EngineError(std::string("cuda engine: ") + what + " a KV file (--conv-id / save_kv / hydrate) with tensor " +
                        "parallelism (--tp " + std::to_string(tp->ranks()) + ") and " + why +
                        " (a rank's pages are not head slices of the unsplit page); drop --tp or pick another --kv format");
  }
  // A stage's device store (the unsplit engine's: its one stage), made on the current device: its own
  // pages, or with --kv-resident a view over a window of its own (StageWindow) over its own host mirror.
  std::unique_ptr<CudaKvStore> make_stage_store(const StoreConfig& c) {
    if (opts.engine.kv_resident <= 0) return std::make_unique<CudaKvStore>(c);
    int dev = 0;
    KVGATE_CUDA_CHECK(cudaGetDevice(&dev));
    windows.push_back(std::make_unique<StageWindow>(dev, c, opts.engine.kv_resident));
    return make_device_store(c, windows.back()->streamed);
  }

  // The leading pages released once the forward call from position pos starts (0 without the
  // release): the whole pages before the first key the call reads (prefill_first_key: the prefill
  // kernel's first 32-key tile, at or before pos - window + 1 where a decode step starts), counted as
  // PagedKvStore::release_before / CudaKvStore::release_before count them. Every stage releases alike.
  int released_pages_at(int pos) const {
    const int B = sc.block_size;
    const int now = (streaming() ? windows[0]->streamed.host->released_tokens(windows[0]->hseq)
                                 : store.released_tokens(seq)) / B;
    if (release_window <= 0) return now;
    return std::max(now, std::min(prefill_first_key(pos, release_window) / B, pos / B));
  }
  // Before each forward call (prefill chunk or decode step), as the CPU engine: with a window on every
  // layer the pages wholly before the first key any layer reads go back to the pool -- every stage's
  // device store, or every stage's host mirror when streaming (its window drops their slots; stream_in
  // marks them released in the view's table). No kernel reads a released entry (the decode kernel starts at
  // pos - window + 1, the prefill kernel at prefill_first_key); kernel_table points it at a live page.
  void release_outside_window() {
    if (release_window <= 0) return;
    const int keep = prefill_first_key(store.length(seq), release_window);
    if (streaming()) {
      for (auto& w : windows) {
        DeviceScope on(w->device);
        w->streamed.host->release_before(w->hseq, keep);
      }
    } else if (pipe) {
      pipe->release_before(seq, keep);  // every stage's store, in step
    } else if (tp) {
      tp->release_before(seq, keep);  // every rank's store, in step
    } else {
      store.release_before(seq, keep);
    }
  }

  void check_room(std::size_t n) const {
    const int pos = store.length(seq);
    if (static_cast<long long>(pos) + static_cast<long long>(n) > max_ctx)
      throw EngineError("cuda engine: " + std::to_string(n) + " more tokens at position " + std::to_string(pos) +
                        " exceed the context of " + std::to_string(max_ctx) + " tokens");
  }
  // Streaming: one attention launch (prefill chunk or decode step) reads every page of the context
  // through the window at once (the kernels' partial softmax states are internal), so the layer's
  // window must hold the pages each call of the next `n` tokens reads: those up to its end less the
  // ones released before it (the sliding-window release). Checked before any state changes; the
  // message names the smallest --kv-resident that works. Every stage's (rank's) window has the same
  // pages per layer and releases alike, so stage 0's answers for all.
  void check_window(std::size_t n) const {
    if (!streaming()) return;
    const int B = sc.block_size;
    const int W = windows[0]->streamed.host->window()->window_blocks();
    const std::size_t C = static_cast<std::size_t>(fwd.options().max_rows);
    long long len = 0, need = 0;  // the end and the pages of the call that reads most
    for (std::size_t i = 0; i < n; i += C) {
      const int pos = store.length(seq) + static_cast<int>(i);
      const long long end = static_cast<long long>(pos) + static_cast<long long>(std::min(C, n - i));
      const long long pages = (end + B - 1) / B - released_pages_at(pos);
      if (pages > need) need = pages, len = end;
    }
    if (need > W)
      throw EngineError("cuda engine: --kv-resident " + std::to_string(opts.engine.kv_resident) + " keeps " +
                        std::to_string(W) + " pages of " + std::to_string(B) + " tokens per layer on the device (" +
                        std::to_string(static_cast<long long>(W) * B) + " tokens), but this step reads " +
                        std::to_string(need) + " pages (" + std::to_string(len) +
                        " tokens) in one attention launch: the CUDA kernels read a step's whole context through the "
                        "window at once. Use --kv-resident " + std::to_string(need * B) + " or more (" +
                        std::to_string(static_cast<long long>(pages_for(max_ctx, B)) * B) + " covers the whole context of " +
                        std::to_string(max_ctx) + " tokens), or drop --kv-resident");
  }
  // Streaming, before a forward call that extends the sequence by n tokens, for one stage (its device
  // current): its host mirror gets the new tokens' pages; every page the call reads (pages
  // [0, ceil((len + n) / B)) of every layer of the stage, K then V, layer by layer) is looked up in the
  // stage's window -- a miss uploads the block from the stage's mirror on the window's stream; the
  // view's table is pointed at the window slots; the stage's forward stream waits (event) for the
  // uploads queued so far.
  // Every layer sees the same lookups in the same order from the same state, so the LRU puts a block
  // in the same slot of every layer's window and one table serves all layers (checked). Within the
  // pass no page evicts another: there are no more pages than slots (check_window) and each miss
  // evicts the layer's least recently used slot (checked: every page resident afterwards).
  void stream_in(KvStage& st, int n) {
    DeviceScope on(st.device);
    PagedKvStore& host = *st.win->streamed.host;
    const PagedKvStore& chost = host;  // page() const is the window lookup (the non-const one drops the device copy)
    const CudaDevicePool& pool = *st.win->streamed.pool;
    const KvWindow& w = *host.window();
    const SeqId hs = st.win->hseq;
    const int n_layers = host.config().n_layers;  // the stage's layers (slots 0..)
    const int len = host.length(hs);
    host.extend(hs, n);
    const int pages = pages_for(len + n, sc.block_size);
    const int first = host.released_tokens(hs) / sc.block_size;  // released pages: not looked up
    const int W = w.window_blocks();
    const std::size_t sb = pool.slot_bytes(), voff = w.v_offset();
    const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(pool.base());
    const auto table = host.block_table(hs);
    std::vector<int> tab(static_cast<std::size_t>(pages), CudaKvStore::kReleasedBlock);
    for (int l = 0; l < n_layers; ++l)
      for (int p = first; p < pages; ++p) {
        const int b = table[static_cast<std::size_t>(p)];
        const auto k = reinterpret_cast<std::uintptr_t>(chost.page(l, KvHalf::K, b));
        const auto v = reinterpret_cast<std::uintptr_t>(chost.page(l, KvHalf::V, b));
        if (k < base || (k - base) % sb != 0 || v != k + voff)
          throw std::logic_error("cuda engine: the store's window is not backed by the engine's device pool");
        const long long local = static_cast<long long>((k - base) / sb) - static_cast<long long>(l) * W;
        if (local < 0 || local >= W)
          throw std::logic_error("cuda engine: layer " + std::to_string(l) + "'s page landed outside its window");
        int& t = tab[static_cast<std::size_t>(p)];
        if (l == 0) t = static_cast<int>(local);
        else if (t != local)
          throw std::logic_error("cuda engine: the window put page " + std::to_string(p) +
                                 " in different slots of layers 0 and " + std::to_string(l));
      }
    for (int l = 0; l < n_layers; ++l)
      for (int p = first; p < pages; ++p)
        if (!w.resident(l, table[static_cast<std::size_t>(p)]))
          throw std::logic_error("cuda engine: a page of the step was evicted by another page of the same step");
    st.store->set_sequence(seq, std::move(tab), len);  // the forward extends the view to len + n
    pool.make_wait(st.fwd->stream());
  }
  // Streaming, after the forward call wrote rows [pos0, pos0 + n) into the window's slots (store
  // kernel on the stage's forward stream), for one stage (its device current): the touched pages go
  // back to the stage's host mirror, queued on the forward's stream after the kernels (device ==
  // mirror for every other byte of those pages), then the host waits for that stream. After it the
  // mirror holds every page, and no kernel still reads a slot that the next call's uploads (window
  // stream, issued later by this thread) may recycle.
  void stream_out(KvStage& st, int pos0, int n) {
    DeviceScope on(st.device);
    PagedKvStore& host = *st.win->streamed.host;
    const CudaKvStore& ds = *st.store;
    const int B = sc.block_size;
    const auto table = host.block_table(st.win->hseq);
    const auto slots = ds.block_table(seq);
    for (int l = 0; l < host.config().n_layers; ++l)
      for (KvHalf h : {KvHalf::K, KvHalf::V})
        for (int p = pos0 / B; p <= (pos0 + n - 1) / B; ++p) {
          // Written in place, not through page() (non-const), which would drop the device copy that is
          // the source of these bytes; the pages are the store's own (host_page is its const view).
          auto* dst = const_cast<std::uint8_t*>(host.host_page(l, h, table[static_cast<std::size_t>(p)]));
          KVGATE_CUDA_CHECK(cudaMemcpyAsync(
              dst, ds.pool(l, h) + static_cast<std::size_t>(slots[static_cast<std::size_t>(p)]) * ds.page_stride(h),
              ds.page_bytes(h), cudaMemcpyDeviceToHost, st.fwd->stream()));
        }
    KVGATE_CUDA_CHECK(cudaStreamSynchronize(st.fwd->stream()));
  }
  // Streaming, around a forward call over every stage (or every tensor-parallel rank): each stage's
  // window gets the call's pages before it, and each stage's mirror the pages the call wrote after it
  // (every writer of every stage writes both copies). With --tp every rank's stream_in runs before the
  // ranks' forward (its forward stream waits for its own window's uploads; the all-reduce's events then
  // order the ranks' streams among themselves), and every rank's stream_out after it (queued on the
  // rank's forward stream, which CudaTensorParallel::finish has already synchronised).
  void stream_in_all(int n) {
    for (KvStage& st : stages) stream_in(st, n);
  }
  void stream_out_all(int pos0, int n) {
    for (KvStage& st : stages) stream_out(st, pos0, n);
  }
  std::size_t pool_bytes() const {  // the device pools of every stage
    std::size_t b = 0;
    for (const KvStage& st : stages) b += st.store->pool_bytes();
    return b;
  }
  void refresh() {
    stats.position = store.length(seq);
    const std::size_t held = store.block_table(seq).size() -
                             static_cast<std::size_t>(store.released_tokens(seq) / sc.block_size);
    stats.kv_bytes = held * static_cast<std::size_t>(sc.n_layers) *  // every stage's layers (all alike)
                     (store.page_bytes(KvHalf::K) + store.page_bytes(KvHalf::V)) *
                     static_cast<std::size_t>(tp ? tp->ranks() : 1);  // every rank's heads (all alike)
    if (streaming()) {  // the stages' counters added
      stats.kv_block_lookups = stats.kv_block_misses = stats.kv_bytes_moved = 0;
      for (const auto& w : windows) {
        const StreamCounters c = w->streamed.host->stream_counters();
        stats.kv_block_lookups += c.lookups;
        stats.kv_block_misses += c.misses;
        stats.kv_bytes_moved += c.bytes_moved;
      }
    }
  }
  // Chunked prefill; `all` receives [n][vocab] when non-null; `argmax` the last token's greedy id.
  void run(std::span<const int> toks, float* all, int* argmax) {
    check_room(toks.size());
    check_window(toks.size());
    const auto t0 = Clock::now();
    const int C = fwd.options().max_rows;
    const std::size_t V = logits.size();
    for (std::size_t i = 0; i < toks.size(); i += static_cast<std::size_t>(C)) {
      const int n = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(C), toks.size() - i));
      const bool last = i + static_cast<std::size_t>(n) == toks.size();
      const int pos0 = store.length(seq);
      release_outside_window();
      if (streaming()) stream_in_all(n);
      const auto chunk = toks.subspan(i, static_cast<std::size_t>(n));
      float* out = all ? all + i * V : last && !argmax ? logits.data() : nullptr;
      int* id = all ? nullptr : last ? argmax : nullptr;
      if (pipe) pipe->forward_chunk(seq, chunk, out, all != nullptr, id);
      else if (tp) tp->forward_chunk(seq, chunk, out, all != nullptr, id);
      else fwd.forward_chunk(seq, chunk, out, all != nullptr, id);
      if (streaming()) stream_out_all(pos0, n);
      history.insert(history.end(), toks.begin() + static_cast<std::ptrdiff_t>(i),
                     toks.begin() + static_cast<std::ptrdiff_t>(i) + n);
    }
    stats.prefill_seconds += seconds_since(t0);
    stats.prefill_tokens += static_cast<long long>(toks.size());
    refresh();
  }
  // One decode step: logits downloaded, or only the greedy id when `argmax`.
  void step(int token, int* argmax) {
    check_room(1);
    check_window(1);
    const auto t0 = Clock::now();
    const SeqId s = seq;
    const int pos0 = store.length(seq);
    release_outside_window();
    if (streaming()) stream_in_all(1);
    if (pipe)
      pipe->forward_decode(std::span<const SeqId>(&s, 1), std::span<const int>(&token, 1),
                           argmax ? nullptr : logits.data(), argmax);
    else if (tp)
      tp->forward_decode(std::span<const SeqId>(&s, 1), std::span<const int>(&token, 1),
                         argmax ? nullptr : logits.data(), argmax);
    else
      fwd.forward_decode(std::span<const SeqId>(&s, 1), std::span<const int>(&token, 1), argmax ? nullptr : logits.data(),
                         argmax);
    if (streaming()) stream_out_all(pos0, 1);
    history.push_back(token);
    stats.decode_seconds += seconds_since(t0);
    stats.decode_tokens += 1;
  }
  // A host store of a stage's format, shape, layers and scales (`stage_sc`: its device store's config)
  // with room for `tokens` (persistence staging).
  std::unique_ptr<PagedKvStore> staging(const StoreConfig& stage_sc, int tokens) const {
    StoreConfig c = stage_sc;
    c.n_blocks = std::max(1, pages_for(tokens, sc.block_size));
    return std::make_unique<PagedKvStore>(c);
  }
  // Streaming: every stage's host mirror as the KV file encoder reads it / the restore writer writes
  // it, in layer order (KvStageView / KvStageTarget, as the CPU engine's stages).
  std::vector<KvStageView> mirror_views() const {
    std::vector<KvStageView> v;
    for (const KvStage& st : stages) v.push_back({st.win->streamed.host.get(), st.win->hseq});
    return v;
  }
  std::vector<KvStageTarget> mirror_targets() {
    std::vector<KvStageTarget> v;
    for (KvStage& st : stages) v.push_back({st.win->streamed.host.get(), st.win->hseq});
    return v;
  }
};

CudaEngine::CudaEngine(const Model& model, CudaEngineOptions opts) : impl_(std::make_unique<Impl>(model, std::move(opts))) {}
CudaEngine::~CudaEngine() = default;

const std::vector<float>& CudaEngine::prefill(std::span<const int> tokens) {
  if (tokens.empty()) throw EngineError("cuda engine: prefill of zero tokens");
  impl_->run(tokens, nullptr, nullptr);
  return impl_->logits;
}

const std::vector<float>& CudaEngine::decode(int token) {
  impl_->step(token, nullptr);
  return impl_->logits;
}

std::vector<float> CudaEngine::forward_all_logits(std::span<const int> tokens) {
  std::vector<float> out(tokens.size() * impl_->logits.size());
  if (tokens.empty()) return out;
  impl_->run(tokens, out.data(), nullptr);
  std::copy(out.end() - static_cast<std::ptrdiff_t>(impl_->logits.size()), out.end(), impl_->logits.begin());
  return out;
}

// As Engine::generate: greedy takes the GPU argmax (the CPU argmax's rule: lowest id of the
// largest logit) and downloads one id per step; otherwise the CPU's seeded Sampler runs on the
// downloaded logits, so identical logits give identical samples.
GenerateResult CudaEngine::generate(std::span<const int> prompt, int steps, const SamplerOptions& so,
                                    const std::function<void(int)>& on_token) {
  Impl& d = *impl_;
  Sampler sampler(vocab_size(), so);
  const bool greedy = so.greedy();
  int next_id = 0;  // the GPU argmax of the last forward (greedy only)
  GenerateResult r = generate_loop(
      "cuda engine", prompt.size(), steps, d.model.config.bos_id, d.model.config.eos_id, d.max_ctx, d.stats,
      [&] { d.run(prompt, nullptr, greedy ? &next_id : nullptr); },
      [&] { return greedy ? next_id : sampler.sample(d.logits); }, [&] { return d.store.length(d.seq); },
      [&](int t) { d.step(t, greedy ? &next_id : nullptr); }, on_token);
  d.refresh();
  return r;
}

void CudaEngine::reset() {
  Impl& d = *impl_;
  if (d.pipe) {
    d.pipe->free_sequence(d.seq);
    d.seq = d.pipe->create_sequence();
  } else if (d.tp) {
    d.tp->free_sequence(d.seq);
    d.seq = d.tp->create_sequence();
  } else {
    d.store.free_sequence(d.seq);
    d.seq = d.store.create_sequence();
  }
  for (auto& w : d.windows) {  // streaming: every stage's mirror
    DeviceScope on(w->device);
    w->streamed.host->free_sequence(w->hseq);  // zeroes the mirror pages and drops their device copies
    w->hseq = w->streamed.host->create_sequence();
  }
  d.history.clear();
  d.stats.ttft_ms = 0;
  d.stats.prefill_tokens = d.stats.decode_tokens = 0;
  d.stats.prefill_seconds = d.stats.decode_seconds = 0;
  d.stats.hydrated_tokens = 0;
  d.stats.hydrate_ms = 0;
  d.refresh();
}

void CudaEngine::set_damage(const std::optional<KvDamage>& d) {
  if (impl_->pipe && d)
    throw EngineError("cuda engine: KV damage (probe sensitivity) with the layer split (--pp) is not supported; run "
                      "it on the unsplit engine");
  if (impl_->tp && d)
    throw EngineError("cuda engine: KV damage (probe sensitivity) with tensor parallelism (--tp) is not supported; run "
                      "it on the unsplit engine (drop --tp)");
  impl_->fwd.set_damage(d);
  impl_->opts.damage = d;
}

std::span<const int> CudaEngine::history() const { return impl_->history; }

// The KV file's pages are the CPU store's page bytes, and the CUDA store holds the same bytes
// (ORA.cuda.store), so a file moves between the backends as a byte copy: compatibility is checked
// against host stores of this engine's config, the matched prefix is restored into them by the CPU
// restore writer, and their pages are copied to the device. With the layer split every stage has its
// own host store of its layers (KvStageTarget, as the CPU engine's stages): the file is layer-major,
// so the same file restores split or unsplit. With tensor parallelism the file is restored into one
// unsplit host store and each rank takes its KV heads' slices of its pages (scatter_rank_pages); a
// --tp save gathers the ranks' pages into one (gather_rank_pages): files move between unsplit, --tp N
// and the CPU engine's --tp N both ways (PAR.cuda.tp.persist).
int CudaEngine::hydrate(const KvFile& file, std::span<const int> prompt) {
  Impl& d = *impl_;
  if (d.opts.damage)
    throw EngineError("cuda engine: a KV file cannot be hydrated into an engine with KV damage (diagnostics): the damage "
                      "is applied to rows as they are written, and a hydrated prefix would carry none");
  d.refuse_files_with_tp("hydrating");
  const std::string& fp = d.model.fingerprint;
  const int most = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(std::max(0, file.header.used_tokens)),
                                                          prompt.size()));
  // With --tp the file (the unsplit layout) is checked against, and restored into, one unsplit host
  // store first, before any rank is touched; each rank's host store or mirror then takes its heads'
  // slices of it (scatter_rank_pages). Unsplit or per stage, the file restores into the stages' own.
  const std::unique_ptr<PagedKvStore> full = d.tp ? d.staging(d.sc, most) : nullptr;
  SeqId fseq = 0;
  auto check = [&](std::span<const KvStageView> stage_views) {  // refuse before touching the sequence
    if (!full) return check_kv_file_compatible(file, stage_views, fp);
    const KvStageView one[1] = {{full.get(), 0}};
    check_kv_file_compatible(file, one, fp);
  };
  auto prefix = [&] {  // the tokens to restore; with --tp, restored into the unsplit store now
    const int n = hydratable_prefix(file, prompt);
    if (n > d.max_ctx) throw EngineError("cuda engine: the KV file holds more tokens than the context");
    if (full) {
      fseq = full->create_sequence();
      const KvStageTarget one[1] = {{full.get(), fseq}};
      restore_kv_file(file, one, n, fp);
    }
    return n;
  };
  auto restore = [&](std::span<const KvStageTarget> targets, int n) {
    if (full) scatter_rank_pages(*full, fseq, n, d.model.config, targets);
    else restore_kv_file(file, targets, n, fp);
  };
  int n = 0;
  if (d.streaming()) {
    // Streaming: every stage's host mirror is a PagedKvStore; restore into them as the CPU engine does
    // (the restore writer writes each mirror; their blocks are fresh, so no device copy exists yet and
    // the first lookups of each stage's window load them).
    check(d.mirror_views());
    n = prefix();
    reset();
    const auto t0 = Clock::now();
    restore(d.mirror_targets(), n);
    // The views' tables are set by stream_in before any kernel reads them; until then they only carry the length.
    for (KvStage& st : d.stages)
      st.store->set_sequence(d.seq, std::vector<int>(static_cast<std::size_t>(pages_for(n, d.sc.block_size)), 0), n);
    d.stats.hydrate_ms = seconds_since(t0) * 1e3;
  } else {
    std::vector<std::unique_ptr<PagedKvStore>> hosts;  // per stage (rank): a staging store of its layers (heads)
    std::vector<KvStageView> views;
    for (const KvStage& st : d.stages) {
      hosts.push_back(d.staging(st.store->config(), most));
      views.push_back({hosts.back().get(), 0});
    }
    check(views);
    n = prefix();
    reset();
    const auto t0 = Clock::now();
    std::vector<KvStageTarget> targets;
    for (auto& h : hosts) targets.push_back({h.get(), h->create_sequence()});
    restore(targets, n);
    const int pages = pages_for(n, d.sc.block_size);  // the last page may be partial: its other slots are zero in both
    for (std::size_t i = 0; i < d.stages.size(); ++i) {
      KvStage& st = d.stages[i];
      const PagedKvStore& host = *hosts[i];
      DeviceScope on(st.device);
      st.store->extend(d.seq, n);
      // Stream ordering: reset() zeroed the freed device pages with cudaMemset (legacy stream) and
      // earlier calls queued kernels on the stage's forward stream: wait for the device before the
      // uploads, queue them on the forward's stream (later forward calls run after them), and wait for
      // that stream before the staging pages (pageable host memory) go out of scope.
      KVGATE_CUDA_CHECK(cudaDeviceSynchronize());
      const auto src = host.block_table(targets[i].seq);
      const auto dst = st.store->block_table(d.seq);
      if (static_cast<int>(src.size()) < pages || static_cast<int>(dst.size()) < pages)
        throw EngineError("cuda engine: hydrate: " + std::string(d.tp ? "rank " : "stage ") + std::to_string(i) +
                          " holds " + std::to_string(src.size()) + " restored pages of the " + std::to_string(pages) +
                          " the file's " + std::to_string(n) + " tokens need (the restore skipped it)");
      for (int l = 0; l < host.config().n_layers; ++l)  // the stage's layers, at its own slots
        for (KvHalf h : {KvHalf::K, KvHalf::V})
          for (int p = 0; p < pages; ++p)
            st.store->upload_page(l, h, dst[static_cast<std::size_t>(p)],
                                  host.host_page(l, h, src[static_cast<std::size_t>(p)]), st.fwd->stream());
      KVGATE_CUDA_CHECK(cudaStreamSynchronize(st.fwd->stream()));
    }
    d.stats.hydrate_ms = seconds_since(t0) * 1e3;
  }
  d.history.assign(prompt.begin(), prompt.begin() + n);
  d.stats.hydrated_tokens = n;
  d.refresh();
  return n;
}

void CudaEngine::save_kv(const std::string& path, std::span<const int> pending) const {
  Impl& d = *impl_;
  d.refuse_files_with_tp("saving");
  std::vector<int> transcript(d.history);
  transcript.insert(transcript.end(), pending.begin(), pending.end());
  const int n = d.store.length(d.seq);
  const std::string& fp = d.model.fingerprint;
  if (d.store.released_tokens(d.seq) > 0)  // every stage releases alike
    throw KvStoreError("cuda engine: save of the KV cache: the pages of the sequence's first " +
                       std::to_string(d.store.released_tokens(d.seq)) +
                       " tokens were released (outside every layer's sliding window); run without the release "
                       "(EngineOptions::release_outside_window = false; a --conv-id run keeps them) to save it");
  // Every stage's (rank's) pages as host stores: streaming, its mirror (it holds every page of its
  // layers: stream_out after every call); resident, its device pages' used runs downloaded into a host
  // store of the stage's config (the CPU import writer lays them out). Stream ordering: the store
  // kernels of every forward call ran on the stage's forward stream; the downloads are queued on it
  // after them, and the host waits for the stream before the encoder reads the staging pages.
  std::vector<std::unique_ptr<PagedKvStore>> hosts;
  std::vector<KvStageView> views;
  if (d.streaming()) {
    views = d.mirror_views();
  } else {
    for (std::size_t i = 0; i < d.stages.size(); ++i) {
      const KvStage& st = d.stages[i];
      const CudaKvStore& ds = *d.stages[i].store;
      DeviceScope on(st.device);
      hosts.push_back(d.staging(ds.config(), n));
      PagedKvStore& host = *hosts.back();
      const SeqId hs = host.create_sequence();
      const auto dev = ds.block_table(d.seq);
      host.import_pages(hs, n, [&](const PagedKvStore::PageRef& p, std::uint8_t* page) {
        ds.download_runs(p.layer, p.half, dev[static_cast<std::size_t>(p.page)], p.runs, page, st.fwd->stream());
      });
      KVGATE_CUDA_CHECK(cudaStreamSynchronize(st.fwd->stream()));
      views.push_back({&host, hs});
    }
  }
  // The CPU encoder writes the stages' stores as one layer-major file, the file of the unsplit store;
  // with --tp the ranks' pages are first gathered into one unsplit store (gather_rank_pages).
  if (!d.tp) return save_kv_file(path, views, n, transcript, fp);
  const std::unique_ptr<PagedKvStore> full = d.staging(d.sc, n);
  const SeqId fseq = full->create_sequence();
  gather_rank_pages(views, d.model.config, *full, fseq, n);
  const KvStageView one[1] = {{full.get(), fseq}};
  save_kv_file(path, one, n, transcript, fp);
}

std::string CudaEngine::check_stream_coherent() const {
  std::string out;
  const Impl& d = *impl_;
  for (std::size_t i = 0; i < d.windows.size(); ++i) {
    DeviceScope on(d.windows[i]->device);
    const std::string e = d.windows[i]->streamed.host->check_stream_coherent();
    if (!e.empty())
      out += (out.empty() ? "" : "; ") +
             (d.windows.size() > 1 ? (d.tp ? "rank " : "stage ") + std::to_string(i) + ": " : "") + e;
  }
  return out;
}
const PagedKvStore* CudaEngine::host_mirror() const { return stage_host_mirror(0); }
const PagedKvStore* CudaEngine::stage_host_mirror(int i) const {
  const Impl& d = *impl_;
  if (d.windows.empty()) return nullptr;
  return d.windows.at(static_cast<std::size_t>(i))->streamed.host.get();
}
int CudaEngine::n_stages() const { return static_cast<int>(impl_->stages.size()); }
CudaKvStore& CudaEngine::stage_store(int i) { return *impl_->stages.at(static_cast<std::size_t>(i)).store; }
int CudaEngine::stage_device(int i) const { return impl_->stages.at(static_cast<std::size_t>(i)).device; }

int CudaEngine::position() const { return impl_->store.length(impl_->seq); }
int CudaEngine::max_context() const { return impl_->max_ctx; }
int CudaEngine::vocab_size() const { return static_cast<int>(impl_->logits.size()); }
const EngineStats& CudaEngine::stats() const {
  impl_->refresh();
  return impl_->stats;
}
const Model& CudaEngine::model() const { return impl_->model; }
CudaKvStore& CudaEngine::store() { return impl_->store; }
CudaForward& CudaEngine::forward() { return impl_->fwd; }
SeqId CudaEngine::sequence() const { return impl_->seq; }

}  // namespace kvgate::cuda
