// The probe recipe (datasets/probes/RECIPE.md): determinism, the golden vectors a reimplementation
// (the probe model's trainer) must reproduce, length/depth placement, and exact scoring.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "catch_compat.hpp"
#include "kvgate/probes.hpp"

using namespace kvgate::probes;

namespace {
std::string source_dir() {
  const char* s = std::getenv("KVGATE_SOURCE_DIR");
  return s ? s : ".";
}
std::size_t occurrences(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("splitmix64 matches the published reference sequence") {
  // Reference values of SplitMix64 seeded with 1234567 (the generator's C reference).
  SplitMix64 g(1234567);
  CHECK(g.next() == 6457827717110365317ULL);
  CHECK(g.next() == 3203168211198807973ULL);
  CHECK(g.next() == 9817491932198370423ULL);
}

TEST_CASE("needle: deterministic, within L, key planted exactly once at the depth") {
  const auto count = byte_counter();
  for (int L : {256, 1000, 4096}) {
    for (double d : {0.0, 0.3, 0.5, 1.0}) {
      const NeedleCase a = make_needle(L, d, 7, count);
      const NeedleCase b = make_needle(L, d, 7, count);
      CHECK(a.prompt == b.prompt);
      CHECK(a.prompt_tokens == count(a.prompt));
      CHECK(a.prompt_tokens <= L);
      CHECK(a.prompt_tokens > L - 120);  // one log line is shorter than 120 bytes
      CHECK(occurrences(a.prompt, a.key) == 1);
      CHECK(occurrences(a.prompt, "secret key") == 3);  // header, needle, question
      CHECK(a.key.size() == 8);
      CHECK(std::abs(a.actual_depth() - d) <= 0.5 / std::max(1, a.haystack_lines) + 1e-12);
      // The needle is line `needle_line` of the log (the header is line 0 of the prompt).
      std::istringstream in(a.prompt);
      std::string line;
      std::getline(in, line);
      for (int i = 0; i <= a.needle_line; ++i) std::getline(in, line);
      CHECK(line.find(a.key) != std::string::npos);
    }
  }
  // Depth moves only the needle: the same (seed, L) gives the same key and haystack.
  CHECK(make_needle(1000, 0.0, 3, count).key == make_needle(1000, 1.0, 3, count).key);
  CHECK(make_needle(1000, 0.5, 3, count).key != make_needle(1000, 0.5, 4, count).key);
}

TEST_CASE("golden vectors (datasets/probes/golden.json) reproduce byte for byte") {
  const auto path = std::filesystem::path(source_dir()) / "datasets" / "probes" / "golden.json";
  std::ifstream f(path);
  REQUIRE(f.good());
  const auto g = nlohmann::json::parse(f);
  REQUIRE(g.at("recipe_version").get<int>() == kRecipeVersion);
  int checked = 0;
  for (const auto& c : g.at("needle")) {
    const auto n = make_needle(c.at("length").get<int>(), c.at("depth").get<double>(), c.at("seed").get<std::uint64_t>(),
                               byte_counter());
    CHECK(n.prompt == c.at("prompt").get<std::string>());
    CHECK(n.key == c.at("key").get<std::string>());
    ++checked;
  }
  for (const auto& c : g.at("echo")) {
    const auto e = make_echo(c.at("seed").get<std::uint64_t>(), c.at("index").get<int>());
    CHECK(e.number == c.at("number").get<std::string>());
    CHECK(e.prompt == c.at("prompt").get<std::string>());
    ++checked;
  }
  for (const auto& c : g.at("counting")) {
    const auto k = make_counting(c.at("n").get<int>());
    CHECK(k.prompt == c.at("prompt").get<std::string>());
    CHECK(k.expected == c.at("expected").get<std::string>());
    ++checked;
  }
  CHECK(checked >= 10);
}

TEST_CASE("needle scoring is exact on the first word") {
  NeedleCase c;
  c.key = "AB3K9QZP";
  CHECK(score_needle(c, " AB3K9QZP\n").exact);
  CHECK(score_needle(c, "AB3K9QZP.").exact);
  CHECK_FALSE(score_needle(c, " AB3K9QZ").exact);
  CHECK_FALSE(score_needle(c, " the key AB3K9QZP").exact);
  CHECK(score_needle(c, " the key AB3K9QZP").contains);
}

TEST_CASE("counting scoring: exact, first divergence, repeated numbers (field note 004)") {
  const auto c = make_counting(10);
  CHECK(c.expected == "1 2 3 4 5 6 7 8 9 10");
  const auto ok = score_counting(c, " 1 2 3 4 5 6 7 8 9 10\n");
  CHECK(ok.exact);
  CHECK(ok.first_divergence == 0);
  CHECK(ok.repeated == 0);
  const auto rep = score_counting(c, "1 2 2 3 3 4 4 5 5 6 6 7 7 8 8 9 9 10 10 10 10");
  CHECK_FALSE(rep.exact);
  CHECK(rep.correct_prefix == 2);
  CHECK(rep.first_divergence == 3);
  CHECK(rep.repeated == 11);
  const auto skip = score_counting(c, "1 2 3 5 6");
  CHECK(skip.first_divergence == 4);
  CHECK(skip.repeated == 0);
  const auto none = score_counting(c, "Once upon a time");
  CHECK(none.numbers == 0);
  CHECK(none.first_divergence == 1);
}

TEST_CASE("echo scoring: exact and dropped digits (field note 003)") {
  EchoCase c;
  c.number = "10086";
  CHECK(score_echo(c, " 10086\n").exact);
  const auto s = score_echo(c, " 1086");
  CHECK_FALSE(s.exact);
  CHECK(s.dropped_digits == 1);
  CHECK(score_echo(c, "Reply").dropped_digits == 5);
  for (int i = 0; i < 200; ++i) {
    const auto e = make_echo(1, i);
    CHECK(e.number.size() >= 1);
    CHECK(e.number.size() <= 12);
    CHECK(e.number[0] != '0');
  }
}
