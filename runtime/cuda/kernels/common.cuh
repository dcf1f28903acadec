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
KVGATE_HD constexpr int elem_bytes(HF f) { return f == HF::f32 ? 4 : (f == HF::f16 || f == HF::bf16) ? 2 : 1; }
KVGATE_HD constexpr int block_bytes(HF f) { return f == HF::q8_0 ? 34 : 18; }

// Bytes of one cell (token x KV head) in the codes region, for D >= 32 (block formats: D/32 blocks,
// scales embedded). int8 keeps its scale in a separate region (2 B per cell).
KVGATE_HD constexpr int cell_bytes(HF f, int D) { return is_block32(f) ? (D / 32) * block_bytes(f) : D * elem_bytes(f); }

KVGATE_HD constexpr int gcd_c(int a, int b) { return b == 0 ? a : gcd_c(b, a % b); }

// Half formats the CUDA kernels store and read. The others (mxfp8, mxfp4, nvfp4, fp8_per_token_head,
// int8_per_token_head: CPU backend only,
// docs/CUDA.md) are refused by supports_op (reason "format_unsupported") before anything dispatches,
// and no kernel is instantiated for them: dispatch_half throws and the decode launchers of a pair
// that holds one throw instead of launching.
KVGATE_HD constexpr bool has_device_kernels(HF f) {
  return f != HF::mxfp8 && f != HF::mxfp4 && f != HF::nvfp4 && f != HF::fp8_per_token_head &&
         f != HF::int8_per_token_head;
}

// Runtime HalfFormat -> template argument, one case per row of KVGATE_HALF_FORMATS. fn receives std::integral_constant<HalfFormat, F>.
template <class Fn>
decltype(auto) dispatch_half(HF f, Fn&& fn) {
  switch (f) {
#define KVGATE_DISPATCH_HALF_ROW(A, name, prefill_mma)                      \
  case HF::name:                                                             \
    if constexpr (has_device_kernels(HF::name)) return fn(std::integral_constant<HF, HF::name>{}); \
    else throw std::invalid_argument("kvgate::cuda: half format " #name " has no CUDA kernels (supports_op refuses it: format_unsupported)");
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
