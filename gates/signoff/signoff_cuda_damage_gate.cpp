// SGN gates of the CUDA engine's injected KV damage (kvgate/kv_damage.hpp, CudaEngineOptions::damage):
// the probes' sensitivity measured on the GPU. Every case is [cuda]: without a device it prints
// "SKIPPED: <reason>" and passes. stories260K, f32 weights, pages of 16 tokens.
//
//  SGN.cuda.damage.zero        A zero-size damage of every family (f32, f16, bf16 KV) leaves the logits
//                              bit-identical to no damage: teacher-forced in chunks and decode steps
//                              (graph replays). Bound: exact (a zero noise adds +-0 to each value read;
//                              v_repeat at size 0 copies no row). A damage on a half that is not a float
//                              format (k8v4) is refused naming the half and the way out.
//  SGN.cuda.damage.changes     A nonzero damage of every family changes the logits (prefill and decode);
//                              k_noise_span [pos0, pos1) leaves every position before pos0 bit-identical
//                              (causal: they never read the damaged keys). An engine whose damage is
//                              replaced after its decode graph was captured (set_damage, reset) gives
//                              bit-identically the logits of a fresh engine made with that damage.
//  SGN.cuda.damage.pages       The device pages after prefill calls of 37 and 20 tokens and 11 decode
//                              steps (calls that start mid-page and cross page edges) equal, bit for bit,
//                              the CPU read hook's own step (apply_kv_damage) applied page by page to the
//                              engine's own undamaged rows (captured before the store kernel) as the CPU
//                              codec stores and reads them, stored again by the CPU codec: every layer,
//                              both halves, f32/f16/bf16, every family. This is the one place the GPU
//                              differs from the CPU engine by design: the damaged value is stored, so on
//                              f16/bf16 it is rounded to the half's format once (the CPU hook uses it
//                              unrounded). Anti-vacuity, rows changed against the undamaged store:
//                              v_noise every V row, k_noise_span exactly the span's K rows, v_repeat some
//                              V rows but not all; the other half never.
//  SGN.cuda.damage.cpu_parity  f32 KV (no rounding of the damaged value), a 256-token corpus sequence,
//                              CUDA chunks of 100 (v_repeat's previous row crosses calls): CUDA-damaged
//                              logits vs CPU-damaged logits per position within the MOD.cuda.logits f32
//                              bound (bounds.hpp: B(chain_cpu) + B(chain_gpu), the GPU chain 8 + n_ctx
//                              roundings per layer longer), both chains 3 roundings per layer longer for
//                              the noise families (the binary64 product rounded to binary32, the add,
//                              amax read from the rounded row). Anti-vacuity: each damage moves the CPU
//                              logits by more than that bound at some position.
//  SGN.cuda.sensitivity.probes_red  The probe model at f16 KV on the CUDA engine (matrix::probe_sensitivity
//                              with device cuda): every probe green undamaged and red under some damage,
//                              the result's engine "cuda".
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bounds.hpp"
#include "catch_compat.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/kv_damage.hpp"
#include "kvgate/matrix.hpp"
#include "kvgate/model.hpp"
#include "kvgate/resolve.hpp"
#include "engine_fixtures.hpp"
#include "models.hpp"

using namespace kvgate;
namespace kc = kvgate::cuda;

#define SGN_DAMAGE_TAGS "[cuda][gate:SGN][fmt:f32][fmt:f16][fmt:bf16]"

#define SGN_REQUIRE_DEVICE_OR_SKIP()                                  \
  do {                                                                \
    const kc::DeviceStatus& st_ = kc::device_status();                \
    if (!st_.available) {                                             \
      WARN("SKIPPED: " << st_.reason);                                \
      return;                                                         \
    }                                                                 \
  } while (0)

namespace {

using kvgate::gates::signoff_engine::stories;

using Weights = std::shared_ptr<const kc::CudaModel>;
// stories260K's f32 weights on the device, one upload per test case (shared by its engines).
Weights stories_weights() { return std::make_shared<const kc::CudaModel>(stories(), kc::WeightType::f32); }

std::vector<int> corpus_seq() { return kvgate::gates::signoff_engine::corpus_sequences(1)[0]; }

constexpr int kBlock = 16;

// resolve_kv(backend "cuda") asks the CUDA capability check, which each program registers itself;
// a test case run alone (a filter, as the mutation driver runs it) must not depend on another one
// having done it first.
ResolvedKv resolve_on_cuda(KvRequest req) {
  kc::register_capability();
  req.backend = "cuda";
  return resolve_kv(req, stories().config, kBlock);
}

kc::CudaEngineOptions cuda_opts(const Weights& w, const std::string& fmt, int chunk, std::optional<KvDamage> d) {
  KvRequest req;
  req.flag = *parse_kv_format(fmt);
  kc::CudaEngineOptions co;
  co.engine.kv = resolve_on_cuda(req);
  REQUIRE(co.engine.kv.effective.name() == fmt);
  co.engine.block_size = kBlock;
  co.engine.prefill_chunk = chunk;
  co.shared_weights = w;
  co.damage = d;
  return co;
}

KvDamage damage(KvDamageKind k, double size) {
  KvDamage d;
  d.kind = k;
  d.size = size;
  d.envelope = 1.0 / 16;
  if (k == KvDamageKind::k_noise_span) d.pos0 = 20, d.pos1 = 90;
  return d;
}

const char* family(KvDamageKind k) {
  return k == KvDamageKind::v_noise ? "v_noise" : k == KvDamageKind::v_repeat ? "v_repeat" : "k_noise_span";
}

const std::vector<KvDamageKind> kFamilies = {KvDamageKind::v_noise, KvDamageKind::v_repeat, KvDamageKind::k_noise_span};
const std::vector<std::string> kFloatFormats = {"f32", "f16", "bf16"};

// Teacher-forced logits of `prompt` (chunks), then the logits of `steps` decode steps feeding `feed`.
struct Run {
  std::vector<float> prefill, decode;
};
Run run(kc::CudaEngine& e, const std::vector<int>& prompt, const std::vector<int>& feed) {
  Run r;
  e.reset();
  r.prefill = e.forward_all_logits(prompt);
  for (int t : feed) {
    const auto& l = e.decode(t);
    r.decode.insert(r.decode.end(), l.begin(), l.end());
  }
  return r;
}

bool same_rows(const std::vector<float>& a, const std::vector<float>& b, std::size_t n) {
  return std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n), b.begin());
}

}  // namespace

TEST_CASE("SGN.cuda.damage.zero a zero-size KV damage on the CUDA engine leaves the logits bit-identical", SGN_DAMAGE_TAGS) {
  SGN_REQUIRE_DEVICE_OR_SKIP();
  const Weights w = stories_weights();
  const auto seq = corpus_seq();
  const std::vector<int> prompt(seq.begin(), seq.begin() + 150), feed(seq.begin() + 150, seq.begin() + 160);
  for (const auto& f : kFloatFormats) {
    kc::CudaEngine plain(stories(), cuda_opts(w, f, 64, std::nullopt));
    const Run ref = run(plain, prompt, feed);
    for (KvDamageKind k : kFamilies) {
      INFO("format " << f << ", family " << family(k));
      kc::CudaEngine zero(stories(), cuda_opts(w, f, 64, damage(k, 0.0)));
      const Run got = run(zero, prompt, feed);
      CHECK(got.prefill == ref.prefill);
      CHECK(got.decode == ref.decode);
      CHECK(zero.forward().graph_replays() > 0);  // the decode steps ran through the captured graph
    }
  }
  // Only float halves take the damage: k8v4's V half (q4_0) is refused, naming it and the way out.
  KvRequest req;
  req.flag = *parse_kv_format("k8v4");
  kc::CudaEngineOptions co;
  co.engine.kv = resolve_on_cuda(req);
  co.shared_weights = w;
  co.damage = damage(KvDamageKind::v_noise, 1.0);
  try {
    kc::CudaEngine e(stories(), co);
    FAIL("a V damage on k8v4 was accepted");
  } catch (const EngineError& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("V half is q4_0") != std::string::npos);
    CHECK(m.find("f32, f16 or bf16") != std::string::npos);
  }
}

TEST_CASE("SGN.cuda.damage.changes a nonzero KV damage changes the CUDA engine's logits, only where it reaches",
          SGN_DAMAGE_TAGS) {
  SGN_REQUIRE_DEVICE_OR_SKIP();
  const Weights w = stories_weights();
  const auto seq = corpus_seq();
  const std::vector<int> prompt(seq.begin(), seq.begin() + 150), feed(seq.begin() + 150, seq.begin() + 160);
  const std::size_t V = static_cast<std::size_t>(stories().config.vocab_size);
  for (const auto& f : kFloatFormats) {
    kc::CudaEngine plain(stories(), cuda_opts(w, f, 64, std::nullopt));
    const Run ref = run(plain, prompt, feed);
    for (KvDamageKind k : kFamilies) {
      INFO("format " << f << ", family " << family(k));
      const KvDamage d = damage(k, k == KvDamageKind::v_repeat ? 0.25 : 1.0);
      kc::CudaEngine hurt(stories(), cuda_opts(w, f, 64, d));
      const Run got = run(hurt, prompt, feed);
      CHECK(got.prefill != ref.prefill);
      CHECK(got.decode != ref.decode);
      if (k == KvDamageKind::k_noise_span) {
        // Positions before the span never read a damaged key; the span's first position does.
        CHECK(same_rows(got.prefill, ref.prefill, static_cast<std::size_t>(d.pos0) * V));
        CHECK_FALSE(same_rows(got.prefill, ref.prefill, static_cast<std::size_t>(d.pos0 + 1) * V));
      }
      // The damage replaced on a used engine (its decode graph captured without it) == a fresh engine.
      kc::CudaEngine reused(stories(), cuda_opts(w, f, 64, std::nullopt));
      (void)run(reused, prompt, feed);
      REQUIRE(reused.forward().graph_captures() > 0);
      reused.set_damage(d);
      const Run again = run(reused, prompt, feed);
      CHECK(again.prefill == got.prefill);
      CHECK(again.decode == got.decode);
    }
  }
}

TEST_CASE("SGN.cuda.damage.pages the CUDA engine's damaged pages == the CPU hook's damage of its own rows, bit for bit",
          SGN_DAMAGE_TAGS) {
  SGN_REQUIRE_DEVICE_OR_SKIP();
  const Weights w = stories_weights();
  const Model& m = stories();
  const ModelConfig& c = m.config;
  const auto seq = corpus_seq();
  const int L = c.n_layers;
  for (const auto& f : kFloatFormats)
    for (KvDamageKind k : kFamilies) {
      INFO("format " << f << ", family " << family(k));
      KvDamage d = damage(k, k == KvDamageKind::v_repeat ? 0.5 : 1.0);
      if (k == KvDamageKind::k_noise_span) d.pos0 = 5, d.pos1 = 45;
      kc::CudaEngine e(m, cuda_opts(w, f, 64, d));
      e.forward().set_capture_kv(true);
      const PageGeometry g = e.store().geometry();
      const int HD = g.row_elems();
      // The undamaged rows of every layer, as the forward handed them to the store kernel.
      std::vector<std::vector<float>> rows_k(static_cast<std::size_t>(L)), rows_v(static_cast<std::size_t>(L));
      auto collect = [&](int R) {
        const auto& ck = e.forward().captured_k();
        const auto& cv = e.forward().captured_v();
        REQUIRE(ck.size() == static_cast<std::size_t>(L) * R * HD);
        for (int l = 0; l < L; ++l) {
          const auto off = static_cast<std::ptrdiff_t>(l) * R * HD;
          rows_k[l].insert(rows_k[l].end(), ck.begin() + off, ck.begin() + off + static_cast<std::ptrdiff_t>(R) * HD);
          rows_v[l].insert(rows_v[l].end(), cv.begin() + off, cv.begin() + off + static_cast<std::ptrdiff_t>(R) * HD);
        }
      };
      int at = 0;
      for (int n : {37, 20}) {  // one forward call each (prefill_chunk 64)
        e.prefill(std::span<const int>(seq.data() + at, static_cast<std::size_t>(n)));
        collect(n);
        at += n;
      }
      for (int s = 0; s < 11; ++s, ++at) {
        e.decode(seq[static_cast<std::size_t>(at)]);
        collect(1);
      }
      REQUIRE(e.position() == at);
      const auto table = e.store().block_table(e.sequence());
      long changed[2] = {0, 0}, pages = 0, differing = 0;
      for (int l = 0; l < L; ++l)
        for (KvHalf h : {KvHalf::K, KvHalf::V}) {
          const HalfFormat hf = e.store().half_format(h);
          const float ts = e.store().tensor_scale(l, h);
          const auto& X = h == KvHalf::K ? rows_k[l] : rows_v[l];
          for (int p0 = 0; p0 < at; p0 += kBlock) {
            const int nt = std::min(kBlock, at - p0);
            std::vector<std::uint8_t> stored(page_bytes(hf, g), 0), want(page_bytes(hf, g), 0);
            std::vector<float> rows(static_cast<std::size_t>(nt) * HD);
            for (int t = 0; t < nt; ++t) {
              quantize_token(hf, g, t, X.data() + static_cast<std::size_t>(p0 + t) * HD, ts, stored.data());
              dequantize_token(hf, g, t, stored.data(), ts, rows.data() + static_cast<std::size_t>(t) * HD);
            }
            const std::vector<float> undamaged = rows;
            apply_kv_damage(d, c.head_dim, l, h, p0, nt, HD, rows.data());
            for (int t = 0; t < nt; ++t) {
              quantize_token(hf, g, t, rows.data() + static_cast<std::size_t>(t) * HD, ts, want.data());
              changed[static_cast<int>(h)] += !std::equal(rows.begin() + static_cast<std::ptrdiff_t>(t) * HD,
                                                          rows.begin() + static_cast<std::ptrdiff_t>(t + 1) * HD,
                                                          undamaged.begin() + static_cast<std::ptrdiff_t>(t) * HD);
            }
            const auto dev = e.store().download_page(l, h, table[static_cast<std::size_t>(p0 / kBlock)]);
            ++pages;
            if (dev != want) {
              ++differing;
              std::size_t i = 0;
              while (i < dev.size() && dev[i] == want[i]) ++i;
              UNSCOPED_INFO("layer " << l << " half " << (h == KvHalf::K ? "K" : "V") << " page " << p0 / kBlock
                                     << ": first differing byte " << i << " (row " << i / (page_bytes(hf, g) / kBlock)
                                     << ")");
            }
          }
        }
      WARN("pages " << f << " " << family(k) << ": " << pages << " pages compared, " << differing
                    << " differ; rows changed K " << changed[0] << " V " << changed[1] << " of " << static_cast<long>(L) * at);
      CHECK(pages == 2L * L * ((at + kBlock - 1) / kBlock));
      CHECK(differing == 0);
      const long all = static_cast<long>(L) * at;
      if (k == KvDamageKind::v_noise) CHECK((changed[0] == 0 && changed[1] == all));
      if (k == KvDamageKind::k_noise_span) CHECK((changed[0] == static_cast<long>(L) * (d.pos1 - d.pos0) && changed[1] == 0));
      if (k == KvDamageKind::v_repeat) CHECK((changed[0] == 0 && changed[1] > 0 && changed[1] < all));
    }
}

TEST_CASE("SGN.cuda.damage.cpu_parity CUDA-damaged logits agree with CPU-damaged logits within the f32 forward bound",
          SGN_DAMAGE_TAGS) {
  SGN_REQUIRE_DEVICE_OR_SKIP();
  const Weights w = stories_weights();
  const Model& m = stories();
  const ModelConfig& c = m.config;
  const auto seq = corpus_seq();
  const std::size_t V = static_cast<std::size_t>(c.vocab_size);
  EngineOptions eo = engine_options_for(*parse_kv_format("f32"), 1);
  eo.block_size = kBlock;
  Engine cpu_plain(m, eo);
  const auto plain = cpu_plain.forward_all_logits(seq);
  for (KvDamageKind k : kFamilies) {
    INFO("family " << family(k));
    const KvDamage d = damage(k, k == KvDamageKind::v_noise ? 4.0 : 0.25);
    EngineOptions eh = eo;
    eh.kv_read_hook = matrix::make_damage_hook(d, c.head_dim);
    Engine cpu(m, eh);
    const auto a = cpu.forward_all_logits(seq);
    kc::CudaEngine gpu_e(m, cuda_opts(w, "f32", 100, d));
    const auto b = gpu_e.forward_all_logits(seq);
    REQUIRE(a.size() == seq.size() * V);
    REQUIRE(b.size() == a.size());
    const double extra = k == KvDamageKind::v_repeat ? 0 : 3.0 * c.n_layers;
    int over = 0, visible = 0;
    double worst = 0, seen = 0;
    for (std::size_t p = 0; p < seq.size(); ++p) {
      double zmax = 0, diff = 0, moved = 0;
      for (std::size_t i = 0; i < V; ++i) {
        zmax = std::max(zmax, std::fabs(double(a[p * V + i])));
        diff = std::max(diff, std::fabs(double(a[p * V + i]) - double(b[p * V + i])));
        moved = std::max(moved, std::fabs(double(a[p * V + i]) - double(plain[p * V + i])));
      }
      const double chain_cpu = kvgate::gates::forward_rounding_chain(c.n_layers, c.dim, c.hidden_dim, c.head_dim, c.q_dim(),
                                                                     static_cast<int>(p)) + extra;
      const double chain_gpu = chain_cpu + c.n_layers * (8 + (p + 1.0));
      const double bound = kvgate::gates::forward_f32_logit_bound(chain_cpu, zmax) +
                           kvgate::gates::forward_f32_logit_bound(chain_gpu, zmax);
      worst = std::max(worst, diff / bound);
      seen = std::max(seen, moved / bound);
      over += diff > bound;
      visible += moved > bound;
    }
    WARN("cpu_parity " << family(k) << ": worst |cuda - cpu| / bound = " << worst
                       << "; largest |damaged - undamaged| / bound (CPU) = " << seen);
    CHECK(over == 0);
    CHECK(visible > 0);
  }
}

TEST_CASE("SGN.cuda.sensitivity.probes_red every probe on the probe model goes red under KV damage on the CUDA engine",
          SGN_DAMAGE_TAGS) {
  SGN_REQUIRE_DEVICE_OR_SKIP();
  auto subject = kvgate::gates::signoff_engine::probe_subject_f16();
  const Model& pm = subject.model;
  EngineOptions& eo = subject.eo;
  eo.prefill_chunk = matrix::signoff_prefill_chunk("cuda");
  matrix::ProbeDevice dev;
  dev.device = "cuda";
  dev.weights = matrix::shared_cuda_weights(pm, "f32");
  const matrix::SensitivityOptions sopt = matrix::sensitivity_options_for({"mxfp4"});  // 2^-2, as the CPU gate
  // The CPU gate's needle case and two more depths: a near-tie on the GPU cannot empty the baseline.
  for (const auto& spec : kvgate::gates::signoff_engine::sensitivity_specs({0.25, 0.5, 0.75})) {
    INFO("probe " << probes::to_string(spec.kind));
    const signoff::ProbeSensitivity p = matrix::probe_sensitivity(pm, eo, spec, sopt, {}, nullptr, &dev);
    WARN("probe " << p.probe << " on " << p.engine << ": " << p.reason);
    CHECK(p.engine == "cuda");
    CHECK(p.baseline_passed > 0);
    CHECK_FALSE(p.vacuous);
    for (const auto& fam : p.families)
      for (std::size_t i = 0; i + 1 < fam.steps.size(); ++i) CHECK_FALSE(fam.steps[i].red());
  }
}
