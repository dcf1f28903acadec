// PAR.persist.<fmt>: a 3-turn conversation saved after every turn and hydrated by a fresh engine
// (a new process per turn, through the same Conversation path as `kvgate run --conv-id`) gives
// logits bitwise identical to the live conversation, on stories260K (head_dim 8: 32-blocks span
// heads) and on a synth head_dim-64 model. Anti-vacuity: the hydrate restored every K/V row and
// only the new tokens were prefilled; a file whose scales (or per-tensor scales, or body) are
// damaged while its checksums are made to match does change the logits or is refused -- so the
// saved bytes carry the state.
#include <algorithm>

#include "kvgate/format_list.hpp"
#include "par_common.hpp"

using namespace kvgate;
using namespace kvgate::par;

namespace {

constexpr int kSteps = 10;

// The live conversation: one engine, three turns, the pending sample opens the next turn.
Trace live_conversation(const Model& m, const KvFormat& f) {
  Engine e(m, options(m, f));
  return live_turns(e, three_turns(m), kSteps);
}

struct Persisted {
  Trace trace;
  std::vector<int> hydrated, prefilled, saved_rows;
  std::vector<std::uint8_t> file_after_turn1;
};

Persisted persisted_conversation(const Model& m, const KvFormat& f, const std::string& dir) {
  const auto turns = three_turns(m);
  KvCacheDir cache(dir);
  Persisted p;
  for (std::size_t t = 0; t < turns.size(); ++t) {
    Engine e(m, options(m, f));  // a fresh process per turn
    Conversation c(cache, "par-persist");
    std::vector<int> prompt = c.transcript();
    prompt.insert(prompt.end(), turns[t].begin(), turns[t].end());
    const int n = c.hydrate(e, prompt);
    p.hydrated.push_back(n);
    const int pending = greedy_turn(e, std::span<const int>(prompt).subspan(static_cast<std::size_t>(n)), kSteps, p.trace);
    p.prefilled.push_back(static_cast<int>(e.stats().prefill_tokens));
    const int pend[1] = {pending};
    c.save(e, pend);
    p.saved_rows.push_back(e.position());
    if (t == 0) p.file_after_turn1 = read_bytes(c.path());
  }
  return p;
}

// Turn 2 of the persisted conversation from a (doctored) turn-1 file; its first logit vector.
std::vector<float> turn2_from(const Model& m, const KvFormat& f, const std::string& path) {
  const KvFile file = read_kv_file(path);
  Engine e(m, options(m, f));
  std::vector<int> prompt = file.tokens;
  const auto turns = three_turns(m);
  prompt.insert(prompt.end(), turns[1].begin(), turns[1].end());
  const int n = e.hydrate(file, prompt);
  return e.prefill(std::span<const int>(prompt).subspan(static_cast<std::size_t>(n)));
}

void run_persist(const Model& m, const KvFormat& f) {
  INFO("model " << m.path << ", format " << f.name());
  const Trace live = live_conversation(m, f);
  TempDir dir;
  const Persisted p = persisted_conversation(m, f, dir.path);
  CHECK(first_difference(live, p.trace) == -1);

  // Anti-vacuity: turn k hydrated everything turn k-1 saved and prefilled only the rest.
  const auto turns = three_turns(m);
  REQUIRE(p.hydrated.size() == 3);
  CHECK(p.hydrated[0] == 0);
  CHECK(p.hydrated[1] == p.saved_rows[0]);
  CHECK(p.hydrated[2] == p.saved_rows[1]);
  CHECK(p.hydrated[1] > 0);
  CHECK(p.prefilled[1] == 1 + static_cast<int>(turns[1].size()));  // the pending sample + the new text
  CHECK(p.prefilled[2] == 1 + static_cast<int>(turns[2].size()));

  // The file is the current version, records the format, its rotations and fp8 scales.
  const KvFile f1 = parse_kv_file(p.file_after_turn1, "turn1");
  CHECK(f1.header.version == kKvFileVersion);
  CHECK(f1.header.format() == f);
  CHECK(f1.header.v_rotation == rotation_of(f.v));
  CHECK(f1.header.fingerprint == m.fingerprint);
  if (uses_tensor_scale(f)) {
    CHECK(f1.header.k_scale == on_every_head(k_scales(m.config.n_layers), m.config.n_kv_heads));
    CHECK(f1.header.v_scale == on_every_head(v_scales(m.config.n_layers), m.config.n_kv_heads));
  }
  CHECK(f1.scales.size() == (uses_token_scales(f) ? f1.header.scales_bytes : 0u));
  if (uses_token_scales(f)) CHECK(!f1.scales.empty());

  // Negative controls: the saved bytes carry the state.
  const std::vector<float>& live_turn2 = live.logits[static_cast<std::size_t>(kSteps + 1)];
  const std::string doctored = dir.file("doctored.kvf");
  Regions r = regions_of(p.file_after_turn1, f1.header);
  write_bytes(dir.file("intact.kvf"), p.file_after_turn1);
  CHECK(bitwise_equal(turn2_from(m, f, dir.file("intact.kvf")), live_turn2));
  if (uses_token_scales(f)) {  // scales not written: a zeroed scales region (checksums made to match)
    KvFileHeader h = f1.header;
    std::vector<std::uint8_t> zero(r.scales.size(), 0);
    h.scales_xxh64 = kv_checksum(zero.data(), zero.size());
    write_bytes(doctored, assemble(h, r.tokens, r.body, zero));
    CHECK_FALSE(bitwise_equal(turn2_from(m, f, doctored), live_turn2));
  }
  {  // body not written
    KvFileHeader h = f1.header;
    std::vector<std::uint8_t> zero(r.body.size(), 0);
    h.body_xxh64 = kv_checksum(zero.data(), zero.size());
    write_bytes(doctored, assemble(h, r.tokens, zero, r.scales));
    CHECK_FALSE(bitwise_equal(turn2_from(m, f, doctored), live_turn2));
  }
  if (uses_tensor_scale(f)) {  // per-tensor scales not persisted: the file claims 1.0 -> refused
    KvFileHeader h = f1.header;
    std::fill(h.k_scale.begin(), h.k_scale.end(), 1.0f);
    std::fill(h.v_scale.begin(), h.v_scale.end(), 1.0f);
    write_bytes(doctored, assemble(h, r.tokens, r.body, r.scales));
    CHECK_THROWS_WITH(turn2_from(m, f, doctored), kvgate_catch::contains("scale of layer 0 KV head 0"));
  }
}

}  // namespace

#define PAR_PERSIST(id, preset)                                                                                   \
  TEST_CASE("PAR.persist." id " persisted + hydrated 3-turn conversation == live, bitwise",                       \
            "[gate:PAR][fmt:" preset "]") {                                                                       \
    on_par_models(run_persist, fmt_of(preset));                                                                   \
  }

KVGATE_PRESETS(PAR_PRESET_ROW, PAR_PERSIST)  // one test case per preset: kvgate/format_list.hpp
PAR_PERSIST("mixed", "k=q8_0,v=fp8_e5m2")
PAR_PERSIST("mixed_rot", "k=fp8_e4m3,v=q4_0_rot")

TEST_CASE("PAR.persist.prefix a new prompt that diverges mid-history hydrates only the common prefix",
          "[gate:PAR][fmt:int8]") {
  const Model& m = stories();
  const KvFormat f = fmt_of("int8");
  const auto turns = three_turns(m);
  TempDir dir;
  Engine a(m, options(m, f));
  Trace ta;
  greedy_turn(a, turns[0], 4, ta);
  a.save_kv(dir.file("p.kvf"));
  const KvFile file = read_kv_file(dir.file("p.kvf"));
  // Edit the prompt at position 7: only 7 tokens can come from the file.
  std::vector<int> prompt(file.tokens.begin(), file.tokens.end());
  prompt[7] = (prompt[7] + 1) % m.config.vocab_size;
  Engine b(m, options(m, f));
  CHECK(b.hydrate(file, prompt) == 7);
  CHECK(b.stats().hydrated_tokens == 7);
  Trace tb, tc;
  greedy_turn(b, std::span<const int>(prompt).subspan(7), 3, tb);
  Engine c(m, options(m, f));  // live: the same token split without a file
  c.prefill(std::span<const int>(prompt).first(7));
  greedy_turn(c, std::span<const int>(prompt).subspan(7), 3, tc);
  CHECK(first_difference(tb, tc) == -1);
  // A prompt equal to the saved history keeps its last token to prefill (logits need one).
  Engine d(m, options(m, f));
  CHECK(d.hydrate(file, file.tokens) == static_cast<int>(file.tokens.size()) - 1);
}
