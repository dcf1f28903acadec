// The one list of half formats and the one list of presets, as X-macros (docs/CONTRIBUTING.md,
// "Add a half format" / "Add a preset"). Everything that enumerates formats at compile time reads
// these: the HalfFormat enum and the preset table (runtime/src/format.cpp), the per-preset gate
// rows of every gate family (gates/), the CUDA dispatch and instantiation files (runtime/cuda/,
// whose CMakeLists.txt parses this file), and the fmt tags of gates that cover every preset.
// Runtime code that only loops reads kvgate::all_half_formats() / kvgate::presets() instead.
//
// Usage: define a macro X(A, ...) taking the row's fields, then write KVGATE_PRESETS(X, a) (or
// KVGATE_HALF_FORMATS(X, a)); A is passed through unchanged to every row (a family's extra
// argument, e.g. the K half of a CUDA instantiation; pass _ when unused). Keep one row per line:
// CMake and the docs check (runtime/tests/format_docs_test.cpp) read the rows with a regex.
#pragma once

// X(A, name, prefill_mma): one row per half format, in enum order. The enum value is the half's
// code in KV files (docs/KV_FILE.md), so a new half format is appended, never inserted.
//   name         the HalfFormat enumerator and the name users type (--kv-k, k=<K>,v=<V>)
//   prefill_mma  mma: the CUDA tensor-core prefill kernel reads it as K (a prefill_mma_k_<name>.cu
//                instantiation is generated); none: it does not (those pairs take the CUDA-core kernel)
#define KVGATE_HALF_FORMATS(X, A) \
  X(A, f32, none)                 \
  X(A, f16, mma)                  \
  X(A, bf16, mma)                 \
  X(A, int8, mma)                 \
  X(A, fp8_e4m3, mma)             \
  X(A, fp8_e5m2, mma)             \
  X(A, q8_0, mma)                 \
  X(A, q4_0, mma)                 \
  X(A, q4_0_rot, mma)             \
  X(A, mxfp8, none)               \
  X(A, mxfp4, none)               \
  X(A, nvfp4, none)               \
  X(A, fp8_per_token_head, none)  \
  X(A, int8_per_token_head, none)  \
  X(A, fp8_block128, none)

// X(A, name, k, v, slot, kind): one row per preset, in the order every listing prints them.
//   name   the preset name (--kv <name>); gate IDs end in it (ENV.<name>, ORA.attn.<name>, ...)
//   k, v   its K and V half formats (names of KVGATE_HALF_FORMATS)
//   slot   a number unique among presets: gate families derive their per-preset seed from it
//          (base + 100 * slot), so a row's random draws do not move when rows are added. The
//          families' own mixed-pair rows use slots 10..16: a new preset takes the next free slot
//          from 20.
//   kind   what the gate families that do not cover every preset select on:
//          reference      f32 KV, the baseline model-level gates compare against (no MOD.tf2048/kl row)
//          homogeneous    every half is a float code or has data-driven scales, so storing 2^k x gives
//                         the same codes and 2^k scales (an INV.<name> homogeneity row)
//          tensor_scaled  a half uses the caller's per-tensor scale (fp8: its INV gates are written
//                         per half: INV.fp8, INV.fp8_e5m2; nvfp4: the FP32 global scale)
#define KVGATE_PRESETS(X, A)                            \
  X(A, f32, f32, f32, 1, reference)                      \
  X(A, f16, f16, f16, 2, homogeneous)                    \
  X(A, bf16, bf16, bf16, 3, homogeneous)                 \
  X(A, int8, int8, int8, 4, homogeneous)                 \
  X(A, fp8, fp8_e4m3, fp8_e4m3, 5, tensor_scaled)        \
  X(A, fp8_e5m2, fp8_e5m2, fp8_e5m2, 6, tensor_scaled)   \
  X(A, q8_0, q8_0, q8_0, 7, homogeneous)                 \
  X(A, q4_0, q4_0, q4_0, 8, homogeneous)                 \
  X(A, k8v4, int8, q4_0_rot, 9, homogeneous)            \
  X(A, mxfp8, mxfp8, mxfp8, 20, homogeneous)             \
  X(A, mxfp4, mxfp4, mxfp4, 21, homogeneous)             \
  X(A, k_mxfp8_v_mxfp4, mxfp8, mxfp4, 22, homogeneous)  \
  X(A, nvfp4, nvfp4, nvfp4, 23, tensor_scaled)          \
  X(A, fp8_per_token_head, fp8_per_token_head, fp8_per_token_head, 24, homogeneous) \
  X(A, int8_per_token_head, int8_per_token_head, int8_per_token_head, 25, homogeneous)

// Helpers every user needs. KVGATE_PRESET_TAG_ROW turns a row into its Catch2 tag, so
// "[gate:F]" KVGATE_PRESETS(KVGATE_PRESET_TAG_ROW, _) is the tag string of a gate over every preset.
#define KVGATE_PRESET_TAG_ROW(A, name, k, v, slot, kind) "[fmt:" #name "]"
#define KVGATE_PRESET_COUNT_ROW(A, name, k, v, slot, kind) +1
#define KVGATE_HALF_COUNT_ROW(A, name, prefill_mma) +1
