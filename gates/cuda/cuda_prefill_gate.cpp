// GPU prefill attention gates (docs/CUDA.md): [gate:ORA][cuda][prefill].
//
//  ORA.cuda.prefill.<fmt>  GPU causal prefill attention (kernels/prefill.cuh) of a chunk of n_new
//                          query tokens at positions [n_past, n_past + n_new) vs the oracle's FP64
//                          causal SDPA over the oracle's dequantization of the GPU's own page bytes:
//                          NaN/Inf first (outputs poisoned with NaN), then NMSE and max-abs under the
//                          derived FP32 bound (bounds.hpp attn_f32_max_abs with this kernel's summation
//                          depths). Chunks with and without a prefix, n_new 1..300, pages 1/3/7/16,
//                          GQA groups 1/2/3/4/8/16, head_dim 8/64/96/128/256, pages of the sequence
//                          interleaved with decoy pages, and "future" rows past the chunk.
//
//  ORA.cuda.prefill_softcap.<fmt>  the same with Gemma 2's attention-logit soft-cap (every other case
//                          windowed) against the oracle's soft-capped SDPA.
//  PAR.cuda.prefill.slow_pool.<fmt>  the same prefill over a copy of the pages in page-locked host
//                          memory mapped into the device (every cp.async of a K/V tile then takes
//                          PCIe's microseconds instead of HBM's ~0.5 us) == the prefill over the device
//                          pages, bit for bit: a tile read before its copies landed (a missing
//                          cp.async.wait_group) reads the stage's previous bytes there. Only the
//                          formats on the tensor-core kernel have one; the CUDA-core kernel makes no
//                          asynchronous copy (STO.cuda.prefill.slow_pool_twins checks the list).
//  STO.cuda.prefill_mma.racecheck  (opt-in, run by name) compute-sanitizer racecheck over
//                          tensor-core prefills of every tile shape reports 0 shared-memory hazards
//                          (the run re-executes this program under the sanitizer on a hidden probe).
//
// Anti-vacuity per case: the outputs vary across query tokens by far more than the bound; an oracle
// whose causal window is one key too wide (query i sees n_past + i + 1 keys) exceeds the bound; the
// bound stays below kOraSensitivity of the output's RMS; a lossy format really changed the result
// (attention over the unquantized rows differs).
//
// Without a device every case prints "SKIPPED: no CUDA device: <reason>" and passes.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "bounds.hpp"
#include "catch_compat.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate/kv_store.hpp"
#include "kvgate_oracle/attention.hpp"
#include "kvgate_oracle/formats.hpp"
#include "kvgate_oracle/metrics.hpp"
#include "cuda_gate_common.hpp"
#include "head_scales.hpp"
#include "store_harness.hpp"
#include "kvgate/numeric.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace ko = kvgate_oracle;
namespace kc = kvgate::cuda;

namespace {

using cuda_gate::DevFloats;
using cuda_gate::MappedPages;
using cuda_gate::oracle_half;
using cuda_gate::generic_only_on_cuda;


struct PrefillCase {
  int block_size, n_kv_heads, head_dim, group;
  int n_past, n_new;  // chunk at positions [n_past, n_past + n_new)
  int n_future;       // rows written past the chunk (must stay invisible)
  std::uint64_t seed;
  std::string describe() const {
    return "block_size=" + std::to_string(block_size) + " kv_heads=" + std::to_string(n_kv_heads) +
           " head_dim=" + std::to_string(head_dim) + " gqa_group=" + std::to_string(group) +
           " n_past=" + std::to_string(n_past) + " n_new=" + std::to_string(n_new) +
           " n_future=" + std::to_string(n_future) + " seed=" + std::to_string(seed);
  }
};

std::vector<PrefillCase> prefill_cases(std::uint64_t s) {
  // {B, H, D, group, n_past, n_new, n_future}
  const int c[][7] = {
      {1, 4, 8, 2, 0, 37, 0},      // D < 32: 32-blocks span heads; one token per page
      {3, 4, 8, 4, 50, 19, 4},     // prefix, ragged pages, future rows
      {16, 1, 64, 1, 0, 130, 0},   // MHA: 64-token query tiles, three of them
      {3, 2, 64, 8, 21, 70, 3},    // group 8: 8 tokens x 8 heads per CTA
      {16, 2, 64, 4, 200, 1, 5},   // a one-token chunk (decode-like) after a long prefix
      {7, 2, 64, 3, 10, 50, 0},    // group 3: 21 tokens x 3 heads per CTA
      {16, 1, 64, 16, 40, 30, 2},  // group 16: two head chunks
      {1, 2, 128, 2, 5, 45, 0},
      {16, 4, 128, 4, 0, 300, 0},  // long chunk from position 0: 19 query tiles, causal skipping
      {3, 4, 128, 1, 100, 77, 6},
      {7, 2, 96, 2, 13, 40, 1},    // head_dim not a power of two (q4_0_rot refuses it: skipped)
      {16, 2, 256, 2, 33, 64, 0},
      {1, 1, 256, 8, 0, 20, 0},
      {3, 2, 128, 4, 300, 9, 2},   // short chunk after a long prefix
      // Tensor-core kernel (64-key tiles; 32 at D = 256): chunks starting mid-page, contexts not a
      // multiple of the tile, the causal diagonal inside a tile, GQA 1/4/8, head_dim 64/128/256.
      {16, 2, 128, 4, 37, 100, 3},  // mid-page start, 137 keys: 2 full tiles + a partial one
      {16, 1, 256, 1, 70, 33, 0},   // D = 256 (32-key tiles), MHA, mid-page start
      {16, 2, 64, 8, 0, 64, 1},     // exactly one tile: the diagonal crosses it
      {16, 8, 128, 4, 555, 1, 0},   // decode-like chunk (n_new = 1), Llama-3-8B head shape
      {16, 2, 128, 8, 611, 150, 2}, // long prefix: 12 tiles, online-softmax rescales, GQA 8
  };
  std::vector<PrefillCase> out;
  std::uint64_t i = 0;
  for (const auto& x : c) out.push_back({x[0], x[1], x[2], x[3], x[4], x[5], x[6], s + i++});
  return out;
}

// ---- tensor-core kernel (path "prefill(mma,D=...)"): its declared operands, reproduced exactly ----
bool bf16_operand(HalfFormat h) { return h == HalfFormat::bf16; }
float round_operand(HalfFormat h, float x) {
  return bf16_operand(h) ? bf16_to_f32(f32_to_bf16_rne(x)) : f16_to_f32(f32_to_f16_rne(x));
}
// Relative rounding of a stored element into the operand type: 0 where the stored value is the operand.
double operand_u(HalfFormat h) {
  return (h == HalfFormat::f16 || h == HalfFormat::bf16 || h == HalfFormat::fp8_e4m3 || h == HalfFormat::fp8_e5m2)
             ? 0.0
             : kF16OperandU;
}
// One half's operand values of n tokens of a page: fp8 codes without the tensor scale (folded into
// q_mul / the epilogue), q4_0_rot in the rotated domain, the rest dequantized; then RNE to the operand.
std::vector<float> operand_values(HalfFormat h, const ko::PageShape& shape, const std::uint8_t* page, int n) {
  const ko::Half oh = h == HalfFormat::q4_0_rot ? ko::Half::q4_0 : oracle_half(h);
  std::vector<float> x = ko::dequantize_page(oh, shape, page, n, 1.0f);
  for (float& e : x) e = round_operand(h, e);
  return x;
}
// The kernel's query operand: binary32 q * q_mul (q_mul as prefill_mma.cu computes it), the
// binary32 Walsh-Hadamard of prefill_fwht_rows (same butterfly order, then x had_c) for a rotated
// K, then one RNE to the K operand type.
// k_scales: the K scale of each KV head (query head hq reads KV head hq / group; q is [n][Hq][D]).
std::vector<float> query_operands(const KvFormat& fmt, const std::vector<float>& q, int D, int Hq, int group,
                                  const std::vector<float>& k_scales) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const bool fp8k = fmt.k == HalfFormat::fp8_e4m3 || fmt.k == HalfFormat::fp8_e5m2;
  const float had_c = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  std::vector<float> out(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) {
    const std::size_t kvh = (i / static_cast<std::size_t>(D)) % static_cast<std::size_t>(Hq) / static_cast<std::size_t>(group);
    const float q_mul = static_cast<float>(static_cast<double>(scale) * 1.4426950408889634 * (fp8k ? k_scales[kvh] : 1.0f));
    out[i] = q[i] * q_mul;
  }
  if (fmt.k == HalfFormat::q4_0_rot)
    for (std::size_t r = 0; r < q.size() / D; ++r) {
      float* x = out.data() + r * D;
      for (int len = 1; len < D; len <<= 1)
        for (int k = 0; k < D / 2; ++k) {
          const int i = (k / len) * 2 * len + (k % len);
          const float a = x[i], b = x[i + len];
          x[i] = a + b;
          x[i + len] = a - b;
        }
      for (int d = 0; d < D; ++d) x[d] *= had_c;
    }
  for (float& e : out) e = round_operand(fmt.k, e);
  return out;
}
// FP64 causal attention over the operands in base-2 score units (score = ln 2 * q~.k~): o and
// b = sum_j w_j |v_jd| per output element, the max L1 score (natural units) over visible keys.
// extra = 1: the window one key too wide (anti-vacuity).
struct OperandRef {
  std::vector<double> o, b;
  double max_l1 = 0;
};
// softcap > 0: the natural-unit score s becomes softcap * tanh(s / softcap) (before the mask).
OperandRef operand_attention(const std::vector<float>& qo, const std::vector<float>& ko_, const std::vector<float>& vo,
                             int n_new, int Hq, int H, int D, int n_past, int n_ctx, int extra, double softcap) {
  OperandRef R;
  R.o.assign(static_cast<std::size_t>(n_new) * Hq * D, 0.0);
  R.b.assign(R.o.size(), 0.0);
  const int group = Hq / H;
  const double ln2 = std::log(2.0);
  std::vector<double> s(static_cast<std::size_t>(n_ctx));
  for (int i = 0; i < n_new; ++i)
    for (int hq = 0; hq < Hq; ++hq) {
      const float* qv = qo.data() + (static_cast<std::size_t>(i) * Hq + hq) * D;
      const int last = std::min(n_ctx - 1, n_past + i + extra);
      double m = -INFINITY;
      for (int t = 0; t <= last; ++t) {
        const float* kv = ko_.data() + (static_cast<std::size_t>(t) * H + hq / group) * D;
        double dot = 0, l1 = 0;
        for (int d = 0; d < D; ++d) {
          dot += double(qv[d]) * kv[d];
          l1 += std::fabs(double(qv[d]) * kv[d]);
        }
        s[static_cast<std::size_t>(t)] = softcap > 0 ? softcap * std::tanh(ln2 * dot / softcap) : ln2 * dot;
        R.max_l1 = std::max(R.max_l1, ln2 * l1);
        m = std::max(m, s[static_cast<std::size_t>(t)]);
      }
      double l = 0;
      for (int t = 0; t <= last; ++t) l += std::exp(s[static_cast<std::size_t>(t)] - m);
      double* o = R.o.data() + (static_cast<std::size_t>(i) * Hq + hq) * D;
      double* b = R.b.data() + (static_cast<std::size_t>(i) * Hq + hq) * D;
      for (int t = 0; t <= last; ++t) {
        const double w = std::exp(s[static_cast<std::size_t>(t)] - m) / l;
        const float* vv = vo.data() + (static_cast<std::size_t>(t) * H + hq / group) * D;
        for (int d = 0; d < D; ++d) {
          o[d] += w * vv[d];
          b[d] += w * std::fabs(double(vv[d]));
        }
      }
    }
  return R;
}

// Per-row error statistics of one comparison.
struct Cmp {
  double nmse = 0, err_max = 0, ref_rms = 0;
};
Cmp compare(const std::vector<double>& ref, const std::vector<double>& got) {
  double ref_sq = 0, err_sq = 0, err_max = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ref_sq += ref[i] * ref[i];
    const double e = got[i] - ref[i];
    err_sq += e * e;
    err_max = std::max(err_max, std::fabs(e));
  }
  return {err_sq / ref_sq, err_max, std::sqrt(ref_sq / double(ref.size()))};
}

// Bound of one case (bounds.hpp attn_f32_max_abs with THIS kernel's summation depths):
//  - a score is one sequential FP32 FMA chain over the D products of the pre-scaled query (one
//    rounding: q * softmax_scale * log2(e) [* fp8 K scale]) and the dequantized key (code x scale,
//    exact in binary32: <= 8-bit code x f16 scale), so |error| <= gamma_{D+1} * L1 <= (D + 2) u L1:
//    attn_f32_max_abs(head_dim = D) (its own "+2");
//  - O is one sequential FMA chain over the n_ctx visible keys, rescaled by the online-softmax
//    correction once per 32-key tile, l likewise (a 32-term tree per tile + the running sum), then
//    one division and the fp8 V-scale product: n_ctx + ceil(n_ctx / 32) + 4 terms in place of n_ctx;
//  - rotated halves exactly as ORA.cuda.decode (the kernel rotates q and the output like decode):
//    the query's binary32 rotation adds sc (log2 D + 2) u |q|_2 |y|_2 to the score error, and a
//    rotated V is compared in the rotated domain with vmax over the rotated values, plus
//    wht_slack(D, |o|_2) for the output's binary32 rotation.
// Windows of the windowed twin (ORA.cuda.prefill_window): page boundaries +-1, a 32-key tile
// boundary +1, a prime, and one key.
int case_window(int i, int block_size) {
  const int w[] = {block_size - 1, block_size, block_size + 1, 33, 17, 1};
  return std::max(1, w[i % 6]);
}

// Soft-capped twin (ORA.cuda.prefill_softcap, Gemma 2's attn_logit_softcapping): cap = 3 x the
// query scale; every other case runs a sliding window (the CUDA-core kernel, as Gemma 2's local
// layers), the others the kernel supports_op names (tensor cores where they apply). Contexts over
// 400 keys are left out (under the cap the softmax flattens and the output's RMS falls towards the
// worst-case bound). Softcap rounding (division, tanhf <= 2 ulp, multiply; tanh' <= 1): u |s| +
// 3u cap per score, counted as an L1 increase of (|s| + 3 cap) / depth in the depth x u x L1 of
// attn_f32_max_abs (depth D + 2 on the CUDA cores, D/4 + 10 on the tensor cores).
// Per-head-scale twin (ORA.cuda.prefill_head_scales, docs/FORMATS.md "Static scales per KV head"): the
// store's fp8 scales differ per KV head (gate_head_scales), the oracle and the tensor-core reference
// take each head's own; same bounds. Anti-vacuity: the reference made with head 0's scales on every
// head is farther than 4 x kOraSensitivity x rms from the one judged in 4 multi-head cases or more,
// and (an fp8 V) in 90% of them.
struct PrefillVariant {
  bool windowed = false, capped = false, slow_pool = false, head_scales = false;
};
void run_prefill_gate(const KvFormat& fmt, std::uint64_t seed0, PrefillVariant variant = {}) {
  const bool windowed = variant.windowed, capped = variant.capped, slow_pool = variant.slow_pool;
  long cases = 0, windows_cut = 0, cap_cases = 0, cap_visible = 0, slow_mma = 0, slow_multi_tile = 0;
  long head_cases = 0, heads_visible = 0;
  int case_index = 0;
  for (const PrefillCase& pc : prefill_cases(seed0)) {
    if (capped && pc.n_past + pc.n_new > 400) continue;
    const int ci = case_index++;
    const int window = windowed || (capped && ci % 2 == 1) ? case_window(ci, pc.block_size) : 0;
    INFO("window " << window);
    const PageGeometry g{pc.block_size, pc.n_kv_heads, pc.head_dim};
    if (!supports(fmt.k, g).ok || !supports(fmt.v, g).ok) {
      WARN("format " << fmt.name() << " case " << pc.describe() << ": geometry refused by the format, skipped");
      continue;
    }
    const int H = pc.n_kv_heads, D = pc.head_dim, Hq = H * pc.group, HD = H * D;
    const int n_ctx = pc.n_past + pc.n_new, n_all = n_ctx + pc.n_future;
    INFO("format " << fmt.name() << " case " << pc.describe());
    const auto sup = kc::supports_op(kc::Op::prefill, fmt, g, Hq);
    INFO("supports_op: " << sup.reason << " " << sup.detail);
    REQUIRE(sup.ok);
    ++cases;

    StoreConfig cfg;
    cfg.format = fmt;
    cfg.n_kv_heads = H;
    cfg.head_dim = D;
    cfg.block_size = pc.block_size;
    cfg.n_blocks = (n_all + pc.block_size - 1) / pc.block_size + 2 * (pc.block_size + 1) + 4;
    const std::vector<float> kscale = variant.head_scales ? gate_head_scales(1, H, KvHalf::K) : std::vector<float>(H, kGateKScale);
    const std::vector<float> vscale = variant.head_scales ? gate_head_scales(1, H, KvHalf::V) : std::vector<float>(H, kGateVScale);
    cfg.k_scale = kscale;
    cfg.v_scale = vscale;
    kc::CudaKvStore gpu(cfg);
    if (variant.head_scales && H > 1) REQUIRE(gpu.per_head_scales());

    // Rows: the sequence's n_all rows (gaussian K/V), decoys: large constant values.
    const StoreCase sc_rows{pc.block_size, H, D, n_all, Pattern::gaussian, pc.seed * 31, 0};
    const std::vector<float> k = make_rows(sc_rows, kGateKMagnitude, 1);
    const std::vector<float> v = make_rows(sc_rows, kGateVMagnitude, 2);
    std::vector<float> future_k = k, future_v = v;  // future rows: replaced by large values
    for (std::size_t i = static_cast<std::size_t>(n_ctx) * HD; i < future_k.size(); ++i) {
      future_k[i] = 30.0f;
      future_v[i] = 30.0f * ((i % 2) ? 1.0f : -1.0f);
    }
    std::vector<float> big(static_cast<std::size_t>(pc.block_size + 1) * HD, 30.0f);
    // Decoy 1 takes the first pages; the prefix is written; decoy 2 takes the next pages; then the
    // chunk (and the future rows) land on pages after it: the table is not contiguous.
    const SeqId decoy1 = gpu.create_sequence();
    gpu.extend(decoy1, pc.block_size + 1);
    gpu.write_host(decoy1, 0, 0, pc.block_size + 1, big.data(), HD, big.data(), HD);
    const SeqId s = gpu.create_sequence();
    if (pc.n_past > 0) {
      gpu.extend(s, pc.n_past);
      gpu.write_host(s, 0, 0, pc.n_past, k.data(), HD, v.data(), HD);
    }
    const SeqId decoy2 = gpu.create_sequence();
    gpu.extend(decoy2, pc.block_size + 1);
    gpu.write_host(decoy2, 0, 0, pc.block_size + 1, big.data(), HD, big.data(), HD);
    gpu.extend(s, pc.n_new + pc.n_future);
    gpu.write_host(s, 0, pc.n_past, pc.n_new + pc.n_future, future_k.data() + static_cast<std::size_t>(pc.n_past) * HD,
                   HD, future_v.data() + static_cast<std::size_t>(pc.n_past) * HD, HD);

    // Query scale as ORA.cuda.decode: 1.5, growing as sqrt(ln(n/2)) for long contexts, so a handful
    // of keys dominate and the output does not average towards 0 under the worst-case bound.
    Rng r(pc.seed ^ 0x5EEDF00Dull);
    const double q_scale = std::max(1.5, std::sqrt(std::log(std::max(1, n_ctx) / 2.0)));
    const float softcap = capped ? static_cast<float>(3.0 * q_scale) : 0.0f;
    INFO("softcap " << softcap);
    std::vector<float> q(static_cast<std::size_t>(pc.n_new) * Hq * D);
    for (auto& x : q) x = r.normal() * static_cast<float>(q_scale);
    DevFloats dq(q.size()), dout(q.size());
    REQUIRE(cudaMemcpy(dq.p, q.data(), q.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    const std::vector<float> poison(q.size(), std::nanf(""));
    REQUIRE(cudaMemcpy(dout.p, poison.data(), q.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    // The kernel that ran (windowed calls take the CUDA-core kernel even where supports_op names the
    // tensor-core one for the geometry): it decides which bound judges the output below.
    const std::string path =
        gpu.prefill(s, 0, Hq, pc.n_past, pc.n_new, dq.p, dout.p, 0.0f, nullptr, window, softcap);
    INFO("kernel that ran: " << path);
    if (window > 0) CHECK(path == "prefill(fp32)");
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<float> got(q.size());
    REQUIRE(cudaMemcpy(got.data(), dout.p, got.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);

    // NaN/Inf first (an unwritten output element is still NaN).
    const std::size_t nonfinite = ko::count_nonfinite(std::span<const float>(got));
    INFO("non-finite outputs: " << nonfinite);
    REQUIRE(nonfinite == 0);

    if (slow_pool) {  // PAR.cuda.prefill.slow_pool: the same bytes read from mapped host memory
      MappedPages mp;
      mp.map(gpu, {s});
      DevFloats dslow(q.size());
      REQUIRE(cudaMemcpy(dslow.p, poison.data(), q.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
      const std::string slow_path =
          mp.view->prefill(mp.seqs[0], 0, Hq, pc.n_past, pc.n_new, dq.p, dslow.p, 0.0f, nullptr, window, softcap);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      std::vector<float> slow(q.size());
      REQUIRE(cudaMemcpy(slow.data(), dslow.p, slow.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
      CHECK(slow_path == path);
      std::size_t differ = 0;
      for (std::size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &slow[i], 4) != 0;
      INFO("path " << path << ": " << differ << " of " << got.size() << " outputs differ in their bits");
      CHECK(differ == 0);
      if (path.rfind("prefill(mma", 0) == 0) {
        ++slow_mma;
        if (n_ctx > 64) ++slow_multi_tile;  // more than one KV tile: the pipeline's second stage is used
      }
      continue;
    }

    // The oracle dequantizes the GPU's own bytes of the first n_ctx tokens.
    const ko::PageShape shape{pc.block_size, H, D};
    const bool rot_k = fmt.k == HalfFormat::q4_0_rot, rot_v = fmt.v == HalfFormat::q4_0_rot;
    const auto table = gpu.block_table(s);
    std::vector<float> kd(static_cast<std::size_t>(n_ctx) * HD), vd(kd.size()), ky(kd.size()), vy(kd.size());
    std::vector<float> kd0, vd0;  // head-scales twin: every head dequantized with head 0's scale
    if (variant.head_scales) kd0.resize(kd.size()), vd0.resize(kd.size());
    for (int p = 0; p * pc.block_size < n_ctx; ++p) {
      const int t0 = p * pc.block_size, m = std::min(pc.block_size, n_ctx - t0);
      const auto kp = gpu.download_page(0, KvHalf::K, table[static_cast<std::size_t>(p)]);
      const auto vp = gpu.download_page(0, KvHalf::V, table[static_cast<std::size_t>(p)]);
      auto put = [&](std::vector<float>& dst, const std::vector<float>& src) {
        std::copy_n(src.begin(), static_cast<std::size_t>(m) * HD, dst.begin() + static_cast<std::ptrdiff_t>(t0) * HD);
      };
      // Each head's own scale (every head the same one outside the head-scales twin).
      put(kd, ko::dequantize_page(oracle_half(fmt.k), shape, kp.data(), m, kscale));
      put(vd, ko::dequantize_page(oracle_half(fmt.v), shape, vp.data(), m, vscale));
      if (variant.head_scales) {
        put(kd0, ko::dequantize_page(oracle_half(fmt.k), shape, kp.data(), m, kscale[0]));
        put(vd0, ko::dequantize_page(oracle_half(fmt.v), shape, vp.data(), m, vscale[0]));
      }
      if (rot_k) put(ky, ko::dequantize_page(ko::Half::q4_0, shape, kp.data(), m, 1.0f));
      if (rot_v) put(vy, ko::dequantize_page(ko::Half::q4_0, shape, vp.data(), m, 1.0f));
    }
    ko::AttnShape as{pc.n_new, Hq, n_ctx, H, D, pc.n_past, 0.0f};
    as.window = window;
    as.softcap = softcap;
    std::vector<double> ref(q.size());
    ko::sdpa_f64(as, q.data(), kd.data(), vd.data(), ref.data());
    if (variant.head_scales && H > 1) {  // head 0's scale on every head: far from the reference judged
      std::vector<double> alt(q.size());
      ko::sdpa_f64(as, q.data(), kd0.data(), vd0.data(), alt.data());
      double d = 0, r2 = 0;
      for (std::size_t i = 0; i < alt.size(); ++i) {
        d = std::max(d, std::fabs(alt[i] - ref[i]));
        r2 += ref[i] * ref[i];
      }
      INFO("head 0's scales on every head vs each head's own: " << d);
      ++head_cases;
      if (d > 4 * kOraSensitivity * std::sqrt(r2 / double(alt.size()))) ++heads_visible;
    }
    if (softcap > 0) {  // anti-vacuity of the cap: without it the reference moves (counted, judged below)
      ko::AttnShape uncapped = as;
      uncapped.softcap = 0;
      std::vector<double> alt(q.size());
      ko::sdpa_f64(uncapped, q.data(), kd.data(), vd.data(), alt.data());
      double d = 0, r2 = 0;
      for (std::size_t i = 0; i < alt.size(); ++i) {
        d = std::max(d, std::fabs(alt[i] - ref[i]));
        r2 += ref[i] * ref[i];
      }
      INFO("with vs without the soft-cap: " << d);
      ++cap_cases;
      // 4 x kOraSensitivity of the RMS: farther than any bound the checks below accept.
      if (d > 4 * kOraSensitivity * std::sqrt(r2 / double(alt.size()))) ++cap_visible;
    }

    // Bound inputs over every (query, head) row and its visible keys.
    const double sc = 1.0 / std::sqrt(double(D));
    double max_l1 = 0, vmax = 0, q_rot_err = 0;
    for (int i = 0; i < pc.n_new; ++i)
      for (int hq = 0; hq < Hq; ++hq) {
        const float* qv = q.data() + (static_cast<std::size_t>(i) * Hq + hq) * D;
        std::vector<double> qr(qv, qv + D);
        double q2 = 0;
        for (double x : qr) q2 += x * x;
        if (rot_k) ko::hadamard_f64(qr.data(), D);
        for (int t = 0; t <= pc.n_past + i; ++t) {
          const std::size_t o = static_cast<std::size_t>(t) * HD + static_cast<std::size_t>(hq / pc.group) * D;
          double l1 = 0, l1r = 0, y2 = 0;
          for (int d = 0; d < D; ++d) {
            l1 += std::fabs(double(qv[d]) * kd[o + d]);
            if (rot_k) {
              l1r += std::fabs(qr[static_cast<std::size_t>(d)] * ky[o + d]);
              y2 += double(ky[o + d]) * ky[o + d];
            }
          }
          max_l1 = std::max({max_l1, l1 * sc, l1r * sc});
          if (rot_k) q_rot_err = std::max(q_rot_err, sc * (std::log2(double(D)) + 2) * kU32 * std::sqrt(q2) * std::sqrt(y2));
        }
      }
    for (float x : (rot_v ? vy : vd)) vmax = std::max(vmax, double(std::fabs(x)));
    if (path.rfind("prefill(mma", 0) == 0) {
      // Tensor-core kernel: (1) the operand rounding against the FP64 attention over the stored
      // values, oracle vs oracle, under the format-derived bound; (2) the kernel against the FP64
      // attention over its own operands under the tight bound (bounds.hpp attn_mma_elem_bound).
      std::vector<float> ko_(kd.size()), vo(kd.size());
      for (int p = 0; p * pc.block_size < n_ctx; ++p) {
        const int t0 = p * pc.block_size, m = std::min(pc.block_size, n_ctx - t0);
        const auto kp = gpu.download_page(0, KvHalf::K, table[static_cast<std::size_t>(p)]);
        const auto vp = gpu.download_page(0, KvHalf::V, table[static_cast<std::size_t>(p)]);
        const auto kx = operand_values(fmt.k, shape, kp.data(), m), vx = operand_values(fmt.v, shape, vp.data(), m);
        std::copy(kx.begin(), kx.end(), ko_.begin() + static_cast<std::ptrdiff_t>(t0) * HD);
        std::copy(vx.begin(), vx.end(), vo.begin() + static_cast<std::ptrdiff_t>(t0) * HD);
      }
      const std::vector<float> qo = query_operands(fmt, q, D, Hq, pc.group, kscale);
      // The fp8 V scale of the output element's KV head (the kernel's epilogue multiplier).
      const bool fp8v = fmt.v == HalfFormat::fp8_e4m3 || fmt.v == HalfFormat::fp8_e5m2;
      const auto vm = [&](std::size_t e) {
        return fp8v ? double(vscale[(e / static_cast<std::size_t>(D)) % static_cast<std::size_t>(Hq) /
                                    static_cast<std::size_t>(pc.group)])
                    : 1.0;
      };
      OperandRef R = operand_attention(qo, ko_, vo, pc.n_new, Hq, H, D, pc.n_past, n_ctx, 0, softcap);
      OperandRef W = operand_attention(qo, ko_, vo, pc.n_new, Hq, H, D, pc.n_past, n_ctx, 1, softcap);
      if (softcap > 0) R.max_l1 += (R.max_l1 + 3.0 * softcap) / (D / 4 + 10);  // softcap rounding (below)
      double vmax_o = 0;
      for (std::size_t e = 0; e < vo.size(); ++e)
        vmax_o = std::max(vmax_o, double(std::fabs(vo[e])) *
                                      (fp8v ? double(vscale[(e / static_cast<std::size_t>(D)) % static_cast<std::size_t>(H)]) : 1.0));
      for (auto* x : {&R.o, &R.b, &W.o})
        for (std::size_t e = 0; e < x->size(); ++e) (*x)[e] *= vm(e);
      // The kernel's output in the domain of R (a rotated V: H applied in binary64).
      std::vector<double> gd(got.begin(), got.end());
      double o2 = 0;
      if (rot_v)
        for (std::size_t row = 0; row < gd.size() / D; ++row) {
          ko::hadamard_f64(gd.data() + row * D, D);
          double h2 = 0;
          for (int d = 0; d < D; ++d) h2 += R.o[row * D + d] * R.o[row * D + d];
          o2 = std::max(o2, h2);
        }
      const int pv_terms_m = n_ctx + (n_ctx + 31) / 32 + 4;
      const double f32_part = attn_f32_max_abs(D / 4 + 8, pv_terms_m, R.max_l1, vmax_o) + (rot_v ? wht_slack(D, std::sqrt(o2)) : 0.0);
      const double u_p = bf16_operand(fmt.v) ? kBf16OperandU : kF16OperandU;
      double err_max = 0, worst = -1, bound_max = 0, bound_sq = 0, ref_sq = 0, err_sq = 0, wide_max = 0, wide_worst = 0;
      for (std::size_t e = 0; e < gd.size(); ++e) {
        const double b = attn_mma_elem_bound(f32_part, u_p, R.b[e], n_ctx, vmax_o, R.o[e]);
        const double err = std::fabs(gd[e] - R.o[e]);
        err_max = std::max(err_max, err);
        worst = std::max(worst, err / b);
        bound_max = std::max(bound_max, b);
        bound_sq += b * b;
        ref_sq += R.o[e] * R.o[e];
        err_sq += err * err;
        wide_max = std::max(wide_max, std::fabs(gd[e] - W.o[e]));
        wide_worst = std::max(wide_worst, std::fabs(gd[e] - W.o[e]) / b);
      }
      const double rms = std::sqrt(ref_sq / double(gd.size())), nmse = err_sq / ref_sq;
      const double bound_rms = std::sqrt(bound_sq / double(gd.size()));
      INFO("path " << path << ": max-abs " << err_max << ", max err/bound " << worst << ", bound max " << bound_max
                   << ", nmse " << nmse << ", bound rms/rms " << bound_rms / rms << (rot_v ? " [rotated domain]" : ""));
      CHECK(worst <= 1.0);
      CHECK(nmse <= bound_max * bound_max / (rms * rms));
      // (1) The operand rounding stays within the format-derived bound (the reference's own check).
      const double u_q = (bf16_operand(fmt.k) ? kBf16OperandU : kF16OperandU) + 8 * kU32;
      // Both references are FP64; besides the operand rounding they differ by the oracle's binary32
      // dequantization products (fp8 code x tensor scale: 2u, in u_k / u_v), its binary32 rotation of a
      // rotated half (q_rot_err as above; a rotated V: wht_slack with |y|_2 <= sqrt(D) max|y|).
      const double vmx = std::max(vmax, vmax_o);
      const double op_bound = attn_operand_rounding_bound(u_q, operand_u(fmt.k) + 2 * kU32, operand_u(fmt.v) + 2 * kU32,
                                                          std::max(max_l1, R.max_l1), vmx) +
                              16 * q_rot_err * vmx + (rot_v ? wht_slack(D, std::sqrt(double(D)) * vmx) : 0.0);
      const std::vector<double> ref_c = [&] {
        std::vector<double> y = ref;
        if (rot_v)
          for (std::size_t row = 0; row < y.size() / D; ++row) ko::hadamard_f64(y.data() + row * D, D);
        return y;
      }();
      double op_err = 0;
      for (std::size_t e = 0; e < ref_c.size(); ++e) op_err = std::max(op_err, std::fabs(ref_c[e] - R.o[e]));
      INFO("operand rounding: max |ref(stored) - ref(operands)| " << op_err << " (format bound " << op_bound << ")");
      CHECK(op_err <= op_bound);
      // Anti-vacuity (the tight bound is the one that judges the kernel). The bound is per element
      // (it scales with sum_j w_j |v_jd|): its RMS stays below kOraSensitivity of the output's RMS,
      // so an O(1) read-side error (a wrong page, head or scale) cannot hide.
      CHECK(bound_rms <= kOraSensitivity * rms);
      double wide_ratio = 0;
      if (pc.n_new > 1) {
        double spread = 0;
        for (int i = 1; i < pc.n_new; ++i)
          for (std::size_t e = 0; e < static_cast<std::size_t>(Hq) * D; ++e)
            spread = std::max(spread, std::fabs(R.o[static_cast<std::size_t>(i) * Hq * D + e] - R.o[e]));
        INFO("max |out(token i) - out(token 0)| = " << spread << ", wide-window max-abs " << wide_max);
        CHECK(spread > 4 * bound_max);
        CHECK(wide_worst > 1.0);  // some element of the one-key-too-wide window exceeds its own bound
        wide_ratio = wide_worst;
      }
      {
        std::vector<double> exact(q.size());
        ko::sdpa_f64(as, q.data(), k.data(), v.data(), exact.data());
        double qerr = 0;
        for (std::size_t i = 0; i < exact.size(); ++i) qerr = std::max(qerr, std::fabs(exact[i] - ref[i]));
        CHECK(qerr > 0);  // every format the kernel reads is lossy against the f32 rows
      }
      std::printf("ORA.cuda.prefill %s %s [%s]: max-abs %.3g (bound %.3g, max err/bound %.3g) nmse %.3g bound-rms/rms %.3g "
                  "wide-window err/bound %.3g operand-rounding %.3g (format bound %.3g)\n",
                  fmt.name().c_str(), pc.describe().c_str(), path.c_str(), err_max, bound_max, worst, nmse,
                  bound_rms / rms, wide_ratio, op_err, op_bound);
      continue;
    }
    const int pv_terms = n_ctx + (n_ctx + 31) / 32 + 4;
    if (softcap > 0) max_l1 += (max_l1 + 3.0 * softcap) / (D + 2);
    double bound = attn_f32_max_abs(D, pv_terms, max_l1, vmax) + 16 * q_rot_err * vmax;

    // Compare (a rotated V: in the rotated domain, H applied to both outputs in binary64).
    auto to_cmp = [&](const std::vector<double>& x) {
      std::vector<double> y = x;
      if (rot_v)
        for (std::size_t row = 0; row < y.size() / D; ++row) ko::hadamard_f64(y.data() + row * D, D);
      return y;
    };
    if (rot_v) {
      double o2 = 0;
      for (std::size_t row = 0; row < ref.size() / D; ++row) {
        double h2 = 0;
        for (int d = 0; d < D; ++d) h2 += ref[row * D + d] * ref[row * D + d];
        o2 = std::max(o2, h2);
      }
      bound += wht_slack(D, std::sqrt(o2));
    }
    const std::vector<double> cmp_ref = to_cmp(ref), cmp_got = to_cmp(std::vector<double>(got.begin(), got.end()));
    const Cmp c = compare(cmp_ref, cmp_got);
    const double nmse_bound = bound * bound / (c.ref_rms * c.ref_rms);
    INFO("path " << path << ": nmse " << c.nmse << " (bound " << nmse_bound << "), max-abs " << c.err_max
                 << " (bound " << bound << "), bound/rms(ref) " << bound / c.ref_rms << (rot_v ? " [rotated domain]" : ""));
    CHECK(c.nmse <= nmse_bound);
    CHECK(c.err_max <= bound);

    // Anti-vacuity.
    CHECK(bound <= kOraSensitivity * c.ref_rms);  // a wrong page/head/scale (O(1) error) cannot hide
    double wide_ratio = 0;
    if (pc.n_new > 1) {
      // The outputs differ across query tokens (same head) by several bounds: a kernel that mixed up
      // query tokens (or gave every token the same window) would fail the comparison above.
      double spread = 0;
      for (int i = 1; i < pc.n_new; ++i)
        for (std::size_t e = 0; e < static_cast<std::size_t>(Hq) * D; ++e)
          spread = std::max(spread, std::fabs(ref[static_cast<std::size_t>(i) * Hq * D + e] - ref[e]));
      INFO("max |out(token i) - out(token 0)| = " << spread);
      CHECK(spread > 4 * bound);
      // A causal window one key too wide (query i sees n_past + i + 1 keys; the last query has none
      // more to see) exceeds the bound: the mask is tested, not assumed.
      ko::AttnShape wide = as;
      wide.q_pos0 = pc.n_past + 1;
      std::vector<double> ref_wide(q.size());
      ko::sdpa_f64(wide, q.data(), kd.data(), vd.data(), ref_wide.data());
      const Cmp cw = compare(to_cmp(ref_wide), cmp_got);
      INFO("wide-window oracle: max-abs " << cw.err_max << " vs bound " << bound);
      CHECK(cw.err_max > bound);
      wide_ratio = cw.err_max / bound;
    }
    if (window > 0 && window < n_ctx) {  // the window cuts: one key more is farther than the bound
      ko::AttnShape wider = as;
      wider.window = window + 1;
      std::vector<double> alt(q.size());
      ko::sdpa_f64(wider, q.data(), kd.data(), vd.data(), alt.data());
      const Cmp cw = compare(to_cmp(alt), cmp_got);
      INFO("window " << window + 1 << " oracle: max-abs " << cw.err_max << " vs bound " << bound);
      CHECK(cw.err_max > bound);
      ++windows_cut;
    }
    if (fmt.k != HalfFormat::f32 || fmt.v != HalfFormat::f32) {
      // The store really quantized: attention over the unquantized rows differs.
      std::vector<double> exact(q.size());
      ko::sdpa_f64(as, q.data(), k.data(), v.data(), exact.data());
      double qerr = 0;
      for (std::size_t i = 0; i < exact.size(); ++i) qerr = std::max(qerr, std::fabs(exact[i] - ref[i]));
      CHECK(qerr > 0);
    }
    // One line per case, pass or fail (the parameters, seed and figures of the run).
    std::printf("ORA.cuda.prefill %s %s: max-abs %.3g (bound %.3g) nmse %.3g bound/rms %.3g wide-window/bound %.3g\n",
                fmt.name().c_str(), pc.describe().c_str(), c.err_max, bound, c.nmse, bound / c.ref_rms, wide_ratio);
  }
  CHECK(cases >= (capped ? 8 : 10));
  if (slow_pool) {
    CHECK(kc::prefill_mma_applies(fmt, PageGeometry{16, 2, 128}));
    INFO("tensor-core cases " << slow_mma << ", with more than one KV tile " << slow_multi_tile);
    CHECK(slow_mma >= 8);
    CHECK(slow_multi_tile >= 5);
  }
  if (windowed) CHECK(windows_cut >= 8);
  if (variant.head_scales) {
    // As ORA.cuda.decode_head_scales: with an fp8 V in 90% of the multi-head cases or more; a K scale
    // alone (softmax temperature only) counted (on an H100, k=fp8_e4m3,v=bf16 windowed: 9 of 15).
    const bool v_scaled = fmt.v == HalfFormat::fp8_e4m3 || fmt.v == HalfFormat::fp8_e5m2;
    INFO("multi-head cases " << head_cases << ", head 0's scales visible in " << heads_visible);
    CHECK(heads_visible >= 4);
    if (v_scaled) CHECK(heads_visible * 10 >= head_cases * 9);
  }
  if (capped) {
    // Counted, not required per case: where few keys are visible or the scores stay far below the
    // cap, it moves the output by less (on the H200: visible in 12-14 of the 16-17 cases per format).
    INFO("soft-capped cases " << cap_cases << ", cap visible in " << cap_visible);
    CHECK(cap_visible * 10 >= cap_cases * 7);
    CHECK(cap_visible >= 8);
  }
}

}  // namespace

#define ORA_CUDA_PREFILL(id, fmtname, seed)                                                              \
  TEST_CASE("ORA.cuda.prefill." id " GPU causal prefill attention == oracle FP64 attention over the same bytes", \
            "[gate:ORA][fmt:" fmtname "][cuda][prefill]") {                                              \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                             \
    const auto f = parse_kv_format(fmtname);                                                             \
    REQUIRE(f.has_value());                                                                              \
    run_prefill_gate(*f, seed);                                                                          \
  }                                                                                                      \
  TEST_CASE("ORA.cuda.prefill_window." id " GPU sliding-window prefill == oracle FP64 windowed SDPA",      \
            "[gate:ORA][fmt:" fmtname "][cuda][prefill]") {                                              \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                     \
    const auto f = parse_kv_format(fmtname);                                                             \
    REQUIRE(f.has_value());                                                                              \
    run_prefill_gate(*f, seed + 50, {.windowed = true});                                                               \
  }                                                                                                      \
  TEST_CASE("ORA.cuda.prefill_softcap." id " GPU soft-capped prefill == oracle FP64 soft-capped SDPA",     \
            "[gate:ORA][fmt:" fmtname "][cuda][prefill]") {                                              \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                     \
    const auto f = parse_kv_format(fmtname);                                                             \
    REQUIRE(f.has_value());                                                                              \
    run_prefill_gate(*f, seed + 70, {.capped = true});                                                        \
  }

// Slow-pool twins (PAR.cuda.prefill.slow_pool, built to catch a stage of the tensor-core kernel read
// before its cp.async.wait_group): one per format that prefills on the tensor-core kernel. The pairs
// left out (an f32 half, MX, NVFP4, the per-(token, head) halves) prefill on the CUDA-core kernel,
// which makes no asynchronous copy: over the same bytes it gives the same bits from any memory, so a
// twin would be a gate no bug can turn red. STO.cuda.prefill.slow_pool_twins checks this list against
// prefill_mma_applies, so a format moving between kernels cannot leave the list stale.
#define PAR_CUDA_PREFILL_SLOW_POOL(id, fmtname, seed)                                                    \
  TEST_CASE("PAR.cuda.prefill.slow_pool." id " GPU prefill over pages in mapped host memory == over device pages, bit for bit", \
            "[gate:PAR][fmt:" fmtname "][cuda][prefill]") {                                              \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                     \
    const auto f = parse_kv_format(fmtname);                                                             \
    REQUIRE(f.has_value());                                                                              \
    run_prefill_gate(*f, seed + 90, {.slow_pool = true});                                                 \
  }

// The mixed pairs of the ORA.cuda.prefill rows (beside one row per preset): those the tensor-core
// kernel serves, then two on the CUDA-core kernel (an f32 half; the fp8_ds_mla pair).
#define CUDA_PREFILL_MIXED_MMA(X)                      \
  X("mixed.q4_0_rot-bf16", "k=q4_0_rot,v=bf16", 10000) \
  X("mixed.q8_0-fp8_e5m2", "k=q8_0,v=fp8_e5m2", 10200) \
  X("mixed.fp8-q4_0", "k=fp8_e4m3,v=q4_0", 10300)      \
  X("mixed.f16-int8", "k=f16,v=int8", 10400)
#define CUDA_PREFILL_MIXED_PAIRS(X)                  \
  CUDA_PREFILL_MIXED_MMA(X)                          \
  X("mixed.f32-q4_0_rot", "k=f32,v=q4_0_rot", 10100) \
  X("mixed.fp8_block128-bf16", "k=fp8_block128,v=bf16", 10500)

// The formats of PAR.cuda.prefill.slow_pool: the pipelined presets (cuda_gate_common.hpp) and the
// mixed pairs on the tensor-core kernel (seeds as their ORA.cuda.prefill rows: 9000 + 100 x the
// preset's slot, + 90).
#define PAR_CUDA_PREFILL_SLOW_POOL_PRESET(name, slot) PAR_CUDA_PREFILL_SLOW_POOL(#name, #name, 9000 + 100 * slot)

#define ORA_CUDA_PREFILL_ROW(A, name, k, v, slot, kind) ORA_CUDA_PREFILL(#name, #name, (9000 + 100 * slot))
KVGATE_PRESETS(ORA_CUDA_PREFILL_ROW, _)  // one row per preset: kvgate/format_list.hpp
CUDA_PREFILL_MIXED_PAIRS(ORA_CUDA_PREFILL)
KVGATE_CUDA_PIPELINED_PRESETS(PAR_CUDA_PREFILL_SLOW_POOL_PRESET)
CUDA_PREFILL_MIXED_MMA(PAR_CUDA_PREFILL_SLOW_POOL)

// Static fp8 scales per KV head (docs/FORMATS.md "Static scales per KV head"), the pairs of the
// ORA.cuda.decode_head_scales rows: the tensor-core kernel (every pair, fp8 with an fp8 or bf16
// half) and the CUDA-core kernel (the windowed twin).
#define ORA_CUDA_PREFILL_HEAD_SCALES(id, fmtname, seed)                                                  \
  TEST_CASE("ORA.cuda.prefill_head_scales." id " GPU causal prefill, fp8 scales per KV head == oracle FP64 SDPA", \
            "[gate:ORA][fmt:" fmtname "][cuda][prefill]") {                                              \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                     \
    const auto f = parse_kv_format(fmtname);                                                             \
    REQUIRE(f.has_value());                                                                              \
    run_prefill_gate(*f, seed + 2000, {.head_scales = true});                                            \
  }                                                                                                      \
  TEST_CASE("ORA.cuda.prefill_window_head_scales." id " GPU sliding-window prefill, fp8 scales per KV head " \
            "== oracle FP64 windowed SDPA",                                                              \
            "[gate:ORA][fmt:" fmtname "][cuda][prefill]") {                                              \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                     \
    const auto f = parse_kv_format(fmtname);                                                             \
    REQUIRE(f.has_value());                                                                              \
    run_prefill_gate(*f, seed + 2050, {.windowed = true, .head_scales = true});                          \
  }
CUDA_HEAD_SCALE_PAIRS(ORA_CUDA_PREFILL_HEAD_SCALES)

TEST_CASE("STO.cuda.prefill.slow_pool_twins the prefill slow-pool twins are exactly the formats the tensor-core kernel serves",
          "[gate:STO][cuda][prefill]") {
  // No device needed: prefill_mma_applies at the prefill cases' geometry (16-token pages, 2 KV heads,
  // head_dim 128), the test the twin's anti-vacuity also uses.
  std::set<std::string> twins, all;
  KVGATE_CUDA_PIPELINED_PRESETS(CUDA_TWIN_PRESET)
  CUDA_PREFILL_MIXED_MMA(CUDA_TWIN_ROW)
  CUDA_PREFILL_MIXED_PAIRS(CUDA_ORA_ROW)
  KVGATE_PRESETS(CUDA_ORA_PRESET, _)
  // 12 twins; 9 formats prefill on CUDA cores (7 presets, 2 pairs).
  cuda_gate::check_twin_list(
      twins, all,
      [](const KvFormat& f, std::string& why) {
        const bool applies = kc::prefill_mma_applies(f, PageGeometry{16, 2, 128});
        why = applies ? "tensor-core prefill applies" : "tensor-core prefill does not apply";
        return applies;
      },
      12, 9);
}

TEST_CASE("STO.cuda.prefill.capability supports_op(Op::prefill) refuses with stable reasons and names its kernel",
          "[gate:STO][cuda][prefill]") {
  auto refused = [](const kc::OpSupport& s, const char* reason) {
    INFO("got reason '" << s.reason << "' detail '" << s.detail << "'");
    CHECK_FALSE(s.ok);
    CHECK(s.reason == reason);
    CHECK_FALSE(s.detail.empty());
  };
  const KvFormat i8{HalfFormat::int8, HalfFormat::int8};
  refused(kc::supports_op(kc::Op::prefill, i8, {16, 4, 64}, 6), "gqa_ratio_invalid");
  refused(kc::supports_op(kc::Op::prefill, i8, {16, 1, 512}, 8), "head_dim_unsupported");
  refused(kc::supports_op(kc::Op::prefill, *parse_kv_format("k8v4"), {16, 8, 96}, 32), "head_dim_not_power_of_two");
  const kc::DeviceStatus& dev = kc::device_status();
  if (dev.available && dev.cc_major < 9) {
    refused(kc::supports_op(kc::Op::prefill, i8, {16, 8, 128}, 32), "arch_unsupported");
    return;
  }
  // Every K/V pair is accepted at every head_dim <= 256 its formats allow: the tensor-core kernel for
  // pairs without an f32 half at head_dim 64/128/256, the CUDA-core kernel for the rest.
  for (HalfFormat kf : all_half_formats())
    for (HalfFormat vf : all_half_formats())
      for (int d : {8, 64, 96, 128, 256}) {
        const PageGeometry g{16, 4, d};
        if (!supports(kf, g).ok || !supports(vf, g).ok) continue;
        const auto s = kc::supports_op(kc::Op::prefill, KvFormat{kf, vf}, g, 16);
        INFO((KvFormat{kf, vf}.name()) << " D=" << d << ": " << s.reason);
        CHECK(s.ok);
        const bool mma = kf != HalfFormat::f32 && vf != HalfFormat::f32 && !generic_only_on_cuda(kf) &&
                         !generic_only_on_cuda(vf) && (d == 64 || d == 128 || d == 256);
        CHECK(s.path == (mma ? "prefill(mma,D=" + std::to_string(d) + ")" : std::string("prefill(fp32)")));
        CHECK(kc::prefill_mma_applies(KvFormat{kf, vf}, g) == mma);
      }
  // The prefill op also refuses without pretending (n_new < 1) at the API.
  if (dev.available) {
    kc::PrefillArgs a;
    a.format = i8;
    a.geometry = {16, 4, 64};
    a.n_heads = 4;
    a.n_new = 0;
    CHECK_THROWS(kc::prefill_attention(a));
  } else {
    WARN("device checks of STO.cuda.prefill.capability SKIPPED: " << dev.reason);
  }
}

// ---- STO.cuda.prefill_mma.racecheck --------------------------------------------------------------
namespace {

// compute-sanitizer: $KVGATE_COMPUTE_SANITIZER, else the toolkit's bin folder this was built with,
// else /usr/local/cuda/bin; "" when none is executable.
std::string find_compute_sanitizer() {
  std::vector<std::string> c;
  if (const char* e = std::getenv("KVGATE_COMPUTE_SANITIZER")) c.emplace_back(e);
#ifdef KVGATE_CUDA_BIN_DIR
  c.emplace_back(std::string(KVGATE_CUDA_BIN_DIR) + "/compute-sanitizer");
#endif
  c.emplace_back("/usr/local/cuda/bin/compute-sanitizer");
  for (const std::string& p : c)
    if (!p.empty() && std::ifstream(p).good()) return p;
  return {};
}

}  // namespace

// Run by STO.cuda.prefill_mma.racecheck under the sanitizer (hidden: [.]); on its own it is a
// plain smoke run. Tensor-core prefills of 1-byte, 4-bit and 16-bit halves at every head_dim, each
// over several KV tiles (both stages of the double buffer in use, the last tile partial).
TEST_CASE("STO.cuda.prefill_mma.race_probe tensor-core prefills for the racecheck gate", "[.][cuda][prefill]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  int ran = 0;
  for (const char* name : {"int8", "q4_0", "bf16"})
    for (int D : {64, 128, 256}) {
      const auto f = parse_kv_format(name);
      REQUIRE(f.has_value());
      const int H = 2, group = 2, Hq = H * group, n_past = 40, n_new = 110, n = n_past + n_new;
      StoreConfig cfg;
      cfg.format = *f;
      cfg.n_kv_heads = H;
      cfg.head_dim = D;
      cfg.block_size = 16;
      cfg.n_blocks = (n + 15) / 16 + 1;
      cfg.k_scale = {kGateKScale};
      cfg.v_scale = {kGateVScale};
      kc::CudaKvStore gpu(cfg);
      const StoreCase sc_rows{16, H, D, n, Pattern::gaussian, static_cast<std::uint64_t>(D), 0};
      const std::vector<float> k = make_rows(sc_rows, kGateKMagnitude, 1), v = make_rows(sc_rows, kGateVMagnitude, 2);
      const SeqId s = gpu.create_sequence();
      gpu.extend(s, n);
      gpu.write_host(s, 0, 0, n, k.data(), static_cast<std::size_t>(H) * D, v.data(), static_cast<std::size_t>(H) * D);
      std::vector<float> q(static_cast<std::size_t>(n_new) * Hq * D);
      Rng r(77 + static_cast<std::uint64_t>(D));
      for (auto& x : q) x = r.normal() * 1.5f;
      DevFloats dq(q.size()), dout(q.size());
      REQUIRE(cudaMemcpy(dq.p, q.data(), q.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
      const std::string path = gpu.prefill(s, 0, Hq, n_past, n_new, dq.p, dout.p);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      CHECK(path.rfind("prefill(mma", 0) == 0);
      std::printf("race_probe ran %s %s\n", name, path.c_str());
      ++ran;
    }
  CHECK(ran == 9);
}

// Opt-in ([.]: run it by name; a racecheck run of the probe takes the sanitizer's time, so the shards
// of a whole gate_cuda run skip it): its first H200 run named the probe without the trailing '*'
// Catch2 needs, so the probe never ran under the sanitizer; its first full run (an H100, round 26)
// ran the nine probe prefills under racecheck with 0 hazards.
TEST_CASE("STO.cuda.prefill_mma.racecheck compute-sanitizer racecheck: 0 shared-memory hazards in the tensor-core prefill",
          "[.][sanitizer][fmt:int8][cuda][prefill]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  const std::string san = find_compute_sanitizer();
  if (san.empty()) {
    WARN("SKIPPED: compute-sanitizer not found (set KVGATE_COMPUTE_SANITIZER)");
    return;
  }
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  REQUIRE_FALSE(ec);
  const std::filesystem::path log = std::filesystem::temp_directory_path() /
                                    ("kvgate_racecheck_" + std::to_string(static_cast<long>(::getpid())) + ".log");
  const std::string cmd = "'" + san + "' --tool racecheck --error-exitcode 7 '" + self.string() +
                          "' 'STO.cuda.prefill_mma.race_probe*' > '" + log.string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::stringstream text;
  text << std::ifstream(log).rdbuf();
  std::filesystem::remove(log, ec);
  const std::string out = text.str();
  INFO(cmd);
  INFO(out.substr(out.size() > 6000 ? out.size() - 6000 : 0));
  CHECK(rc == 0);
  CHECK(out.find("RACECHECK SUMMARY: 0 hazards") != std::string::npos);
  // Anti-vacuity: the sanitizer ran the probe's nine tensor-core prefills and they passed.
  int ran = 0;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    ran += line.rfind("race_probe ran ", 0) == 0 && line.find(" prefill(mma,D=") != std::string::npos;
  CHECK(ran == 9);
  CHECK(out.find("All tests passed") != std::string::npos);
}
