// Streamed KV on the GPU (`--kv-resident N` with the CUDA backend): the KvWindow of kv_stream.hpp
// backed by device memory. The window's slots live in one cudaMalloc allocation; the host mirror is
// the PagedKvStore's own pages, page-locked in place with cudaHostRegister; a miss or a write-through
// is one cudaMemcpyAsync per byte run on the pool's stream. Decode reads the window's slots with the
// unchanged decode kernel through a device table of slot ids (docs/CUDA.md "Streaming on the GPU").
//
// Ordering: uploads, the table copy and the decode kernel all go to the pool's stream, so a kernel
// sees every upload queued before it and an upload that recycles a slot runs after the kernels
// that read the slot's previous block. A consumer on another stream calls make_wait(stream) before
// its kernel (and must not let the pool recycle slots while that kernel runs).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "kvgate/cuda/ops.hpp"
#include "kvgate/kv_store.hpp"
#include "kvgate/kv_stream.hpp"

namespace kvgate::cuda {

struct DevicePoolCounters {
  long long copies = 0;               // cudaMemcpyAsync calls (one per byte run)
  long long bytes_uploaded = 0;       // host -> device, all uploads (misses and write-throughs)
  long long bytes_from_pinned = 0;    // ... whose source lay in a registered (page-locked) range
  long long bytes_from_pageable = 0;  // ... that did not: correct, but the copy is synchronous
};

class CudaDevicePool final : public KvDevicePool {
 public:
  // `slots` x `slot_bytes` (a multiple of kKvSlotAlign) of device memory, zeroed; uploads go to
  // `stream` (nullptr: the legacy default stream). Throws std::runtime_error on a CUDA error.
  CudaDevicePool(int slots, std::size_t slot_bytes, cudaStream_t stream = nullptr);
  ~CudaDevicePool() override;  // waits for the stream, unregisters the host ranges, frees
  CudaDevicePool(const CudaDevicePool&) = delete;
  CudaDevicePool& operator=(const CudaDevicePool&) = delete;

  int slots() const override { return slots_; }
  std::size_t slot_bytes() const override { return slot_bytes_; }
  std::size_t upload(int slot, std::size_t dst_offset, const std::uint8_t* src, std::span<const ByteRun> runs) override;
  const std::uint8_t* data(int slot) const override;  // device pointer
  void read_back(int slot, std::size_t offset, std::uint8_t* dst, std::size_t bytes) const override;

  // Page-locks host memory in place for the pool's lifetime (cudaHostRegister). The ranges are
  // widened to whole OS pages and merged first: CUDA pins whole pages and refuses to register a
  // page twice. Returns the bytes registered. A range some other owner already registered is
  // skipped (uploads from it are counted as pageable).
  // Only for memory no other object shares a page with (PagedKvStore::host_pool is such memory):
  // a foreign buffer inside a pinned page would have its pageable copies turn asynchronous.
  std::size_t pin_host_ranges(std::vector<std::pair<const void*, std::size_t>> ranges);
  bool pinned(const void* p, std::size_t bytes) const;
  std::size_t pinned_bytes() const { return pinned_bytes_; }

  cudaStream_t stream() const { return stream_; }
  void sync() const;                        // host waits for every queued upload and kernel
  void make_wait(cudaStream_t consumer) const;  // `consumer` waits (event) for what is queued so far
  const std::uint8_t* base() const { return base_; }  // slot s at base() + s * slot_bytes()
  const DevicePoolCounters& counters() const { return counters_; }

  // Device scratch for decode's slot table (grows; used on the pool's stream only).
  int* table_scratch(std::size_t ints);

 private:
  int slots_;
  std::size_t slot_bytes_;
  cudaStream_t stream_;
  std::uint8_t* base_ = nullptr;
  cudaEvent_t event_ = nullptr;
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> pinned_;  // registered [lo, hi), sorted
  std::size_t pinned_bytes_ = 0;
  int* table_ = nullptr;
  std::size_t table_ints_ = 0;
  DevicePoolCounters counters_;
};

// A device pool with the slot layout of KvWindow for `fmt`/`g` (slot_bytes = kv_slot_bytes).
std::unique_ptr<CudaDevicePool> make_cuda_device_pool(int slots, const KvFormat& fmt, const PageGeometry& g,
                                                      cudaStream_t stream = nullptr);

// Turns streaming on for `store` with its window in device memory: a pool of n_layers x
// window-blocks slots, the store's host pages (every layer, K and V: the host mirror) registered as
// page-locked memory (PagedKvStore::host_pool: page-aligned, whole pages), then
// store.set_streaming(resident_tokens, pool). The pool belongs to the store (it goes with
// set_streaming(0) or the store's destructor, which drops the window before the pages); the
// reference is valid until then. Do not assign to the store while it streams on the device
// (assignment frees the old pages before it drops the window): set_streaming(0) first.
CudaDevicePool& stream_on_device(PagedKvStore& store, int resident_tokens, cudaStream_t stream = nullptr);

// Decode attention of sequence `s` of a store streamed by stream_on_device on `pool`, over `layer`,
// with the query at the sequence's last position: d_q/d_out [n_heads][D] on the device. Each block
// of the sequence is looked up in the window (a miss uploads it from the host mirror on the pool's
// stream), then decode_attention runs on the pool's stream with k_pool/v_pool = the slots' K/V
// pages, page strides = slot_bytes, block table = slot ids. One launch reads the whole context
// through the window, so the layer's window must hold the sequence's pages: a window of fewer blocks
// is refused (KvStoreError, "window_smaller_than_context"). Returns the decode plan.
DecodePlan decode_streamed(const PagedKvStore& store, CudaDevicePool& pool, SeqId s, int layer, int n_heads,
                           const float* d_q, float* d_out, DecodeWorkspace& ws, float softmax_scale = 0.0f,
                           int num_splits = 0);

}  // namespace kvgate::cuda
