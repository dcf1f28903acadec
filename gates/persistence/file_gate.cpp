// The KV file's rules (docs/KV_FILE.md):
//   PAR.version.*  the current version reads; a version-2 file (no head-scales region) reads for
//                  every format; a version-1 file (no scales region, written by the
//                  test's own v1 writer) reads for formats without per-token scales and is refused
//                  for the others; newer versions, other models, formats, rotations, shapes and
//                  per-tensor scales are refused -- each message names the file, its version, the
//                  format and what to do.
//   PAR.corrupt.*  every single flipped byte of every region is detected and names its region;
//                  every truncation is refused and names the region of the first missing byte
//                  (a cut exactly at a region's start blames that region, not the one before);
//                  trailing bytes are refused.
#include <algorithm>
#include <functional>
#include <map>

#include "kvgate/format_list.hpp"
#include "limit_fixtures.hpp"
#include "par_common.hpp"

using namespace kvgate;
using namespace kvgate::par;

namespace {

// The formats the loops below cover (kAll), as tags.
#define PAR_ALL_FMT_TAGS \
  "[gate:PAR]" KVGATE_PRESETS(KVGATE_PRESET_TAG_ROW, _) "[fmt:k=q8_0,v=fp8_e5m2]"

struct Saved {
  std::vector<std::uint8_t> bytes;
  KvFile file;
};

// The region of byte i of a file with header h, in file order (docs/KV_FILE.md).
std::string region_of(const KvFileHeader& h, std::size_t i) {
  const std::size_t l0 = kKvFileHeaderBytes, t0 = l0 + h.layer_formats_bytes, b0 = t0 + h.tokens_bytes,
                    s0 = b0 + h.body_bytes, h0 = s0 + h.scales_bytes;
  return i < l0 ? "header" : i < t0 ? "layer_formats" : i < b0 ? "tokens" : i < s0 ? "body" : i < h0 ? "scales" : "head_scales";
}

// A small file of stories260K: 9 prompt tokens + 2 decoded, one pending id.
Saved small_file(const KvFormat& f, const std::string& path) {
  const Model& m = stories();
  Engine e(m, options(m, f));
  Trace tr;
  const auto turns = three_turns(m);
  const auto toks = std::span<const int>(turns[0]).first(9);
  const int pending = greedy_turn(e, toks, 2, tr);
  const int pend[1] = {pending};
  e.save_kv(path, pend);
  Saved s;
  s.bytes = read_bytes(path);
  s.file = read_kv_file(path);
  return s;
}

// Logits of one more token after hydrating `path` (every saved row).
std::vector<float> continue_from(const std::string& path, const KvFormat& f) {
  const Model& m = stories();
  const KvFile file = read_kv_file(path);
  Engine e(m, options(m, f));
  std::vector<int> prompt = file.tokens;
  prompt.push_back(5);
  const int n = e.hydrate(file, prompt);
  REQUIRE(n == file.header.used_tokens);
  return e.prefill(std::span<const int>(prompt).subspan(static_cast<std::size_t>(n)));
}

std::string refusal(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const KvFileError& e) {
    return e.what();
  }
  return "(no refusal)";
}

const char* kUnscaled[] = {"f32", "f16", "bf16", "fp8", "fp8_e5m2"};
const char* kScaled[] = {"int8", "q8_0", "q4_0", "k8v4", "k=q8_0,v=fp8_e5m2", "k=fp8_e4m3,v=q4_0_rot"};
// Every preset (kvgate/format_list.hpp) and one mixed pair; kUnscaled / kScaled are samples.
#define PAR_PRESET_NAME_ROW(A, name, k, v, slot, kind) #name,
const char* kAll[] = {KVGATE_PRESETS(PAR_PRESET_NAME_ROW, _) "k=q8_0,v=fp8_e5m2"};

}  // namespace

TEST_CASE("PAR.version.current every preset writes the current version, and it reads back",
          PAR_ALL_FMT_TAGS) {
  TempDir dir;
  for (const char* p : kAll) {
    INFO(p);
    const Saved s = small_file(fmt_of(p), dir.file("a.kvf"));
    CHECK(s.file.header.version == kKvFileVersion);
    CHECK(s.bytes.size() == s.file.file_bytes);
    CHECK(std::equal(s.bytes.begin(), s.bytes.begin() + 8, kKvFileMagic));
  }
}

TEST_CASE("PAR.version.v1_unscaled a version-1 file of a format without per-token scales reads and hydrates bitwise",
          "[gate:PAR][fmt:f32][fmt:f16][fmt:bf16][fmt:fp8][fmt:fp8_e5m2]") {
  TempDir dir;
  for (const char* p : kUnscaled) {
    INFO(p);
    const KvFormat f = fmt_of(p);
    const Saved s = small_file(f, dir.file("v2.kvf"));
    const auto v1 = as_version1(s.bytes);
    write_bytes(dir.file("v1.kvf"), v1);
    const KvFile f1 = read_kv_file(dir.file("v1.kvf"));
    CHECK(f1.header.version == 1);
    CHECK(f1.scales.empty());
    CHECK(bitwise_equal(continue_from(dir.file("v1.kvf"), f), continue_from(dir.file("v2.kvf"), f)));
  }
}

TEST_CASE("PAR.version.v2 a version-2 file (no head-scales region) reads and hydrates bitwise, each layer's scale on "
          "every KV head",
          PAR_ALL_FMT_TAGS) {
  TempDir dir;
  for (const char* p : kAll) {
    INFO(p);
    const KvFormat f = fmt_of(p);
    const Saved s = small_file(f, dir.file("v3.kvf"));
    write_bytes(dir.file("v2.kvf"), as_version2(s.bytes));
    const KvFile f2 = read_kv_file(dir.file("v2.kvf"));
    CHECK(f2.header.version == 2);
    CHECK(f2.file_bytes + s.file.header.head_scales_bytes + s.file.header.layer_formats_bytes == s.file.file_bytes);
    CHECK(s.file.header.head_scales_bytes > 0);
    CHECK(f2.header.k_scale == s.file.header.k_scale);  // per-tensor: the header's scale on every head
    CHECK(f2.header.v_scale == s.file.header.v_scale);
    CHECK(bitwise_equal(continue_from(dir.file("v2.kvf"), f), continue_from(dir.file("v3.kvf"), f)));
  }
}

TEST_CASE("PAR.version.v3 a version-3 file (no layer-formats region: one format on every layer) reads and hydrates "
          "bitwise",
          PAR_ALL_FMT_TAGS) {
  TempDir dir;
  for (const char* p : kAll) {
    INFO(p);
    const KvFormat f = fmt_of(p);
    const Saved s = small_file(f, dir.file("v4.kvf"));
    const int n_layers = s.file.header.n_layers;
    CHECK(s.file.header.layer_formats_bytes == static_cast<std::uint64_t>(n_layers) * 4);
    CHECK(s.file.header.layer_formats == std::vector<KvFormat>(static_cast<std::size_t>(n_layers), f));
    write_bytes(dir.file("v3.kvf"), as_older_version(s.bytes, 3));
    const KvFile f3 = read_kv_file(dir.file("v3.kvf"));
    CHECK(f3.header.version == 3);
    CHECK(f3.header.layer_formats_bytes == 0);
    CHECK(f3.file_bytes + s.file.header.layer_formats_bytes == s.file.file_bytes);
    CHECK(f3.header.layer_formats == s.file.header.layer_formats);  // the header's format on every layer
    CHECK(f3.header.k_scale == s.file.header.k_scale);
    CHECK(bitwise_equal(continue_from(dir.file("v3.kvf"), f), continue_from(dir.file("v4.kvf"), f)));
  }
}

TEST_CASE("PAR.version.v1_scaled a version-1 file of a format with per-token scales is refused with what to do",
          "[gate:PAR][fmt:int8][fmt:q8_0][fmt:q4_0][fmt:k8v4]") {
  TempDir dir;
  for (const char* p : kScaled) {
    INFO(p);
    const KvFormat f = fmt_of(p);
    const Saved s = small_file(f, dir.file("v2.kvf"));
    write_bytes(dir.file("old.kvf"), as_version1(s.bytes));
    KvFileError::Kind kind = KvFileError::Kind::io;
    std::string msg;
    try {
      read_kv_file(dir.file("old.kvf"));
    } catch (const KvFileError& e) {
      kind = e.kind();
      msg = e.what();
    }
    CHECK(kind == KvFileError::Kind::version);
    CHECK_THAT(msg, kvgate_catch::contains(dir.file("old.kvf")));
    CHECK_THAT(msg, kvgate_catch::contains("version 1"));
    CHECK_THAT(msg, kvgate_catch::contains(f.name()));
    CHECK_THAT(msg, kvgate_catch::contains("per-token scales"));
    CHECK_THAT(msg, kvgate_catch::contains("Delete the file"));
  }
}

TEST_CASE("PAR.version.newer a file of a newer version is refused, naming both versions", "[gate:PAR][fmt:int8]") {
  TempDir dir;
  const Saved s = small_file(fmt_of("int8"), dir.file("a.kvf"));
  Regions r = regions_of(s.bytes, s.file.header);
  KvFileHeader h = s.file.header;
  h.version = kKvFileVersion + 1;
  write_bytes(dir.file("new.kvf"), assemble(h, r.tokens, r.body, r.scales));
  const std::string msg = refusal([&] { read_kv_file(dir.file("new.kvf")); });
  CHECK_THAT(msg, kvgate_catch::contains("new.kvf"));
  CHECK_THAT(msg, kvgate_catch::contains("version " + std::to_string(kKvFileVersion + 1)));
  CHECK_THAT(msg, kvgate_catch::contains("reads versions 1 to " + std::to_string(kKvFileVersion)));
}

TEST_CASE("PAR.version.mismatch files of another model, format, rotation, shape or fp8 scale are refused",
          "[gate:PAR][fmt:int8][fmt:k8v4][fmt:fp8]") {
  const Model& m = stories();
  TempDir dir;
  auto hydrate_msg = [&](const Model& model, const EngineOptions& o, const std::string& path) {
    return refusal([&] {
      const KvFile file = read_kv_file(path);
      Engine e(model, o);
      std::vector<int> prompt = file.tokens;
      prompt.push_back(3);
      e.hydrate(file, prompt);
    });
  };
  SECTION("model") {
    const Saved s = small_file(fmt_of("int8"), dir.file("m.kvf"));
    Model other = load_model(stories_path());
    other.weights.layers[0].wq[0] += 1.0f;  // another model of the same shape
    other.fingerprint = "0123456789abcdef";
    const std::string msg = hydrate_msg(other, options(other, fmt_of("int8")), dir.file("m.kvf"));
    CHECK_THAT(msg, kvgate_catch::contains("m.kvf"));
    CHECK_THAT(msg, kvgate_catch::contains("version " + std::to_string(kKvFileVersion) + ", format int8"));
    CHECK_THAT(msg, kvgate_catch::contains("model fingerprint " + m.fingerprint));
    CHECK_THAT(msg, kvgate_catch::contains("delete the file"));
  }
  SECTION("format") {
    small_file(fmt_of("int8"), dir.file("f.kvf"));
    const std::string msg = hydrate_msg(m, options(m, fmt_of("q8_0")), dir.file("f.kvf"));
    CHECK_THAT(msg, kvgate_catch::contains("format int8 in the file, q8_0 in this run"));
    CHECK_THAT(msg, kvgate_catch::contains("--kv format"));
  }
  SECTION("rotation: a k=int8,v=q4_0 file in a k8v4 run") {
    small_file(fmt_of("k=int8,v=q4_0"), dir.file("r.kvf"));
    const std::string msg = hydrate_msg(m, options(m, fmt_of("k8v4")), dir.file("r.kvf"));
    CHECK_THAT(msg, kvgate_catch::contains("rotation K none / V none in the file, K none / V walsh-hadamard in this run"));
  }
  SECTION("rotation flag: a k8v4 file whose header says V rotation none is never restored") {
    const Saved s = small_file(fmt_of("k8v4"), dir.file("k.kvf"));
    Regions r = regions_of(s.bytes, s.file.header);
    KvFileHeader h = s.file.header;
    h.v_rotation = KvRotation::none;
    write_bytes(dir.file("norot.kvf"), assemble(h, r.tokens, r.body, r.scales));
    const std::string msg = refusal([&] { read_kv_file(dir.file("norot.kvf")); });
    CHECK_THAT(msg, kvgate_catch::contains("norot.kvf"));
    CHECK_THAT(msg, kvgate_catch::contains("format k8v4"));
    CHECK_THAT(msg, kvgate_catch::contains("rotation 'none' where q4_0_rot needs 'walsh-hadamard'"));
  }
  SECTION("shape: a stories260K file in a head_dim-64 model") {
    small_file(fmt_of("int8"), dir.file("s.kvf"));
    const Model& big = synth64();
    const std::string msg = hydrate_msg(big, options(big, fmt_of("int8")), dir.file("s.kvf"));
    CHECK_THAT(msg, kvgate_catch::contains("shape 5 layers x 4 KV heads x head_dim 8 in the file, 2 x 2 x 64 in this run"));
  }
  SECTION("per-tensor fp8 scale") {
    small_file(fmt_of("fp8"), dir.file("p.kvf"));
    EngineOptions o = options(m, fmt_of("fp8"));
    o.k_scale = {1.0f};
    const std::string msg = hydrate_msg(m, o, dir.file("p.kvf"));
    CHECK_THAT(msg, kvgate_catch::contains("K scale of layer 0 KV head 0 0.370000005 in the file, 1 in this run"));
    CHECK_THAT(msg, kvgate_catch::contains("--k-scale"));
  }
}

TEST_CASE("PAR.corrupt.flip every flipped byte of every region is detected and names the region",
          PAR_ALL_FMT_TAGS) {
  TempDir dir;
  for (const char* p : kAll) {
    INFO(p);
    const Saved s = small_file(fmt_of(p), dir.file("a.kvf"));
    const KvFileHeader& h = s.file.header;
    std::map<std::string, int> flipped, named;
    std::vector<std::uint8_t> b = s.bytes;
    std::string first_bad;
    for (std::size_t i = 0; i < b.size(); ++i) {
      b[i] ^= static_cast<std::uint8_t>(1u << (i % 8));
      const std::string want = region_of(h, i);
      ++flipped[want];
      try {
        parse_kv_file(b, "a.kvf");
      } catch (const KvFileError& e) {
        if (e.region() == want && std::string(e.what()).find(want) != std::string::npos) ++named[want];
        else if (first_bad.empty()) first_bad = "byte " + std::to_string(i) + ": " + e.what();
      }
      b[i] = s.bytes[i];
    }
    INFO(first_bad);
    CHECK(named == flipped);
    CHECK(flipped["header"] == static_cast<int>(kKvFileHeaderBytes));
    CHECK(flipped["tokens"] > 0);
    CHECK(flipped["body"] > 0);
    if (uses_token_scales(fmt_of(p))) CHECK(flipped["scales"] > 0);
    CHECK(flipped["head_scales"] == static_cast<int>(h.n_layers * 2 * h.n_kv_heads * 4));  // version 3
    CHECK(flipped["layer_formats"] == static_cast<int>(h.n_layers * 4));                  // version 4
  }
}

TEST_CASE("PAR.corrupt.token_count_limit a header whose token count passes CONTEXT is refused before any region is sized",
          "[gate:PAR][fmt:int8]") {
  // Bound: CONTEXT of runtime/limits, lowered through its override to exactly the file's token count:
  // at the limit the file parses, one below it is refused (corrupt, region "header") naming the file,
  // the count, the limit and the override.
  TempDir dir;
  const Saved s = small_file(fmt_of("int8"), dir.file("a.kvf"));
  const std::uint64_t n = static_cast<std::uint64_t>(s.file.header.token_count);
  REQUIRE(n > 1);
  {
    const kvgate::gates::ScopedLimit at("CONTEXT", n);
    CHECK(refusal([&] { parse_kv_file(s.bytes, "a.kvf"); }) == "(no refusal)");
  }
  const kvgate::gates::ScopedLimit below("CONTEXT", n - 1);
  try {
    parse_kv_file(s.bytes, "a.kvf");
    FAIL("accepted a token count over CONTEXT");
  } catch (const KvFileError& e) {
    CHECK(e.kind() == KvFileError::Kind::corrupt);
    CHECK(e.region() == "header");
    CHECK_THAT(std::string(e.what()), kvgate_catch::contains("a.kvf"));
    CHECK_THAT(std::string(e.what()), kvgate_catch::contains("token ids = " + std::to_string(n) + " exceeds the limit " +
                                                              std::to_string(n - 1)));
    CHECK_THAT(std::string(e.what()), kvgate_catch::contains("KVGATE_LIMIT_CONTEXT=N"));
  }
}

TEST_CASE("PAR.corrupt.truncated every truncation of a file is refused naming the region it cuts; trailing bytes too",
          PAR_ALL_FMT_TAGS) {
  TempDir dir;
  for (const char* p : kAll) {
    INFO(p);
    const Saved s = small_file(fmt_of(p), dir.file("a.kvf"));
    const KvFileHeader& h = s.file.header;
    int refused = 0, truncated_kind = 0;
    // A file cut to n bytes lacks byte n first: the refusal names byte n's region (error region and
    // message), so a cut exactly at a region's start blames that region, not the one before it.
    std::map<std::string, int> cut, named, at_start;
    std::string first_bad;
    for (std::size_t n = 0; n < s.bytes.size(); ++n) {
      const std::string want = region_of(h, n);
      ++cut[want];
      if (n == 0 || region_of(h, n - 1) != want) ++at_start[want];
      try {
        parse_kv_file(std::span<const std::uint8_t>(s.bytes).first(n), "a.kvf");
      } catch (const KvFileError& e) {
        ++refused;
        truncated_kind += e.kind() == KvFileError::Kind::truncated;
        if (e.region() == want && std::string(e.what()).find(want) != std::string::npos) ++named[want];
        else if (first_bad.empty()) first_bad = "cut to " + std::to_string(n) + " bytes (" + want + "): region '" + e.region() + "': " + e.what();
      }
    }
    CHECK(refused == static_cast<int>(s.bytes.size()));
    CHECK(truncated_kind == refused);  // reported as truncation, never as something else
    INFO(first_bad);
    CHECK(named == cut);
    // Anti-vacuity: a cut at the first byte of every region the file has.
    for (const char* r : {"header", "layer_formats", "tokens", "body", "head_scales"}) CHECK(at_start[r] == 1);
    if (uses_token_scales(fmt_of(p))) CHECK(at_start["scales"] == 1);
    std::vector<std::uint8_t> longer = s.bytes;
    longer.push_back(0);
    CHECK_THROWS_AS(parse_kv_file(longer, "a.kvf"), KvFileError);
    // And through the file system: a truncated file on disk is refused with its name and the region.
    write_bytes(dir.file("cut.kvf"), std::span<const std::uint8_t>(s.bytes).first(s.bytes.size() - 1));
    const std::string msg = refusal([&] { read_kv_file(dir.file("cut.kvf")); });
    CHECK_THAT(msg, kvgate_catch::contains("cut.kvf"));
    CHECK_THAT(msg, kvgate_catch::contains("is truncated"));
  }
}
