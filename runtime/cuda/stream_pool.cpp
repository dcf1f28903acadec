// The CUDA device pool of a streamed KV window (kvgate/cuda/stream_pool.hpp).
//
// Host mirror: the PagedKvStore's own pages, page-locked in place (cudaHostRegister) rather than
// staged through a pinned bounce buffer. Registering keeps one copy of every byte (the mirror is
// what the CPU writers already write), each miss is one DMA per byte run straight from the page,
// and no staging ring has to track which bounce slot a queued copy still reads. From pageable
// memory cudaMemcpyAsync would stage through a driver buffer and return only after the host side
// was consumed -- correct but synchronous, so the counters say which source an upload came from.
#include "kvgate/cuda/stream_pool.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/common.cuh"

namespace kvgate::cuda {

CudaDevicePool::CudaDevicePool(int slots, std::size_t slot_bytes, cudaStream_t stream)
    : slots_(slots), slot_bytes_(slot_bytes), stream_(stream) {
  if (slots < 1) throw std::invalid_argument("cuda device pool: needs at least one slot");
  if (slot_bytes == 0 || slot_bytes % kKvSlotAlign != 0)
    throw std::invalid_argument("cuda device pool: slot_bytes " + std::to_string(slot_bytes) +
                                " is not a positive multiple of " + std::to_string(kKvSlotAlign) +
                                " (every K and V page start must stay 256-byte aligned)");
  const std::size_t bytes = static_cast<std::size_t>(slots) * slot_bytes;
  KVGATE_CUDA_CHECK(cudaMalloc(&base_, bytes));  // 256-byte aligned (cudaMalloc guarantees >= 256)
  try {
    // On the pool's stream: a legacy-stream memset would not be ordered before uploads queued on a
    // non-blocking stream and could land on top of them.
    KVGATE_CUDA_CHECK(cudaMemsetAsync(base_, 0, bytes, stream_));
    KVGATE_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  } catch (...) {
    cudaFree(base_);
    throw;
  }
}

CudaDevicePool::~CudaDevicePool() {
  // Queued copies may still read the registered host pages and write the slots: drain first.
  cudaStreamSynchronize(stream_);
  for (const auto& r : pinned_) cudaHostUnregister(reinterpret_cast<void*>(r.first));
  if (table_) cudaFree(table_);
  if (event_) cudaEventDestroy(event_);
  cudaFree(base_);
}

const std::uint8_t* CudaDevicePool::data(int slot) const {
  return base_ + static_cast<std::size_t>(slot) * slot_bytes_;
}

bool CudaDevicePool::pinned(const void* p, std::size_t bytes) const {
  const auto lo = reinterpret_cast<std::uintptr_t>(p), hi = lo + bytes;
  // The last registered range starting at or before lo.
  auto it = std::upper_bound(pinned_.begin(), pinned_.end(), lo,
                             [](std::uintptr_t x, const auto& r) { return x < r.first; });
  if (it == pinned_.begin()) return false;
  --it;
  return hi <= it->second;
}

std::size_t CudaDevicePool::upload(int slot, std::size_t dst_offset, const std::uint8_t* src,
                                   std::span<const ByteRun> runs) {
  if (slot < 0 || slot >= slots_) throw std::out_of_range("cuda device pool: slot " + std::to_string(slot));
  std::uint8_t* dst = base_ + static_cast<std::size_t>(slot) * slot_bytes_ + dst_offset;
  std::size_t moved = 0;
  for (const ByteRun& r : runs) {
    if (dst_offset + r.offset + r.bytes > slot_bytes_)
      throw std::out_of_range("cuda device pool: run '" + r.name + "' ends past the slot");
    KVGATE_CUDA_CHECK(cudaMemcpyAsync(dst + r.offset, src + r.offset, r.bytes, cudaMemcpyHostToDevice, stream_));
    ++counters_.copies;
    (pinned(src + r.offset, r.bytes) ? counters_.bytes_from_pinned : counters_.bytes_from_pageable) +=
        static_cast<long long>(r.bytes);
    moved += r.bytes;
  }
  counters_.bytes_uploaded += static_cast<long long>(moved);
  return moved;
}

void CudaDevicePool::read_back(int slot, std::size_t offset, std::uint8_t* dst, std::size_t bytes) const {
  if (slot < 0 || slot >= slots_ || offset + bytes > slot_bytes_)
    throw std::out_of_range("cuda device pool: read_back outside slot " + std::to_string(slot));
  sync();  // after every upload queued so far
  KVGATE_CUDA_CHECK(cudaMemcpy(dst, data(slot) + offset, bytes, cudaMemcpyDeviceToHost));
}

std::size_t CudaDevicePool::pin_host_ranges(std::vector<std::pair<const void*, std::size_t>> ranges) {
  const auto page = static_cast<std::uintptr_t>(HostPageAlloc::page_size());
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> iv;
  for (const auto& [p, n] : ranges) {
    if (n == 0) continue;
    const auto lo = reinterpret_cast<std::uintptr_t>(p);
    iv.emplace_back(lo / page * page, (lo + n + page - 1) / page * page);
  }
  std::sort(iv.begin(), iv.end());
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> merged;
  for (const auto& r : iv) {
    if (!merged.empty() && r.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  std::size_t registered = 0;
  for (const auto& r : merged) {
    if (pinned(reinterpret_cast<const void*>(r.first), r.second - r.first)) continue;  // already ours
    const cudaError_t e =
        cudaHostRegister(reinterpret_cast<void*>(r.first), r.second - r.first, cudaHostRegisterDefault);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
      cudaGetLastError();  // someone else pinned a page of it: leave it, uploads from it count as pageable
      continue;
    }
    KVGATE_CUDA_CHECK(e);
    pinned_.push_back(r);
    registered += r.second - r.first;
  }
  std::sort(pinned_.begin(), pinned_.end());
  pinned_bytes_ += registered;
  return registered;
}

void CudaDevicePool::sync() const { KVGATE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void CudaDevicePool::make_wait(cudaStream_t consumer) const {
  KVGATE_CUDA_CHECK(cudaEventRecord(event_, stream_));
  KVGATE_CUDA_CHECK(cudaStreamWaitEvent(consumer, event_, 0));
}

int* CudaDevicePool::table_scratch(std::size_t ints) {
  if (ints > table_ints_) {
    if (table_) KVGATE_CUDA_CHECK(cudaFree(table_));  // cudaFree waits for kernels still reading it
    table_ = nullptr;
    table_ints_ = 0;
    KVGATE_CUDA_CHECK(cudaMalloc(&table_, ints * sizeof(int)));
    table_ints_ = ints;
  }
  return table_;
}

std::unique_ptr<CudaDevicePool> make_cuda_device_pool(int slots, const KvFormat& fmt, const PageGeometry& g,
                                                      cudaStream_t stream) {
  return std::make_unique<CudaDevicePool>(slots, kv_slot_bytes(fmt, g), stream);
}

CudaDevicePool& stream_on_device(PagedKvStore& store, int resident_tokens, cudaStream_t stream) {
  const StoreConfig& c = store.config();
  if (resident_tokens < 1) throw KvStoreError("cuda stream: the resident window must hold at least 1 token");
  const int window_blocks = std::max(1, (resident_tokens + c.block_size - 1) / c.block_size);  // as KvWindow
  auto pool = make_cuda_device_pool(c.n_layers * window_blocks, c.format, store.geometry(), stream);
  // The store's pools are page-aligned allocations padded to whole pages (HostPageAlloc): widening
  // them to pages pins nothing but the store's own memory. A neighbour's buffer inside a pinned page
  // would have its pageable copies turn asynchronous (DMA from a vector its owner already freed).
  std::vector<std::pair<const void*, std::size_t>> ranges;
  for (int l = 0; l < c.n_layers; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V}) {
      const std::span<const std::uint8_t> p = store.host_pool(l, h);
      if (p.empty()) continue;
      if (reinterpret_cast<std::uintptr_t>(p.data()) % HostPageAlloc::page_size() != 0)
        throw std::logic_error("cuda stream: the store's host pool is not page-aligned; pinning it would pin its neighbours");
      ranges.emplace_back(p.data(), p.size());
    }
  pool->pin_host_ranges(std::move(ranges));
  CudaDevicePool& ref = *pool;
  store.set_streaming(resident_tokens, std::move(pool));
  return ref;
}

DecodePlan decode_streamed(const PagedKvStore& store, CudaDevicePool& pool, SeqId s, int layer, int n_heads,
                           const float* d_q, float* d_out, DecodeWorkspace& ws, float softmax_scale, int num_splits) {
  const KvWindow* w = store.window();
  if (!w) throw KvStoreError("cuda streamed decode: the store is not streaming (stream_on_device first)");
  const StoreConfig& c = store.config();
  if (layer < 0 || layer >= c.n_layers) throw KvStoreError("cuda streamed decode: layer " + std::to_string(layer));
  const int len = store.length(s);
  if (len < 1) throw KvStoreError("cuda streamed decode: empty sequence " + std::to_string(s));
  const int pages = (len + c.block_size - 1) / c.block_size;
  // One launch reads every page of the context through the table of window slots: the layer's window
  // must hold them all at once (the kernel's partial softmax states are not exposed for merging
  // window-sized launches).
  if (pages > w->window_blocks())
    throw KvStoreError("cuda streamed decode: window_smaller_than_context: the window holds " +
                       std::to_string(w->window_blocks()) + " blocks per layer (" + std::to_string(w->window_tokens()) +
                       " tokens), sequence " + std::to_string(s) + " needs " + std::to_string(pages) + " (" +
                       std::to_string(len) + " tokens) in one decode launch");
  const auto table = store.block_table(s);
  const std::size_t voff = w->v_offset(), sb = pool.slot_bytes();
  const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(pool.base());
  std::vector<int> tab(static_cast<std::size_t>(pages) + 1);
  for (int p = 0; p < pages; ++p) {
    const int block = table[static_cast<std::size_t>(p)];
    // A miss evicts this layer's least recently used slot; the pages of this pass are the most
    // recently used ones and there are no more of them than slots, so none is evicted by another.
    const auto k = reinterpret_cast<std::uintptr_t>(store.page(layer, KvHalf::K, block));
    const auto v = reinterpret_cast<std::uintptr_t>(store.page(layer, KvHalf::V, block));
    if (k < base || k >= base + static_cast<std::uintptr_t>(pool.slots()) * sb || (k - base) % sb != 0 || v != k + voff)
      throw std::logic_error("cuda streamed decode: the store's window is not backed by this pool");
    tab[static_cast<std::size_t>(p)] = static_cast<int>((k - base) / sb);
  }
  {  // Defence of the claim above: every page still resident, in distinct slots.
    std::vector<int> sorted(tab.begin(), tab.begin() + pages);
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      throw std::logic_error("cuda streamed decode: two pages of one launch share a window slot");
    for (int p = 0; p < pages; ++p)
      if (!w->resident(layer, table[static_cast<std::size_t>(p)]))
        throw std::logic_error("cuda streamed decode: a page of the launch was evicted by another");
  }
  tab[static_cast<std::size_t>(pages)] = len;  // seq_lens[0] after the table
  int* d_tab = pool.table_scratch(tab.size());
  // From pageable memory: staged before the call returns, so `tab` may go; queued after the uploads.
  KVGATE_CUDA_CHECK(cudaMemcpyAsync(d_tab, tab.data(), tab.size() * sizeof(int), cudaMemcpyHostToDevice, pool.stream()));
  DecodeArgs a;
  a.format = c.format;
  a.geometry = store.geometry();
  a.n_heads = n_heads;
  a.batch = 1;
  a.k_pool = pool.base();
  a.v_pool = pool.base() + voff;
  a.k_page_stride = sb;
  a.v_page_stride = sb;
  a.block_tables = d_tab;
  a.table_stride = pages;
  a.seq_lens = d_tab + pages;
  a.max_seq_len = len;
  a.q = d_q;
  a.out = d_out;
  // A host store's per-tensor scales (PagedKvStore::tensor_scale refuses a layer whose heads differ:
  // per-head tables stream through the CUDA engine's device store, CudaKvStore::kernel_scales).
  a.k_scale = store.tensor_scale(layer, KvHalf::K);
  a.v_scale = store.tensor_scale(layer, KvHalf::V);
  a.softmax_scale = softmax_scale;
  a.num_splits = num_splits;
  return decode_attention(a, ws, pool.stream());
}

}  // namespace kvgate::cuda
