#include "kvgate/kv_stream.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace kvgate {

namespace {

constexpr std::size_t kAlign = kKvSlotAlign;
std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

class HostDevicePool final : public KvDevicePool {
 public:
  HostDevicePool(int slots, std::size_t slot_bytes)
      : slots_(slots), slot_bytes_(align_up(slot_bytes)), mem_(static_cast<std::size_t>(slots) * slot_bytes_ + kAlign, 0) {
    auto p = reinterpret_cast<std::uintptr_t>(mem_.data());
    base_ = mem_.data() + (align_up(p) - p);
  }
  int slots() const override { return slots_; }
  std::size_t slot_bytes() const override { return slot_bytes_; }
  std::size_t upload(int slot, std::size_t dst_offset, const std::uint8_t* src, std::span<const ByteRun> runs) override {
    std::uint8_t* dst = base_ + static_cast<std::size_t>(slot) * slot_bytes_ + dst_offset;
    std::size_t moved = 0;
    for (const ByteRun& r : runs) {
      std::memcpy(dst + r.offset, src + r.offset, r.bytes);
      moved += r.bytes;
    }
    return moved;
  }
  const std::uint8_t* data(int slot) const override { return base_ + static_cast<std::size_t>(slot) * slot_bytes_; }

 private:
  int slots_;
  std::size_t slot_bytes_;
  std::vector<std::uint8_t> mem_;
  std::uint8_t* base_;
};

}  // namespace

std::size_t kv_slot_v_offset(const KvFormat& f, const PageGeometry& g) { return align_up(page_bytes(f.k, g)); }
std::size_t kv_slot_bytes(const KvFormat& f, const PageGeometry& g) {
  return align_up(kv_slot_v_offset(f, g) + page_bytes(f.v, g));
}
std::size_t kv_slot_bytes(const KvFormat& f, const PageGeometry& gk, const PageGeometry& gv) {
  return align_up(kv_slot_v_offset(f, gk) + page_bytes(f.v, gv));
}

void KvDevicePool::read_back(int slot, std::size_t offset, std::uint8_t* dst, std::size_t bytes) const {
  std::memcpy(dst, data(slot) + offset, bytes);
}

std::unique_ptr<KvDevicePool> make_host_device_pool(int slots, std::size_t slot_bytes) {
  return std::make_unique<HostDevicePool>(slots, slot_bytes);
}

KvWindow::KvWindow(KvFormat fmt, PageGeometry g, int n_layers, int n_blocks, int window_tokens,
                   std::unique_ptr<KvDevicePool> device, std::optional<PageGeometry> gv)
    : fmt_(fmt), g_(g), gv_(gv.value_or(g)), n_layers_(n_layers), n_blocks_(n_blocks), window_tokens_(window_tokens) {
  if (window_tokens < 1) throw std::invalid_argument("kv stream: the resident window must hold at least 1 token");
  window_blocks_ = std::max(1, (window_tokens + g.block_size - 1) / g.block_size);
  page_bytes_[0] = page_bytes(fmt.k, g);
  page_bytes_[1] = page_bytes(fmt.v, gv_);
  runs_[0] = page_runs(fmt.k, g);
  runs_[1] = page_runs(fmt.v, gv_);
  const int slots = n_layers * window_blocks_;
  const std::size_t need = kv_slot_bytes(fmt, g, gv_);
  dev_ = device ? std::move(device) : make_host_device_pool(slots, need);
  // The slot size must be the layout's exactly: a consumer addresses slot s at data(0) + s * slot_bytes.
  if (dev_->slots() < slots || dev_->slot_bytes() != need)
    throw std::invalid_argument("kv stream: the device pool has " + std::to_string(dev_->slots()) + " slots of " +
                                std::to_string(dev_->slot_bytes()) + " bytes; the window needs " +
                                std::to_string(slots) + " of " + std::to_string(need));
  slot_of_.assign(static_cast<std::size_t>(n_layers) * n_blocks, -1);
  block_in_.assign(static_cast<std::size_t>(slots), -1);
  used_.assign(static_cast<std::size_t>(slots), 0);
}

std::size_t KvWindow::v_offset() const { return kv_slot_v_offset(fmt_, g_); }

std::size_t KvWindow::device_bytes() const {
  return static_cast<std::size_t>(n_layers_) * window_blocks_ * (page_bytes_[0] + page_bytes_[1]);
}

bool KvWindow::resident(int layer, int block) const {
  return slot_of_[static_cast<std::size_t>(layer) * n_blocks_ + block] >= 0;
}

const std::uint8_t* KvWindow::lookup(int layer, int half, int block, const HostPage& host) {
  ++counters_.lookups;
  int& w = slot_of_[static_cast<std::size_t>(layer) * n_blocks_ + block];
  if (w < 0) {
    ++counters_.misses;
    // Least recently used slot of this layer (a free slot has tick 0 and wins).
    int victim = 0;
    for (int i = 1; i < window_blocks_; ++i)
      if (used_[static_cast<std::size_t>(slot_index(layer, i))] < used_[static_cast<std::size_t>(slot_index(layer, victim))])
        victim = i;
    const std::size_t vs = static_cast<std::size_t>(slot_index(layer, victim));
    if (block_in_[vs] >= 0) {
      slot_of_[static_cast<std::size_t>(layer) * n_blocks_ + block_in_[vs]] = -1;
      ++counters_.evictions;
    }
    // The block moves as the byte runs of its K page and of its V page.
    counters_.bytes_moved += static_cast<long long>(dev_->upload(static_cast<int>(vs), 0, host(layer, 0, block), runs_[0]));
    counters_.bytes_moved +=
        static_cast<long long>(dev_->upload(static_cast<int>(vs), v_offset(), host(layer, 1, block), runs_[1]));
    block_in_[vs] = block;
    w = victim;
  }
  const int s = slot_index(layer, w);
  used_[static_cast<std::size_t>(s)] = ++tick_;
  return dev_->data(s) + (half == 0 ? 0 : v_offset());
}

void KvWindow::write_through(int layer, int half, int block, std::span<const ByteRun> runs,
                             const std::uint8_t* host_page) {
  const int w = slot_of_[static_cast<std::size_t>(layer) * n_blocks_ + block];
  if (w < 0) return;
  counters_.bytes_written_through += static_cast<long long>(
      dev_->upload(slot_index(layer, w), half == 0 ? 0 : v_offset(), host_page, runs));
}

void KvWindow::invalidate(int block) {
  for (int l = 0; l < n_layers_; ++l) invalidate(l, block);
}

void KvWindow::invalidate(int layer, int block) {
  int& w = slot_of_[static_cast<std::size_t>(layer) * n_blocks_ + block];
  if (w < 0) return;
  const std::size_t s = static_cast<std::size_t>(slot_index(layer, w));
  block_in_[s] = -1;
  used_[s] = 0;
  w = -1;
}

std::string KvWindow::check_coherent(const HostPage& host) const {
  for (int l = 0; l < n_layers_; ++l)
    for (int i = 0; i < window_blocks_; ++i) {
      const int s = slot_index(l, i);
      const int b = block_in_[static_cast<std::size_t>(s)];
      if (b < 0) continue;
      for (int h = 0; h < 2; ++h) {
        std::vector<std::uint8_t> dev(page_bytes_[h]);
        dev_->read_back(s, h == 0 ? 0 : v_offset(), dev.data(), dev.size());
        const std::uint8_t* hp = host(l, h, b);
        for (const ByteRun& r : runs_[h])
          if (std::memcmp(dev.data() + r.offset, hp + r.offset, r.bytes) != 0)
            return "device copy of layer " + std::to_string(l) + (h == 0 ? " K" : " V") + " block " + std::to_string(b) +
                   " differs from the host mirror in run '" + r.name + "'";
      }
    }
  return {};
}

}  // namespace kvgate
