// INV.cuda.schedule.<fmt>: what a decode schedule may change on the GPU (docs/CUDA.md "Schedule
// invariance"). The same sequence's split-K decode attention is bitwise the same
//   - alone, and in a batch with shorter sequences before or after it (its batch slot moves);
//   - over other physical pages holding the same rows (page ids moved by a decoy);
//   - from one run to the next (no atomics or scheduling-dependent order in any reduction);
// at a forced split count, and twice at the planner's own count.
// Bound: zero, bitwise. A (sequence, query head) is computed by the same CTAs over the same key
// ranges (tokens per split follow from the batch's longest sequence, which is the tested one in
// every batch here) and its splits are combined in the same order; nothing reads the batch slot,
// a page id or the run. Not bitwise, so not claimed: a different split count (or a longer
// companion, which moves the split boundaries) reassociates the softmax sums; ORA.cuda.decode bounds
// every split count against the FP64 oracle instead.
// Anti-vacuity: the forced plan has more than one split (the combine runs), the two copies of the
// sequence share no page, and the output is finite and not all zero.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "catch_compat.hpp"
#include "cuda_gate_common.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/format_list.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace kc = kvgate::cuda;

namespace {

using DevBuf = cuda_gate::DevFloats;

constexpr int kBlock = 16, kH = 8, kD = 128, kGroup = 4, kHq = kH * kGroup;
constexpr int kLong = 1500, kMid = 333, kSplits = 6;

struct Seq {
  SeqId id;
  int len;
};

// Decodes one query per sequence of `batch` (queries: `q_of` each sequence's Hq x D block) and returns
// the output of batch slot `slot`.
std::vector<float> decode_slot(kc::CudaKvStore& gpu, const std::vector<Seq>& batch, const std::vector<const float*>& q_of,
                               int slot, int splits, kc::DecodeWorkspace& ws, kc::DecodePlan* plan_out = nullptr) {
  const std::size_t per = static_cast<std::size_t>(kHq) * kD;
  std::vector<float> q(per * batch.size());
  std::vector<SeqId> ids;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    std::copy_n(q_of[i], per, q.data() + i * per);
    ids.push_back(batch[i].id);
  }
  DevBuf dq(q.size()), dout(q.size());
  REQUIRE(cudaMemcpy(dq.p, q.data(), q.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  const std::vector<float> poison(q.size(), std::nanf(""));
  REQUIRE(cudaMemcpy(dout.p, poison.data(), q.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  const kc::DecodePlan plan = gpu.decode(ids, 0, kHq, dq.p, dout.p, ws, 0.0f, splits, nullptr, 0, 0.0f);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  if (plan_out) *plan_out = plan;
  std::vector<float> out(q.size());
  REQUIRE(cudaMemcpy(out.data(), dout.p, out.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  return {out.begin() + static_cast<std::ptrdiff_t>(slot * per), out.begin() + static_cast<std::ptrdiff_t>((slot + 1) * per)};
}

std::size_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
  return n;
}

void run_schedule_gate(const KvFormat& fmt, std::uint64_t seed) {
  const PageGeometry g{kBlock, kH, kD};
  if (!supports(fmt.k, g).ok || !supports(fmt.v, g).ok) {
    WARN("SKIPPED: " << fmt.name() << " cannot store head_dim " << kD);
    return;
  }
  INFO("format " << fmt.name() << ", " << kH << " KV heads of " << kD << ", GQA " << kGroup << ", pages of " << kBlock
                 << ", lens " << kLong << "/" << kMid << "/1, forced splits " << kSplits << ", seed " << seed);
  const int HD = kH * kD;
  StoreConfig cfg;
  cfg.format = fmt;
  cfg.n_kv_heads = kH;
  cfg.head_dim = kD;
  cfg.block_size = kBlock;
  cfg.n_blocks = 2 * ((kLong + kBlock - 1) / kBlock) + (kMid + kBlock - 1) / kBlock + 8;
  cfg.k_scale = std::vector<float>(kH, kGateKScale);
  cfg.v_scale = std::vector<float>(kH, kGateVScale);
  kc::CudaKvStore gpu(cfg);
  auto add = [&](int len, std::uint64_t s) {
    const StoreCase c{kBlock, kH, kD, len, Pattern::gaussian, s, 0};
    const std::vector<float> k = make_rows(c, kGateKMagnitude, 1), v = make_rows(c, kGateVMagnitude, 2);
    const SeqId id = gpu.create_sequence();
    gpu.extend(id, len);
    gpu.write_host(id, 0, 0, len, k.data(), HD, v.data(), HD);
    return Seq{id, len};
  };
  const Seq a = add(kLong, seed), b = add(kMid, seed + 1), c = add(1, seed + 2);
  const Seq decoy = add(3 * kBlock + 5, seed + 3);  // moves the copy's pages
  const Seq a2 = add(kLong, seed);                  // the same rows as `a`, on other pages
  {
    const auto ta = gpu.block_table(a.id), tb = gpu.block_table(a2.id);
    const std::set<int> pa(ta.begin(), ta.end());
    for (int p : tb) CHECK(pa.count(p) == 0);  // anti-vacuity: no shared page
  }
  (void)decoy;
  Rng r(seed ^ 0x5C4ED);
  const double q_scale = std::max(1.5, std::sqrt(std::log(kLong / 2.0)));
  auto query = [&] {
    std::vector<float> q(static_cast<std::size_t>(kHq) * kD);
    for (auto& x : q) x = r.normal() * static_cast<float>(q_scale);
    return q;
  };
  const std::vector<float> qa = query(), qb = query(), qc = query();
  kc::DecodeWorkspace ws;
  kc::DecodePlan plan;
  const std::vector<float> alone = decode_slot(gpu, {a}, {qa.data()}, 0, kSplits, ws, &plan);
  INFO("plan path=" << plan.path << " splits=" << plan.splits << " tokens/split=" << plan.tokens_per_split);
  REQUIRE(plan.splits > 1);
  CHECK(std::all_of(alone.begin(), alone.end(), [](float x) { return std::isfinite(x); }));
  CHECK(std::any_of(alone.begin(), alone.end(), [](float x) { return x != 0.0f; }));
  {
    INFO("batch [mid, long, one]: slot 1");
    CHECK(bits_differ(decode_slot(gpu, {b, a, c}, {qb.data(), qa.data(), qc.data()}, 1, kSplits, ws), alone) == 0);
  }
  {
    INFO("batch [one, mid, long copy on other pages]: slot 2");
    CHECK(bits_differ(decode_slot(gpu, {c, b, a2}, {qc.data(), qb.data(), qa.data()}, 2, kSplits, ws), alone) == 0);
  }
  {
    INFO("the same call again");
    CHECK(bits_differ(decode_slot(gpu, {a}, {qa.data()}, 0, kSplits, ws), alone) == 0);
  }
  {
    INFO("the planner's split count, twice, alone and in slot 1 of [one, long]");
    kc::DecodePlan p0;
    const std::vector<float> first = decode_slot(gpu, {a}, {qa.data()}, 0, 0, ws, &p0);
    INFO("planner splits=" << p0.splits);
    CHECK(bits_differ(decode_slot(gpu, {a}, {qa.data()}, 0, 0, ws), first) == 0);
    kc::DecodePlan p1;
    const std::vector<float> in_batch = decode_slot(gpu, {c, a}, {qc.data(), qa.data()}, 1, 0, ws, &p1);
    if (p1.splits == p0.splits && p1.tokens_per_split == p0.tokens_per_split) CHECK(bits_differ(in_batch, first) == 0);
  }
}

}  // namespace

#define INV_CUDA_SCHEDULE(id, fmtname, seed)                                                                       \
  TEST_CASE("INV.cuda.schedule." id " a sequence's GPU decode is bitwise the same in any batch slot, beside shorter " \
            "sequences, on other pages and run to run",                                                           \
            "[gate:INV][fmt:" fmtname "][cuda]") {                                                                 \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                               \
    const auto f = parse_kv_format(fmtname);                                                                       \
    REQUIRE(f.has_value());                                                                                        \
    run_schedule_gate(*f, seed);                                                                                   \
  }
#define INV_CUDA_SCHEDULE_ROW(A, name, k, v, slot, kind) INV_CUDA_SCHEDULE(#name, #name, (9100 + 100 * slot))
KVGATE_PRESETS(INV_CUDA_SCHEDULE_ROW, _)  // one row per preset: kvgate/format_list.hpp
INV_CUDA_SCHEDULE("mixed.q8_0-fp8_e5m2", "k=q8_0,v=fp8_e5m2", 9051)
