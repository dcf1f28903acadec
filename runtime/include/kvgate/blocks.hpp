// llama.cpp-compatible 32-element block layouts (docs/FORMATS.md). Plain structs, sizes pinned.
#pragma once
#include <cstdint>

namespace kvgate {

inline constexpr int kQBlock = 32;  // elements per q8_0 / q4_0 block
inline constexpr int kTileBlock = 128;  // elements per fp8_block128 tile (DeepSeek fp8_ds_mla's 1x128)

struct block_q8_0 {
  std::uint16_t d;        // binary16 scale, magnitude rounded upward
  std::int8_t qs[kQBlock];  // codes in [-127, 127]
};
static_assert(sizeof(block_q8_0) == 34, "q8_0 block must be 34 bytes");

struct block_q4_0 {
  std::uint16_t d;              // binary16 scale = -(signed extreme)/8, magnitude rounded upward
  std::uint8_t qs[kQBlock / 2];  // low nibble: element j, high nibble: element j+16
};
static_assert(sizeof(block_q4_0) == 18, "q4_0 block must be 18 bytes");

}  // namespace kvgate
