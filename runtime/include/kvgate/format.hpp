// The KV format catalog: half formats (one for K, one for V), presets, page layouts as byte runs,
// capability checks and declared error envelopes. docs/FORMATS.md is the normative definition.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvgate/format_list.hpp"

namespace kvgate {

// One enumerator per row of KVGATE_HALF_FORMATS (kvgate/format_list.hpp), in its order.
#define KVGATE_HALF_ENUM_ROW(A, name, prefill_mma) name,
enum class HalfFormat : std::uint8_t { KVGATE_HALF_FORMATS(KVGATE_HALF_ENUM_ROW, _) };
#undef KVGATE_HALF_ENUM_ROW
inline constexpr int kHalfFormatCount = 0 KVGATE_HALF_FORMATS(KVGATE_HALF_COUNT_ROW, _);
inline constexpr int kPresetCount = 0 KVGATE_PRESETS(KVGATE_PRESET_COUNT_ROW, _);

// Geometry of one page of one half (K or V) of one layer.
struct PageGeometry {
  int block_size = 16;  // tokens per page
  int n_kv_heads = 1;   // H
  int head_dim = 64;    // D
  int row_elems() const { return n_kv_heads * head_dim; }
};

// A contiguous region of a page, e.g. the codes or the scales (what streaming moves).
struct ByteRun {
  std::string name;
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

// A format's codec for one token row (H*D floats, head-major) in and out of page slot `slot`;
// head_scale[n_kv_heads] holds the (layer, K|V) FP32 scale of each KV head: fp8 halves divide the
// elements of head h by head_scale[h]; nvfp4 takes head_scale[0] as its global scale (one per
// (layer, K|V): the store refuses per-head scales for it); the other formats ignore it.
using QuantizeTokenFn = void (*)(const PageGeometry& g, int slot, const float* row, const float* head_scale,
                                 std::uint8_t* page);
using DequantizeTokenFn = void (*)(const PageGeometry& g, int slot, const std::uint8_t* page, const float* head_scale,
                                   float* row);

// The declared per-element envelope as constants (docs/FORMATS.md, envelope_bound below):
// |x^ - x| <= max(rel |x| + scale s, floor), + the FP slack of one quotient and one product when
// fp_slack; q4 formats use scale_clamped for the opposite-side population that clamps to code 15.
struct EnvelopeConstants {
  double rel = 0;
  double scale = 0;
  double scale_clamped = 0;
  double floor = 0;
  bool fp_slack = false;
};

// The traits of one half format: one row per format in runtime/src/format.cpp (kInfo), read by the
// page layout, the codecs, the envelope, `kvgate formats` and the KV file code. Fields are in
// designated-initializer order.
struct HalfFormatInfo {
  HalfFormat id;
  int block_elems;               // elements per code block: 1, kQBlock for the 32-block formats, 16 (nvfp4)
  std::size_t block_bytes;       // bytes per block: the element size, sizeof(block_q8_0 / block_q4_0), or
                                 // the code bytes of one block when its scale lives in a scales run
  std::size_t cell_scale_bytes;  // bytes per cell (token x kv head) of the page's "scales" run; 0: none
  std::size_t block_scale_bytes; // bytes per block of the page's "scales" run (MX); 0: none or embedded
  bool rotated;                  // a Walsh-Hadamard rotation per head before quantizing
  std::string_view name;
  std::string_view code_type;          // element code: "f32", "f16", "int8", "e4m3fn", "q4 nibble", ...
  std::string_view scale_granularity;  // "none", "per cell (token x kv head)", "per tensor (layer, K|V)", "per 32-block of the token row"
  std::string_view scale_dtype;        // "-", "f16", "f32"
  std::string_view rotation;           // "none" or "walsh-hadamard per head"
  std::string_view storage_precision;  // what is kept in memory
  std::string_view transfer_precision; // what moves between pools / to disk
  std::string_view execution_precision;  // what attention computes in
  std::string_view envelope;           // the error envelope, as text for reports
  bool per_token_scales;               // needs a scales region that must be persisted/swapped with codes
  bool per_tensor_scale;               // uses the caller's (layer, K|V) FP32 scale (fp8: one per KV head)
  EnvelopeConstants env;
  QuantizeTokenFn quantize_token;      // the page writer of one token row
  DequantizeTokenFn dequantize_token;  // the page reader of one token row (scalar reference)
};

const HalfFormatInfo& info(HalfFormat f);
std::string_view name(HalfFormat f);
std::optional<HalfFormat> parse_half(std::string_view s);
std::span<const HalfFormat> all_half_formats();

// Capability of a half format for a geometry; `reason` is a stable machine-readable code.
struct Capability {
  bool ok = true;
  std::string reason;  // e.g. "head_dim_not_power_of_two", "row_not_multiple_of_32"
  std::string detail;  // one human sentence
};
Capability supports(HalfFormat f, const PageGeometry& g);

std::size_t page_bytes(HalfFormat f, const PageGeometry& g);
std::vector<ByteRun> page_runs(HalfFormat f, const PageGeometry& g);
// Bytes per cell (one token x one KV head) = page_bytes / (block_size * n_kv_heads); fractional
// for 32-block formats with head_dim < 32.
double bytes_per_cell(HalfFormat f, const PageGeometry& g);
// Byte ranges of the page that hold token `slot` (for parity checks of used slots only).
std::vector<ByteRun> token_ranges(HalfFormat f, const PageGeometry& g, int slot);

// --- Head slices of a page (tensor parallelism: a rank's store holds KV heads [head0, head0 + n)) ---
// Every region of a page (page_runs: "codes", "blocks", "scales") is token-major with a row per
// token that is head-major: the row of H*D elements in block_elems-element blocks of block_bytes
// (codes/blocks), then per block block_scale_bytes (MX, nvfp4, fp8_block128 scales) or per head
// cell_scale_bytes (int8, *_per_token_head scales). The bytes of heads [head0, head0 + n) are the
// same sub-range of every row when head0*D and n*D are whole blocks; a page of those n heads alone
// (geometry {B, n, D}) holds exactly those sub-ranges, row after row. Why heads [head0, head0 + n)
// of format f cannot be cut out of a page of geometry `full` ("" when they can).
std::string head_slice_refusal(HalfFormat f, const PageGeometry& full, int head0, int n_heads);
// Copies heads [head0, head0 + n_heads) of every slot of a page of geometry `full` into a page of
// geometry {B, n_heads, D} (rank_page, page_bytes of that geometry), and the inverse (writes only
// those heads' bytes of full_page). Throw std::invalid_argument with head_slice_refusal's reason.
void copy_head_slice(HalfFormat f, const PageGeometry& full, int head0, int n_heads, const std::uint8_t* full_page,
                     std::uint8_t* rank_page);
void place_head_slice(HalfFormat f, const PageGeometry& full, int head0, int n_heads, const std::uint8_t* rank_page,
                      std::uint8_t* full_page);

// --- K/V pairs and presets ---------------------------------------------------------------
struct KvFormat {
  HalfFormat k = HalfFormat::f16;
  HalfFormat v = HalfFormat::f16;
  bool operator==(const KvFormat&) const = default;
  std::string name() const;  // preset name when it is one, else "k=<k>,v=<v>"
};

struct Preset {
  std::string_view name;
  KvFormat fmt;
};
std::span<const Preset> presets();
// Accepts a preset name ("fp8" = fp8_e4m3), or "k=<half>,v=<half>".
std::optional<KvFormat> parse_kv_format(std::string_view s);
std::string known_formats_text();  // for error messages

// --- Codecs: one token row (H*D floats, head-major) in and out of page slot `slot` -----------
// head_scales: one FP32 scale per KV head (n_kv_heads entries, else std::invalid_argument); only
// fp8 halves (per head) and nvfp4 (head 0's, its global scale) use them. The overloads with one
// tensor_scale give every head that scale (the per-tensor case).
void quantize_token(HalfFormat f, const PageGeometry& g, int slot, const float* row, std::span<const float> head_scales,
                    std::uint8_t* page);
void dequantize_token(HalfFormat f, const PageGeometry& g, int slot, const std::uint8_t* page,
                      std::span<const float> head_scales, float* row);
void quantize_token(HalfFormat f, const PageGeometry& g, int slot, const float* row, float tensor_scale,
                    std::uint8_t* page);
void dequantize_token(HalfFormat f, const PageGeometry& g, int slot, const std::uint8_t* page, float tensor_scale,
                      float* row);

// In-place normalized Walsh-Hadamard transform of n (power of two) floats, in the exact order of
// docs/FORMATS.md; it is its own inverse.
void hadamard_normalized(float* x, int n);

// --- Declared envelope -------------------------------------------------------------------
// Bound on |x_hat - x| for one element with stored scale `scale` (the cell/block scale as stored,
// or the per-tensor scale for fp8). For q4_0/q4_0_rot `clamped` selects the opposite-side
// population (code 15 by clamping). For q4_0_rot the bound is in the rotated domain.
double envelope_bound(HalfFormat f, float x, float scale, bool clamped = false);

}  // namespace kvgate
