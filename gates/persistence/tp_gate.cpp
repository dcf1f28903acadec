// PAR.tp.*: tensor parallelism of the CPU engine (EngineOptions::tensor_parallel,
// kvgate/tensor_parallel.hpp), laid out as a multi-GPU split of every layer: each rank holds its
// query/KV heads (with its own KV store) and FFN rows, and an all-reduce sums the ranks' block outputs.
//   PAR.tp.<fmt>      2 and 4 ranks on a synth GQA model (8 query / 4 KV heads of 32, FFN 512):
//                     (a) anchor: one rank (TensorParallelForward, N = 1) gives bitwise the unsplit
//                         engine's logits at every prompt position and decode step;
//                     (b) teacher forcing: before each block the split pass is handed the unsplit
//                         pass's residual stream; then every rank's attention outputs and FFN hidden
//                         rows are bitwise the unsplit ones' slices, each block's all-reduced output
//                         is within the derived bound of the unsplit one, and after the run each
//                         rank's store holds, bitwise, its KV heads' slice of the unsplit rows;
//                     (c) the engine: the ranks' pools add up to the unsplit pool, each rank holds
//                         its heads, stats say "tensor:N".
//   PAR.tp.stream.<fmt>  --tp 2 streamed (windows of 3 and 8 tokens) == --tp 2 resident, bitwise;
//                     every rank streams (misses on each) and after every step each rank's device
//                     copies equal its host mirror.
//   PAR.tp.persist.<fmt>  KV files (conversations) with --tp: the ranks' pages are gathered into an
//                     unsplit staging store and saved through the unsplit writer; a hydrate restores
//                     the file into a staging store and scatters each rank's head slice into its store.
//                     (a) an unsplit engine's file hydrated into --tp 2 and --tp 4 and saved again ==
//                         the file, byte for byte;
//                     (b) a --tp 2 engine's file hydrated into an unsplit engine and saved again ==
//                         the --tp 2 file; that file hydrated into --tp 2 (resident, and streamed)
//                         continues (a chunk of new tokens, decode steps) bitwise as the uninterrupted
//                         --tp 2 engine;
//                     (c) after a --tp hydrate each rank's store holds, bitwise (dequantized rows),
//                         its KV heads' slice of the unsplit engine's hydrated rows.
//                     Anti-vacuity: the files hold more than one page per layer and non-zero bytes;
//                     a byte flipped in rank 1's store after a hydrate changes the saved file; the
//                     --tp 2 file differs from the unsplit engine's own for the same prompt (the
//                     all-reduce reassociates later layers' inputs; printed, not required).
//                     Bound: zero, bitwise -- the file's bytes are moved between pages (memcpy of each
//                     head range, copy_head_slice / place_head_slice in runtime/src/format.cpp), never
//                     recomputed; runtime_unit's head_slice test shows that a rank page quantized from
//                     its heads alone is byte for byte that head range of the unsplit page, for every
//                     half format.
//   PAR.tp.archs      (b) on the transformers references Gemma 3 (post-norms, sliding layers,
//                     soft-caps), Qwen3 (QK-norm) and Qwen2 (qkv bias) with --tp 2.
//   PAR.tp.options    refusals (ranks that do not divide the KV heads or the FFN, --pp, --kv-layers,
//                     MoE and MLA models) name the option and the fix; a KV file that does not match
//                     the run is refused by a --tp engine before its ranks are touched.
//
// Bound of (b), derived: a block output element is y_i = sum_j a_j w_ij over n terms (n = q_dim for
// attention, the FFN width for the FFN), with the same a on both sides (checked bitwise). Any float
// summation order of n products is within gamma(n) S of the exact sum, S = sum_j |a_j w_ij|
// (gamma(n) = n u / (1 - n u), u = 2^-24; Higham, Accuracy and Stability, 3.1). The unsplit pass
// is one such order; the split pass sums n/N products per rank (gamma(n/N) S_r) and then N partials
// (gamma(N-1) sum_r |partial_r|), within gamma(n/N + N - 1) S of the exact sum. So
// |y_split - y_unsplit| <= (gamma(n) + gamma(n/N + N - 1)) S, computed per element in FP64.
// Free-running logits are not compared: rounding differences grow through the layers by an
// amount no bound here derives; the teacher-forced blocks pin every operation of the split.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "hf_arch_ref.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate/tensor_parallel.hpp"
#include "par_common.hpp"

using namespace kvgate;
using namespace kvgate::par;

namespace {

constexpr int kSteps = 8;
constexpr int kChunk = 7;

// A GQA model with 4 KV heads of 32 (32-blocks inside a head), so 2 and 4 ranks split it.
const Model& synth_tp() { return gates::synth_model_once("tp", gates::synth_tp_options()); }

const Model& hf_ref(const char* name) {
  static std::map<std::string, std::unique_ptr<Model>> cache;
  auto& m = cache[name];
  if (!m) m = std::make_unique<Model>(gates::hf_arch::load_network(gates::hf_arch::refs_root() / name));
  return *m;
}

bool is_fp8(const KvFormat& f) {
  return f.k == HalfFormat::fp8_e4m3 || f.k == HalfFormat::fp8_e5m2 || f.v == HalfFormat::fp8_e4m3 ||
         f.v == HalfFormat::fp8_e5m2;
}

// Engine options; fp8 halves get distinct scales per (layer, KV head), so a rank reading another
// rank's heads' scales changes its codes.
EngineOptions tp_options(const Model& m, const KvFormat& f, int ranks, int resident = 0, int block_size = 16) {
  EngineOptions o = options(m, f, resident, block_size);
  o.prefill_chunk = kChunk;
  o.tensor_parallel = ranks;
  if (is_fp8(f) && f.k != HalfFormat::nvfp4 && f.v != HalfFormat::nvfp4) {
    const int L = m.config.n_layers, H = m.config.n_kv_heads;
    o.k_scale.clear();
    o.v_scale.clear();
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        o.k_scale.push_back(0.31f + 0.07f * static_cast<float>(l) + 0.05f * static_cast<float>(h));
        o.v_scale.push_back(0.017f * static_cast<float>(1 + l) * (1.0f + 0.25f * static_cast<float>(h)));
      }
  }
  return o;
}

std::vector<std::vector<float>> engine_logits(Engine& e, std::span<const int> prompt) {
  std::vector<std::vector<float>> out;
  const std::vector<float> all = e.forward_all_logits(prompt);
  const std::size_t V = static_cast<std::size_t>(e.vocab_size());
  for (std::size_t i = 0; i < prompt.size(); ++i)
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(i * V), all.begin() + static_cast<std::ptrdiff_t>((i + 1) * V));
  int tok = argmax(out.back());
  for (int s = 0; s < kSteps; ++s) {
    out.push_back(e.decode(tok));
    tok = argmax(out.back());
  }
  return out;
}

double gamma_of(double n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1.0 - n * u);
}

// Slice [c0, c0 + n) of every row of a [T][cols] matrix.
std::vector<float> columns(const float* a, int T, int cols, int c0, int n) {
  std::vector<float> out;
  for (int t = 0; t < T; ++t)
    out.insert(out.end(), a + static_cast<std::ptrdiff_t>(t) * cols + c0, a + static_cast<std::ptrdiff_t>(t) * cols + c0 + n);
  return out;
}

struct BlockStats {
  double worst_ratio = 0;   // max |y_split - y_unsplit| / bound
  double max_out = 0;       // max |y|
  double max_bound = 0;     // max bound
  long long elements = 0;
};

// |y_split - y_unsplit| <= (gamma(n) + gamma(n/N + N - 1)) S per element; a = the block's input rows
// [T][n] (equal on both sides), W = [dim][n].
void check_block(const float* y_split, const float* y_ref, const float* a, const WeightView& W, int T, int n, int dim,
                 int ranks, BlockStats& bs) {
  const double g = gamma_of(n) + gamma_of(static_cast<double>(n) / ranks + ranks - 1);
  std::vector<float> w(static_cast<std::size_t>(n));
  for (int i = 0; i < dim; ++i) {
    W.to_f32(static_cast<std::size_t>(i) * n, static_cast<std::size_t>(n), w.data());
    for (int t = 0; t < T; ++t) {
      double S = 0;
      for (int j = 0; j < n; ++j) S += std::fabs(static_cast<double>(a[static_cast<std::size_t>(t) * n + j]) * w[static_cast<std::size_t>(j)]);
      const double bound = g * S;
      const std::size_t k = static_cast<std::size_t>(t) * dim + i;
      const double d = std::fabs(static_cast<double>(y_split[k]) - y_ref[k]);
      REQUIRE(std::isfinite(y_split[k]));
      if (d > bound) {
        FAIL_CHECK("block output element (token " << t << ", " << i << "): |split - unsplit| = " << d << " > bound " << bound
                                                  << " (S = " << S << ", n = " << n << ", ranks = " << ranks << ")");
        return;
      }
      bs.worst_ratio = std::max(bs.worst_ratio, bound > 0 ? d / bound : 0.0);
      bs.max_out = std::max(bs.max_out, std::fabs(static_cast<double>(y_ref[k])));
      bs.max_bound = std::max(bs.max_bound, bound);
      ++bs.elements;
    }
  }
}

// (b): the split pass teacher-forced by the unsplit one (a TensorParallelForward of one rank) over the
// prompt in chunks and kSteps greedy decode steps.
void run_teacher_forced(const Model& m, const KvFormat& f, int ranks) {
  INFO("model " << m.path << ", format " << f.name() << ", ranks " << ranks);
  const ModelConfig& c = m.config;
  const EngineOptions o = tp_options(m, f, ranks);
  const StoreConfig full = make_store_config(m, o, o.max_context, "PAR.tp");
  TensorParallelForward ref(m, 1, full, kChunk, 1), tp(m, ranks, full, kChunk, 1);
  REQUIRE(tp.ranks() == ranks);
  const int T_max = kChunk, dim = c.dim, hd = c.head_dim;
  std::vector<float> logits(static_cast<std::size_t>(T_max) * c.vocab_size);
  BlockStats attn, ffn;
  std::vector<int> toks = joined_turns(m);
  std::size_t done = 0;
  int steps = 0;
  while (done < toks.size()) {
    const int T = static_cast<int>(std::min<std::size_t>(kChunk, toks.size() - done));
    const int pos0 = ref.begin_chunk(toks.data() + done, T);
    REQUIRE(tp.begin_chunk(toks.data() + done, T) == pos0);
    for (int l = 0; l < c.n_layers; ++l) {
      INFO("layer " << l << ", position " << pos0);
      const LayerWeights& L = m.weights.layers[static_cast<std::size_t>(l)];
      tp.set_residual(ref.residual(0), T);
      ref.attention(l, T, pos0);
      tp.attention(l, T, pos0);
      for (int r = 0; r < ranks; ++r) {
        const TpSlice s = tp.slice(r);
        const std::vector<float> want = columns(ref.attention_rows(0), T, c.q_dim(), s.q_head0 * hd, s.q_heads * hd);
        const std::vector<float> got(tp.attention_rows(r), tp.attention_rows(r) + want.size());
        CHECK(bitwise_equal(got, want));
      }
      check_block(tp.block_sum(), ref.block_sum(), ref.attention_rows(0), L.wo.view(), T, c.q_dim(), dim, ranks, attn);
      ref.add_block(l, true, T, pos0);
      tp.set_residual(ref.residual(0), T);
      ref.ffn(l, T);
      tp.ffn(l, T);
      for (int r = 0; r < ranks; ++r) {
        const TpSlice s = tp.slice(r);
        const std::vector<float> want = columns(ref.ffn_hidden(0), T, c.hidden_dim, s.ffn0, s.ffn);
        const std::vector<float> got(tp.ffn_hidden(r), tp.ffn_hidden(r) + want.size());
        CHECK(bitwise_equal(got, want));
        if (ranks > 1) {  // anti-vacuity: each rank's share is a real part of the sum
          const float* p = tp.partial(r);
          CHECK(std::any_of(p, p + static_cast<std::ptrdiff_t>(T) * dim, [](float x) { return x != 0.0f; }));
        }
      }
      check_block(tp.block_sum(), ref.block_sum(), ref.ffn_hidden(0), L.w2.view(), T, c.hidden_dim, dim, ranks, ffn);
      ref.add_block(l, false, T, pos0);
    }
    ref.head(T, logits.data(), false);
    done += static_cast<std::size_t>(T);
    if (done == toks.size() && steps < kSteps) {  // greedy decode steps on the unsplit pass's tokens
      const std::vector<float> last(logits.begin(), logits.begin() + c.vocab_size);
      toks.push_back(argmax(last));
      ++steps;
    }
  }
  // Anti-vacuity of the bound: a rank's share missing from a sum (the size of an output) is far
  // outside it, and the comparisons really ran.
  for (const BlockStats* b : {&attn, &ffn}) {
    CHECK(b->elements > 0);
    CHECK(b->max_out > 0);
    CHECK(b->max_bound < 1e-3 * b->max_out);
  }
  // Every rank's store holds its KV heads' slice of the unsplit rows, every layer, bitwise.
  for (int r = 0; r < ranks; ++r) {
    const TpSlice s = tp.slice(r);
    CHECK(tp.store(r).config().n_kv_heads == s.kv_heads);
    for (int l = 0; l < c.n_layers; ++l)
      for (KvHalf h : {KvHalf::K, KvHalf::V}) {
        INFO("rank " << r << ", layer " << l << ", half " << (h == KvHalf::K ? "K" : "V"));
        const std::vector<float> all = layer_rows(ref.store(0), ref.sequence(0), l, h);
        const int n = ref.store(0).length(ref.sequence(0));
        const std::vector<float> want = columns(all.data(), n, c.kv_dim(), s.kv_head0 * hd, s.kv_heads * hd);
        const std::vector<float> got = layer_rows(tp.store(r), tp.sequence(r), l, h);
        CHECK(bitwise_equal(got, want));
        CHECK(std::any_of(got.begin(), got.end(), [](float x) { return x != 0.0f; }));
      }
    CHECK(tp.store(r).check_guards().empty());
  }
}

// (a) and (c).
void run_engine(const Model& m, const KvFormat& f) {
  INFO("model " << m.path << ", format " << f.name());
  const std::vector<int> prompt = joined_turns(m);
  EngineOptions uo = tp_options(m, f, 1);
  Engine single(m, uo);
  const auto want = engine_logits(single, prompt);
  CHECK_FALSE(bitwise_equal(want.front(), want.back()));
  {  // (a) one rank == the unsplit engine, bitwise, every position and step
    const StoreConfig full = make_store_config(m, uo, uo.max_context, "PAR.tp");
    TensorParallelForward one(m, 1, full, kChunk, 1);
    std::vector<std::vector<float>> got;
    std::vector<float> buf(static_cast<std::size_t>(kChunk) * m.config.vocab_size);
    const std::size_t V = static_cast<std::size_t>(m.config.vocab_size);
    for (std::size_t i = 0; i < prompt.size(); i += kChunk) {
      const int T = static_cast<int>(std::min<std::size_t>(kChunk, prompt.size() - i));
      one.forward(prompt.data() + i, T, buf.data(), true);
      for (int t = 0; t < T; ++t)
        got.emplace_back(buf.begin() + static_cast<std::ptrdiff_t>(t * V), buf.begin() + static_cast<std::ptrdiff_t>((t + 1) * V));
    }
    int tok = argmax(got.back());
    for (int s = 0; s < kSteps; ++s) {
      one.forward(&tok, 1, buf.data(), false);
      got.emplace_back(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(V));
      tok = argmax(got.back());
    }
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("logit vector " << i);
      CHECK(bitwise_equal(got[i], want[i]));
    }
  }
  for (int ranks : {2, 4}) {  // (c)
    INFO("ranks " << ranks);
    Engine e(m, tp_options(m, f, ranks));
    const auto got = engine_logits(e, prompt);
    REQUIRE(got.size() == want.size());
    for (const auto& v : got) CHECK(std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); }));
    CHECK(e.tp_ranks() == ranks);
    CHECK(e.stats().topology == "tensor:" + std::to_string(ranks));
    CHECK(e.stats().tensor_parallel == ranks);
    CHECK(e.stats().kv_pool_bytes == single.stats().kv_pool_bytes);
    std::size_t pools = 0;
    for (int r = 0; r < ranks; ++r) {
      const PagedKvStore& st = e.rank_store(r);
      CHECK(st.config().n_kv_heads == m.config.n_kv_heads / ranks);
      CHECK(st.config().n_layers == m.config.n_layers);
      CHECK(st.length(e.rank_sequence(r)) == single.position());
      pools += st.pool_bytes();
    }
    CHECK(pools == single.store().pool_bytes());
    CHECK_THROWS_WITH(e.rank_store(ranks), kvgate_catch::contains("no tensor-parallel rank"));
  }
}

void run_tp(const Model& m, const KvFormat& f) {
  run_engine(m, f);
  for (int ranks : {2, 4}) run_teacher_forced(m, f, ranks);
}

void run_tp_stream(const Model& m, const KvFormat& f) {
  INFO("model " << m.path << ", format " << f.name());
  const std::vector<int> prompt = joined_turns(m);
  Engine resident(m, tp_options(m, f, 2, 0, 4));  // pages of 4 tokens on both sides
  const auto want = engine_logits(resident, prompt);
  for (int window : {3, 8}) {
    INFO("window " << window << " tokens");
    Engine e(m, tp_options(m, f, 2, window, 4));
    std::vector<std::vector<float>> got;
    const std::vector<float> all = e.forward_all_logits(prompt);
    const std::size_t V = static_cast<std::size_t>(e.vocab_size());
    for (std::size_t i = 0; i < prompt.size(); ++i)
      got.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(i * V), all.begin() + static_cast<std::ptrdiff_t>((i + 1) * V));
    int tok = argmax(got.back());
    for (int s = 0; s < kSteps; ++s) {
      for (int r = 0; r < 2; ++r) {
        INFO("rank " << r << ", step " << s);
        CHECK(e.rank_store(r).check_stream_coherent().empty());
      }
      got.push_back(e.decode(tok));
      tok = argmax(got.back());
    }
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("logit vector " << i);
      CHECK(bitwise_equal(got[i], want[i]));
    }
    long long misses = 0;
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r);
      const PagedKvStore& st = e.rank_store(r);
      REQUIRE(st.streaming());
      CHECK(st.stream_counters().misses > 0);
      misses += st.stream_counters().misses;
    }
    CHECK(e.stats().kv_block_misses == misses);
  }
}

// KV files with --tp (PAR.tp.persist): see the header.
void run_tp_persist(const Model& m, const KvFormat& f) {
  INFO("model " << m.path << ", format " << f.name());
  const ModelConfig& c = m.config;
  const std::vector<std::vector<int>> turns = three_turns(m);
  std::vector<int> prompt = turns[0];
  prompt.insert(prompt.end(), turns[1].begin(), turns[1].end());
  std::vector<int> longer = prompt;  // a hydrate of `longer` takes every saved token (one is left to prefill)
  longer.insert(longer.end(), turns[2].begin(), turns[2].end());
  const int n = static_cast<int>(prompt.size());
  TempDir dir;
  auto saved = [&](const Engine& e, const std::string& name) {
    e.save_kv(dir.file(name));
    return read_bytes(dir.file(name));
  };
  // The continuation: turn 3 as one chunk, then kSteps greedy decode steps.
  auto continue_turn = [&](Engine& e) {
    std::vector<std::vector<float>> out;
    out.push_back(e.prefill(turns[2]));
    for (int s = 0; s < kSteps; ++s) out.push_back(e.decode(argmax(out.back())));
    return out;
  };

  Engine single(m, tp_options(m, f, 1));
  single.prefill(prompt);
  const std::vector<std::uint8_t> file1 = saved(single, "single.kvf");
  {  // anti-vacuity: more than one page per layer, non-zero page bytes
    const KvFile k = read_kv_file(dir.file("single.kvf"));
    REQUIRE(k.header.used_tokens == n);
    CHECK(n > k.header.block_size);
    CHECK(std::any_of(k.body.begin(), k.body.end(), [](std::uint8_t b) { return b != 0; }));
  }
  Engine hydrated1(m, tp_options(m, f, 1));  // the unsplit engine's hydrated rows, for (c)
  REQUIRE(hydrated1.hydrate(read_kv_file(dir.file("single.kvf")), longer) == n);

  for (int ranks : {2, 4}) {  // (a) and (c)
    INFO("unsplit file hydrated into --tp " << ranks);
    Engine e(m, tp_options(m, f, ranks));
    REQUIRE(e.hydrate(read_kv_file(dir.file("single.kvf")), longer) == n);
    CHECK(e.position() == n);
    CHECK(saved(e, "tp" + std::to_string(ranks) + ".kvf") == file1);
    for (int r = 0; r < ranks; ++r) {
      const TpSlice s = tensor_parallel_slice(c, ranks, r);
      for (int l = 0; l < c.n_layers; ++l)
        for (KvHalf h : {KvHalf::K, KvHalf::V}) {
          INFO("rank " << r << ", layer " << l << ", half " << (h == KvHalf::K ? "K" : "V"));
          const std::vector<float> all = layer_rows(hydrated1.store(), hydrated1.sequence(), l, h);
          const std::vector<float> want = columns(all.data(), n, c.kv_dim(), s.kv_head0 * c.head_dim, s.kv_heads * c.head_dim);
          const std::vector<float> got = layer_rows(e.rank_store(r), e.rank_sequence(r), l, h);
          CHECK(bitwise_equal(got, want));
          CHECK(std::any_of(got.begin(), got.end(), [](float x) { return x != 0.0f; }));
        }
      CHECK(e.rank_store(r).check_guards().empty());
    }
  }

  // (b) a --tp 2 engine's file.
  Engine tp2(m, tp_options(m, f, 2));
  tp2.prefill(prompt);
  const std::vector<std::uint8_t> file2 = saved(tp2, "tp2_own.kvf");
  if (file2 == file1)
    WARN("the --tp 2 file equals the unsplit engine's for this prompt (no row changed by the all-reduce's rounding)");
  else
    std::printf("PAR.tp.persist.%s: the --tp 2 file differs from the unsplit engine's (%zu bytes)\n", f.name().c_str(),
                file2.size());
  const std::vector<std::vector<float>> want = continue_turn(tp2);  // uninterrupted
  Engine unsplit(m, tp_options(m, f, 1));
  REQUIRE(unsplit.hydrate(read_kv_file(dir.file("tp2_own.kvf")), longer) == n);
  CHECK(saved(unsplit, "via_unsplit.kvf") == file2);
  for (int resident : {0, 20}) {
    INFO("hydrated into --tp 2, --kv-resident " << resident);
    Engine e(m, tp_options(m, f, 2, resident));
    REQUIRE(e.hydrate(read_kv_file(dir.file("via_unsplit.kvf")), longer) == n);
    for (int r = 0; r < 2; ++r) CHECK(e.rank_store(r).check_stream_coherent().empty());
    const std::vector<std::vector<float>> got = continue_turn(e);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("logit vector " << i);
      CHECK(bitwise_equal(got[i], want[i]));
    }
    if (resident > 0)
      for (int r = 0; r < 2; ++r) {
        CHECK(e.rank_store(r).streaming());
        CHECK(e.rank_store(r).check_stream_coherent().empty());
      }
  }

  {  // anti-vacuity: a byte of rank 1's store changes the saved file
    Engine e(m, tp_options(m, f, 2));
    REQUIRE(e.hydrate(read_kv_file(dir.file("single.kvf")), longer) == n);
    PagedKvStore& st = const_cast<PagedKvStore&>(e.rank_store(1));
    const int block = st.block_table(e.rank_sequence(1))[0];
    st.page(0, KvHalf::K, block)[0] ^= 0x40;
    CHECK(saved(e, "flipped.kvf") != file1);
  }
}

}  // namespace

#define PAR_TP_PERSIST(id, preset)                                                                                 \
  TEST_CASE("PAR.tp.persist." id " KV files with --tp: unsplit <-> --tp 2 / --tp 4 round trips byte for byte; a "  \
            "hydrated --tp 2 continues bitwise",                                                                    \
            "[gate:PAR][fmt:" preset "]") {                                                                         \
    run_tp_persist(synth_tp(), fmt_of(preset));                                                                     \
  }
PAR_TP_PERSIST("f32", "f32")
PAR_TP_PERSIST("int8", "int8")
PAR_TP_PERSIST("k8v4", "k8v4")
PAR_TP_PERSIST("q4_0", "q4_0")
PAR_TP_PERSIST("fp8", "fp8")
PAR_TP_PERSIST("mxfp4", "mxfp4")
PAR_TP_PERSIST("fp8_per_token_head", "fp8_per_token_head")

#define PAR_TP(id, preset)                                                                                          \
  TEST_CASE("PAR.tp." id " 2 and 4 tensor-parallel ranks: teacher-forced blocks within the derived bound, rank " \
            "stores hold their heads bitwise; 1 rank == unsplit",                                                   \
            "[gate:PAR][fmt:" preset "]") {                                                                         \
    run_tp(synth_tp(), fmt_of(preset));                                                                             \
  }                                                                                                                 \
  TEST_CASE("PAR.tp.stream." id " --tp 2 streamed == --tp 2 resident, bitwise; every rank streams",                 \
            "[gate:PAR][fmt:" preset "]") {                                                                         \
    run_tp_stream(synth_tp(), fmt_of(preset));                                                                      \
  }

KVGATE_PRESETS(PAR_PRESET_ROW, PAR_TP)  // one test case per preset: kvgate/format_list.hpp
PAR_TP("mixed", "k=q8_0,v=fp8_e5m2")

TEST_CASE("PAR.tp.archs Gemma 3, Qwen3 and Qwen2 references split over 2 ranks: teacher-forced blocks within the "
          "derived bound",
          "[gate:PAR][fmt:int8]") {
  for (const char* name : {"gemma3", "qwen3", "qwen2"}) {
    SECTION(name) {
      const Model& m = hf_ref(name);
      for (const char* preset : {"f32", "int8"}) run_teacher_forced(m, fmt_of(preset), 2);
    }
  }
}

TEST_CASE("PAR.tp.options splits that tensor parallelism does not make are refused naming the option and the fix",
          "[gate:PAR][fmt:int8]") {
  const Model& m = synth_tp();
  const KvFormat f = fmt_of("int8");
  auto with = [&](int ranks) { return tp_options(m, f, ranks); };
  CHECK_THROWS_WITH(Engine(m, with(3)), kvgate_catch::contains("--tp 3 does not divide the model's 4 KV heads"));
  CHECK_THROWS_WITH(Engine(m, with(0)), kvgate_catch::contains("give 1 (no split) or more ranks"));
  EngineOptions pp = with(2);
  pp.pipeline_stages = 2;
  CHECK_THROWS_WITH(Engine(m, pp), kvgate_catch::contains("a pipeline split (--pp)"));
  EngineOptions lm = with(2);
  lm.kv_layers = KvLayerMap(static_cast<std::size_t>(m.config.n_layers), f);
  CHECK_THROWS_WITH(Engine(m, lm), kvgate_catch::contains("a per-layer KV map (--kv-layers)"));
  const Model& moe = hf_ref("qwen3_moe");
  CHECK_THROWS_WITH(Engine(moe, tp_options(moe, f, 2)), kvgate_catch::contains("mixture-of-experts"));
  const Model& mla = hf_ref("deepseek_v3");
  CHECK_THROWS_WITH(Engine(mla, tp_options(mla, f, 2)), kvgate_catch::contains("latent attention (MLA)"));
  // A rank row narrower than a 32-block: the store refuses the format, naming it.
  const Model& llama = hf_ref("llama_default");  // 2 KV heads of 16: one rank holds 16 elements a row
  CHECK_THROWS(Engine(llama, tp_options(llama, fmt_of("q8_0"), 2)));
  // KV files work with the split (PAR.tp.persist); a file that does not match the run (another
  // format) is refused before the ranks are touched.
  Engine e(m, with(2));
  e.prefill(three_turns(m)[0]);
  TempDir dir;
  e.save_kv(dir.file("x.kvf"));
  Engine single(m, tp_options(m, fmt_of("q8_0"), 1));
  single.prefill(three_turns(m)[0]);
  single.save_kv(dir.file("y.kvf"));
  CHECK_THROWS_WITH(e.hydrate(read_kv_file(dir.file("y.kvf")), three_turns(m)[0]),
                    kvgate_catch::contains("does not match this run"));
  CHECK(e.position() == static_cast<int>(three_turns(m)[0].size()));  // nothing lost
  CHECK(e.rank_store(1).length(e.rank_sequence(1)) == e.position());
  CHECK(e.stage_count() == 1);
}
