// Probe generators and scoring; the recipe is normative in datasets/probes/RECIPE.md.
#include "kvgate/probes.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <tuple>

namespace kvgate::probes {

std::uint64_t SplitMix64::next() {
  s_ += 0x9E3779B97F4A7C15ULL;
  std::uint64_t z = s_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

namespace {

// RECIPE.md "Seeding": state0 = seed * 0x100000001B3 + a * 0x9E3779B97F4A7C15 + tag (mod 2^64).
std::uint64_t state0(std::uint64_t tag, std::uint64_t seed, std::uint64_t a) {
  return seed * 0x100000001B3ULL + a * 0x9E3779B97F4A7C15ULL + tag;
}
constexpr std::uint64_t kTagNeedle = 1, kTagEcho = 3;

constexpr std::string_view kKeyAlphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789";  // 32, no 0/O/1/I
constexpr std::array<std::string_view, 12> kServices = {"api-gateway", "auth",    "billing",  "scheduler",
                                                        "search",      "storage", "mailer",   "metrics",
                                                        "frontend",    "inventory", "payments", "notifier"};
constexpr std::array<std::string_view, 8> kResources = {"users", "orders", "invoices", "sessions",
                                                        "items", "reports", "events",  "carts"};
constexpr std::array<std::string_view, 8> kUsers = {"alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"};
constexpr std::array<std::string_view, 4> kVolumes = {"data", "log", "cache", "spool"};

constexpr std::string_view kNeedleHeader = "Below is a service log. One line in it holds the secret key.\n";
constexpr std::string_view kNeedleQuestion = "Question: What is the secret key?\nAnswer:";

std::string u(std::uint64_t v) { return std::to_string(v); }

std::string timestamp(std::uint64_t ms) {
  const std::uint64_t day = 1 + ms / 86400000ULL;
  const std::uint64_t in_day = ms % 86400000ULL;
  char b[40];
  std::snprintf(b, sizeof b, "2024-01-%02lluT%02llu:%02llu:%02llu.%03lluZ", static_cast<unsigned long long>(day),
                static_cast<unsigned long long>(in_day / 3600000ULL),
                static_cast<unsigned long long>(in_day / 60000ULL % 60),
                static_cast<unsigned long long>(in_day / 1000ULL % 60), static_cast<unsigned long long>(in_day % 1000));
  return b;
}

std::string level_of(std::uint64_t r) {  // r = below(20)
  if (r < 12) return "INFO ";
  if (r < 16) return "DEBUG";
  if (r < 19) return "WARN ";
  return "ERROR";
}

std::string message(SplitMix64& g) {
  switch (g.below(12)) {
    case 0: {
      const auto v = 1 + g.below(3);
      const auto res = kResources[g.below(8)];
      const auto id = g.below(100000);
      const auto ms = 1 + g.below(900);
      return "GET /api/v" + u(v) + "/" + std::string(res) + "/" + u(id) + " 200 in " + u(ms) + " ms";
    }
    case 1: {
      const auto v = 1 + g.below(3);
      const auto res = kResources[g.below(8)];
      const auto ms = 1 + g.below(900);
      return "POST /api/v" + u(v) + "/" + std::string(res) + " 201 in " + u(ms) + " ms";
    }
    case 2: {
      const auto user = kUsers[g.below(8)];
      const auto b = g.below(256), c = g.below(256), d = g.below(256);
      return "user " + std::string(user) + " logged in from 10." + u(b) + "." + u(c) + "." + u(d);
    }
    case 3: {
      const auto p = g.below(100), q = g.below(10);
      const auto n = 100 + g.below(99900);
      return "cache hit ratio " + u(p) + "." + u(q) + "% over " + u(n) + " requests";
    }
    case 4: {
      const auto m = 8 + g.below(57);
      const auto n = g.below(m + 1);
      return "connection pool " + u(n) + "/" + u(m) + " in use";
    }
    case 5: {
      const auto id = g.below(100000);
      const auto k = 1 + g.below(5);
      return "retrying job " + u(id) + " (attempt " + u(k) + " of 5)";
    }
    case 6: {
      const auto p = g.below(100);
      const auto vol = kVolumes[g.below(4)];
      return "disk usage at " + u(p) + "% on /var/" + std::string(vol);
    }
    case 7: {
      const auto n = 1 + g.below(5000);
      const auto res = kResources[g.below(8)];
      const auto ms = 1 + g.below(900);
      return "flushed " + u(n) + " records to " + std::string(res) + " in " + u(ms) + " ms";
    }
    case 8:
      return "health check passed (" + u(1 + g.below(900)) + " ms)";
    case 9: {
      const auto res = kResources[g.below(8)];
      const auto ms = 1000 + g.below(9000);
      return "slow query on " + std::string(res) + ": " + u(ms) + " ms";
    }
    case 10:
      return "worker " + u(g.below(64)) + " started";
    default:
      return "config reloaded, " + u(1 + g.below(500)) + " entries";
  }
}

struct LogLine {
  std::string ts;
  std::string text;  // with '\n'
};

LogLine next_line(SplitMix64& g, std::uint64_t& clock_ms) {
  clock_ms += 1 + g.below(4000);
  LogLine l;
  l.ts = timestamp(clock_ms);
  const std::string level = level_of(g.below(20));
  const auto svc = kServices[g.below(12)];
  const auto pid = 1000 + g.below(9000);
  l.text = l.ts + " " + level + " " + std::string(svc) + "[" + u(pid) + "]: " + message(g) + "\n";
  return l;
}

std::string assemble(const std::vector<LogLine>& lines, int n, int p, const std::string& needle_tail) {
  std::string s(kNeedleHeader);
  for (int i = 0; i <= n; ++i) {
    if (i == p) {
      const std::string& ts = (p < n) ? lines[p].ts : (n > 0 ? lines[n - 1].ts : timestamp(0));
      s += ts + needle_tail;
    }
    if (i < n) s += lines[i].text;
  }
  s += kNeedleQuestion;
  return s;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

TokenCounter byte_counter() {
  return [](const std::string& t) { return static_cast<int>(t.size()) + 1; };
}

std::optional<ProbeKind> parse_probe_kind(std::string_view s) {
  if (s == "needle") return ProbeKind::needle;
  if (s == "counting") return ProbeKind::counting;
  if (s == "echo") return ProbeKind::echo;
  return std::nullopt;
}

const char* to_string(ProbeKind k) {
  switch (k) {
    case ProbeKind::needle: return "needle";
    case ProbeKind::counting: return "counting";
    case ProbeKind::echo: return "echo";
  }
  return "?";
}

std::string haystack_line(SplitMix64& rng, std::uint64_t& clock_ms) { return next_line(rng, clock_ms).text; }

NeedleCase make_needle(int length, double depth, std::uint64_t seed, const TokenCounter& count) {
  if (length <= 0) throw std::invalid_argument("needle: length must be > 0");
  if (!(depth >= 0.0 && depth <= 1.0)) throw std::invalid_argument("needle: depth must be in [0, 1]");
  SplitMix64 g(state0(kTagNeedle, seed, static_cast<std::uint64_t>(length)));
  NeedleCase c;
  c.length = length;
  c.depth = depth;
  c.seed = seed;
  for (int i = 0; i < 8; ++i) c.key += kKeyAlphabet[g.below(kKeyAlphabet.size())];
  const auto needle_pid = 1000 + g.below(9000);
  const std::string needle_tail = " INFO  keystore[" + u(needle_pid) + "]: the secret key is " + c.key + "\n";
  std::uint64_t clock_ms = g.below(43200) * 1000ULL;

  // Estimate how many lines fit (per-line token counts add up closely), then settle exactly.
  const int empty = count("");
  const int frame = count(assemble({}, 0, 0, needle_tail));
  std::vector<LogLine> lines;
  int est = frame;
  while (est <= length && static_cast<int>(lines.size()) < length) {
    lines.push_back(next_line(g, clock_ms));
    est += std::max(1, count(lines.back().text) - empty);
  }
  for (int extra = 0; extra < 8; ++extra) lines.push_back(next_line(g, clock_ms));
  const int total = static_cast<int>(lines.size());
  auto build = [&](int n) {
    const int p = static_cast<int>(std::floor(depth * n + 0.5));
    return std::make_pair(assemble(lines, n, p, needle_tail), p);
  };
  int n = std::max(0, static_cast<int>(lines.size()) - 9);
  auto [text, p] = build(n);
  int tokens = count(text);
  while (tokens > length && n > 0) {
    --n;
    std::tie(text, p) = build(n);
    tokens = count(text);
  }
  while (n < total) {
    auto [t2, p2] = build(n + 1);
    const int k2 = count(t2);
    if (k2 > length) break;
    ++n;
    text = std::move(t2);
    p = p2;
    tokens = k2;
  }
  c.prompt = std::move(text);
  c.haystack_lines = n;
  c.needle_line = p;
  c.prompt_tokens = tokens;
  return c;
}

CountingCase make_counting(int n) {
  if (n <= 0) throw std::invalid_argument("counting: N must be > 0");
  CountingCase c;
  c.n = n;
  c.prompt = "Count from 1 to " + std::to_string(n) + ":\n";
  for (int i = 1; i <= n; ++i) c.expected += (i > 1 ? " " : "") + std::to_string(i);
  return c;
}

EchoCase make_echo(std::uint64_t seed, int index) {
  SplitMix64 g(state0(kTagEcho, seed, static_cast<std::uint64_t>(index)));
  EchoCase c;
  c.seed = seed;
  c.index = index;
  const int digits = 1 + static_cast<int>(g.below(12));
  c.number += static_cast<char>('1' + g.below(9));
  for (int i = 1; i < digits; ++i) c.number += static_cast<char>('0' + g.below(10));
  c.prompt = "Reply with " + c.number + " and nothing else.\nReply:";
  return c;
}

std::string first_word(std::string_view out) {
  std::size_t i = 0;
  while (i < out.size() && is_space(out[i])) ++i;
  std::size_t j = i;
  while (j < out.size() && !is_space(out[j])) ++j;
  std::string w(out.substr(i, j - i));
  while (!w.empty() && std::string_view(".,;:!?").find(w.back()) != std::string_view::npos) w.pop_back();
  return w;
}

NeedleScore score_needle(const NeedleCase& c, std::string_view output) {
  NeedleScore s;
  s.answer = first_word(output);
  s.exact = s.answer == c.key;
  s.contains = output.find(c.key) != std::string_view::npos;
  return s;
}

CountingScore score_counting(const CountingCase& c, std::string_view output) {
  std::vector<long long> v;
  for (std::size_t i = 0; i < output.size();) {
    if (std::isdigit(static_cast<unsigned char>(output[i]))) {
      std::size_t j = i;
      long long x = 0;
      while (j < output.size() && std::isdigit(static_cast<unsigned char>(output[j]))) {
        if (j - i < 18) x = x * 10 + (output[j] - '0');
        ++j;
      }
      v.push_back(x);
      i = j;
    } else {
      ++i;
    }
  }
  CountingScore s;
  s.numbers = static_cast<int>(v.size());
  while (s.correct_prefix < static_cast<int>(v.size()) && v[s.correct_prefix] == s.correct_prefix + 1) ++s.correct_prefix;
  s.exact = s.correct_prefix >= c.n;
  s.first_divergence = s.exact ? 0 : s.correct_prefix + 1;
  for (std::size_t i = 1; i < v.size(); ++i)
    if (v[i] == v[i - 1]) ++s.repeated;
  for (std::size_t i = 0; i < v.size() && i < 24; ++i) s.head.push_back(v[i]);
  return s;
}

int lcs_length(std::string_view a, std::string_view b) {
  std::vector<int> prev(b.size() + 1, 0), cur(b.size() + 1, 0);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = a[i - 1] == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

EchoScore score_echo(const EchoCase& c, std::string_view output) {
  EchoScore s;
  s.answer = first_word(output);
  s.exact = s.answer == c.number;
  std::string digits;
  for (char ch : s.answer)
    if (std::isdigit(static_cast<unsigned char>(ch))) digits += ch;
  s.dropped_digits = static_cast<int>(c.number.size()) - lcs_length(c.number, digits);
  return s;
}

int answer_budget(std::string_view expected, const TokenCounter& count, int margin) {
  return std::max(1, count(" " + std::string(expected)) - count("")) + margin;
}

nlohmann::json to_json(const NeedleCase& c) {
  return {{"length", c.length},         {"depth", c.depth},           {"seed", c.seed},
          {"key", c.key},               {"haystack_lines", c.haystack_lines}, {"needle_line", c.needle_line},
          {"actual_depth", c.actual_depth()}, {"prompt_tokens", c.prompt_tokens}};
}
nlohmann::json to_json(const CountingCase& c) { return {{"n", c.n}}; }
nlohmann::json to_json(const EchoCase& c) { return {{"seed", c.seed}, {"index", c.index}, {"number", c.number}}; }
nlohmann::json to_json(const NeedleScore& s) {
  return {{"exact", s.exact}, {"contains", s.contains}, {"answer", s.answer}};
}
nlohmann::json to_json(const CountingScore& s) {
  return {{"exact", s.exact},         {"correct_prefix", s.correct_prefix}, {"first_divergence", s.first_divergence},
          {"repeated", s.repeated},   {"numbers", s.numbers},               {"head", s.head}};
}
nlohmann::json to_json(const EchoScore& s) {
  return {{"exact", s.exact}, {"answer", s.answer}, {"dropped_digits", s.dropped_digits}};
}

}  // namespace kvgate::probes
