#include "kvgate/kv_file.hpp"
#include "kvgate/limits.hpp"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

#include "kvgate/atomic_file.hpp"
#include "kvgate/blocks.hpp"
#include "kvgate/kv_layer_map.hpp"

namespace kvgate {

namespace {

// --- header field offsets (docs/KV_FILE.md) ----------------------------------------------------
constexpr std::size_t kOffVersion = 8, kOffHeaderBytes = 12, kOffHeaderHash = 16;
constexpr std::size_t kOffKFormat = 24, kOffVFormat = 25, kOffKRot = 26, kOffVRot = 27;
constexpr std::size_t kOffLayers = 28, kOffHeads = 32, kOffHeadDim = 36, kOffBlock = 40;
constexpr std::size_t kOffUsed = 44, kOffTokenCount = 48, kOffReserved0 = 52;
constexpr std::size_t kOffTokensBytes = 56, kOffBodyBytes = 64, kOffScalesBytes = 72;
constexpr std::size_t kOffTokensHash = 80, kOffBodyHash = 88, kOffScalesHash = 96;
constexpr std::size_t kOffFingerprint = 104, kOffScaleCount = 136, kOffHeadScalesBytes = 140, kOffHeadScalesHash = 148;
constexpr std::size_t kOffLayerFormatsBytes = 156, kOffLayerFormatsHash = 164;  // version 4
constexpr std::size_t kOffLayout = 172, kOffVHeadDim = 176;  // version 5
constexpr std::size_t kOffReserved1 = 156, kOffReserved4 = 172, kOffReserved5 = 180, kOffScales = 256;
constexpr std::size_t kLayerFormatBytes = 4;  // K code, V code, K rotation, V rotation
static_assert(kOffScales + 8 * kKvFileMaxLayers == kKvFileHeaderBytes);

void put32(std::string& b, std::size_t off, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[off + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
void put64(std::string& b, std::size_t off, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) b[off + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
std::uint32_t get32(const std::uint8_t* b, std::size_t off) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(b[off + i]) << (8 * i);
  return v;
}
std::uint64_t get64(const std::uint8_t* b, std::size_t off) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(b[off + i]) << (8 * i);
  return v;
}

// Bytes one token of one half puts in the body (codes) and in the scales region.
struct TokenBytes {
  std::size_t codes = 0, scales = 0;
  std::size_t qblock = 0;  // llama.cpp block size (34 / 18) for 32-block formats, else 0
};
TokenBytes token_bytes(HalfFormat f, const PageGeometry& g) {
  TokenBytes t;
  for (const ByteRun& r : token_ranges(f, g, 0)) {
    if (r.name == "blocks") {
      t.qblock = f == HalfFormat::q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0);
      const std::size_t nb = r.bytes / t.qblock;
      t.codes += nb * (t.qblock - sizeof(std::uint16_t));
      t.scales += nb * sizeof(std::uint16_t);
    } else if (r.name == "scales") {
      t.scales += r.bytes;
    } else {
      t.codes += r.bytes;
    }
  }
  return t;
}

std::string describe(const KvFileHeader& h) {
  return "version " + std::to_string(h.version) + ", format " + h.format_name();
}

std::string quoted(const std::string& path) { return "KV file '" + path + "'"; }

[[noreturn]] void fail(KvFileError::Kind k, const std::string& region, const std::string& msg) {
  throw KvFileError(k, region, msg);
}

bool valid_half_code(std::uint8_t c) { return c < kHalfFormatCount; }

std::string fmt_float(float x) {
  std::ostringstream os;
  os.precision(9);
  os << x;
  return os.str();
}

}  // namespace

KvRotation rotation_of(HalfFormat f) { return f == HalfFormat::q4_0_rot ? KvRotation::walsh_hadamard : KvRotation::none; }

std::string_view rotation_name(KvRotation r) {
  switch (r) {
    case KvRotation::none: return "none";
    case KvRotation::walsh_hadamard: return "walsh-hadamard";
  }
  return "unknown";
}

std::uint64_t kv_checksum(const void* data, std::size_t n) { return XXH64(data, n, 0); }

namespace {
// Scale of (layer l, head hd) from a header's k_scale/v_scale: [n_layers * n_kv_heads] per head,
// [n_layers] per layer, else 1.0 (what an unused half records).
float header_scale(const std::vector<float>& s, const KvFileHeader& h, int l, int hd) {
  const std::size_t H = static_cast<std::size_t>(std::max(h.n_kv_heads, 1));
  if (s.size() == static_cast<std::size_t>(h.n_layers) * H) return s[static_cast<std::size_t>(l) * H + static_cast<std::size_t>(hd)];
  if (s.size() == static_cast<std::size_t>(h.n_layers)) return s[static_cast<std::size_t>(l)];
  return 1.0f;
}
}  // namespace

bool KvFileHeader::uniform() const {
  return std::all_of(layer_formats.begin(), layer_formats.end(), [&](const KvFormat& f) { return f == format(); });
}

std::string KvFileHeader::format_name() const {
  if (uniform()) return format().name();
  KvLayerMap m;
  for (int l = 0; l < n_layers; ++l) m.push_back(layer_format(l));
  return "per-layer map " + kv_layer_map_name(m);
}

std::string encode_kv_layer_formats(const KvFileHeader& h) {
  if (h.version < 4) return {};
  std::string out;
  for (int l = 0; l < h.n_layers; ++l) {
    const KvFormat f = h.layer_format(l);
    out.push_back(static_cast<char>(f.k));
    out.push_back(static_cast<char>(f.v));
    out.push_back(static_cast<char>(rotation_of(f.k)));
    out.push_back(static_cast<char>(rotation_of(f.v)));
  }
  return out;
}

std::string encode_kv_head_scales(const KvFileHeader& h) {
  if (h.version < 3) return {};
  std::string out;
  out.reserve(static_cast<std::size_t>(h.n_layers) * 2 * static_cast<std::size_t>(h.n_kv_heads) * 4);
  for (int l = 0; l < h.n_layers; ++l)
    for (const std::vector<float>* s : {&h.k_scale, &h.v_scale})
      for (int hd = 0; hd < h.n_kv_heads; ++hd) {
        const std::uint32_t u = std::bit_cast<std::uint32_t>(header_scale(*s, h, l, hd));
        for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xFF));
      }
  return out;
}

std::string encode_kv_header(const KvFileHeader& h) {
  if (h.n_layers < 1 || h.n_layers > kKvFileMaxLayers)
    throw KvFileError(KvFileError::Kind::io, "", "KV file: " + std::to_string(h.n_layers) +
                                                     " layers do not fit the header (1.." +
                                                     std::to_string(kKvFileMaxLayers) + ")");
  if (h.fingerprint.size() > kKvFileFingerprintBytes)
    throw KvFileError(KvFileError::Kind::io, "", "KV file: model fingerprint longer than 32 bytes");
  std::string b(kKvFileHeaderBytes, '\0');
  std::memcpy(b.data(), kKvFileMagic, sizeof kKvFileMagic);
  put32(b, kOffVersion, h.version);
  put32(b, kOffHeaderBytes, static_cast<std::uint32_t>(kKvFileHeaderBytes));
  b[kOffKFormat] = static_cast<char>(h.k_format);
  b[kOffVFormat] = static_cast<char>(h.v_format);
  b[kOffKRot] = static_cast<char>(h.k_rotation);
  b[kOffVRot] = static_cast<char>(h.v_rotation);
  put32(b, kOffLayers, static_cast<std::uint32_t>(h.n_layers));
  put32(b, kOffHeads, static_cast<std::uint32_t>(h.n_kv_heads));
  put32(b, kOffHeadDim, static_cast<std::uint32_t>(h.head_dim));
  put32(b, kOffBlock, static_cast<std::uint32_t>(h.block_size));
  put32(b, kOffUsed, static_cast<std::uint32_t>(h.used_tokens));
  put32(b, kOffTokenCount, static_cast<std::uint32_t>(h.token_count));
  put64(b, kOffTokensBytes, h.tokens_bytes);
  put64(b, kOffBodyBytes, h.body_bytes);
  put64(b, kOffScalesBytes, h.scales_bytes);
  put64(b, kOffTokensHash, h.tokens_xxh64);
  put64(b, kOffBodyHash, h.body_xxh64);
  put64(b, kOffScalesHash, h.scales_xxh64);
  std::memcpy(b.data() + kOffFingerprint, h.fingerprint.data(), h.fingerprint.size());
  put32(b, kOffScaleCount, static_cast<std::uint32_t>(h.n_layers));
  for (int l = 0; l < h.n_layers; ++l) {  // head 0's scale of each layer (the whole scale before version 3)
    put32(b, kOffScales + 8 * static_cast<std::size_t>(l), std::bit_cast<std::uint32_t>(header_scale(h.k_scale, h, l, 0)));
    put32(b, kOffScales + 8 * static_cast<std::size_t>(l) + 4, std::bit_cast<std::uint32_t>(header_scale(h.v_scale, h, l, 0)));
  }
  if (h.version >= 3) {
    const std::string hs = encode_kv_head_scales(h);
    put64(b, kOffHeadScalesBytes, hs.size());
    put64(b, kOffHeadScalesHash, kv_checksum(hs.data(), hs.size()));
  }
  if (h.version >= 4) {
    const std::string lf = encode_kv_layer_formats(h);
    put64(b, kOffLayerFormatsBytes, lf.size());
    put64(b, kOffLayerFormatsHash, kv_checksum(lf.data(), lf.size()));
  }
  if (h.version >= 5) {
    put32(b, kOffLayout, static_cast<std::uint32_t>(h.layout));
    put32(b, kOffVHeadDim, static_cast<std::uint32_t>(h.half_geometry(1).head_dim));
  }
  put64(b, kOffHeaderHash, kv_checksum(b.data(), b.size()));  // computed with the field at zero
  return b;
}

KvRegionSizes kv_region_sizes(const KvFileHeader& h) {
  KvRegionSizes s;
  s.tokens = static_cast<std::uint64_t>(h.token_count) * sizeof(std::int32_t);
  const std::uint64_t used = static_cast<std::uint64_t>(h.used_tokens);
  for (int l = 0; l < h.n_layers; ++l) {  // each layer in its own format (version 4), else the header's
    const KvFormat f = h.layer_format(l);
    const TokenBytes tk = token_bytes(f.k, h.half_geometry(0)), tv = token_bytes(f.v, h.half_geometry(1));
    s.body += used * (tk.codes + tv.codes);
    if (h.version >= 2) s.scales += used * (tk.scales + tv.scales);
  }
  s.layer_formats = h.version >= 4 ? static_cast<std::uint64_t>(h.n_layers) * kLayerFormatBytes : 0;
  s.head_scales = h.version >= 3 ? static_cast<std::uint64_t>(h.n_layers) * 2 * static_cast<std::uint64_t>(h.n_kv_heads) * 4 : 0;
  return s;
}

namespace {

// The stages' combined shape: the first stage's config with every stage's layers (each stage holds
// its layers in its own format: a per-layer map, --kv-layers). Stages out of layer order (or of
// different shapes) are a caller's bug.
StoreConfig combined_config(std::span<const KvStageView> stages) {
  if (stages.empty()) throw KvFileError(KvFileError::Kind::io, "", "KV file: internal error: no stores");
  StoreConfig c = stages[0].store->config();
  c.n_layers = 0;
  for (const KvStageView& st : stages) {
    const StoreConfig& sc = st.store->config();
    if (sc.first_layer != c.n_layers || sc.n_kv_heads != c.n_kv_heads ||
        sc.head_dim != c.head_dim || sc.block_size != c.block_size || sc.layout != c.layout ||
        sc.half_geometry(KvHalf::V).head_dim != c.half_geometry(KvHalf::V).head_dim)
      throw KvFileError(KvFileError::Kind::io, "",
                        "KV file: internal error: pipeline stage stores out of layer order or of different shapes "
                        "(a stage starts at layer " + std::to_string(sc.first_layer) + ", expected " +
                            std::to_string(c.n_layers) + ")");
    c.n_layers += sc.n_layers;
  }
  return c;
}

// Stage and layer slot of model layer l.
std::pair<const PagedKvStore*, int> stage_layer(std::span<const KvStageView> stages, int l) {
  for (const KvStageView& st : stages) {
    const int first = st.store->config().first_layer;
    if (l >= first && l < first + st.store->config().n_layers) return {st.store, l - first};
  }
  throw KvFileError(KvFileError::Kind::io, "", "KV file: internal error: no stage holds layer " + std::to_string(l));
}

// Each model layer's K/V formats: its stage's store format.
std::vector<KvFormat> stage_layer_formats(std::span<const KvStageView> stages, int n_layers) {
  std::vector<KvFormat> out;
  for (int l = 0; l < n_layers; ++l) out.push_back(stage_layer(stages, l).first->format());
  return out;
}

std::string formats_name(const std::vector<KvFormat>& m) {
  const bool uniform = std::all_of(m.begin(), m.end(), [&](const KvFormat& f) { return f == m.front(); });
  return uniform ? m.front().name() : "per-layer map " + kv_layer_map_name(m);
}

}  // namespace

std::string encode_kv_file(const PagedKvStore& store, SeqId s, int n_tokens, std::span<const int> tokens,
                           std::string_view fingerprint) {
  const KvStageView one[1] = {{&store, s}};
  return encode_kv_file(one, n_tokens, tokens, fingerprint);
}

std::string encode_kv_file(std::span<const KvStageView> stages, int n_tokens, std::span<const int> tokens,
                           std::string_view fingerprint) {
  const StoreConfig c = combined_config(stages);
  if (static_cast<int>(tokens.size()) < n_tokens)
    throw KvFileError(KvFileError::Kind::io, "", "KV file: the transcript holds " + std::to_string(tokens.size()) +
                                                     " token ids, fewer than the " + std::to_string(n_tokens) +
                                                     " K/V rows saved");
  KvFileHeader h;
  h.version = kKvFileVersion;
  h.k_format = c.format.k;
  h.v_format = c.format.v;
  h.k_rotation = rotation_of(c.format.k);
  h.v_rotation = rotation_of(c.format.v);
  h.n_layers = c.n_layers;
  h.n_kv_heads = c.n_kv_heads;
  h.head_dim = c.head_dim;
  h.layout = c.layout;
  h.v_head_dim = c.half_geometry(KvHalf::V).head_dim;
  h.block_size = c.block_size;
  h.used_tokens = n_tokens;
  h.token_count = static_cast<int>(tokens.size());
  h.fingerprint = std::string(fingerprint);
  h.layer_formats = stage_layer_formats(stages, c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const auto [st, sl] = stage_layer(stages, l);
    for (KvHalf hf : {KvHalf::K, KvHalf::V})
      for (float x : st->head_scales(sl, hf)) (hf == KvHalf::K ? h.k_scale : h.v_scale).push_back(x);
  }
  const KvRegionSizes sz = kv_region_sizes(h);

  std::string tok(sz.tokens, '\0');
  for (std::size_t i = 0; i < tokens.size(); ++i) put32(tok, i * 4, static_cast<std::uint32_t>(tokens[i]));
  std::string body, scales;
  body.reserve(sz.body);
  scales.reserve(sz.scales);
  // Layer-major regions: the stages' pages one after the other, in layer order.
  for (const KvStageView& stage : stages) {
    const PagedKvStore& store = *stage.store;
    store.export_pages(stage.seq, n_tokens, [&](const PagedKvStore::PageRef& p, const std::uint8_t* page) {
      const TokenBytes tb = token_bytes(store.half_format(p.half), store.half_geometry(p.half));
      for (const ByteRun& r : p.runs) {
        const char* src = reinterpret_cast<const char*>(page + r.offset);
        if (r.name == "blocks") {  // llama.cpp blocks: the f16 d goes to the scales region, qs to the body
          for (std::size_t o = 0; o < r.bytes; o += tb.qblock) {
            scales.append(src + o, sizeof(std::uint16_t));
            body.append(src + o + sizeof(std::uint16_t), tb.qblock - sizeof(std::uint16_t));
          }
        } else if (r.name == "scales") {
          scales.append(src, r.bytes);
        } else {
          body.append(src, r.bytes);
        }
      }
    });
  }
  if (body.size() != sz.body || scales.size() != sz.scales)
    throw KvFileError(KvFileError::Kind::io, "", "KV file: internal error: region sizes do not match the layout");
  h.tokens_bytes = sz.tokens;
  h.body_bytes = sz.body;
  h.scales_bytes = sz.scales;
  h.tokens_xxh64 = kv_checksum(tok.data(), tok.size());
  h.body_xxh64 = kv_checksum(body.data(), body.size());
  h.scales_xxh64 = kv_checksum(scales.data(), scales.size());
  std::string out = encode_kv_header(h);
  const std::string head_scales = encode_kv_head_scales(h), layer_formats = encode_kv_layer_formats(h);
  out.reserve(out.size() + layer_formats.size() + tok.size() + body.size() + scales.size() + head_scales.size());
  out += layer_formats;
  out += tok;
  out += body;
  out += scales;
  out += head_scales;
  return out;
}

void save_kv_file(const std::string& path, const PagedKvStore& store, SeqId s, int n_tokens,
                  std::span<const int> tokens, std::string_view fingerprint) {
  write_file_atomic(path, encode_kv_file(store, s, n_tokens, tokens, fingerprint));
}

void save_kv_file(const std::string& path, std::span<const KvStageView> stages, int n_tokens,
                  std::span<const int> tokens, std::string_view fingerprint) {
  write_file_atomic(path, encode_kv_file(stages, n_tokens, tokens, fingerprint));
}

KvFile parse_kv_file(std::span<const std::uint8_t> bytes, const std::string& path) {
  using K = KvFileError::Kind;
  const std::string who = quoted(path);
  const std::uint8_t* b = bytes.data();
  const std::size_t n = bytes.size();
  if (n < kOffHeaderHash + 8)
    fail(K::truncated, "header",
         who + " is truncated: " + std::to_string(n) + " bytes, shorter than its " + std::to_string(kKvFileHeaderBytes) +
             "-byte header region. Delete it; the conversation's next turn writes a new one.");
  if (std::memcmp(b, kKvFileMagic, sizeof kKvFileMagic) != 0)
    fail(K::corrupt, "header", who + ": header region damaged or not a kvgate KV file (bad magic). Delete it.");
  const std::uint32_t header_bytes = get32(b, kOffHeaderBytes);
  if (header_bytes != kKvFileHeaderBytes)
    fail(K::corrupt, "header",
         who + ": header region damaged (header size field " + std::to_string(header_bytes) + ", expected " +
             std::to_string(kKvFileHeaderBytes) + "). Delete it; the next turn writes a new one.");
  if (n < kKvFileHeaderBytes)
    fail(K::truncated, "header",
         who + " is truncated: " + std::to_string(n) + " bytes, shorter than its " + std::to_string(kKvFileHeaderBytes) +
             "-byte header region. Delete it; the next turn writes a new one.");
  {
    std::string hb(reinterpret_cast<const char*>(b), kKvFileHeaderBytes);
    put64(hb, kOffHeaderHash, 0);
    if (kv_checksum(hb.data(), hb.size()) != get64(b, kOffHeaderHash))
      fail(K::corrupt, "header",
           who + ": checksum mismatch in the header region (the file is damaged). Delete it; the next turn writes "
                 "a new one.");
  }
  KvFile f;
  f.path = path;
  f.file_bytes = n;
  KvFileHeader& h = f.header;
  h.version = get32(b, kOffVersion);
  if (h.version > kKvFileVersion || h.version < kKvFileOldestVersion)
    fail(K::version, "",
         who + " has version " + std::to_string(h.version) + "; this kvgate reads versions " +
             std::to_string(kKvFileOldestVersion) + " to " + std::to_string(kKvFileVersion) +
             ". Use the kvgate that wrote it, or delete the file to start the conversation again.");
  const std::uint8_t kc = b[kOffKFormat], vc = b[kOffVFormat];
  if (!valid_half_code(kc) || !valid_half_code(vc))
    fail(K::version, "header",
         who + " (version " + std::to_string(h.version) + ") names an unknown half format code (K " + std::to_string(kc) +
             ", V " + std::to_string(vc) + "); it was written by a newer kvgate. Delete it or use that kvgate.");
  h.k_format = static_cast<HalfFormat>(kc);
  h.v_format = static_cast<HalfFormat>(vc);
  const std::uint8_t kr = b[kOffKRot], vr = b[kOffVRot];
  if (kr > 1 || vr > 1)
    fail(K::version, "header",
         who + " (" + describe(h) + ") names an unknown rotation kind (K " + std::to_string(kr) + ", V " +
             std::to_string(vr) + "). Delete it or use the kvgate that wrote it.");
  h.k_rotation = static_cast<KvRotation>(kr);
  h.v_rotation = static_cast<KvRotation>(vr);
  h.n_layers = static_cast<int>(get32(b, kOffLayers));
  h.n_kv_heads = static_cast<int>(get32(b, kOffHeads));
  h.head_dim = static_cast<int>(get32(b, kOffHeadDim));
  h.block_size = static_cast<int>(get32(b, kOffBlock));
  h.used_tokens = static_cast<int>(get32(b, kOffUsed));
  h.token_count = static_cast<int>(get32(b, kOffTokenCount));
  h.tokens_bytes = get64(b, kOffTokensBytes);
  h.body_bytes = get64(b, kOffBodyBytes);
  h.scales_bytes = get64(b, kOffScalesBytes);
  h.tokens_xxh64 = get64(b, kOffTokensHash);
  h.body_xxh64 = get64(b, kOffBodyHash);
  h.scales_xxh64 = get64(b, kOffScalesHash);
  h.head_scales_bytes = get64(b, kOffHeadScalesBytes);
  h.head_scales_xxh64 = get64(b, kOffHeadScalesHash);
  if (h.version >= 4) {
    h.layer_formats_bytes = get64(b, kOffLayerFormatsBytes);
    h.layer_formats_xxh64 = get64(b, kOffLayerFormatsHash);
  }
  // Version 5: the layout and the V row width; before it K/V heads of one width.
  std::uint32_t layout_code = 0;
  h.v_head_dim = h.head_dim;
  if (h.version >= 5) {
    layout_code = get32(b, kOffLayout);
    h.v_head_dim = static_cast<int>(get32(b, kOffVHeadDim));
  }
  {
    const char* fp = reinterpret_cast<const char*>(b + kOffFingerprint);
    h.fingerprint.assign(fp, strnlen(fp, kKvFileFingerprintBytes));
  }
  if (layout_code > static_cast<std::uint32_t>(KvLayout::mla_latent))
    fail(K::version, "header",
         who + " (" + describe(h) + ") names an unknown layout code " + std::to_string(layout_code) +
             "; it was written by a newer kvgate. Delete it or use that kvgate.");
  h.layout = static_cast<KvLayout>(layout_code);
  // kv_heads: one width for both halves; mla_latent: one row (n_kv_heads 1) of two widths.
  const bool layout_ok = h.layout == KvLayout::kv_heads ? h.v_head_dim == h.head_dim
                                                        : h.n_kv_heads == 1 && h.v_head_dim >= 1;
  const bool shape_ok = layout_ok && h.n_layers >= 1 && h.n_layers <= kKvFileMaxLayers && h.n_kv_heads >= 1 && h.head_dim >= 1 &&
                        h.block_size >= 1 && h.used_tokens >= 0 && h.token_count >= h.used_tokens &&
                        get32(b, kOffScaleCount) == static_cast<std::uint32_t>(h.n_layers) &&
                        get32(b, kOffReserved0) == 0;
  bool reserved_zero = true;
  for (std::size_t i = h.version >= 5   ? kOffReserved5
                      : h.version >= 4 ? kOffReserved4
                      : h.version >= 3 ? kOffReserved1
                                       : kOffHeadScalesBytes;
       i < kOffScales; ++i)
    reserved_zero = reserved_zero && b[i] == 0;
  for (std::size_t i = kOffScales + 8 * static_cast<std::size_t>(std::clamp(h.n_layers, 0, kKvFileMaxLayers));
       i < kKvFileHeaderBytes; ++i)
    reserved_zero = reserved_zero && b[i] == 0;
  if (!shape_ok || !reserved_zero)
    fail(K::corrupt, "header",
         who + " (" + describe(h) + "): header region inconsistent (layers " + std::to_string(h.n_layers) +
             ", KV heads " + std::to_string(h.n_kv_heads) + ", head_dim " + std::to_string(h.head_dim) +
             ", layout " + name(h.layout) + " with V rows of " + std::to_string(h.v_head_dim) +
             ", block size " + std::to_string(h.block_size) + ", used tokens " + std::to_string(h.used_tokens) +
             ", token ids " + std::to_string(h.token_count) + (reserved_zero ? "" : ", reserved bytes not zero") +
             "). Delete it.");
  // Before version 3 the header's per-layer scale is every KV head's (version 3 reads its
  // head-scales region below, after the checksums).
  for (int l = 0; l < h.n_layers; ++l)
    for (int hd = 0; hd < h.n_kv_heads && h.version < 3; ++hd) {
      h.k_scale.push_back(std::bit_cast<float>(get32(b, kOffScales + 8 * static_cast<std::size_t>(l))));
      h.v_scale.push_back(std::bit_cast<float>(get32(b, kOffScales + 8 * static_cast<std::size_t>(l) + 4)));
    }
  // The rotation is metadata of its own: a file whose rotation disagrees with its format holds
  // codes in another domain than its format says, and is never restored.
  for (int half = 0; half < 2; ++half) {
    const HalfFormat hf = half == 0 ? h.k_format : h.v_format;
    const KvRotation rot = half == 0 ? h.k_rotation : h.v_rotation;
    if (rot != rotation_of(hf))
      fail(K::mismatch, "header",
           who + " (" + describe(h) + "): its " + (half == 0 ? "K" : "V") + " half is " + std::string(name(hf)) +
               " but the file records rotation '" + std::string(rotation_name(rot)) + "' where " +
               std::string(name(hf)) + " needs '" + std::string(rotation_name(rotation_of(hf))) +
               "': the codes are not in the domain the format reads. Refusing to restore it; delete the file.");
  }
  // Version 4: each layer's formats and rotations, the region right after the header (read before the
  // region sizes, which they determine). Before version 4 every layer holds the header's format.
  if (h.version >= 4) {
    const std::uint64_t lf_bytes = static_cast<std::uint64_t>(h.n_layers) * kLayerFormatBytes;
    if (h.layer_formats_bytes != lf_bytes)
      fail(K::corrupt, "header",
           who + " (version " + std::to_string(h.version) + "): header region inconsistent: layer_formats_bytes " +
               std::to_string(h.layer_formats_bytes) + " where " + std::to_string(h.n_layers) + " layers imply " +
               std::to_string(lf_bytes) + ". Delete it.");
    if (n < kKvFileHeaderBytes + lf_bytes)
      fail(K::truncated, "layer_formats",
           who + " (version " + std::to_string(h.version) + ") is truncated: " + std::to_string(n) +
               " bytes, cut inside the layer_formats region. Delete it; the next turn writes a new one.");
    const std::uint8_t* lp = b + kKvFileHeaderBytes;
    if (kv_checksum(lp, lf_bytes) != h.layer_formats_xxh64)
      fail(K::corrupt, "layer_formats",
           who + " (version " + std::to_string(h.version) +
               "): checksum mismatch in the layer_formats region (the file is damaged). Delete it; the next turn "
               "writes a new one.");
    for (int l = 0; l < h.n_layers; ++l) {
      const std::uint8_t* e = lp + static_cast<std::size_t>(l) * kLayerFormatBytes;
      if (!valid_half_code(e[0]) || !valid_half_code(e[1]) || e[2] > 1 || e[3] > 1)
        fail(K::version, "layer_formats",
             who + " (version " + std::to_string(h.version) + "): layer " + std::to_string(l) +
                 " names an unknown half format or rotation code (K " + std::to_string(e[0]) + ", V " +
                 std::to_string(e[1]) + ", rotations " + std::to_string(e[2]) + "/" + std::to_string(e[3]) +
                 "); it was written by a newer kvgate. Delete it or use that kvgate.");
      const KvFormat lf{static_cast<HalfFormat>(e[0]), static_cast<HalfFormat>(e[1])};
      for (int half = 0; half < 2; ++half) {
        const HalfFormat hf = half == 0 ? lf.k : lf.v;
        if (e[2 + half] != static_cast<std::uint8_t>(rotation_of(hf)))
          fail(K::mismatch, "layer_formats",
               who + " (version " + std::to_string(h.version) + "): layer " + std::to_string(l) + "'s " +
                   (half == 0 ? "K" : "V") + " half is " + std::string(name(hf)) + " but the file records rotation '" +
                   std::string(rotation_name(static_cast<KvRotation>(e[2 + half]))) + "' where " +
                   std::string(name(hf)) + " needs '" + std::string(rotation_name(rotation_of(hf))) +
                   "': the codes are not in the domain the format reads. Refusing to restore it; delete the file.");
      }
      h.layer_formats.push_back(lf);
    }
    if (!(h.layer_formats.front() == h.format()))
      fail(K::corrupt, "header",
           who + " (version " + std::to_string(h.version) + "): header region inconsistent: the header's format " +
               h.format().name() + " is not layer 0's " + h.layer_formats.front().name() +
               " in the layer_formats region. Delete it.");
  } else {
    h.layer_formats.assign(static_cast<std::size_t>(h.n_layers), h.format());
  }
  for (int l = 0; l < h.n_layers; ++l) {
    if (l > 0 && h.layer_formats[static_cast<std::size_t>(l)] == h.layer_formats[static_cast<std::size_t>(l) - 1]) continue;
    for (int half = 0; half < 2; ++half) {
      const HalfFormat hf = half == 0 ? h.layer_formats[static_cast<std::size_t>(l)].k
                                      : h.layer_formats[static_cast<std::size_t>(l)].v;
      if (const Capability cap = supports(hf, h.half_geometry(half)); !cap.ok)
        fail(K::corrupt, "header",
             who + " (" + describe(h) + "): format " + std::string(name(hf)) + " (layer " + std::to_string(l) +
                 ") cannot hold this shape (" + cap.reason + "). Delete it.");
    }
  }
  // Version rule: version 1 has no scales region; it is read only where no half needs per-token scales.
  if (h.version < 2) {
    for (int half = 0; half < 2; ++half) {
      const HalfFormat hf = half == 0 ? h.k_format : h.v_format;
      if (info(hf).per_token_scales)
        fail(K::version, "",
             who + " is version " + std::to_string(h.version) + " (a layout without a scales region) and holds format " +
                 h.format().name() + ", whose " + (half == 0 ? "K" : "V") + " half " + std::string(name(hf)) +
                 " needs per-token scales (" + std::string(info(hf).scale_granularity) +
                 ") that version 1 never stored: restoring it would decode garbage. Delete the file; the next turn "
                 "writes version " + std::to_string(kKvFileVersion) + " with its scales.");
    }
  }
  // The region sizes are products of the header's counts: bounded first so none can wrap 64 bits.
  if (static_cast<std::uint64_t>(h.token_count) > limits::max_of(limits::kContext))
    fail(K::corrupt, "header",
         who + " (" + describe(h) + "): token ids = " + std::to_string(h.token_count) + " exceeds the limit " +
             std::to_string(limits::max_of(limits::kContext)) + " on the " + limits::kContext.what + " (" +
             limits::override_hint(limits::kContext) + "). Delete it.");
  const KvRegionSizes want = kv_region_sizes(h);
  if (h.tokens_bytes != want.tokens || h.body_bytes != want.body || h.scales_bytes != want.scales ||
      h.head_scales_bytes != want.head_scales || h.layer_formats_bytes != want.layer_formats)
    fail(K::corrupt, "header",
         who + " (" + describe(h) + "): header region inconsistent: region sizes tokens/body/scales/head_scales " +
             std::to_string(h.tokens_bytes) + "/" + std::to_string(h.body_bytes) + "/" + std::to_string(h.scales_bytes) +
             "/" + std::to_string(h.head_scales_bytes) + " where the shape implies " + std::to_string(want.tokens) + "/" +
             std::to_string(want.body) + "/" + std::to_string(want.scales) + "/" + std::to_string(want.head_scales) +
             ". Delete it.");
  const std::uint64_t total = kKvFileHeaderBytes + want.layer_formats + want.tokens + want.body + want.scales + want.head_scales;
  if (n < total) {
    const std::uint64_t t_end = kKvFileHeaderBytes + want.layer_formats + want.tokens, b_end = t_end + want.body,
                        s_end = b_end + want.scales;
    const char* region = n < t_end ? "tokens" : n < b_end ? "body" : n < s_end ? "scales" : "head_scales";
    fail(K::truncated, region,
         who + " (" + describe(h) + ") is truncated: " + std::to_string(n) + " bytes of " + std::to_string(total) +
             " (cut inside the " + region + " region). Delete it; the next turn writes a new one.");
  }
  if (n > total)
    fail(K::corrupt, "",
         who + " (" + describe(h) + ") has " + std::to_string(n - total) +
             " bytes after its last region (damaged or not written by kvgate). Delete it.");
  const std::uint8_t* tp = b + kKvFileHeaderBytes + want.layer_formats;
  const std::uint8_t* bp = tp + want.tokens;
  const std::uint8_t* sp = bp + want.body;
  const std::uint8_t* hp = sp + want.scales;
  struct Region {
    const char* name;
    const std::uint8_t* p;
    std::uint64_t n, hash;
  };
  for (const Region& r : {Region{"tokens", tp, want.tokens, h.tokens_xxh64}, Region{"body", bp, want.body, h.body_xxh64},
                          Region{"scales", sp, want.scales, h.scales_xxh64},
                          Region{"head_scales", hp, want.head_scales, h.head_scales_xxh64}})
    if ((h.version >= 3 || std::string_view(r.name) != "head_scales") && kv_checksum(r.p, r.n) != r.hash)
      fail(K::corrupt, r.name,
           who + " (" + describe(h) + "): checksum mismatch in the " + r.name +
               " region (the file is damaged). Delete it; the next turn writes a new one.");
  f.tokens.resize(static_cast<std::size_t>(h.token_count));
  for (std::size_t i = 0; i < f.tokens.size(); ++i) {
    f.tokens[i] = static_cast<int>(get32(tp, i * 4));
    if (f.tokens[i] < 0)
      fail(K::corrupt, "tokens",
           who + " (" + describe(h) + "): transcript token " + std::to_string(i) + " is " + std::to_string(f.tokens[i]) +
               ", not a token id (ids are >= 0; the file is damaged or not written by kvgate). Delete it.");
  }
  // Version 3: the head-scales region, layer-major, K's n_kv_heads scales then V's.
  for (std::uint64_t o = 0; o < want.head_scales; o += 4) {
    const float x = std::bit_cast<float>(get32(hp, static_cast<std::size_t>(o)));
    const std::uint64_t i = o / 4, H = static_cast<std::uint64_t>(h.n_kv_heads);
    if (!(x > 0.0f) || !std::isfinite(x))
      fail(K::corrupt, "head_scales",
           who + " (" + describe(h) + "): the " + ((i / H) % 2 == 0 ? "K" : "V") + " scale of layer " +
               std::to_string(i / (2 * H)) + " KV head " + std::to_string(i % H) + " is " + fmt_float(x) +
               ", not a finite scale > 0 (the file is damaged or not written by kvgate). Delete it.");
    ((i / H) % 2 == 0 ? h.k_scale : h.v_scale).push_back(x);
  }
  f.body.assign(bp, bp + want.body);
  f.scales.assign(sp, sp + want.scales);
  return f;
}

KvFile read_kv_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw KvFileError(KvFileError::Kind::io, "", quoted(path) + " cannot be opened: " + std::strerror(errno));
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw KvFileError(KvFileError::Kind::io, "", quoted(path) + " cannot be read");
  return parse_kv_file(bytes, path);
}

void check_kv_file_compatible(const KvFile& f, const PagedKvStore& store, std::string_view fingerprint) {
  const KvStageView one[1] = {{&store, 0}};
  check_kv_file_compatible(f, one, fingerprint);
}

void check_kv_file_compatible(const KvFile& f, std::span<const KvStageView> stages, std::string_view fingerprint) {
  const KvFileHeader& h = f.header;
  const StoreConfig c = combined_config(stages);
  const std::vector<KvFormat> run_formats = stage_layer_formats(stages, c.n_layers);
  std::vector<KvFormat> file_formats;
  for (int l = 0; l < h.n_layers; ++l) file_formats.push_back(h.layer_format(l));
  std::vector<std::string> diffs;
  if (h.fingerprint != fingerprint)
    diffs.push_back("model fingerprint " + h.fingerprint + " in the file, " + std::string(fingerprint) + " in this run");
  if (file_formats != run_formats)
    diffs.push_back("format " + formats_name(file_formats) + " in the file, " + formats_name(run_formats) +
                    " in this run");
  const KvRotation rk = rotation_of(c.format.k), rv = rotation_of(c.format.v);
  if (h.k_rotation != rk || h.v_rotation != rv)
    diffs.push_back("rotation K " + std::string(rotation_name(h.k_rotation)) + " / V " +
                    std::string(rotation_name(h.v_rotation)) + " in the file, K " + std::string(rotation_name(rk)) +
                    " / V " + std::string(rotation_name(rv)) + " in this run");
  if (h.layout != c.layout || h.v_head_dim != c.half_geometry(KvHalf::V).head_dim)
    diffs.push_back(std::string("layout ") + name(h.layout) + " (V rows of " + std::to_string(h.v_head_dim) +
                    ") in the file, " + name(c.layout) + " (V rows of " +
                    std::to_string(c.half_geometry(KvHalf::V).head_dim) +
                    ") in this run (an MLA model's --mla-cache must be the one the file was saved with)");
  if (h.n_layers != c.n_layers || h.n_kv_heads != c.n_kv_heads || h.head_dim != c.head_dim)
    diffs.push_back("shape " + std::to_string(h.n_layers) + " layers x " + std::to_string(h.n_kv_heads) +
                    " KV heads x head_dim " + std::to_string(h.head_dim) + " in the file, " +
                    std::to_string(c.n_layers) + " x " + std::to_string(c.n_kv_heads) + " x " +
                    std::to_string(c.head_dim) + " in this run");
  if (diffs.empty()) {  // the scales matter for the halves that use them (fp8 per KV head, nvfp4's global)
    for (int half = 0; half < 2; ++half) {
      const std::vector<float>& fsv = half == 0 ? h.k_scale : h.v_scale;
      const std::size_t H = static_cast<std::size_t>(c.n_kv_heads);
      bool differs = false;
      for (int l = 0; l < c.n_layers && !differs; ++l) {
        const KvFormat& lf = run_formats[static_cast<std::size_t>(l)];
        if (!info(half == 0 ? lf.k : lf.v).per_tensor_scale) continue;  // the layer's half uses no scale
        const auto [st, sl] = stage_layer(stages, l);
        const std::span<const float> rs = st->head_scales(sl, half == 0 ? KvHalf::K : KvHalf::V);
        for (std::size_t hd = 0; hd < H && !differs; ++hd) {
          const float fs = fsv[static_cast<std::size_t>(l) * H + hd];
          if (std::bit_cast<std::uint32_t>(fs) == std::bit_cast<std::uint32_t>(rs[hd])) continue;
          differs = true;
          diffs.push_back(std::string(half == 0 ? "K" : "V") + " scale of layer " + std::to_string(l) + " KV head " +
                          std::to_string(hd) + " " + fmt_float(fs) + " in the file, " + fmt_float(rs[hd]) +
                          " in this run (pass the scales it was saved with: --" + (half == 0 ? "k" : "v") + "-scale " +
                          fmt_float(fs) + " when every layer and head shares it, else --kv-scales FILE)");
        }
      }
    }
  }
  if (diffs.empty()) return;
  std::string msg = quoted(f.path) + " (" + describe(h) + ", " + std::to_string(h.used_tokens) +
                    " tokens) does not match this run: ";
  for (std::size_t i = 0; i < diffs.size(); ++i) msg += (i ? "; " : "") + diffs[i];
  msg += ". It cannot be restored here: rerun with the model and --kv format it was saved with, or delete the file "
         "(the conversation then starts cold and is saved anew).";
  throw KvFileError(KvFileError::Kind::mismatch, "", msg);
}

int hydratable_prefix(const KvFile& f, std::span<const int> prompt) {
  const std::size_t limit = std::min<std::size_t>(static_cast<std::size_t>(f.header.used_tokens), f.tokens.size());
  std::size_t n = 0;
  while (n < limit && n < prompt.size() && f.tokens[n] == prompt[n]) ++n;
  if (!prompt.empty() && n >= prompt.size()) n = prompt.size() - 1;  // one token is prefilled for its logits
  return static_cast<int>(n);
}

void restore_kv_file(const KvFile& f, PagedKvStore& store, SeqId s, int n_tokens, std::string_view fingerprint) {
  const KvStageTarget one[1] = {{&store, s}};
  restore_kv_file(f, one, n_tokens, fingerprint);
}

void restore_kv_file(const KvFile& f, std::span<const KvStageTarget> stages, int n_tokens, std::string_view fingerprint) {
  std::vector<KvStageView> views;
  for (const KvStageTarget& st : stages) views.push_back({st.store, st.seq});
  check_kv_file_compatible(f, views, fingerprint);
  const KvFileHeader& h = f.header;
  if (n_tokens < 0 || n_tokens > h.used_tokens)
    throw KvFileError(KvFileError::Kind::mismatch, "",
                      quoted(f.path) + ": cannot restore " + std::to_string(n_tokens) + " tokens; it holds " +
                          std::to_string(h.used_tokens));
  // Per (layer, half): its token bytes (the layer's formats) and its region offsets: layer-major,
  // K then V, token-major inside.
  std::vector<TokenBytes> tb(static_cast<std::size_t>(h.n_layers) * 2);
  std::vector<std::size_t> body_at(tb.size()), scale_at(tb.size());
  std::size_t bo = 0, so = 0;
  for (int l = 0; l < h.n_layers; ++l)
    for (int half = 0; half < 2; ++half) {
      const std::size_t i = static_cast<std::size_t>(l) * 2 + half;
      const KvFormat lf = h.layer_format(l);
      tb[i] = token_bytes(half == 0 ? lf.k : lf.v, h.half_geometry(half));
      body_at[i] = bo;
      scale_at[i] = so;
      bo += static_cast<std::size_t>(h.used_tokens) * tb[i].codes;
      so += static_cast<std::size_t>(h.used_tokens) * tb[i].scales;
    }
  for (const KvStageTarget& stage : stages) {
    // The stage's layer slot p.layer is model layer first + p.layer of the file.
    const std::size_t first = static_cast<std::size_t>(stage.store->config().first_layer);
    stage.store->import_pages(stage.seq, n_tokens, [&](const PagedKvStore::PageRef& p, std::uint8_t* page) {
      const int half = static_cast<int>(p.half);
      const std::size_t fl = first + static_cast<std::size_t>(p.layer);
      const TokenBytes& t = tb[fl * 2 + half];
      const std::uint8_t* codes = f.body.data() + body_at[fl * 2 + half] + static_cast<std::size_t>(p.first_token) * t.codes;
      const std::uint8_t* scales =
          f.scales.data() + scale_at[fl * 2 + half] + static_cast<std::size_t>(p.first_token) * t.scales;
      for (const ByteRun& r : p.runs) {
        std::uint8_t* dst = page + r.offset;
        if (r.name == "blocks") {
          const std::size_t qs = t.qblock - sizeof(std::uint16_t);
          for (std::size_t i = 0; i < r.bytes / t.qblock; ++i) {
            std::memcpy(dst + i * t.qblock, scales + i * sizeof(std::uint16_t), sizeof(std::uint16_t));
            std::memcpy(dst + i * t.qblock + sizeof(std::uint16_t), codes + i * qs, qs);
          }
        } else if (r.name == "scales") {
          std::memcpy(dst, scales, r.bytes);
        } else {
          std::memcpy(dst, codes, r.bytes);
        }
      }
    });
  }
}

}  // namespace kvgate
