// SGN gates on an engine: the sign-off's quality measurement and probe sensitivity run on models.
//
//  SGN.quality.paths_agree     The quality runner's two paths on the CPU engine (stories260K, two
//                              corpus sequences of 256 tokens, appended in windows of 100 that cross
//                              prefill chunks and pages): the chunked prefill (chunks that write K/V
//                              into the store in the format, then attend over it) and the decode path
//                              (one decode step per token) give bit-identical logits for every preset.
//                              Bound: exact -- every output element is computed by the same code on
//                              both paths (as MOD.engine.prefill_equals_decode). measure_quality is
//                              window-invariant (windows of 100 and of 1000 give the same metrics
//                              exactly), counts every position, and its decode-path noise run is 0.
//                              Anti-vacuity: q4_0 and the f32-vs-f16 noise run have KL > 0.
//  SGN.sensitivity.hook        The KV read hook: a zero-size damage leaves logits bit-identical to no
//                              hook (the read path is unchanged); a whole-row V repeat changes them.
//  SGN.sensitivity.probes_red  Each probe (needle, counting, echo) on the probe model at f16 KV is
//                              green undamaged and goes red under some injected damage: not vacuous.
//  SGN.cuda.quality.paths_agree [cuda] The same two paths on the CUDA engine (prefill kernel vs decode
//                              kernel), stories260K: f32 KV within twice the f32 forward bound of
//                              bounds.hpp per element; every other preset: the paths differ by less
//                              than the format differs from f32 KV (mean KL, top-1).
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "bounds.hpp"
#include "catch_compat.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/kv_store.hpp"
#include "kvgate/matrix.hpp"
#include "kvgate/model.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate/signoff.hpp"
#include "engine_fixtures.hpp"
#include "models.hpp"

#if KVGATE_SIGNOFF_GATE_CUDA
#include "kvgate/cuda/device.hpp"
#endif

using namespace kvgate;
namespace so = kvgate::signoff;

#define SGN_ENGINE_TAGS "[gate:SGN][fmt:f32][fmt:f16][fmt:bf16][fmt:int8][fmt:fp8][fmt:fp8_e5m2][fmt:q8_0][fmt:q4_0][fmt:k8v4]"

namespace {

using kvgate::gates::signoff_engine::stories;

std::vector<std::vector<int>> corpus2() { return kvgate::gates::signoff_engine::corpus_sequences(2); }

std::vector<float> appended(so::LogitsEngine& e, const std::vector<int>& seq, std::size_t window) {
  e.reset();
  std::vector<float> all;
  for (std::size_t p = 0; p < seq.size(); p += window) {
    const auto w = std::min(window, seq.size() - p);
    const auto l = e.append(std::span<const int>(seq.data() + p, w));
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> v;
  for (const auto& p : presets()) v.emplace_back(p.name);
  return v;
}

}  // namespace

TEST_CASE("SGN.quality.paths_agree the chunked-prefill and decode paths of the quality runner agree bit for bit on the CPU engine",
          SGN_ENGINE_TAGS) {
  const Model& m = stories();
  const auto corpus = corpus2();
  const auto make = so::cpu_engine_factory(m, 1, 128);
  const std::size_t V = static_cast<std::size_t>(m.config.vocab_size);
  for (const auto& f : preset_names()) {
    INFO("preset " << f);
    auto chunked = make(f, so::QualityPath::chunked_prefill);
    auto decode = make(f, so::QualityPath::decode_steps);
    CHECK(chunked->effective() == f);
    for (const auto& seq : corpus) {
      const auto a = appended(*chunked, seq, 100);
      const auto b = appended(*decode, seq, 100);
      REQUIRE(a.size() == seq.size() * V);
      REQUIRE(b.size() == a.size());
      CHECK(a == b);
    }
  }
  // The measurement: window-invariant, every position counted, decode-path noise exactly 0.
  so::QualityOptions q100, q1000;
  q100.window = 100;
  q1000.window = 1000;
  const std::vector<std::string> fmts = {"q4_0", "q8_0"};
  const auto r1 = so::measure_quality(make, fmts, "f16", corpus, so::default_buckets(), q100);
  const auto r2 = so::measure_quality(make, fmts, "f16", corpus, so::default_buckets(), q1000);
  CHECK(r1.positions == 512);
  CHECK(r1.decode_path_positions == 512);
  for (const auto& f : fmts) {
    INFO("format " << f);
    const auto& a = r1.by_format.at(f).all;
    const auto& b = r2.by_format.at(f).all;
    CHECK(a.positions == 512);
    CHECK(a.kl_mean == b.kl_mean);
    CHECK(a.kl_p99 == b.kl_p99);
    CHECK(a.top1 == b.top1);
    CHECK(a.ppl_fmt == b.ppl_fmt);
    CHECK(a.kl_mean > 0);  // anti-vacuity: the lossy format is measured against the baseline, not itself
    CHECK(r1.by_format.at(f).buckets.size() == 4);
    CHECK(r1.by_format.at(f).buckets[0].stats.positions == 512);  // every depth < 1K lands in 0-1K
  }
  CHECK(r1.by_format.at("q4_0").all.kl_mean > r1.by_format.at("q8_0").all.kl_mean);
  REQUIRE(r1.noise.runs.size() == 2);
  CHECK(r1.noise.runs[0].quality.all.kl_mean > 0);  // f32 vs f16: a real difference
  CHECK(r1.noise.runs[1].quality.all.positions == 512);
  CHECK(r1.noise.runs[1].quality.all.kl_max == 0.0);  // decode path == chunked prefill, bitwise
  CHECK(r1.noise.runs[1].quality.all.top1 == 1.0);
}

TEST_CASE("SGN.sensitivity.hook a zero-size damage on the store read changes nothing; a real one changes the logits",
          SGN_ENGINE_TAGS) {
  const Model& m = stories();
  const auto seq = corpus2()[0];
  for (const char* f : {"f32", "q4_0", "k8v4"}) {
    INFO("preset " << f);
    EngineOptions eo = engine_options_for(*parse_kv_format(f), 1);
    Engine plain(m, eo);
    const auto ref = plain.forward_all_logits(seq);
    matrix::Damage zero;
    zero.kind = matrix::DamageKind::v_noise;
    zero.size = 0;
    zero.envelope = 1.0 / 16;
    EngineOptions eh = eo;
    eh.kv_read_hook = matrix::make_damage_hook(zero, m.config.head_dim);
    Engine hooked(m, eh);
    CHECK(hooked.forward_all_logits(seq) == ref);
    matrix::Damage rep;
    rep.kind = matrix::DamageKind::v_repeat;
    rep.size = 1.0;
    EngineOptions er = eo;
    er.kv_read_hook = matrix::make_damage_hook(rep, m.config.head_dim);
    Engine damaged(m, er);
    CHECK(damaged.forward_all_logits(seq) != ref);
  }
}

TEST_CASE("SGN.sensitivity.probes_red every probe on the probe model passes undamaged and goes red under injected KV damage",
          SGN_ENGINE_TAGS) {
  auto subject = kvgate::gates::signoff_engine::probe_subject_f16();
  const Model& pm = subject.model;
  EngineOptions& eo = subject.eo;
  const matrix::SensitivityOptions sopt = matrix::sensitivity_options_for(preset_names());
  // 2^-2 relative (half an E2M1 ulp): the widest envelope of the presets, mxfp4 the first preset with it
  // (nvfp4 ties it; fp8_e5m2's 2^-3 was the widest before the 4-bit float formats).
  CHECK(sopt.envelope_format == "mxfp4");
  CHECK(sopt.envelope == 0x1p-2);
  for (const auto& spec : kvgate::gates::signoff_engine::sensitivity_specs({0.5})) {
    INFO("probe " << probes::to_string(spec.kind));
    const so::ProbeSensitivity p = matrix::probe_sensitivity(pm, eo, spec, sopt);
    CHECK(p.baseline_passed > 0);
    CHECK_FALSE(p.vacuous);
    int red_families = 0;
    for (const auto& f : p.families) {
      red_families += f.smallest_red ? 1 : 0;
      // Each ladder stops at its first red rung: only the last step may be red.
      for (std::size_t i = 0; i + 1 < f.steps.size(); ++i) CHECK_FALSE(f.steps[i].red());
    }
    CHECK(red_families >= 1);
  }
}

#if KVGATE_SIGNOFF_GATE_CUDA
TEST_CASE("SGN.cuda.quality.paths_agree the quality runner's prefill and decode paths agree on the CUDA engine",
          "[cuda]" SGN_ENGINE_TAGS) {
  const auto& st = kvgate::cuda::device_status();
  if (!st.available) {
    WARN("SKIPPED: no CUDA device: " << st.reason);
    return;
  }
  const Model& m = stories();
  const auto corpus = corpus2();
  const auto make = so::device_engine_factory(m, "cuda", 1, 128, 256, "f32");
  const std::size_t V = static_cast<std::size_t>(m.config.vocab_size);
  const ModelConfig& c = m.config;
  // f32 KV: per position |chunked - decode| <= 2 x the f32 forward bound (each path within the bound
  // of the exact value), the chain with the GPU's extra roundings per layer (MOD.cuda.logits).
  {
    auto a_e = make("f32", so::QualityPath::chunked_prefill);
    auto b_e = make("f32", so::QualityPath::decode_steps);
    for (const auto& seq : corpus) {
      const auto a = appended(*a_e, seq, 100);
      const auto b = appended(*b_e, seq, 100);
      REQUIRE(a.size() == seq.size() * V);
      REQUIRE(b.size() == a.size());
      int over = 0;
      double worst = 0;
      for (std::size_t p = 0; p < seq.size(); ++p) {
        double zmax = 0, d = 0;
        for (std::size_t i = 0; i < V; ++i) {
          zmax = std::max(zmax, std::fabs(double(a[p * V + i])));
          d = std::max(d, std::fabs(double(a[p * V + i]) - double(b[p * V + i])));
        }
        const double chain = kvgate::gates::forward_rounding_chain(c.n_layers, c.dim, c.hidden_dim, c.head_dim, c.q_dim(),
                                                                   static_cast<int>(p)) +
                             c.n_layers * (8 + (p + 1.0));
        const double bound = 2 * kvgate::gates::forward_f32_logit_bound(chain, zmax);
        worst = std::max(worst, d / bound);
        over += d > bound;
      }
      INFO("worst |chunked - decode| / bound = " << worst);
      CHECK(over == 0);
    }
  }
  // Lossy presets: the two paths differ by less than the format differs from f32 KV.
  so::QualityOptions qo;
  qo.device = "cuda";
  for (const auto& f : preset_names()) {
    if (f == "f32") continue;
    INFO("preset " << f);
    const auto vs_f32 = so::measure_quality(make, {f}, "f32", corpus, so::default_buckets(), qo);
    const auto paths = so::measure_quality(make, {}, f, corpus, so::default_buckets(), qo);
    const auto& fmt = vs_f32.by_format.at(f).all;
    const auto& dec = paths.noise.runs.at(1).quality.all;  // f decode path vs f chunked
    CHECK(dec.positions == 512);
    CHECK(fmt.kl_mean > 0);
    CHECK(dec.kl_mean <= fmt.kl_mean);
    CHECK(dec.top1 >= fmt.top1);
  }
}
#endif

// ---- provenance outside a git work tree ------------------------------------------------------------------

TEST_CASE("SGN.matrix.no_git the matrix report renders a provenance whose commit and dirty flag are null",
          SGN_ENGINE_TAGS) {
  // A kvgate run outside a git work tree (an installed binary, an unpacked release, the mutation
  // driver's scratch copy) records git_commit and git_dirty as null (matrix::provenance). The
  // Markdown writer read git_dirty as a bool and `kvgate signoff` died with a bare
  // "[json.exception.type_error.302] type must be boolean, but is null" after the whole matrix ran
  // (found when the mutation driver ran gate_cli from a scratch copy outside any git repository).
  // Expected: the report says there is no commit, and a real provenance still shows its commit.
  // Bound: exact text. Anti-vacuity: the same matrix with a commit renders it, dirty or not.
  const Model& m = stories();
  matrix::MatrixOptions mo;
  mo.formats = {"f16"};
  mo.lengths = {};
  mo.timing = mo.probes = mo.quality = false;
  nlohmann::json mj = matrix::run_matrix(m, mo, nlohmann::json::object());
  REQUIRE(mj.contains("provenance"));
  mj["provenance"]["git_commit"] = nullptr;
  mj["provenance"]["git_dirty"] = nullptr;
  std::string md;
  REQUIRE_NOTHROW(md = matrix::matrix_markdown(mj));
  CHECK(md.find("Commit: none (not a git work tree)") != std::string::npos);
  mj["provenance"]["git_commit"] = "0123456789abcdef0123";
  mj["provenance"]["git_dirty"] = true;
  CHECK(matrix::matrix_markdown(mj).find("Commit `0123456789ab` (dirty)") != std::string::npos);
  mj["provenance"]["git_dirty"] = false;
  const std::string clean = matrix::matrix_markdown(mj);
  CHECK(clean.find("Commit `0123456789ab`,") != std::string::npos);
  CHECK(clean.find("(dirty)") == std::string::npos);
}

// ---- the matrix's KV bytes columns against the page sizes, K and V halves apart -------------------------

TEST_CASE("SGN.matrix.kv_bytes kv_bytes_per_token == n_layers x (K page + V page) / block and bytes_per_cell == K cell + V cell, every preset and mixed pairs",
          SGN_ENGINE_TAGS) {
  // The reference is the page geometry: page_bytes / bytes_per_cell of each half (STO.bytes proves them
  // against the docs/FORMATS.md formulas), summed over the K and the V half and the model's layers and
  // divided by the tokens of a page. The class it closes: a bytes column that assumes K and V are
  // stored alike (K counted twice, V counted twice, one half only, one layer only), which every
  // symmetric preset hides; written after an adversarial mutant (the matrix counting the K page twice)
  // survived every gate. Bound: exact (integers).
  // Anti-vacuity: at least two of the formats checked have a K page that differs from their V page,
  // and for them K counted twice (or V twice) gives another number than the reference.
  const Model& m = stories();
  const ModelConfig& c = m.config;
  matrix::MatrixOptions mo;
  for (const Preset& p : presets()) mo.formats.emplace_back(p.name);
  mo.formats.emplace_back("k=q8_0,v=q4_0");
  mo.formats.emplace_back("k=f16,v=fp8_e4m3");
  mo.formats.emplace_back("k=q4_0,v=f32");
  mo.lengths = {};
  mo.timing = mo.probes = mo.quality = false;
  const nlohmann::json mj = matrix::run_matrix(m, mo, nlohmann::json::object());
  int checked = 0, asymmetric = 0;
  for (const auto& fj : mj["formats"]) {
    const std::string name = fj["format"].get<std::string>();
    INFO("format " << name << " effective " << fj["effective"]);
    const auto fmt = parse_kv_format(fj["effective"].get<std::string>());
    REQUIRE(fmt.has_value());
    const int block = mj["config"]["block_size"].get<int>();  // the matrix's page size, from its own record
    REQUIRE(block > 1);
    const PageGeometry g{block, c.n_kv_heads, c.head_dim};
    const std::size_t pk = page_bytes(fmt->k, g), pv = page_bytes(fmt->v, g);
    const std::size_t layers = static_cast<std::size_t>(c.n_layers);
    CHECK(fj["kv_bytes_per_token"].get<std::size_t>() == layers * (pk + pv) / block);
    CHECK(fj["bytes_per_cell"].get<double>() == bytes_per_cell(fmt->k, g) + bytes_per_cell(fmt->v, g));
    if (pk != pv) {
      ++asymmetric;
      CHECK(layers * (pk + pv) / block != layers * 2 * pk / block);
      CHECK(layers * (pk + pv) / block != layers * 2 * pv / block);
    }
    ++checked;
  }
  CHECK(checked == static_cast<int>(presets().size()) + 3);
  CHECK(asymmetric >= 2);
}

// ---- the per-layer ablation ------------------------------------------------------------------------------

TEST_CASE("SGN.matrix.layer_ablation each entry is its format on that one layer, the rest f32, with the KL/top-1 of that engine",
          SGN_ENGINE_TAGS) {
  // The reference: for each layer l, an engine whose per-layer map holds the format on layer l and f32
  // everywhere else (the map is parsed back from the entry), run over the same corpus sequences as the
  // matrix's f32 baseline; KL(f32 || mapped) per position computed here in binary64 from the two
  // engines' logits (own log-softmax), its mean and top-1 agreement. The class it closes: an ablation
  // that puts the format on the wrong layer (off by one, every layer, none), measures against the wrong
  // baseline, or files a layer's numbers under another. Bound: |matrix - reference| <= 1e-9 x the
  // reference + 1e-15 (the same float logits summed in binary64 in another order: at most ~vocab x
  // 2^-53 relative; a wrong layer moves the KL by far more). Anti-vacuity: every layer's KL > 0 and at
  // least three layers' KLs differ (the layers are not interchangeable on stories260K).
  const Model& m = stories();
  const ModelConfig& c = m.config;
  matrix::MatrixOptions mo;
  mo.formats = {"int8"};
  mo.lengths = {};
  mo.timing = mo.probes = false;
  mo.quality = true;
  mo.corpus_path = matrix::default_source_dir() + "/datasets/corpora/stories260K_tf.json";
  mo.layer_ablation = {"q4_0"};
  const nlohmann::json mj = matrix::run_matrix(m, mo, nlohmann::json::object());
  REQUIRE(mj.contains("layer_ablation"));
  const auto& ab = mj["layer_ablation"];
  REQUIRE(ab.size() == static_cast<std::size_t>(c.n_layers));
  const matrix::Corpus corpus = matrix::load_corpus(mo.corpus_path);
  REQUIRE(!corpus.sequences.empty());
  const KvFormat f32{HalfFormat::f32, HalfFormat::f32}, q4{HalfFormat::q4_0, HalfFormat::q4_0};
  auto logits_of = [&](const EngineOptions& eo) {
    std::vector<std::vector<float>> out;
    Engine e(m, eo);
    for (const auto& seq : corpus.sequences) {
      e.reset();
      const int n = std::min<int>(static_cast<int>(seq.size()), e.max_context());
      out.push_back(e.forward_all_logits(std::span<const int>(seq).first(static_cast<std::size_t>(n))));
    }
    return out;
  };
  const std::vector<std::vector<float>> ref = logits_of(engine_options_for(f32));
  const std::size_t V = static_cast<std::size_t>(c.vocab_size);
  std::set<double> kls;
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& a = ab[static_cast<std::size_t>(l)];
    INFO("layer " << l << " entry " << a.dump());
    CHECK(a["layer"] == l);
    CHECK(a["format"] == "q4_0");
    KvLayerMap want(static_cast<std::size_t>(c.n_layers), f32);
    want[static_cast<std::size_t>(l)] = q4;
    CHECK(parse_kv_layer_map(a["map"].get<std::string>(), c.n_layers) == want);
    EngineOptions eo = engine_options_for(f32);
    eo.kv_layers = want;
    const std::vector<std::vector<float>> got = logits_of(eo);
    double kl_sum = 0;
    long long positions = 0, agree = 0;
    for (std::size_t s = 0; s < ref.size(); ++s)
      for (std::size_t t = 0; t < ref[s].size() / V; ++t) {
        const float* p = ref[s].data() + t * V;
        const float* q = got[s].data() + t * V;
        double mp = p[0], mq = q[0];
        std::size_t ap = 0, aq = 0;
        for (std::size_t i = 1; i < V; ++i) {
          if (p[i] > mp) mp = p[i], ap = i;
          if (q[i] > mq) mq = q[i], aq = i;
        }
        double zp = 0, zq = 0;
        for (std::size_t i = 0; i < V; ++i) zp += std::exp(p[i] - mp), zq += std::exp(q[i] - mq);
        double kl = 0;
        for (std::size_t i = 0; i < V; ++i) {
          const double lp = p[i] - mp - std::log(zp), lq = q[i] - mq - std::log(zq);
          kl += std::exp(lp) * (lp - lq);
        }
        kl_sum += std::max(0.0, kl);
        ++positions;
        agree += ap == aq;
      }
    REQUIRE(positions > 0);
    const double kl_mean = kl_sum / static_cast<double>(positions);
    CHECK(a["kl_positions"] == positions);
    CHECK(std::abs(a["kl_mean"].get<double>() - kl_mean) <= 1e-9 * kl_mean + 1e-15);
    CHECK(a["top1"].get<double>() == static_cast<double>(agree) / static_cast<double>(positions));
    CHECK(kl_mean > 0);
    kls.insert(kl_mean);
  }
  CHECK(kls.size() >= 3);
}

// ---- the matrix's capacity column against the pool the engine builds ------------------------------------

TEST_CASE("SGN.matrix.capacity capacity_tokens == the tokens a pool of the budget holds (blocks x block size), every preset",
          SGN_ENGINE_TAGS) {
  // The reference is the pool geometry itself: the engine's store for a byte budget
  // (make_store_config with kv_cache_memory = budget) holds n_blocks pages of block_size tokens per
  // sequence: extending one sequence to n_blocks x block_size tokens succeeds and one more token is
  // refused. Its page count is also checked against the pool rule (kvgate/kv_store.hpp), floor(budget /
  // (n_layers x (K page + V page))), with the pages from page_bytes, which STO.bytes proves against
  // the docs/FORMATS.md formulas.
  // The class it closes: a capacity reported in the wrong unit (blocks, bytes per token of one
  // half, one layer's pool), which ratios between formats hide. Bound: exact (integers).
  // Anti-vacuity: block_size 16 > 1, so a count of blocks differs from the tokens; two budgets,
  // one not a multiple of any pool block; the presets' capacities are not all equal.
  const Model& m = stories();
  const ModelConfig& c = m.config;
  for (const std::size_t budget : {std::size_t(1) << 20, (std::size_t(3) << 20) + 1000}) {
    matrix::MatrixOptions mo;
    for (const Preset& p : presets()) mo.formats.emplace_back(p.name);
    mo.lengths = {};
    mo.timing = mo.probes = mo.quality = false;
    mo.budget_bytes = budget;
    const nlohmann::json mj = matrix::run_matrix(m, mo, nlohmann::json::object());
    std::set<long long> capacities;
    int checked = 0;
    for (const auto& fj : mj["formats"]) {
      const std::string name = fj["format"].get<std::string>();
      INFO("budget " << budget << " format " << name);
      const auto fmt = parse_kv_format(fj["effective"].get<std::string>());
      REQUIRE(fmt.has_value());
      EngineOptions eo = engine_options_for(*fmt);
      eo.kv_cache_memory = budget;
      const StoreConfig sc = make_store_config(m, eo, c.max_seq_len, "engine");
      const PageGeometry g{sc.block_size, c.n_kv_heads, c.head_dim};
      const std::size_t per_block = static_cast<std::size_t>(c.n_layers) * (page_bytes(fmt->k, g) + page_bytes(fmt->v, g));
      REQUIRE(sc.block_size == 16);
      CHECK(static_cast<std::size_t>(sc.n_blocks) == budget / per_block);
      PagedKvStore store(sc);
      const SeqId s = store.create_sequence();
      const long long tokens = static_cast<long long>(sc.n_blocks) * sc.block_size;
      store.extend(s, static_cast<int>(tokens));
      CHECK_THROWS_AS(store.extend(s, 1), KvStoreError);
      CHECK(fj["capacity_tokens"].get<long long>() == tokens);
      CHECK(fj["capacity_tokens"].get<long long>() != sc.n_blocks);
      capacities.insert(tokens);
      ++checked;
    }
    CHECK(checked == static_cast<int>(presets().size()));  // f32 is one of the presets
    CHECK(capacities.size() >= 4);
  }
}
