// Shared pieces of the CUDA kernels: error checks, compile-time traits of the half formats, and
// the one dispatch switch from the runtime HalfFormat to template arguments.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kvgate/format.hpp"

#define KVGATE_CUDA_CHECK(expr)                                                                     \
  do {                                                                                              \
    const cudaError_t kvgate_err_ = (expr);                                                         \
    if (kvgate_err_ != cudaSuccess)                                                                 \
      throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(kvgate_err_) + " (" + \
                               #expr + ") at " + __FILE__ + ":" + std::to_string(__LINE__));        \
  } while (0)

#ifdef __CUDACC__
#define KVGATE_HD __host__ __device__
#else
#define KVGATE_HD
#endif

namespace kvgate::cuda::detail {

using HF = kvgate::HalfFormat;

KVGATE_HD constexpr bool is_block32(HF f) { return f == HF::q8_0 || f == HF::q4_0 || f == HF::q4_0_rot; }
KVGATE_HD constexpr bool is_rot(HF f) { return f == HF::q4_0_rot; }
KVGATE_HD constexpr bool is_q4(HF f) { return f == HF::q4_0 || f == HF::q4_0_rot; }
KVGATE_HD constexpr bool is_fp8(HF f) { return f == HF::fp8_e4m3 || f == HF::fp8_e5m2; }
KVGATE_HD constexpr bool is_mx(HF f) { return f == HF::mxfp8 || f == HF::mxfp4; }
KVGATE_HD constexpr bool is_e2m1(HF f) { return f == HF::mxfp4 || f == HF::nvfp4; }
KVGATE_HD constexpr bool is_per_token_head(HF f) { return f == HF::fp8_per_token_head || f == HF::int8_per_token_head; }
KVGATE_HD constexpr int elem_bytes(HF f) { return f == HF::f32 ? 4 : (f == HF::f16 || f == HF::bf16) ? 2 : 1; }
KVGATE_HD constexpr int block_bytes(HF f) { return f == HF::q8_0 ? 34 : 18; }

// Bytes of one cell (token x KV head) in the codes region, for D >= 32 (block formats: D/32 blocks,
// scales embedded; E2M1 halves: two codes per byte). int8, the MX, NVFP4 and per-(token, head) halves
// keep their scales in a separate region (cell_scale_bytes).
KVGATE_HD constexpr int cell_bytes(HF f, int D) {
  return is_block32(f) ? (D / 32) * block_bytes(f) : is_e2m1(f) ? D / 2 : D * elem_bytes(f);
}
// Bytes of one cell's scales in the page's separate scales run (docs/FORMATS.md "Geometry"), for
// D >= 32: int8 2 (f16), the per-(token, head) halves 4 (binary32), mxfp8 / mxfp4 D/32 (one UE8M0
// per 32-block), nvfp4 D/16 (one E4M3 per 16-block); 0 for the others.
KVGATE_HD constexpr int cell_scale_bytes(HF f, int D) {
  return f == HF::int8 ? 2 : is_per_token_head(f) ? 4 : is_mx(f) ? D / 32 : f == HF::nvfp4 ? D / 16 : 0;
}

KVGATE_HD constexpr int gcd_c(int a, int b) { return b == 0 ? a : gcd_c(b, a % b); }

// Every half format has CUDA kernels: the store kernel (bit-exact with the CPU reference) and the
// element accessor load_elem (decode.cuh) that the generic decode kernel and the CUDA-core prefill
// kernel read through. The fast and tensor-core decode kernels (per-lane cell slices, decode.cuh
// Slice; decode_mma.cuh fragments) exist for every pair of the nine formats below, at head_dim
// 64/128/256 (has_pipelined_decode).
KVGATE_HD constexpr bool has_fast_kernels(HF f) {
  return f == HF::f32 || f == HF::f16 || f == HF::bf16 || f == HF::int8 || f == HF::fp8_e4m3 || f == HF::fp8_e5m2 ||
         f == HF::q8_0 || f == HF::q4_0 || f == HF::q4_0_rot;
}
// The 2026 halves with a tensor-core decode kernel only (decode_mma.cuh; no CUDA-core Slice), and
// only in the pairs has_pipelined_decode names: mxfp8, mxfp4, nvfp4, fp8_per_token_head,
// int8_per_token_head. fp8_block128 has none.
KVGATE_HD constexpr bool mma_only_half(HF f) { return is_mx(f) || f == HF::nvfp4 || is_per_token_head(f); }
// Halves whose codes convert to f16 exactly (int8, q8_0, q4_0 - 8, e4m3, e5m2, e2m1): the operands
// of the tensor-core decode kernel. A pair of two of them takes it where has_pipelined_decode holds.
KVGATE_HD constexpr bool narrow_code_half(HF f) {
  return f == HF::int8 || is_fp8(f) || is_block32(f) || mma_only_half(f);
}
// The (K, V) pairs whose fast or tensor-core decode kernels are instantiated (decode_launch.cuh
// kDecodeInstantiated) and chosen by supports_op at head_dim 64/128/256: every pair of the nine
// has_fast_kernels formats; each mma_only_half paired with itself; and mxfp8 K with mxfp4 V (the
// preset k_mxfp8_v_mxfp4). Any other pair holding a 2026 half (with an older half, or fp8_block128)
// decodes on the generic kernel at every head_dim (path "generic"), and nothing else is
// instantiated for it: each pair costs CI compile time.
KVGATE_HD constexpr bool has_pipelined_decode(HF k, HF v) {
  return (has_fast_kernels(k) && has_fast_kernels(v)) || (mma_only_half(k) && k == v) ||
         (k == HF::mxfp8 && v == HF::mxfp4);
}
// The half formats whose codes are scaled by the caller's (layer, K|V) FP32 scale (fp8 per tensor;
// nvfp4's global scale): the kernels fold K's into the query multiplier and V's into the output.
inline float applied_tensor_scale(HF f, float s) { return kvgate::info(f).per_tensor_scale ? s : 1.0f; }
// The per-KV-head scales a half's kernels read (docs/FORMATS.md "Static scales per KV head"): an fp8
// half takes the device table [n_kv_heads] of its layer (null: its one tensor scale on every head); a
// half that reads no caller scale ignores it. nvfp4 keeps one global scale per (layer, K|V): a table
// for it is refused (std::invalid_argument naming `op`), as the CPU store refuses it.
const float* applied_head_scales(HF f, const float* heads, const char* op);

#ifdef __CUDACC__
// The query multiplier of KV head kvh: the host's q_mul, or, with per-head K scales, the same product
// from that head's scale in the host's order (binary64 products, one rounding to binary32), so a
// table whose heads all hold s gives the bits of q_mul made from s.
__device__ __forceinline__ float head_q_mul(float q_mul, float sm_scale, const float* k_heads, int kvh) {
  return k_heads ? static_cast<float>(static_cast<double>(sm_scale) * 1.4426950408889634 * static_cast<double>(k_heads[kvh]))
                 : q_mul;
}
// The output multiplier of KV head kvh: the V tensor scale, or that head's V scale.
__device__ __forceinline__ float head_v_mul(float v_mul, const float* v_heads, int kvh) {
  return v_heads ? v_heads[kvh] : v_mul;
}
#endif

// Runtime HalfFormat -> template argument, one case per row of KVGATE_HALF_FORMATS. fn receives std::integral_constant<HalfFormat, F>.
template <class Fn>
decltype(auto) dispatch_half(HF f, Fn&& fn) {
  switch (f) {
#define KVGATE_DISPATCH_HALF_ROW(A, name, prefill_mma)                      \
  case HF::name:                                                             \
    return fn(std::integral_constant<HF, HF::name>{});
    KVGATE_HALF_FORMATS(KVGATE_DISPATCH_HALF_ROW, _)
#undef KVGATE_DISPATCH_HALF_ROW
  }
  throw std::invalid_argument("kvgate::cuda: unknown half format");
}

// 1/sqrt(n) exactly as FORMATS.md computes it: binary64 then RNE to binary32 (host side).
float hadamard_scale(int n);

// The attention-logit soft-cap in the kernels' base-2 score units: cap * log2(e) (0: none). A
// negative or non-finite cap is refused naming the op (host side, util.cu).
float softcap_base2(float cap, const char* op);

}  // namespace kvgate::cuda::detail
