// Parameters and compile-time configuration of the decode attention kernels, visible to the
// dispatch code without instantiating any kernel (kernels live in decode.cuh).
#pragma once
#include <cstdint>

#include "common.cuh"

namespace kvgate::cuda::detail {

struct DecodeLaunch {
  const std::uint8_t* k_pool = nullptr;
  const std::uint8_t* v_pool = nullptr;
  std::size_t k_page_stride = 0, v_page_stride = 0;
  const int* block_tables = nullptr;  // [batch][table_stride]
  int table_stride = 0;
  const int* seq_lens = nullptr;      // [batch]
  const float* q = nullptr;           // [batch][n_heads][D]
  float* part_o = nullptr;            // [batch][splits][n_heads][D]
  float* part_ml = nullptr;           // [batch][splits][n_heads][2]
  int batch = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, block_size = 0;
  int group = 1, n_hchunks = 1, splits = 1, tokens_per_split = 0;
  float q_mul = 1.0f;  // softmax_scale * log2(e) * k_tensor_scale
  const float* k_heads = nullptr;  // per-KV-head K scales [n_kv_heads] (device): q_mul per head (head_q_mul)
  float sm_scale = 0.0f;           // softmax_scale (what head_q_mul multiplies with a head's scale)
  float had_c = 1.0f;  // float(1/sqrt(double(D)))
  int window = 0;      // > 0: sliding window (keys seq_len - window .. seq_len - 1)
  float softcap2 = 0.0f;  // > 0: attention-logit soft-cap in base-2 score units (cap * log2(e)); decode.cuh softcap2
  // Bytes-moved accounting (docs/CUDA.md "What a decode step reads on the GPU"): null, the default,
  // leaves it off (one uniform branch per warp after its loop). Else every warp adds, once, the cells
  // (token x KV head) its loop copied from the pool times cell_bytes (decode.cuh count_read).
  unsigned long long* bytes_read = nullptr;
  unsigned cell_bytes = 0;  // K + V bytes of one cell as the formats lay out a page (decode.cu decode_cell_bytes)
  bool page_tiles = true;   // the fast and tensor-core kernels may take page tiles (ops.hpp decode_page_tiles)
};

struct CombineLaunch {
  const float* part_o = nullptr;
  const float* part_ml = nullptr;
  float* out = nullptr;  // [batch][n_heads][D]
  int batch = 0, n_heads = 0, head_dim = 0, splits = 1;
  float v_mul = 1.0f;  // v tensor scale
  const float* v_heads = nullptr;  // per-KV-head V scales [n_kv_heads] (device); null: v_mul
  int group = 1;                   // query heads per KV head (query head hq reads KV head hq / group)
  float had_c = 1.0f;
};

inline constexpr int kHeadsPerCta = 4;
inline constexpr int kDecodeWarps = 4;
inline constexpr int kStages = 3;

inline constexpr int kGenericMaxPerLane = 8;  // generic path: head_dim <= 256
inline int generic_smem_bytes(int D) { return (kHeadsPerCta * D + kDecodeWarps * kHeadsPerCta * (D + 2)) * 4; }

template <HF KF, HF VF, int D>
struct FastCfg {
  static constexpr int E = 16, L = D / E, TG = 32 / L;
  static constexpr int CBK = cell_bytes(KF, D), CBV = cell_bytes(VF, D);
  static constexpr int CGK = gcd_c(CBK, 16), CGV = gcd_c(CBV, 16);
  static constexpr int SK = (CBK + 15) / 16 * 16, SV = (CBV + 15) / 16 * 16;
  static constexpr int BPT = SK + SV + 8;  // + K and V scale words (int8)
  static constexpr int C = (TG * 4 * BPT <= 6144) ? 4 : (TG * 2 * BPT <= 6144) ? 2 : 1;  // tokens per group per stage
  static constexpr int TGC = TG * C;                  // tokens per warp per stage (power of two, <= 32)
  static constexpr int LPT = 32 / TGC;                // copy lanes per token
  static constexpr int TOK = TGC, STAGES = kStages;   // the staging pipeline's names (decode.cuh WarpKvPipe)
  static constexpr int STAGE = TGC * BPT + TGC * 2;   // + 2 parity bytes per token
  static constexpr int STAGE_AL = (STAGE + 15) / 16 * 16;
  static constexpr int WARP_SMEM = kStages * STAGE_AL;
  static constexpr int Q_SMEM = kDecodeWarps * kHeadsPerCta * D * 4;  // each warp its own KV head's q
  static constexpr int PIPE_SMEM = kDecodeWarps * WARP_SMEM;
  static constexpr int SMEM = Q_SMEM + PIPE_SMEM;
};

// Halves the tensor-core path reads: the narrow formats (codes converted to f16 exactly: common.cuh
// narrow_code_half, the 2026 halves included) and the 16-bit ones (fed to bf16/f16 MMAs as stored).
// f32 stays on the CUDA cores.
template <HF F>
KVGATE_HD constexpr bool narrow_half() { return narrow_code_half(F); }
template <HF F>
KVGATE_HD constexpr bool wide16_half() { return F == HF::f16 || F == HF::bf16; }
// The 16-bit halves are supported by the tensor-core kernel (and passed the gates on the H200) but
// are not dispatched to it: with two 16-bit operands it measured slower than the CUDA-core path
// (bf16 at 32K x 16: 2.70 TB/s vs 3.53 TB/s).
template <HF F>
KVGATE_HD constexpr bool mma_half() { return narrow_half<F>(); }

KVGATE_HD constexpr int mma_cell_stride(int x) {
  return (x + 15) / 16 * 16 + (((x + 15) / 16 * 16) % 64 == 0 ? 16 : 0);
}

// Bytes a stage row keeps after a cell's codes for the cell's scales (decode.cuh WarpKvPipe
// copy_cell_scales): the 2026 halves stage them there (at least the aligned 4-byte word that holds
// them); int8's go to the stage's scale words; the others embed theirs in the codes (q8_0, q4_0).
KVGATE_HD constexpr int staged_scale_bytes(HF f, int D) {
  return mma_only_half(f) ? (cell_scale_bytes(f, D) < 4 ? 4 : cell_scale_bytes(f, D)) : 0;
}

template <HF KF, HF VF, int D>
struct MmaCfg {
  static constexpr int CBK = cell_bytes(KF, D), CBV = cell_bytes(VF, D);
  static constexpr int CGK = gcd_c(CBK, 16), CGV = gcd_c(CBV, 16);
  // A stage row: the cell's codes, then (2026 halves) its staged scales, padded (mma_cell_stride).
  static constexpr int SK = mma_cell_stride(CBK + staged_scale_bytes(KF, D)), SV = mma_cell_stride(CBV + staged_scale_bytes(VF, D));
  // One 16-token MMA tile per warp stage and a 3-deep ring: the kernel is latency-bound, so 12
  // resident warps per SM beat larger tiles with fewer warps (measured on the H200: 2 tiles x
  // 2 stages x 8 warps ran int8 at 2.2 TB/s, 1 x 3 x 12 at 2.5 TB/s).
  static constexpr int NT = 1;
  static constexpr int TOK = 16 * NT, LPT = 32 / TOK;
  static constexpr int STAGES = 3;
  static constexpr int STAGE = TOK * (SK + SV) + TOK * 8 + TOK * 2;
  static constexpr int STAGE_AL = (STAGE + 15) / 16 * 16;
  static constexpr int WARP_SMEM = STAGES * STAGE_AL;
  // Each warp stages its KV head's q (kHeadsPerCta x D floats) in its ring's last stage, which the
  // prologue leaves free (WarpKvPipe::spare_stage): no shared memory of its own, so four CTAs of
  // int8/fp8 at D = 128 (4 x 57 KB) fit in an SM's 228 KB.
  static_assert(STAGE_AL >= kHeadsPerCta * D * 4, "q must fit in one pipeline stage");
  static constexpr int SMEM = kDecodeWarps * WARP_SMEM;
  static constexpr int KSTEPS = D / 16, MTILES = D / 16, NBLK = D / 32;
  // Resident CTAs per SM the registers are budgeted for (__launch_bounds__): the kernel is bound by
  // per-tile latency, so 16 warps/SM (<= 128 registers) at D <= 128. D = 256 holds twice the O and
  // q fragments and stays at 12 warps (<= 168 registers); so does a q8_0 K with a block-scaled V,
  // which spills at 128 registers (48 B for q8_0/q8_0 at D = 128, ptxas 13.0).
  static constexpr int MIN_CTAS = D <= 128 && !(KF == HF::q8_0 && is_block32(VF)) ? 4 : 3;
};

// Which kernel a (K, V, D) instantiation runs: generic (D == 0), tensor-core (both halves narrow),
// or the CUDA-core fast path.
template <HF KF, HF VF, int D>
KVGATE_HD constexpr bool use_mma() { return D != 0 && mma_half<KF>() && mma_half<VF>(); }

template <HF KF, HF VF, int D>
int decode_smem_bytes(int head_dim) {
  if constexpr (D == 0 || !has_pipelined_decode(KF, VF)) return generic_smem_bytes(head_dim);
  else if constexpr (use_mma<KF, VF, D>()) return MmaCfg<KF, VF, D>::SMEM;
  else return FastCfg<KF, VF, D>::SMEM;
}

// Defined in decode.cuh, explicitly instantiated per K half format (decode_k_<fmt>.cu).
template <HF KF, HF VF, int D>
void launch_decode(const DecodeLaunch& a, int smem_bytes, cudaStream_t stream);
template <HF KF, HF VF, int D>
int decode_max_active(int smem_bytes);  // resident CTAs per SM
// decode_combine.cu
void launch_combine(const CombineLaunch& a, bool rot_v, cudaStream_t stream);

}  // namespace kvgate::cuda::detail
