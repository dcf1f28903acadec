// GPU model gates (docs/CUDA.md): the whole-model CUDA forward (kvgate::cuda::CudaEngine) on stories260K.
//
//  MOD.cuda.greedy.stories260K  GPU greedy (f32 KV; GPU argmax, graph and plain launches, and the
//                               CPU argmax of downloaded logits) == the README's 64 verified ids ==
//                               the CPU engine's, and the same text.
//  MOD.cuda.logits.<fmt>        teacher-forced GPU logits over the committed corpus (8 x 256 tokens,
//                               datasets/corpora/stories260K_tf.json) vs the CPU engine:
//    f32:  per position |gpu - cpu| <= B_gpu(p) + B_cpu(p), B = forward_f32_logit_bound (bounds.hpp,
//          the binary32 rounding chain of the forward, gamma_N * max|z|). The GPU's chain is the
//          CPU's plus, per layer, 8 + n_ctx roundings: the q prescale by scale*log2(e) (1), exp2/expf
//          approximations of <= 2 ulp (softmax, SiLU: 4), the split/tile merge (3), and at most one
//          online-softmax rescale per key (n_ctx). cuBLAS sums the same terms in another order: the
//          chain counts n roundings per length-n dot product whatever the order. NMSE <= the NMSE of
//          the bound; a top-1 difference only where the CPU's top-2 gap is within 2x the bound.
//    lossy: a K/V value on a rounding boundary may quantize differently from a last-ulp difference
//          in the GPU's binary32 rows, so logits are not compared to CPU(fmt) elementwise. Instead
//          GPU(fmt) vs CPU(f32) must meet the model-level budgets MOD.kl applies to CPU(fmt) vs
//          CPU(f32) (bounds.hpp "MOD": mean KL, p99 KL, top-1 disagreements of the reference
//          envelope-noise perturbation R_F in the oracle), and the store bytes must be exact where
//          the input rows are bitwise equal: the GPU's own post-RoPE K/V rows of every layer,
//          quantized by the CPU store, give the GPU store's page bytes bit for bit (every format).
//    Anti-vacuity: logits non-constant and the f32 bound under kOraSensitivity of the logit RMS;
//    a wrong-layer model (layers 0 and 1 swapped) and a wrong-position K rotation (K rotated at
//    pos + 1) exceed the f32 bound; the wrong-layer model exceeds each lossy format's budgets.
//
// Without a device every case prints "SKIPPED: no CUDA device: <reason>" and passes.
#ifndef KVGATE_SOURCE_DIR_DEFAULT
#define KVGATE_SOURCE_DIR_DEFAULT "."  // the corpus is looked up under $KVGATE_SOURCE_DIR, else here
#endif
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kvgate/build_paths.hpp"
#include "../model_vs_oracle/model_harness.hpp"
#include "bounds.hpp"
#include "catch_compat.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate/kv_store.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/numeric.hpp"
#include "kvgate/sampler.hpp"
#include "kvgate/synth.hpp"
#include "scratch_dir.hpp"
#include "cuda_f32_bound.hpp"
#include "cuda_gate_common.hpp"
#include "head_scales.hpp"
#include "model_fixtures.hpp"
#include "models.hpp"

using namespace kvgate;
using namespace kvgate::gates;
using namespace kvgate::gates::model_level;
namespace kc = kvgate::cuda;
using kvgate::gates::cuda_gate::check_f32;
using kvgate::gates::cuda_gate::describe;
using kvgate::gates::cuda_gate::F32Check;

namespace {

const std::vector<int>& kGreedy64 = kvgate::gates::kStories260KGreedy64;
const char* const kGreedyText = kvgate::gates::kStories260KGreedyText;

constexpr int kChunk = 128;  // prefill chunk: each 256-token sequence runs as two chunks (n_past 0, 128)

struct Stories {
  Model rt;
  ko::Transformer ora;
  Corpus corpus;
  std::vector<std::vector<float>> cpu_f32;  // per sequence: CPU engine, f32 KV
};

const Stories& stories() {
  static std::unique_ptr<Stories> s;
  if (s) return *s;
  const ModelLookup lk = find_model("stories260K/stories260K.bin");
  if (!lk.found()) FAIL(lk.message);
  auto st = std::make_unique<Stories>();
  st->rt = load_model(lk.path);
  st->ora = ko::load_llama2c(lk.path);
  st->corpus = load_corpus(corpus_path());
  REQUIRE(st->corpus.sequences.size() == 8);
  for (const auto& seq : st->corpus.sequences) {
    REQUIRE(seq.size() == 256);
    st->cpu_f32.push_back(runtime_logits(st->rt, KvFormat{HalfFormat::f32, HalfFormat::f32}, seq).logits);
  }
  s = std::move(st);
  return *s;
}

kc::CudaEngineOptions gpu_opts(const KvFormat& f, int chunk = kChunk, bool graphs = true) {
  kc::CudaEngineOptions o;
  o.engine = engine_options_for(f, 1);
  o.engine.kv.backend = "cuda";
  o.engine.max_context = 256;
  o.engine.prefill_chunk = chunk;
  o.cuda_graphs = graphs;
  return o;
}

// Teacher-forced GPU logits of every corpus sequence ([8] x [256][vocab]).
std::vector<std::vector<float>> gpu_logits(const Model& m, const KvFormat& f, int k_rope_offset = 0) {
  kc::CudaEngine e(m, gpu_opts(f));
  e.forward().set_k_rope_position_offset(k_rope_offset);
  std::vector<std::vector<float>> out;
  for (const auto& seq : stories().corpus.sequences) {
    e.reset();
    out.push_back(e.forward_all_logits(seq));
    REQUIRE(e.stats().effective_kv == f.name());
    REQUIRE(e.stats().backend == "cuda");
  }
  return out;
}

Model swapped_layers(const Model& m) {  // the wrong-layer model: layers 0 and 1 exchanged
  Model w;
  w.path = m.path + " (layers 0 and 1 swapped)";
  w.config = m.config;
  w.weights = m.weights;
  std::swap(w.weights.layers[0], w.weights.layers[1]);
  return w;
}

// ---- f32: elementwise FP32 forward-error bound ------------------------------------------------------

// check_f32, describe: cuda_f32_bound.hpp (shared with MOD.cuda.window_release).

// ---- store bytes: GPU rows quantized by the CPU store == the GPU store's pages ------------------------

struct BytesCheck {
  long pages = 0, differing = 0, nonzero_bytes = 0;
  std::string first;
  bool per_head = false;  // the engine's store had scales that differ across KV heads
};

// k_scale / v_scale: the engine's KV scales (EngineOptions::k_scale/v_scale; empty: the default).
BytesCheck check_store_bytes(const Model& m, const KvFormat& f, const std::vector<int>& seq,
                             const std::vector<float>& k_scale = {}, const std::vector<float>& v_scale = {}) {
  // One chunk of the whole sequence so the captured rows cover it (the chunked path is what the
  // logits gates use; the store kernel is the same).
  kc::CudaEngineOptions o = gpu_opts(f, static_cast<int>(seq.size()));
  o.engine.k_scale = k_scale;
  o.engine.v_scale = v_scale;
  kc::CudaEngine e(m, o);
  e.forward().set_capture_kv(true);
  (void)e.forward_all_logits(seq);
  const auto& ck = e.forward().captured_k();
  const auto& cv = e.forward().captured_v();
  const ModelConfig& c = m.config;
  const int n = static_cast<int>(seq.size()), kvd = c.kv_dim();
  REQUIRE(ck.size() == static_cast<std::size_t>(c.n_layers) * n * kvd);
  StoreConfig sc = e.store().config();
  PagedKvStore cpu(sc);
  const SeqId cs = cpu.create_sequence();
  cpu.extend(cs, n);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::size_t off = static_cast<std::size_t>(l) * n * kvd;
    cpu.write(cs, l, 0, n, ck.data() + off, static_cast<std::size_t>(kvd), cv.data() + off, static_cast<std::size_t>(kvd));
  }
  BytesCheck r;
  r.per_head = e.store().per_head_scales();
  const auto gt = e.store().block_table(e.sequence());
  const auto ct = cpu.block_table(cs);
  REQUIRE(gt.size() == ct.size());
  for (int l = 0; l < c.n_layers; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V})
      for (std::size_t p = 0; p < gt.size(); ++p) {
        const auto got = e.store().download_page(l, h, gt[p]);
        const std::uint8_t* want = cpu.page(l, h, ct[p]);
        REQUIRE(got.size() == cpu.page_bytes(h));
        ++r.pages;
        for (std::uint8_t b : got) r.nonzero_bytes += b != 0;
        for (std::size_t i = 0; i < got.size(); ++i)
          if (got[i] != want[i]) {
            if (r.differing == 0)
              r.first = "layer " + std::to_string(l) + (h == KvHalf::K ? " K" : " V") + " page " + std::to_string(p) +
                        " byte " + std::to_string(i);
            ++r.differing;
            break;
          }
      }
  return r;
}

// ---- lossy formats: the MOD budgets ---------------------------------------------------------------

std::uint64_t name_seed(const std::string& s) {  // as gates/model_level (FNV-1a of the name)
  std::uint64_t h = 1469598103934665603ull;
  for (char ch : s) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h;
}

Comparison reference_rf(const KvFormat& f, const std::vector<float>& ks, const std::vector<float>& vs) {
  const Stories& s = stories();
  const auto& c = s.ora.config;
  std::vector<std::future<std::vector<float>>> clean, noisy;
  for (std::size_t i = 0; i < s.corpus.sequences.size(); ++i) {
    const auto& seq = s.corpus.sequences[i];
    clean.push_back(std::async(std::launch::async, [&s, &seq] { return ko::forward_all(s.ora, seq); }));
    const auto hook = envelope_noise_hook(f, c.n_kv_heads, c.head_dim(), ks, vs, name_seed(f.name()) + i);
    noisy.push_back(std::async(std::launch::async, [&s, &seq, hook] { return ko::forward_all(s.ora, seq, hook); }));
  }
  Comparison cmp;
  for (std::size_t i = 0; i < clean.size(); ++i) cmp.add(clean[i].get(), noisy[i].get(), c.vocab_size);
  return cmp;
}

Comparison compare(const std::vector<std::vector<float>>& ref, const std::vector<std::vector<float>>& test, int V) {
  Comparison c;
  for (std::size_t i = 0; i < ref.size(); ++i) c.add(ref[i], test[i], V);
  return c;
}

void print_params(const char* id, const KvFormat& f) {
  const Stories& s = stories();
  const auto& d = kc::device_status();
  std::cout << id << ": device " << d.name << " (sm_" << d.cc_major << d.cc_minor << "), model stories260K (dim "
            << s.rt.config.dim << ", " << s.rt.config.n_layers << " layers, " << s.rt.config.n_heads << "/"
            << s.rt.config.n_kv_heads << " heads, head_dim " << s.rt.config.head_dim << "), KV " << f.name()
            << ", corpus " << s.corpus.sequences.size() << " x 256 tokens (seeds";
  for (auto sd : s.corpus.seeds) std::cout << " " << sd;
  std::cout << "), prefill chunk " << kChunk << ", R_F seed FNV1a('" << f.name() << "') + sequence\n";
}

void mod_cuda_logits(const char* id, const std::string& preset) {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  const auto f = parse_kv_format(preset);
  REQUIRE(f.has_value());
  const Stories& s = stories();
  const ModelConfig& c = s.rt.config;
  print_params(id, *f);
  const auto gpu = gpu_logits(s.rt, *f);

  // Store bytes: exact where the input rows are bitwise equal (the GPU's own rows).
  const BytesCheck bc = check_store_bytes(s.rt, *f, s.corpus.sequences[0]);
  std::cout << id << ": store bytes: " << bc.differing << " of " << bc.pages
            << " pages differ from the CPU store fed the GPU's K/V rows" << (bc.first.empty() ? "" : " (first: " + bc.first + ")")
            << ", " << bc.nonzero_bytes << " nonzero bytes\n";
  CHECK(bc.differing == 0);
  CHECK(bc.nonzero_bytes > 0);  // anti-vacuity: the pages hold data

  const Model wrong_layer = swapped_layers(s.rt);
  const auto gpu_wl = gpu_logits(wrong_layer, *f);
  const bool lossy = f->k != HalfFormat::f32 || f->v != HalfFormat::f32;
  if (!lossy) {
    const F32Check r = check_f32(s.cpu_f32, gpu, c);
    const F32Check wl = check_f32(s.cpu_f32, gpu_wl, c);
    const F32Check wp = check_f32(s.cpu_f32, gpu_logits(s.rt, *f, 1), c);
    std::cout << id << ": GPU vs CPU f32: " << describe(r) << "\n"
              << id << ": logit RMS " << r.rms << ", smallest per-position std " << r.min_std << "\n"
              << id << ": wrong layer (0<->1): " << describe(wl) << "\n"
              << id << ": wrong K position (+1): " << describe(wp) << "\n";
    INFO(describe(r));
    REQUIRE(r.nonfinite == 0);  // NaN/Inf first
    CHECK(r.nmse <= r.nmse_bound);
    CHECK(r.worst_ratio <= 1.0);
    CHECK(r.top1_unexplained == 0);
    // Anti-vacuity.
    CHECK(r.min_std > 0);                              // logits are not constant at any position
    CHECK(r.max_bound <= kOraSensitivity * r.rms);     // the bound is tight enough to see a bug
    CHECK(wl.worst_ratio > 1.0);                       // a wrong-layer forward goes red
    CHECK(wp.worst_ratio > 1.0);                       // a wrong-position K rotation goes red
    return;
  }
  // Lossy: GPU(fmt) vs CPU(f32) within MOD.kl's budgets for fmt.
  const auto cpu_f = [&] {
    std::vector<std::vector<float>> out;
    for (const auto& seq : s.corpus.sequences) out.push_back(runtime_logits(s.rt, *f, seq).logits);
    return out;
  }();
  std::vector<float> ks, vs;
  {
    kc::CudaEngine e(s.rt, gpu_opts(*f));
    for (int l = 0; l < c.n_layers; ++l) {
      ks.push_back(e.store().tensor_scale(l, KvHalf::K));
      vs.push_back(e.store().tensor_scale(l, KvHalf::V));
    }
  }
  const Comparison ref = reference_rf(*f, ks, vs);
  const Comparison got = compare(s.cpu_f32, gpu, c.vocab_size);
  const Comparison cpu_ref = compare(s.cpu_f32, cpu_f, c.vocab_size);
  const Comparison wl = compare(s.cpu_f32, gpu_wl, c.vocab_size);
  const double th_mean = ref.mean_kl(), th_p99 = ref.quantile_kl(kModKlQuantile);
  const double th_top1 = mod_top1_allowed(ref.top1_disagree);
  std::cout << std::setprecision(4) << id << ": nonfinite " << got.nonfinite << "; GPU(" << f->name()
            << ") vs CPU(f32): " << got.text() << "\n"
            << id << ": budgets from R_F: mean KL <= " << th_mean << ", p99 KL <= " << th_p99 << ", top-1 differ <= "
            << std::floor(th_top1) << " (R_F: " << ref.text() << ")\n"
            << id << ": for reference CPU(" << f->name() << ") vs CPU(f32): " << cpu_ref.text() << "\n"
            << id << ": wrong layer (0<->1) GPU(" << f->name() << ") vs CPU(f32): " << wl.text() << "\n";
  INFO("GPU(fmt) vs CPU(f32): " << got.text() << "; R_F: " << ref.text());
  REQUIRE(got.nonfinite == 0);
  CHECK(got.mean_kl() <= th_mean);
  CHECK(got.quantile_kl(kModKlQuantile) <= th_p99);
  CHECK(double(got.top1_disagree) <= th_top1);
  // Anti-vacuity: the format changed the logits, the budgets are real, a wrong layer turns this gate
  // red: it exceeds at least one budget (the gate fails on any). Every 8-bit and 16-bit preset's
  // wrong layer exceeds all three; the 4-bit floats' (mxfp4, nvfp4: an E2M1 ulp of 2^-2 on head_dim
  // 8) exceed the mean and top-1 budgets, and their p99 budget is as wide as the damage (measured on
  // an H100: mxfp4 wrong layer p99 KL 10.98 vs budget 11.23).
  CHECK(got.max_abs > 0);
  CHECK(th_mean > 0);
  const bool wl_mean = wl.mean_kl() > th_mean, wl_p99 = wl.quantile_kl(kModKlQuantile) > th_p99,
             wl_top1 = double(wl.top1_disagree) > th_top1;
  INFO("wrong layer over the budgets: mean " << wl_mean << ", p99 " << wl_p99 << ", top-1 " << wl_top1);
  CHECK((wl_mean || wl_p99 || wl_top1));
  CHECK(wl_mean);  // the mean budget sees a wrong layer for every preset
}

}  // namespace

TEST_CASE("MOD.cuda.greedy.stories260K GPU greedy == README ids == CPU engine", "[gate:MOD][cuda][fmt:f32]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  const ModelLookup lk = find_model("stories260K/stories260K.bin");
  if (!lk.found()) FAIL(lk.message);
  const Model m = load_model(lk.path);
  REQUIRE(m.tokenizer != nullptr);
  const KvFormat f32{HalfFormat::f32, HalfFormat::f32};
  const int bos = m.config.bos_id;
  std::cout << "MOD.cuda.greedy.stories260K: device " << kc::device_status().name << ", KV f32, 64 greedy steps after BOS\n";
  // CPU engine reference.
  Engine cpu(m, engine_options_for(f32, 1));
  const GenerateResult rc = cpu.generate(std::span<const int>(&bos, 1), 64, SamplerOptions{});
  CHECK(rc.tokens == kGreedy64);
  for (bool graphs : {true, false}) {
    INFO("cuda graphs " << graphs);
    kc::CudaEngineOptions o;
    o.engine = engine_options_for(f32, 1);
    o.engine.kv.backend = "cuda";
    o.cuda_graphs = graphs;
    kc::CudaEngine e(m, o);
    const GenerateResult r = e.generate(std::span<const int>(&bos, 1), 64, SamplerOptions{});  // GPU argmax
    std::string text;
    int prev = bos;
    for (int id : r.tokens) {
      text += m.tokenizer->decode_piece(prev, id);
      prev = id;
    }
    const EngineStats& st = e.stats();
    std::cout << "MOD.cuda.greedy.stories260K: graphs " << (graphs ? "on" : "off") << ": " << r.tokens.size()
              << " ids, stop " << r.stop_reason << ", decode " << std::setprecision(5) << st.decode_tok_s()
              << " tok/s, graph captures " << e.forward().graph_captures() << ", replays " << e.forward().graph_replays()
              << ", matches README " << (r.tokens == kGreedy64) << ", matches CPU " << (r.tokens == rc.tokens) << "\n";
    CHECK(r.tokens == kGreedy64);
    CHECK(r.tokens == rc.tokens);
    CHECK(text == kGreedyText);
    CHECK(r.stop_reason == "steps");
    CHECK(st.backend == "cuda");
    CHECK(st.effective_kv == "f32");
    CHECK(st.decode_tokens == 63);
    CHECK(st.kv_bytes == cpu.stats().kv_bytes);
    if (graphs) CHECK(e.forward().graph_replays() == 63);
    else CHECK(e.forward().graph_replays() == 0);
    // The logits path: CPU argmax of the downloaded logits, token by token.
    e.reset();
    std::vector<int> ids;
    int next = argmax(e.prefill(std::span<const int>(&bos, 1)));
    for (int i = 0; i < 64; ++i) {
      ids.push_back(next);
      if (i + 1 < 64) next = argmax(e.decode(next));
    }
    CHECK(ids == kGreedy64);
  }
}

#define MOD_CUDA_LOGITS(id, preset)                                                                      \
  TEST_CASE("MOD.cuda.logits." id " GPU teacher-forced logits vs the CPU engine, stories260K corpus",    \
            "[gate:MOD][cuda][fmt:" preset "]") {                                                        \
    mod_cuda_logits("MOD.cuda.logits." id, preset);                                                      \
  }

#define MOD_CUDA_LOGITS_ROW(A, name, k, v, slot, kind) MOD_CUDA_LOGITS(#name, #name)
KVGATE_PRESETS(MOD_CUDA_LOGITS_ROW, _)  // one row per preset: kvgate/format_list.hpp

// MOD.cuda.head_scales.stories260K: the CUDA forward with static fp8 scales per KV head (docs/CUDA.md
// "Static fp8 scales per KV head"; the table distinct per layer, head and half, gate_head_scales) writes
// every layer's pages as the CPU store fed the GPU's own K/V rows: the forward hands each layer's
// store call its row of the device table. Bound: exact bytes. Anti-vacuity: the engine's store is
// per-head, the pages hold data, and every layer's table differs from layer 0's.
TEST_CASE("MOD.cuda.head_scales.stories260K GPU forward with fp8 scales per KV head: every layer's pages == the CPU "
          "store fed the GPU's rows",
          "[gate:MOD][cuda][fmt:fp8][fmt:fp8_e5m2]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  const Stories& s = stories();
  const ModelConfig& c = s.rt.config;
  const auto ks = gate_head_scales(c.n_layers, c.n_kv_heads, KvHalf::K), vs = gate_head_scales(c.n_layers, c.n_kv_heads, KvHalf::V);
  for (const KvFormat f : {KvFormat{HalfFormat::fp8_e4m3, HalfFormat::fp8_e4m3}, KvFormat{HalfFormat::fp8_e4m3, HalfFormat::fp8_e5m2}}) {
    const BytesCheck bc = check_store_bytes(s.rt, f, s.corpus.sequences[0], ks, vs);
    std::cout << "MOD.cuda.head_scales.stories260K: KV " << f.name() << ", " << c.n_layers << " layers x " << c.n_kv_heads
              << " KV heads of scales: " << bc.differing << " of " << bc.pages << " pages differ from the CPU store fed the GPU's rows"
              << (bc.first.empty() ? "" : " (first: " + bc.first + ")") << ", " << bc.nonzero_bytes << " nonzero bytes\n";
    INFO("KV " << f.name() << ": first differing page " << bc.first);
    CHECK(bc.per_head);
    CHECK(bc.differing == 0);
    CHECK(bc.pages >= 2L * c.n_layers);  // every layer's K and V pages were compared
    CHECK(bc.pages % (2L * c.n_layers) == 0);
    CHECK(bc.nonzero_bytes > 0);
  }
  for (int l = 1; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h) CHECK(ks[static_cast<std::size_t>(l * c.n_kv_heads + h)] != ks[static_cast<std::size_t>(h)]);
}

// STO.cuda.weights_bf16: the bf16 weight upload (page-locked double buffer, conversion on all
// cores) stores RNE(host f32) of every weight, the same rounding __float2bfloat16_rn gives and
// f32_to_bf16_rne defines. Bound: exact (bitwise). The matrices span more than one staging buffer
// (2^23 elements) and several tensors follow each other through the two buffers; the host values
// include exact ties and values that round up. Anti-vacuity: RNE differs from truncation on a
// large share of the elements, the f32 vectors (norm gains) arrive bit for bit.
TEST_CASE("STO.cuda.weights_bf16 bf16 upload: every device word is RNE of the host f32 weight",
          "[gate:STO][cuda][fmt:bf16]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  Model m;
  ModelConfig& c = m.config;
  c.arch = "llama";
  c.dim = 256;
  c.hidden_dim = 64;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 128;
  c.vocab_size = 40000;  // 10,240,000 elements per embedding matrix: 2 staging pieces
  c.max_seq_len = 64;
  std::uint64_t x = 0x5EEDull;
  auto next_bits = [&x] {  // finite floats of every magnitude in [2^-20, 2^12), both signs; every 5th a tie
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    std::uint32_t b = static_cast<std::uint32_t>(x >> 32);
    b = (b & 0x807FFFFFu) | ((107u + static_cast<std::uint32_t>((x >> 20) % 32u)) << 23);
    if ((x >> 8) % 5u == 0) b = (b & 0xFFFF0000u) | 0x8000u;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  auto fill = [&](auto& v, std::size_t n) {  // std::vector<float> or Weight (FP32)
    v.resize(n);
    for (float& f : v) f = next_bits();
  };
  const std::size_t D = 256, F = 64, Q = 256, KV = 128, V = 40000;
  fill(m.weights.tok_embeddings, V * D);
  fill(m.weights.classifier, V * D);
  fill(m.weights.final_norm, D);
  m.weights.layers.resize(2);
  for (LayerWeights& L : m.weights.layers) {
    fill(L.attn_norm, D);
    fill(L.ffn_norm, D);
    fill(L.wq, Q * D);
    fill(L.wk, KV * D);
    fill(L.wv, KV * D);
    fill(L.wo, D * Q);
    fill(L.w1, F * D);
    fill(L.w2, D * F);
    fill(L.w3, F * D);
  }
  const kc::CudaModel cm(m, kc::WeightType::bf16);
  std::size_t checked = 0, not_truncation = 0;
  auto check_bf16 = [&](const void* dev, const std::vector<float>& host, const char* what) {
    INFO(what);
    std::vector<std::uint16_t> got(host.size());
    REQUIRE(cudaMemcpy(got.data(), dev, got.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    std::size_t bad = 0, first = host.size();
    for (std::size_t i = 0; i < host.size(); ++i) {
      const std::uint16_t want = f32_to_bf16_rne(host[i]);
      std::uint32_t b;
      std::memcpy(&b, &host[i], 4);
      not_truncation += want != static_cast<std::uint16_t>(b >> 16);
      if (got[i] != want && bad++ == 0) first = i;
    }
    INFO("first bad element " << first);
    CHECK(bad == 0);
    checked += host.size();
  };
  auto check_f32 = [&](const float* dev, const std::vector<float>& host, const char* what) {
    INFO(what);
    std::vector<float> got(host.size());
    REQUIRE(cudaMemcpy(got.data(), dev, got.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(std::memcmp(got.data(), host.data(), host.size() * 4) == 0);
  };
  check_bf16(cm.tok_embeddings(), m.weights.tok_embeddings, "tok_embeddings");
  check_bf16(cm.classifier(), m.weights.classifier, "classifier");
  check_f32(cm.final_norm(), m.weights.final_norm, "final_norm");
  for (int l = 0; l < 2; ++l) {
    const auto& L = m.weights.layers[static_cast<std::size_t>(l)];
    const auto& d = cm.layer(l);
    for (const auto& [dev, host, what] : {std::tuple<const void*, const Weight*, const char*>{d.wq, &L.wq, "wq"},
                                          {d.wk, &L.wk, "wk"}, {d.wv, &L.wv, "wv"}, {d.wo, &L.wo, "wo"},
                                          {d.w1, &L.w1, "w1"}, {d.w2, &L.w2, "w2"}, {d.w3, &L.w3, "w3"}})
      check_bf16(dev, *host, what);
    check_f32(d.attn_norm, L.attn_norm, "attn_norm");
    check_f32(d.ffn_norm, L.ffn_norm, "ffn_norm");
  }
  CHECK(checked > 2 * (std::size_t{1} << 23));  // more than one staging buffer's worth
  CHECK(not_truncation > checked / 4);          // RNE is visible: truncation would fail the check
}

TEST_CASE("STO.cuda.weights_as_stored weights kept as stored reach the device as the FP32 conversion's would",
          "[gate:STO][cuda][fmt:bf16][fmt:f16]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  // Bound: exact. A bf16 checkpoint's words go to the device unchanged (no round trip through FP32
  // can alter them, but a wrong piece offset or a f16 read would); an f16 checkpoint's reach the device
  // as RNE(bf16) of their exact FP32 value, the words the FP32-converted model uploads; FP32 device
  // weights are the converted floats. The embedding (40000 x 256) spans several staging pieces.
  kvgate::gates::ScratchDir t("kvgate-cuda-weights");
  for (const char* dt : {"bf16", "f16"}) {
    INFO(dt);
    SynthOptions o = kvgate::gates::wide_embedding_options(40000);
    o.max_seq_len = 64;
    o.dtype = dt;
    o.out = (t.path() / dt).string();
    synth_hf(o);
    const Model kept = load_hf(o.out), conv = load_hf(o.out, WeightStorage::f32);
    REQUIRE(kept.weights.tok_embeddings.mapped());
    REQUIRE(kept.weights.tok_embeddings.size() > 2 * (std::size_t{1} << 22));  // several pieces of either path
    const kc::CudaModel kb(kept, kc::WeightType::bf16), cb(conv, kc::WeightType::bf16);
    const kc::CudaModel kf(kept, kc::WeightType::f32), cf(conv, kc::WeightType::f32);
    CHECK(kb.weight_bytes() == kc::CudaModel::device_bytes(kept.weights, kc::WeightType::bf16));
    CHECK(kf.weight_bytes() == kc::CudaModel::device_bytes(kept.weights, kc::WeightType::f32));
    CHECK(kb.weight_bytes() == cb.weight_bytes());
    auto words = [](const void* dev, std::size_t n, std::size_t width) {
      std::string b(n * width, '\0');
      REQUIRE(cudaMemcpy(b.data(), dev, b.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
      return b;
    };
    auto same = [&](const void* a, const void* b, const Weight& host, std::size_t width, const char* what) {
      INFO(what);
      const std::string x = words(a, host.size(), width), y = words(b, host.size(), width);
      CHECK(x == y);
      if (width == 2 && std::string(dt) == "bf16")  // the stored words themselves
        CHECK(std::memcmp(x.data(), host.view().half(), x.size()) == 0);
    };
    same(kb.tok_embeddings(), cb.tok_embeddings(), kept.weights.tok_embeddings, 2, "tok_embeddings bf16");
    same(kb.classifier(), cb.classifier(), kept.weights.classifier, 2, "classifier bf16");
    same(kf.tok_embeddings(), cf.tok_embeddings(), kept.weights.tok_embeddings, 4, "tok_embeddings f32");
    const LayerWeights& L = kept.weights.layers[0];
    for (const auto& [a, b, host, what] :
         {std::tuple<const void*, const void*, const Weight*, const char*>{kb.layer(0).wq, cb.layer(0).wq, &L.wq, "wq"},
          {kb.layer(0).wk, cb.layer(0).wk, &L.wk, "wk"},
          {kb.layer(0).w2, cb.layer(0).w2, &L.w2, "w2"}})
      same(a, b, *host, 2, what);
    for (const auto& [a, b, host, what] :
         {std::tuple<const void*, const void*, const Weight*, const char*>{kf.layer(0).wq, cf.layer(0).wq, &L.wq, "wq f32"},
          {kf.layer(0).w3, cf.layer(0).w3, &L.w3, "w3 f32"}})
      same(a, b, *host, 4, what);
  }
}
