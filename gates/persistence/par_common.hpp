// Shared plumbing of the PAR gates: the models (stories260K, a synth head_dim-64 model), engines
// per format, greedy turns that record every logit vector, temp folders, file byte surgery.
#pragma once
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/kv_cache_dir.hpp"
#include "kvgate/kv_file.hpp"
#include "kvgate/model.hpp"
#include "kvgate/synth.hpp"
#include "model_fixtures.hpp"
#include "models.hpp"
#include "scratch_dir.hpp"

namespace kvgate::par {

// --- models ------------------------------------------------------------------------------------
inline std::string stories_path() {
  const gates::ModelLookup l = gates::find_model("stories260K/stories260K.bin");
  if (!l.found()) throw std::runtime_error("PAR gates: " + l.message);
  return l.path;
}

// The real stories260K model (head_dim 8, 4 KV heads, 5 layers). A missing model is a failure,
// never a pass: the gate cannot be vacuous.
inline const Model& stories() {
  static std::unique_ptr<Model> m = std::make_unique<Model>(load_model(stories_path()));
  return *m;
}

// A temp folder removed at scope exit (gates/common/scratch_dir.hpp).
struct TempDir {
  gates::ScratchDir dir{"kvgate-par"};
  std::string path = dir.str();
  std::string file(const std::string& name) const { return path + "/" + name; }
};

// A deterministic random-weight Llama with head_dim 64 (2 KV heads, 2 layers): 32-blocks inside a
// head, a 64-point rotation. Generated once per process by kvgate's synth.
inline const Model& synth64() {
  SynthOptions o;
  o.layers = 2;
  o.hidden = 128;
  o.heads = 2;
  o.kv_heads = 2;
  o.ffn = 256;
  o.vocab = 300;
  o.seed = 5;
  o.max_seq_len = 256;
  return gates::synth_model_once("hd64", o);
}

// Runs `run(model, f)` in one section per PAR model of the calling test case: stories260K, then the
// synth head_dim-64 model.
template <class Run>
void on_par_models(const Run& run, const KvFormat& f) {
  SECTION("stories260K") { run(stories(), f); }
  SECTION("synth head_dim 64") { run(synth64(), f); }
}

// KVGATE_PRESETS(PAR_PRESET_ROW, MACRO) registers MACRO(id, preset) once per preset
// (kvgate/format_list.hpp), the preset's name as both.
#define PAR_PRESET_ROW(MACRO, name, k, v, slot, kind) MACRO(#name, #name)

// --- formats -------------------------------------------------------------------------------------
inline KvFormat fmt_of(const char* preset) {
  const auto f = parse_kv_format(preset);
  if (!f) throw std::runtime_error(std::string("unknown preset ") + preset);
  return *f;
}

inline bool uses_tensor_scale(const KvFormat& f) { return info(f.k).per_tensor_scale || info(f.v).per_tensor_scale; }
inline bool uses_token_scales(const KvFormat& f) { return info(f.k).per_token_scales || info(f.v).per_token_scales; }

// Per-layer fp8 scales: non-unit, unequal across layers and between K and V (anti-vacuity: a scale
// that is not persisted or not checked changes the decoded values).
inline std::vector<float> k_scales(int n_layers) {
  std::vector<float> s;
  for (int l = 0; l < n_layers; ++l) s.push_back(0.37f + 0.05f * static_cast<float>(l));
  return s;
}
inline std::vector<float> v_scales(int n_layers) {
  std::vector<float> s;
  for (int l = 0; l < n_layers; ++l) s.push_back(0.0213f * static_cast<float>(l + 1));
  return s;
}

inline EngineOptions options(const Model& m, const KvFormat& f, int resident = 0, int block_size = 16, int threads = 1) {
  EngineOptions o = engine_options_for(f, threads);
  o.block_size = block_size;
  o.kv_resident = resident;
  o.max_context = std::min(m.config.max_seq_len, 256);
  if (uses_tensor_scale(f)) {
    o.k_scale = k_scales(m.config.n_layers);
    o.v_scale = v_scales(m.config.n_layers);
  }
  return o;
}

// --- turns ---------------------------------------------------------------------------------------
inline int argmax(const std::vector<float>& v) {
  int best = 0;
  for (int i = 1; i < static_cast<int>(v.size()); ++i)
    if (v[static_cast<std::size_t>(i)] > v[static_cast<std::size_t>(best)]) best = i;
  return best;
}

struct Trace {
  std::vector<std::vector<float>> logits;  // every logit vector, in order
  std::vector<int> generated;              // sampled ids (the last one is not yet in the KV)
};

// Prefill `tokens`, then `steps` greedy steps: decode the previous sample, sample again. Appends
// every logit vector to the trace. Returns the last sampled id (pending: not in the KV).
inline int greedy_turn(Engine& e, std::span<const int> tokens, int steps, Trace& tr) {
  tr.logits.push_back(e.prefill(tokens));
  int next = argmax(tr.logits.back());
  tr.generated.push_back(next);
  for (int i = 0; i < steps; ++i) {
    tr.logits.push_back(e.decode(next));
    next = argmax(tr.logits.back());
    tr.generated.push_back(next);
  }
  return next;
}

// The live conversation: one engine, the turns in order, each turn's pending sample opening the next.
inline Trace live_turns(Engine& e, const std::vector<std::vector<int>>& turns, int steps) {
  Trace tr;
  int pending = -1;
  for (const auto& t : turns) {
    std::vector<int> toks;
    if (pending >= 0) toks.push_back(pending);
    toks.insert(toks.end(), t.begin(), t.end());
    pending = greedy_turn(e, toks, steps, tr);
  }
  return tr;
}

// What a swapped-out sequence's freed blocks see meanwhile: another sequence takes n tokens of
// blocks and fills every layer's K and V with N(0, sigma) rows. Returns it (free it afterwards).
inline SeqId scribble_sequence(PagedKvStore& st, const ModelConfig& c, int n, unsigned seed, float sigma) {
  const SeqId other = st.create_sequence();
  st.extend(other, n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  const int HD = c.n_kv_heads * c.head_dim;
  std::vector<float> rows(static_cast<std::size_t>(n) * HD);
  for (auto& x : rows) x = d(rng);
  for (int l = 0; l < st.config().n_layers; ++l) st.write(other, l, 0, n, rows.data(), HD, rows.data(), HD);
  return other;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Index of the first differing logit vector, or -1 when the traces are bitwise identical.
inline int first_difference(const Trace& a, const Trace& b) {
  if (a.logits.size() != b.logits.size()) return static_cast<int>(std::min(a.logits.size(), b.logits.size()));
  for (std::size_t i = 0; i < a.logits.size(); ++i)
    if (!bitwise_equal(a.logits[i], b.logits[i])) return static_cast<int>(i);
  return -1;
}

// Three turns of a conversation, as token ids (turn 1 starts with BOS).
inline std::vector<std::vector<int>> three_turns(const Model& m) {
  if (m.tokenizer) {
    const Tokenizer& t = *m.tokenizer;
    return {t.encode("Once upon a time, a little fox found a red ball in the park.", true),
            t.encode(" Then the fox met a bird who wanted to play.", false),
            t.encode(" At night they went home and slept.", false)};
  }
  std::vector<std::vector<int>> turns(3);
  for (int i = 0; i < 21; ++i) turns[0].push_back((7 * i + 3) % m.config.vocab_size);
  for (int i = 0; i < 13; ++i) turns[1].push_back((11 * i + 5) % m.config.vocab_size);
  for (int i = 0; i < 9; ++i) turns[2].push_back((13 * i + 1) % m.config.vocab_size);
  return turns;
}

// The three turns as one prompt.
inline std::vector<int> joined_turns(const Model& m) {
  std::vector<int> p;
  for (const auto& t : three_turns(m)) p.insert(p.end(), t.begin(), t.end());
  return p;
}
// Dequantized rows of every position of one layer slot of a store: [length][n_kv_heads * head_dim].
inline std::vector<float> layer_rows(const PagedKvStore& st, SeqId s, int layer, KvHalf h) {
  const int n = st.length(s);
  std::vector<float> out(static_cast<std::size_t>(n) * st.config().n_kv_heads * st.config().head_dim);
  st.read(s, layer, h, 0, n, out.data());
  return out;
}

// --- file bytes ----------------------------------------------------------------------------------
inline std::vector<std::uint8_t> read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
inline void write_bytes(const std::string& p, std::span<const std::uint8_t> b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Rewrites a header (with a valid checksum) in front of the given regions (and, from version 4,
// the layer-formats region of the header's layer formats after it; from version 3, the head-scales
// region of the header's scales at the end).
inline std::vector<std::uint8_t> assemble(const KvFileHeader& h, std::span<const std::uint8_t> tokens,
                                          std::span<const std::uint8_t> body, std::span<const std::uint8_t> scales) {
  const std::string hb = encode_kv_header(h);
  std::vector<std::uint8_t> out(hb.begin(), hb.end());
  const std::string lf = encode_kv_layer_formats(h);  // version 4
  out.insert(out.end(), lf.begin(), lf.end());
  out.insert(out.end(), tokens.begin(), tokens.end());
  out.insert(out.end(), body.begin(), body.end());
  out.insert(out.end(), scales.begin(), scales.end());
  const std::string hs = encode_kv_head_scales(h);  // version 3: the head scales of h.k_scale/v_scale
  out.insert(out.end(), hs.begin(), hs.end());
  return out;
}

// Per-layer scales as a parsed file holds them: each layer's scale on each of its n_kv_heads heads.
inline std::vector<float> on_every_head(const std::vector<float>& per_layer, int n_kv_heads) {
  std::vector<float> out;
  for (float x : per_layer) out.insert(out.end(), static_cast<std::size_t>(n_kv_heads), x);
  return out;
}

struct Regions {
  std::vector<std::uint8_t> tokens, body, scales;
};
inline Regions regions_of(std::span<const std::uint8_t> file, const KvFileHeader& h) {
  const std::size_t t0 = kKvFileHeaderBytes + h.layer_formats_bytes, b0 = t0 + h.tokens_bytes, s0 = b0 + h.body_bytes;
  return {{file.begin() + t0, file.begin() + b0}, {file.begin() + b0, file.begin() + s0},
          {file.begin() + s0, file.begin() + s0 + h.scales_bytes}};
}

// The "older version writer" of the tests: the same content in an older layout (one format on
// every layer; the header encoder writes each version's own fields). Version 3 has no
// layer-formats region; version 2 has no head-scales region (each layer's header scale is then every KV head's: only per-tensor scales
// survive it); version 1 has no scales region either.
inline std::vector<std::uint8_t> as_older_version(std::span<const std::uint8_t> file, std::uint32_t version) {
  KvFile f = parse_kv_file(file, "current");
  Regions r = regions_of(file, f.header);
  KvFileHeader h = f.header;
  h.version = version;
  h.head_scales_bytes = 0;
  h.head_scales_xxh64 = 0;
  if (version < 2) {
    h.scales_bytes = 0;
    h.scales_xxh64 = kv_checksum(nullptr, 0);
    r.scales.clear();
  }
  return assemble(h, r.tokens, r.body, r.scales);
}
inline std::vector<std::uint8_t> as_version1(std::span<const std::uint8_t> file) { return as_older_version(file, 1); }
inline std::vector<std::uint8_t> as_version2(std::span<const std::uint8_t> file) { return as_older_version(file, 2); }

}  // namespace kvgate::par
