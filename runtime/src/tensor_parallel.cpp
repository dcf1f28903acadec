// Tensor parallelism of the CPU forward pass (kvgate/tensor_parallel.hpp): every rank is a
// CpuForward over a sliced copy of the model and its own store; the all-reduce sums the ranks'
// block outputs in rank order.
#include "kvgate/tensor_parallel.hpp"

#include <cstring>
#include <string>

#include "forward_cpu.hpp"
#include "kvgate/engine.hpp"
#include "thread_pool.hpp"

namespace kvgate {

namespace {

// Rows [r0, r0 + n) of a [rows][cols] matrix, as FP32 (16-bit storage converted exactly: the same
// dot products, bit for bit, as the CPU forward's own conversion).
Weight rows_of(const Weight& w, int r0, int n, int cols) {
  std::vector<float> out(static_cast<std::size_t>(n) * static_cast<std::size_t>(cols));
  w.view().to_f32(static_cast<std::size_t>(r0) * static_cast<std::size_t>(cols), out.size(), out.data());
  return Weight(std::move(out));
}

// Columns [c0, c0 + n) of a [rows][cols] matrix, as FP32.
Weight cols_of(const Weight& w, int rows, int cols, int c0, int n) {
  std::vector<float> out(static_cast<std::size_t>(rows) * static_cast<std::size_t>(n));
  const WeightView v = w.view();
  for (int i = 0; i < rows; ++i)
    v.to_f32(static_cast<std::size_t>(i) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c0),
             static_cast<std::size_t>(n), out.data() + static_cast<std::size_t>(i) * static_cast<std::size_t>(n));
  return Weight(std::move(out));
}

std::vector<float> range_of(const std::vector<float>& v, int first, int n) {
  if (v.empty()) return v;
  return {v.begin() + first, v.begin() + first + n};
}

// Per-KV-head scales [n_layers * H] (layer-major) of the heads [h0, h0 + n): the rank's; a per-layer
// or per-tensor list is the same for every rank.
std::vector<float> head_scales_of(const std::vector<float>& s, int n_layers, int H, int h0, int n) {
  if (s.size() != static_cast<std::size_t>(n_layers) * static_cast<std::size_t>(H) || H == n) return s;
  std::vector<float> out;
  for (int l = 0; l < n_layers; ++l)
    for (int h = h0; h < h0 + n; ++h) out.push_back(s[static_cast<std::size_t>(l) * H + h]);
  return out;
}

}  // namespace

Model tensor_parallel_model(const Model& m, int ranks, int r) {
  const ModelConfig& c = m.config;
  const TpSlice sl = tensor_parallel_slice(c, ranks, r);
  const int hd = c.head_dim, dim = c.dim;
  Model s;
  s.path = m.path;
  s.source_kind = m.source_kind;
  s.fingerprint = m.fingerprint;
  s.config = c;
  s.config.n_heads = sl.q_heads;
  s.config.n_kv_heads = sl.kv_heads;
  s.config.hidden_dim = sl.ffn;
  s.config.k_scale = head_scales_of(c.k_scale, c.n_layers, c.n_kv_heads, sl.kv_head0, sl.kv_heads);
  s.config.v_scale = head_scales_of(c.v_scale, c.n_layers, c.n_kv_heads, sl.kv_head0, sl.kv_heads);
  s.weights.tok_embeddings = m.weights.tok_embeddings;
  s.weights.classifier = m.weights.classifier;
  s.weights.final_norm = m.weights.final_norm;
  for (const LayerWeights& L : m.weights.layers) {
    LayerWeights o;
    o.attn_norm = L.attn_norm;
    o.ffn_norm = L.ffn_norm;
    o.post_attn_norm = L.post_attn_norm;
    o.post_ffn_norm = L.post_ffn_norm;
    o.q_norm = L.q_norm;
    o.k_norm = L.k_norm;
    // Column split (outputs): the rank's heads' rows of Wq/Wk/Wv, the FFN rows of W1/W3.
    o.wq = rows_of(L.wq, sl.q_head0 * hd, sl.q_heads * hd, dim);
    o.wk = rows_of(L.wk, sl.kv_head0 * hd, sl.kv_heads * hd, dim);
    o.wv = rows_of(L.wv, sl.kv_head0 * hd, sl.kv_heads * hd, dim);
    o.bq = range_of(L.bq, sl.q_head0 * hd, sl.q_heads * hd);
    o.bk = range_of(L.bk, sl.kv_head0 * hd, sl.kv_heads * hd);
    o.bv = range_of(L.bv, sl.kv_head0 * hd, sl.kv_heads * hd);
    o.w1 = rows_of(L.w1, sl.ffn0, sl.ffn, dim);
    o.w3 = rows_of(L.w3, sl.ffn0, sl.ffn, dim);
    // Row split (inputs): the columns of Wo that read the rank's heads, of W2 that read its FFN rows.
    o.wo = cols_of(L.wo, dim, c.q_dim(), sl.q_head0 * hd, sl.q_heads * hd);
    o.w2 = cols_of(L.w2, dim, c.hidden_dim, sl.ffn0, sl.ffn);
    s.weights.layers.push_back(std::move(o));
  }
  return s;
}

std::string tensor_parallel_refusal(const ModelConfig& c, int ranks) {
  const std::string n = std::to_string(ranks);
  if (ranks < 1) return "--tp " + n + ": give 1 (no split) or more ranks";
  if (c.mla.any()) return "latent attention (MLA) layers are not split by tensor parallelism in this version";
  if (c.moe.any()) return "mixture-of-experts layers are not split by tensor parallelism in this version";
  if (c.n_kv_heads % ranks != 0)
    return "--tp " + n + " does not divide the model's " + std::to_string(c.n_kv_heads) +
           " KV heads (each rank holds whole KV heads and their query heads): give a divisor of " +
           std::to_string(c.n_kv_heads);
  if (c.n_heads % c.n_kv_heads != 0)
    return "the model's " + std::to_string(c.n_heads) + " query heads are not a multiple of its " +
           std::to_string(c.n_kv_heads) + " KV heads";
  if (c.hidden_dim % ranks != 0)
    return "--tp " + n + " does not divide the FFN width " + std::to_string(c.hidden_dim) + ": give a divisor of it";
  return "";
}

TpSlice tensor_parallel_slice(const ModelConfig& c, int ranks, int r) {
  TpSlice s;
  s.kv_heads = c.n_kv_heads / ranks;
  s.kv_head0 = r * s.kv_heads;
  s.q_heads = c.n_heads / ranks;
  s.q_head0 = r * s.q_heads;
  s.ffn = c.hidden_dim / ranks;
  s.ffn0 = r * s.ffn;
  return s;
}

StoreConfig tensor_parallel_store_config(const StoreConfig& full, const ModelConfig& c, int ranks, int r) {
  const TpSlice s = tensor_parallel_slice(c, ranks, r);
  StoreConfig sc = full;
  sc.n_kv_heads = s.kv_heads;
  sc.k_scale = head_scales_of(full.k_scale, full.n_layers, full.n_kv_heads, s.kv_head0, s.kv_heads);
  sc.v_scale = head_scales_of(full.v_scale, full.n_layers, full.n_kv_heads, s.kv_head0, s.kv_heads);
  return sc;
}

std::string tensor_parallel_file_refusal(const StoreConfig& full, const ModelConfig& c, int ranks) {
  for (int r = 0; r < ranks; ++r) {
    const TpSlice sl = tensor_parallel_slice(c, ranks, r);
    for (const KvHalf h : {KvHalf::K, KvHalf::V}) {
      const HalfFormat hf = h == KvHalf::K ? full.format.k : full.format.v;
      if (const std::string why = head_slice_refusal(hf, full.half_geometry(h), sl.kv_head0, sl.kv_heads); !why.empty())
        return "the " + std::string(name(hf)) + (h == KvHalf::K ? " K" : " V") + " half: " + why;
    }
  }
  return "";
}

void gather_rank_pages(std::span<const KvStageView> ranks, const ModelConfig& c, PagedKvStore& full, SeqId fseq, int n) {
  full.extend(fseq, n);
  const std::span<const int> blocks = full.block_table(fseq);
  const int N = static_cast<int>(ranks.size());
  for (int r = 0; r < N; ++r) {
    const TpSlice sl = tensor_parallel_slice(c, N, r);
    const KvStageView& rk = ranks[static_cast<std::size_t>(r)];
    rk.store->export_pages(rk.seq, n, [&](const PagedKvStore::PageRef& p, const std::uint8_t* page) {
      place_head_slice(full.half_format(p.half), full.half_geometry(p.half), sl.kv_head0, sl.kv_heads, page,
                       full.page(p.layer, p.half, blocks[static_cast<std::size_t>(p.page)]));
    });
  }
}

void scatter_rank_pages(const PagedKvStore& full, SeqId fseq, int n, const ModelConfig& c,
                        std::span<const KvStageTarget> ranks) {
  const std::span<const int> blocks = full.block_table(fseq);
  const int N = static_cast<int>(ranks.size());
  for (int r = 0; r < N; ++r) {
    const TpSlice sl = tensor_parallel_slice(c, N, r);
    const KvStageTarget& rk = ranks[static_cast<std::size_t>(r)];
    rk.store->import_pages(rk.seq, n, [&](const PagedKvStore::PageRef& p, std::uint8_t* page) {
      copy_head_slice(full.half_format(p.half), full.half_geometry(p.half), sl.kv_head0, sl.kv_heads,
                      full.host_page(p.layer, p.half, blocks[static_cast<std::size_t>(p.page)]), page);
    });
  }
}

struct TensorParallelForward::Impl {
  struct Rank {
    Model model;
    PagedKvStore store;
    SeqId seq;
    detail::CpuForward fwd;
    std::vector<float> partial;  // [max_chunk][dim]: this rank's share of the last block
    Rank(Model m, StoreConfig sc, int chunk, detail::ThreadPool& pool)
        : model(std::move(m)), store(std::move(sc)), seq(store.create_sequence()), fwd(model, chunk, pool) {}
  };
  const Model& m;
  int n;
  std::unique_ptr<detail::ThreadPool> own_pool;  // when the caller gave a thread count, not its pool
  std::vector<std::unique_ptr<Rank>> ranks;
  std::vector<float> sum;  // [max_chunk][dim]: the all-reduced block output

  Impl(const Model& model, int n_ranks, const StoreConfig& full, int chunk, detail::ThreadPool* shared, int threads)
      : m(model), n(n_ranks), own_pool(shared ? nullptr : std::make_unique<detail::ThreadPool>(threads)) {
    detail::ThreadPool& pool = shared ? *shared : *own_pool;
    if (const std::string why = tensor_parallel_refusal(m.config, n); !why.empty())
      throw EngineError("engine: tensor parallelism (--tp " + std::to_string(n) + "): " + why);
    const std::size_t rows = static_cast<std::size_t>(chunk) * static_cast<std::size_t>(m.config.dim);
    for (int r = 0; r < n; ++r) {
      ranks.push_back(std::make_unique<Rank>(tensor_parallel_model(m, n, r), tensor_parallel_store_config(full, m.config, n, r),
                                             chunk, pool));
      ranks.back()->partial.resize(rows);
    }
    sum.resize(rows);
  }

  // The all-reduce: the ranks' partials summed in rank order into `sum`.
  void all_reduce(int T) {
    const std::size_t count = static_cast<std::size_t>(T) * static_cast<std::size_t>(m.config.dim);
    for (auto& rk : ranks) std::memcpy(rk->partial.data(), rk->fwd.block_output(), sizeof(float) * count);
    std::memcpy(sum.data(), ranks[0]->partial.data(), sizeof(float) * count);
    for (int r = 1; r < n; ++r) {
      const float* p = ranks[static_cast<std::size_t>(r)]->partial.data();
      for (std::size_t i = 0; i < count; ++i) sum[i] += p[i];
    }
  }
};

TensorParallelForward::TensorParallelForward(const Model& m, int ranks, const StoreConfig& full, int max_chunk,
                                             detail::ThreadPool& pool)
    : impl_(std::make_unique<Impl>(m, ranks, full, max_chunk, &pool, 0)) {}
TensorParallelForward::TensorParallelForward(const Model& m, int ranks, const StoreConfig& full, int max_chunk,
                                             int threads)
    : impl_(std::make_unique<Impl>(m, ranks, full, max_chunk, nullptr, threads)) {}
TensorParallelForward::~TensorParallelForward() = default;

int TensorParallelForward::ranks() const { return impl_->n; }
TpSlice TensorParallelForward::slice(int r) const { return tensor_parallel_slice(impl_->m.config, impl_->n, r); }
const Model& TensorParallelForward::rank_model(int r) const { return impl_->ranks.at(static_cast<std::size_t>(r))->model; }
PagedKvStore& TensorParallelForward::store(int r) { return impl_->ranks.at(static_cast<std::size_t>(r))->store; }
const PagedKvStore& TensorParallelForward::store(int r) const { return impl_->ranks.at(static_cast<std::size_t>(r))->store; }
SeqId TensorParallelForward::sequence(int r) const { return impl_->ranks.at(static_cast<std::size_t>(r))->seq; }

void TensorParallelForward::reset_sequences() {
  for (auto& rk : impl_->ranks) {
    rk->store.free_sequence(rk->seq);
    rk->seq = rk->store.create_sequence();
  }
}

int TensorParallelForward::begin_chunk(const int* tokens, int T) {
  Impl& d = *impl_;
  d.ranks[0]->fwd.check_chunk(tokens, T);
  const int pos0 = d.ranks[0]->store.length(d.ranks[0]->seq);
  for (auto& rk : d.ranks) {
    if (rk->store.extend(rk->seq, T) != pos0)
      throw EngineError("engine: a tensor-parallel rank's sequence is out of step with rank 0's");
    rk->fwd.embed(tokens, T, pos0);
  }
  return pos0;
}

void TensorParallelForward::attention(int l, int T, int pos0) {
  for (auto& rk : impl_->ranks) rk->fwd.attention_block(rk->store, rk->seq, l, l, T, pos0);
  impl_->all_reduce(T);
}

void TensorParallelForward::ffn(int l, int T) {
  for (auto& rk : impl_->ranks) rk->fwd.ffn_block(l, T);
  impl_->all_reduce(T);
}

void TensorParallelForward::add_block(int l, bool attention_block, int T, int pos0) {
  Impl& d = *impl_;
  const ModelConfig& c = d.m.config;
  const LayerWeights& L = d.m.weights.layers[static_cast<std::size_t>(l)];
  const float* post = !c.post_norms ? nullptr : attention_block ? L.post_attn_norm.data() : L.post_ffn_norm.data();
  const std::size_t count = static_cast<std::size_t>(T) * static_cast<std::size_t>(c.dim);
  for (auto& rk : d.ranks) {
    std::memcpy(rk->fwd.block_output(), d.sum.data(), sizeof(float) * count);
    rk->fwd.add_block(post, T);
    if (!attention_block) rk->fwd.check_finite(l, T, pos0);
  }
}

void TensorParallelForward::head(int T, float* logits, bool all_logits) { impl_->ranks[0]->fwd.head(T, logits, all_logits); }

void TensorParallelForward::forward(const int* tokens, int T, float* logits, bool all_logits) {
  const int pos0 = begin_chunk(tokens, T);
  for (int l = 0; l < impl_->m.config.n_layers; ++l) {
    attention(l, T, pos0);
    add_block(l, true, T, pos0);
    ffn(l, T);
    add_block(l, false, T, pos0);
  }
  head(T, logits, all_logits);
}

const float* TensorParallelForward::block_sum() const { return impl_->sum.data(); }
const float* TensorParallelForward::partial(int r) const { return impl_->ranks.at(static_cast<std::size_t>(r))->partial.data(); }
const float* TensorParallelForward::attention_rows(int r) const {
  return impl_->ranks.at(static_cast<std::size_t>(r))->fwd.attention_rows();
}
const float* TensorParallelForward::ffn_hidden(int r) const { return impl_->ranks.at(static_cast<std::size_t>(r))->fwd.ffn_hidden(); }
const float* TensorParallelForward::residual(int r) const {
  return impl_->ranks.at(static_cast<std::size_t>(r))->fwd.activations();
}
void TensorParallelForward::set_residual(const float* x, int T) {
  for (auto& rk : impl_->ranks) rk->fwd.set_residual(x, T);
}

}  // namespace kvgate
