// ORA.mla.<half>: the MLA latent cache (KvLayout::mla_latent) against the independent oracle, one
// gate per half format of the latent (kvgate/format_list.hpp), each with the RoPE key in bf16 (the
// field's fp8_ds_mla-style split) and in a second format (the latent's own where the RoPE width
// allows it, else f16).
//
// Per case (random MLA geometry, context and queries; seed printed):
//  1. bytes: every page of both halves equals the oracle's quantize_page of the rows written (the
//     latent with K's format and scale, the RoPE key with V's: a RoPE key stored in the latent's
//     format, or with its scale, differs);
//  2. attention: the runtime's weight-absorbed latent attention (mla_latent_attention) == the
//     oracle's textbook expanded MLA in FP64 (mla_attention_f64) over the oracle's dequantization
//     of the same pages. NaN/Inf first, then NMSE, then max-abs against mla_absorbed_f32_max_abs
//     (gates/common/bounds.hpp: derived from the roundings of the absorbed chain).
// Anti-vacuity: the bound stays under kOraSensitivity of the output RMS; dropping the RoPE key from
// the score, transposing the absorbed W_UK (another head's W_UK) or scaling by the latent width's
// 1/sqrt(kv_lora) each move the oracle's output by more than 4x the bound; a lossy half really
// quantized (the oracle over the unquantized rows differs).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <vector>

#include "bounds.hpp"
#include "catch_compat.hpp"
#include "kvgate/attention_mla.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate_oracle/attention.hpp"
#include "kvgate_oracle/formats.hpp"
#include "kvgate_oracle/metrics.hpp"
#include "oracle_fixtures.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace ko = kvgate_oracle;

namespace {

struct MlaCase {
  int heads, nope, rope, v_dim, kv_lora, block, n_ctx, n_q;
};

// Geometries: latent widths 64 / 128 / 96 (not a power of two: the rotated q4_0 refuses it),
// RoPE widths 8..32, one to four heads, contexts across page edges, decode (n_q 1) and a prefill tail.
const MlaCase kCases[] = {
    {4, 16, 16, 16, 64, 16, 1, 1},   {4, 16, 16, 16, 64, 16, 17, 1},  {2, 32, 8, 24, 128, 16, 40, 5},
    {3, 8, 32, 8, 96, 7, 23, 3},     {1, 16, 16, 32, 64, 3, 12, 12},  {4, 24, 16, 16, 128, 16, 33, 2},
};

struct Outcome {
  int cases = 0, lossy_cases = 0, lossy_seen = 0;
};

void run_case(HalfFormat latent_f, HalfFormat rope_f, const MlaCase& mc, std::uint32_t seed, Outcome& out) {
  const PageGeometry gk{mc.block, 1, mc.kv_lora}, gv{mc.block, 1, mc.rope};
  if (!supports(latent_f, gk).ok || !supports(rope_f, gv).ok) return;
  const int H = mc.heads, N = mc.nope, R = mc.rope, VD = mc.v_dim, KL = mc.kv_lora, QK = N + R, T = mc.n_ctx;
  std::cout << "ORA.mla latent " << name(latent_f) << " rope " << name(rope_f) << ": heads " << H << " nope " << N
            << " rope " << R << " v " << VD << " kv_lora " << KL << " block " << mc.block << " ctx " << T << " n_q "
            << mc.n_q << " seed " << seed << "\n";
  INFO("latent " << name(latent_f) << ", rope " << name(rope_f) << ", heads " << H << ", kv_lora " << KL << ", rope "
                 << R << ", ctx " << T << ", n_q " << mc.n_q << ", seed " << seed);
  std::mt19937 g(seed);
  // The latent is an RMSNorm output (O(1)); the RoPE key a rotated projection; W ~ 1/sqrt(kv_lora).
  const std::vector<float> lat = normal_rows(g, static_cast<std::size_t>(T) * KL, 1.0f);
  const std::vector<float> rk = normal_rows(g, static_cast<std::size_t>(T) * R, 1.0f);
  const std::vector<float> w = normal_rows(g, static_cast<std::size_t>(H) * (N + VD) * KL, 1.0f / std::sqrt(float(KL)));
  const std::vector<float> q = normal_rows(g, static_cast<std::size_t>(mc.n_q) * H * QK, 0.4f);

  StoreConfig sc;
  sc.format = {latent_f, rope_f};
  sc.layout = KvLayout::mla_latent;
  sc.n_layers = 1;
  sc.n_kv_heads = 1;
  sc.head_dim = KL;
  sc.v_head_dim = R;
  sc.block_size = mc.block;
  sc.n_blocks = (T + mc.block - 1) / mc.block + 1;
  sc.k_scale = {kGateKScale};
  sc.v_scale = {kGateVScale};
  PagedKvStore store(sc);
  const SeqId s = store.create_sequence();
  store.extend(s, T);
  store.write(s, 0, 0, T, lat.data(), static_cast<std::size_t>(KL), rk.data(), static_cast<std::size_t>(R));

  // 1. Bytes of every page == the oracle's quantization of the rows written, each half with its format.
  const ko::PageShape shk{mc.block, 1, KL}, shv{mc.block, 1, R};
  const auto table = store.block_table(s);
  std::vector<float> latd(lat.size()), rkd(rk.size());
  for (std::size_t p = 0; p < table.size(); ++p) {
    const int t0 = static_cast<int>(p) * mc.block, n = std::min(mc.block, T - t0);
    if (n <= 0) break;
    for (const bool k_half : {true, false}) {
      const KvHalf h = k_half ? KvHalf::K : KvHalf::V;
      const int width = k_half ? KL : R;
      const ko::PageShape sh = k_half ? shk : shv;
      const ko::Half oh = oracle_half(store.half_format(h));
      const std::vector<float> hs(store.head_scales(0, h).begin(), store.head_scales(0, h).end());
      const std::vector<float>& rows = k_half ? lat : rk;
      const std::vector<std::uint8_t> want =
          ko::quantize_page(oh, sh, rows.data() + static_cast<std::size_t>(t0) * width, n, hs);
      REQUIRE(want.size() == store.page_bytes(h));
      const std::uint8_t* got = store.page(0, h, table[p]);
      INFO((k_half ? "latent" : "RoPE key") << " page " << p << ": runtime bytes == oracle bytes");
      CHECK(std::equal(want.begin(), want.end(), got));
      const std::vector<float> deq = ko::dequantize_page(oh, sh, got, n, hs);
      std::copy(deq.begin(), deq.end(), (k_half ? latd : rkd).begin() + static_cast<std::ptrdiff_t>(t0) * width);
    }
  }

  // 2. Absorbed attention (runtime, FP32) vs the expanded oracle (FP64) over the same dequantized rows.
  const double scale = 1.0 / std::sqrt(double(QK));
  const MlaDims d{H, N, R, VD, KL};
  MlaAttentionArgs ma;
  ma.n_q = mc.n_q;
  ma.pos0 = T - mc.n_q;
  ma.softmax_scale = static_cast<float>(scale);
  std::vector<float> got(static_cast<std::size_t>(mc.n_q) * H * VD);
  mla_latent_attention(store, s, 0, d, ma, q.data(), w.data(), got.data());
  const ko::MlaShape ms{mc.n_q, H, T, N, R, VD, KL, T - mc.n_q, scale};
  std::vector<double> ref(got.size());
  ko::mla_attention_f64(ms, q.data(), latd.data(), rkd.data(), w.data(), ref.data());

  // Bound inputs over the dequantized rows: the expanded score's absolute sum, |v|, W_UV's row L1, |c|.
  double max_l1 = 0, vmax = 0, wl1 = 0, cmax = 0;
  for (float x : latd) cmax = std::max(cmax, double(std::fabs(x)));
  for (int h = 0; h < H; ++h) {
    const float* wh = w.data() + static_cast<std::size_t>(h) * (N + VD) * KL;
    for (int v = 0; v < VD; ++v) {
      double l1 = 0;
      for (int j = 0; j < KL; ++j) l1 += std::fabs(double(wh[(N + v) * KL + j]));
      wl1 = std::max(wl1, l1);
    }
    for (int t = 0; t < T; ++t) {
      const float* c = latd.data() + static_cast<std::size_t>(t) * KL;
      for (int v = 0; v < VD; ++v) {
        double x = 0;
        for (int j = 0; j < KL; ++j) x += double(wh[(N + v) * KL + j]) * c[j];
        vmax = std::max(vmax, std::fabs(x));
      }
      for (int i = 0; i < mc.n_q; ++i) {
        const float* qh = q.data() + (static_cast<std::size_t>(i) * H + h) * QK;
        double l1 = 0;
        for (int n = 0; n < N; ++n)
          for (int j = 0; j < KL; ++j) l1 += std::fabs(double(qh[n]) * wh[n * KL + j] * c[j]);
        for (int r = 0; r < R; ++r) l1 += std::fabs(double(qh[N + r]) * rkd[static_cast<std::size_t>(t) * R + r]);
        max_l1 = std::max(max_l1, l1 * scale);
      }
    }
  }
  const double bound = mla_absorbed_f32_max_abs(N, R, KL, T, max_l1, vmax, wl1, cmax);
  // NaN/Inf, NMSE, max-abs; the bound under kOraSensitivity of the output's RMS (anti-vacuity).
  const double rms = check_within_bound(ref, got, bound);
  std::cout << "  max-abs " << ko::max_abs_diff(ref, got) << ", bound " << bound << " = " << bound / rms
            << " of the output RMS\n";
  auto other = [&](const std::vector<float>& q2, const std::vector<float>& l2, const std::vector<float>& r2,
                   const std::vector<float>& w2, double scale2) {
    ko::MlaShape m2 = ms;
    m2.softmax_scale = scale2;
    std::vector<double> alt(ref.size());
    ko::mla_attention_f64(m2, q2.data(), l2.data(), r2.data(), w2.data(), alt.data());
    return ko::max_abs_diff(alt, ref);
  };
  if (T > 1) {  // with one key every score gives weight 1: the score-side checks need two keys
    const std::vector<float> no_rope(rkd.size(), 0.0f);
    const double d_rope = other(q, latd, no_rope, w, scale);
    INFO("without the RoPE key in the score the output moves by " << d_rope);
    CHECK(d_rope > 4 * bound);
    std::vector<float> w_rot(w);  // every head's W_UK from the next head (H > 1), or W_UK reversed
    for (int h = 0; h < H; ++h)
      for (int n = 0; n < N; ++n)
        for (int j = 0; j < KL; ++j)
          w_rot[(static_cast<std::size_t>(h) * (N + VD) + n) * KL + j] =
              H > 1 ? w[(static_cast<std::size_t>((h + 1) % H) * (N + VD) + n) * KL + j]
                    : w[(static_cast<std::size_t>(h) * (N + VD) + (N - 1 - n)) * KL + j];
    const double d_wuk = other(q, latd, rkd, w_rot, scale);
    INFO("with another W_UK the output moves by " << d_wuk);
    CHECK(d_wuk > 4 * bound);
    const double d_scale = other(q, latd, rkd, w, 1.0 / std::sqrt(double(KL)));
    INFO("scaled by 1/sqrt(kv_lora) instead of 1/sqrt(nope + rope) the output moves by " << d_scale);
    CHECK(d_scale > 4 * bound);
  }
  // A lossy latent always moves the output; a lossy RoPE key only where the scores matter (two keys).
  if (latent_f != HalfFormat::f32 || (rope_f != HalfFormat::f32 && T > 1)) {
    std::vector<double> exact(ref.size());
    ko::mla_attention_f64(ms, q.data(), lat.data(), rk.data(), w.data(), exact.data());
    const double qerr = ko::max_abs_diff(exact, ref);
    INFO("quantization effect on the output " << qerr);
    CHECK(qerr > 0);
    out.lossy_seen += qerr > 0;
    ++out.lossy_cases;
  }
  ++out.cases;
}

void run_mla_gate(HalfFormat latent_f, std::uint32_t seed) {
  Outcome o;
  // The RoPE key in bf16 (fp8_ds_mla's choice), and in the latent's own format where its width
  // allows it (else f16): the second pass sees a RoPE half that is not the latent's default partner.
  const HalfFormat second = supports(latent_f, PageGeometry{16, 1, 16}).ok ? latent_f : HalfFormat::f16;
  std::uint32_t k = 0;
  for (const HalfFormat rope_f : {HalfFormat::bf16, second})
    for (const MlaCase& mc : kCases) run_case(latent_f, rope_f, mc, seed + 17 * k++, o);
  INFO("latent " << name(latent_f) << ": " << o.cases << " cases run");
  // Every half format with blocks of at most 64 stores at least the 64- and 128-wide latents (6 cases
  // of 12); fp8_block128's tiles fit the two 128-wide ones only (4 of 12: both RoPE formats).
  CHECK(o.cases >= (info(latent_f).block_elems > 64 ? 4 : 6));
  if (latent_f != HalfFormat::f32) CHECK(o.lossy_cases == o.cases);
  CHECK(o.lossy_seen == o.lossy_cases);
}

}  // namespace

#define ORA_MLA_ROW(A, name, prefill_mma)                                                                   \
  TEST_CASE("ORA.mla." #name " MLA latent cache: page bytes == oracle, absorbed attention == FP64 expanded MLA", \
            "[gate:ORA][mla]") {                                                                            \
    run_mla_gate(HalfFormat::name, 7100u + static_cast<std::uint32_t>(HalfFormat::name) * 100u);            \
  }
KVGATE_HALF_FORMATS(ORA_MLA_ROW, _)  // one gate per half format of the latent: kvgate/format_list.hpp
