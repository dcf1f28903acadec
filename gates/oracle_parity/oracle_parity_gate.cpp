// ORA gates: the runtime's store bytes equal the independent oracle's bytes for the same input,
// and the runtime's attention over its quantized store matches the oracle's FP64 attention over
// the oracle's own dequantization of those bytes. Read-side bugs that cancel between two
// quantized runs (V read from the K page, a dropped in-page offset) are caught only here.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "bounds.hpp"
#include "catch_compat.hpp"
#include "kvgate/attention.hpp"
#include "kvgate_oracle/attention.hpp"
#include "kvgate_oracle/formats.hpp"
#include "kvgate_oracle/metrics.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace ko = kvgate_oracle;

namespace {

ko::Half to_oracle(HalfFormat f) {
  const auto h = ko::parse_half(name(f));
  REQUIRE(h.has_value());
  return *h;
}

// Contiguous copy of rows [t0, t0+n) of a strided input.
std::vector<float> rows(const StoreCase& c, const std::vector<float>& x, int t0, int n) {
  const std::size_t HD = static_cast<std::size_t>(c.n_kv_heads * c.head_dim);
  std::vector<float> out(static_cast<std::size_t>(n) * HD);
  for (int t = 0; t < n; ++t)
    std::copy_n(x.data() + static_cast<std::size_t>(t0 + t) * c.row_stride(), HD, out.data() + t * HD);
  return out;
}

std::string first_diff(const std::uint8_t* a, const std::uint8_t* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) {
      std::ostringstream o;
      o << "first differing byte at page offset " << i << ": runtime 0x" << std::hex << int(a[i]) << " oracle 0x"
        << int(b[i]);
      return o.str();
    }
  return {};
}

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
      const ko::Half oh = to_oracle(store.half_format(kh));
      REQUIRE(ko::page_bytes(oh, shape) == store.page_bytes(kh));
      for (std::size_t p = 0; p < table.size(); ++p) {
        const int t0 = static_cast<int>(p) * c.block_size;
        const int n = std::min(c.block_size, c.n_tokens - t0);
        const auto in = rows(c, half == 0 ? k : v, t0, n);
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
  std::string describe() const {
    return "block_size=" + std::to_string(block_size) + " kv_heads=" + std::to_string(n_kv_heads) +
           " head_dim=" + std::to_string(head_dim) + " gqa_group=" + std::to_string(group) +
           " n_ctx=" + std::to_string(n_ctx) + " n_q=" + std::to_string(n_q) + " seed=" + std::to_string(seed);
  }
};

std::vector<AttnCase> attn_cases(std::uint64_t seed0) {
  std::vector<AttnCase> out;
  const int shapes[][2] = {{4, 8}, {8, 8}, {1, 64}, {2, 64}, {8, 128}, {1, 128}, {2, 256}, {4, 256}};  // {H, D}
  const int groups[] = {1, 2, 4, 8};
  const int blocks[] = {1, 3, 7, 16};
  int i = 0;
  for (const auto& sh : shapes)
    for (int g : groups) {
      const int b = blocks[i % 4];
      const int n_ctx = 2 * b + b / 2 + 3 + (i % 5) * 7;  // crosses pages, ragged last page
      out.push_back({b, sh[0], sh[1], g, n_ctx, 1, seed0 + static_cast<std::uint64_t>(i)});                // decode
      out.push_back({b, sh[0], sh[1], g, n_ctx, std::min(5, n_ctx), seed0 + 1000 + static_cast<std::uint64_t>(i)});  // prefill chunk
      ++i;
    }
  return out;
}

void run_attention_gate(const KvFormat& fmt, std::uint64_t seed0) {
  long cases_run = 0;
  for (const AttnCase& ac : attn_cases(seed0)) {
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
    std::vector<float> got(q.size());
    attention(store, s, 0, args, q.data(), got.data());

    // Oracle: dequantize the runtime's bytes with the oracle's own decoder, FP64 attention.
    const ko::PageShape shape{ac.block_size, ac.n_kv_heads, D};
    std::vector<float> kd(static_cast<std::size_t>(ac.n_ctx) * HD), vd(kd.size());
    const auto table = store.block_table(s);
    for (std::size_t p = 0; p < table.size(); ++p) {
      const int t0 = static_cast<int>(p) * ac.block_size;
      const int n = std::min(ac.block_size, ac.n_ctx - t0);
      const auto kp = ko::dequantize_page(to_oracle(fmt.k), shape, store.page(0, KvHalf::K, table[p]), n, kGateKScale);
      const auto vp = ko::dequantize_page(to_oracle(fmt.v), shape, store.page(0, KvHalf::V, table[p]), n, kGateVScale);
      std::copy(kp.begin(), kp.end(), kd.begin() + static_cast<std::ptrdiff_t>(t0) * HD);
      std::copy(vp.begin(), vp.end(), vd.begin() + static_cast<std::ptrdiff_t>(t0) * HD);
    }
    const ko::AttnShape as{ac.n_q, Hq, ac.n_ctx, ac.n_kv_heads, D, ac.n_ctx - ac.n_q, 0.0f};
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
    const double bound = attn_f32_max_abs(D, ac.n_ctx, max_l1, vmax);
    double ref_sq = 0;
    for (double x : ref) ref_sq += x * x;
    const double nmse_bound = bound * bound * double(ref.size()) / ref_sq;

    // NaN/Inf first, then NMSE, then max-abs (llama.cpp test-backend-ops order).
    REQUIRE(ko::count_nonfinite(std::span<const float>(got)) == 0);
    const double e_nmse = ko::nmse(ref, got), e_max = ko::max_abs_diff(ref, got);
    INFO("nmse " << e_nmse << " (bound " << nmse_bound << "), max-abs " << e_max << " (bound " << bound << ")");
    CHECK(e_nmse <= nmse_bound);
    CHECK(e_max <= bound);

    // Anti-vacuity: (a) the gate can see errors far below a real read-side bug: the bound stays
    // under kOraSensitivity of the output's RMS; (b) for lossy formats the store really quantized:
    // attention over the unquantized inputs differs from the reference (a silent f32 store is seen).
    const double rms = std::sqrt(ref_sq / double(ref.size()));
    INFO("bound / rms(ref) = " << bound / rms);
    CHECK(bound <= kOraSensitivity * rms);
    if (fmt.k != HalfFormat::f32 || fmt.v != HalfFormat::f32) {
      const auto kf = rows(c, k, 0, ac.n_ctx), vf = rows(c, v, 0, ac.n_ctx);
      std::vector<double> exact(q.size());
      ko::sdpa_f64(as, q.data(), kf.data(), vf.data(), exact.data());
      double qerr = 0;
      for (std::size_t i = 0; i < exact.size(); ++i) qerr = std::max(qerr, std::fabs(exact[i] - ref[i]));
      INFO("quantization effect on the output " << qerr);
      CHECK(qerr > 0);
    }
  }
  CHECK(cases_run >= 32);
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
  }

ORA_PRESET("f32", "f32", 1100)
ORA_PRESET("f16", "f16", 1200)
ORA_PRESET("bf16", "bf16", 1300)
ORA_PRESET("int8", "int8", 1400)
ORA_PRESET("fp8", "fp8", 1500)
ORA_PRESET("fp8_e5m2", "fp8_e5m2", 1600)
ORA_PRESET("q8_0", "q8_0", 1700)
ORA_PRESET("q4_0", "q4_0", 1800)
ORA_PRESET("k8v4", "k8v4", 1900)
ORA_PRESET("mixed", "k=q8_0,v=fp8_e5m2", 2000)
