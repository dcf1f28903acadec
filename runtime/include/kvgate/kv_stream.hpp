// Streamed KV (`--kv-resident N`): a window of N tokens' blocks per layer in the device pool, every
// block in a host mirror. PagedKvStore owns one of these when streaming is on (set_streaming):
// its pages become the host mirror, attention reads the device copy through page() const, and a
// miss moves the block host -> device as the format's byte runs (format.hpp page_runs).
//
// Invariant (field note: a writer that skips the host mirror serves stale bytes later): every
// writer -- prefill and decode appends, truncation, swap-in, restore from a KV file -- writes the
// host mirror and, when the block is in the window, the device copy too (write_through).
// check_coherent() proves it for every resident block.
//
// The device pool is a small interface so that the CUDA backend can back it with device memory
// (and the host mirror with pinned memory, the upload with an async copy); CPU builds use
// make_host_device_pool(), plain memory, through the very same window logic.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <optional>
#include <string>
#include <vector>

#include "kvgate/format.hpp"

namespace kvgate {

// Slot layout of the window (what a device pool must provide): a slot holds one (layer, block), its K
// page at offset 0 and its V page at kv_slot_v_offset(); kv_slot_bytes() in all. Both page starts and
// the slot size are multiples of 256 bytes, the page alignment of the CUDA store whose decode kernels
// read pages with 16-byte vector loads (a streamed window on the GPU is read by the same kernels).
inline constexpr std::size_t kKvSlotAlign = 256;
std::size_t kv_slot_v_offset(const KvFormat& f, const PageGeometry& g);
std::size_t kv_slot_bytes(const KvFormat& f, const PageGeometry& g);
// The same when the V page has its own geometry (the MLA latent layout: V rows of the RoPE key).
std::size_t kv_slot_bytes(const KvFormat& f, const PageGeometry& gk, const PageGeometry& gv);

// Slots of the device pool, kv_slot_bytes() apart in one allocation.
class KvDevicePool {
 public:
  virtual ~KvDevicePool() = default;
  virtual int slots() const = 0;
  virtual std::size_t slot_bytes() const = 0;
  // Host -> device: for each run, bytes [r.offset, r.offset + r.bytes) of `src` go to
  // slot + dst_offset + r.offset. Returns the bytes moved.
  virtual std::size_t upload(int slot, std::size_t dst_offset, const std::uint8_t* src, std::span<const ByteRun> runs) = 0;
  // What kernels read for a slot (host-addressable on CPU builds, a device pointer on CUDA).
  virtual const std::uint8_t* data(int slot) const = 0;
  // Bytes [offset, offset + bytes) of a slot copied to host memory, after every upload queued so far
  // (check_coherent reads the device copy through this: a CUDA pool's data() is not host-addressable).
  virtual void read_back(int slot, std::size_t offset, std::uint8_t* dst, std::size_t bytes) const;
};

// The simulated device pool of CPU builds: `slots` x `slot_bytes` of host memory.
std::unique_ptr<KvDevicePool> make_host_device_pool(int slots, std::size_t slot_bytes);

struct StreamCounters {
  long long lookups = 0;       // page requests (a K page and a V page are one request each)
  long long misses = 0;        // requests that had to load the block (K and V pages) from the host mirror
  long long evictions = 0;     // resident blocks dropped to make room
  long long bytes_moved = 0;   // host -> device bytes (sum of the byte runs uploaded on misses)
  long long bytes_written_through = 0;  // device bytes written by writers (both copies kept equal)
};

class KvWindow {
 public:
  // host_page(layer, half, block) returns the host mirror page.
  using HostPage = std::function<const std::uint8_t*(int layer, int half, int block)>;

  // window_tokens >= 1: ceil(window_tokens / block_size) blocks per layer (at least one, so a window
  // smaller than a page still holds the page being read). `device` may be null: a host pool is made.
  // g is both halves' page geometry, or K's when `gv` (the V half's) is given.
  KvWindow(KvFormat fmt, PageGeometry g, int n_layers, int n_blocks, int window_tokens,
           std::unique_ptr<KvDevicePool> device = nullptr, std::optional<PageGeometry> gv = std::nullopt);

  int window_tokens() const { return window_tokens_; }
  int window_blocks() const { return window_blocks_; }  // per layer
  std::size_t v_offset() const;                          // of the V page in a slot (kv_slot_v_offset)
  std::size_t device_bytes() const;                      // the device pool (all layers, K+V)
  const StreamCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }

  // The device copy of page (layer, half) of `block`; on a miss, the least recently used block of
  // that layer's window is dropped and the block's K and V pages are uploaded from the host mirror
  // as their byte runs. The pointer stays valid until the next lookup of another block of the layer.
  const std::uint8_t* lookup(int layer, int half, int block, const HostPage& host);
  bool resident(int layer, int block) const;
  // Writers call this after writing `runs` of the host page: the same runs go to the device copy
  // when the block is in the window (no allocation when it is not; a later miss loads it).
  void write_through(int layer, int half, int block, std::span<const ByteRun> runs, const std::uint8_t* host_page);
  // The block was freed or handed out anew: every layer's device copy of it is dropped.
  void invalidate(int block);
  // The (layer, block) device copy may be stale (raw host writes): dropped.
  void invalidate(int layer, int block);
  // Empty when every resident device copy equals its host mirror page; else names the first mismatch.
  std::string check_coherent(const HostPage& host) const;

 private:
  int slot_index(int layer, int w) const { return layer * window_blocks_ + w; }

  KvFormat fmt_;
  PageGeometry g_, gv_;
  int n_layers_, n_blocks_, window_tokens_, window_blocks_;
  std::size_t page_bytes_[2];
  std::vector<ByteRun> runs_[2];
  std::unique_ptr<KvDevicePool> dev_;
  std::vector<int> slot_of_;            // [layer * n_blocks + block] -> w (-1: not resident)
  std::vector<int> block_in_;           // [layer * window_blocks + w] -> block (-1: free)
  std::vector<unsigned long long> used_;  // [layer * window_blocks + w] -> last-use tick (LRU)
  unsigned long long tick_ = 0;
  StreamCounters counters_;
};

}  // namespace kvgate
