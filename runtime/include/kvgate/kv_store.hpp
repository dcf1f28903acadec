// Paged KV store: per layer, a pool of pages (block_size tokens x KV heads x head_dim) for K and
// one for V in their half formats, each page with its scale region (docs/FORMATS.md); block
// tables per sequence; append/write, dequantized read, truncate, swap out/in, byte accounting.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvgate/format.hpp"

namespace kvgate {

class KvStoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class KvHalf : std::uint8_t { K = 0, V = 1 };
enum class Residency : std::uint8_t { resident, swapped };

struct StoreConfig {
  KvFormat format;
  int n_layers = 1;
  int n_kv_heads = 1;
  int head_dim = 64;
  int block_size = 16;
  int n_blocks = 64;             // pool capacity per layer (pages of K, and as many of V)
  std::vector<float> k_scale;    // [n_layers] per-tensor fp8 scales; empty = 1.0 everywhere
  std::vector<float> v_scale;    // [n_layers]
  std::size_t guard_bytes = 64;  // canary bytes before and after every page
  PageGeometry geometry() const { return {block_size, n_kv_heads, head_dim}; }
};

// Blocks a memory budget buys: budget / (n_layers * (K page + V page)).
int blocks_for_budget(const KvFormat& f, const PageGeometry& g, int n_layers, std::size_t budget_bytes);

using SeqId = int;

class PagedKvStore {
 public:
  explicit PagedKvStore(StoreConfig cfg);  // throws KvStoreError on an unsupported format/geometry

  const StoreConfig& config() const { return cfg_; }
  const KvFormat& format() const { return cfg_.format; }
  PageGeometry geometry() const { return cfg_.geometry(); }
  HalfFormat half_format(KvHalf h) const { return h == KvHalf::K ? cfg_.format.k : cfg_.format.v; }
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
  void truncate(SeqId s, int new_len);
  // Move every page of the sequence to host memory and free its blocks.
  void swap_out(SeqId s);
  // Bring it back; transactional: when blocks are short, nothing changes and KvStoreError is thrown.
  void swap_in(SeqId s);

  // --- raw pages (what kernels, oracles and persistence consume) ---------------------------
  std::span<const int> block_table(SeqId s) const;
  const std::uint8_t* page(int layer, KvHalf h, int block) const;
  std::uint8_t* page(int layer, KvHalf h, int block);
  std::size_t page_bytes(KvHalf h) const;

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

  StoreConfig cfg_;
  std::size_t page_bytes_[2]{};
  std::vector<std::vector<std::uint8_t>> pools_;  // [layer*2 + half] -> n_blocks * stride
  std::vector<int> free_list_;
  std::map<SeqId, Sequence> seqs_;
  SeqId next_id_ = 0;
};

inline constexpr std::uint8_t kGuardByte = 0xA5;

}  // namespace kvgate
