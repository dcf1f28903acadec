// Half formats and their pages, written from docs/FORMATS.md only (never from runtime/).
// The ORA gates compare these bytes with the runtime's: every store here follows the page
// to the bit; reads are the literal one-multiply dequant.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvgate_oracle/scalar.hpp"

namespace kvgate_oracle {

enum class Half { f32, f16, bf16, int8, fp8_e4m3, fp8_e5m2, q8_0, q4_0, q4_0_rot, mxfp8, mxfp4, nvfp4,
                  fp8_per_token_head, int8_per_token_head, fp8_block128 };

// Names as in FORMATS.md; "fp8" is accepted as fp8_e4m3 (the preset alias).
std::optional<Half> parse_half(std::string_view name);
const char* half_name(Half h);
inline constexpr Half kAllHalves[] = {Half::f32,      Half::f16,      Half::bf16,
                                      Half::int8,     Half::fp8_e4m3, Half::fp8_e5m2,
                                      Half::q8_0,     Half::q4_0,     Half::q4_0_rot,
                                      Half::mxfp8,    Half::mxfp4,    Half::nvfp4,
                                      Half::fp8_per_token_head,       Half::int8_per_token_head,
                                      Half::fp8_block128};

// Presets: the table of FORMATS.md "Presets and pairs", typed from the page (src/formats.cpp).
struct KvPair { Half k; Half v; };
std::optional<KvPair> parse_preset(std::string_view name);
std::string pair_name(KvPair p);  // the preset name if it is one, else "k=<K>,v=<V>"

bool is_block32(Half h);  // q8_0, q4_0, q4_0_rot, mxfp8, mxfp4: 32-blocks over the flattened token row
bool is_mx(Half h);       // mxfp8, mxfp4: codes run, then a scales run of one UE8M0 byte per 32-block
// nvfp4: 16-blocks over the token row; codes run, then a scales run of one E4M3 byte per 16-block,
// and the per-tensor FP32 global scale (tensor_scale).

// Geometry: a page holds block_size tokens x n_kv_heads cells x head_dim elements.
struct PageShape {
    int block_size;  // B tokens
    int n_kv_heads;  // H
    int head_dim;    // D
};

// Why a geometry is refused ("row_not_multiple_of_32", "head_dim_not_power_of_two",
// "bad_shape"), or nullopt when it is accepted. The functions below throw
// std::invalid_argument with this reason as message on a refused geometry.
std::optional<std::string> refusal_reason(Half h, PageShape s);

size_t page_bytes(Half h, PageShape s);
double bytes_per_cell(Half h, PageShape s);  // page_bytes / (B·H), fractional for D < 32 blocks

// (offset, length) byte ranges of the page that belong to token slot `slot`:
// one range (codes, or 32-blocks with their embedded d) or two for int8, the per-token-head formats,
// MX and nvfp4 (codes, then scales).
std::vector<std::pair<size_t, size_t>> slot_byte_ranges(Half h, PageShape s, int slot);

// x[n_tokens][H][D] -> a zeroed page of page_bytes with slots 0..n_tokens-1 written.
// tensor_scale: the per-tensor binary32 scale (fp8; nvfp4's global scale).
std::vector<uint8_t> quantize_page(Half h, PageShape s, const float* x, int n_tokens,
                                   float tensor_scale);
// page (FORMATS.md layout) -> out[n_tokens][H][D].
std::vector<float> dequantize_page(Half h, PageShape s, const uint8_t* page, int n_tokens,
                                   float tensor_scale);
// Static scales per KV head (FORMATS.md "Static scales per KV head"): head_scales[H], fp8 elements
// of head h divided (stored) and multiplied (read) by head_scales[h]; nvfp4 takes one global scale
// (every entry equal, else std::invalid_argument). The tensor_scale overloads give every head it.
std::vector<uint8_t> quantize_page(Half h, PageShape s, const float* x, int n_tokens,
                                   const std::vector<float>& head_scales);
std::vector<float> dequantize_page(Half h, PageShape s, const uint8_t* page, int n_tokens,
                                   const std::vector<float>& head_scales);

// Scale governing element (slot, h, i) as stored: int8 the cell's f16 scale; fp8_per_token_head /
// int8_per_token_head the cell's f32 scale; fp8_block128 its 128-tile's f32 scale; q8_0/q4_0/q4_0_rot
// the signed f16 d of its 32-block (for q4_0_rot, element i of the *rotated* cell);
// MX the block's X = 2^(e8m0 - 127); nvfp4 the block's S = e4m3 scale x global (binary32); fp8
// tensor_scale; float formats 0.
float element_scale(Half h, PageShape s, const uint8_t* page, int slot, int head, int i,
                    float tensor_scale);

// Slot-level building blocks: one token row row[H*D] (head-major) into / out of slot `slot`
// of a page, touching only that slot's bytes (slot_byte_ranges).
void quantize_slot(Half h, PageShape s, const float* row /*[H*D]*/, uint8_t* page, int slot,
                   float tensor_scale);
void dequantize_slot(Half h, PageShape s, const uint8_t* page, int slot, float tensor_scale,
                     float* row /*[H*D]*/);
void quantize_slot(Half h, PageShape s, const float* row /*[H*D]*/, uint8_t* page, int slot,
                   const std::vector<float>& head_scales);
void dequantize_slot(Half h, PageShape s, const uint8_t* page, int slot, const std::vector<float>& head_scales,
                     float* row /*[H*D]*/);

// 32-block kernels: x[32] -> 34 / 18 bytes, and back.
void quantize_block_q8_0(const float* x /*[32]*/, uint8_t* blk /*[34]*/);
void dequantize_block_q8_0(const uint8_t* blk, float* x /*[32]*/);
void quantize_block_q4_0(const float* x /*[32]*/, uint8_t* blk /*[18]*/);
void dequantize_block_q4_0(const uint8_t* blk, float* x /*[32]*/);
// MX 32-block: x[32] -> the UE8M0 scale code and 32 element codes (E4M3 bytes for mxfp8, E2M1
// nibbles, one per byte, for mxfp4).
uint8_t quantize_block_mx(Half h, const float* x /*[32]*/, uint8_t* codes /*[32]*/);
// nvfp4 16-block: x[16], global scale g -> the E4M3 block-scale code and 16 E2M1 codes.
uint8_t quantize_block_nvfp4(const float* x /*[16]*/, float g, uint8_t* codes /*[16]*/);
// int8 cell: x[D] -> codes[D] and the f16 scale bits.
void quantize_cell_int8(const float* x, int D, int8_t* codes, uint16_t* scale);
// fp8_per_token_head / int8_per_token_head cell: x[D] -> codes[D] (e4m3fn bytes / int8 as bytes);
// returns the binary32 scale s = amax/448 (/127) over the finite elements, 1.0 when that is zero.
float quantize_cell_per_token_head(Half h, const float* x, int D, uint8_t* codes);
// fp8_block128 tile: x[128] -> 128 e4m3fn codes; returns the tile's binary32 scale (the
// fp8_per_token_head rule over the tile).
float quantize_tile_fp8_block128(const float* x /*[128]*/, uint8_t* codes /*[128]*/);

// Normalized Walsh–Hadamard, FORMATS.md q4_0_rot steps 1-2 in their exact op order
// (binary32). n must be a power of two. Its own inverse up to rounding.
void hadamard(float* x, int n);
// Reference: explicit (H_n / sqrt(n)) · x in binary64, H_n the Sylvester matrix
// H[i][j] = (-1)^popcount(i & j) — the matrix the butterfly above computes.
void hadamard_f64(double* x, int n);

}  // namespace kvgate_oracle
