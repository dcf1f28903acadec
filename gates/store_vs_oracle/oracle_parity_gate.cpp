// ORA gates: the runtime's store bytes equal the independent oracle's bytes for the same input,
// and the runtime's attention over its quantized store matches the oracle's FP64 attention over
// the oracle's own dequantization of those bytes. Read-side bugs that cancel between two
// quantized runs (V read from the K page, a dropped in-page offset) are caught only here.
#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "bounds.hpp"
#include "catch_compat.hpp"
#include "kvgate/attention.hpp"
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

void run_bytes_gate(const KvFormat& fmt, std::uint64_t seed0) {
  long pages_compared = 0, cases_run = 0;
  for (const StoreCase& c : covering_cases(seed0)) {
    if (!case_supported(fmt, c)) continue;
    ++cases_run;
    INFO("format " << fmt.name() << " case " << c.describe());
    const auto k = make_rows(c, kGateKMagnitude, 1), v = make_rows(c, kGateVMagnitude, 2);
    PagedKvStore store(case_config(fmt, c));
    const SeqId s = store.create_sequence();
    write_case(store, s, c, k, v);
    REQUIRE(store.check_guards().empty());
    const ko::PageShape shape{c.block_size, c.n_kv_heads, c.head_dim};
    const auto table = store.block_table(s);
    for (int half = 0; half < 2; ++half) {
      const KvHalf kh = half == 0 ? KvHalf::K : KvHalf::V;
      const ko::Half oh = oracle_half(store.half_format(kh));
      REQUIRE(ko::page_bytes(oh, shape) == store.page_bytes(kh));
      for (std::size_t p = 0; p < table.size(); ++p) {
        const int t0 = static_cast<int>(p) * c.block_size;
        const int n = std::min(c.block_size, c.n_tokens - t0);
        const auto in = case_rows(c, half == 0 ? k : v, t0, n);
        const auto expect = ko::quantize_page(oh, shape, in.data(), n, half == 0 ? kGateKScale : kGateVScale);
        const std::uint8_t* got = store.page(0, kh, table[p]);
        INFO((half == 0 ? "K" : "V") << " page " << p << " (" << n << " tokens): "
                                     << first_diff(got, expect.data(), expect.size()));
        CHECK(std::equal(expect.begin(), expect.end(), got));  // whole page: used slots and zeroed tail
        ++pages_compared;
      }
    }
  }
  CHECK(cases_run >= 64);
  CHECK(pages_compared >= 256);
}

struct AttnCase {
  int block_size, n_kv_heads, head_dim, group, n_ctx, n_q;
  std::uint64_t seed;
  int window = 0;      // sliding window (0: full causal)
  float softcap = 0;   // attention-logit soft-cap (0: none)
  std::string describe() const {
    return "block_size=" + std::to_string(block_size) + " kv_heads=" + std::to_string(n_kv_heads) +
           " head_dim=" + std::to_string(head_dim) + " gqa_group=" + std::to_string(group) +
           " n_ctx=" + std::to_string(n_ctx) + " n_q=" + std::to_string(n_q) + " seed=" + std::to_string(seed) +
           " window=" + std::to_string(window) + " softcap=" + std::to_string(softcap);
  }
};

std::vector<AttnCase> attn_cases(std::uint64_t seed0) {
  std::vector<AttnCase> out;
  for_each_attention_geometry([&](int b, int h, int d, int g, int i) {
    const int n_ctx = 2 * b + b / 2 + 3 + (i % 5) * 7;  // crosses pages, ragged last page
    out.push_back({b, h, d, g, n_ctx, 1, seed0 + static_cast<std::uint64_t>(i)});                // decode
    out.push_back({b, h, d, g, n_ctx, std::min(5, n_ctx), seed0 + 1000 + static_cast<std::uint64_t>(i)});  // prefill chunk
  });
  return out;
}

// Sliding-window cases: windows at page boundaries (block_size - 1, block_size, block_size + 1,
// 2 block_size +- 1), a window of one key, a window longer than the context (= full attention);
// contexts several windows long; decode, a short prefill chunk and a chunk longer than the window.
std::vector<AttnCase> window_cases(std::uint64_t seed0) {
  std::vector<AttnCase> out;
  for_each_attention_geometry([&](int b, int h, int d, int g, int i) {
    const int choices[] = {b - 1, b, b + 1, 2 * b - 1, 2 * b, 2 * b + 1, 1, -1};
    for (int k = 0; k < 2; ++k) {
      const int pick = choices[(i + 3 * k) % 8];
      const int w0 = std::max(1, pick);
      const int n_ctx = 3 * std::max(w0, b) + 5 + (i % 3);
      const int w = pick < 0 ? n_ctx + 4 : w0;  // -1: longer than the context
      const std::uint64_t sd = seed0 + 100 * static_cast<std::uint64_t>(i) + static_cast<std::uint64_t>(k);
      out.push_back({b, h, d, g, n_ctx, 1, sd, w});
      out.push_back({b, h, d, g, n_ctx, std::min(5, n_ctx), sd + 50, w});
      if (k == 0) out.push_back({b, h, d, g, n_ctx, std::min(n_ctx, std::min(w, n_ctx) + 2), sd + 70, w});
    }
  });
  return out;
}

// Soft-capped cases (Gemma 2's attn_logit_softcapping): a cap of 2 puts the larger scores (|s| up
// to ~5 with these queries) well into tanh's bend; every third case with a window too (>= 2 keys,
// so that the cap still changes the softmax). head_dim <= 128: the cap flattens the softmax, which
// lowers the output's RMS, and at head_dim 256 the worst-case bound (which grows with D * L1) then
// no longer stays under kOraSensitivity of it; the cap is applied per score, whatever D is, and
// D = 256 is covered by ORA.attn / ORA.attn_window.
std::vector<AttnCase> softcap_cases(std::uint64_t seed0) {
  std::vector<AttnCase> out;
  for (AttnCase c : attn_cases(seed0)) {
    if (c.head_dim > 128) continue;
    c.softcap = 2.0f;
    if (out.size() % 3 == 0) c.window = std::max(2, c.block_size + static_cast<int>(out.size() % 2));
    out.push_back(c);
  }
  return out;
}

enum class Check { plain, window, softcap, split };
std::vector<AttnCase> split_cases(std::uint64_t seed0);  // at the end of the file (ORA.attn_split)

void run_attention_gate(const KvFormat& fmt, std::uint64_t seed0, Check what = Check::plain) {
  long cases_run = 0, windows_cut = 0;
  const std::vector<AttnCase> cases =
      what == Check::window ? window_cases(seed0) : what == Check::softcap ? softcap_cases(seed0)
      : what == Check::split ? split_cases(seed0) : attn_cases(seed0);
  for (const AttnCase& ac : cases) {
    const StoreCase c{ac.block_size, ac.n_kv_heads, ac.head_dim, ac.n_ctx, Pattern::gaussian, ac.seed, 0};
    if (!case_supported(fmt, c)) continue;
    ++cases_run;
    INFO("format " << fmt.name() << " case " << ac.describe());
    const auto k = make_rows(c, kGateKMagnitude, 1), v = make_rows(c, kGateVMagnitude, 2);
    PagedKvStore store(case_config(fmt, c));
    const SeqId s = store.create_sequence();
    write_case(store, s, c, k, v);
    const int Hq = ac.n_kv_heads * ac.group, D = ac.head_dim, HD = ac.n_kv_heads * D;
    Rng r(ac.seed ^ 0xABCDEF);
    std::vector<float> q(static_cast<std::size_t>(ac.n_q) * Hq * D);
    for (auto& x : q) x = r.normal() * 1.5f;  // sharp enough that softmax is far from uniform
    AttentionArgs args{ac.n_q, Hq, ac.n_ctx - ac.n_q, 0};
    args.window = ac.window;
    args.softcap = ac.softcap;
    std::vector<float> got(q.size());
    attention(store, s, 0, args, q.data(), got.data());

    // Oracle: dequantize the runtime's bytes with the oracle's own decoder, FP64 attention.
    const ko::PageShape shape{ac.block_size, ac.n_kv_heads, D};
    std::vector<float> kd(static_cast<std::size_t>(ac.n_ctx) * HD), vd(kd.size());
    const auto table = store.block_table(s);
    for (std::size_t p = 0; p < table.size(); ++p) {
      const int t0 = static_cast<int>(p) * ac.block_size;
      const int n = std::min(ac.block_size, ac.n_ctx - t0);
      const auto kp = ko::dequantize_page(oracle_half(fmt.k), shape, store.page(0, KvHalf::K, table[p]), n, kGateKScale);
      const auto vp = ko::dequantize_page(oracle_half(fmt.v), shape, store.page(0, KvHalf::V, table[p]), n, kGateVScale);
      std::copy(kp.begin(), kp.end(), kd.begin() + static_cast<std::ptrdiff_t>(t0) * HD);
      std::copy(vp.begin(), vp.end(), vd.begin() + static_cast<std::ptrdiff_t>(t0) * HD);
    }
    ko::AttnShape as{ac.n_q, Hq, ac.n_ctx, ac.n_kv_heads, D, ac.n_ctx - ac.n_q, 0.0f};
    as.window = ac.window;
    as.softcap = ac.softcap;
    std::vector<double> ref(q.size());
    ko::sdpa_f64(as, q.data(), kd.data(), vd.data(), ref.data());

    // Bound inputs: the largest L1 score and |v| over the dequantized K/V.
    double max_l1 = 0, vmax = 0;
    const double sc = 1.0 / std::sqrt(double(D));
    for (int i = 0; i < ac.n_q; ++i)
      for (int hq = 0; hq < Hq; ++hq)
        for (int t = 0; t < ac.n_ctx; ++t) {
          double l1 = 0;
          for (int d = 0; d < D; ++d)
            l1 += std::fabs(double(q[(i * Hq + hq) * D + d]) * kd[t * HD + (hq / ac.group) * D + d]);
          max_l1 = std::max(max_l1, l1 * sc);
        }
    for (float x : vd) vmax = std::max(vmax, double(std::fabs(x)));
    // Soft-capping adds per score: the division by cap (u |s| / cap, carried through tanh' <= 1), tanh's
    // own rounding (2u of |tanh| <= 1) and the multiply (u): (u |s| / cap + 3u) cap = u |s| + 3u cap,
    // counted as an L1 increase of (|s| + 3 cap) / (D + 2) in attn_f32_max_abs's (D + 2) u L1.
    if (ac.softcap > 0) max_l1 += (max_l1 + 3.0 * ac.softcap) / (D + 2);
    const double bound = attn_f32_max_abs(D, ac.n_ctx, max_l1, vmax);

    // NaN/Inf first, then NMSE, then max-abs; anti-vacuity (a): the gate can see errors far below a
    // real read-side bug, the bound stays under kOraSensitivity of the output's RMS (check_within_bound).
    (void)check_within_bound(ref, got, bound);
    // (b) for lossy formats the store really quantized: attention over the unquantized inputs
    // differs from the reference (a silent f32 store is seen).
    // (c) the window / the cap really changes the output: the same oracle with the window one key
    // longer (an off-by-one) or without the cap is farther from the reference than the bound.
    auto dist = [&](const ko::AttnShape& other) {
      std::vector<double> alt(q.size());
      ko::sdpa_f64(other, q.data(), kd.data(), vd.data(), alt.data());
      double d = 0;
      for (std::size_t i = 0; i < alt.size(); ++i) d = std::max(d, std::fabs(alt[i] - ref[i]));
      return d;
    };
    if (ac.window > 0 && ac.window < ac.n_ctx) {
      ko::AttnShape wider = as;
      wider.window = ac.window + 1;
      const double d = dist(wider);
      INFO("window " << ac.window << " vs " << ac.window + 1 << ": outputs differ by " << d);
      CHECK(d > 4 * bound);
      ++windows_cut;
    }
    if (ac.softcap > 0) {
      ko::AttnShape uncapped = as;
      uncapped.softcap = 0;
      const double d = dist(uncapped);
      INFO("with vs without the soft-cap: outputs differ by " << d);
      CHECK(d > 4 * bound);
    }
    if (fmt.k != HalfFormat::f32 || fmt.v != HalfFormat::f32) {
      const auto kf = case_rows(c, k, 0, ac.n_ctx), vf = case_rows(c, v, 0, ac.n_ctx);
      std::vector<double> exact(q.size());
      ko::sdpa_f64(as, q.data(), kf.data(), vf.data(), exact.data());
      double qerr = 0;
      for (std::size_t i = 0; i < exact.size(); ++i) qerr = std::max(qerr, std::fabs(exact[i] - ref[i]));
      INFO("quantization effect on the output " << qerr);
      CHECK(qerr > 0);
    }
  }
  CHECK(cases_run >= (what == Check::softcap ? 24 : 32));
  if (what == Check::window) CHECK(windows_cut >= 32);
}

}  // namespace

#define ORA_PRESET(id, preset, seed)                                                                   \
  TEST_CASE("ORA.bytes." id " runtime page bytes == oracle page bytes", "[gate:ORA][fmt:" preset "]") { \
    const auto f = parse_kv_format(preset);                                                            \
    REQUIRE(f.has_value());                                                                            \
    run_bytes_gate(*f, seed);                                                                          \
  }                                                                                                    \
  TEST_CASE("ORA.attn." id " runtime attention == oracle FP64 attention over the same bytes",          \
            "[gate:ORA][fmt:" preset "]") {                                                            \
    const auto f = parse_kv_format(preset);                                                            \
    REQUIRE(f.has_value());                                                                            \
    run_attention_gate(*f, seed + 7);                                                                  \
  }                                                                                                    \
  TEST_CASE("ORA.attn_window." id " sliding-window attention == oracle FP64 windowed SDPA, same bytes",  \
            "[gate:ORA][fmt:" preset "]") {                                                            \
    const auto f = parse_kv_format(preset);                                                            \
    REQUIRE(f.has_value());                                                                            \
    run_attention_gate(*f, seed + 11, Check::window);                                                  \
  }                                                                                                    \
  TEST_CASE("ORA.attn_softcap." id " soft-capped attention == oracle FP64 soft-capped SDPA, same bytes", \
            "[gate:ORA][fmt:" preset "]") {                                                            \
    const auto f = parse_kv_format(preset);                                                            \
    REQUIRE(f.has_value());                                                                            \
    run_attention_gate(*f, seed + 13, Check::softcap);                                                 \
  }

#define ORA_PRESET_ROW(A, name, k, v, slot, kind) ORA_PRESET(#name, #name, (1000 + 100 * slot))
KVGATE_PRESETS(ORA_PRESET_ROW, _)  // one row per preset: kvgate/format_list.hpp
ORA_PRESET("mixed", "k=q8_0,v=fp8_e5m2", 2000)

// ---- ORA.attn_split: contexts at k*S - 1, k*S, k*S + 1 of the CPU decode's split --------------------------
// The CPU attention (runtime/src/attention.cpp) has no split-K: it walks the context page by page
// (B tokens) and, inside a page, in score chunks of S = 16 tokens (kW: two 8-lane vectors, one
// online-softmax step each); the last chunk of a page is ragged, lanes past it are masked. So its
// edges are k*S - 1, k*S, k*S + 1 (a chunk one short, full, one over) and k*B - 1, k*B, k*B + 1,
// and the in-page chunk offset c0 > 0 exists only on pages longer than S. ORA.attn and
// ORA.attn_window use pages of at most 16 tokens (one chunk per page) and contexts off these edges;
// here pages of 16 (one chunk), 24 (a full and a ragged chunk) and 48 (three chunks), every context
// at an S edge up to 3S and at a B edge up to 2B, decode and a 3-query prefill chunk ending there,
// and sliding windows of S - 1, S and S + 1 keys at head_dim <= 64 (their first visible slot lands on either side
// of a chunk edge inside the page). The bound is ORA.attn's: attn_f32_max_abs (bounds.hpp), with
// its anti-vacuity (bound under kOraSensitivity of the output RMS, a window one key longer farther
// than 4x the bound, quantization visible).
namespace {

constexpr int kCpuScoreChunk = 16;  // S: runtime/src/attention.cpp kW

std::vector<AttnCase> split_cases(std::uint64_t seed0) {
  std::vector<AttnCase> out;
  const int shapes[][2] = {{2, 64}, {4, 32}, {1, 128}, {2, 256}};  // {H, D}, rows multiples of 32
  const int S = kCpuScoreChunk;
  int i = 0;
  for (int B : {16, 24, 48}) {
    std::vector<int> ctx;
    for (int k = 1; k <= 3; ++k)
      for (int d = -1; d <= 1; ++d) ctx.push_back(k * S + d);
    for (int k = 1; k <= 2; ++k)
      for (int d = -1; d <= 1; ++d) ctx.push_back(k * B + d);
    std::sort(ctx.begin(), ctx.end());
    ctx.erase(std::unique(ctx.begin(), ctx.end()), ctx.end());
    for (int n_ctx : ctx) {
      // head_dim 256 (the generic-D kernel) up to 64 keys: past that its worst-case bound nears
      // kOraSensitivity of the output RMS (a flatter softmax over more keys).
      const auto& sh = shapes[i % 4][1] == 256 && n_ctx > 64 ? shapes[2] : shapes[i % 4];
      const int group = 1 << (i % 3);  // GQA 1, 2, 4
      const std::uint64_t sd = seed0 + 10 * static_cast<std::uint64_t>(i);
      out.push_back({B, sh[0], sh[1], group, n_ctx, 1, sd});
      out.push_back({B, sh[0], sh[1], group, n_ctx, 3, sd + 1});
      const int w = S - 1 + i % 3;  // S - 1, S, S + 1
      // Windows at head_dim <= 64 only: at 128 and 256 the worst-case bound (it grows with D x L1)
      // is too close to the effect of one key more for the window's anti-vacuity check.
      if (n_ctx > w + 1 && sh[1] <= 64) out.push_back({B, sh[0], sh[1], group, n_ctx, 1, sd + 2, w});
      ++i;
    }
  }
  return out;
}

// Anti-vacuity of the population itself: pages with a second and a third chunk are read, the last
// chunk of a page ends one short of, at and one past an S edge, and windows start inside a chunk > 0.
void check_split_population(const std::vector<AttnCase>& cases) {
  const int S = kCpuScoreChunk;
  std::set<int> tail_mod_s;
  int second_chunk = 0, third_chunk = 0, late_windows = 0;
  for (const AttnCase& c : cases) {
    const int in_last_page = (c.n_ctx - 1) % c.block_size + 1;  // keys on the last page
    second_chunk += in_last_page > S;
    third_chunk += in_last_page > 2 * S;
    if (c.n_ctx > S) tail_mod_s.insert(c.n_ctx % S);
    if (c.window > 0) late_windows += (c.n_ctx - c.window) % c.block_size >= S;
  }
  CHECK(second_chunk >= 10);
  CHECK(third_chunk >= 4);
  CHECK(tail_mod_s.count(S - 1) + tail_mod_s.count(0) + tail_mod_s.count(1) == 3);
  CHECK(late_windows >= 3);
}

}  // namespace

#define ORA_SPLIT_ROW(A, name, k, v, slot, kind)                                                                   \
  TEST_CASE("ORA.attn_split." #name " contexts at k*S-1, k*S, k*S+1 of the CPU score chunk and k*B+-1 == oracle FP64", \
            "[gate:ORA][fmt:" #name "]") {                                                                         \
    const auto f = parse_kv_format(#name);                                                                         \
    REQUIRE(f.has_value());                                                                                        \
    run_attention_gate(*f, 3000 + 100 * (slot), Check::split);                                                     \
    check_split_population(split_cases(3000 + 100 * (slot)));                                                      \
  }
KVGATE_PRESETS(ORA_SPLIT_ROW, _)  // one row per preset: kvgate/format_list.hpp
