// GPU gates for the CUDA backend (docs/CUDA.md): [gate:ORA][cuda] and [gate:STO][cuda].
//
//  ORA.cuda.store.<half>     GPU page bytes == CPU runtime page bytes == oracle page bytes, every
//                            covering geometry and input pattern (plus special values vs oracle).
//  ORA.cuda.decode.<fmt>     GPU split-K decode attention vs the oracle's FP64 SDPA over the
//                            oracle's dequantization of the GPU's own page bytes: NaN/Inf first,
//                            then NMSE and max-abs under the derived FP32 bound (bounds.hpp),
//                            across page sizes, GQA ratios, head_dims 8/64/128/256, ragged batches,
//                            contexts crossing pages and forced split counts.
//  PAR.cuda.decode.page_tiles.<fmt>  the pipelined decode (fast, tensor-core) with page tiles == with
//                            token lookups, bit for bit, every decode case (kernels/decode.cuh WarpKvPipe).
//  STO.cuda.capability       supports_op refusals and kernel paths (no device needed).
//  STO.cuda.slow_pool_twins  PAR.cuda.decode.slow_pool.<fmt> exists exactly for the formats whose
//                            decode kernel is pipelined (no device needed).
//  STO.cuda.resolve          resolve_kv(backend "cuda") consults supports_op (no device needed).
//
// Without a device every [cuda] case prints "SKIPPED: no CUDA device: <reason>" and passes, so the
// executable exits 0 on CPU-only CI; the message keeps the skip visible.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bounds.hpp"
#include "catch_compat.hpp"
#include "cuda_gate_common.hpp"
#include "head_scales.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate/kv_store.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate_oracle/attention.hpp"
#include "kvgate_oracle/formats.hpp"
#include "kvgate_oracle/metrics.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace ko = kvgate_oracle;
namespace kc = kvgate::cuda;

namespace {

using cuda_gate::decode_pipelined_on_cuda;
using cuda_gate::first_diff;
using cuda_gate::generic_only_on_cuda;
using DevBuf = cuda_gate::DevFloats;
ko::Half to_oracle(HalfFormat f) { return cuda_gate::oracle_half(f); }

// Writes the same rows into a CPU store and a GPU store in two appends (an append crosses a page).
void write_both(PagedKvStore& cpu, SeqId cs, kc::CudaKvStore& gpu, SeqId gs, int n_tokens, const std::vector<float>& k,
                const std::vector<float>& v, std::size_t stride) {
  const int first = std::min(n_tokens, n_tokens / 2 + 1);
  cpu.extend(cs, first);
  cpu.write(cs, 0, 0, first, k.data(), stride, v.data(), stride);
  gpu.extend(gs, first);
  gpu.write_host(gs, 0, 0, first, k.data(), stride, v.data(), stride);
  if (n_tokens > first) {
    const int rest = n_tokens - first;
    cpu.extend(cs, rest);
    cpu.write(cs, 0, first, rest, k.data() + first * stride, stride, v.data() + first * stride, stride);
    gpu.extend(gs, rest);
    gpu.write_host(gs, 0, first, rest, k.data() + first * stride, stride, v.data() + first * stride, stride);
  }
}

// ---- ORA.cuda.store --------------------------------------------------------------------------------

// head_scales (ORA.cuda.store_head_scales, fp8 halves): the scales differ per KV head
// (gate_head_scales), the oracle quantizes each head with its own; anti-vacuity: the oracle with head
// 0's scale on every head gives other bytes on some page of 3/4 of the multi-head cases or more.
void run_store_gate(HalfFormat f, std::uint64_t seed0, bool head_scales = false) {
  const KvFormat fmt{f, f};
  long cases = 0, pages = 0, head_cases = 0, head0_differs = 0;
  for (const StoreCase& c : covering_cases(seed0)) {
    if (!case_supported(fmt, c)) continue;
    ++cases;
    INFO("half " << name(f) << " case " << c.describe() << (head_scales ? " (scales per KV head)" : ""));
    const auto k = make_rows(c, kGateKMagnitude, 1), v = make_rows(c, kGateVMagnitude, 2);
    StoreConfig cc = case_config(fmt, c);
    const std::vector<float> hk = gate_head_scales(1, c.n_kv_heads, KvHalf::K), hv = gate_head_scales(1, c.n_kv_heads, KvHalf::V);
    if (head_scales) {
      cc.k_scale = hk;
      cc.v_scale = hv;
    }
    PagedKvStore cpu(cc);
    kc::CudaKvStore gpu(cc);
    if (head_scales && c.n_kv_heads > 1) REQUIRE(gpu.per_head_scales());
    bool differs = false;
    const SeqId cs = cpu.create_sequence(), gs = gpu.create_sequence();
    write_both(cpu, cs, gpu, gs, c.n_tokens, k, v, c.row_stride());
    const auto ct = cpu.block_table(cs), gt = gpu.block_table(gs);
    REQUIRE(ct.size() == gt.size());
    const ko::PageShape shape{c.block_size, c.n_kv_heads, c.head_dim};
    for (int half = 0; half < 2; ++half) {
      const KvHalf kh = half == 0 ? KvHalf::K : KvHalf::V;
      REQUIRE(gpu.page_bytes(kh) == cpu.page_bytes(kh));
      for (std::size_t p = 0; p < ct.size(); ++p) {
        const auto got = gpu.download_page(0, kh, gt[p]);
        const std::uint8_t* want = cpu.page(0, kh, ct[p]);
        const int t0 = static_cast<int>(p) * c.block_size, n = std::min(c.block_size, c.n_tokens - t0);
        std::vector<float> in(static_cast<std::size_t>(n) * c.n_kv_heads * c.head_dim);
        for (int t = 0; t < n; ++t)
          std::copy_n((half == 0 ? k : v).data() + (t0 + t) * c.row_stride(), c.n_kv_heads * c.head_dim,
                      in.data() + static_cast<std::size_t>(t) * c.n_kv_heads * c.head_dim);
        const auto orc = head_scales ? ko::quantize_page(to_oracle(f), shape, in.data(), n, half == 0 ? hk : hv)
                                     : ko::quantize_page(to_oracle(f), shape, in.data(), n, half == 0 ? kGateKScale : kGateVScale);
        if (head_scales)
          differs |= ko::quantize_page(to_oracle(f), shape, in.data(), n, half == 0 ? hk[0] : hv[0]) != orc;
        INFO((half == 0 ? "K" : "V") << " page " << p << ": vs CPU " << first_diff(got.data(), want, got.size(), "gpu", "cpu")
                                     << "; vs oracle " << first_diff(got.data(), orc.data(), got.size(), "gpu", "oracle"));
        CHECK(std::memcmp(got.data(), want, got.size()) == 0);
        CHECK(orc.size() == got.size());
        CHECK(std::equal(orc.begin(), orc.end(), got.begin()));
        ++pages;
      }
    }
    if (head_scales && c.n_kv_heads > 1) {
      ++head_cases;
      head0_differs += differs;
    }
  }
  CHECK(cases >= 64);
  CHECK(pages >= 256);
  if (head_scales) {
    // A case whose codes are all zero at either scale (the zero_cells pattern: an eighth of the
    // cases) cannot differ; on an H100: 84 of 96 multi-head cases differ.
    INFO("multi-head cases " << head_cases << ", head 0's scales give other bytes in " << head0_differs);
    CHECK(head_cases >= 16);
    CHECK(head0_differs * 4 >= head_cases * 3);
  }
}

// Special values: NaN, +-inf, +-0, f32 subnormals, huge, f16/fp8 rounding boundaries and ties.
// GPU == oracle (the normative reference) and GPU == CPU runtime for every value, +-inf and huge
// inputs included (the CPU's rint(x/s) saturates before its int conversion, as the GPU's does).
void run_store_special(HalfFormat f) {
  const KvFormat fmt{f, f};
  const int H = 2, D = 64, B = 3, T = 7;
  const float specials[] = {std::nanf(""), -std::nanf(""), INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, -3e-39f,
                            1e30f, -1e30f, 65504.0f, 65520.0f, 8388608.0f, 448.0f, 464.0f, 480.0f, -57344.0f, 61440.0f,
                            0.5f, 1.5f, 2.5f, -2.5f, 1.0009765625f, 6.1035156e-05f, 5.9604645e-08f, 1e-7f};
  const int ns = static_cast<int>(sizeof(specials) / sizeof(specials[0]));
  std::vector<float> k(static_cast<std::size_t>(T) * H * D), v(k.size());
  Rng r(77);
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = r.normal();
    v[i] = r.normal() * 0.05f;
  }
  // Token 0..2: a special value in every 8th element; token 3: cells made only of specials; token 4:
  // an all-NaN cell; tokens 5..6 stay normal (in-domain control).
  for (int i = 0; i < H * D; i += 8) k[i] = v[i + 1] = specials[(i / 8) % ns];
  for (int i = 0; i < H * D; i += 5) k[H * D + i] = specials[(i * 7) % ns];
  for (int i = 0; i < H * D; ++i) v[2 * H * D + i] = i % 3 ? specials[i % ns] : v[2 * H * D + i];
  for (int i = 0; i < H * D; ++i) k[3 * H * D + i] = specials[i % ns];
  for (int i = 0; i < D; ++i) v[4 * H * D + i] = std::nanf("");
  StoreConfig cfg;
  cfg.format = fmt;
  cfg.n_kv_heads = H;
  cfg.head_dim = D;
  cfg.block_size = B;
  cfg.n_blocks = 4;
  cfg.k_scale = {kGateKScale};
  cfg.v_scale = {kGateVScale};
  PagedKvStore cpu(cfg);
  kc::CudaKvStore gpu(cfg);
  const SeqId cs = cpu.create_sequence(), gs = gpu.create_sequence();
  write_both(cpu, cs, gpu, gs, T, k, v, static_cast<std::size_t>(H * D));
  const ko::PageShape shape{B, H, D};
  const auto ct = cpu.block_table(cs), gt = gpu.block_table(gs);
  long cpu_checked = 0;
  for (int half = 0; half < 2; ++half) {
    const KvHalf kh = half == 0 ? KvHalf::K : KvHalf::V;
    const auto& x = half == 0 ? k : v;
    for (std::size_t p = 0; p < ct.size(); ++p) {
      const int t0 = static_cast<int>(p) * B, n = std::min(B, T - t0);
      const auto got = gpu.download_page(0, kh, gt[p]);
      const auto orc = ko::quantize_page(to_oracle(f), shape, x.data() + static_cast<std::size_t>(t0) * H * D, n,
                                         half == 0 ? kGateKScale : kGateVScale);
      INFO("half " << name(f) << (half == 0 ? " K" : " V") << " page " << p << ": "
                   << first_diff(got.data(), orc.data(), got.size(), "gpu", "oracle"));
      CHECK(std::equal(orc.begin(), orc.end(), got.begin()));
      for (int s = 0; s < n; ++s) {
        for (const ByteRun& run : token_ranges(f, cpu.geometry(), s)) {
          INFO("CPU slot " << s << " run " << run.name);
          CHECK(std::memcmp(got.data() + run.offset, cpu.page(0, kh, ct[p]) + run.offset, run.bytes) == 0);
        }
        ++cpu_checked;
      }
    }
  }
  CHECK(cpu_checked == 2 * T);  // every slot of both halves, the out-of-range ones included
}

// ---- ORA.cuda.decode --------------------------------------------------------------------------------

struct DecodeCase {
  int block_size, n_kv_heads, head_dim, group;
  std::vector<int> lens;  // one decode query per sequence, at its last position
  int num_splits;         // 0 = planner's choice
  std::uint64_t seed;
  double q_boost = 1.0;   // x the query scale below (a more peaked softmax where a long case needs it)
  std::string describe() const {
    std::string l;
    for (int x : lens) l += (l.empty() ? "" : ",") + std::to_string(x);
    return "block_size=" + std::to_string(block_size) + " kv_heads=" + std::to_string(n_kv_heads) +
           " head_dim=" + std::to_string(head_dim) + " gqa_group=" + std::to_string(group) + " lens=[" + l +
           "] splits=" + std::to_string(num_splits) + " seed=" + std::to_string(seed) +
           (q_boost != 1.0 ? " q_boost=" + std::to_string(q_boost) : "");
  }
};

std::vector<DecodeCase> decode_cases(std::uint64_t seed0) {
  std::vector<DecodeCase> out;
  for_each_attention_geometry([&](int b, int h, int d, int g, int i) {
    const int n = 2 * b + b / 2 + 3 + (i % 5) * 37;  // crosses pages, ragged last page
    // A ragged batch: the long sequence, a short one, a one-token one (empty splits).
    out.push_back({b, h, d, g, {n, n / 3 + 1, 1}, 0, seed0 + static_cast<std::uint64_t>(i)});
  });
  // Long contexts: many pipeline steps per CTA, planner splits and forced split counts.
  out.push_back({16, 8, 128, 4, {3001, 1500}, 0, seed0 + 100});
  out.push_back({16, 8, 128, 4, {2500}, 1, seed0 + 101});
  out.push_back({16, 8, 128, 4, {2500}, 7, seed0 + 102});
  out.push_back({7, 2, 64, 8, {1999, 17}, 0, seed0 + 103});
  out.push_back({16, 4, 256, 2, {1200}, 0, seed0 + 104});
  out.push_back({5, 2, 8, 4, {777}, 3, seed0 + 105});
  // The split merge loads nw x U partial rows a round (decode_combine.cu: 256 splits at D <= 128,
  // 128 at D = 256): split counts past one round (282 and 132 after the planner's rounding of
  // tokens per split to 16), and a head_dim that is not a multiple of 4 (4-byte row loads). At
  // D = 256 and 2100 keys the output RMS of k8v4 and of fp8 with per-head scales fell just under 10
  // bounds (bound / rms 0.106 and 0.101 on the H200): the query scale x 1.15 makes one key dominate
  // (effective count n (n/2)^-(1.15^2) < 1: the output RMS up to sqrt(2) x that of two keys) while
  // the bound grows 1.15x with the scores' L1.
  out.push_back({16, 8, 128, 4, {4500, 700}, 300, seed0 + 106});
  out.push_back({16, 4, 256, 2, {2100}, 140, seed0 + 107, 1.15});
  out.push_back({4, 2, 6, 2, {301}, 5, seed0 + 108});
  // Pages of 64 tokens: the tensor-core kernel's page tiles (decode.cuh WarpKvPipe) start a split's
  // 16-token steps inside a page (slot 16, 32 or 48), which 16-token pages never do.
  out.push_back({64, 8, 128, 4, {1500, 333}, 0, seed0 + 109});
  return out;
}

// Bound of one decode case (bounds.hpp attn_f32_max_abs, with the GPU's summation depth and
// extended for the rotated halves):
//  - dot products are blocked sums. CUDA-core paths ("fast", "generic"): a lane adds <= 8
//    products sequentially (two chains of 8 over its 16 elements; generic <= 8 elements per lane),
//    then one pair add, <= 5 butterfly levels across lanes, the multiply by the cell/block scale,
//    and q carries one rounding from its pre-scaling by softmax_scale*log2(e): forward error
//    <= gamma_16 * L1 (Higham, blocked summation), in place of the recursive gamma_{D+2} of a
//    length-D loop. Tensor-core path ("mma"): 2*D/16 sequential MMA steps (q split hi + lo), each
//    adding 16 exact products to the FP32 accumulator with up to 2u error (tensor cores may
//    truncate: Fasi et al. 2021), + 4u for the hi/lo representation of q, + <= D/32 block-scale
//    products and sums, + 4 scalings: depth D/4 + 24;
//  - the kernel computes scores in the domain K is stored in: for a rotated K it dots the
//    rotated query (H q in binary32: log2(D) butterfly levels and the scaling, error vector
//    |e|_2 <= (log2 D + 2) u |q|_2) with the rotated-domain codes y, so L1 is taken in both
//    domains and the rotation adds sc * (log2 D + 2) u |q|_2 |y|_2 (Cauchy-Schwarz);
//  - for a rotated V the kernel accumulates sum p y in the rotated domain and rotates the output
//    once (binary32: <= wht_slack(D, |o|_2) per element); the comparison is therefore made in the
//    rotated domain (H applied to both outputs in binary64) with vmax over the rotated values.
int gpu_dot_depth(const std::string& path, int D) { return path.rfind("mma", 0) == 0 ? D / 4 + 24 : 16; }

// Sliding windows of the windowed twin (ORA.cuda.decode_window): at page boundaries +-1, across
// two pages, a prime, and a window of one key.
int case_window(int i, int block_size) {
  const int w[] = {block_size - 1, block_size, block_size + 1, 2 * block_size + 1, 37, 1};
  return std::max(1, w[i % 6]);
}

// Soft-capped twin (ORA.cuda.decode_softcap, Gemma 2's attn_logit_softcapping): cap = 3 x the
// query scale (4.5 at q_scale 1.5), so the largest scores (|s| up to ~3 q_scale) are bent hard
// (cap tanh(1) = 0.76 cap) while the softmax stays peaked; every other case also runs a sliding window (the generic kernel, as
// Gemma 2's local layers). The long-context cases are left out: under the cap their softmax
// flattens over hundreds of keys and the output's RMS falls towards the worst-case bound.
// Softcap rounding (division, tanhf <= 2 ulp, multiply; tanh' <= 1): u |s| + 3u cap per score,
// counted as an L1 increase of (|s| + 3 cap) / depth in attn_f32_max_abs's depth x u x L1.
// Slow-pool twin (PAR.cuda.decode.slow_pool): every case again over the same pages in mapped host
// memory (cuda_gate::MappedPages), outputs bit for bit equal: a stage of WarpKvPipe read before its
// cp.async.wait_group shows there. Run only for the formats with a pipelined kernel (the list by the
// PAR.cuda.decode.slow_pool rows below).
// Per-head-scale twin (ORA.cuda.decode_head_scales, docs/FORMATS.md "Static scales per KV head"): the
// store's fp8 scales differ per KV head (gate_head_scales: ratios that are not powers of two), the
// oracle dequantizes each head with its own scale; same bound. Anti-vacuity: the reference made with
// head 0's scales on every head is farther than 4 bounds from the one judged in 16 multi-head
// sequences or more, and (an fp8 V) in 90% of them (a kernel reading one head's scale for all goes red).
// Page-tile twin (PAR.cuda.decode.page_tiles): every case again with the pipelined kernels' page
// tiles switched the other way (kvgate::cuda::set_decode_page_tiles; kernels/decode.cuh
// WarpKvPipe), outputs bit for bit equal: both ways stage the same bytes in the same places, so a page, slot, head or
// zero-fill that one of them gets wrong shows there, however small its effect on the output.
// Anti-vacuity: at least 8 cases per format on a pipelined kernel with pages a page tile of either
// kernel covers (a power of two >= 16 tokens: the 16- and 64-token cases).
struct DecodeVariant {
  bool windowed = false, capped = false, slow_pool = false, head_scales = false, page_tiles_twin = false;
};
void run_decode_gate(const KvFormat& fmt, std::uint64_t seed0, DecodeVariant variant = {}) {
  const bool windowed = variant.windowed, capped = variant.capped, slow_pool = variant.slow_pool;
  long cases = 0, windows_cut = 0, windowed_seqs = 0, cap_seqs = 0, cap_visible = 0, slow_pipelined = 0;
  long head_seqs = 0, heads_visible = 0, tile_cases = 0;
  std::map<std::string, long> path_cases;  // plan.path -> cases (the kernel each case ran on)
  int case_index = 0;
  kc::DecodeWorkspace ws;
  for (const DecodeCase& dc : decode_cases(seed0)) {
    const int max_len0 = *std::max_element(dc.lens.begin(), dc.lens.end());
    if (capped && max_len0 > 1000) continue;
    const int ci = case_index++;
    const int window = windowed || (capped && ci % 2 == 1) ? case_window(ci, dc.block_size) : 0;
    const PageGeometry g{dc.block_size, dc.n_kv_heads, dc.head_dim};
    if (!supports(fmt.k, g).ok || !supports(fmt.v, g).ok) continue;
    INFO("window " << window);
    const int H = dc.n_kv_heads, D = dc.head_dim, Hq = H * dc.group, HD = H * D;
    const int batch = static_cast<int>(dc.lens.size());
    const int max_len = *std::max_element(dc.lens.begin(), dc.lens.end());
    INFO("format " << fmt.name() << " case " << dc.describe());
    const auto sup = kc::supports_op(kc::Op::decode, fmt, g, Hq);
    REQUIRE(sup.ok);
    ++cases;

    StoreConfig cfg;
    cfg.format = fmt;
    cfg.n_kv_heads = H;
    cfg.head_dim = D;
    cfg.block_size = dc.block_size;
    cfg.n_blocks = 0;
    for (int L : dc.lens) cfg.n_blocks += (L + dc.block_size - 1) / dc.block_size;
    cfg.n_blocks += 3;
    // Scales per KV head (one per head in every case: H entries, equal without variant.head_scales).
    const std::vector<float> kscale = variant.head_scales ? gate_head_scales(1, H, KvHalf::K) : std::vector<float>(H, kGateKScale);
    const std::vector<float> vscale = variant.head_scales ? gate_head_scales(1, H, KvHalf::V) : std::vector<float>(H, kGateVScale);
    cfg.k_scale = kscale;
    cfg.v_scale = vscale;
    kc::CudaKvStore gpu(cfg);
    if (variant.head_scales && H > 1) REQUIRE(gpu.per_head_scales());
    // A decoy sequence first so the pages of the tested sequences do not start at block 0.
    const SeqId decoy = gpu.create_sequence();
    gpu.extend(decoy, dc.block_size + 1);
    std::vector<SeqId> seqs;
    std::vector<std::vector<float>> ks, vs;
    for (int s = 0; s < batch; ++s) {
      const StoreCase c{dc.block_size, H, D, dc.lens[static_cast<std::size_t>(s)], Pattern::gaussian,
                        dc.seed * 31 + static_cast<std::uint64_t>(s), 0};
      ks.push_back(make_rows(c, kGateKMagnitude, 1));
      vs.push_back(make_rows(c, kGateVMagnitude, 2));
      const SeqId id = gpu.create_sequence();
      gpu.extend(id, c.n_tokens);
      gpu.write_host(id, 0, 0, c.n_tokens, ks.back().data(), HD, vs.back().data(), HD);
      seqs.push_back(id);
    }
    {  // decoy content: large values; reading a decoy page instead of the right one goes red
      std::vector<float> big(static_cast<std::size_t>(dc.block_size + 1) * HD, 30.0f);
      gpu.write_host(decoy, 0, 0, dc.block_size + 1, big.data(), HD, big.data(), HD);
    }
    // Query scale: 1.5 (softmax far from uniform), growing as sqrt(ln(n/2)) for long contexts so
    // that a handful of keys dominate (effective count ~ n exp(-s^2) ~ 2). Otherwise the output
    // of a long context averages towards 0 while the worst-case FP32 bound (which does not shrink
    // with averaging) stays put, and the bound would exceed kOraSensitivity of the output's RMS.
    Rng r(dc.seed ^ 0xABCDEF);
    const double q_scale = std::max(1.5, std::sqrt(std::log(std::max(1, max_len) / 2.0))) * dc.q_boost;
    const float softcap = capped ? static_cast<float>(3.0 * q_scale) : 0.0f;
    INFO("softcap " << softcap);
    std::vector<float> q(static_cast<std::size_t>(batch) * Hq * D);
    for (auto& x : q) x = r.normal() * static_cast<float>(q_scale);
    DevBuf dq(q.size()), dout(q.size());
    REQUIRE(cudaMemcpy(dq.p, q.data(), q.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    std::vector<float> poison(q.size(), std::nanf(""));
    REQUIRE(cudaMemcpy(dout.p, poison.data(), q.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    const kc::DecodePlan plan =
        gpu.decode(seqs, 0, Hq, dq.p, dout.p, ws, 0.0f, dc.num_splits, nullptr, window, softcap);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<float> got(q.size());
    REQUIRE(cudaMemcpy(got.data(), dout.p, got.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    INFO("plan path=" << plan.path << " splits=" << plan.splits << " tokens/split=" << plan.tokens_per_split
                      << " ctas=" << plan.ctas);
    ++path_cases[window > 0 ? std::string("generic") : plan.path];

    // NaN/Inf first (the output was poisoned with NaN: an unwritten element shows here).
    REQUIRE(ko::count_nonfinite(std::span<const float>(got)) == 0);

    // The same decode again through `store` (sequences `ids`) into a NaN-poisoned buffer: the same
    // plan, and how many outputs differ in their bits from `got`.
    auto bits_differ_again = [&](auto& store, const auto& ids) {
      DevBuf dagain(q.size());
      REQUIRE(cudaMemcpy(dagain.p, poison.data(), q.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
      kc::DecodeWorkspace ws2;
      const kc::DecodePlan p2 = store.decode(ids, 0, Hq, dq.p, dagain.p, ws2, 0.0f, dc.num_splits, nullptr, window, softcap);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      std::vector<float> again(q.size());
      REQUIRE(cudaMemcpy(again.data(), dagain.p, again.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
      CHECK(p2.path == plan.path);
      CHECK(p2.splits == plan.splits);
      std::size_t differ = 0;
      for (std::size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &again[i], 4) != 0;
      return differ;
    };

    if (slow_pool) {
      cuda_gate::MappedPages mp;
      mp.map(gpu, seqs);
      const std::size_t differ = bits_differ_again(*mp.view, mp.seqs);
      INFO(differ << " of " << got.size() << " outputs differ in their bits");
      CHECK(differ == 0);
      // A pipelined kernel (fast, mma) whose splits wrap the 3-stage ring (> 2 stages of <= 16 tokens).
      if (plan.path != "generic" && plan.tokens_per_split > 32) ++slow_pipelined;
      continue;
    }

    if (variant.page_tiles_twin) {  // `got` ran with the process's setting; the other way now
      const bool was = kc::decode_page_tiles();
      kc::set_decode_page_tiles(!was);
      const std::size_t differ = bits_differ_again(gpu, seqs);
      kc::set_decode_page_tiles(was);
      INFO(differ << " of " << got.size() << " outputs differ in their bits between page tiles and token lookups");
      CHECK(differ == 0);
      const int B = dc.block_size;
      if (plan.path != "generic" && window == 0 && (B & (B - 1)) == 0 && B >= 16) ++tile_cases;
      continue;
    }

    const ko::PageShape shape{dc.block_size, H, D};
    const bool rot_k = fmt.k == HalfFormat::q4_0_rot, rot_v = fmt.v == HalfFormat::q4_0_rot;
    const double sc = 1.0 / std::sqrt(double(D));
    for (int s = 0; s < batch; ++s) {
      const int n = dc.lens[static_cast<std::size_t>(s)];
      const auto table = gpu.block_table(seqs[static_cast<std::size_t>(s)]);
      std::vector<float> kd(static_cast<std::size_t>(n) * HD), vd(kd.size()), ky(kd.size()), vy(kd.size());
      std::vector<float> kd0, vd0;  // head-scales twin: every head dequantized with head 0's scale
      if (variant.head_scales) kd0.resize(kd.size()), vd0.resize(kd.size());
      for (std::size_t p = 0; p < table.size(); ++p) {
        const int t0 = static_cast<int>(p) * dc.block_size, m = std::min(dc.block_size, n - t0);
        const auto kp = gpu.download_page(0, KvHalf::K, table[p]);
        const auto vp = gpu.download_page(0, KvHalf::V, table[p]);
        auto put = [&](std::vector<float>& dst, const std::vector<float>& src) {
          std::copy(src.begin(), src.end(), dst.begin() + static_cast<std::ptrdiff_t>(t0) * HD);
        };
        // Each head's own scale (every head the same one outside the head-scales twin).
        put(kd, ko::dequantize_page(to_oracle(fmt.k), shape, kp.data(), m, kscale));
        put(vd, ko::dequantize_page(to_oracle(fmt.v), shape, vp.data(), m, vscale));
        if (variant.head_scales) {
          put(kd0, ko::dequantize_page(to_oracle(fmt.k), shape, kp.data(), m, kscale[0]));
          put(vd0, ko::dequantize_page(to_oracle(fmt.v), shape, vp.data(), m, vscale[0]));
        }
        // Rotated-domain values (the bytes read as plain q4_0) for the bound of a rotated half.
        if (rot_k) put(ky, ko::dequantize_page(ko::Half::q4_0, shape, kp.data(), m, 1.0f));
        if (rot_v) put(vy, ko::dequantize_page(ko::Half::q4_0, shape, vp.data(), m, 1.0f));
      }
      const float* qs = q.data() + static_cast<std::size_t>(s) * Hq * D;
      ko::AttnShape as{1, Hq, n, H, D, n - 1, 0.0f};
      as.window = window;
      as.softcap = softcap;
      std::vector<double> ref(static_cast<std::size_t>(Hq) * D);
      ko::sdpa_f64(as, qs, kd.data(), vd.data(), ref.data());
      std::vector<float> mine(got.begin() + static_cast<std::ptrdiff_t>(s) * Hq * D,
                              got.begin() + static_cast<std::ptrdiff_t>(s + 1) * Hq * D);

      // Bound inputs.
      double max_l1 = 0, vmax = 0, q_rot_err = 0;
      for (int hq = 0; hq < Hq; ++hq) {
        const float* qv = qs + hq * D;
        std::vector<double> qr(qv, qv + D);
        double q2 = 0;
        for (double x : qr) q2 += x * x;
        if (rot_k) ko::hadamard_f64(qr.data(), D);
        for (int t = 0; t < n; ++t) {
          const std::size_t o = static_cast<std::size_t>(t) * HD + static_cast<std::size_t>(hq / dc.group) * D;
          double l1 = 0, l1r = 0, y2 = 0;
          for (int d = 0; d < D; ++d) {
            l1 += std::fabs(double(qv[d]) * kd[o + d]);
            if (rot_k) {
              l1r += std::fabs(qr[d] * ky[o + d]);
              y2 += double(ky[o + d]) * ky[o + d];
            }
          }
          max_l1 = std::max({max_l1, l1 * sc, l1r * sc});
          if (rot_k)
            q_rot_err = std::max(q_rot_err, sc * (std::log2(double(D)) + 2) * kU32 * std::sqrt(q2) * std::sqrt(y2));
        }
      }
      for (float x : (rot_v ? vy : vd)) vmax = std::max(vmax, double(std::fabs(x)));
      const int depth = gpu_dot_depth(plan.path, D);
      if (softcap > 0) max_l1 += (max_l1 + 3.0 * softcap) / depth;
      // attn_f32_max_abs with the query-rotation error folded into the score error (4*4 factor of
      // bounds.hpp: score error e moves the output by <= 4e vmax, x4 margin).
      // P is split hi + lo too on the tensor-core path (<= 2^-22 relative): 4 more terms of n.
      double bound = attn_f32_max_abs(depth - 2, n + 4, max_l1, vmax) + 16 * q_rot_err * vmax;
      std::vector<double> cmp_ref = ref, cmp_got(mine.begin(), mine.end());
      if (rot_v) {
        double o2 = 0;
        for (int hq = 0; hq < Hq; ++hq) {
          ko::hadamard_f64(cmp_ref.data() + hq * D, D);
          ko::hadamard_f64(cmp_got.data() + hq * D, D);
          double h2 = 0;
          for (int d = 0; d < D; ++d) h2 += ref[hq * D + d] * ref[hq * D + d];
          o2 = std::max(o2, h2);
        }
        bound += wht_slack(D, std::sqrt(o2));
      }
      double ref_sq = 0, err_sq = 0, err_max = 0;
      for (std::size_t i = 0; i < cmp_ref.size(); ++i) {
        ref_sq += cmp_ref[i] * cmp_ref[i];
        const double e = cmp_got[i] - cmp_ref[i];
        err_sq += e * e;
        err_max = std::max(err_max, std::fabs(e));
      }
      const double nmse = err_sq / ref_sq;
      const double nmse_bound = bound * bound * double(cmp_ref.size()) / ref_sq;
      INFO("sequence " << s << " (" << n << " tokens): nmse " << nmse << " (bound " << nmse_bound << "), max-abs "
                       << err_max << " (bound " << bound << ")" << (rot_v ? " [rotated domain]" : ""));
      CHECK(nmse <= nmse_bound);
      CHECK(err_max <= bound);
      // Anti-vacuity: the bound stays far below the output's RMS (a wrong page, head, scale or
      // offset is an O(1) error), and the store really quantized (lossy formats).
      const double rms = std::sqrt(ref_sq / double(cmp_ref.size()));
      INFO("bound / rms(ref) = " << bound / rms);
      CHECK(bound <= kOraSensitivity * rms);
      if (variant.head_scales && H > 1) {  // head 0's scale on every head: farther than the bound
        std::vector<double> alt(ref.size());
        ko::sdpa_f64(as, qs, kd0.data(), vd0.data(), alt.data());
        const double d = ko::max_abs_diff(alt, ref);
        INFO("head 0's scales on every head vs each head's own: " << d);
        ++head_seqs;
        if (d > 4 * bound) ++heads_visible;
      }
      if (window > 0 && window < n) {  // the window cuts: one key more is farther than the bound
        ko::AttnShape wider = as;
        wider.window = window + 1;
        std::vector<double> alt(ref.size());
        ko::sdpa_f64(wider, qs, kd.data(), vd.data(), alt.data());
        const double d = ko::max_abs_diff(alt, ref);
        // Counted, not required per case: the one extra key can carry a softmax weight too small to
        // move the output past 4 bounds (seen on the H200 for 2 of ~800 windowed sequences); the
        // gate requires that most windowed sequences could see an off-by-one window.
        INFO("window " << window << " vs " << window + 1 << ": " << d);
        ++windowed_seqs;
        if (d > 4 * bound) ++windows_cut;
      }
      if (softcap > 0 && n > 1 && window != 1) {  // the cap bends the scores: without it, farther than the bound
        ko::AttnShape uncapped = as;
        uncapped.softcap = 0;
        std::vector<double> alt(ref.size());
        ko::sdpa_f64(uncapped, qs, kd.data(), vd.data(), alt.data());
        const double d = ko::max_abs_diff(alt, ref);
        INFO("with vs without the soft-cap: " << d);
        ++cap_seqs;
        if (d > 4 * bound) ++cap_visible;
      }
      // With a one-key window the softmax weight is exactly 1 whatever K holds, so only a lossy V
      // can move the output.
      const bool k_matters = !(window == 1);
      if (n > 1 && ((k_matters && fmt.k != HalfFormat::f32) || fmt.v != HalfFormat::f32)) {
        std::vector<float> kf(kd.size()), vf(vd.size());
        std::copy_n(ks[static_cast<std::size_t>(s)].begin(), kf.size(), kf.begin());
        std::copy_n(vs[static_cast<std::size_t>(s)].begin(), vf.size(), vf.begin());
        std::vector<double> exact(ref.size());
        ko::sdpa_f64(as, qs, kf.data(), vf.data(), exact.data());
        double qerr = 0;
        for (std::size_t i = 0; i < exact.size(); ++i) qerr = std::max(qerr, std::fabs(exact[i] - ref[i]));
        CHECK(qerr > 0);
      }
    }
  }
  CHECK(cases >= (capped ? 16 : 24));
  {
    // The kernels the cases ran on (visible with -s): without a window, a pair with a pipelined
    // decode kernel (decode_pipelined_on_cuda: fast or tensor-core, at head_dim 64/128/256) must
    // have run cases on it (the 2026 halves' tensor-core path included), and every pair some on
    // the generic kernel (head_dim 8).
    std::ostringstream o;
    long pipelined = 0;
    for (const auto& [path, n] : path_cases) {
      o << " " << path << ":" << n;
      if (path != "generic") pipelined += n;
    }
    INFO("format " << fmt.name() << " decode paths:" << o.str());
    if (!windowed && decode_pipelined_on_cuda(fmt.k, fmt.v)) CHECK(pipelined >= 8);
    if (windowed || !decode_pipelined_on_cuda(fmt.k, fmt.v)) CHECK(pipelined == 0);
    CHECK(path_cases.count("generic") == 1);
  }
  if (variant.page_tiles_twin) {
    // 13 such cases in decode_cases at the time of writing (6 geometry cases with 16-token pages at
    // head_dim 64-256, 7 long cases); 8 leaves room for a changed list, not for an empty one.
    INFO("cases on a pipelined kernel with pages a page tile covers: " << tile_cases);
    CHECK(tile_cases >= 8);
  }
  if (slow_pool) {
    // Anti-vacuity: the case list (decode_cases) gives every format at least two sequences on a
    // pipelined kernel whose splits wrap the ring (2 or 3 per format on the H200; 4, the first
    // guess written before any device run, was never met).
    INFO("cases on a pipelined kernel whose splits wrap the stage ring: " << slow_pipelined);
    CHECK(slow_pipelined >= 2);
  }
  if (variant.head_scales) {
    // With an fp8 V, head 0's V scale rescales heads 1..H-1's outputs by 1.4-3x: visible in 90% of
    // the multi-head sequences or more. A K scale alone only changes those heads' softmax
    // temperature, which moves nothing where one key dominates or a window of one key is read:
    // counted, not a share (on an H100, k=fp8_e4m3,v=bf16: 56 of 80 sequences, 42 of 80 windowed).
    const bool v_scaled = fmt.v == HalfFormat::fp8_e4m3 || fmt.v == HalfFormat::fp8_e5m2;
    INFO("multi-head sequences " << head_seqs << ", head 0's scales visible in " << heads_visible);
    CHECK(heads_visible >= 16);
    if (v_scaled) CHECK(heads_visible * 10 >= head_seqs * 9);
  }
  if (capped) {
    INFO("soft-capped sequences " << cap_seqs << ", cap visible in " << cap_visible);
    CHECK(cap_visible >= 16);
    CHECK(cap_visible * 10 >= cap_seqs * 9);
  }
  if (windowed) {
    INFO("windowed sequences " << windowed_seqs << ", off-by-one visible in " << windows_cut);
    CHECK(windows_cut >= 16);
    CHECK(windows_cut * 10 >= windowed_seqs * 9);
  }
}

}  // namespace

// ---- test cases ------------------------------------------------------------------------------------

#define ORA_CUDA_STORE(half, seed)                                                                          \
  TEST_CASE("ORA.cuda.store." half " GPU page bytes == CPU page bytes == oracle page bytes",                \
            "[gate:ORA][fmt:" half "][cuda]") {                                                             \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                        \
    const auto f = parse_half(half);                                                                        \
    REQUIRE(f.has_value());                                                                                 \
    run_store_gate(*f, seed);                                                                               \
    run_store_special(*f);                                                                                  \
  }

#define ORA_CUDA_STORE_ROW(A, name, prefill_mma) ORA_CUDA_STORE(#name, 6100 + 100 * static_cast<int>(HalfFormat::name))
KVGATE_HALF_FORMATS(ORA_CUDA_STORE_ROW, _)  // one row per half format: kvgate/format_list.hpp

// Static fp8 scales per KV head (docs/FORMATS.md "Static scales per KV head"): the store kernel
// divides each element by its own head's scale.
TEST_CASE("ORA.cuda.store_head_scales fp8 halves with a scale per KV head: GPU page bytes == CPU == oracle",
          "[gate:ORA][fmt:fp8][fmt:fp8_e5m2][cuda]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  run_store_gate(HalfFormat::fp8_e4m3, 9500, true);
  run_store_gate(HalfFormat::fp8_e5m2, 9600, true);
}

#define ORA_CUDA_DECODE(id, fmtname, seed)                                                                  \
  TEST_CASE("ORA.cuda.decode." id " GPU decode attention == oracle FP64 attention over the same bytes",     \
            "[gate:ORA][fmt:" fmtname "][cuda]") {                                                          \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                        \
    const auto f = parse_kv_format(fmtname);                                                                \
    REQUIRE(f.has_value());                                                                                 \
    run_decode_gate(*f, seed);                                                                              \
  }                                                                                                         \
  TEST_CASE("ORA.cuda.decode_window." id " GPU sliding-window decode == oracle FP64 windowed SDPA",         \
            "[gate:ORA][fmt:" fmtname "][cuda]") {                                                          \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                        \
    const auto f = parse_kv_format(fmtname);                                                                \
    REQUIRE(f.has_value());                                                                                 \
    run_decode_gate(*f, seed + 50, {.windowed = true});                                                     \
  }                                                                                                         \
  TEST_CASE("ORA.cuda.decode_softcap." id " GPU soft-capped decode == oracle FP64 soft-capped SDPA",        \
            "[gate:ORA][fmt:" fmtname "][cuda]") {                                                          \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                        \
    const auto f = parse_kv_format(fmtname);                                                                \
    REQUIRE(f.has_value());                                                                                 \
    run_decode_gate(*f, seed + 70, {.capped = true});                                                       \
  }

// The twins of every format whose decode runs on a pipelined kernel (fast or tensor-core), seeds as
// its ORA.cuda.decode rows + 90 and + 95:
//  - slow pool (PAR.cuda.decode.slow_pool, built to catch a stage of WarpKvPipe read before its
//    cp.async.wait_group; the 2026 presets included: their tensor-core kernel stages codes and
//    scales with cp.async). The formats left out (the fp8_block128 pair) decode on the generic
//    kernel only, which makes no asynchronous copy: over the same bytes it gives the same bits from
//    any memory, so a twin would be a gate no bug can turn red. STO.cuda.slow_pool_twins checks this
//    list against the kernels' own choice (supports_op's path), so a format moving between kernels
//    cannot leave the list stale;
//  - page tiles (PAR.cuda.decode.page_tiles): the pipelined kernels are the ones with page tiles.
#define PAR_CUDA_DECODE_TWINS(id, fmtname, seed)                                                            \
  TEST_CASE("PAR.cuda.decode.slow_pool." id " GPU decode over pages in mapped host memory == over device pages, bit for bit", \
            "[gate:PAR][fmt:" fmtname "][cuda]") {                                                          \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                        \
    const auto f = parse_kv_format(fmtname);                                                                \
    REQUIRE(f.has_value());                                                                                 \
    run_decode_gate(*f, seed + 90, {.slow_pool = true});                                                    \
  }                                                                                                         \
  TEST_CASE("PAR.cuda.decode.page_tiles." id " GPU decode with page tiles == with token lookups, bit for bit", \
            "[gate:PAR][fmt:" fmtname "][cuda]") {                                                          \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                        \
    const auto f = parse_kv_format(fmtname);                                                                \
    REQUIRE(f.has_value());                                                                                 \
    run_decode_gate(*f, seed + 95, {.page_tiles_twin = true});                                              \
  }

// The mixed pairs of the ORA.cuda.decode rows (beside one row per preset): those on a pipelined
// kernel, then the fp8_ds_mla pair (generic kernel).
#define CUDA_DECODE_MIXED_PIPELINED(X)              \
  X("mixed.q8_0-fp8_e5m2", "k=q8_0,v=fp8_e5m2", 8000) \
  X("mixed.q4_0_rot-bf16", "k=q4_0_rot,v=bf16", 8100) \
  X("mixed.fp8-q4_0", "k=fp8_e4m3,v=q4_0", 8200)      \
  X("mixed.f16-int8", "k=f16,v=int8", 8300)           \
  X("mixed.f32-q4_0_rot", "k=f32,v=q4_0_rot", 8400)   \
  X("mixed.int8-f32", "k=int8,v=f32", 8500)           \
  X("mixed.bf16-fp8", "k=bf16,v=fp8_e4m3", 8600)
#define CUDA_DECODE_MIXED_PAIRS(X) \
  CUDA_DECODE_MIXED_PIPELINED(X)   \
  X("mixed.fp8_block128-bf16", "k=fp8_block128,v=bf16", 8700)

// The formats of the twins (PAR.cuda.decode.slow_pool, .page_tiles): the presets and mixed pairs
// above whose decode is pipelined (seeds as their ORA.cuda.decode rows: 7000 + 100 x the slot).
#define PAR_CUDA_DECODE_TWINS_PRESET(name, slot) PAR_CUDA_DECODE_TWINS(#name, #name, 7000 + 100 * slot)
// f32 decodes on the fast kernel; the 2026 presets on the tensor-core kernel.
#define CUDA_DECODE_SLOW_POOL_PRESETS(X) \
  X(f32, 1) KVGATE_CUDA_PIPELINED_PRESETS(X) KVGATE_CUDA_DECODE_MMA_2026_PRESETS(X)

// Static fp8 scales per KV head (docs/FORMATS.md "Static scales per KV head"), one row per kernel that
// reads them: the tensor-core kernel (both halves fp8; the generic one at head_dim 8), the CUDA-core
// fast kernel with a per-head K (query multiplier) and with a per-head V (the combine's output
// scale), and the generic kernel (the windowed twin).
#define ORA_CUDA_DECODE_HEAD_SCALES(id, fmtname, seed)                                                      \
  TEST_CASE("ORA.cuda.decode_head_scales." id " GPU decode, fp8 scales per KV head == oracle FP64 SDPA",     \
            "[gate:ORA][fmt:" fmtname "][cuda]") {                                                          \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                        \
    const auto f = parse_kv_format(fmtname);                                                                \
    REQUIRE(f.has_value());                                                                                 \
    run_decode_gate(*f, seed, {.head_scales = true});                                                       \
  }                                                                                                         \
  TEST_CASE("ORA.cuda.decode_window_head_scales." id " GPU sliding-window decode, fp8 scales per KV head "  \
            "== oracle FP64 windowed SDPA",                                                                 \
            "[gate:ORA][fmt:" fmtname "][cuda]") {                                                          \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                        \
    const auto f = parse_kv_format(fmtname);                                                                \
    REQUIRE(f.has_value());                                                                                 \
    run_decode_gate(*f, seed + 50, {.windowed = true, .head_scales = true});                                \
  }

#define ORA_CUDA_DECODE_ROW(A, name, k, v, slot, kind) ORA_CUDA_DECODE(#name, #name, (7000 + 100 * slot))
KVGATE_PRESETS(ORA_CUDA_DECODE_ROW, _)  // one row per preset: kvgate/format_list.hpp
CUDA_DECODE_MIXED_PAIRS(ORA_CUDA_DECODE)
CUDA_DECODE_SLOW_POOL_PRESETS(PAR_CUDA_DECODE_TWINS_PRESET)
CUDA_DECODE_MIXED_PIPELINED(PAR_CUDA_DECODE_TWINS)
CUDA_HEAD_SCALE_PAIRS(ORA_CUDA_DECODE_HEAD_SCALES)

TEST_CASE("STO.cuda.slow_pool_twins the decode slow-pool twins are exactly the formats whose decode kernel is pipelined",
          "[gate:STO][cuda]") {
  // No device needed: supports_op's path at head_dim 128 (the decode cases' most common; the twins'
  // own anti-vacuity counts their cases on a pipelined kernel). A pipelined kernel ("fast(...)",
  // "mma(...)") copies pages with cp.async and has a twin; "generic" has none.
  std::set<std::string> twins, all;
  CUDA_DECODE_SLOW_POOL_PRESETS(CUDA_TWIN_PRESET)
  CUDA_DECODE_MIXED_PIPELINED(CUDA_TWIN_ROW)
  CUDA_DECODE_MIXED_PAIRS(CUDA_ORA_ROW)
  KVGATE_PRESETS(CUDA_ORA_PRESET, _)
  // 22 twins (16, and the 6 presets of the 2026 halves on the tensor-core kernel); 1 format decodes
  // generically (the fp8_block128 pair).
  cuda_gate::check_twin_list(
      twins, all,
      [](const KvFormat& f, std::string& why) {
        const kc::OpSupport s = kc::supports_op(kc::Op::decode, f, {16, 8, 128}, 32);
        REQUIRE(s.ok);
        why = "path '" + s.path + "'";
        return s.path != "generic";
      },
      22, 1);
}

TEST_CASE("STO.cuda.capability supports_op refuses with stable reasons and names the kernel path",
          "[gate:STO][cuda]") {
  const KvFormat i8{HalfFormat::int8, HalfFormat::int8};
  const KvFormat k8v4{HalfFormat::int8, HalfFormat::q4_0_rot};
  const KvFormat q8{HalfFormat::q8_0, HalfFormat::q8_0};
  auto check = [](const kc::OpSupport& s, const char* reason) {
    INFO("got reason '" << s.reason << "' detail '" << s.detail << "'");
    CHECK_FALSE(s.ok);
    CHECK(s.reason == reason);
    CHECK_FALSE(s.detail.empty());
  };
  check(kc::supports_op(kc::Op::decode, k8v4, {16, 8, 96}, 32), "head_dim_not_power_of_two");
  check(kc::supports_op(kc::Op::store, q8, {16, 1, 8}, 0), "row_not_multiple_of_32");
  check(kc::supports_op(kc::Op::decode, i8, {16, 4, 64}, 6), "gqa_ratio_invalid");
  check(kc::supports_op(kc::Op::decode, i8, {16, 1, 512}, 8), "head_dim_unsupported");
  check(kc::supports_op(kc::Op::store, i8, {16, 256, 256}, 0), "row_too_large");
  const kc::DeviceStatus& dev = kc::device_status();
  if (dev.available && dev.cc_major < 9) {
    check(kc::supports_op(kc::Op::decode, i8, {16, 8, 128}, 32), "arch_unsupported");
    return;
  }
  CHECK(kc::supports_op(kc::Op::decode, i8, {16, 8, 128}, 32).path == "mma(D=128)");
  CHECK(kc::supports_op(kc::Op::decode, k8v4, {16, 8, 64}, 8).path == "mma(D=64)");
  CHECK(kc::supports_op(kc::Op::decode, KvFormat{HalfFormat::bf16, HalfFormat::bf16}, {16, 8, 128}, 32).path ==
        "fast(D=128)");
  CHECK(kc::supports_op(kc::Op::decode, KvFormat{HalfFormat::f16, HalfFormat::int8}, {16, 8, 256}, 32).path ==
        "fast(D=256)");
  CHECK(kc::supports_op(kc::Op::decode, KvFormat{HalfFormat::f32, HalfFormat::int8}, {16, 8, 128}, 32).path ==
        "fast(D=128)");
  // The 2026 halves: tensor cores with themselves (and mxfp8 K with mxfp4 V), generic beside another half.
  const KvFormat mx8{HalfFormat::mxfp8, HalfFormat::mxfp8}, mx84{HalfFormat::mxfp8, HalfFormat::mxfp4};
  CHECK(kc::supports_op(kc::Op::decode, mx8, {16, 8, 128}, 32).path == "mma(D=128)");
  CHECK(kc::supports_op(kc::Op::decode, mx84, {16, 8, 64}, 8).path == "mma(D=64)");
  CHECK(kc::supports_op(kc::Op::decode, KvFormat{HalfFormat::nvfp4, HalfFormat::nvfp4}, {16, 2, 256}, 8).path ==
        "mma(D=256)");
  CHECK(kc::supports_op(kc::Op::decode, KvFormat{HalfFormat::int8_per_token_head, HalfFormat::int8_per_token_head},
                        {16, 8, 128}, 32)
            .path == "mma(D=128)");
  CHECK(kc::supports_op(kc::Op::decode, KvFormat{HalfFormat::mxfp4, HalfFormat::mxfp8}, {16, 8, 128}, 32).path ==
        "generic");
  CHECK(kc::supports_op(kc::Op::decode, KvFormat{HalfFormat::mxfp8, HalfFormat::int8}, {16, 8, 128}, 32).path ==
        "generic");
  CHECK(kc::supports_op(kc::Op::decode, mx8, {16, 4, 8}, 8).path == "generic");
  CHECK(kc::supports_op(kc::Op::decode, k8v4, {16, 4, 8}, 8).path == "generic");
  CHECK(kc::supports_op(kc::Op::decode, i8, {16, 8, 96}, 8).path == "generic");
  CHECK(kc::supports_op(kc::Op::store, q8, {16, 8, 128}, 0).ok);
  // Every pair of half formats is accepted where the geometry allows it; a pair without a pipelined
  // kernel (decode_pipelined_on_cuda) decodes on the generic kernel (STO.cuda.generic_formats), a
  // pair of 2026 halves with one on the tensor cores.
  long accepted = 0, generic = 0;
  for (HalfFormat kf : all_half_formats())
    for (HalfFormat vf : all_half_formats()) {
      INFO((KvFormat{kf, vf}.name()));
      const kc::OpSupport s = kc::supports_op(kc::Op::decode, KvFormat{kf, vf}, {16, 8, 128}, 32);
      CHECK(s.ok);
      accepted += s.ok;
      if (!decode_pipelined_on_cuda(kf, vf)) {
        CHECK(s.path == "generic");
        generic += s.path == "generic";
      } else if (generic_only_on_cuda(kf) || generic_only_on_cuda(vf)) {
        CHECK(s.path == "mma(D=128)");
      } else {
        CHECK(s.path != "generic");
      }
    }
  CHECK(accepted == 225);  // anti-vacuity: the 15 half formats, every pair
  // The 81 pairs of the nine fast formats run fast or mma at D = 128, and 6 pairs of 2026 halves
  // (5 halves with themselves, mxfp8 K with mxfp4 V) mma.
  CHECK(generic == 225 - 81 - 6);
  if (!dev.available) WARN("device checks of STO.cuda.capability SKIPPED: " << dev.reason);
}

TEST_CASE("STO.cuda.generic_formats MX, NVFP4 and per-token-head halves are stored, decoded generically beside older halves, kept by the resolver",
          "[gate:STO][cuda][fmt:mxfp8][fmt:mxfp4][fmt:nvfp4][fmt:fp8_per_token_head][fmt:int8_per_token_head]") {
  // No device needed: the capability switch and the resolver. Their kernels are the generic decode
  // kernel and the CUDA-core prefill kernel, both reading through load_elem (decode.cuh), and for a
  // half with itself (fp8_block128 excepted) the tensor-core decode kernel at head_dim 64/128/256
  // (decode_mma.cuh); the ORA.cuda rows of these presets check their bytes and attention on a device.
  long generic_halves = 0;
  for (HalfFormat h : all_half_formats()) {
    if (!generic_only_on_cuda(h)) continue;
    ++generic_halves;
    // Alone and paired with a fast-path format on either side.
    for (const KvFormat f : {KvFormat{h, h}, KvFormat{h, HalfFormat::int8}, KvFormat{HalfFormat::bf16, h}}) {
      for (int d : {64, 128, 256}) {
        const PageGeometry g{16, 2, d};
        INFO(f.name() << " D=" << d);
        const kc::OpSupport st = kc::supports_op(kc::Op::store, f, g);
        const kc::OpSupport de = kc::supports_op(kc::Op::decode, f, g, 8);
        const kc::OpSupport pr = kc::supports_op(kc::Op::prefill, f, g, 8);
        CHECK(st.ok);
        CHECK(de.ok);
        const bool mma = f.k == f.v && h != HalfFormat::fp8_block128;
        CHECK(de.path == (mma ? "mma(D=" + std::to_string(d) + ")" : std::string("generic")));
        CHECK(pr.ok);
        CHECK(pr.path == "prefill(fp32)");
        CHECK_FALSE(kc::prefill_mma_applies(f, g));
      }
    }
    // The resolver on backend cuda keeps the format as asked (strict: no error; no fallback).
    kc::register_capability();
    ModelConfig c;
    c.n_kv_heads = 2;
    c.n_heads = 8;
    c.head_dim = 64;
    c.dim = 8 * 64;
    KvRequest r;
    r.flag = KvFormat{h, h};
    r.strict = true;
    r.backend = "cuda";
    const ResolvedKv got = resolve_kv(r, c, 16);
    INFO(name(h) << ": effective " << got.effective.name() << ", fallback '" << got.fallback_reason << "'");
    CHECK(got.effective == (KvFormat{h, h}));
    CHECK(got.fallback_reason.empty());
    register_backend_capability("cuda", nullptr);
  }
  CHECK(generic_halves == 6);  // mxfp8, mxfp4, nvfp4, fp8_per_token_head, int8_per_token_head, fp8_block128
}

TEST_CASE("STO.cuda.resolve resolve_kv on backend cuda refuses what the CUDA ops cannot run, with their reason",
          "[gate:STO][cuda]") {
  kc::register_capability();
  auto cfg = [](int kv_heads, int head_dim) {
    ModelConfig c;
    c.n_kv_heads = kv_heads;
    c.n_heads = kv_heads * 4;
    c.head_dim = head_dim;
    c.dim = c.n_heads * head_dim;
    return c;
  };
  auto req = [](const char* f, bool strict) {
    KvRequest r;
    r.flag = parse_kv_format(f);
    r.strict = strict;
    r.backend = "cuda";
    return r;
  };
  // Supported: kept as requested on cuda (the hook is consulted and says yes).
  const ResolvedKv ok = resolve_kv(req("k8v4", true), cfg(8, 128), 16);
  CHECK(ok.backend == "cuda");
  CHECK(ok.effective == *parse_kv_format("k8v4"));
  CHECK_FALSE(ok.fell_back());
  // head_dim 512: no CUDA decode kernel for any half -> a clear error naming the reason.
  std::string msg;
  try {
    resolve_kv(req("int8", false), cfg(2, 512), 16);
  } catch (const KvResolveError& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("head_dim_unsupported") != std::string::npos);
  CHECK(msg.find("backend 'cuda'") != std::string::npos);
  // A token row over the store kernel's shared memory (256 KV heads x 256 dims) -> row_too_large.
  msg.clear();
  try {
    resolve_kv(req("int8", false), cfg(256, 256), 16);
  } catch (const KvResolveError& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("row_too_large") != std::string::npos);
  // Anti-vacuity: the CPU backend takes both geometries (the refusals are the CUDA hook's).
  KvRequest cpu = req("int8", true);
  cpu.backend = "cpu";
  CHECK_FALSE(resolve_kv(cpu, cfg(2, 512), 16).fell_back());
  CHECK_FALSE(resolve_kv(cpu, cfg(256, 256), 16).fell_back());
  register_backend_capability("cuda", nullptr);
}

TEST_CASE("STO.cuda.head_scales per-KV-head scales: fp8 halves run them, an nvfp4 half's are refused by name (no "
          "device needed); a half that reads no scale ignores its list",
          "[gate:STO][fmt:fp8][fmt:nvfp4]") {
  // The fp8 kernels take a layer's per-head table (ORA.cuda.store_head_scales and the
  // ORA.cuda.*_head_scales rows check their arithmetic on a device). nvfp4's FP32 global scale is one
  // per (layer, K|V), as on the CPU store: a table whose heads differ must be refused with reason
  // "per_head_scales_unsupported" before any device memory is touched, never run with one head's scale.
  StoreConfig c;
  c.format = {HalfFormat::fp8_e4m3, HalfFormat::fp8_e5m2};
  c.n_layers = 2;
  c.n_kv_heads = 4;
  c.head_dim = 64;
  c.block_size = 16;
  c.n_blocks = 4;
  c.k_scale = {0.5f, 0.5f, 0.5f, 0.5f, 0.25f, 0.25f, 0.25f, 0.25f};  // per head, but every head agrees
  c.v_scale = {0.1f, 0.2f, 0.3f, 0.4f, 0.1f, 0.1f, 0.1f, 0.1f};      // layer 0's heads differ
  for (kc::Op op : {kc::Op::store, kc::Op::decode, kc::Op::prefill}) {
    const kc::OpSupport s = kc::supports_op(op, c, 8);
    INFO("fp8 with per-head V scales: reason '" << s.reason << "' detail '" << s.detail << "'");
    CHECK(s.ok);
  }
  StoreConfig nv = c;
  nv.format = {HalfFormat::fp8_e4m3, HalfFormat::nvfp4};
  const kc::OpSupport s = kc::supports_op(kc::Op::store, nv);
  INFO("nvfp4 V with per-head scales: reason '" << s.reason << "' detail '" << s.detail << "'");
  CHECK_FALSE(s.ok);
  CHECK(s.reason == "per_head_scales_unsupported");
  CHECK_THAT(s.detail, kvgate_catch::contains("V half"));
  CHECK_THAT(s.detail, kvgate_catch::contains("layer 0"));
  CHECK_FALSE(kc::supports_op(kc::Op::decode, nv, 8).ok);
  CHECK_FALSE(kc::supports_op(kc::Op::prefill, nv, 8).ok);
  std::string msg;
  try {
    kc::CudaKvStore st(nv);
  } catch (const KvStoreError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, kvgate_catch::contains("per_head_scales_unsupported"));
  // The ops refuse a per-head table for an nvfp4 half too (checked before any launch; the pointer is
  // never read).
  const float fake = 1.0f;
  kc::StoreRowsArgs a;
  a.n_tokens = 1;
  a.head_scales = &fake;
  msg.clear();
  try {
    kc::store_rows(HalfFormat::nvfp4, nv.geometry(), a);
  } catch (const std::invalid_argument& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, kvgate_catch::contains("per_head_scales_unsupported"));
  // Anti-vacuity: nvfp4 heads that agree pass; a V half that reads no scale (int8) ignores its list;
  // the CUDA store keeps the table per head (what its kernels read), as the CPU store does.
  StoreConfig agree = nv;
  agree.v_scale = {0.1f, 0.1f, 0.1f, 0.1f, 0.2f, 0.2f, 0.2f, 0.2f};
  CHECK(kc::supports_op(kc::Op::store, agree).ok);
  StoreConfig int8_v = nv;
  int8_v.format.v = HalfFormat::int8;
  CHECK(kc::supports_op(kc::Op::store, int8_v).ok);
}
