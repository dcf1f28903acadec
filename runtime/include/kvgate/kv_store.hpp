// Paged KV store: per layer, a pool of pages (block_size tokens x KV heads x head_dim) for K and
// one for V in their half formats, each page with its scale region (docs/FORMATS.md); block
// tables per sequence; append/write, dequantized read, truncate, swap out/in, byte accounting.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvgate/format.hpp"
#include "kvgate/kv_stream.hpp"

namespace kvgate {

class KvStoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class KvHalf : std::uint8_t { K = 0, V = 1 };
enum class Residency : std::uint8_t { resident, swapped };

// What a token's rows hold.
//   kv_heads    K and V of n_kv_heads heads of head_dim each (every model; MLA "expanded").
//   mla_latent  multi-head latent attention's cache (DeepSeek-V2/V3): one row per token and layer,
//               split in two halves that each take their own half format: the K half holds the
//               latent c_kv (kv_lora_rank = head_dim elements), the V half the shared RoPE key
//               k_rope (qk_rope_head_dim = v_head_dim elements); n_kv_heads is 1. Attention reads
//               it in the weight-absorbed form (attention_mla.hpp), never through attention();
//               KV files (version 5) record it; a streaming window sizes each half's page.
enum class KvLayout : std::uint8_t { kv_heads, mla_latent };
const char* name(KvLayout l);

struct StoreConfig {
  KvFormat format;
  int n_layers = 1;
  int n_kv_heads = 1;
  int head_dim = 64;
  int block_size = 16;
  int n_blocks = 64;             // pool capacity per layer (pages of K, and as many of V)
  // FP32 scales of the fp8 halves (nvfp4: its global scale): [n_layers] per tensor (every KV head of
  // a layer takes the layer's), or [n_layers * n_kv_heads] per KV head, layer-major (l * H + h);
  // empty = 1.0 everywhere. The store keeps them as [n_layers * n_kv_heads] (normalize_kv_scales).
  std::vector<float> k_scale;
  std::vector<float> v_scale;
  std::size_t guard_bytes = 64;  // canary bytes before and after every page
  // The model layer this store's layer 0 is (a pipeline stage holds layers [first_layer,
  // first_layer + n_layers) of the model, EngineOptions::pipeline_stages); 0 for a whole model.
  // Layer arguments of the store are its own (0-based); the read hook is handed the model's layer.
  int first_layer = 0;
  KvLayout layout = KvLayout::kv_heads;
  // Row width of the V half when it differs from K's (the mla_latent layout's RoPE key); 0: head_dim.
  int v_head_dim = 0;
  // The K half's geometry (and V's when v_head_dim is 0): what every kv_heads reader uses.
  PageGeometry geometry() const { return {block_size, n_kv_heads, head_dim}; }
  PageGeometry half_geometry(KvHalf h) const {
    return {block_size, n_kv_heads, h == KvHalf::V && v_head_dim > 0 ? v_head_dim : head_dim};
  }
};

// Expands StoreConfig::k_scale/v_scale to [n_layers * n_kv_heads] (empty: 1.0; [n_layers]: each
// layer's scale on every head) and refuses another length or a scale that is not finite and > 0
// (KvStoreError, prefixed with `who`).
void normalize_kv_scales(StoreConfig& c, const std::string& who);
// Per-layer scale lists (each one number, or n_kv_heads numbers) as StoreConfig::k_scale/v_scale:
// [n_layers] when every list is one number, else [n_layers * n_kv_heads] with a one-number layer's
// scale on each of its heads.
std::vector<float> flatten_kv_scales(const std::vector<std::vector<float>>& per_layer, int n_kv_heads);
// True when every entry has the bits of the first.
bool uniform_heads(std::span<const float> s);
// On a config whose scales are expanded (normalize_kv_scales), what every store reads: the scale of
// each KV head of (layer, half) (n_kv_heads entries); whether some (layer, half) has heads that
// differ; the one scale of (layer, half) for per-tensor readers (KvStoreError prefixed with `who`
// when its heads differ). PagedKvStore and the CUDA store answer through these.
std::span<const float> head_scales_of(const StoreConfig& c, int layer, KvHalf h);
bool per_head_scales_of(const StoreConfig& c);
float tensor_scale_of(const StoreConfig& c, int layer, KvHalf h, const std::string& who);

// Blocks a memory budget buys: budget / (n_layers * (K page + V page)).
int blocks_for_budget(const KvFormat& f, const PageGeometry& g, int n_layers, std::size_t budget_bytes);
// The same for a store whose halves may differ in width (StoreConfig::half_geometry).
int blocks_for_budget(const StoreConfig& c, std::size_t budget_bytes);

using SeqId = int;

// A diagnostic hook on the store read (off unless a caller sets one): attention hands it the
// dequantized rows of every page it reads, [n][n_kv_heads * head_dim] for positions [pos0, pos0+n)
// of `layer`, before they are used, and it may change them. The probes' damage injection
// (kvgate::matrix sensitivity) uses it to prove a probe can go red; nothing in a release path sets
// one. When none is set the read path is unchanged (one null check per page).
class KvReadHook {
 public:
  virtual ~KvReadHook() = default;
  virtual void on_read(int layer, KvHalf h, int pos0, int n, int row_elems, float* rows) const = 0;
};

// A diagnostic count of the read path (off unless a caller sets one): every lookup of a page for
// reading (page() const, what attention reads) adds one page and that page's bytes to its half.
// The bytes-moved gates compare it with the pages a decode step needs; nothing in a release path
// sets one (one null check per lookup when none is set). Relaxed atomics: prefill attention reads
// from several threads.
struct KvReadCounter {
  std::atomic<std::uint64_t> pages[2] = {0, 0};  // [KvHalf]
  std::atomic<std::uint64_t> bytes[2] = {0, 0};
  void reset() {
    for (int h = 0; h < 2; ++h) pages[h] = 0, bytes[h] = 0;
  }
};

// Byte storage of the host page pools: page-aligned and padded to whole OS pages. The CUDA backend
// page-locks a streamed store's pools in place (cudaHostRegister pins whole pages); a pool that
// shared a page with other heap objects would make their owners' pageable copies asynchronous
// behind their back (a freed vector read later by DMA).
struct HostPageAlloc {
  using value_type = std::uint8_t;
  template <class U>
  struct rebind {
    using other = HostPageAlloc;  // bytes only
  };
  HostPageAlloc() = default;
  static std::size_t page_size();
  static std::uint8_t* allocate(std::size_t n);
  static void deallocate(std::uint8_t* p, std::size_t n) noexcept;
  friend bool operator==(const HostPageAlloc&, const HostPageAlloc&) { return true; }
};

class PagedKvStore {
 public:
  explicit PagedKvStore(StoreConfig cfg);  // throws KvStoreError on an unsupported format/geometry
  // Copies hold the same pages and sequences; a streamed store's copy starts with a cold window.
  PagedKvStore(const PagedKvStore& o);
  PagedKvStore& operator=(const PagedKvStore& o);
  PagedKvStore(PagedKvStore&&) noexcept = default;
  PagedKvStore& operator=(PagedKvStore&&) noexcept = default;
  ~PagedKvStore();

  const StoreConfig& config() const { return cfg_; }
  const KvFormat& format() const { return cfg_.format; }
  PageGeometry geometry() const { return cfg_.geometry(); }
  PageGeometry half_geometry(KvHalf h) const { return cfg_.half_geometry(h); }
  KvLayout layout() const { return cfg_.layout; }
  HalfFormat half_format(KvHalf h) const { return h == KvHalf::K ? cfg_.format.k : cfg_.format.v; }
  // The scale of each KV head of (layer, half): n_kv_heads entries (what every reader uses).
  std::span<const float> head_scales(int layer, KvHalf h) const;
  // True when some (layer, half) has scales that differ across KV heads.
  bool per_head_scales() const;
  // The one scale of (layer, half) for per-tensor readers; throws KvStoreError when its heads differ.
  float tensor_scale(int layer, KvHalf h) const;

  // --- sequences -------------------------------------------------------------------------
  SeqId create_sequence();
  void free_sequence(SeqId s);  // refused (KvStoreError) while the sequence is swapped out
  int length(SeqId s) const;
  Residency residency(SeqId s) const;
  // Grow the sequence by n tokens, allocating pages; returns the first new position.
  int extend(SeqId s, int n);
  // Quantize rows for positions [pos0, pos0+n) of one layer into their slots. Row t of K is at
  // k + t*k_stride (floats), likewise V; each row holds n_kv_heads*head_dim floats.
  void write(SeqId s, int layer, int pos0, int n, const float* k, std::size_t k_stride, const float* v,
             std::size_t v_stride);
  // Dequantized read of positions [pos0, pos0+n): out[n][n_kv_heads][head_dim].
  void read(SeqId s, int layer, KvHalf h, int pos0, int n, float* out) const;
  // Drop tokens >= new_len: frees whole pages and clears the codes and scales of the cut slots.
  // Refused below the released prefix (release_before).
  void truncate(SeqId s, int new_len);
  // Sliding-window release: gives back to the pool every whole page of the sequence whose positions
  // all lie before `first_kept_pos` (pages p with (p + 1) * block_size <= first_kept_pos, never the
  // page being filled). Their block-table entries become kReleasedBlock; reading, exporting or
  // swapping those tokens is refused afterwards. Returns the pages released by this call.
  int release_before(SeqId s, int first_kept_pos);
  // Tokens [0, released_tokens) of the sequence have had their pages released.
  int released_tokens(SeqId s) const;
  static constexpr int kReleasedBlock = -1;
  // Move every page of the sequence to host memory and free its blocks.
  void swap_out(SeqId s);
  // Bring it back; transactional: when blocks are short, nothing changes and KvStoreError is thrown.
  void swap_in(SeqId s);

  // --- raw pages (what kernels, oracles and persistence consume) ---------------------------
  std::span<const int> block_table(SeqId s) const;
  // What attention reads. When streaming, the device copy from the resident window (a miss loads
  // the block from the host mirror); the pointer stays valid until a lookup of another block of
  // the same layer. Otherwise the page itself.
  const std::uint8_t* page(int layer, KvHalf h, int block) const;
  // The page (host mirror when streaming) for raw writes; when streaming, its device copy is
  // dropped, so the next read reloads what was written here.
  std::uint8_t* page(int layer, KvHalf h, int block);
  // The page itself (the host mirror when streaming); never touches the window.
  const std::uint8_t* host_page(int layer, KvHalf h, int block) const;
  // All host memory of one (layer, half) pool (pages and guards): starts on an OS page boundary and
  // its allocation is a whole number of pages, owned by this store alone (what may be page-locked).
  std::span<const std::uint8_t> host_pool(int layer, KvHalf h) const;
  std::size_t page_bytes(KvHalf h) const;

  // --- diagnostics ------------------------------------------------------------------------------
  // Sets (null: clears) the read hook attention applies to every page it reads (KvReadHook).
  void set_read_hook(std::shared_ptr<const KvReadHook> h) { read_hook_ = std::move(h); }
  const KvReadHook* read_hook() const { return read_hook_.get(); }
  // Sets (null: clears) the counter of page lookups for reading (KvReadCounter).
  void set_read_counter(std::shared_ptr<KvReadCounter> c) { read_counter_ = std::move(c); }

  // --- streaming (kv_stream.hpp) ---------------------------------------------------------------
  // resident_tokens > 0: a window of that many tokens' blocks per layer lives in a device pool
  // (`device`, or a simulated one in host memory) and the pages above become the host mirror that
  // holds every block; every writer writes both copies. 0 turns streaming off. The window starts
  // empty (cold); counters start at zero.
  void set_streaming(int resident_tokens, std::unique_ptr<KvDevicePool> device = nullptr);
  bool streaming() const { return window_ != nullptr; }
  const KvWindow* window() const { return window_.get(); }
  StreamCounters stream_counters() const;  // zeros when not streaming
  // Empty when every resident device copy equals its host mirror page (or when not streaming).
  std::string check_stream_coherent() const;

  // --- export / import of a sequence's pages as byte runs (persistence) -----------------------
  // Page runs cut to their first `used_slots` slots (every run is token-major: [block_size][...]).
  std::vector<ByteRun> used_runs(KvHalf h, int used_slots) const;
  struct PageRef {
    int layer = 0;
    KvHalf half = KvHalf::K;
    int page = 0;         // index in the sequence's block table
    int first_token = 0;  // page * block_size
    int slots = 0;        // used slots of this page
    std::span<const ByteRun> runs;  // used_runs(half, slots)
  };
  // Visits the pages holding tokens [0, n_tokens) of the sequence, in order layer, K then V, page,
  // with the host copy of each page.
  void export_pages(SeqId s, int n_tokens, const std::function<void(const PageRef&, const std::uint8_t* page)>& sink) const;
  // The restore writer: appends n_tokens to an empty resident sequence; `fill` writes the used runs
  // of each page (same order as export_pages). Host mirror and device copies are both written.
  void import_pages(SeqId s, int n_tokens, const std::function<void(const PageRef&, std::uint8_t* page)>& fill);

  // --- accounting --------------------------------------------------------------------------
  std::size_t pool_bytes() const;                  // every page of every layer, K and V (no guards)
  std::size_t sequence_bytes(SeqId s) const;       // pages held by the sequence
  int free_blocks() const { return static_cast<int>(free_list_.size()); }
  int total_blocks() const { return cfg_.n_blocks; }
  // Empty when every guard region is intact; otherwise names the first corrupted page.
  std::string check_guards() const;

 private:
  struct Sequence {
    int length = 0;
    std::vector<int> blocks;
    int released = 0;  // leading block-table entries given back by release_before (kReleasedBlock)
    Residency residency = Residency::resident;
    std::vector<std::uint8_t> host;  // swapped-out pages: [n_blocks][n_layers][K,V] pages
  };
  Sequence& seq(SeqId s);
  const Sequence& seq(SeqId s) const;
  std::size_t stride(KvHalf h) const { return page_bytes_[static_cast<int>(h)] + 2 * cfg_.guard_bytes; }
  std::uint8_t* pool_page(int layer, KvHalf h, int block);
  const std::uint8_t* pool_page(int layer, KvHalf h, int block) const;
  int alloc_block();
  void release_block(int b);
  void clear_slots(int block, int slot0);
  void push_runs(int layer, KvHalf h, int block, std::span<const ByteRun> runs);  // host -> device copy

  StoreConfig cfg_;
  std::size_t page_bytes_[2]{};
  std::vector<std::vector<std::uint8_t, HostPageAlloc>> pools_;  // [layer*2 + half] -> n_blocks * stride
  std::vector<int> free_list_;
  std::map<SeqId, Sequence> seqs_;
  SeqId next_id_ = 0;
  std::shared_ptr<const KvReadHook> read_hook_;  // diagnostics only; null in every release path
  std::shared_ptr<KvReadCounter> read_counter_;   // diagnostics only; null in every release path
  mutable std::unique_ptr<KvWindow> window_;  // streaming: the device window (lookups update its LRU)
};

inline constexpr std::uint8_t kGuardByte = 0xA5;

}  // namespace kvgate
