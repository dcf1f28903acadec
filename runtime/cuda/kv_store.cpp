#include "kvgate/cuda/kv_store.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/common.cuh"
#include "kvgate/window_release.hpp"

namespace kvgate::cuda {

namespace {
constexpr std::size_t kPageAlign = 256;  // every page starts 256-byte aligned (vector loads)
}

CudaKvStore::CudaKvStore(StoreConfig cfg) : cfg_(std::move(cfg)) {
  const OpSupport sup = supports_op(Op::store, cfg_);
  if (!sup.ok)
    throw KvStoreError("cuda kv store: format '" + cfg_.format.name() + "' is not supported here (" + sup.reason +
                       "): " + sup.detail);
  if (cfg_.n_layers < 1 || cfg_.n_blocks < 0) throw KvStoreError("cuda kv store: n_layers must be >= 1 and n_blocks >= 0");
  for (int h = 0; h < 2; ++h) {
    page_bytes_[h] = kvgate::page_bytes(h == 0 ? cfg_.format.k : cfg_.format.v, cfg_.half_geometry(static_cast<KvHalf>(h)));
    stride_[h] = (page_bytes_[h] + kPageAlign - 1) / kPageAlign * kPageAlign;
  }
  init_scales();
  pools_.assign(static_cast<std::size_t>(cfg_.n_layers) * 2, nullptr);
  try {
    for (int l = 0; l < cfg_.n_layers; ++l)
      for (int h = 0; h < 2; ++h) {
        const std::size_t bytes = std::max<std::size_t>(1, static_cast<std::size_t>(cfg_.n_blocks) * stride_[h]);
        std::uint8_t* p = nullptr;
        KVGATE_CUDA_CHECK(cudaMalloc(&p, bytes));
        pools_[static_cast<std::size_t>(l) * 2 + h] = p;
        KVGATE_CUDA_CHECK(cudaMemset(p, 0, bytes));
      }
  } catch (...) {
    for (auto* p : pools_)
      if (p) cudaFree(p);
    if (d_head_scales_) cudaFree(d_head_scales_);
    throw;
  }
  free_list_.reserve(static_cast<std::size_t>(cfg_.n_blocks));
  for (int b = cfg_.n_blocks - 1; b >= 0; --b) free_list_.push_back(b);  // hands out 0, 1, 2, ... like the CPU store
}

CudaKvStore::CudaKvStore(StoreConfig cfg, External ext) : cfg_(std::move(cfg)), external_(true) {
  const OpSupport sup = supports_op(Op::store, cfg_);
  if (!sup.ok)
    throw KvStoreError("cuda kv store: format '" + cfg_.format.name() + "' is not supported here (" + sup.reason +
                       "): " + sup.detail);
  if (cfg_.n_layers < 1) throw KvStoreError("cuda kv store: n_layers must be >= 1");
  if (ext.pools.size() != static_cast<std::size_t>(cfg_.n_layers) * 2 || ext.n_pages < 1 || ext.stride % kPageAlign != 0)
    throw KvStoreError("cuda kv store view: needs one K and one V base per layer, >= 1 page and a stride that is a "
                       "multiple of 256 bytes");
  for (int h = 0; h < 2; ++h) {
    page_bytes_[h] = kvgate::page_bytes(h == 0 ? cfg_.format.k : cfg_.format.v, cfg_.half_geometry(static_cast<KvHalf>(h)));
    if (page_bytes_[h] > ext.stride) throw KvStoreError("cuda kv store view: the stride is smaller than a page");
    stride_[h] = ext.stride;
  }
  for (auto* p : ext.pools)
    if (!p || reinterpret_cast<std::uintptr_t>(p) % kPageAlign != 0)
      throw KvStoreError("cuda kv store view: page bases must be non-null and 256-byte aligned");
  cfg_.n_blocks = ext.n_pages;
  init_scales();
  pools_ = std::move(ext.pools);  // not owned; the free list stays empty
}

void CudaKvStore::init_scales() {
  normalize_kv_scales(cfg_, "cuda kv store");
  // supports_op(Op::store, cfg_) above refused a per-head table for a half other than fp8.
  if (!per_head_scales()) return;
  const std::size_t n = cfg_.k_scale.size();
  std::vector<float> both(cfg_.k_scale);
  both.insert(both.end(), cfg_.v_scale.begin(), cfg_.v_scale.end());
  KVGATE_CUDA_CHECK(cudaMalloc(&d_head_scales_, 2 * n * sizeof(float)));
  const cudaError_t e = cudaMemcpy(d_head_scales_, both.data(), 2 * n * sizeof(float), cudaMemcpyHostToDevice);
  if (e != cudaSuccess) {
    cudaFree(d_head_scales_);
    d_head_scales_ = nullptr;
    KVGATE_CUDA_CHECK(e);
  }
}

CudaKvStore::~CudaKvStore() {
  if (!external_)
    for (auto* p : pools_)
      if (p) cudaFree(p);
  for (auto* p : scratch_)
    if (p) cudaFree(p);
  if (d_head_scales_) cudaFree(d_head_scales_);
  if (d_bytes_read_) cudaFree(d_bytes_read_);
}

void CudaKvStore::set_read_counter(bool on) {
  if (on && !d_bytes_read_) {
    KVGATE_CUDA_CHECK(cudaMalloc(&d_bytes_read_, sizeof(unsigned long long)));
    reset_read_bytes();
  } else if (!on && d_bytes_read_) {
    KVGATE_CUDA_CHECK(cudaDeviceSynchronize());  // no kernel still adds to it
    KVGATE_CUDA_CHECK(cudaFree(d_bytes_read_));
    d_bytes_read_ = nullptr;
  }
}

std::uint64_t CudaKvStore::read_bytes() const {
  if (!d_bytes_read_) return 0;
  KVGATE_CUDA_CHECK(cudaDeviceSynchronize());  // the kernels of every stream that counted have finished
  unsigned long long n = 0;
  KVGATE_CUDA_CHECK(cudaMemcpy(&n, d_bytes_read_, sizeof n, cudaMemcpyDeviceToHost));
  return n;
}

void CudaKvStore::reset_read_bytes() {
  if (!d_bytes_read_) return;
  KVGATE_CUDA_CHECK(cudaDeviceSynchronize());
  KVGATE_CUDA_CHECK(cudaMemset(d_bytes_read_, 0, sizeof(unsigned long long)));
  KVGATE_CUDA_CHECK(cudaDeviceSynchronize());
}

std::span<const float> CudaKvStore::head_scales(int layer, KvHalf h) const {
  if (layer < 0 || layer >= cfg_.n_layers)
    throw KvStoreError("cuda kv store: layer " + std::to_string(layer) + " is out of range (n_layers " +
                       std::to_string(cfg_.n_layers) + ")");
  return head_scales_of(cfg_, layer, h);
}

bool CudaKvStore::per_head_scales() const { return per_head_scales_of(cfg_); }

float CudaKvStore::tensor_scale(int layer, KvHalf h) const { return tensor_scale_of(cfg_, layer, h, "cuda kv store"); }

CudaKvStore::KernelScales CudaKvStore::kernel_scales(int layer, KvHalf h) const {
  const std::span<const float> s = head_scales(layer, h);
  KernelScales k;
  k.tensor = s[0];
  if (!uniform_heads(s))
    k.heads = d_head_scales_ + (static_cast<std::size_t>(h == KvHalf::K ? 0 : 1) * cfg_.n_layers + layer) * s.size();
  return k;
}

CudaKvStore::Sequence& CudaKvStore::seq(SeqId s) {
  auto it = seqs_.find(s);
  if (it == seqs_.end()) throw KvStoreError("cuda kv store: unknown sequence id " + std::to_string(s));
  return it->second;
}
const CudaKvStore::Sequence& CudaKvStore::seq(SeqId s) const { return const_cast<CudaKvStore*>(this)->seq(s); }

SeqId CudaKvStore::create_sequence() {
  seqs_[next_id_] = Sequence{};
  return next_id_++;
}

void CudaKvStore::free_sequence(SeqId s) {
  Sequence& q = seq(s);
  if (external_) {  // the view's pages belong to the window; nothing to zero or give back
    seqs_.erase(s);
    return;
  }
  for (int b : q.blocks)
    if (b != kReleasedBlock) free_page(b);
  seqs_.erase(s);
}

// Zeroed on the legacy stream, which waits for the forward's (blocking) stream: no kernel still
// reads the page, and a later kernel that writes it runs after the zeroing.
void CudaKvStore::free_page(int b) {
  for (int l = 0; l < cfg_.n_layers; ++l)
    for (int h = 0; h < 2; ++h)
      KVGATE_CUDA_CHECK(cudaMemset(pools_[static_cast<std::size_t>(l) * 2 + h] + static_cast<std::size_t>(b) * stride_[h], 0,
                                   page_bytes_[h]));
  free_list_.push_back(b);
}

int CudaKvStore::released_tokens(SeqId s) const { return seq(s).released * cfg_.block_size; }

int CudaKvStore::release_before(SeqId s, int first_kept_pos) {
  Sequence& q = seq(s);
  if (external_)
    throw KvStoreError("cuda kv store view: release_before is for stores that own their pages; a streamed window's "
                       "pages are released in its host mirror (PagedKvStore::release_before)");
  return release_table_prefix(q.blocks, q.released, q.length, cfg_.block_size, first_kept_pos,
                              [this](int b) { free_page(b); });
}

void CudaKvStore::kernel_table(std::span<const int> table, int* dst, std::size_t n) {
  const int live = table.empty() || table.back() == kReleasedBlock ? 0 : table.back();
  for (std::size_t i = 0; i < n; ++i) dst[i] = table[i] == kReleasedBlock ? live : table[i];
}

void CudaKvStore::check_kept(SeqId s, const Sequence& q, int first, const std::string& what) const {
  if (first >= q.released * cfg_.block_size) return;
  throw KvStoreError("cuda kv store: " + what + " of sequence " + std::to_string(s) + " starts at position " +
                     std::to_string(first) + ", but the pages of its first " +
                     std::to_string(q.released * cfg_.block_size) +
                     " tokens were released (outside every layer's sliding window); run without the release "
                     "(EngineOptions::release_outside_window = false) to keep them");
}

int CudaKvStore::length(SeqId s) const { return seq(s).length; }
std::span<const int> CudaKvStore::block_table(SeqId s) const { return seq(s).blocks; }

void CudaKvStore::set_sequence(SeqId s, std::vector<int> blocks, int length) {
  if (!external_) throw KvStoreError("cuda kv store: set_sequence is for views (the store allocates its own pages)");
  Sequence& q = seq(s);
  const int B = cfg_.block_size;
  if (length < 0 || static_cast<long long>(blocks.size()) * B < length)
    throw KvStoreError("cuda kv store view: a table of " + std::to_string(blocks.size()) + " pages cannot hold " +
                       std::to_string(length) + " tokens");
  std::size_t released = 0;
  while (released < blocks.size() && blocks[released] == kReleasedBlock) ++released;
  for (std::size_t i = released; i < blocks.size(); ++i)
    if (blocks[i] < 0 || blocks[i] >= cfg_.n_blocks)
      throw KvStoreError("cuda kv store view: page " + std::to_string(blocks[i]) + " is outside the view's " +
                         std::to_string(cfg_.n_blocks) + " pages");
  q.blocks = std::move(blocks);
  q.length = length;
  q.released = static_cast<int>(released);
}

void CudaKvStore::upload_page(int layer, KvHalf h, int block, const std::uint8_t* src, cudaStream_t stream) {
  if (layer < 0 || layer >= cfg_.n_layers || block < 0 || block >= cfg_.n_blocks)
    throw KvStoreError("cuda kv store: upload of page " + std::to_string(block) + " layer " + std::to_string(layer) +
                       " is outside the pool");
  KVGATE_CUDA_CHECK(cudaMemcpyAsync(pool(layer, h) + static_cast<std::size_t>(block) * page_stride(h), src, page_bytes(h),
                                    cudaMemcpyHostToDevice, stream));
}

void CudaKvStore::download_runs(int layer, KvHalf h, int block, std::span<const ByteRun> runs, std::uint8_t* dst,
                                cudaStream_t stream) const {
  if (layer < 0 || layer >= cfg_.n_layers || block < 0 || block >= cfg_.n_blocks)
    throw KvStoreError("cuda kv store: download of page " + std::to_string(block) + " layer " + std::to_string(layer) +
                       " is outside the pool");
  const std::uint8_t* page = pool(layer, h) + static_cast<std::size_t>(block) * page_stride(h);
  for (const ByteRun& r : runs) {
    if (r.offset + r.bytes > page_bytes(h)) throw KvStoreError("cuda kv store: run '" + r.name + "' ends past the page");
    KVGATE_CUDA_CHECK(
        cudaMemcpyAsync(dst + r.offset, page + r.offset, r.bytes, cudaMemcpyDeviceToHost, stream));
  }
}

int CudaKvStore::extend(SeqId s, int n) {
  Sequence& q = seq(s);
  if (n < 0) throw KvStoreError("cuda kv store: extend by a negative count");
  const int B = cfg_.block_size;
  const int need = (q.length + n + B - 1) / B;
  const int missing = need - static_cast<int>(q.blocks.size());
  if (missing > free_blocks())
    throw KvStoreError("cuda kv store: out of KV blocks: sequence " + std::to_string(s) + " needs " +
                       std::to_string(missing) + " more, " + std::to_string(free_blocks()) + " free");
  for (int i = 0; i < missing; ++i) {
    q.blocks.push_back(free_list_.back());
    free_list_.pop_back();
  }
  const int pos0 = q.length;
  q.length += n;
  return pos0;
}

void* CudaKvStore::scratch(int which, std::size_t bytes) {
  if (bytes > scratch_bytes_[which]) {
    if (scratch_[which]) KVGATE_CUDA_CHECK(cudaFree(scratch_[which]));
    scratch_[which] = nullptr;
    scratch_bytes_[which] = 0;
    KVGATE_CUDA_CHECK(cudaMalloc(&scratch_[which], bytes));
    scratch_bytes_[which] = bytes;
  }
  return scratch_[which];
}

void CudaKvStore::write(SeqId s, int layer, int pos0, int n, const float* d_k, std::size_t k_stride, const float* d_v,
                        std::size_t v_stride, cudaStream_t stream) {
  const Sequence& q = seq(s);
  if (layer < 0 || layer >= cfg_.n_layers || pos0 < 0 || n < 0 || pos0 + n > q.length)
    throw KvStoreError("cuda kv store: write of positions [" + std::to_string(pos0) + ", " + std::to_string(pos0 + n) +
                       ") layer " + std::to_string(layer) + " is outside the sequence (length " +
                       std::to_string(q.length) + ")");
  if (n == 0) return;
  check_kept(s, q, pos0, "write");
  const int B = cfg_.block_size;
  std::vector<int> map(static_cast<std::size_t>(n));
  for (int t = 0; t < n; ++t) {
    const int pos = pos0 + t;
    map[static_cast<std::size_t>(t)] = q.blocks[static_cast<std::size_t>(pos / B)] * B + pos % B;
  }
  auto* d_map = static_cast<int*>(scratch(0, map.size() * sizeof(int)));
  KVGATE_CUDA_CHECK(cudaMemcpyAsync(d_map, map.data(), map.size() * sizeof(int), cudaMemcpyHostToDevice, stream));
  for (KvHalf h : {KvHalf::K, KvHalf::V}) {
    const PageGeometry g = cfg_.half_geometry(h);  // the latent layout's V half: the RoPE key's width
    StoreRowsArgs a;
    a.rows = h == KvHalf::K ? d_k : d_v;
    a.row_stride = h == KvHalf::K ? k_stride : v_stride;
    a.slot_mapping = d_map;
    a.n_tokens = n;
    a.pool = pool(layer, h);
    a.page_stride = page_stride(h);
    const KernelScales ks = kernel_scales(layer, h);
    a.tensor_scale = ks.tensor;
    a.head_scales = ks.heads;
    store_rows(half_format(h), g, a, stream);
  }
  // The pageable-memory copy above returned after staging; the map vector may go.
}

void CudaKvStore::write_host(SeqId s, int layer, int pos0, int n, const float* k, std::size_t k_stride, const float* v,
                             std::size_t v_stride) {
  if (n <= 0) return;
  const std::size_t HDk = cfg_.half_geometry(KvHalf::K).row_elems(), HDv = cfg_.half_geometry(KvHalf::V).row_elems();
  const std::size_t kb = ((static_cast<std::size_t>(n) - 1) * k_stride + HDk) * sizeof(float);
  const std::size_t vb = ((static_cast<std::size_t>(n) - 1) * v_stride + HDv) * sizeof(float);
  auto* dk = static_cast<float*>(scratch(1, kb));
  auto* dv = static_cast<float*>(scratch(2, vb));
  KVGATE_CUDA_CHECK(cudaMemcpy(dk, k, kb, cudaMemcpyHostToDevice));
  KVGATE_CUDA_CHECK(cudaMemcpy(dv, v, vb, cudaMemcpyHostToDevice));
  write(s, layer, pos0, n, dk, k_stride, dv, v_stride, nullptr);
  KVGATE_CUDA_CHECK(cudaDeviceSynchronize());
}

std::vector<std::uint8_t> CudaKvStore::download_page(int layer, KvHalf h, int block) const {
  std::vector<std::uint8_t> out(page_bytes(h));
  KVGATE_CUDA_CHECK(cudaMemcpy(out.data(), pool(layer, h) + static_cast<std::size_t>(block) * page_stride(h), out.size(),
                               cudaMemcpyDeviceToHost));
  return out;
}

std::size_t CudaKvStore::pool_bytes() const {
  return static_cast<std::size_t>(cfg_.n_blocks) * cfg_.n_layers * (page_bytes_[0] + page_bytes_[1]);
}

std::pair<int*, int*> CudaKvStore::upload_row_tables(std::span<const SeqId> seqs, const std::vector<int>& lens,
                                                     int max_pages, cudaStream_t stream) {
  std::vector<int> tables(seqs.size() * static_cast<std::size_t>(max_pages), 0);
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& q = seq(seqs[i]);
    kernel_table(q.blocks, tables.data() + static_cast<std::ptrdiff_t>(i) * max_pages, q.blocks.size());
  }
  auto* d_tables = static_cast<int*>(scratch(3, (tables.size() + lens.size()) * sizeof(int)));
  int* d_lens = d_tables + tables.size();
  // Pageable host memory: each copy has staged its bytes when it returns, so the vectors may go.
  KVGATE_CUDA_CHECK(cudaMemcpyAsync(d_tables, tables.data(), tables.size() * sizeof(int), cudaMemcpyHostToDevice, stream));
  KVGATE_CUDA_CHECK(cudaMemcpyAsync(d_lens, lens.data(), lens.size() * sizeof(int), cudaMemcpyHostToDevice, stream));
  return {d_tables, d_lens};
}

DecodePlan CudaKvStore::decode(std::span<const SeqId> seqs, int layer, int n_heads, const float* d_q, float* d_out,
                               DecodeWorkspace& ws, float softmax_scale, int num_splits, cudaStream_t stream,
                               int window, float softcap) {
  refuse_latent("decode attention");
  const int batch = static_cast<int>(seqs.size());
  int max_pages = 1, max_len = 1;
  for (SeqId s : seqs) {
    const Sequence& q = seq(s);
    if (q.length < 1) throw KvStoreError("cuda kv store: decode over an empty sequence " + std::to_string(s));
    max_pages = std::max(max_pages, static_cast<int>(q.blocks.size()));
    max_len = std::max(max_len, q.length);
  }
  std::vector<int> lens(static_cast<std::size_t>(batch));
  for (int i = 0; i < batch; ++i) {
    const SeqId s = seqs[static_cast<std::size_t>(i)];
    const Sequence& q = seq(s);
    check_kept(s, q, window > 0 ? std::max(0, q.length - window) : 0, "decode attention");
    lens[static_cast<std::size_t>(i)] = q.length;
  }
  const auto [d_tables, d_lens] = upload_row_tables(seqs, lens, max_pages, stream);
  DecodeArgs a;
  a.format = cfg_.format;
  a.geometry = geometry();
  a.n_heads = n_heads;
  a.batch = batch;
  a.k_pool = pool(layer, KvHalf::K);
  a.v_pool = pool(layer, KvHalf::V);
  a.k_page_stride = page_stride(KvHalf::K);
  a.v_page_stride = page_stride(KvHalf::V);
  a.block_tables = d_tables;
  a.table_stride = max_pages;
  a.seq_lens = d_lens;
  a.max_seq_len = max_len;
  a.q = d_q;
  a.out = d_out;
  set_kernel_scales(*this, layer, a);
  a.softmax_scale = softmax_scale;
  a.num_splits = num_splits;
  a.window = window;
  a.softcap = softcap;
  a.bytes_read = d_bytes_read_;  // null unless set_read_counter(true)
  return decode_attention(a, ws, stream);
}

std::string CudaKvStore::prefill(SeqId s, int layer, int n_heads, int pos0, int n_new, const float* d_q, float* d_out,
                                 float softmax_scale, cudaStream_t stream, int window, float softcap) {
  refuse_latent("prefill attention");
  const Sequence& q = seq(s);
  if (layer < 0 || layer >= cfg_.n_layers || pos0 < 0 || n_new < 1 || pos0 + n_new > q.length)
    throw KvStoreError("cuda kv store: prefill of positions [" + std::to_string(pos0) + ", " +
                       std::to_string(pos0 + n_new) + ") layer " + std::to_string(layer) +
                       " is outside the sequence (length " + std::to_string(q.length) + ") or empty");
  // The kernel reads pages [0, ceil((pos0 + n_new) / block_size)) of the table. The table shares
  // scratch slot 3 with decode(): like decode, one call at a time per store (same stream).
  const std::size_t n_pages = (static_cast<std::size_t>(pos0) + n_new + cfg_.block_size - 1) / cfg_.block_size;
  check_kept(s, q, prefill_first_key(pos0, window), "prefill attention");
  std::vector<int> table(n_pages);
  kernel_table(q.blocks, table.data(), n_pages);
  auto* d_table = static_cast<int*>(scratch(3, n_pages * sizeof(int)));
  KVGATE_CUDA_CHECK(cudaMemcpyAsync(d_table, table.data(), n_pages * sizeof(int), cudaMemcpyHostToDevice, stream));
  PrefillArgs a;
  a.format = cfg_.format;
  a.geometry = geometry();
  a.n_heads = n_heads;
  a.k_pool = pool(layer, KvHalf::K);
  a.v_pool = pool(layer, KvHalf::V);
  a.k_page_stride = page_stride(KvHalf::K);
  a.v_page_stride = page_stride(KvHalf::V);
  a.block_table = d_table;
  a.n_past = pos0;
  a.n_new = n_new;
  a.q = d_q;
  a.out = d_out;
  set_kernel_scales(*this, layer, a);
  a.softmax_scale = softmax_scale;
  a.window = window;
  a.softcap = softcap;
  prefill_attention(a, stream);
  if (window > 0) return "prefill(fp32)";  // windowed calls stay on the CUDA-core kernel (prefill_mma.cu)
  return supports_op(Op::prefill, a.format, a.geometry, n_heads).path;  // the kernel that ran
}

void CudaKvStore::refuse_latent(const char* what) const {
  if (cfg_.layout == KvLayout::mla_latent)
    throw KvStoreError(std::string("cuda kv store: ") + what + " reads K/V heads, but this store holds the MLA latent "
                       "cache (layout mla_latent): read it with mla_attention (the weight-absorbed form)");
}

DecodePlan CudaKvStore::mla_attention(std::span<const SeqId> seqs, std::span<const int> lens, int layer, int n_heads,
                                      const float* d_q, float* d_out, DecodeWorkspace& ws, float softmax_scale,
                                      int num_splits, cudaStream_t stream) {
  if (cfg_.layout != KvLayout::mla_latent)
    throw KvStoreError(std::string("cuda kv store: mla_attention reads the MLA latent cache, but this store's layout is ") +
                       name(cfg_.layout) + ": read it with decode() / prefill()");
  if (layer < 0 || layer >= cfg_.n_layers)
    throw KvStoreError("cuda kv store: layer " + std::to_string(layer) + " is out of range (n_layers " +
                       std::to_string(cfg_.n_layers) + ")");
  if (!lens.empty() && lens.size() != seqs.size())
    throw KvStoreError("cuda kv store: mla_attention got " + std::to_string(lens.size()) + " lengths for " +
                       std::to_string(seqs.size()) + " rows");
  const int rows = static_cast<int>(seqs.size());
  int max_pages = 1, max_len = 1;
  std::vector<int> row_len(seqs.size());
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& q = seq(seqs[i]);
    const int n = lens.empty() ? q.length : lens[i];
    if (n < 1 || n > q.length)
      throw KvStoreError("cuda kv store: mla_attention row " + std::to_string(i) + " reads " + std::to_string(n) +
                         " keys of sequence " + std::to_string(seqs[i]) + " (length " + std::to_string(q.length) +
                         "): a row reads 1 .. length keys");
    check_kept(seqs[i], q, 0, "latent attention");
    row_len[i] = n;
    max_pages = std::max(max_pages, static_cast<int>(q.blocks.size()));
    max_len = std::max(max_len, n);
  }
  const auto [d_tables, d_lens] = upload_row_tables(seqs, row_len, max_pages, stream);
  MlaDecodeArgs a;
  a.format = cfg_.format;
  a.block_size = cfg_.block_size;
  a.kv_lora = cfg_.head_dim;
  a.rope = cfg_.half_geometry(KvHalf::V).head_dim;
  a.n_heads = n_heads;
  a.rows = rows;
  a.k_pool = pool(layer, KvHalf::K);
  a.v_pool = pool(layer, KvHalf::V);
  a.k_page_stride = page_stride(KvHalf::K);
  a.v_page_stride = page_stride(KvHalf::V);
  a.block_tables = d_tables;
  a.table_stride = max_pages;
  a.seq_lens = d_lens;
  a.max_seq_len = max_len;
  a.q = d_q;
  a.out = d_out;
  a.k_scale = tensor_scale(layer, KvHalf::K);
  a.v_scale = tensor_scale(layer, KvHalf::V);
  a.softmax_scale = softmax_scale;
  a.num_splits = num_splits;
  a.bytes_read = d_bytes_read_;  // null unless set_read_counter(true)
  return mla_decode_attention(a, ws, stream);
}

}  // namespace kvgate::cuda
