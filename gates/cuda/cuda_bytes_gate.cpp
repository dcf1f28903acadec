// STO.cuda.bytes_read.<preset>, STO.cuda.bytes_read.mla: bytes-moved accounting of the CUDA attention
// kernels (docs/CUDA.md "What a decode step reads on the GPU"), the GPU twin of STO.bytes_read.<preset>
// (gates/conformance/bytes_read_gate.cpp). No logit shows a kernel that streams more of the pool than
// the step needs (a loop over every page of the block table, a split that re-reads the context past
// its range, a silent full-pool dequantize) as long as it masks what it should not see; the count does.
//
// What is counted. CudaKvStore::set_read_counter(true) hands decode() a device counter
// (DecodeArgs::bytes_read). Each warp of the decode kernels adds, once after its loop, the tokens
// whose K and V cells its loop read from the pool times cell bytes = (K + V page bytes) /
// (block_size x n_kv_heads): the fast and tensor-core kernels replay the page lookups of the steps
// their loop ran (WarpKvPipe::count_read: a token whose lookup hit a page was copied, the others
// zero-filled, not read), the generic kernel counts its loop's tokens by the loop index. The latent
// kernel (mla) adds per CTA the keys of its split range its tile loop covered x (latent + RoPE key
// token bytes).
//
// The bound. Per layer launched and per sequence with n keys (its length, or min(length, window) on
// a sliding window) a decode step needs the K and V rows of those n tokens, every KV head:
//   need = sum_seq n_layers x n x (K token bytes + V token bytes),
// token bytes = page bytes / B of docs/FORMATS.md "Geometry" (gates/common/format_bytes.hpp, written
// apart from the runtime's table; one token row holds all n_kv_heads heads). A CTA serves at most 4
// query heads of a KV head's group, so a group of more than 4 query heads reads its KV head's cells
// once per chunk of 4: chunks = ceil(group / 4), and the kernels' need is need x chunks. Checked:
//   need x chunks <= counted < need x chunks + slack,
//   slack = chunks x sum_seq n_layers x (splits holding keys of the seq + [windowed]) x (K + V page bytes):
// less than one page per (sequence, split holding keys, layer) -- what a loader that moves whole
// pages would add: each split boundary inside a page has that page read by both neighbouring splits,
// and the last split reads its page's slots past n -- plus one page for a windowed sequence, whose
// first page holds keys before the window. The kernels of today copy cells, not pages, so the count
// also equals need x chunks exactly (checked too: the geometries below give whole bytes per cell).
// A split count > 1 (forced 3 and 5, and the planner's), lengths that are a multiple of the page size
// (48) and not (37, 133, and 1: empty trailing splits), idle warps (6 KV heads: the second CTA of
// four warps has two), head chunks (groups of 5 and 8), the generic kernel (head_dim 32, and every
// windowed call) and a pool whose first pages belong to a decoy sequence.
// Anti-vacuity: the count is > 0, and growing every context by 21 tokens raises it by exactly
// n_layers x 21 x sequences x (K + V token bytes) x chunks; the counter off leaves the counter at 0
// and the outputs bit for bit those of the counted run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "cuda_gate_common.hpp"
#include "format_bytes.hpp"
#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate/kv_store.hpp"
#include "populations.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace kc = kvgate::cuda;

namespace {

using DevBuf = cuda_gate::DevFloats;

constexpr int kLayers = 2;   // layers of the store, each decoded once per step (one launch each)
constexpr int kGrowBy = 21;  // tokens appended to every sequence for the scaling check

struct BytesCase {
  int block_size, n_kv_heads, head_dim, group;
  std::string describe() const {
    return "block_size=" + std::to_string(block_size) + " kv_heads=" + std::to_string(n_kv_heads) +
           " head_dim=" + std::to_string(head_dim) + " gqa_group=" + std::to_string(group);
  }
};

// Fast / tensor-core kernels (head_dim 64, 128, 256; generic for the generic-only halves) and the
// generic kernel (head_dim 32), with one and two query-head chunks and a CTA with idle warps.
const BytesCase kCases[] = {{16, 4, 128, 2}, {8, 6, 64, 4}, {16, 2, 256, 5}, {16, 2, 32, 8}};
const std::vector<int> kLens = {48, 37, 133, 1};  // 48 = 3 pages of 16 (6 of 8); 37, 133 ragged; 1: empty splits

struct Need {
  std::uint64_t need = 0;   // the format's bytes, x chunks
  std::uint64_t slack = 0;  // the bound's allowance above it
};

// need and slack of one step over `lens` (docs above), from the plan's split ranges.
Need step_need(const KvFormat& f, const BytesCase& c, const std::vector<int>& lens, int window,
               const kc::DecodePlan& plan) {
  const std::size_t B = static_cast<std::size_t>(c.block_size), H = static_cast<std::size_t>(c.n_kv_heads),
                    D = static_cast<std::size_t>(c.head_dim);
  const std::size_t page = expected_page_bytes(f.k, B, H, D) + expected_page_bytes(f.v, B, H, D);
  const std::size_t token = page / B;
  const std::uint64_t chunks = static_cast<std::uint64_t>((c.group + 3) / 4);
  Need n;
  for (int len : lens) {
    const int keys = window > 0 ? std::min(len, window) : len;
    const int splits_with_keys = (keys + plan.tokens_per_split - 1) / plan.tokens_per_split;
    n.need += static_cast<std::uint64_t>(kLayers) * static_cast<std::uint64_t>(keys) * token * chunks;
    n.slack += static_cast<std::uint64_t>(kLayers) * static_cast<std::uint64_t>(splits_with_keys + (window > 0 ? 1 : 0)) *
               page * chunks;
  }
  return n;
}

struct Counts {
  long runs = 0, split_runs = 0, chunked_runs = 0, generic_runs = 0, pipelined_runs = 0, windowed_runs = 0;
};

void run_bytes_case(const KvFormat& f, const BytesCase& c, std::uint64_t seed, Counts& counts) {
  const PageGeometry g{c.block_size, c.n_kv_heads, c.head_dim};
  if (!supports(f.k, g).ok || !supports(f.v, g).ok) return;
  const int H = c.n_kv_heads, D = c.head_dim, Hq = H * c.group, HD = H * D;
  INFO("format " << f.name() << " case " << c.describe());
  REQUIRE(kc::supports_op(kc::Op::decode, f, g, Hq).ok);
  // Whole bytes per cell at these geometries: the exact count below is the format's need itself.
  const std::size_t row = (expected_page_bytes(f.k, c.block_size, H, D) + expected_page_bytes(f.v, c.block_size, H, D)) /
                          static_cast<std::size_t>(c.block_size);
  REQUIRE(row % static_cast<std::size_t>(H) == 0);

  StoreConfig cfg;
  cfg.format = f;
  cfg.n_layers = kLayers;
  cfg.n_kv_heads = H;
  cfg.head_dim = D;
  cfg.block_size = c.block_size;
  cfg.n_blocks = 2 + 2;  // the decoy's, and spare
  for (int L : kLens) cfg.n_blocks += (L + kGrowBy + c.block_size - 1) / c.block_size;
  cfg.k_scale = std::vector<float>(static_cast<std::size_t>(kLayers) * H, kGateKScale);
  cfg.v_scale = std::vector<float>(static_cast<std::size_t>(kLayers) * H, kGateVScale);
  kc::CudaKvStore gpu(cfg);
  REQUIRE_FALSE(gpu.read_counter_on());
  // A decoy first (large values), so the tested pages do not start at page 0 and the padding of a
  // shorter sequence's block-table row (page 0) holds someone else's keys.
  const SeqId decoy = gpu.create_sequence();
  gpu.extend(decoy, c.block_size + 1);
  {
    std::vector<float> big(static_cast<std::size_t>(c.block_size + 1) * HD, 30.0f);
    for (int l = 0; l < kLayers; ++l) gpu.write_host(decoy, l, 0, c.block_size + 1, big.data(), HD, big.data(), HD);
  }
  std::vector<SeqId> seqs;
  std::vector<int> lens = kLens;
  // Rows for the grown length; the first kLens[s] are written now, the rest for the scaling check.
  std::vector<std::vector<float>> ks, vs;
  for (std::size_t s = 0; s < lens.size(); ++s) {
    const StoreCase sc{c.block_size, H, D, lens[s] + kGrowBy, Pattern::gaussian, seed * 31 + s, 0};
    ks.push_back(make_rows(sc, kGateKMagnitude, 1));
    vs.push_back(make_rows(sc, kGateVMagnitude, 2));
    const SeqId id = gpu.create_sequence();
    gpu.extend(id, lens[s]);
    for (int l = 0; l < kLayers; ++l) gpu.write_host(id, l, 0, lens[s], ks[s].data(), HD, vs[s].data(), HD);
    seqs.push_back(id);
  }
  const int batch = static_cast<int>(seqs.size());
  Rng r(seed ^ 0x5EEDu);
  std::vector<float> q(static_cast<std::size_t>(batch) * Hq * D);
  for (auto& x : q) x = r.normal() * 1.5f;
  DevBuf dq(q.size()), dout(q.size()), doff(q.size());
  dq.put(q);
  kc::DecodeWorkspace ws;

  // One decode step (every layer) with the counter on: the bytes counted and the plan.
  auto step = [&](int splits, int window, DevBuf& out, kc::DecodePlan& plan) {
    gpu.reset_read_bytes();
    for (int l = 0; l < kLayers; ++l) plan = gpu.decode(seqs, l, Hq, dq.p, out.p, ws, 0.0f, splits, nullptr, window);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    return gpu.read_bytes();
  };
  auto check_step = [&](int splits, int window) {
    INFO("lens " << lens[0] << "," << lens[1] << "," << lens[2] << "," << lens[3] << " num_splits " << splits
                 << " window " << window);
    kc::DecodePlan plan;
    const std::uint64_t counted = step(splits, window, dout, plan);
    const Need n = step_need(f, c, lens, window, plan);
    INFO("plan path=" << plan.path << " splits=" << plan.splits << " tokens/split=" << plan.tokens_per_split
                      << " head_chunks=" << plan.head_chunks << "; counted " << counted << " B, need " << n.need
                      << " B, slack " << n.slack << " B");
    CHECK(plan.head_chunks == (c.group + 3) / 4);
    CHECK(counted > 0);
    CHECK(counted >= n.need);
    CHECK(counted < n.need + n.slack);
    CHECK(counted == n.need);  // cells, not pages: the exact need (whole bytes per cell here)
    ++counts.runs;
    counts.split_runs += plan.splits > 1;
    counts.chunked_runs += plan.head_chunks > 1;
    counts.generic_runs += plan.path == "generic" || window > 0;
    counts.pipelined_runs += plan.path != "generic" && window == 0;
    counts.windowed_runs += window > 0;
    return counted;
  };

  gpu.set_read_counter(true);
  REQUIRE(gpu.read_counter_on());
  for (int window : {0, 20})
    for (int splits : {1, 3, 5, 0}) check_step(splits, window);

  // The counter off: nothing counted, and the output bits of the same step counted (3 splits, no window).
  {
    kc::DecodePlan p_on, p_off;
    const std::uint64_t on = step(3, 0, dout, p_on);
    REQUIRE(on > 0);
    gpu.set_read_counter(false);
    REQUIRE_FALSE(gpu.read_counter_on());
    for (int l = 0; l < kLayers; ++l) p_off = gpu.decode(seqs, l, Hq, dq.p, doff.p, ws, 0.0f, 3, nullptr, 0);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(gpu.read_bytes() == 0);
    const std::vector<float> a = dout.get(), b = doff.get();
    std::size_t differ = 0;
    for (std::size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], 4) != 0;
    INFO(differ << " of " << a.size() << " outputs differ in their bits between the counter on and off");
    CHECK(differ == 0);
    CHECK(p_on.splits == p_off.splits);
    gpu.set_read_counter(true);
  }

  // Scaling: every context grows by kGrowBy tokens; the count grows by exactly their bytes.
  const std::uint64_t before = check_step(3, 0);
  for (std::size_t s = 0; s < seqs.size(); ++s) {
    gpu.extend(seqs[s], kGrowBy);
    const std::size_t off = static_cast<std::size_t>(lens[s]) * HD;
    for (int l = 0; l < kLayers; ++l)
      gpu.write_host(seqs[s], l, lens[s], kGrowBy, ks[s].data() + off, HD, vs[s].data() + off, HD);
    lens[s] += kGrowBy;
  }
  const std::uint64_t after = check_step(3, 0);
  const std::uint64_t chunks = static_cast<std::uint64_t>((c.group + 3) / 4);
  CHECK(after > before);
  CHECK(after - before ==
        static_cast<std::uint64_t>(kLayers) * kGrowBy * seqs.size() * static_cast<std::uint64_t>(row) * chunks);
  check_step(5, 20);
  check_step(0, 0);
}

void run_bytes_gate(const KvFormat& f, std::uint64_t seed) {
  Counts counts;
  for (const BytesCase& c : kCases) run_bytes_case(f, c, seed++, counts);
  INFO("format " << f.name() << ": " << counts.runs << " steps, " << counts.split_runs << " with splits > 1, "
                 << counts.chunked_runs << " with 2 head chunks, " << counts.generic_runs << " on the generic kernel, "
                 << counts.pipelined_runs << " on the fast / tensor-core kernels, " << counts.windowed_runs
                 << " windowed");
  // Anti-vacuity: the geometries ran, with split counts above 1, two head chunks and the generic kernel.
  CHECK(counts.runs >= 12);
  CHECK(counts.split_runs > 0);
  CHECK(counts.chunked_runs > 0);
  CHECK(counts.generic_runs > 0);
  const bool fast_pair = cuda_gate::decode_pipelined_on_cuda(f.k, f.v);
  if (fast_pair) CHECK(counts.pipelined_runs > 0);
}

// ---- latent attention (MLA) ----------------------------------------------------------------------

// One latent store (kv_lora 128, RoPE key 64, 20 query heads: two 16-head chunks) per latent format
// beside a bf16 RoPE key; the count is tokens staged x (latent + RoPE token bytes) x 2 chunks.
bool run_mla_bytes(HalfFormat latent, std::uint64_t seed) {
  constexpr int B = 16, KL = 128, R = 64, Hq = 20, chunks = 2;
  const KvFormat f{latent, HalfFormat::bf16};
  if (!supports(f.k, PageGeometry{B, 1, KL}).ok || !kc::supports_mla(f, KL, R, Hq).ok) return false;
  INFO("latent format " << name(latent));
  StoreConfig sc = cuda_gate::latent_store_config(f, KL, R, B);
  sc.n_blocks = 4;
  for (int L : kLens) sc.n_blocks += (L + B - 1) / B;
  kc::CudaKvStore gpu(sc);
  std::vector<SeqId> ids;
  for (std::size_t s = 0; s < kLens.size(); ++s) {
    const int L = kLens[s];
    Rng r(seed * 131 + s);
    std::vector<float> rows(static_cast<std::size_t>(L) * (KL + R));
    for (auto& x : rows) x = r.normal();
    const SeqId id = gpu.create_sequence();
    gpu.extend(id, L);
    gpu.write_host(id, 0, 0, L, rows.data(), KL + R, rows.data() + KL, KL + R);
    ids.push_back(id);
  }
  const std::size_t token = expected_page_bytes(f.k, B, 1, KL) / B + expected_page_bytes(f.v, B, 1, R) / B;
  std::uint64_t need = 0;
  for (int L : kLens) need += static_cast<std::uint64_t>(L) * token * chunks;
  Rng r(seed ^ 0x77u);
  std::vector<float> q(kLens.size() * Hq * (KL + R));
  for (auto& x : q) x = r.normal();
  DevBuf dq(q.size()), dout(kLens.size() * Hq * KL);
  dq.put(q);
  kc::DecodeWorkspace ws;
  gpu.set_read_counter(true);
  for (int splits : {1, 3, 0}) {
    gpu.reset_read_bytes();
    const kc::DecodePlan p = gpu.mla_attention(ids, {}, 0, Hq, dq.p, dout.p, ws, 0.1f, splits);
    const std::uint64_t counted = gpu.read_bytes();
    INFO("num_splits " << splits << ": plan splits=" << p.splits << " tokens/split=" << p.tokens_per_split
                       << " head_chunks=" << p.head_chunks << "; counted " << counted << " B, need " << need << " B");
    CHECK(p.head_chunks == chunks);
    CHECK(counted > 0);
    CHECK(counted == need);  // the latent kernel stages whole tokens of its range, each once per chunk
  }
  return true;
}

}  // namespace

#define STO_CUDA_BYTES_READ(id, fmtname, seed)                                                              \
  TEST_CASE("STO.cuda.bytes_read." id " the KV bytes a GPU decode step reads are the format's need, within " \
            "a page per split",                                                                             \
            "[gate:STO][fmt:" fmtname "][cuda]") {                                                          \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                        \
    const auto f = parse_kv_format(fmtname);                                                                \
    REQUIRE(f.has_value());                                                                                 \
    run_bytes_gate(*f, seed);                                                                               \
  }
#define STO_CUDA_BYTES_READ_ROW(A, name, k, v, slot, kind) STO_CUDA_BYTES_READ(#name, #name, (12000 + 100 * slot))
KVGATE_PRESETS(STO_CUDA_BYTES_READ_ROW, _)  // one row per preset: kvgate/format_list.hpp

TEST_CASE("STO.cuda.bytes_read.mla the GPU latent kernel reads each key's latent and RoPE key once per head chunk",
          "[gate:STO][mla][cuda]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  long ran = 0;
  for (HalfFormat h : {HalfFormat::bf16, HalfFormat::int8, HalfFormat::fp8_e4m3, HalfFormat::q8_0, HalfFormat::q4_0,
                       HalfFormat::mxfp4, HalfFormat::fp8_block128}) {
    ran += run_mla_bytes(h, 13000 + static_cast<std::uint64_t>(h) * 7) ? 1 : 0;
  }
  CHECK(ran == 7);  // every listed latent format runs at kv_lora 128
}
