// INV.schedule.<preset>: schedule invariance of the CPU engine. The same request (a 70-token prompt
// and 8 decode steps on stories260K) gives bit-identical logits, and stores bit-identical token
// bytes, under every schedule the CPU engine exposes:
//   - thread counts 1..4 (matmul rows and prefill query ranges split over threads; every output is
//     computed by the same code whatever the split);
//   - prefill chunk boundaries (chunks of 1, 7, 16, 33 and one chunk of 128);
//   - page (block) sizes that are multiples of the attention's 16-key score chunk (16, 32, 48): the
//     online softmax then rescales at the same keys. Every format here quantizes within one token
//     row (a scale per cell, per 16/32-block of the row, or per tensor), so the page size never
//     changes a token's codes: the token bytes are compared at every page size;
//   - batch composition: the request's rows in a store of their own, or sharing the pool with other
//     sequences whose appends interleave with its own (its pages scattered over other block ids).
// Where bitwise is NOT promised, the derived bound: a page size that is no multiple of 16 (8, 24)
// moves the online softmax's rescaling points, so attention over the same stored rows may round
// differently; each result is within attn_f32_max_abs (bounds.hpp) of the FP64 attention, so the
// two differ by at most twice that. The CPU engine has no split-K (one pass over the pages per
// query); the CUDA decode's split count is not covered here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bounds.hpp"
#include "catch_compat.hpp"
#include "conformance_fixtures.hpp"
#include "kvgate/attention.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/model.hpp"
#include "models.hpp"
#include "populations.hpp"

using namespace kvgate;
using namespace kvgate::gates;

namespace {

struct Schedule {
  int threads = 1, chunk = 128, block = 16;
  std::string describe() const {
    return "threads " + std::to_string(threads) + ", prefill chunk " + std::to_string(chunk) + ", block " +
           std::to_string(block);
  }
};

struct Request {
  std::vector<float> logits;                   // every prompt position, then every decode step
  std::vector<std::vector<std::uint8_t>> tok;  // per (layer, half, position): the token's bytes in its page
  std::size_t layer0 = 0;                      // entries of layer 0 (tok[0, layer0))
};

Request run_request(const KvFormat& f, const Schedule& s) {
  const Model& m = stories260k();
  const std::vector<int>& ids = kStories260KGreedy64;
  std::vector<int> prompt{1};
  for (int r = 0; r < 2; ++r) prompt.insert(prompt.end(), ids.begin(), ids.end());
  prompt.resize(70);
  EngineOptions o = engine_options_for(f, s.threads);
  o.block_size = s.block;
  o.prefill_chunk = s.chunk;
  Engine e(m, o);
  REQUIRE(e.stats().threads == s.threads);
  Request r;
  r.logits = e.forward_all_logits(prompt);
  for (int i = 0; i < 8; ++i) {
    const auto& l = e.decode(ids[static_cast<std::size_t>(i)]);
    r.logits.insert(r.logits.end(), l.begin(), l.end());
  }
  const PagedKvStore& st = e.store();
  const PageGeometry g = st.geometry();
  const auto table = st.block_table(e.sequence());
  for (int l = 0; l < m.config.n_layers; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V})
      for (int pos = 0; pos < e.position(); ++pos) {
        const std::uint8_t* page = st.host_page(l, h, table[static_cast<std::size_t>(pos / g.block_size)]);
        std::vector<std::uint8_t> b;
        for (const ByteRun& run : token_ranges(st.half_format(h), g, pos % g.block_size))
          b.insert(b.end(), page + run.offset, page + run.offset + run.bytes);
        r.tok.push_back(std::move(b));
        if (l == 0) r.layer0 = r.tok.size();
      }
  return r;
}

// Positions (rows of V logits) where two logit vectors differ in any bit; -1 when none.
long first_logit_diff(const std::vector<float>& a, const std::vector<float>& b, std::size_t V) {
  if (a.size() != b.size()) return -2;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<long>(i / V);
  return -1;
}

void check_engine_schedules(const KvFormat& f) {
  const std::size_t V = static_cast<std::size_t>(stories260k().config.vocab_size);
  const Schedule ref{};
  const Request base = run_request(f, ref);
  // Anti-vacuity: the request is not trivial (its logits vary over positions), the bytes are there.
  REQUIRE(base.logits.size() == 78 * V);
  CHECK(std::memcmp(base.logits.data(), base.logits.data() + 40 * V, V * sizeof(float)) != 0);
  REQUIRE(!base.tok.empty());
  const Schedule schedules[] = {{2, 128, 16}, {3, 128, 16}, {4, 128, 16}, {1, 1, 16},  {1, 7, 16}, {1, 16, 16},
                                {4, 33, 16},  {1, 128, 32}, {1, 128, 48}, {2, 7, 32}, {3, 16, 48}};
  for (const Schedule& s : schedules) {
    INFO("format " << f.name() << ": " << s.describe() << " against " << ref.describe());
    const Request r = run_request(f, s);
    CHECK(first_logit_diff(base.logits, r.logits, V) == -1);  // -1: every logit of every position bit-identical
    CHECK(r.tok == base.tok);
  }
  // Page sizes that are no multiple of the score chunk: the logits are not promised bitwise (the
  // bound is checked at the attention level, check_store_schedules), so the rows of layers past the
  // first may differ; layer 0's rows come from the embeddings alone, and its token bytes are
  // identical (the codes are per token, whatever the page).
  for (int B : {8, 24}) {
    INFO("format " << f.name() << ": block " << B);
    const Request r = run_request(f, {1, 128, B});
    REQUIRE(r.layer0 == base.layer0);
    CHECK(std::equal(r.tok.begin(), r.tok.begin() + static_cast<std::ptrdiff_t>(r.layer0), base.tok.begin()));
  }
}

// The store-level schedules: batch composition (bitwise) and a page size off the score chunk (bound).
struct StoreRows {
  int H = 2, D = 64, n = 45, heads = 4;
  std::vector<float> k, v, q;
};

StoreConfig store_config(const KvFormat& f, const StoreRows& r, int B, int n_blocks) {
  StoreConfig c;
  c.format = f;
  c.n_layers = 1;
  c.n_kv_heads = r.H;
  c.head_dim = r.D;
  c.block_size = B;
  c.n_blocks = n_blocks;
  c.k_scale = {0.37f};
  c.v_scale = {0.0213f};
  return c;
}

// Prefill (every query of the sequence) and decode (the last query) attention outputs, concatenated.
std::vector<float> attend_all(const PagedKvStore& st, SeqId s, const StoreRows& r) {
  std::vector<float> out(static_cast<std::size_t>(r.n) * r.heads * r.D), last(static_cast<std::size_t>(r.heads) * r.D);
  AttentionArgs a;
  a.n_heads = r.heads;
  a.n_q = r.n;
  attention(st, s, 0, a, r.q.data(), out.data());
  a.n_q = 1;
  a.pos0 = r.n - 1;
  attention(st, s, 0, a, r.q.data() + static_cast<std::size_t>(r.n - 1) * r.heads * r.D, last.data());
  out.insert(out.end(), last.begin(), last.end());
  return out;
}

void check_store_schedules(const KvFormat& f, std::uint64_t seed) {
  StoreRows r;
  Rng rng(seed);
  const std::size_t HD = static_cast<std::size_t>(r.H) * r.D;
  for (std::size_t i = 0; i < r.n * HD; ++i) r.k.push_back(rng.normal()), r.v.push_back(0.05f * rng.normal());
  for (std::size_t i = 0; i < static_cast<std::size_t>(r.n) * r.heads * r.D; ++i) r.q.push_back(rng.normal());

  // Alone: one sequence, pages in order.
  PagedKvStore alone(store_config(f, r, 16, 8));
  const SeqId a = alone.create_sequence();
  alone.extend(a, r.n);
  alone.write(a, 0, 0, r.n, r.k.data(), HD, r.v.data(), HD);
  const std::vector<float> want = attend_all(alone, a, r);

  // Shared: two other sequences take pages between the request's appends of 7 tokens.
  PagedKvStore shared(store_config(f, r, 16, 20));
  const SeqId o1 = shared.create_sequence(), s = shared.create_sequence(), o2 = shared.create_sequence();
  for (int pos = 0; pos < r.n; pos += 7) {
    const int n = std::min(7, r.n - pos);
    for (SeqId other : {o1, o2}) {
      const int p0 = shared.extend(other, 9);
      shared.write(other, 0, p0, 9, r.v.data(), HD, r.k.data(), HD);  // other rows, K and V crossed
    }
    shared.extend(s, n);
    shared.write(s, 0, pos, n, r.k.data() + pos * HD, HD, r.v.data() + pos * HD, HD);
  }
  const auto ta = alone.block_table(a), ts = shared.block_table(s);
  CHECK(!std::equal(ta.begin(), ta.end(), ts.begin(), ts.end()));  // anti-vacuity: other block ids
  CHECK(std::memcmp(want.data(), attend_all(shared, s, r).data(), want.size() * sizeof(float)) == 0);

  // Pages of 8 and 24 keys against pages of 16: the same stored rows, attention within twice the
  // FP32-vs-FP64 bound of each (attn_f32_max_abs over the dequantized rows).
  std::vector<float> kd(r.n * HD), vd(r.n * HD);
  alone.read(a, 0, KvHalf::K, 0, r.n, kd.data());
  alone.read(a, 0, KvHalf::V, 0, r.n, vd.data());
  double max_l1 = 0, vmax = 0;
  const double scale = 1.0 / std::sqrt(static_cast<double>(r.D));
  for (int i = 0; i < r.n; ++i)
    for (int hq = 0; hq < r.heads; ++hq) {
      const int hk = hq / (r.heads / r.H);
      for (int t = 0; t <= i; ++t) {
        double l1 = 0;
        for (int d = 0; d < r.D; ++d)
          l1 += std::fabs(double(r.q[(static_cast<std::size_t>(i) * r.heads + hq) * r.D + d]) *
                          kd[t * HD + static_cast<std::size_t>(hk) * r.D + d]);
        max_l1 = std::max(max_l1, l1 * scale);
      }
    }
  for (float x : vd) vmax = std::max(vmax, double(std::fabs(x)));
  const double bound = 2 * attn_f32_max_abs(r.D, r.n, max_l1, vmax);
  for (int B : {8, 24}) {
    PagedKvStore other(store_config(f, r, B, 8));
    const SeqId b = other.create_sequence();
    other.extend(b, r.n);
    other.write(b, 0, 0, r.n, r.k.data(), HD, r.v.data(), HD);
    const std::vector<float> got = attend_all(other, b, r);
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
    INFO("format " << f.name() << ": block " << B << " against 16, max |diff| " << worst << ", bound " << bound);
    CHECK(worst <= bound);
    CHECK(bound < 1e-2 * vmax);  // anti-vacuity: the bound is far below the values' scale (a dropped key moves more)
  }
}

}  // namespace

#define INV_SCHEDULE(id, preset, slot)                                                                              \
  TEST_CASE("INV.schedule." id " threads, prefill chunks, pages, batch: bitwise (pages of 8/24: derived bound)", \
            "[gate:INV][fmt:" preset "]") {                                                                          \
    const auto f = parse_kv_format(preset);                                                                        \
    REQUIRE(f.has_value());                                                                                        \
    check_engine_schedules(*f);                                                                                    \
    check_store_schedules(*f, 9100 + 100 * (slot));                                                                \
  }
#define INV_SCHEDULE_ROW(A, name, k, v, slot, kind) INV_SCHEDULE(#name, #name, slot)
KVGATE_PRESETS(INV_SCHEDULE_ROW, _)  // one row per preset: kvgate/format_list.hpp
