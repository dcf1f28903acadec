// Boundary rows of the persistence rules, each at the exact edge and one past it:
//  - PAR.version.floor: the KV file reads versions kKvFileOldestVersion..kKvFileVersion; a file
//    whose version is below the oldest (0) is refused naming it, with a valid header otherwise (the
//    file is the current one with only the version field changed and re-assembled).
//  - PAR.cache.budget_edges: a cache folder exactly at its budget keeps every file; one byte under
//    the total evicts the least recently used one (the budget is "at most", docs/PERSISTENCE.md).
// The class they close: an off-by-one at a documented limit (< vs <=).
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "par_common.hpp"

using namespace kvgate;
using namespace kvgate::par;

namespace {

std::string refusal_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no refusal)";
}

// One conversation turn of stories260K in int8 (the same tokens every time: equal file sizes).
void save_turn(const KvCacheDir& cache, const std::string& id, std::span<const int> tokens) {
  const Model& m = stories();
  Engine e(m, options(m, fmt_of("int8")));
  Conversation c(cache, id);
  Trace tr;
  const int pending = greedy_turn(e, tokens, 2, tr);
  const int pend[1] = {pending};
  c.save(e, pend);
}

}  // namespace

TEST_CASE("PAR.version.floor a file below the oldest readable version is refused, the oldest is read", "[gate:PAR][fmt:f16]") {
  // f16 has no per-token scales, so the version-1 layout (no scales region) can hold it and no other
  // rule refuses the file: only the version floor can.
  TempDir dir;
  const Model& m = stories();
  Engine e(m, options(m, fmt_of("f16")));
  Trace tr;
  const auto turns = three_turns(m);
  const int pending = greedy_turn(e, std::span<const int>(turns[0]).first(9), 2, tr);
  const int pend[1] = {pending};
  e.save_kv(dir.file("a.kvf"), pend);
  const std::vector<std::uint8_t> bytes = read_bytes(dir.file("a.kvf"));
  const KvFile f = read_kv_file(dir.file("a.kvf"));
  const Regions r = regions_of(bytes, f.header);
  // Anti-vacuity: the same bytes re-assembled at the current and at the oldest version are read back.
  write_bytes(dir.file("same.kvf"), assemble(f.header, r.tokens, r.body, r.scales));
  CHECK(read_kv_file(dir.file("same.kvf")).tokens == f.tokens);
  KvFileHeader h = f.header;
  h.version = kKvFileOldestVersion;
  write_bytes(dir.file("oldest.kvf"), assemble(h, r.tokens, r.body, r.scales));
  CHECK(read_kv_file(dir.file("oldest.kvf")).tokens == f.tokens);
  h.version = kKvFileOldestVersion - 1;
  write_bytes(dir.file("old.kvf"), assemble(h, r.tokens, r.body, r.scales));
  const std::string msg = refusal_of([&] { read_kv_file(dir.file("old.kvf")); });
  INFO(msg);
  CHECK_THAT(msg, kvgate_catch::contains("old.kvf"));
  CHECK_THAT(msg, kvgate_catch::contains("version " + std::to_string(kKvFileOldestVersion - 1)));
}

TEST_CASE("PAR.cache.budget_edges a folder exactly at its budget keeps its files, one byte less evicts", "[gate:PAR][fmt:int8]") {
  const auto turns = three_turns(stories());
  const auto toks = std::span<const int>(turns[0]);
  TempDir dir;
  std::uint64_t one = 0;
  {
    KvCacheDir probe(dir.file("probe"));
    save_turn(probe, "p", toks);
    one = std::filesystem::file_size(probe.path_for("p"));
  }
  REQUIRE(one > 0);
  {
    KvCacheDir at(dir.file("at"), 2 * one);  // exactly two files
    save_turn(at, "a", toks);
    save_turn(at, "b", toks);
    CHECK(at.entries().size() == 2);
  }
  {
    KvCacheDir under(dir.file("under"), 2 * one - 1);  // one byte short of two files
    save_turn(under, "a", toks);
    save_turn(under, "b", toks);
    const auto es = under.entries();
    REQUIRE(es.size() == 1);
    CHECK(es[0].conv_id == "b");  // the least recently used one went
  }
}
