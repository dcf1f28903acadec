// Whether the AVX2 fast paths run: the CPU has AVX2 and KVGATE_NO_AVX2 is unset. KVGATE_NO_AVX2=1
// forces the portable paths (ctest runs gate programs that way too, so both paths are covered).
// KVGATE_NO_AVX2=1 turns the AVX-512 kernels off as well.
#pragma once

#include <cstdlib>

namespace kvgate {

#if defined(__x86_64__) && defined(__GNUC__)
inline const bool kHaveAvx2 = __builtin_cpu_supports("avx2") && std::getenv("KVGATE_NO_AVX2") == nullptr;
// Whether the AVX-512 kernels run (a few hot loops of attention's int8 page read): the AVX2 paths
// run, the CPU has AVX-512F and KVGATE_NO_AVX512 is unset (ctest runs gate_model that way too, so
// the AVX2 kernels they replace stay covered on an AVX-512 host).
// (kHaveAvx2 is defined above it in every translation unit, so it is initialized first.)
inline const bool kHaveAvx512 =
    kHaveAvx2 && __builtin_cpu_supports("avx512f") && std::getenv("KVGATE_NO_AVX512") == nullptr;
#endif

}  // namespace kvgate
