// Probe generators and exact scoring (needle, counting, echo). Runtime-independent: the only
// model-specific input is a token counter the caller passes in (the tokenizer of the subject, or
// byte counting for a byte-level model). The recipe is normative in datasets/probes/RECIPE.md and
// shared with the probe model's training data (datasets/models/probe/): change both together.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvgate::probes {

inline constexpr int kRecipeVersion = 1;

// SplitMix64 (Steele, Lea, Flood 2014). below(n) = next() % n (the bias is irrelevant here and the
// modulo keeps other-language reimplementations exact).
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next();
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next() % n; }

 private:
  std::uint64_t s_;
};

// Tokens the subject needs for `text` encoded as a prompt (BOS included when the subject adds one).
using TokenCounter = std::function<int(const std::string& text)>;
// A byte-level counter: text bytes + 1 (BOS). What a byte-vocabulary model sees.
TokenCounter byte_counter();

enum class ProbeKind { needle, counting, echo };
std::optional<ProbeKind> parse_probe_kind(std::string_view s);
const char* to_string(ProbeKind k);

// --- needle ----------------------------------------------------------------------------------
struct NeedleCase {
  int length = 0;        // requested context L (tokens, prompt included)
  double depth = 0;      // requested depth d in [0, 1]
  std::uint64_t seed = 0;
  std::string prompt;    // the whole prompt text (haystack + question)
  std::string key;       // the expected answer
  int haystack_lines = 0;  // log lines, the needle line not counted
  int needle_line = 0;     // 0-based index of the needle among all lines of the log
  int prompt_tokens = 0;   // tokens of `prompt` by the counter (<= length unless the frame alone is longer)
  double actual_depth() const { return haystack_lines == 0 ? 0.0 : double(needle_line) / haystack_lines; }
};
// One deterministic log line (haystack), and the needle's line; exposed for the recipe tests.
std::string haystack_line(SplitMix64& rng, std::uint64_t& clock_ms);
NeedleCase make_needle(int length, double depth, std::uint64_t seed, const TokenCounter& count);

// --- counting --------------------------------------------------------------------------------
struct CountingCase {
  int n = 0;
  std::string prompt;
  std::string expected;  // "1 2 3 ... N"
};
CountingCase make_counting(int n);

// --- echo ------------------------------------------------------------------------------------
struct EchoCase {
  std::uint64_t seed = 0;
  int index = 0;
  std::string number;
  std::string prompt;
};
EchoCase make_echo(std::uint64_t seed, int index);

// --- scoring (exact, on the generated text only) ---------------------------------------------
// The first whitespace-delimited word of the output, with trailing . , ; : removed.
std::string first_word(std::string_view output);

struct NeedleScore {
  bool exact = false;      // first_word(output) == key
  bool contains = false;   // the key appears anywhere in the output
  std::string answer;      // first_word(output)
};
NeedleScore score_needle(const NeedleCase& c, std::string_view output);

struct CountingScore {
  bool exact = false;          // the first N integers of the output are 1..N
  int correct_prefix = 0;      // leading integers equal to 1, 2, 3, ...
  int first_divergence = 0;    // 1-based position of the first wrong/missing integer; 0 when exact
  int repeated = 0;            // integers equal to the one before them (field note 004's artifact)
  int numbers = 0;             // integers read from the output
  std::vector<long long> head; // the first integers read (at most 24), for reports
};
CountingScore score_counting(const CountingCase& c, std::string_view output);

struct EchoScore {
  bool exact = false;      // first_word(output) == number
  std::string answer;
  int dropped_digits = 0;  // digits of the number missing from the answer's digits (LCS)
};
EchoScore score_echo(const EchoCase& c, std::string_view output);

// Longest common subsequence length (for dropped digits).
int lcs_length(std::string_view a, std::string_view b);

nlohmann::json to_json(const NeedleCase& c);
nlohmann::json to_json(const CountingCase& c);
nlohmann::json to_json(const EchoCase& c);
nlohmann::json to_json(const NeedleScore& s);
nlohmann::json to_json(const CountingScore& s);
nlohmann::json to_json(const EchoScore& s);

// Generation budget in tokens for a case: the expected answer's tokens (by the counter, BOS not
// counted) plus a margin.
int answer_budget(std::string_view expected_answer, const TokenCounter& count, int margin = 6);

}  // namespace kvgate::probes
