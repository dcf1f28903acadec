// PAR.cuda.tp.*: tensor parallelism of the CUDA forward (kvgate/cuda/tensor_parallel.hpp,
// docs/CUDA.md "Tensor parallelism"; the CPU counterpart is PAR.tp, gates/persistence/tp_gate.cpp).
// Model: a synth GQA Llama (8 query / 4 KV heads of head_dim 32, hidden 256, FFN 512, 2 layers, f32
// weights), so 2 and 4 ranks split it (2 / 1 KV heads per rank). KV formats f32, int8, k8v4 and
// fp8_e4m3 (fp8 with static scales distinct per (layer, KV head): a rank reading another rank's heads'
// scales writes other codes). Pages of 16 tokens, chunks of 7 (chunks and pages cross).
//   PAR.cuda.tp.anchor.<fmt>  CudaTensorParallel with one rank vs the unsplit CudaForward (no graphs on
//                     either side: both plan attention per call): the logits of every position of a
//                     chunked prefill and of 8 greedy decode steps, and every page of the stores.
//                     Bound: ZERO (bitwise), expected by construction: with one rank every GEMM has the
//                     unsplit shape and arguments except Wo/W2, where the unsplit pass accumulates
//                     (cuBLAS beta = 1: fl(acc + x) in the epilogue) and the rank writes acc with
//                     beta = 0, the all-reduce copies it (exact) and mk::add makes the same one rounding
//                     fl(x + acc). This assumes cuBLAS picks the same algorithm (the same order inside
//                     acc) for beta = 0 and beta = 1 on the same shape; if a device shows otherwise, this
//                     case fails and names the first differing logit vector (the per-block bound of
//                     PAR.cuda.tp.<fmt> (i), with n the GEMM's inner dimension, then applies instead).
//   PAR.cuda.tp.<fmt>  2 and 4 ranks on one GPU (and 2 ranks on devices 0,1 where a machine has two;
//                     else that part prints SKIPPED), teacher-forced at block level as PAR.tp: before
//                     each block every rank's residual replica is set to the reference's residual, the
//                     reference being the one-rank driver run through the same steps. Then:
//                     (i) per block the all-reduced output y_split (rank 0's sum buffer, before the
//                         residual add) against an FP64 recomputation from each rank's OWN attention
//                         output rows / FFN hidden rows (downloaded) and its Wo / W2 slice:
//                           |y_split - sum_r sum_j a_rj w_rij| <= gamma(n/N + N - 1) S,
//                           S = sum_r sum_j |a_rj w_rij|, gamma(k) = k u / (1 - k u), u = 2^-24;
//                         derived: each rank's GEMM sums n/N products in some order (any order:
//                         gamma(n/N) S_r; Higham, Accuracy and Stability, 3.1), the all-reduce adds N
//                         partials in rank order (N - 1 roundings). No absolute term: the relative
//                         rounding model needs every product to be normal (an addition whose result is
//                         subnormal is exact under gradual underflow); checked: no exact product
//                         a_j w_ij (nor xb_j w_ij in (ii)) lies in (0, FLT_MIN). The same check runs on
//                         the reference (N = 1: gamma(n)). Anti-vacuity: for every rank some element's share |sum_j a_rj w_rij|
//                         exceeds the bound there (a missing or doubled rank term is caught), and the
//                         bound stays below 1e-3 of the largest output.
//                     (ii) each rank's K/V rows before quantization (CudaForward::set_capture_kv) vs the
//                         reference's rows of its KV heads: the count of bitwise-equal elements is
//                         printed; gated under two float orders of the same dot product:
//                           V: |v_split - v_ref| <= 2 gamma(dim) S_i,
//                           K (after RoPE, pair (i, p), |cos|, |sin| <= 1, two roundings and a
//                           subtraction per turned element, no FMA in the kernels):
//                           |k_split - k_ref| <= (2 gamma(dim) + 2 (2u + u^2)(1 + gamma(dim))) (S_i + S_p),
//                         S_i = sum_j |xb_j w_ij| (FP64, xb the block's normed rows, checked bitwise
//                         equal on both sides, w the rank's Wk / Wv rows). The synth model has no qkv
//                         bias and no QK-norm (required).
//                     (iii) each rank's store holds only its KV heads (n_kv_heads = Hkv / N, its pool
//                         bytes = the unsplit pool / N, the scales of its heads) and every page of it
//                         equals, byte for byte, the CPU store (PagedKvStore with the same rank
//                         StoreConfig, tensor_parallel_store_config) fed that rank's captured rows
//                         (as ORA.cuda's CPU/CUDA store byte equality); with fp8 the ranks' scale tables
//                         differ (anti-vacuity: rank 0's table would write other codes).
//                     (iv) free-running: 2 ranks' greedy ids over 16 decode steps vs the unsplit
//                         forward's, printed (not gated: no bound here covers rounding differences
//                         growing through free-running layers).
//   PAR.cuda.tp.engine  CudaEngine with EngineOptions::tensor_parallel = 2 (kvgate run --device cuda
//                     --tp 2): runs a prefill and greedy steps with finite logits, stats report
//                     tensor_parallel 2 and the topology "tensor:2 (ranks on cuda:D,cuda:D)", the ranks'
//                     pools add up to the unsplit engine's pool and each rank store holds half the KV
//                     heads; refused naming the option and the fix: 3 ranks on 4 KV heads, --pp with
//                     --tp, KV damage; a KV file is saved and hydrated. --kv-resident is not refused: every
//                     rank gets its own host mirror and device window (checked here: one mirror per
//                     rank, of its KV heads); PAR.cuda.tp.stream.<fmt> (gates/cuda/cuda_tp_stream_gate.cpp)
//                     gates the streamed ranks against the resident ones, bitwise.
// The CLI's refusal of --tp with --device cuda and --pp is checked without a device by CLI.run.tp
// (gates/cli/cli_gate.cpp), as is that --kv-resident and --conv-id with --tp are not refused there.
// Without a device every case prints "SKIPPED: no CUDA device: <reason>" and passes.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "cuda_gate_common.hpp"
#include "head_scales.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/cuda/tensor_parallel.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/kv_file.hpp"
#include "kvgate/rope.hpp"
#include "kvgate/sampler.hpp"
#include "kvgate/tensor_parallel.hpp"
#include "model_fixtures.hpp"
#include "scratch_dir.hpp"

using namespace kvgate;
namespace kc = kvgate::cuda;
namespace cuda_gate = kvgate::gates::cuda_gate;

namespace {

constexpr int kBlock = 16, kChunk = 7, kSteps = 8, kFree = 16, kCtx = 128, kPrompt = 19;

const Model& synth_tp() { return gates::synth_model_once("cuda_tp", gates::synth_tp_options()); }

KvFormat fmt_named(const std::string& name) {
  const auto f = parse_kv_format(name);
  REQUIRE(f.has_value());
  return *f;
}

bool is_fp8(const KvFormat& f) { return f.k == HalfFormat::fp8_e4m3 || f.v == HalfFormat::fp8_e4m3; }

EngineOptions engine_opts(const Model& m, const KvFormat& f) {
  EngineOptions o = engine_options_for(f, 1);
  o.kv.backend = "cuda";
  o.block_size = kBlock;
  o.max_context = kCtx;
  o.prefill_chunk = kChunk;
  gates::set_gate_head_scales_if_fp8(o, f, m.config.n_layers, m.config.n_kv_heads);
  return o;
}

StoreConfig full_store(const Model& m, const KvFormat& f) {
  const EngineOptions o = engine_opts(m, f);
  return make_store_config(m, o, kCtx, "PAR.cuda.tp");
}

kc::CudaForwardOptions fwd_opts() { return kc::CudaForwardOptions{kChunk, kCtx, false}; }

kc::TensorParallelOptions tp_opts(int ranks, const StoreConfig& sc, std::vector<int> devices = {}) {
  kc::TensorParallelOptions o;
  o.ranks = ranks;
  o.devices = std::move(devices);
  o.weights = kc::WeightType::f32;
  o.store = sc;
  o.forward = fwd_opts();
  return o;
}

std::vector<int> prompt_ids(const Model& m) {
  std::vector<int> p;
  for (int i = 0; i < kPrompt; ++i) p.push_back((37 * i + 11) % (m.config.vocab_size - 2));
  return p;
}

double gamma_of(double n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1.0 - n * u);
}

// The unsplit forward (no graphs) over its own store.
struct Unsplit {
  kc::CudaModel model;
  kc::CudaKvStore store;
  kc::CudaForward fwd;
  SeqId s;
  Unsplit(const Model& m, const StoreConfig& sc)
      : model(m, kc::WeightType::f32), store(sc), fwd(model, store, fwd_opts()), s(store.create_sequence()) {}
};

// Every page of every layer of two device stores' sequences, byte for byte.
long compare_pages(const kc::CudaKvStore& a, SeqId sa, const kc::CudaKvStore& b, SeqId sb) {
  long pages = 0;
  const auto ta = a.block_table(sa), tb = b.block_table(sb);
  REQUIRE(ta.size() == tb.size());
  for (int l = 0; l < a.config().n_layers; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V})
      for (std::size_t p = 0; p < ta.size(); ++p) {
        const auto x = a.download_page(l, h, ta[p]);
        const auto y = b.download_page(l, h, tb[p]);
        REQUIRE(x.size() == y.size());
        INFO("layer " << l << (h == KvHalf::K ? " K" : " V") << " page " << p << ": "
                      << cuda_gate::first_diff(x.data(), y.data(), x.size(), "split", "unsplit"));
        CHECK(std::memcmp(x.data(), y.data(), x.size()) == 0);
        ++pages;
      }
  return pages;
}

// --- PAR.cuda.tp.anchor ---------------------------------------------------------------------------
void run_anchor(const KvFormat& f) {
  const Model& m = synth_tp();
  const int V = m.config.vocab_size;
  const StoreConfig sc = full_store(m, f);
  INFO("format " << f.name());
  Unsplit u(m, sc);
  kc::CudaTensorParallel one(m, tp_opts(1, sc));
  REQUIRE(one.ranks() == 1);
  const SeqId s1 = one.create_sequence();
  const std::vector<int> prompt = prompt_ids(m);
  std::vector<std::vector<float>> want, got;
  for (std::size_t p = 0; p < prompt.size(); p += kChunk) {
    const std::size_t n = std::min<std::size_t>(kChunk, prompt.size() - p);
    const std::span<const int> chunk(prompt.data() + p, n);
    std::vector<float> a(n * V), b(n * V);
    u.fwd.forward_chunk(u.s, chunk, a.data(), true);
    one.forward_chunk(s1, chunk, b.data(), true);
    for (std::size_t t = 0; t < n; ++t) {
      want.emplace_back(a.begin() + static_cast<std::ptrdiff_t>(t * V), a.begin() + static_cast<std::ptrdiff_t>((t + 1) * V));
      got.emplace_back(b.begin() + static_cast<std::ptrdiff_t>(t * V), b.begin() + static_cast<std::ptrdiff_t>((t + 1) * V));
    }
  }
  int tok = argmax(want.back());
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> a(V), b(V);
    u.fwd.forward_decode(std::span<const SeqId>(&u.s, 1), std::span<const int>(&tok, 1), a.data());
    one.forward_decode(std::span<const SeqId>(&s1, 1), std::span<const int>(&tok, 1), b.data());
    want.push_back(a);
    got.push_back(b);
    tok = argmax(a);
  }
  REQUIRE(got.size() == want.size());
  REQUIRE(got.size() == static_cast<std::size_t>(kPrompt + kSteps));
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("logit vector " << i << " (" << (i < static_cast<std::size_t>(kPrompt) ? "prefill position" : "decode step")
                         << ")");
    CHECK(cuda_gate::bit_equal(got[i], want[i]));
  }
  // Anti-vacuity: the logits are finite and differ across positions; the rank's store was written and
  // holds every page of the unsplit store's.
  for (const auto& v : want) CHECK(std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); }));
  CHECK_FALSE(cuda_gate::bit_equal(want.front(), want.back()));
  CHECK(one.rank(0).store->length(s1) == u.store.length(u.s));
  CHECK(compare_pages(*one.rank(0).store, s1, u.store, u.s) == 2L * m.config.n_layers * ((kPrompt + kSteps + kBlock - 1) / kBlock));
}

// --- PAR.cuda.tp.<fmt> ------------------------------------------------------------------------------
struct BlockStats {
  double worst_ratio = 0, max_out = 0, max_bound = 0;
  long long elements = 0, subnormal_products = 0;
  std::vector<int> rank_seen;  // per rank: elements where its share alone exceeds the bound
};

// (i): y = tp.block_sum() [T][dim] against the ranks' own rows a_r [T][n_r] and weights W_r [dim][n_r].
void check_block(kc::CudaTensorParallel& tp, int l, bool attention, int T, BlockStats& bs) {
  const int N = tp.ranks();
  const int dim = tp.rank(0).model.config.dim;
  const std::vector<float> y = tp.block_sum();
  std::vector<std::vector<float>> a, w;
  int n_r = 0;
  for (int r = 0; r < N; ++r) {
    const kc::CudaTensorParallel::Rank& rk = tp.rank(r);
    const LayerWeights& L = rk.model.weights.layers[static_cast<std::size_t>(l)];
    n_r = attention ? rk.model.config.q_dim() : rk.model.config.hidden_dim;
    a.push_back(attention ? tp.attention_out(r) : tp.ffn_hidden(r));
    std::vector<float> wr(static_cast<std::size_t>(dim) * n_r);
    (attention ? L.wo : L.w2).view().to_f32(0, wr.size(), wr.data());
    w.push_back(std::move(wr));
  }
  if (bs.rank_seen.empty()) bs.rank_seen.assign(static_cast<std::size_t>(N), 0);
  const double g = gamma_of(static_cast<double>(n_r) + N - 1);  // n_r = n / N
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < dim; ++i) {
      double exact = 0, S = 0;
      std::vector<double> share(static_cast<std::size_t>(N), 0.0);
      for (int r = 0; r < N; ++r) {
        const float* ar = a[static_cast<std::size_t>(r)].data() + static_cast<std::size_t>(t) * n_r;
        const float* wi = w[static_cast<std::size_t>(r)].data() + static_cast<std::size_t>(i) * n_r;
        for (int j = 0; j < n_r; ++j) {
          const double p = static_cast<double>(ar[j]) * static_cast<double>(wi[j]);
          bs.subnormal_products += p != 0 && std::fabs(p) < static_cast<double>(FLT_MIN);
          share[static_cast<std::size_t>(r)] += p;
          S += std::fabs(p);
        }
        exact += share[static_cast<std::size_t>(r)];
      }
      const double yk = y[static_cast<std::size_t>(t) * dim + i];
      REQUIRE(std::isfinite(yk));
      const double bound = g * S, d = std::fabs(yk - exact);
      if (d > bound) {
        FAIL_CHECK((attention ? "attention" : "FFN") << " block of layer " << l << ", row " << t << ", element " << i
                                                     << ": |y_split - exact| = " << d << " > bound " << bound
                                                     << " (S = " << S << ", n/N = " << n_r << ", N = " << N << ")");
        return;
      }
      for (int r = 0; r < N; ++r) bs.rank_seen[static_cast<std::size_t>(r)] += std::fabs(share[static_cast<std::size_t>(r)]) > bound;
      bs.worst_ratio = std::max(bs.worst_ratio, bound > 0 ? d / bound : 0.0);
      bs.max_out = std::max(bs.max_out, std::fabs(exact));
      bs.max_bound = std::max(bs.max_bound, bound);
      ++bs.elements;
    }
}

struct KvStats {
  long long elements = 0, bitwise = 0, subnormal_products = 0;
  double worst_ratio = 0;
};

// (ii): rank r's captured K/V rows of layer l (this call's T rows) vs the reference's rows of its heads.
void check_kv(kc::CudaTensorParallel& ref, kc::CudaTensorParallel& tp, int r, int l, int T, KvStats& ks) {
  const ModelConfig& c = ref.rank(0).model.config;
  const kc::CudaTensorParallel::Rank& rk = tp.rank(r);
  const int dim = c.dim, hd = c.head_dim, kvd = c.kv_dim(), kvd_r = rk.model.config.kv_dim();
  const int h0 = rk.slice.kv_head0;
  const std::vector<float> xb = tp.normed_rows(r);
  CHECK(cuda_gate::bit_equal(xb, ref.normed_rows(0)));  // the teacher forcing gave both sides the same block input
  const LayerWeights& L = rk.model.weights.layers[static_cast<std::size_t>(l)];
  const double u = std::ldexp(1.0, -24), g = gamma_of(dim);
  const int rot_half = rope_rotary_dim(c.rope, hd) / 2;
  for (KvHalf h : {KvHalf::K, KvHalf::V}) {
    const std::vector<float>& got = h == KvHalf::K ? rk.forward->captured_k() : rk.forward->captured_v();
    const std::vector<float>& all = h == KvHalf::K ? ref.rank(0).forward->captured_k() : ref.rank(0).forward->captured_v();
    REQUIRE(got.size() == static_cast<std::size_t>(c.n_layers) * T * kvd_r);
    std::vector<float> w(static_cast<std::size_t>(kvd_r) * dim);
    (h == KvHalf::K ? L.wk : L.wv).view().to_f32(0, w.size(), w.data());
    for (int t = 0; t < T; ++t) {
      std::vector<double> S(static_cast<std::size_t>(kvd_r), 0.0);
      for (int i = 0; i < kvd_r; ++i)
        for (int j = 0; j < dim; ++j) {
          const double p = std::fabs(static_cast<double>(xb[static_cast<std::size_t>(t) * dim + j]) *
                                     w[static_cast<std::size_t>(i) * dim + j]);
          ks.subnormal_products += p != 0 && p < static_cast<double>(FLT_MIN);
          S[static_cast<std::size_t>(i)] += p;
        }
      for (int i = 0; i < kvd_r; ++i) {
        const float gv = got[(static_cast<std::size_t>(l) * T + t) * kvd_r + i];
        const float rv = all[(static_cast<std::size_t>(l) * T + t) * kvd + h0 * hd + i];
        double bound = 2 * g * S[static_cast<std::size_t>(i)];
        if (h == KvHalf::K) {  // the RoPE partner of element i within its head
          const int e = i % hd, base = i - e;
          int p = i;
          if (c.rope_style == RopeStyle::interleaved && e < 2 * rot_half) p = base + (e ^ 1);
          else if (c.rope_style == RopeStyle::half && e < 2 * rot_half) p = base + (e < rot_half ? e + rot_half : e - rot_half);
          bound = (2 * g + 2 * (2 * u + u * u) * (1 + g)) * (S[static_cast<std::size_t>(i)] + S[static_cast<std::size_t>(p)]);
        }
        const double d = std::fabs(static_cast<double>(gv) - rv);
        ++ks.elements;
        ks.bitwise += std::memcmp(&gv, &rv, sizeof(float)) == 0;
        if (d > bound) {
          FAIL_CHECK("rank " << r << " layer " << l << (h == KvHalf::K ? " K" : " V") << " row " << t << " element " << i
                             << ": |split - reference| = " << d << " > bound " << bound);
          return;
        }
        ks.worst_ratio = std::max(ks.worst_ratio, bound > 0 ? d / bound : 0.0);
      }
    }
  }
}

// The teacher-forced split of `N` ranks (on `devices`, empty: the current device) against the one-rank
// reference, over a chunked prefill and kSteps greedy decode steps; then (iii) the rank stores.
void run_teacher_forced(const KvFormat& f, int N, std::vector<int> devices = {}) {
  const Model& m = synth_tp();
  const ModelConfig& c = m.config;
  INFO("format " << f.name() << ", ranks " << N << (devices.empty() ? "" : " on devices 0,1"));
  REQUIRE(!c.qkv_bias);
  REQUIRE(!c.qk_norm);
  const StoreConfig sc = full_store(m, f);
  kc::CudaTensorParallel ref(m, tp_opts(1, sc)), tp(m, tp_opts(N, sc, std::move(devices)));
  REQUIRE(tp.ranks() == N);
  ref.rank(0).forward->set_capture_kv(true);
  for (int r = 0; r < N; ++r) tp.rank(r).forward->set_capture_kv(true);
  const SeqId sr = ref.create_sequence(), st = tp.create_sequence();
  // The CPU stores of the ranks' configs, fed the ranks' captured rows.
  std::vector<std::unique_ptr<PagedKvStore>> cpu;
  std::vector<SeqId> cs;
  for (int r = 0; r < N; ++r) {
    cpu.push_back(std::make_unique<PagedKvStore>(tensor_parallel_store_config(sc, c, N, r)));
    cs.push_back(cpu.back()->create_sequence());
  }
  BlockStats attn_ref, ffn_ref, attn, ffn;
  KvStats kv;
  std::vector<int> toks = prompt_ids(m);
  std::vector<float> logits(static_cast<std::size_t>(c.vocab_size));
  std::size_t done = 0;
  int steps = 0;
  while (done < toks.size()) {
    const bool decode = done >= static_cast<std::size_t>(kPrompt);
    const int T = decode ? 1 : static_cast<int>(std::min<std::size_t>(kChunk, toks.size() - done));
    const std::span<const int> call(toks.data() + done, static_cast<std::size_t>(T));
    int pos0 = 0;
    if (decode) {
      pos0 = ref.rank(0).store->length(sr);
      ref.begin_decode(std::span<const SeqId>(&sr, 1), call);
      tp.begin_decode(std::span<const SeqId>(&st, 1), call);
    } else {
      pos0 = ref.begin_chunk(sr, call);
      REQUIRE(tp.begin_chunk(st, call) == pos0);
    }
    REQUIRE(tp.rows() == T);
    for (int l = 0; l < c.n_layers; ++l) {
      INFO("layer " << l << ", position " << pos0);
      tp.set_residual(ref.residual(0));
      ref.attention(l);
      tp.attention(l);
      check_block(ref, l, true, T, attn_ref);
      check_block(tp, l, true, T, attn);
      for (int r = 0; r < N; ++r) check_kv(ref, tp, r, l, T, kv);
      ref.add_block(l, true);
      tp.set_residual(ref.residual(0));
      ref.ffn(l);
      tp.ffn(l);
      check_block(ref, l, false, T, ffn_ref);
      check_block(tp, l, false, T, ffn);
      ref.add_block(l, false);
    }
    ref.finish(logits.data(), false, nullptr);
    tp.finish(nullptr, false, nullptr);
    for (int r = 0; r < N; ++r) {  // the rank's rows of this call into its CPU store
      const std::vector<float>& k = tp.rank(r).forward->captured_k();
      const std::vector<float>& v = tp.rank(r).forward->captured_v();
      const std::size_t kvd_r = static_cast<std::size_t>(tp.rank(r).model.config.kv_dim());
      REQUIRE(cpu[static_cast<std::size_t>(r)]->extend(cs[static_cast<std::size_t>(r)], T) == pos0);
      for (int l = 0; l < c.n_layers; ++l) {
        const std::size_t off = static_cast<std::size_t>(l) * T * kvd_r;
        cpu[static_cast<std::size_t>(r)]->write(cs[static_cast<std::size_t>(r)], l, pos0, T, k.data() + off, kvd_r,
                                                v.data() + off, kvd_r);
      }
    }
    done += static_cast<std::size_t>(T);
    if (done == toks.size() && steps < kSteps) {  // greedy on the reference's logits
      toks.push_back(argmax(logits));
      ++steps;
    }
  }
  std::printf("PAR.cuda.tp %s N=%d: worst |y - exact| / bound attention %.3g, FFN %.3g (reference %.3g, %.3g); K/V rows "
              "bitwise equal to the reference's: %lld of %lld elements (worst / bound %.3g)\n",
              f.name().c_str(), N, attn.worst_ratio, ffn.worst_ratio, attn_ref.worst_ratio, ffn_ref.worst_ratio,
              kv.bitwise, kv.elements, kv.worst_ratio);
  // Anti-vacuity of (i): the comparisons ran, the bound is small against the outputs, and every rank's
  // share alone exceeds it somewhere (the sum without that rank, or with it twice, is outside it).
  for (const BlockStats* b : {&attn, &ffn, &attn_ref, &ffn_ref}) {
    CHECK(b->subnormal_products == 0);  // the bound's rounding model (no absolute term) applies
    CHECK(b->elements > 0);
    CHECK(b->max_out > 0);
    CHECK(b->max_bound < 1e-3 * b->max_out);
  }
  for (const BlockStats* b : {&attn, &ffn})
    for (int r = 0; r < N; ++r) {
      INFO("rank " << r << ": elements where its share alone exceeds the bound");
      CHECK(b->rank_seen[static_cast<std::size_t>(r)] > 0);
    }
  CHECK(kv.elements > 0);
  CHECK(kv.subnormal_products == 0);
  // (iii): each rank's store holds only its KV heads, with their scales, and its pages are the CPU
  // store's encoding of the rank's rows.
  const kc::CudaKvStore& rs = *ref.rank(0).store;
  long pages = 0;
  for (int r = 0; r < N; ++r) {
    INFO("rank " << r);
    const kc::CudaKvStore& g = *tp.rank(r).store;
    const PagedKvStore& h = *cpu[static_cast<std::size_t>(r)];
    CHECK(g.config().n_kv_heads == c.n_kv_heads / N);
    CHECK(g.pool_bytes() * static_cast<std::size_t>(N) == rs.pool_bytes());
    CHECK(g.length(st) == rs.length(sr));
    for (int l = 0; l < c.n_layers; ++l)
      for (KvHalf half : {KvHalf::K, KvHalf::V}) {
        const auto want = h.head_scales(l, half);
        const auto have = g.head_scales(l, half);
        CHECK(std::equal(want.begin(), want.end(), have.begin(), have.end()));
      }
    const auto gt = g.block_table(st), ct = h.block_table(cs[static_cast<std::size_t>(r)]);
    REQUIRE(gt.size() == ct.size());
    for (int l = 0; l < c.n_layers; ++l)
      for (KvHalf half : {KvHalf::K, KvHalf::V})
        for (std::size_t p = 0; p < gt.size(); ++p) {
          const auto got = g.download_page(l, half, gt[p]);
          const std::uint8_t* want = h.page(l, half, ct[p]);
          INFO("layer " << l << (half == KvHalf::K ? " K" : " V") << " page " << p << ": "
                        << cuda_gate::first_diff(got.data(), want, got.size(), "gpu", "cpu"));
          CHECK(std::memcmp(got.data(), want, got.size()) == 0);
          CHECK(std::any_of(got.begin(), got.end(), [](std::uint8_t b) { return b != 0; }));
          ++pages;
        }
  }
  CHECK(pages == static_cast<long>(N) * 2 * c.n_layers * ((kPrompt + kSteps + kBlock - 1) / kBlock));
  if (is_fp8(f) && N > 1)  // the ranks' scale tables differ: rank 0's table on rank 1 would write other codes
    for (int l = 0; l < c.n_layers; ++l) {
      const auto s0 = tp.rank(0).store->head_scales(l, KvHalf::K), s1 = tp.rank(1).store->head_scales(l, KvHalf::K);
      CHECK_FALSE(std::equal(s0.begin(), s0.end(), s1.begin(), s1.end()));
    }
}

// (iv): free-running greedy ids, 2 ranks vs the unsplit forward; printed, not gated.
void print_free_running(const KvFormat& f) {
  const Model& m = synth_tp();
  const StoreConfig sc = full_store(m, f);
  Unsplit u(m, sc);
  kc::CudaTensorParallel two(m, tp_opts(2, sc));
  const SeqId s2 = two.create_sequence();
  const std::vector<int> prompt = prompt_ids(m);
  std::vector<int> a, b;
  int ta = 0, tb = 0;
  for (std::size_t p = 0; p < prompt.size(); p += kChunk) {
    const std::size_t n = std::min<std::size_t>(kChunk, prompt.size() - p);
    const std::span<const int> chunk(prompt.data() + p, n);
    u.fwd.forward_chunk(u.s, chunk, nullptr, false, &ta);
    two.forward_chunk(s2, chunk, nullptr, false, &tb);
  }
  for (int step = 0; step < kFree; ++step) {
    a.push_back(ta);
    b.push_back(tb);
    u.fwd.forward_decode(std::span<const SeqId>(&u.s, 1), std::span<const int>(&ta, 1), nullptr, &ta);
    two.forward_decode(std::span<const SeqId>(&s2, 1), std::span<const int>(&tb, 1), nullptr, &tb);
  }
  int first = -1;
  for (int i = 0; i < kFree && first < 0; ++i)
    if (a[static_cast<std::size_t>(i)] != b[static_cast<std::size_t>(i)]) first = i;
  std::printf("PAR.cuda.tp %s free-running, 2 ranks vs unsplit, %d greedy ids: %s", f.name().c_str(), kFree,
              first < 0 ? "identical\n" : "differ from step ");
  if (first >= 0) std::printf("%d\n", first);
}

void run_tp(const KvFormat& f) {
  for (int N : {2, 4}) run_teacher_forced(f, N);
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess) n_dev = 0;
  if (n_dev >= 2) run_teacher_forced(f, 2, {0, 1});
  else WARN("SKIPPED (part): 2 ranks on devices 0,1 need 2 GPUs; this machine has " << n_dev);
  print_free_running(f);
}

// --- PAR.cuda.tp.engine ----------------------------------------------------------------------------
kc::CudaEngineOptions engine_cuda(const Model& m, const KvFormat& f, int tp) {
  kc::CudaEngineOptions o;
  o.engine = engine_opts(m, f);
  o.engine.tensor_parallel = tp;
  o.weights = kc::WeightType::f32;
  return o;
}

}  // namespace

#define CUDA_TP_CASE(id, name)                                                                                    \
  TEST_CASE("PAR.cuda.tp.anchor." id " one tensor-parallel rank == the unsplit CUDA forward, bitwise (logits, " \
            "pages)",                                                                                             \
            "[gate:PAR][fmt:" id "][cuda]") {                                                                     \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                              \
    run_anchor(fmt_named(name));                                                                                  \
  }                                                                                                               \
  TEST_CASE("PAR.cuda.tp." id " 2 and 4 CUDA tensor-parallel ranks, teacher-forced: all-reduced blocks within "   \
            "the derived bound, K/V rows within two dot-product orders, rank stores == the CPU store's bytes",    \
            "[gate:PAR][multigpu][fmt:" id "][cuda]") {                                                           \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                              \
    run_tp(fmt_named(name));                                                                                      \
  }

CUDA_TP_CASE("f32", "f32")
CUDA_TP_CASE("int8", "int8")
CUDA_TP_CASE("k8v4", "k8v4")
CUDA_TP_CASE("fp8_e4m3", "fp8")

TEST_CASE("PAR.cuda.tp.engine the CUDA engine with --tp 2 runs, reports its topology and pools, and refuses what "
          "it does not split by name",
          "[gate:PAR][fmt:int8][cuda]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  const Model& m = synth_tp();
  const KvFormat f = fmt_named("int8");
  const std::vector<int> prompt = prompt_ids(m);
  kc::CudaEngine single(m, engine_cuda(m, f, 1));
  kc::CudaEngine e(m, engine_cuda(m, f, 2));
  int cur = 0;
  REQUIRE(cudaGetDevice(&cur) == cudaSuccess);
  const GenerateResult g = e.generate(prompt, 6, SamplerOptions{});  // greedy: the ranks' GPU argmax
  INFO("stop: " << g.stop_reason);
  CHECK(e.position() >= static_cast<int>(prompt.size()));
  const std::vector<float> z = e.decode(g.tokens.empty() ? prompt.back() : g.tokens.back());
  CHECK(std::all_of(z.begin(), z.end(), [](float x) { return std::isfinite(x); }));
  CHECK_FALSE(std::all_of(z.begin(), z.end(), [&](float x) { return x == z[0]; }));
  const EngineStats& st = e.stats();
  CHECK(st.tensor_parallel == 2);
  CHECK(st.topology == "tensor:2 (ranks on cuda:" + std::to_string(cur) + ",cuda:" + std::to_string(cur) + ")");
  CHECK(st.devices == 1);
  CHECK(st.kv_pool_bytes == single.stats().kv_pool_bytes);
  CHECK(st.kv_pool_bytes > 0);
  REQUIRE(e.n_stages() == 2);  // the ranks
  std::size_t pools = 0;
  for (int r = 0; r < 2; ++r) {
    CHECK(e.stage_store(r).config().n_kv_heads == m.config.n_kv_heads / 2);
    CHECK(e.stage_store(r).length(e.sequence()) == e.position());
    pools += e.stage_store(r).pool_bytes();
  }
  CHECK(pools == single.store().pool_bytes());
  // Refusals, each naming the option and the fix.
  CHECK_THROWS_WITH(kc::CudaEngine(m, engine_cuda(m, f, 3)),
                    kvgate_catch::contains("--tp 3 does not divide the model's 4 KV heads"));
  kc::CudaEngineOptions pp = engine_cuda(m, f, 2);
  pp.engine.pipeline_stages = 2;
  CHECK_THROWS_WITH(kc::CudaEngine(m, pp), kvgate_catch::contains("a layer split (--pp)"));
  CHECK_THROWS_WITH(kc::CudaEngine(m, pp), kvgate_catch::contains("drop one of --tp and --pp"));
  {  // --kv-resident with --tp: a host mirror and a device window per rank, each of the rank's KV heads.
    kc::CudaEngineOptions res = engine_cuda(m, f, 2);
    res.engine.kv_resident = 32;
    kc::CudaEngine se(m, res);
    REQUIRE(se.n_stages() == 2);
    for (int r = 0; r < 2; ++r) {
      REQUIRE(se.stage_host_mirror(r) != nullptr);
      CHECK(se.stage_host_mirror(r)->config().n_kv_heads == m.config.n_kv_heads / 2);
    }
    CHECK(se.stage_host_mirror(0) != se.stage_host_mirror(1));
    CHECK(se.stats().kv_resident_tokens == 32);
  }
  kc::CudaEngineOptions dmg = engine_cuda(m, f, 2);
  dmg.damage = KvDamage{};
  CHECK_THROWS_WITH(kc::CudaEngine(m, dmg), kvgate_catch::contains("KV damage"));
  // KV files are not refused (PAR.cuda.tp.persist checks their bytes): the --tp engine saves the
  // unsplit layout, and the unsplit engine's file of the same run hydrates into it.
  const gates::ScratchDir dir("kvgate_cuda_tp_gate");
  e.save_kv(dir.sub("x.kvf"));
  CHECK(read_kv_file(dir.sub("x.kvf")).header.used_tokens == e.position());
  single.prefill(prompt);
  single.save_kv(dir.sub("y.kvf"));
  const int n = e.hydrate(read_kv_file(dir.sub("y.kvf")), prompt);
  CHECK(n > 0);
  CHECK(e.position() == n);
}
