// Whether the AVX2 fast paths run: the CPU has AVX2 and KVGATE_NO_AVX2 is unset. KVGATE_NO_AVX2=1
// forces the portable paths (ctest runs gate programs that way too, so both paths are covered).
#pragma once

#include <cstdlib>

namespace kvgate {

#if defined(__x86_64__) && defined(__GNUC__)
inline const bool kHaveAvx2 = __builtin_cpu_supports("avx2") && std::getenv("KVGATE_NO_AVX2") == nullptr;
#endif

}  // namespace kvgate
