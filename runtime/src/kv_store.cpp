#include "kvgate/kv_store.hpp"
#include "kvgate/window_release.hpp"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

namespace kvgate {

std::size_t HostPageAlloc::page_size() {
  static const std::size_t p = [] {
    const long v = sysconf(_SC_PAGESIZE);
    return v > 0 ? static_cast<std::size_t>(v) : std::size_t{4096};
  }();
  return p;
}

std::uint8_t* HostPageAlloc::allocate(std::size_t n) {
  const std::size_t pg = page_size();
  const std::size_t bytes = std::max<std::size_t>(pg, (n + pg - 1) / pg * pg);
  void* p = std::aligned_alloc(pg, bytes);
  if (!p) throw std::bad_alloc();
  return static_cast<std::uint8_t*>(p);
}

void HostPageAlloc::deallocate(std::uint8_t* p, std::size_t) noexcept { std::free(p); }

std::span<const std::uint8_t> PagedKvStore::host_pool(int layer, KvHalf h) const {
  const auto& v = pools_[static_cast<std::size_t>(layer) * 2 + static_cast<int>(h)];
  return {v.data(), v.size()};
}

int blocks_for_budget(const KvFormat& f, const PageGeometry& g, int n_layers, std::size_t budget_bytes) {
  const std::size_t per_block = static_cast<std::size_t>(n_layers) * (page_bytes(f.k, g) + page_bytes(f.v, g));
  return per_block == 0 ? 0 : static_cast<int>(budget_bytes / per_block);
}

int blocks_for_budget(const StoreConfig& c, std::size_t budget_bytes) {
  const std::size_t per_block = static_cast<std::size_t>(c.n_layers) * (page_bytes(c.format.k, c.half_geometry(KvHalf::K)) +
                                                                        page_bytes(c.format.v, c.half_geometry(KvHalf::V)));
  return per_block == 0 ? 0 : static_cast<int>(budget_bytes / per_block);
}

const char* name(KvLayout l) { return l == KvLayout::mla_latent ? "mla_latent" : "kv_heads"; }

PagedKvStore::PagedKvStore(StoreConfig cfg) : cfg_(std::move(cfg)) {
  if (cfg_.v_head_dim < 0) throw KvStoreError("kv store: v_head_dim must be >= 0 (0: head_dim)");
  if (cfg_.layout == KvLayout::mla_latent && (cfg_.n_kv_heads != 1 || cfg_.v_head_dim < 1))
    throw KvStoreError("kv store: the mla_latent layout holds one row per token (n_kv_heads 1, got " +
                       std::to_string(cfg_.n_kv_heads) + ") with the latent as K (head_dim) and the RoPE key as V "
                       "(v_head_dim >= 1, got " + std::to_string(cfg_.v_head_dim) + ")");
  for (KvHalf h : {KvHalf::K, KvHalf::V}) {
    const Capability c = supports(half_format(h), half_geometry(h));
    if (!c.ok)
      throw KvStoreError("kv store: " + std::string(h == KvHalf::K ? "K" : "V") + " half format '" +
                         std::string(name(half_format(h))) + "' is not supported here (" + c.reason + "): " + c.detail);
  }
  if (cfg_.n_layers < 1 || cfg_.n_blocks < 0) throw KvStoreError("kv store: n_layers must be >= 1 and n_blocks >= 0");
  normalize_kv_scales(cfg_, "kv store");
  for (KvHalf h : {KvHalf::K, KvHalf::V})
    if (half_format(h) == HalfFormat::nvfp4)
      for (int l = 0; l < cfg_.n_layers; ++l)
        if (!uniform_heads(head_scales(l, h)))
          throw KvStoreError(std::string("kv store: the ") + (h == KvHalf::K ? "K" : "V") +
                             " half is nvfp4, whose FP32 global scale is one per (layer, K|V), but layer " +
                             std::to_string(l) + "'s " + (h == KvHalf::K ? "k_scale" : "v_scale") +
                             " differs per KV head: per-head scales apply to fp8_e4m3/fp8_e5m2 halves only; give one "
                             "scale per layer for it");
  page_bytes_[0] = kvgate::page_bytes(cfg_.format.k, half_geometry(KvHalf::K));
  page_bytes_[1] = kvgate::page_bytes(cfg_.format.v, half_geometry(KvHalf::V));
  pools_.resize(static_cast<std::size_t>(cfg_.n_layers) * 2);
  for (int l = 0; l < cfg_.n_layers; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V})
      pools_[static_cast<std::size_t>(l) * 2 + static_cast<int>(h)].assign(
          static_cast<std::size_t>(cfg_.n_blocks) * stride(h), kGuardByte);
  for (int b = 0; b < cfg_.n_blocks; ++b)
    for (int l = 0; l < cfg_.n_layers; ++l)
      for (KvHalf h : {KvHalf::K, KvHalf::V}) std::memset(pool_page(l, h, b), 0, page_bytes_[static_cast<int>(h)]);
  free_list_.reserve(static_cast<std::size_t>(cfg_.n_blocks));
  for (int b = cfg_.n_blocks - 1; b >= 0; --b) free_list_.push_back(b);  // pop_back hands out 0, 1, 2, ...
}

PagedKvStore::PagedKvStore(const PagedKvStore& o)
    : cfg_(o.cfg_), pools_(o.pools_), free_list_(o.free_list_), seqs_(o.seqs_), next_id_(o.next_id_) {
  page_bytes_[0] = o.page_bytes_[0];
  page_bytes_[1] = o.page_bytes_[1];
  if (o.window_) set_streaming(o.window_->window_tokens());
}

PagedKvStore& PagedKvStore::operator=(const PagedKvStore& o) {
  if (this != &o) *this = PagedKvStore(o);
  return *this;
}

PagedKvStore::~PagedKvStore() = default;

bool uniform_heads(std::span<const float> s) {
  for (float x : s)
    if (std::bit_cast<std::uint32_t>(x) != std::bit_cast<std::uint32_t>(s[0])) return false;
  return true;
}

void normalize_kv_scales(StoreConfig& c, const std::string& who) {
  const std::size_t L = static_cast<std::size_t>(c.n_layers), H = static_cast<std::size_t>(std::max(c.n_kv_heads, 1));
  for (auto* sc : {&c.k_scale, &c.v_scale}) {
    const char* field = sc == &c.k_scale ? "k_scale" : "v_scale";
    if (sc->empty()) sc->assign(L, 1.0f);
    if (sc->size() == L && H > 1) {  // per tensor: every head of a layer holds the layer's scale
      std::vector<float> full;
      full.reserve(L * H);
      for (float x : *sc) full.insert(full.end(), H, x);
      *sc = std::move(full);
    }
    if (sc->size() != L * H)
      throw KvStoreError(who + ": k_scale/v_scale must have one entry per layer (" + std::to_string(L) +
                         ") or one per layer and KV head (" + std::to_string(L) + " x " + std::to_string(H) + " = " +
                         std::to_string(L * H) + "), got " + std::to_string(sc->size()) + " for " + field);
    for (std::size_t i = 0; i < sc->size(); ++i)
      if (!((*sc)[i] > 0.0f) || !std::isfinite((*sc)[i]))
        throw KvStoreError(who + ": KV scales must be finite and > 0, got " + std::to_string((*sc)[i]) + " for " + field +
                           " of layer " + std::to_string(i / H) + " KV head " + std::to_string(i % H));
  }
}

std::vector<float> flatten_kv_scales(const std::vector<std::vector<float>>& per_layer, int n_kv_heads) {
  bool any_head = false;
  for (const auto& v : per_layer) any_head = any_head || v.size() > 1;
  std::vector<float> out;
  for (const auto& v : per_layer)
    if (any_head && v.size() == 1) out.insert(out.end(), static_cast<std::size_t>(n_kv_heads), v[0]);
    else out.insert(out.end(), v.begin(), v.end());
  return out;
}

std::span<const float> head_scales_of(const StoreConfig& c, int layer, KvHalf h) {
  const std::vector<float>& v = h == KvHalf::K ? c.k_scale : c.v_scale;
  const std::size_t H = static_cast<std::size_t>(c.n_kv_heads);
  return {v.data() + static_cast<std::size_t>(layer) * H, H};
}

bool per_head_scales_of(const StoreConfig& c) {
  for (int l = 0; l < c.n_layers; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V})
      if (!uniform_heads(head_scales_of(c, l, h))) return true;
  return false;
}

float tensor_scale_of(const StoreConfig& c, int layer, KvHalf h, const std::string& who) {
  const std::span<const float> s = head_scales_of(c, layer, h);
  if (!uniform_heads(s))
    throw KvStoreError(who + ": layer " + std::to_string(layer) + "'s " + (h == KvHalf::K ? "K" : "V") +
                       " scale differs per KV head; a per-tensor reader cannot use it (read head_scales())");
  return s[0];
}

std::span<const float> PagedKvStore::head_scales(int layer, KvHalf h) const { return head_scales_of(cfg_, layer, h); }
bool PagedKvStore::per_head_scales() const { return per_head_scales_of(cfg_); }
float PagedKvStore::tensor_scale(int layer, KvHalf h) const { return tensor_scale_of(cfg_, layer, h, "kv store"); }

PagedKvStore::Sequence& PagedKvStore::seq(SeqId s) {
  auto it = seqs_.find(s);
  if (it == seqs_.end()) throw KvStoreError("kv store: unknown sequence id " + std::to_string(s));
  return it->second;
}
const PagedKvStore::Sequence& PagedKvStore::seq(SeqId s) const { return const_cast<PagedKvStore*>(this)->seq(s); }

SeqId PagedKvStore::create_sequence() {
  seqs_[next_id_] = Sequence{};
  return next_id_++;
}

void PagedKvStore::free_sequence(SeqId s) {
  Sequence& q = seq(s);
  if (q.residency == Residency::swapped)
    throw KvStoreError("kv store: sequence " + std::to_string(s) +
                       " is swapped out; swap it in (or discard its host copy) before freeing it");
  for (int b : q.blocks)
    if (b != kReleasedBlock) release_block(b);
  seqs_.erase(s);
}

int PagedKvStore::length(SeqId s) const { return seq(s).length; }
Residency PagedKvStore::residency(SeqId s) const { return seq(s).residency; }
std::span<const int> PagedKvStore::block_table(SeqId s) const { return seq(s).blocks; }
int PagedKvStore::released_tokens(SeqId s) const { return seq(s).released * cfg_.block_size; }

int PagedKvStore::release_before(SeqId s, int first_kept_pos) {
  Sequence& q = seq(s);
  if (q.residency != Residency::resident)
    throw KvStoreError("kv store: release of pages of swapped-out sequence " + std::to_string(s));
  return release_table_prefix(q.blocks, q.released, q.length, cfg_.block_size, first_kept_pos,
                              [this](int b) { release_block(b); });
}

namespace {
[[noreturn]] void released_refusal(const std::string& what, SeqId s, int tokens) {
  throw KvStoreError("kv store: " + what + " of sequence " + std::to_string(s) + ": the pages of its first " +
                     std::to_string(tokens) + " tokens were released (outside every layer's sliding window); run "
                     "without the release (EngineOptions::release_outside_window = false) to keep them");
}
}  // namespace

int PagedKvStore::alloc_block() {
  if (free_list_.empty()) return -1;
  const int b = free_list_.back();
  free_list_.pop_back();
  return b;
}

void PagedKvStore::release_block(int b) {
  for (int l = 0; l < cfg_.n_layers; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V}) std::memset(pool_page(l, h, b), 0, page_bytes_[static_cast<int>(h)]);
  if (window_) window_->invalidate(b);  // a freed block has no device copy
  free_list_.push_back(b);
}

int PagedKvStore::extend(SeqId s, int n) {
  Sequence& q = seq(s);
  if (q.residency != Residency::resident)
    throw KvStoreError("kv store: cannot extend sequence " + std::to_string(s) + " while it is swapped out");
  if (n < 0) throw KvStoreError("kv store: extend by a negative count");
  const int B = cfg_.block_size;
  const int need = (q.length + n + B - 1) / B;
  const int missing = need - static_cast<int>(q.blocks.size());
  if (missing > free_blocks())
    throw KvStoreError("kv store: out of KV blocks: sequence " + std::to_string(s) + " needs " + std::to_string(missing) +
                       " more, " + std::to_string(free_blocks()) + " free of " + std::to_string(cfg_.n_blocks) +
                       " (raise --kv-cache-memory or shorten the context)");
  for (int i = 0; i < missing; ++i) q.blocks.push_back(alloc_block());
  const int pos0 = q.length;
  q.length += n;
  return pos0;
}

std::uint8_t* PagedKvStore::pool_page(int layer, KvHalf h, int block) {
  return pools_[static_cast<std::size_t>(layer) * 2 + static_cast<int>(h)].data() +
         static_cast<std::size_t>(block) * stride(h) + cfg_.guard_bytes;
}
const std::uint8_t* PagedKvStore::pool_page(int layer, KvHalf h, int block) const {
  return const_cast<PagedKvStore*>(this)->pool_page(layer, h, block);
}

const std::uint8_t* PagedKvStore::page(int layer, KvHalf h, int block) const {
  if (block < 0)
    throw KvStoreError("kv store: read of a released page (block-table entry " + std::to_string(block) +
                       "): a page outside every layer's sliding window was given back to the pool");
  if (read_counter_) [[unlikely]] {
    read_counter_->pages[static_cast<int>(h)].fetch_add(1, std::memory_order_relaxed);
    read_counter_->bytes[static_cast<int>(h)].fetch_add(page_bytes_[static_cast<int>(h)], std::memory_order_relaxed);
  }
  if (!window_) return pool_page(layer, h, block);
  return window_->lookup(layer, static_cast<int>(h), block, [this](int l, int hh, int b) {
    return pool_page(l, static_cast<KvHalf>(hh), b);
  });
}
std::uint8_t* PagedKvStore::page(int layer, KvHalf h, int block) {
  if (window_) window_->invalidate(layer, block);  // the caller may write the host copy directly
  return pool_page(layer, h, block);
}
const std::uint8_t* PagedKvStore::host_page(int layer, KvHalf h, int block) const { return pool_page(layer, h, block); }

void PagedKvStore::push_runs(int layer, KvHalf h, int block, std::span<const ByteRun> runs) {
  if (window_) window_->write_through(layer, static_cast<int>(h), block, runs, pool_page(layer, h, block));
}

void PagedKvStore::set_streaming(int resident_tokens, std::unique_ptr<KvDevicePool> device) {
  if (resident_tokens < 0) throw KvStoreError("kv store: the resident window must be >= 0 tokens (0 = off)");
  if (resident_tokens == 0) {
    window_.reset();
    return;
  }
  window_ = std::make_unique<KvWindow>(cfg_.format, geometry(), cfg_.n_layers, cfg_.n_blocks, resident_tokens,
                                       std::move(device), half_geometry(KvHalf::V));
}

StreamCounters PagedKvStore::stream_counters() const { return window_ ? window_->counters() : StreamCounters{}; }

std::string PagedKvStore::check_stream_coherent() const {
  if (!window_) return {};
  return window_->check_coherent(
      [this](int l, int h, int b) { return pool_page(l, static_cast<KvHalf>(h), b); });
}
std::size_t PagedKvStore::page_bytes(KvHalf h) const { return page_bytes_[static_cast<int>(h)]; }

void PagedKvStore::write(SeqId s, int layer, int pos0, int n, const float* k, std::size_t k_stride, const float* v,
                         std::size_t v_stride) {
  const Sequence& q = seq(s);
  if (q.residency != Residency::resident)
    throw KvStoreError("kv store: write to swapped-out sequence " + std::to_string(s));
  if (layer < 0 || layer >= cfg_.n_layers || pos0 < 0 || pos0 + n > q.length)
    throw KvStoreError("kv store: write of positions [" + std::to_string(pos0) + ", " + std::to_string(pos0 + n) +
                       ") layer " + std::to_string(layer) + " is outside the sequence (length " +
                       std::to_string(q.length) + ", layers " + std::to_string(cfg_.n_layers) + ")");
  const PageGeometry g = half_geometry(KvHalf::K), gv = half_geometry(KvHalf::V);
  const int B = cfg_.block_size;
  for (int t = 0; t < n; ++t) {
    const int pos = pos0 + t;
    const int block = q.blocks[static_cast<std::size_t>(pos / B)];
    const int slot = pos % B;
    quantize_token(cfg_.format.k, g, slot, k + t * k_stride, head_scales(layer, KvHalf::K),
                   pool_page(layer, KvHalf::K, block));
    quantize_token(cfg_.format.v, gv, slot, v + t * v_stride, head_scales(layer, KvHalf::V),
                   pool_page(layer, KvHalf::V, block));
    if (window_) {  // streaming: the device copy gets the same token bytes (both copies written)
      push_runs(layer, KvHalf::K, block, token_ranges(cfg_.format.k, g, slot));
      push_runs(layer, KvHalf::V, block, token_ranges(cfg_.format.v, gv, slot));
    }
  }
}

void PagedKvStore::read(SeqId s, int layer, KvHalf h, int pos0, int n, float* out) const {
  const Sequence& q = seq(s);
  if (q.residency != Residency::resident)
    throw KvStoreError("kv store: read of swapped-out sequence " + std::to_string(s));
  if (layer < 0 || layer >= cfg_.n_layers || pos0 < 0 || pos0 + n > q.length)
    throw KvStoreError("kv store: read outside the sequence");
  if (pos0 < q.released * cfg_.block_size) released_refusal("read of position " + std::to_string(pos0), s, q.released * cfg_.block_size);
  const PageGeometry g = half_geometry(h);
  const int B = cfg_.block_size;
  const std::size_t HD = static_cast<std::size_t>(g.row_elems());
  for (int t = 0; t < n; ++t) {
    const int pos = pos0 + t;
    dequantize_token(half_format(h), g, pos % B, pool_page(layer, h, q.blocks[static_cast<std::size_t>(pos / B)]),
                     head_scales(layer, h), out + t * HD);
  }
}

void PagedKvStore::clear_slots(int block, int slot0) {
  for (int l = 0; l < cfg_.n_layers; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V})
      for (int slot = slot0; slot < cfg_.block_size; ++slot) {
        const PageGeometry g = half_geometry(h);
        for (const ByteRun& r : token_ranges(half_format(h), g, slot))
          std::memset(pool_page(l, h, block) + r.offset, 0, r.bytes);
        if (window_) push_runs(l, h, block, token_ranges(half_format(h), g, slot));  // the device copy too
      }
}

void PagedKvStore::truncate(SeqId s, int new_len) {
  Sequence& q = seq(s);
  if (q.residency != Residency::resident)
    throw KvStoreError("kv store: truncate of swapped-out sequence " + std::to_string(s));
  if (new_len < 0 || new_len > q.length)
    throw KvStoreError("kv store: truncate to " + std::to_string(new_len) + " outside [0, " +
                       std::to_string(q.length) + "]");
  const int B = cfg_.block_size;
  if (new_len < q.released * B) released_refusal("truncate to " + std::to_string(new_len), s, q.released * B);
  const std::size_t keep = static_cast<std::size_t>((new_len + B - 1) / B);
  while (q.blocks.size() > keep) {
    release_block(q.blocks.back());
    q.blocks.pop_back();
  }
  if (new_len % B != 0) clear_slots(q.blocks.back(), new_len % B);  // codes and scales of the cut slots
  q.length = new_len;
}

void PagedKvStore::swap_out(SeqId s) {
  Sequence& q = seq(s);
  if (q.residency == Residency::swapped) throw KvStoreError("kv store: sequence " + std::to_string(s) + " is already swapped out");
  if (q.released > 0) released_refusal("swap-out", s, q.released * cfg_.block_size);
  const std::size_t per_block = static_cast<std::size_t>(cfg_.n_layers) * (page_bytes_[0] + page_bytes_[1]);
  q.host.resize(q.blocks.size() * per_block);
  std::uint8_t* dst = q.host.data();
  for (int b : q.blocks)
    for (int l = 0; l < cfg_.n_layers; ++l)
      for (KvHalf h : {KvHalf::K, KvHalf::V}) {
        std::memcpy(dst, pool_page(l, h, b), page_bytes_[static_cast<int>(h)]);  // codes and scale region together
        dst += page_bytes_[static_cast<int>(h)];
      }
  for (int b : q.blocks) release_block(b);
  q.residency = Residency::swapped;
}

void PagedKvStore::swap_in(SeqId s) {
  Sequence& q = seq(s);
  if (q.residency == Residency::resident) throw KvStoreError("kv store: sequence " + std::to_string(s) + " is not swapped out");
  const std::size_t n = q.blocks.size();
  if (static_cast<int>(n) > free_blocks())
    throw KvStoreError("kv store: swap-in of sequence " + std::to_string(s) + " needs " + std::to_string(n) +
                       " blocks, " + std::to_string(free_blocks()) + " free; the sequence stays swapped out");
  std::vector<int> fresh(n);
  for (auto& b : fresh) b = alloc_block();
  const std::uint8_t* src = q.host.data();
  for (int b : fresh)
    for (int l = 0; l < cfg_.n_layers; ++l)
      for (KvHalf h : {KvHalf::K, KvHalf::V}) {
        std::memcpy(pool_page(l, h, b), src, page_bytes_[static_cast<int>(h)]);
        if (window_) push_runs(l, h, b, page_runs(half_format(h), half_geometry(h)));  // both copies (when resident)
        src += page_bytes_[static_cast<int>(h)];
      }
  q.blocks = std::move(fresh);
  q.host.clear();
  q.host.shrink_to_fit();
  q.residency = Residency::resident;
}

std::vector<ByteRun> PagedKvStore::used_runs(KvHalf h, int used_slots) const {
  std::vector<ByteRun> runs = page_runs(half_format(h), half_geometry(h));
  for (ByteRun& r : runs) r.bytes = r.bytes / static_cast<std::size_t>(cfg_.block_size) * static_cast<std::size_t>(used_slots);
  return runs;
}

void PagedKvStore::export_pages(SeqId s, int n_tokens,
                                const std::function<void(const PageRef&, const std::uint8_t*)>& sink) const {
  const Sequence& q = seq(s);
  if (q.residency != Residency::resident)
    throw KvStoreError("kv store: export of swapped-out sequence " + std::to_string(s));
  if (n_tokens < 0 || n_tokens > q.length)
    throw KvStoreError("kv store: export of " + std::to_string(n_tokens) + " tokens from a sequence of " +
                       std::to_string(q.length));
  const int B = cfg_.block_size;
  if (n_tokens > 0 && q.released > 0) released_refusal("export", s, q.released * B);
  const int n_pages = (n_tokens + B - 1) / B;
  for (int l = 0; l < cfg_.n_layers; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V})
      for (int p = 0; p < n_pages; ++p) {
        const int slots = std::min(B, n_tokens - p * B);
        const std::vector<ByteRun> runs = used_runs(h, slots);
        sink(PageRef{l, h, p, p * B, slots, runs}, pool_page(l, h, q.blocks[static_cast<std::size_t>(p)]));
      }
}

void PagedKvStore::import_pages(SeqId s, int n_tokens, const std::function<void(const PageRef&, std::uint8_t*)>& fill) {
  Sequence& q = seq(s);
  if (q.residency != Residency::resident || q.length != 0)
    throw KvStoreError("kv store: import needs an empty resident sequence (sequence " + std::to_string(s) + " holds " +
                       std::to_string(q.length) + " tokens)");
  if (n_tokens < 0) throw KvStoreError("kv store: import of a negative token count");
  extend(s, n_tokens);
  const int B = cfg_.block_size;
  const int n_pages = (n_tokens + B - 1) / B;
  for (int l = 0; l < cfg_.n_layers; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V})
      for (int p = 0; p < n_pages; ++p) {
        const int slots = std::min(B, n_tokens - p * B);
        const std::vector<ByteRun> runs = used_runs(h, slots);
        const int b = q.blocks[static_cast<std::size_t>(p)];
        fill(PageRef{l, h, p, p * B, slots, runs}, pool_page(l, h, b));
        push_runs(l, h, b, runs);  // the restore writer writes both copies
      }
}

std::size_t PagedKvStore::pool_bytes() const {
  return static_cast<std::size_t>(cfg_.n_blocks) * cfg_.n_layers * (page_bytes_[0] + page_bytes_[1]);
}

std::size_t PagedKvStore::sequence_bytes(SeqId s) const {
  const Sequence& q = seq(s);
  return (q.blocks.size() - static_cast<std::size_t>(q.released)) * static_cast<std::size_t>(cfg_.n_layers) *
         (page_bytes_[0] + page_bytes_[1]);
}

std::string PagedKvStore::check_guards() const {
  for (int l = 0; l < cfg_.n_layers; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V})
      for (int b = 0; b < cfg_.n_blocks; ++b) {
        const std::uint8_t* p = pool_page(l, h, b);
        const std::size_t pb = page_bytes_[static_cast<int>(h)];
        for (std::size_t i = 1; i <= cfg_.guard_bytes; ++i)
          if (p[-static_cast<std::ptrdiff_t>(i)] != kGuardByte || p[pb + i - 1] != kGuardByte)
            return "guard region of layer " + std::to_string(l) + (h == KvHalf::K ? " K" : " V") + " page " +
                   std::to_string(b) + " was overwritten";
      }
  return {};
}

}  // namespace kvgate
