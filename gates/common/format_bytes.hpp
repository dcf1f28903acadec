// The byte formulas of docs/FORMATS.md ("Geometry" table), written out for the gates independently
// of the runtime's traits table: the STO byte-accounting gates (gates/storage) and the bytes-moved
// gates (gates/conformance) compare the runtime's figures with these.
#pragma once
#include <cstddef>

#include "kvgate/format.hpp"

namespace kvgate::gates {

// FORMATS.md "Geometry" table, per half page.
inline std::size_t expected_page_bytes(HalfFormat f, std::size_t B, std::size_t H, std::size_t D) {
  switch (f) {
    case HalfFormat::f32: return B * H * D * 4;
    case HalfFormat::f16:
    case HalfFormat::bf16: return B * H * D * 2;
    case HalfFormat::int8: return B * H * D + 2 * B * H;
    case HalfFormat::fp8_e4m3:
    case HalfFormat::fp8_e5m2: return B * H * D;
    case HalfFormat::q8_0: return B * (H * D / 32) * 34;
    case HalfFormat::q4_0:
    case HalfFormat::q4_0_rot: return B * (H * D / 32) * 18;
    case HalfFormat::mxfp8: return B * H * D + B * (H * D / 32);      // E4M3 codes, then UE8M0 scales
    case HalfFormat::mxfp4: return B * (H * D / 2) + B * (H * D / 32);  // E2M1 nibbles, then UE8M0 scales
    case HalfFormat::nvfp4: return B * (H * D / 2) + B * (H * D / 16);  // E2M1 nibbles, then E4M3 scales
    case HalfFormat::fp8_per_token_head:
    case HalfFormat::int8_per_token_head: return B * H * D + 4 * B * H;  // byte codes, then f32 scales [B][H]
    case HalfFormat::fp8_block128: return B * H * D + 4 * B * (H * D / 128);  // byte codes, then f32 scales per 128
  }
  return 0;
}

}  // namespace kvgate::gates
