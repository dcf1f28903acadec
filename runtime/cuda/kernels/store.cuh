// Quantize + append ("set rows") for every half format: one CTA per token row, the row staged in
// shared memory, Walsh-Hadamard rotation in place for q4_0_rot, then the format's codes written
// into the page slot given by the slot mapping. Bit-exact with kvgate::quantize_token.
#pragma once
#include <cstdint>

#include "common.cuh"
#include "numeric.cuh"

namespace kvgate::cuda::detail {

struct StoreLaunch {
  const float* rows = nullptr;     // [n_tokens][row_stride] (device)
  std::size_t row_stride = 0;      // floats
  const int* slot_mapping = nullptr;  // [n_tokens] block*block_size + slot; < 0 = skip (device)
  int n_tokens = 0;
  std::uint8_t* pool = nullptr;    // page p at pool + p*page_stride
  std::size_t page_stride = 0;
  int block_size = 0, n_kv_heads = 0, head_dim = 0;
  float tensor_scale = 1.0f;       // fp8 (and nvfp4's global scale)
  const float* head_scales = nullptr;  // fp8: [n_kv_heads] per-KV-head scales (device); null: tensor_scale
  float had_c = 1.0f;              // q4_0_rot: float(1/sqrt(double(D)))
};

template <HF F>
__global__ void __launch_bounds__(256) store_kernel(StoreLaunch a) {
  extern __shared__ float srow[];
  const int t = blockIdx.x;
  const int map = a.slot_mapping[t];
  if (map < 0) return;
  const int B = a.block_size, H = a.n_kv_heads, D = a.head_dim, HD = H * D;
  const int block = map / B, slot = map % B;
  std::uint8_t* page = a.pool + static_cast<std::size_t>(block) * a.page_stride;
  const float* src = a.rows + static_cast<std::size_t>(t) * a.row_stride;
  const int tid = threadIdx.x, nthr = blockDim.x;
  const std::size_t row0 = static_cast<std::size_t>(slot) * HD;

  if constexpr (F == HF::f32) {
    float* out = reinterpret_cast<float*>(page) + row0;
    for (int i = tid; i < HD; i += nthr) out[i] = src[i];
  } else if constexpr (F == HF::f16 || F == HF::bf16) {
    auto* out = reinterpret_cast<std::uint16_t*>(page) + row0;
    for (int i = tid; i < HD; i += nthr) out[i] = F == HF::f16 ? dev::f32_to_f16_rne(src[i]) : dev::f32_to_bf16_rne(src[i]);
  } else if constexpr (is_fp8(F)) {
    std::uint8_t* out = page + row0;
    for (int i = tid; i < HD; i += nthr) {
      // NaN keeps its sign through x/s on the CPU; the GPU divider returns a canonical +NaN.
      const float s = a.head_scales ? a.head_scales[i / D] : a.tensor_scale;  // element i's KV head
      const float y = isnan(src[i]) ? src[i] : __fdiv_rn(src[i], s);
      out[i] = F == HF::fp8_e4m3 ? dev::f32_to_fp8_e4m3(y) : dev::f32_to_fp8_e5m2(y);
    }
  } else {
    for (int i = tid; i < HD; i += nthr) srow[i] = src[i];
    __syncthreads();
    if constexpr (is_rot(F)) {
      // FORMATS.md q4_0_rot steps 1-2, per head; pairs of one level are independent, so the
      // parallel order gives the same binary32 results as the sequential loop.
      const int half = D / 2;
      for (int len = 1; len < D; len <<= 1) {
        for (int p = tid; p < H * half; p += nthr) {
          const int h = p / half, k = p % half;
          const int i = (k / len) * 2 * len + (k % len);
          float* c = srow + h * D;
          const float x = c[i], y = c[i + len];
          c[i] = __fadd_rn(x, y);
          c[i + len] = __fsub_rn(x, y);
        }
        __syncthreads();
      }
      for (int i = tid; i < HD; i += nthr) srow[i] = __fmul_rn(srow[i], a.had_c);
      __syncthreads();
    }
    const int lane = tid & 31, warp = tid >> 5, nwarps = nthr >> 5;
    if constexpr (F == HF::int8) {
      auto* codes = reinterpret_cast<std::int8_t*>(page) + row0;
      auto* scales = reinterpret_cast<std::uint16_t*>(page + static_cast<std::size_t>(B) * HD) +
                     static_cast<std::size_t>(slot) * H;
      for (int h = warp; h < H; h += nwarps) {
        const float* x = srow + h * D;
        float amax = 0.0f;
        for (int i = lane; i < D; i += 32) amax = fmaxf(amax, fabsf(x[i]));  // NaN ignored, as std::max
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        std::uint16_t s16 = 0;
        if (amax != 0.0f) s16 = dev::f16_scale_round_up(amax, 127);
        const float s = dev::f16_to_f32(s16);
        for (int i = lane; i < D; i += 32)
          codes[h * D + i] = (amax == 0.0f || isnan(x[i])) ? std::int8_t{0}
                                                           : static_cast<std::int8_t>(dev::rint_clamp(__fdiv_rn(x[i], s), -127, 127));
        if (lane == 0) scales[h] = s16;
      }
    } else if constexpr (F == HF::q8_0) {
      const int nb = HD / 32;
      std::uint8_t* base = page + static_cast<std::size_t>(slot) * nb * 34;
      for (int b = warp; b < nb; b += nwarps) {
        const float x = srow[b * 32 + lane];
        float amax = fabsf(x);
        if (!(amax == amax)) amax = 0.0f;
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        std::uint16_t d16 = 0;
        if (amax != 0.0f) d16 = dev::f16_scale_round_up(amax, 127);
        const float d = dev::f16_to_f32(d16);
        const int q = (amax == 0.0f || isnan(x)) ? 0 : dev::rint_clamp(__fdiv_rn(x, d), -127, 127);
        std::uint8_t* blk = base + b * 34;
        blk[2 + lane] = static_cast<std::uint8_t>(static_cast<std::int8_t>(q));
        if (lane == 0) {
          blk[0] = static_cast<std::uint8_t>(d16 & 0xFF);
          blk[1] = static_cast<std::uint8_t>(d16 >> 8);
        }
      }
    } else if constexpr (F == HF::mxfp8 || F == HF::mxfp4) {
      // One thread per 32-block, the CPU reference's sequential loop (FORMATS.md "mxfp8, mxfp4"):
      // codes [B][row code bytes], then the UE8M0 scales [B][HD/32].
      constexpr bool E4 = F == HF::mxfp8;
      const int nb = HD / 32, row_code_bytes = E4 ? HD : HD / 2;
      std::uint8_t* codes = page + static_cast<std::size_t>(slot) * row_code_bytes;
      std::uint8_t* scales = page + static_cast<std::size_t>(B) * row_code_bytes + static_cast<std::size_t>(slot) * nb;
      for (int b = tid; b < nb; b += nthr) {
        const float* x = srow + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i)
          if (fabsf(x[i]) > amax) amax = fabsf(x[i]);  // NaN elements are ignored
        const std::uint8_t sc = dev::mx_scale_code<E4 ? 8 : 2>(amax);
        scales[b] = sc;
        const float X = sc == 0xFF ? 1.0f : dev::e8m0_to_f32(sc);
        if constexpr (E4) {
          for (int i = 0; i < 32; ++i) {
            // x / X keeps a NaN's sign on the CPU; the GPU divider returns a canonical +NaN.
            const float y = isnan(x[i]) ? x[i] : __fdiv_rn(x[i], X);
            codes[b * 32 + i] = sc == 0xFF ? std::uint8_t{0} : dev::f32_to_fp8_e4m3(y);
          }
        } else {
          for (int i = 0; i < 32; i += 2) {
            const std::uint8_t lo = sc == 0xFF ? std::uint8_t{0} : dev::f32_to_e2m1(__fdiv_rn(x[i], X));
            const std::uint8_t hi = sc == 0xFF ? std::uint8_t{0} : dev::f32_to_e2m1(__fdiv_rn(x[i + 1], X));
            codes[(b * 32 + i) / 2] = static_cast<std::uint8_t>(lo | (hi << 4));
          }
        }
      }
    } else if constexpr (F == HF::nvfp4) {
      // One thread per 16-block (FORMATS.md "nvfp4"): sb = e4m3((amax / 6) / global), S = e4m3(sb) *
      // global in binary32, element = e2m1(x / S), S == 0: every code 0. Codes [B][HD/2], then the
      // E4M3 block scales [B][HD/16]; the global scale is the half's tensor scale.
      const int nb = HD / 16;
      const float global = a.tensor_scale;
      std::uint8_t* codes = page + static_cast<std::size_t>(slot) * (HD / 2);
      std::uint8_t* scales = page + static_cast<std::size_t>(B) * (HD / 2) + static_cast<std::size_t>(slot) * nb;
      for (int b = tid; b < nb; b += nthr) {
        const float* x = srow + b * 16;
        float amax = 0.0f;
        for (int i = 0; i < 16; ++i)
          if (fabsf(x[i]) > amax) amax = fabsf(x[i]);  // NaN elements are ignored
        const std::uint8_t sb = dev::f32_to_fp8_e4m3(__fdiv_rn(__fdiv_rn(amax, 6.0f), global));
        scales[b] = sb;
        const float S = __fmul_rn(dev::fp8_e4m3_to_f32(sb), global);
        for (int i = 0; i < 16; i += 2) {
          const std::uint8_t lo = S == 0.0f ? std::uint8_t{0} : dev::f32_to_e2m1(__fdiv_rn(x[i], S));
          const std::uint8_t hi = S == 0.0f ? std::uint8_t{0} : dev::f32_to_e2m1(__fdiv_rn(x[i + 1], S));
          codes[(b * 16 + i) / 2] = static_cast<std::uint8_t>(lo | (hi << 4));
        }
      }
    } else if constexpr (F == HF::fp8_per_token_head || F == HF::int8_per_token_head) {
      // One warp per cell (FORMATS.md "fp8_per_token_head and int8_per_token_head"): amax over the
      // finite elements (a max: exact in any order), s = amax / qmax in binary32, 1.0 where that is 0;
      // codes [B][H][D], then the binary32 scales [B][H].
      constexpr bool Fp8 = F == HF::fp8_per_token_head;
      std::uint8_t* codes = page + static_cast<std::size_t>(slot) * HD;
      std::uint8_t* scales = page + static_cast<std::size_t>(B) * HD + static_cast<std::size_t>(slot) * H * 4;
      for (int h = warp; h < H; h += nwarps) {
        const float* x = srow + h * D;
        float amax = 0.0f;
        for (int i = lane; i < D; i += 32)
          if (isfinite(x[i]) && fabsf(x[i]) > amax) amax = fabsf(x[i]);
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        float sc = __fdiv_rn(amax, Fp8 ? 448.0f : 127.0f);
        if (sc == 0.0f) sc = 1.0f;
        for (int i = lane; i < D; i += 32) {
          if constexpr (Fp8) {
            const float y = isnan(x[i]) ? x[i] : __fdiv_rn(x[i], sc);
            codes[h * D + i] = dev::f32_to_fp8_e4m3(y);
          } else {
            // NaN -> 0; clamp(y, -127, 127) then ties-to-even is rint then clamp (rint_clamp).
            codes[h * D + i] = isnan(x[i]) ? std::uint8_t{0}
                                           : static_cast<std::uint8_t>(static_cast<std::int8_t>(dev::rint_clamp(__fdiv_rn(x[i], sc), -127, 127)));
          }
        }
        if (lane < 4) scales[h * 4 + lane] = static_cast<std::uint8_t>(__float_as_uint(sc) >> (8 * lane));
      }
    } else if constexpr (F == HF::fp8_block128) {
      // One warp per 128-tile of the row (FORMATS.md "fp8_block128"): the fp8_per_token_head rule over
      // the tile; codes [B][H*D], then the binary32 scales [B][H*D/128].
      const int nb = HD / 128;
      std::uint8_t* codes = page + static_cast<std::size_t>(slot) * HD;
      std::uint8_t* scales = page + static_cast<std::size_t>(B) * HD + static_cast<std::size_t>(slot) * nb * 4;
      for (int b = warp; b < nb; b += nwarps) {
        const float* x = srow + b * 128;
        float amax = 0.0f;
        for (int i = lane; i < 128; i += 32)
          if (isfinite(x[i]) && fabsf(x[i]) > amax) amax = fabsf(x[i]);
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        float sc = __fdiv_rn(amax, 448.0f);
        if (sc == 0.0f) sc = 1.0f;
        for (int i = lane; i < 128; i += 32) {
          const float y = isnan(x[i]) ? x[i] : __fdiv_rn(x[i], sc);
          codes[b * 128 + i] = dev::f32_to_fp8_e4m3(y);
        }
        if (lane < 4) scales[b * 4 + lane] = static_cast<std::uint8_t>(__float_as_uint(sc) >> (8 * lane));
      }
    } else {  // q4_0, q4_0_rot
      const int nb = HD / 32;
      std::uint8_t* base = page + static_cast<std::size_t>(slot) * nb * 18;
      for (int b = warp; b < nb; b += nwarps) {
        const float x = srow[b * 32 + lane];
        // Signed extreme, lowest index on a tie, NaN never wins (the CPU's strict '>' scan).
        float key = fabsf(x);
        if (!(key == key)) key = -1.0f;
        int idx = lane;
        for (int o = 16; o > 0; o >>= 1) {
          const float k2 = __shfl_xor_sync(0xffffffffu, key, o);
          const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
          if (k2 > key || (k2 == key && i2 < idx)) {
            key = k2;
            idx = i2;
          }
        }
        const float m = __shfl_sync(0xffffffffu, x, idx);
        const float amax = key;
        int code = 8;
        std::uint16_t d16 = 0;
        if (amax > 0.0f) {
          const std::uint16_t mag = dev::f16_scale_round_up(amax, 8);
          d16 = m > 0.0f ? static_cast<std::uint16_t>(mag | 0x8000u) : mag;
          const float d = dev::f16_to_f32(d16);
          code = isnan(x) ? 8 : dev::rint_clamp(__fdiv_rn(x, d), -8, 7) + 8;
        }
        const int hi = __shfl_down_sync(0xffffffffu, code, 16);
        std::uint8_t* blk = base + b * 18;
        if (lane < 16) blk[2 + lane] = static_cast<std::uint8_t>(code | (hi << 4));
        if (lane == 0) {
          blk[0] = static_cast<std::uint8_t>(d16 & 0xFF);
          blk[1] = static_cast<std::uint8_t>(d16 >> 8);
        }
      }
    }
  }
}

}  // namespace kvgate::cuda::detail
