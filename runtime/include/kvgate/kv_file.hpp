// The versioned KV file (docs/KV_FILE.md has the byte table): a fixed 2048-byte header (magic,
// version, K and V half formats, rotation kinds, per-layer fp8 scales, model fingerprint, shape,
// block size, used tokens, byte size and xxHash64 of every region), then (version 4) the
// layer-formats region (each layer's K/V half formats and rotations: a per-layer map, --kv-layers),
// the token ids, the KV body (codes) and the scales region (every per-token scale: int8 cell
// scales, q8_0/q4_0 block scales), then (version 3) the head-scales region: the fp8 scale of every
// (layer, K|V, KV head).
// Written atomically (atomic_file.hpp).
//
// Reading verifies everything before a byte reaches the store: structure and region sizes, the
// checksum of every region (a mismatch names the region), the version rules (version 1 has no
// scales region and is read only for formats without per-token scales), and compatibility with
// the run (model, format, rotation, shape, per-tensor scales). Every refusal names the file, its
// version and format, and what to do.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kvgate/format.hpp"
#include "kvgate/kv_store.hpp"

namespace kvgate {

inline constexpr char kKvFileMagic[8] = {'K', 'V', 'G', 'A', 'T', 'E', 'K', 'V'};
inline constexpr std::uint32_t kKvFileVersion = 5;  // written for every format, per-layer map and layout
inline constexpr std::uint32_t kKvFileOldestVersion = 1;
inline constexpr std::size_t kKvFileHeaderBytes = 2048;
inline constexpr int kKvFileMaxLayers = 224;  // per-tensor scale slots in the header
inline constexpr std::size_t kKvFileFingerprintBytes = 32;

enum class KvRotation : std::uint8_t { none = 0, walsh_hadamard = 1 };
KvRotation rotation_of(HalfFormat f);
std::string_view rotation_name(KvRotation r);

class KvFileError : public std::runtime_error {
 public:
  enum class Kind { io, corrupt, truncated, version, mismatch };
  KvFileError(Kind kind, std::string region, const std::string& message)
      : std::runtime_error(message), kind_(kind), region_(std::move(region)) {}
  Kind kind() const { return kind_; }
  // "header", "layer_formats", "tokens", "body", "scales", "head_scales" for damage inside a
  // region; empty otherwise.
  const std::string& region() const { return region_; }

 private:
  Kind kind_;
  std::string region_;
};

struct KvFileHeader {
  std::uint32_t version = kKvFileVersion;
  HalfFormat k_format = HalfFormat::f16;
  HalfFormat v_format = HalfFormat::f16;
  KvRotation k_rotation = KvRotation::none;
  KvRotation v_rotation = KvRotation::none;
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  // Version 5: what the rows hold (KvLayout: kv_heads, or the MLA latent cache: the K half the
  // latent, the V half the RoPE key) and the V half's row width per head; before version 5
  // kv_heads and head_dim. A parsed file always has v_head_dim >= 1.
  KvLayout layout = KvLayout::kv_heads;
  int v_head_dim = 0;  // 0 in a writer's header: head_dim
  int block_size = 0;
  int used_tokens = 0;  // tokens whose K/V rows the body holds
  int token_count = 0;  // ids in the tokens region: the transcript (>= used_tokens)
  std::uint64_t tokens_bytes = 0, body_bytes = 0, scales_bytes = 0;
  std::uint64_t tokens_xxh64 = 0, body_xxh64 = 0, scales_xxh64 = 0;
  std::uint64_t head_scales_bytes = 0, head_scales_xxh64 = 0;  // version 3: the head-scales region
  std::uint64_t layer_formats_bytes = 0, layer_formats_xxh64 = 0;  // version 4: the layer-formats region
  std::string fingerprint;              // Model::fingerprint (<= 32 ASCII bytes)
  // The store's scales per KV head, [n_layers * n_kv_heads] (l * H + h): fp8 halves decode with
  // them, nvfp4 uses them as its global scale. A parsed file always has that size (before version 3
  // each layer's one header scale on every head); a writer may give [n_layers] (every head the layer's).
  std::vector<float> k_scale, v_scale;
  // Each layer's K/V half formats, [n_layers] (version 4's layer-formats region). A parsed file
  // always has that size (before version 4 the header's one format on every layer); k_format and
  // v_format are layer 0's. A writer may leave it empty: every layer holds format().
  std::vector<KvFormat> layer_formats;
  KvFormat format() const { return {k_format, v_format}; }
  // The page geometry of half 0 (K) or 1 (V) of the file's rows.
  PageGeometry half_geometry(int half) const {
    return {block_size, n_kv_heads, half == 1 && v_head_dim > 0 ? v_head_dim : head_dim};
  }
  KvFormat layer_format(int layer) const {
    return layer_formats.empty() ? format() : layer_formats.at(static_cast<std::size_t>(layer));
  }
  bool uniform() const;             // every layer holds format()
  std::string format_name() const;  // format().name(), or the per-layer map's name (kv_layer_map_name)
};

// The header's 2048 bytes with its checksum filled in (any version; for tests that write old layouts).
// Version 3: its head-scales size and checksum are those of encode_kv_head_scales(h).
std::string encode_kv_header(const KvFileHeader& h);
// Version 3's head-scales region of h.k_scale/v_scale (layer-major: K's n_kv_heads f32, then V's);
// empty before version 3.
std::string encode_kv_head_scales(const KvFileHeader& h);
// Version 4's layer-formats region: per layer K code, V code, K rotation, V rotation (one byte
// each, the rotation each format needs); empty before version 4.
std::string encode_kv_layer_formats(const KvFileHeader& h);
std::uint64_t kv_checksum(const void* data, std::size_t n);  // xxHash64, seed 0

// Region sizes that a header's shape, format, token counts and version imply.
struct KvRegionSizes {
  std::uint64_t layer_formats = 0, tokens = 0, body = 0, scales = 0, head_scales = 0;
};
KvRegionSizes kv_region_sizes(const KvFileHeader& h);

struct KvFile {
  std::string path;  // for messages
  KvFileHeader header;
  std::vector<int> tokens;       // token_count ids
  std::vector<std::uint8_t> body;    // codes: per layer, K then V, token-major
  std::vector<std::uint8_t> scales;  // per layer, K then V, token-major (empty in version 1)
  std::size_t file_bytes = 0;
  std::string format_name() const { return header.format_name(); }
};

// The current-version bytes of a file holding the first n_tokens K/V rows of sequence `s` (read
// from the host copy) and the transcript `tokens` (size >= n_tokens).
std::string encode_kv_file(const PagedKvStore& store, SeqId s, int n_tokens, std::span<const int> tokens,
                           std::string_view fingerprint);

// A pipeline split (EngineOptions::pipeline_stages) keeps each stage's layers in its own store.
// The stages, in layer order (stage i's StoreConfig::first_layer is the layers of stages 0..i-1),
// read and write the file a single store of every layer would: the body and scales regions are
// layer-major, so a file saved from a split run hydrates into an unsplit one and the reverse.
struct KvStageView {
  const PagedKvStore* store = nullptr;
  SeqId seq = 0;
};
struct KvStageTarget {
  PagedKvStore* store = nullptr;
  SeqId seq = 0;
};
std::string encode_kv_file(std::span<const KvStageView> stages, int n_tokens, std::span<const int> tokens,
                           std::string_view fingerprint);
void save_kv_file(const std::string& path, std::span<const KvStageView> stages, int n_tokens,
                  std::span<const int> tokens, std::string_view fingerprint);
void check_kv_file_compatible(const KvFile& f, std::span<const KvStageView> stages, std::string_view fingerprint);
void restore_kv_file(const KvFile& f, std::span<const KvStageTarget> stages, int n_tokens, std::string_view fingerprint);
// encode_kv_file + write_file_atomic.
void save_kv_file(const std::string& path, const PagedKvStore& store, SeqId s, int n_tokens,
                  std::span<const int> tokens, std::string_view fingerprint);

// Structure, region sizes, checksums and version rules; throws KvFileError.
KvFile parse_kv_file(std::span<const std::uint8_t> bytes, const std::string& path);
KvFile read_kv_file(const std::string& path);

// Refuses (KvFileError, kind mismatch) a file that cannot be restored into `store` for the model
// with `fingerprint`: model, K/V formats of every layer, rotations, layers, KV heads, head_dim,
// per-tensor scales.
void check_kv_file_compatible(const KvFile& f, const PagedKvStore& store, std::string_view fingerprint);

// How many leading tokens of `prompt` can come from the file: the longest common prefix of the
// prompt and the file's first used_tokens ids, leaving at least one prompt token to prefill.
int hydratable_prefix(const KvFile& f, std::span<const int> prompt);

// Checks compatibility, then restores the first n_tokens (<= used_tokens) K/V rows into the empty
// sequence `s` through the store's restore writer.
void restore_kv_file(const KvFile& f, PagedKvStore& store, SeqId s, int n_tokens, std::string_view fingerprint);

}  // namespace kvgate
