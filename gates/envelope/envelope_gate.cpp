// ENV gates: every element of dequant(store(x)) lies within its format's rounding envelope, over
// adversarial populations, with anti-vacuity checks so the bound is really the rounding envelope.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "kvgate/blocks.hpp"
#include "kvgate/format_list.hpp"
#include "bounds.hpp"
#include "catch_compat.hpp"
#include "kvgate_oracle/scalar.hpp"
#include "head_scales.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace ko = kvgate_oracle;

namespace {

struct HalfStats {
  long elements = 0, violations = 0, clamped = 0, fp8_saturated = 0, fp8_pages_without_normals = 0;
  double max_use = 0;  // max err/bound
  std::string first_violation;
};

void note(HalfStats& st, double err, double bound, const std::string& where) {
  ++st.elements;
  if (bound > 0) st.max_use = std::max(st.max_use, err / bound);
  if (!(err <= bound)) {
    if (st.violations++ == 0) {
      std::ostringstream o;
      o.precision(9);
      o << where << ": |x^-x| = " << err << " > bound " << bound;
      st.first_violation = o.str();
    }
  }
}

// Checks one half (x: inputs with row stride, xh: dequantized rows) against the envelope.
void check_half(HalfFormat f, const StoreCase& c, const std::vector<float>& x, const std::vector<float>& xh,
                float tensor_scale, HalfStats& st) {
  const int H = c.n_kv_heads, D = c.head_dim, HD = H * D;
  long page_normals = 0;
  for (int t = 0; t < c.n_tokens; ++t) {
    const float* row = x.data() + static_cast<std::size_t>(t) * c.row_stride();
    const float* rh = xh.data() + static_cast<std::size_t>(t) * HD;
    auto where = [&](int i) {
      return "token " + std::to_string(t) + " elem " + std::to_string(i) + " x=" + std::to_string(row[i]) +
             " x^=" + std::to_string(rh[i]);
    };
    switch (f) {
      case HalfFormat::f32:
        for (int i = 0; i < HD; ++i) note(st, std::fabs(double(rh[i]) - row[i]), 0.0, where(i));
        break;
      case HalfFormat::f16:
        for (int i = 0; i < HD; ++i) note(st, std::fabs(double(rh[i]) - row[i]), f16_bound(row[i]), where(i));
        break;
      case HalfFormat::bf16:
        for (int i = 0; i < HD; ++i) note(st, std::fabs(double(rh[i]) - row[i]), bf16_bound(row[i]), where(i));
        break;
      case HalfFormat::int8:
        for (int h = 0; h < H; ++h) {
          double amax = 0;
          for (int i = 0; i < D; ++i) amax = std::max(amax, std::fabs(double(row[h * D + i])));
          for (int i = h * D; i < (h + 1) * D; ++i)
            note(st, std::fabs(double(rh[i]) - row[i]), absmax127_bound(row[i], amax), where(i));
        }
        break;
      case HalfFormat::fp8_e4m3:
      case HalfFormat::fp8_e5m2: {
        const bool e4 = f == HalfFormat::fp8_e4m3;
        if (t % c.block_size == 0) page_normals = 0;
        for (int i = 0; i < HD; ++i) {
          const double y = std::fabs(double(row[i]) / tensor_scale);
          if (y >= (e4 ? kE4m3MinNormal : kE5m2MinNormal)) ++page_normals;
          if (y > (e4 ? kE4m3Max : kE5m2Max)) ++st.fp8_saturated;
          const double b = e4 ? fp8_e4m3_bound(row[i], tensor_scale) : fp8_e5m2_bound(row[i], tensor_scale);
          note(st, std::fabs(double(rh[i]) - row[i]), b, where(i));
        }
        // Anti-vacuity: every page holds normals (checked when the page is complete or the case ends).
        if ((t % c.block_size == c.block_size - 1 || t == c.n_tokens - 1) && page_normals == 0)
          ++st.fp8_pages_without_normals;
        break;
      }
      case HalfFormat::fp8_per_token_head:
      case HalfFormat::int8_per_token_head:
        // The cell's own scale from its finite amax (FORMATS.md; bounds.hpp fp8_pth_bound / int8_pth_bound).
        for (int h = 0; h < H; ++h) {
          double amax = 0;
          for (int i = h * D; i < (h + 1) * D; ++i)
            if (std::isfinite(row[i])) amax = std::max(amax, std::fabs(double(row[i])));
          for (int i = h * D; i < (h + 1) * D; ++i)
            note(st, std::fabs(double(rh[i]) - row[i]),
                 f == HalfFormat::fp8_per_token_head ? fp8_pth_bound(row[i], amax) : int8_pth_bound(row[i], amax),
                 where(i));
        }
        break;
      case HalfFormat::fp8_block128:
        // The tile's own scale from its finite amax: fp8_pth_bound over 128-element tiles of the row.
        for (int b = 0; b < HD / kTileBlock; ++b) {
          double amax = 0;
          for (int i = b * kTileBlock; i < (b + 1) * kTileBlock; ++i)
            if (std::isfinite(row[i])) amax = std::max(amax, std::fabs(double(row[i])));
          for (int i = b * kTileBlock; i < (b + 1) * kTileBlock; ++i)
            note(st, std::fabs(double(rh[i]) - row[i]), fp8_pth_bound(row[i], amax), where(i));
        }
        break;
      case HalfFormat::q8_0:
        for (int b = 0; b < HD; b += 32) {
          double amax = 0;
          for (int i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(double(row[i])));
          for (int i = b; i < b + 32; ++i)
            note(st, std::fabs(double(rh[i]) - row[i]), absmax127_bound(row[i], amax), where(i));
        }
        break;
      case HalfFormat::mxfp8:
      case HalfFormat::mxfp4:
        for (int b = 0; b < HD; b += 32) {
          double amax = 0;
          for (int i = b; i < b + 32; ++i)
            if (!std::isnan(row[i])) amax = std::max(amax, std::fabs(double(row[i])));
          for (int i = b; i < b + 32; ++i) {
            const bool e4 = f == HalfFormat::mxfp8;
            st.clamped += e4 ? mxfp8_saturated(row[i], amax) : mxfp4_saturated(row[i], amax);
            note(st, std::fabs(double(rh[i]) - row[i]), e4 ? mxfp8_bound(row[i], amax) : mxfp4_bound(row[i], amax),
                 where(i));
          }
        }
        break;
      case HalfFormat::nvfp4:
        for (int b = 0; b < HD; b += 16) {
          double amax = 0;
          for (int i = b; i < b + 16; ++i)
            if (!std::isnan(row[i])) amax = std::max(amax, std::fabs(double(row[i])));
          // The saturated population (counted for anti-vacuity only): beyond 6 S, with S as the page
          // stores it, recomputed with the oracle's scalar E4M3 (FORMATS.md nvfp4 steps 2-3).
          const float S = ko::from_e4m3(ko::to_e4m3(float(amax) / 6.0f / tensor_scale)) * tensor_scale;
          for (int i = b; i < b + 16; ++i) {
            st.clamped += std::fabs(row[i]) > 6.0 * S;
            note(st, std::fabs(double(rh[i]) - row[i]), nvfp4_bound(row[i], amax, tensor_scale), where(i));
          }
        }
        break;
      case HalfFormat::q4_0:
      case HalfFormat::q4_0_rot: {
        // For the rotated format the envelope is stated in the rotated domain: rotate both x and
        // x^ in FP64 (the normalized Hadamard is its own inverse), then apply the q4_0 bound.
        std::vector<double> y(row, row + HD), yh(rh, rh + HD);
        double wht_tol = 0;
        if (f == HalfFormat::q4_0_rot) {
          for (int h = 0; h < H; ++h) {
            for (auto* v : {&y, &yh}) {
              double* p = v->data() + h * D;
              for (int len = 1; len < D; len <<= 1)
                for (int i = 0; i < D; ++i)
                  if (!(i & len)) {
                    const double a = p[i], bb = p[i + len];
                    p[i] = a + bb;
                    p[i + len] = a - bb;
                  }
              for (int i = 0; i < D; ++i) p[i] /= std::sqrt(double(D));
            }
            double l2 = 0;
            for (int i = 0; i < D; ++i) l2 += double(row[h * D + i]) * row[h * D + i];
            wht_tol = std::max(wht_tol, wht_slack(D, std::sqrt(l2)));
          }
        }
        for (int b = 0; b < HD; b += 32) {
          double m = 0;
          for (int i = b; i < b + 32; ++i)
            if (std::fabs(y[i]) > std::fabs(m)) m = y[i];
          for (int i = b; i < b + 32; ++i) {
            const bool cl = q4_0_clamped(y[i], m);
            st.clamped += cl;
            // Rotated case: the runtime rotated in binary32, so its block extreme and elements may
            // differ from the FP64 ones by wht_tol (twice: forward on store, inverse on read).
            const bool maybe_clamped = cl || (wht_tol > 0 && q4_0_clamped_near(y[i], m));
            const double bound = q4_0_bound(y[i], std::fabs(m) + wht_tol, maybe_clamped) + 3 * wht_tol;
            note(st, std::fabs(yh[i] - y[i]), bound, where(i));
          }
        }
        if (f == HalfFormat::q4_0_rot) {
          // L2 per head in the original domain: ||x^-x|| = ||y^-y|| (orthogonal) <= sqrt(sum bound_i^2).
          for (int h = 0; h < H; ++h) {
            double e2 = 0, b2 = 0;
            for (int i = h * D; i < (h + 1) * D; ++i) {
              e2 += (double(rh[i]) - row[i]) * (double(rh[i]) - row[i]);
              double m = 0;
              const int b0 = (i / 32) * 32;
              for (int j = b0; j < b0 + 32; ++j)
                if (std::fabs(y[j]) > std::fabs(m)) m = y[j];
              const double bi = q4_0_bound(y[i], std::fabs(m) + wht_tol, true) + 3 * wht_tol;
              b2 += bi * bi;
            }
            if (!(std::sqrt(e2) <= std::sqrt(b2))) {
              ++st.violations;
              if (st.first_violation.empty())
                st.first_violation = "token " + std::to_string(t) + " head " + std::to_string(h) +
                                     ": L2 error " + std::to_string(std::sqrt(e2)) + " > " + std::to_string(std::sqrt(b2));
            }
          }
        }
        break;
      }
    }
  }
}

bool lossy(HalfFormat f) { return f != HalfFormat::f32; }

void run_env_gate(const KvFormat& fmt, std::uint64_t seed0) {
  long cases_run = 0, cases_small_head = 0;
  HalfStats agg[2];
  for (const StoreCase& c : covering_cases(seed0)) {
    if (!case_supported(fmt, c)) continue;
    ++cases_run;
    if (c.head_dim < 32) ++cases_small_head;
    INFO("format " << fmt.name() << " case " << c.describe());
    // fp8 tensor scales follow the data's magnitude (as a calibrated checkpoint scale would), so
    // the tiny population exercises fp8's normal range rather than flushing to subnormals.
    const float fs = c.pattern == Pattern::tiny ? kTinyMagnitude : 1.0f;
    const StoredCase sc = store_and_read(fmt, c, kGateKScale * fs, kGateVScale * fs);
    REQUIRE(sc.guards.empty());
    // Anti-vacuity: K and V differ (a K/V swap cannot pass unseen).
    double kv_diff = 0;
    for (std::size_t i = 0; i < sc.k.size(); ++i)
      if (!std::isnan(sc.k[i])) kv_diff = std::max(kv_diff, std::fabs(double(sc.k[i]) - sc.v[i]));
    REQUIRE(kv_diff > 0);
    HalfStats st[2];
    check_half(fmt.k, c, sc.k, sc.k_hat, kGateKScale * fs, st[0]);
    check_half(fmt.v, c, sc.v, sc.v_hat, kGateVScale * fs, st[1]);
    for (int h = 0; h < 2; ++h) {
      const HalfFormat hf = h == 0 ? fmt.k : fmt.v;
      INFO((h == 0 ? "K half " : "V half ") << name(hf) << ": " << st[h].elements << " elements, max err/bound "
                                            << st[h].max_use << ", first violation: " << st[h].first_violation);
      CHECK(st[h].violations == 0);
      CHECK(st[h].fp8_saturated == 0);  // nothing saturates outside the saturation cases
      CHECK(st[h].fp8_pages_without_normals == 0);
      if (lossy(hf) && c.pattern == Pattern::gaussian) CHECK(st[h].max_use >= kMinEnvelopeUse);
      agg[h].clamped += st[h].clamped;
      agg[h].max_use = std::max(agg[h].max_use, st[h].max_use);
    }
  }
  INFO("format " << fmt.name());
  // Anti-vacuity over the whole gate: cases ran, small heads (32-blocks spanning heads) were
  // covered, and the q4_0 clamp population was exercised.
  CHECK(cases_run >= 64);
  CHECK(cases_small_head >= 8);
  for (int h = 0; h < 2; ++h) {
    const HalfFormat hf = h == 0 ? fmt.k : fmt.v;
    // q4_0: the clamp population; MX: the saturated population (amax's significand above 1.75);
    // nvfp4: the elements a rounded-down block scale saturates.
    if (hf == HalfFormat::q4_0 || hf == HalfFormat::q4_0_rot || hf == HalfFormat::mxfp8 || hf == HalfFormat::mxfp4 ||
        hf == HalfFormat::nvfp4)
      CHECK(agg[h].clamped > 0);
    if (lossy(hf)) CHECK(agg[h].max_use >= kMinEnvelopeUse);
  }
}

}  // namespace

#define ENV_PRESET(id, preset, seed)                                                        \
  TEST_CASE("ENV." id " every element within the envelope", "[gate:ENV][fmt:" preset "]") { \
    const auto f = parse_kv_format(preset);                                                 \
    REQUIRE(f.has_value());                                                                 \
    run_env_gate(*f, seed);                                                                 \
  }

#define ENV_PRESET_ROW(A, name, k, v, slot, kind) ENV_PRESET(#name, #name, (100 * slot))
KVGATE_PRESETS(ENV_PRESET_ROW, _)  // one row per preset: kvgate/format_list.hpp
ENV_PRESET("mixed", "k=q8_0,v=fp8_e5m2", 1000)

namespace {

// ENV.mla.<half>: the MLA latent cache (KvLayout::mla_latent). Per token one row in two halves of
// their own widths: the K half the latent c_kv (kv_lora_rank elements), the V half the shared RoPE
// key (qk_rope_head_dim). Every element of both halves within the half format's envelope, the format
// once as the latent (RoPE key in bf16) and once as the RoPE key (latent in bf16), over a DeepSeek
// shape (512 + 64), the tiny references' (32 + 8) and two between, every population, pages of 16, 3
// and 7 tokens; a half the geometry does not hold (a 32-block format on an 8-wide RoPE row) is left
// out, as the resolver would. The same checks as the K/V rows (check_half), on the latent store.
void run_env_mla(HalfFormat hf, std::uint64_t seed0) {
  struct Shape {
    int latent, rope, block;
  };
  const Shape shapes[] = {{512, 64, 16}, {32, 8, 16}, {128, 32, 7}, {64, 16, 3}};
  long checked[2] = {0, 0};
  HalfStats agg[2];
  std::uint64_t i = 0;
  for (const Shape& sh : shapes)
    for (Pattern p : kAllPatterns)
      for (int as_v = 0; as_v < 2; ++as_v) {
        const KvFormat fmt = as_v ? KvFormat{HalfFormat::bf16, hf} : KvFormat{hf, HalfFormat::bf16};
        const int n = 2 * sh.block + sh.block / 2 + 1;
        const StoreCase ck{sh.block, 1, sh.latent, n, p, seed0 + 2 * i, static_cast<int>(i % 3 == 0 ? 5 : 0)};
        const StoreCase cv{sh.block, 1, sh.rope, n, p, seed0 + 2 * i + 1, 0};
        ++i;
        if (!supports(fmt.k, PageGeometry{sh.block, 1, sh.latent}).ok || !supports(fmt.v, PageGeometry{sh.block, 1, sh.rope}).ok)
          continue;
        INFO("format " << fmt.name() << " latent " << sh.latent << " rope " << sh.rope << " case " << ck.describe());
        const float fs = p == Pattern::tiny ? kTinyMagnitude : 1.0f;
        StoreConfig cfg;
        cfg.format = fmt;
        cfg.n_layers = 1;
        cfg.layout = KvLayout::mla_latent;
        cfg.n_kv_heads = 1;
        cfg.head_dim = sh.latent;
        cfg.v_head_dim = sh.rope;
        cfg.block_size = sh.block;
        cfg.n_blocks = (n + sh.block - 1) / sh.block + 2;
        cfg.k_scale = {kGateKScale * fs};
        cfg.v_scale = {kGateVScale * fs};
        const std::vector<float> k = make_rows(ck, kGateKMagnitude, 1), v = make_rows(cv, kGateVMagnitude, 2);
        PagedKvStore store(cfg);
        const SeqId s = store.create_sequence();
        store.extend(s, n);
        store.write(s, 0, 0, n, k.data(), ck.row_stride(), v.data(), cv.row_stride());
        std::vector<float> kh(static_cast<std::size_t>(n) * sh.latent), vh(static_cast<std::size_t>(n) * sh.rope);
        store.read(s, 0, KvHalf::K, 0, n, kh.data());
        store.read(s, 0, KvHalf::V, 0, n, vh.data());
        REQUIRE(store.check_guards().empty());
        HalfStats st[2];
        check_half(fmt.k, ck, k, kh, kGateKScale * fs, st[0]);
        check_half(fmt.v, cv, v, vh, kGateVScale * fs, st[1]);
        const HalfStats& mine = st[as_v];
        INFO(name(hf) << " as the " << (as_v ? "RoPE key" : "latent") << ": " << mine.elements
                      << " elements, max err/bound " << mine.max_use << ", first violation: " << mine.first_violation);
        CHECK(st[0].violations == 0);
        CHECK(st[1].violations == 0);
        CHECK(mine.fp8_saturated == 0);
        CHECK(mine.fp8_pages_without_normals == 0);
        CHECK(mine.elements == static_cast<long>(n) * (as_v ? sh.rope : sh.latent));  // every element was checked
        ++checked[as_v];
        agg[as_v].max_use = std::max(agg[as_v].max_use, mine.max_use);
      }
  INFO(name(hf) << ": " << checked[0] << " cases as the latent, " << checked[1] << " as the RoPE key");
  // Anti-vacuity: every shape whose row the format's blocks divide (docs/FORMATS.md, counted here from
  // the traits' block size, not from supports()) ran in both roles: every format holds the latent rows
  // of 512 and 128 (fp8_block128 only those), a 32-block format skips the 8- and 16-wide RoPE rows,
  // fp8_block128 every RoPE row. A lossy format used a real part of its envelope in each role it ran.
  const long P = static_cast<long>(std::size(kAllPatterns));
  long fit[2] = {0, 0};
  for (const Shape& sh : shapes) {
    fit[0] += sh.latent % info(hf).block_elems == 0;
    fit[1] += sh.rope % info(hf).block_elems == 0;
  }
  CHECK(fit[0] >= 2);
  CHECK(checked[0] == fit[0] * P);
  CHECK(checked[1] == fit[1] * P);
  if (lossy(hf)) {
    CHECK(agg[0].max_use >= kMinEnvelopeUse);
    if (fit[1] > 0) CHECK(agg[1].max_use >= kMinEnvelopeUse);
  }
}

}  // namespace

#define ENV_MLA_ROW(A, name, prefill_mma)                                                                 \
  TEST_CASE("ENV.mla." #name " MLA latent cache: every latent and RoPE-key element within the envelope", \
            "[gate:ENV][mla]") {                                                                          \
    run_env_mla(HalfFormat::name, 8100u + static_cast<std::uint32_t>(HalfFormat::name) * 100u);           \
  }
KVGATE_HALF_FORMATS(ENV_MLA_ROW, _)  // one gate per half format: kvgate/format_list.hpp

// fp8 saturation: values beyond the largest finite code clamp to +-max*s; inf clamps too; NaN stays NaN.
static void run_saturation(HalfFormat hf, double fmax) {
  const float s = kGateKScale;
  const StoreCase c{4, 2, 32, 4, Pattern::gaussian, 42, 0};
  std::vector<float> k(static_cast<std::size_t>(c.n_tokens) * 64);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>((i % 2 ? 1 : -1) * fmax * s * (1.0 + 0.5 * (i % 7)));
  k[5] = std::numeric_limits<float>::infinity();
  k[6] = -std::numeric_limits<float>::infinity();
  k[7] = std::nanf("");
  std::vector<float> v(k.size(), 0.25f);
  PagedKvStore store(case_config({hf, HalfFormat::f32}, c, s, 1.0f));
  const SeqId id = store.create_sequence();
  store.extend(id, c.n_tokens);
  store.write(id, 0, 0, c.n_tokens, k.data(), 64, v.data(), 64);
  std::vector<float> kh(k.size());
  store.read(id, 0, KvHalf::K, 0, c.n_tokens, kh.data());
  long saturated = 0;
  for (std::size_t i = 0; i < k.size(); ++i) {
    INFO("element " << i << " x=" << k[i] << " x^=" << kh[i] << " scale " << s);
    if (std::isnan(k[i])) {
      CHECK(std::isnan(kh[i]));
      continue;
    }
    const double expect = std::copysign(fmax * s, double(k[i]));
    CHECK(std::fabs(double(kh[i]) - expect) <= 4 * kU32 * std::fabs(expect));
    ++saturated;
  }
  CHECK(saturated >= 60);  // anti-vacuity: the case really is about saturation
}

TEST_CASE("ENV.fp8.saturation values past 448 clamp to +-448*s", "[gate:ENV][fmt:fp8]") {
  run_saturation(HalfFormat::fp8_e4m3, kE4m3Max);
}
TEST_CASE("ENV.fp8_e5m2.saturation values past 57344 clamp to +-57344*s", "[gate:ENV][fmt:fp8_e5m2]") {
  run_saturation(HalfFormat::fp8_e5m2, kE5m2Max);
}

TEST_CASE("ENV.fp8.head_scales per-KV-head scales: every element within the envelope of its own head's scale",
          "[gate:ENV][fmt:fp8][fmt:fp8_e5m2]") {
  // Bound: FORMATS.md "fp8" with s the element's head's scale: |x^ - x| <= 2^-4 |x| + 2^-10 s (e4m3),
  // 2^-3 |x| + 2^-17 s (e5m2), + 4u|x| (bounds.hpp fp8_e4m3_bound / fp8_e5m2_bound); every x / s is
  // normal and unsaturated (head_scales.hpp). Scales distinct per head, layer and half.
  // Anti-vacuity: the worst element uses more than a quarter of its bound (the bound is not loose by
  // orders of magnitude), and the same codes read with head 0's scale on every head break the bound
  // on some element of every (layer, half).
  const int L = 3, H = 4, D = 16, B = 16, n = 40;
  for (HalfFormat hf : {HalfFormat::fp8_e4m3, HalfFormat::fp8_e5m2}) {
    const bool e4 = hf == HalfFormat::fp8_e4m3;
    const auto ks = gate_head_scales(L, H, KvHalf::K), vs = gate_head_scales(L, H, KvHalf::V);
    const HeadScaledStore st = fill_head_scaled({hf, hf}, L, H, D, B, n, ks, vs, 23);
    for (int l = 0; l < L; ++l)
      for (KvHalf kh : {KvHalf::K, KvHalf::V}) {
        INFO(name(hf) << " layer " << l << (kh == KvHalf::K ? " K" : " V"));
        const auto& x = kh == KvHalf::K ? st.k[static_cast<std::size_t>(l)] : st.v[static_cast<std::size_t>(l)];
        std::vector<float> xh(x.size());
        st.store->read(st.seq, l, kh, 0, n, xh.data());
        const auto hs = st.store->head_scales(l, kh);
        double worst = 0;
        bool wrong_breaks = false;
        long violations = 0;
        std::string first;
        for (std::size_t i = 0; i < x.size(); ++i) {
          const std::size_t h = (i % static_cast<std::size_t>(H * D)) / D;
          const double b = e4 ? fp8_e4m3_bound(x[i], hs[h]) : fp8_e5m2_bound(x[i], hs[h]);
          const double err = std::fabs(double(xh[i]) - x[i]);
          if (!(err <= b) && violations++ == 0)
            first = "element " + std::to_string(i) + " (head " + std::to_string(h) + "): x " + std::to_string(x[i]) +
                    " read " + std::to_string(xh[i]) + " bound " + std::to_string(b);
          worst = std::max(worst, err / b);
          const double wrong = double(xh[i]) / hs[h] * hs[0];  // the codes with head 0's scale
          wrong_breaks |= std::fabs(wrong - x[i]) > b;
        }
        INFO(violations << " elements outside the envelope; first: " << first);
        CHECK(violations == 0);
        CHECK(worst > 0.25);
        CHECK(wrong_breaks);
      }
  }
}

// ENV.declared: the envelope the runtime declares (envelope_bound, what `kvgate formats` and the
// reports publish next to each format) is the normative one of docs/FORMATS.md, written out here:
// for a stored scale s and element x, |x^ - x| <= max(rel |x| + c s, floor), c the coefficient of
// the element's population (q4_0's clamped one), plus for the quantized formats at most the binary32
// slack of one quotient and one product, budgeted at 2^-20 (s + |x|). Not looser (a declared bound a
// coefficient too high would hide errors behind a published number) and not tighter. The
// microscaled formats (mxfp8, mxfp4, nvfp4) declare a bound in terms of their block's amax that
// has no closed form in (x, s); this gate leaves them to ENV.<fmt>, which derives theirs.
TEST_CASE("ENV.declared every closed-form declared envelope equals the normative one of docs/FORMATS.md",
          "[gate:ENV][fmt:int8][fmt:q8_0][fmt:q4_0][fmt:fp8][fmt:fp8_e5m2][fmt:f16][fmt:bf16][fmt:f32]") {
  struct Normative {
    HalfFormat f;
    double rel, c, c_clamped, floor;
    bool slack;
  };
  const Normative table[] = {
      {HalfFormat::f32, 0, 0, 0, 0, false},
      {HalfFormat::f16, 0x1p-11, 0, 0, 0x1p-25, false},  // half an ulp; half the subnormal spacing 2^-24
      {HalfFormat::bf16, 0x1p-8, 0, 0, 0, false},
      {HalfFormat::int8, 0, 0.5, 0.5, 0, true},           // s/2
      {HalfFormat::q8_0, 0, 0.5, 0.5, 0, true},           // d/2
      {HalfFormat::q4_0, 0, 0.5, 1.0, 0, true},           // |d|/2; clamped to code 15: |d|
      {HalfFormat::q4_0_rot, 0, 0.5, 1.0, 0, true},       // as q4_0, in the rotated domain
      {HalfFormat::fp8_e4m3, 0x1p-4, 0x1p-10, 0x1p-10, 0, true},
      {HalfFormat::fp8_e5m2, 0x1p-3, 0x1p-17, 0x1p-17, 0, true},
      {HalfFormat::fp8_per_token_head, 0x1p-4, 0x1p-10, 0x1p-10, 0, true},
      {HalfFormat::int8_per_token_head, 0, 0.5, 0.5, 0, true},
      {HalfFormat::fp8_block128, 0x1p-4, 0x1p-10, 0x1p-10, 0, true},  // the tile's s
  };
  const float xs[] = {0.0f, 1e-30f, 3e-6f, 0.37f, -1.0f, 5.5f, -300.0f, 6e4f};
  const float ss[] = {0x1p-20f, 0.0123f, 1.0f, 3.75f, 512.0f};
  int checked = 0;
  for (const Normative& n : table)
    for (const bool clamped : {false, true})
      for (const float x : xs)
        for (const float s : ss) {
          const double ax = std::fabs(static_cast<double>(x)), sd = static_cast<double>(s);
          const double want = std::max(n.rel * ax + (clamped ? n.c_clamped : n.c) * sd, n.floor);
          const double budget = n.slack ? 0x1p-20 * (sd + ax) : 0.0;
          const double got = envelope_bound(n.f, x, s, clamped);
          INFO(name(n.f) << " x=" << x << " s=" << s << (clamped ? " clamped" : "") << ": declared " << got
                         << ", normative " << want << " + at most " << budget);
          CHECK(got >= want);
          CHECK(got <= want + budget);
          ++checked;
        }
  CHECK(checked == static_cast<int>(std::size(table)) * 2 * 8 * 5);
}
