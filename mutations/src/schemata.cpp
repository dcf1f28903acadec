#include "kvgate_mutations/schemata.hpp"

#include <algorithm>
#include <cctype>
#include <ostream>
#include <regex>
#include <set>

namespace kvgate::mutate {

namespace fs = std::filesystem;

const char* to_string(SwitchForm f) {
  return f == SwitchForm::expression ? "expression" : f == SwitchForm::declaration ? "declaration" : "statement";
}

namespace {

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool op_char(char c) { return std::string_view("<>=!&|+-*/%^~").find(c) != std::string_view::npos; }
bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

int line_of(std::string_view t, std::size_t pos) {
  return 1 + static_cast<int>(std::count(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(std::min(pos, t.size())), '\n'));
}

// The text with comments blanked (newlines kept) and then, if `fold`, newlines turned into spaces.
// Empty optional when a literal spans a line or a preprocessor line is inside (cannot be folded).
std::optional<std::string> clean(std::string_view t, bool fold) {
  const auto cls = classify_chars(t);
  std::string out(t);
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (cls[i] == CharClass::directive) return std::nullopt;
    if (cls[i] == CharClass::literal && t[i] == '\n') return std::nullopt;
    if (cls[i] == CharClass::comment && t[i] != '\n') out[i] = ' ';
    if (fold && t[i] == '\n') out[i] = ' ';
  }
  if (fold && !out.empty() && out.back() == '\\') return std::nullopt;
  return out;
}

// Brackets balanced over code characters, never closing below zero; optionally no `;` or `,` at
// depth 0 (an expression).
bool balanced(std::string_view t, bool expression) {
  const auto cls = classify_chars(t);
  int depth = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (cls[i] != CharClass::code) {
      if (cls[i] == CharClass::directive) return false;
      continue;
    }
    const char c = t[i];
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') {
      if (--depth < 0) return false;
    }
    if (expression && depth == 0 && (c == ';' || c == ',')) return false;
  }
  return depth == 0;
}

std::string_view trim(std::string_view t) {
  while (!t.empty() && space(t.front())) t.remove_prefix(1);
  while (!t.empty() && space(t.back())) t.remove_suffix(1);
  return t;
}

bool starts_with_word(std::string_view t, std::string_view w) {
  t = trim(t);
  return t.size() >= w.size() && t.substr(0, w.size()) == w && (t.size() == w.size() || !ident_char(t[w.size()]));
}

// Code text with comments removed, trimmed: what a reader of the statement sees.
std::string code_only(std::string_view t) {
  const auto c = clean(t, true);
  return c ? std::string(trim(*c)) : std::string();
}

// An expression slot: text[s0, s1) is delimited on both sides as a complete operand.
struct Slot {
  std::size_t s0 = 0, s1 = 0;
};

std::optional<Slot> expression_slot(std::string_view f, const std::vector<CharClass>& cls, std::size_t b,
                                    std::size_t e) {
  std::size_t left = std::string_view::npos;
  int depth = 0;
  for (std::size_t i = b; i-- > 0;) {
    if (cls[i] == CharClass::directive) return std::nullopt;
    if (cls[i] != CharClass::code) continue;
    const char c = f[i];
    if (c == ')' || c == ']' || c == '}') {
      ++depth;
    } else if (c == '(' || c == '[' || c == '{') {
      if (depth == 0) {
        left = i;
        break;
      }
      --depth;
    } else if (depth == 0 && (c == ',' || c == ';')) {
      left = i;
      break;
    } else if (depth == 0 && c == '=') {
      const char p = i > 0 ? f[i - 1] : ' ', n = i + 1 < f.size() ? f[i + 1] : ' ';
      const bool comparison = n == '=' || p == '=' || p == '!' || ((p == '<' || p == '>') && !(i > 1 && f[i - 2] == p));
      if (!comparison) {
        left = i;
        break;
      }
    }
  }
  if (left == std::string_view::npos) return std::nullopt;
  std::size_t right = std::string_view::npos;
  depth = 0;
  for (std::size_t i = e; i < f.size(); ++i) {
    if (cls[i] == CharClass::directive) return std::nullopt;
    if (cls[i] != CharClass::code) continue;
    const char c = f[i];
    if (c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if (c == ')' || c == ']' || c == '}') {
      if (depth == 0) {
        right = i;
        break;
      }
      --depth;
    } else if (depth == 0 && (c == ',' || c == ';')) {
      right = i;
      break;
    } else if (depth == 0 && c == '=') {
      const char p = i > 0 ? f[i - 1] : ' ', n = i + 1 < f.size() ? f[i + 1] : ' ';
      if (n != '=' && p != '=' && p != '!' && p != '<' && p != '>') {
        right = i;
        break;
      }
    }
  }
  if (right == std::string_view::npos) return std::nullopt;
  Slot s{left + 1, right};
  // A statement keyword before the operand is not part of it.
  for (bool again = true; again;) {
    again = false;
    std::size_t k = s.s0;
    while (k < s.s1 && (space(f[k]) || cls[k] == CharClass::comment)) ++k;
    for (const std::string_view w : {"return", "throw", "co_return", "co_yield", "else", "do"}) {
      if (f.substr(k, w.size()) == w && (k + w.size() >= f.size() || !ident_char(f[k + w.size()]))) {
        s.s0 = k + w.size();
        again = true;
        break;
      }
    }
  }
  if (s.s0 > b) return std::nullopt;  // the change was in the keyword itself
  return s;
}

bool not_an_expression(std::string_view code) {
  for (const std::string_view w : {"if", "for", "while", "switch", "case", "default", "goto", "static_assert", "using",
                                   "typedef", "template", "namespace", "struct", "class", "enum", "constexpr",
                                   "static", "const", "auto", "int", "bool", "float", "double", "char", "void",
                                   "unsigned", "long", "short", "std::size_t", "size_t"})
    if (starts_with_word(code, w)) return true;
  return code.empty();
}

// What precedes text position `pos` (skipping blanks and comments): a statement may start there.
bool statement_may_start_at(std::string_view f, const std::vector<CharClass>& cls, std::size_t pos) {
  std::size_t i = pos;
  while (i > 0 && (space(f[i - 1]) || cls[i - 1] == CharClass::comment)) --i;
  if (i == 0) return false;  // file scope
  if (cls[i - 1] == CharClass::directive) return false;
  const char c = f[i - 1];
  if (c == ';' || c == '{' || c == '}' || c == ')' || c == ':') return true;
  for (const std::string_view w : {"else", "do"})
    if (i >= w.size() && f.substr(i - w.size(), w.size()) == w && (i == w.size() || !ident_char(f[i - w.size() - 1])))
      return true;
  return false;
}

bool statement_sequence(std::string_view t) {
  const std::string code = code_only(t);
  if (code.empty()) return true;  // nothing (a deleted or an inserted statement's other side)
  if (!balanced(t, false)) return false;
  if (code.back() != ';' && code.back() != '}') return false;
  for (const std::string_view w : {"else", "case", "default", "public", "private", "protected", "template"})
    if (starts_with_word(code, w)) return false;
  return code.front() != '}' && code.front() != '#';
}

// The next code after `pos` is the keyword `else`: the lines before it end an `if` whose `else`
// belongs to the same statement, so wrapping them in braces would orphan the `else`.
bool else_follows(std::string_view t, const std::vector<CharClass>& c, std::size_t pos) {
  std::size_t i = pos;
  while (i < t.size() && (space(t[i]) || c[i] == CharClass::comment)) ++i;
  return i + 4 <= t.size() && t.substr(i, 4) == "else" && (i + 4 == t.size() || !ident_char(t[i + 4])) &&
         c[i] == CharClass::code;
}

// [s0, s1) is the whole condition of an `if (...)` or `while (...)` (not `if constexpr`, whose
// condition is a constant expression): `(` right before s0 preceded by the keyword, `)` at s1.
bool condition_slot(std::string_view f, const std::vector<CharClass>& cls, std::size_t s0, std::size_t s1) {
  if (s0 == 0 || s1 >= f.size() || f[s0 - 1] != '(' || f[s1] != ')') return false;
  std::size_t i = s0 - 1;
  while (i > 0 && (space(f[i - 1]) || cls[i - 1] == CharClass::comment)) --i;
  for (const std::string_view w : {"if", "while"})
    if (i >= w.size() && f.substr(i - w.size(), w.size()) == w && (i == w.size() || !ident_char(f[i - w.size() - 1])) &&
        cls[i - w.size()] == CharClass::code)
      return true;
  return false;
}

// A single declaration statement `DECL = INIT;` in t[lb, le) (absolute positions, classes c): the
// positions of its top-level `=` and of its final `;`. Refused (nullopt): no top-level `=`, a
// compound assignment or comparison at the top level, a second top-level `=` or `,` (several
// declarators), code after the `;`, unbalanced brackets.
struct DeclSplit {
  std::size_t eq = 0, semi = 0;
};
std::optional<DeclSplit> declaration_split(std::string_view t, const std::vector<CharClass>& c, std::size_t lb, std::size_t le) {
  int depth = 0;
  std::optional<std::size_t> eq;
  std::optional<std::size_t> semi;
  for (std::size_t i = lb; i < le && i < t.size(); ++i) {
    if (c[i] != CharClass::code || space(t[i])) continue;
    const char ch = t[i];
    if (semi) return std::nullopt;  // code after the `;`: more than one statement
    if (ch == '(' || ch == '[' || ch == '{') {
      ++depth;
    } else if (ch == ')' || ch == ']' || ch == '}') {
      if (--depth < 0) return std::nullopt;
    } else if (depth == 0 && ch == '=') {
      const char prev = i > lb ? t[i - 1] : ' ', next = i + 1 < le ? t[i + 1] : ' ';
      if (eq || next == '=' || std::string_view("=<>!+-*/%&|^").find(prev) != std::string_view::npos) return std::nullopt;
      eq = i;
    } else if (depth == 0 && ch == ',' && eq) {
      return std::nullopt;
    } else if (depth == 0 && ch == ';') {
      semi = i;
    }
  }
  if (!eq || !semi || depth != 0) return std::nullopt;
  return DeclSplit{*eq, *semi};
}

// DECL (the code before the `=`) declares one plain variable by value: at least a type and a name,
// the name last, no reference (`&`: binding the lambda's returned copy would dangle), no array,
// member access or call, and no storage or constant-expression keyword (a static initializes once,
// a constexpr cannot read the switch).
bool plain_declarator(std::string_view decl_code) {
  for (const std::string_view w : {"return", "using", "typedef", "static", "thread_local", "extern", "constexpr", "constinit",
                                   "consteval", "goto", "case", "default", "if", "for", "while", "switch", "else", "do",
                                   "throw", "delete", "co_return", "co_yield", "co_await", "friend", "template", "operator"})
    if (starts_with_word(decl_code, w)) return false;
  for (const char ch : decl_code)
    if (ch == '&' || ch == '[' || ch == ']' || ch == '.' || ch == '(' || ch == ')' || ch == '{' || ch == '}' || ch == ';' ||
        ch == '"' || ch == '\'')
      return false;
  if (decl_code.find("->") != std::string_view::npos) return false;
  std::size_t end = decl_code.size();
  while (end > 0 && space(decl_code[end - 1])) --end;
  if (end == 0 || !ident_char(decl_code[end - 1])) return false;
  std::size_t start = end;
  while (start > 0 && ident_char(decl_code[start - 1])) --start;
  if (std::isdigit(static_cast<unsigned char>(decl_code[start]))) return false;
  // something (the type) before the name
  for (std::size_t i = 0; i < start; ++i)
    if (ident_char(decl_code[i])) return true;
  return false;
}

}  // namespace

std::vector<CharClass> classify_chars(std::string_view t) {
  std::vector<CharClass> c(t.size(), CharClass::code);
  std::size_t i = 0;
  bool line_start = true;
  while (i < t.size()) {
    const char ch = t[i];
    if (ch == '\n') {
      line_start = true;
      ++i;
      continue;
    }
    if (line_start && (ch == ' ' || ch == '\t')) {
      ++i;
      continue;
    }
    if (line_start && ch == '#') {  // a directive, with its continuations
      while (i < t.size()) {
        if (t[i] == '\n' && (i == 0 || t[i - 1] != '\\')) break;
        c[i++] = CharClass::directive;
      }
      continue;
    }
    line_start = false;
    if (ch == '/' && i + 1 < t.size() && t[i + 1] == '/') {
      while (i < t.size() && t[i] != '\n') c[i++] = CharClass::comment;
      continue;
    }
    if (ch == '/' && i + 1 < t.size() && t[i + 1] == '*') {
      const std::size_t end = t.find("*/", i + 2);
      const std::size_t stop = end == std::string_view::npos ? t.size() : end + 2;
      for (; i < stop; ++i) c[i] = CharClass::comment;
      continue;
    }
    if (ch == '"' && i > 0 && t[i - 1] == 'R' && (i < 2 || !ident_char(t[i - 2]) || t[i - 2] == '8' ||
                                                   t[i - 2] == 'u' || t[i - 2] == 'U' || t[i - 2] == 'L')) {
      const std::size_t paren = t.find('(', i);
      if (paren != std::string_view::npos) {
        const std::string close = ")" + std::string(t.substr(i + 1, paren - i - 1)) + "\"";
        const std::size_t end = t.find(close, paren);
        const std::size_t stop = end == std::string_view::npos ? t.size() : end + close.size();
        for (; i < stop; ++i) c[i] = CharClass::literal;
        continue;
      }
    }
    if (ch == '"' || ch == '\'') {
      if (ch == '\'' && i > 0 && std::isxdigit(static_cast<unsigned char>(t[i - 1]))) {
        // A digit separator (1'000) when the token it is in starts with a digit.
        std::size_t k = i;
        while (k > 0 && (ident_char(t[k - 1]) || t[k - 1] == '\'' || t[k - 1] == '.')) --k;
        if (std::isdigit(static_cast<unsigned char>(t[k]))) {
          ++i;
          continue;
        }
      }
      c[i++] = CharClass::literal;
      while (i < t.size() && t[i] != ch && t[i] != '\n') {
        if (t[i] == '\\' && i + 1 < t.size()) c[i++] = CharClass::literal;
        c[i++] = CharClass::literal;
      }
      if (i < t.size() && t[i] == ch) c[i++] = CharClass::literal;
      continue;
    }
    ++i;
  }
  return c;
}

std::vector<SwitchEdit> switch_candidates(std::string_view f, const Mutant& m, int n, std::string* why) {
  std::vector<SwitchEdit> out;
  auto no = [&](const std::string& w) {
    if (why) *why = w;
    return std::vector<SwitchEdit>{};
  };
  const std::size_t hits = count_occurrences(f, m.anchor);
  if (m.occurrences != 1 || hits != 1)
    return no("the anchor occurs " + std::to_string(hits) + " times (a switch is generated for one)");
  const std::size_t h = f.find(m.anchor);
  const std::string fm = std::string(f.substr(0, h)) + m.replacement + std::string(f.substr(h + m.anchor.size()));
  // The changed region: [b, ea) in the original, [b, er) in the mutated text.
  std::size_t b = 0;
  while (b < f.size() && b < fm.size() && f[b] == fm[b]) ++b;
  std::size_t s = 0;
  while (s < f.size() - b && s < fm.size() - b && f[f.size() - 1 - s] == fm[fm.size() - 1 - s]) ++s;
  std::size_t ea = f.size() - s, er = fm.size() - s;
  // Whole lines deleted or inserted by an anchor that starts after the indentation: the change then
  // reads "X\n<indent>" at the indented position; the same change is "<indent>X\n" at the line
  // start, which the statement form takes as whole lines.
  {
    const std::size_t lb0 = b == 0 ? 0 : f.rfind('\n', b - 1) == std::string_view::npos ? 0 : f.rfind('\n', b - 1) + 1;
    const std::size_t k = b - lb0;
    const bool indent = k > 0 && f.substr(lb0, k).find_first_not_of(" \t") == std::string_view::npos;
    if (indent && (ea == b) != (er == b)) {
      const std::string_view t = ea == b ? std::string_view(fm).substr(b, er - b) : f.substr(b, ea - b);
      if (t.size() > k && t.substr(t.size() - k) == f.substr(lb0, k) && t[t.size() - k - 1] == '\n') {
        b -= k;
        ea -= k;
        er -= k;
      }
    }
  }
  const auto cls = classify_chars(f);
  const auto clsm = classify_chars(fm);
  bool only_comments = true;
  for (std::size_t i = b; i < ea; ++i) {
    if (cls[i] == CharClass::directive) return no("the change touches a preprocessor line");
    only_comments = only_comments && (cls[i] == CharClass::comment || space(f[i]));
  }
  for (std::size_t i = b; i < er; ++i) {
    if (clsm[i] == CharClass::directive) return no("the change touches a preprocessor line");
    only_comments = only_comments && (clsm[i] == CharClass::comment || space(fm[i]));
  }
  if (only_comments) return no("only comments or blanks change (the rebuild path tells a no-op)");
  // A comment that changes with the code (the mutant's own note) is not part of the change: the
  // slot is sought from the last changed code character; the mapping to the mutated text keeps
  // the whole region (ea0, er0), so the comment ends up blanked inside the switch.
  const std::size_t ea0 = ea, er0 = er;
  std::size_t ea1 = ea, er1 = er;
  while (ea1 > b && (cls[ea1 - 1] == CharClass::comment || space(f[ea1 - 1]))) --ea1;
  while (er1 > b && (clsm[er1 - 1] == CharClass::comment || space(fm[er1 - 1]))) --er1;
  // ... and code that both texts share before that comment is not either.
  ea = ea1;
  er = er1;
  while (ea > b && er > b && f[ea - 1] == fm[er - 1] && cls[ea - 1] == CharClass::code) {
    --ea;
    --er;
  }
  // A position of the original at or after the change, in the mutated text.
  const auto to_mutated = [&](std::size_t p) { return p <= ea1 ? p + er1 - ea1 : p + er0 - ea0; };
  // Whole tokens: an identifier, a number or an operator cut by the change.
  while (b > 0 && cls[b - 1] == CharClass::code && (ident_char(f[b - 1]) || op_char(f[b - 1]))) --b;
  while (ea < f.size() && cls[ea] == CharClass::code && (ident_char(f[ea]) || op_char(f[ea]))) ++ea;
  const std::string on_call = "::kvgate_mutant_schema::on(" + std::to_string(n) + ")";
  // 1. expression form
  if (const auto slot = expression_slot(f, cls, b, ea)) {
    const std::string_view off = f.substr(slot->s0, slot->s1 - slot->s0);
    const std::size_t s1m = to_mutated(slot->s1);  // the same delimiter in the mutated text
    const std::string_view on = std::string_view(fm).substr(slot->s0, s1m - slot->s0);
    const auto off1 = clean(off, true), on1 = clean(on, true);
    const std::string off_code = code_only(off), on_code = code_only(on);
    if (off1 && on1 && balanced(off, true) && balanced(on, true) && !not_an_expression(off_code) &&
        !not_an_expression(on_code)) {
      SwitchEdit ed;
      ed.form = SwitchForm::expression;
      ed.begin = slot->s0;
      ed.end = slot->s1;
      ed.first_line = line_of(f, ed.begin);
      ed.last_line = line_of(f, ed.end == ed.begin ? ed.end : ed.end - 1);
      if (condition_slot(f, cls, slot->s0, slot->s1)) {
        // The whole condition of an `if` / `while`: both sides are converted to bool as the statement
        // converts its condition (contextually, explicit operator bool included), so a mutant that
        // turns `opt` into `false && opt` is a switch without changing what either side means.
        ed.text = "(" + on_call + " ? static_cast<bool>(" + std::string(trim(*on1)) + ") : static_cast<bool>(" +
                  *clean(off, false) + "))";
      } else {
        const std::string off_type = "decltype((" + std::string(trim(*off1)) + "))";
        ed.text = "(" + on_call + " ? static_cast<::kvgate_mutant_schema::same_t<" + off_type +
                  ">>(::kvgate_mutant_schema::typed<" + off_type + ">(" + std::string(trim(*on1)) + ")) : (" +
                  *clean(off, false) + "))";
      }
      ed.off_pos = ed.text.size() - 2 - off.size();
      out.push_back(std::move(ed));
    }
  }
  // 2. statement form: the whole lines that hold the change
  {
    const std::size_t lb = b == 0 ? 0 : f.rfind('\n', b - 1) == std::string_view::npos ? 0 : f.rfind('\n', b - 1) + 1;
    // The region's end: the end of its last line, or, when whole lines (with their newline) go or
    // come, the newline before the common rest.
    std::size_t le, lem;
    // Whole lines inserted before the line at lb (nothing of the original changes) count too.
    const bool inserted_lines = ea0 == lb && b == lb && er0 > lb && fm[er0 - 1] == '\n';
    const bool whole_lines =
        inserted_lines || (ea0 > lb && f[ea0 - 1] == '\n' && (er0 == lb || (er0 > lb && fm[er0 - 1] == '\n')));
    if (whole_lines) {
      le = ea0 > lb ? ea0 - 1 : lb;
      lem = er0 > lb ? er0 - 1 : lb;
    } else {
      const std::size_t last = ea0 > b ? ea0 - 1 : b;
      le = f[std::min(last, f.size() - 1)] == '\n' ? last : f.find('\n', last);
      if (le == std::string_view::npos) le = f.size();
      lem = le + er0 >= ea0 + lb ? le + er0 - ea0 : std::string_view::npos;
    }
    // A change inside a statement that goes on over the next lines: the region grows line by line
    // (up to 8) until both versions are whole statements.
    for (int grow_lines = 0; grow_lines <= 8 && le >= lb && lem != std::string_view::npos && lem >= lb &&
                             lem <= fm.size();
         ++grow_lines) {
      if (grow_lines > 0) {
        if (whole_lines || le >= f.size()) break;
        const std::size_t next = f.find('\n', le + 1);
        const std::size_t nle = next == std::string_view::npos ? f.size() : next;
        lem += nle - le;
        le = nle;
        if (lem > fm.size()) break;
      }
      const std::string_view off = f.substr(lb, le - lb);
      const std::string_view on = std::string_view(fm).substr(lb, lem - lb);
      const auto off_clean = clean(off, false), on1 = clean(on, true);
      if (off_clean && on1 && statement_sequence(off) && statement_sequence(on) &&
          statement_may_start_at(f, cls, lb) && !else_follows(f, cls, le) && !else_follows(fm, clsm, lem)) {
        // 2a. declaration form: one declaration whose initializer changes keeps its name in scope
        // (the statement form would end the name's scope at its closing brace).
        const auto d = declaration_split(f, cls, lb, le);
        const auto dm = declaration_split(fm, clsm, lb, lem);
        if (d && dm && code_only(f.substr(lb, d->eq - lb)) == code_only(std::string_view(fm).substr(lb, dm->eq - lb)) &&
            plain_declarator(code_only(f.substr(lb, d->eq - lb)))) {
          const std::string_view off_init = f.substr(d->eq + 1, d->semi - d->eq - 1);
          const std::string_view on_init = std::string_view(fm).substr(dm->eq + 1, dm->semi - dm->eq - 1);
          const auto off_init_clean = clean(off_init, false), on_init1 = clean(on_init, true);
          if (off_init_clean && on_init1 && !trim(*on_init1).empty() && !trim(*off_init_clean).empty()) {
            SwitchEdit ed;
            ed.form = SwitchForm::declaration;
            ed.begin = d->eq + 1;
            ed.end = d->semi;
            ed.first_line = line_of(f, ed.begin);
            ed.last_line = line_of(f, ed.end == ed.begin ? ed.end : ed.end - 1);
            ed.text = " [&]() { if (" + on_call + ") return " + std::string(trim(*on_init1)) + "; return ";
            ed.off_pos = ed.text.size();
            ed.text += *off_init_clean + "; }()";
            out.push_back(std::move(ed));
          }
        }
        SwitchEdit ed;
        ed.form = SwitchForm::statement;
        ed.begin = lb;
        ed.end = le;
        ed.first_line = line_of(f, lb);
        ed.last_line = line_of(f, le == lb ? le : le - 1);
        ed.text = "if (" + on_call + ") { " + std::string(trim(*on1)) + " } else { " + *off_clean + " }";
        ed.off_pos = ed.text.size() - 2 - off.size();
        out.push_back(std::move(ed));
        break;
      }
    }
  }
  if (out.empty()) return no("the change is neither inside a delimited expression nor whole statements");
  return out;
}

std::string schema_header(const std::vector<std::string>& ids) {
  std::string t =
      "// Generated by kvgate mutate into the scratch build (mutant schemata): the switch that turns one\n"
      "// catalog mutant on. KVGATE_MUTANT=<id> selects it (read once per process); unset or empty: none.\n"
      "// KVGATE_MUTANT_REACHED=<file>: the file is created when the active mutant's code first runs.\n"
      "// KVGATE_MUTANT_COVERAGE=<file>: at exit, the IDs of every switch evaluated are appended to it.\n"
      "#pragma once\n#include <atomic>\n#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n"
      "#include <cstddef>\n#include <type_traits>\n\nnamespace kvgate_mutant_schema {\n\n"
      "// The type an expression switch casts the mutated operand to: the unmutated operand's own type and\n"
      "// value category (decltype((e))), so the switch, off, is that very operand (an lvalue stays the\n"
      "// object, never a copy: a returned or bound reference keeps pointing at it); an array (a string\n"
      "// literal) decays to a pointer, as it does in the conditional anyway.\n"
      "template <class T> struct same { using type = T; };\n"
      "template <class T, std::size_t N> struct same<T (&)[N]> { using type = T*; };\n"
      "template <class T> using same_t = typename same<T>::type;\n"
      "// The mutated operand must have the unmutated one's type (references, cv and array decay aside):\n"
      "// the cast above would otherwise convert a change of type away (a code read as std::uint8_t, cast\n"
      "// back to std::int8_t, is the original code, and the mutant would run as the original). Such a\n"
      "// mutant fails to compile here; the driver then moves it to the statement form, or to\n"
      "// patch-and-rebuild, where the change is compiled as written.\n"
      "template <class Off, class On>\nconstexpr On&& typed(On&& on) {\n"
      "  static_assert(std::is_same_v<std::decay_t<Off>, std::decay_t<On>>,\n"
      "                \"kvgate mutate: the mutant changes the type of the operand it switches\");\n"
      "  return static_cast<On&&>(on);\n}\n\n"
      "inline constexpr int kCount = " +
      std::to_string(ids.size() - 1) + ";\ninline constexpr const char* kIds[kCount + 1] = {\n";
  for (const auto& id : ids) t += "    \"" + id + "\",\n";
  t +=
      "};\n\n"
      "struct State {\n  int active = 0;  // 0: none; -1: an ID this build does not hold\n"
      "  const char* reached = nullptr;\n  const char* coverage = nullptr;\n};\n\n"
      "inline std::atomic<unsigned char> g_hit[kCount + 1];\n\n"
      "inline void dump_coverage() {\n"
      "  const char* path = std::getenv(\"KVGATE_MUTANT_COVERAGE\");\n"
      "  if (path == nullptr || *path == 0) return;\n"
      "  if (std::FILE* f = std::fopen(path, \"a\")) {\n"
      "    for (int i = 1; i <= kCount; ++i)\n"
      "      if (g_hit[i].load(std::memory_order_relaxed)) std::fprintf(f, \"%s\\n\", kIds[i]);\n"
      "    std::fclose(f);\n  }\n}\n\n"
      "inline const State& state() noexcept {\n"
      "  static const State s = [] {\n    State t;\n"
      "    if (const char* id = std::getenv(\"KVGATE_MUTANT\"); id != nullptr && *id != 0) {\n"
      "      t.active = -1;\n"
      "      for (int i = 1; i <= kCount; ++i)\n"
      "        if (std::strcmp(id, kIds[i]) == 0) t.active = i;\n    }\n"
      "    t.reached = std::getenv(\"KVGATE_MUTANT_REACHED\");\n"
      "    t.coverage = std::getenv(\"KVGATE_MUTANT_COVERAGE\");\n"
      "    if (t.coverage != nullptr && *t.coverage != 0) std::atexit(dump_coverage);\n"
      "    else t.coverage = nullptr;\n"
      "    return t;\n  }();\n  return s;\n}\n\n"
      "inline bool on(int n) noexcept {\n"
      "  const State& s = state();\n"
      "  if (s.coverage != nullptr) g_hit[n].store(1, std::memory_order_relaxed);\n"
      "  if (s.active != n) return false;\n"
      "  static std::atomic<bool> told{false};\n"
      "  if (s.reached != nullptr && !told.exchange(true))\n"
      "    if (std::FILE* f = std::fopen(s.reached, \"a\")) std::fclose(f);\n"
      "  return true;\n}\n\n}  // namespace kvgate_mutant_schema\n";
  return t;
}

namespace {
// `t` with the edits applied (positions relative to t; edits may nest).
std::string nest_edits(std::string t, std::vector<SwitchEdit> edits) {
  std::sort(edits.begin(), edits.end(), [](const SwitchEdit& a, const SwitchEdit& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
  });
  std::vector<SwitchEdit> top;
  std::vector<std::vector<SwitchEdit>> inner;
  for (auto& ed : edits) {
    if (!top.empty() && top.back().begin <= ed.begin && ed.end <= top.back().end) {
      inner.back().push_back(std::move(ed));
      continue;
    }
    if (!top.empty() && ed.begin < top.back().end) throw CatalogError("schemata: overlapping switches in one file");
    top.push_back(std::move(ed));
    inner.emplace_back();
  }
  for (std::size_t i = top.size(); i-- > 0;) {
    SwitchEdit& o = top[i];
    if (!inner[i].empty()) {
      std::vector<SwitchEdit> rel = inner[i];
      for (auto& r : rel) {
        r.begin -= o.begin;
        r.end -= o.begin;
      }
      o.text.replace(o.off_pos, o.end - o.begin, nest_edits(o.text.substr(o.off_pos, o.end - o.begin), std::move(rel)));
    }
    t.replace(o.begin, o.end - o.begin, o.text);
  }
  return t;
}
}  // namespace

std::string instrument_text(std::string_view f, std::vector<SwitchEdit> edits, const fs::path& header) {
  if (edits.empty()) return std::string(f);
  std::size_t first = edits.front().begin;
  for (const auto& ed : edits) first = std::min(first, ed.begin);
  // The include line: blank or comment-only, at brace depth 0 and outside conditional groups
  // (else inside one level, e.g. a classic include guard), before the first edit.
  const auto cls = classify_chars(f);
  std::size_t best = std::string_view::npos, best1 = std::string_view::npos;
  int depth = 0, pp = 0;
  for (std::size_t ls = 0; ls < first;) {
    std::size_t le = f.find('\n', ls);
    if (le == std::string_view::npos) le = f.size();
    // Blank, or a `//` comment from its first non-blank character to its end.
    std::size_t k = ls;
    while (k < le && space(f[k])) ++k;
    bool blank = k == le || (f.substr(k, 2) == "//" && cls[k] == CharClass::comment);
    const bool in_block_comment = ls > 0 && cls[ls - 1] == CharClass::comment;
    const bool continued = ls > 0 && cls[ls - 1] == CharClass::directive;
    if (blank && depth == 0 && !in_block_comment && !continued && le < first) {
      if (pp == 0 && best == std::string_view::npos) best = ls;
      if (pp == 1 && best1 == std::string_view::npos) best1 = ls;
    }
    const std::string_view line = trim(f.substr(ls, le - ls));
    if (!line.empty() && cls[ls + (f.substr(ls, le - ls).find(line.front()))] == CharClass::directive) {
      std::string_view d = trim(line.substr(1));
      if (d.substr(0, 2) == "if") ++pp;
      if (d.substr(0, 5) == "endif") --pp;
    }
    for (std::size_t i = ls; i < le; ++i)
      if (cls[i] == CharClass::code) {
        if (f[i] == '{') ++depth;
        if (f[i] == '}') --depth;
      }
    ls = le + 1;
  }
  if (best == std::string_view::npos) best = best1;
  if (best == std::string_view::npos)
    throw CatalogError("schemata: no blank or comment-only line at file scope before the first switch");
  std::string out = nest_edits(std::string(f), std::move(edits));  // the include line lies before every edit
  std::size_t le = out.find('\n', best);
  if (le == std::string::npos) le = out.size();
  out.replace(best, le - best, "#include \"" + header.string() + "\"");
  return out;
}

std::vector<LogLocation> error_locations(std::string_view log) {
  static const std::regex gcc(R"(^(.+?):(\d+):(\d+):\s+(fatal error|error|required from|  required from)\b)");
  static const std::regex gcc_req(R"(^(.+?):(\d+):(\d+):\s+required from)");
  // clang says where a template was instantiated in a note (gcc: "required from here").
  static const std::regex clang_inst(R"(^(.+?):(\d+):(\d+):\s+note: in instantiation of .* requested here)");
  // gcc names an always_inline intrinsic's header as the error ("inlining failed ... target specific
  // option mismatch": a switch's lambda lacks its function's target attribute) and the call in a note.
  static const std::regex gcc_called(R"(^(.+?):(\d+):(\d+):\s+note: called from here)");
  static const std::regex nvcc(R"(^(.+?)\((\d+)\): (error|catastrophic error))");
  std::vector<LogLocation> out;
  std::size_t pos = 0;
  while (pos < log.size()) {
    std::size_t nl = log.find('\n', pos);
    if (nl == std::string_view::npos) nl = log.size();
    const std::string line(log.substr(pos, nl - pos));
    pos = nl + 1;
    std::smatch mt;
    if (std::regex_search(line, mt, gcc) || std::regex_search(line, mt, gcc_req) ||
        std::regex_search(line, mt, clang_inst) || std::regex_search(line, mt, gcc_called) ||
        std::regex_search(line, mt, nvcc))
      out.push_back({mt[1].str(), std::stoi(mt[2].str()), mt.size() > 3 && mt[3].matched && !mt[3].str().empty() &&
                                                              std::isdigit(static_cast<unsigned char>(mt[3].str()[0]))
                                                          ? std::stoi(mt[3].str())
                                                          : 0});
  }
  return out;
}

bool SchemaPlan::has(const std::string& id) const { return find(id) != nullptr; }
const SchemaPlan::Entry* SchemaPlan::find(const std::string& id) const {
  for (const auto& e : switched)
    if (e.mutant->id == id) return &e;
  return nullptr;
}

namespace {

// Moves entry i to its next form, or to the fallback; returns true when it stays switched.
bool demote(SchemaPlan& plan, std::size_t i, const std::string& why) {
  auto& e = plan.switched[i];
  if (++e.chosen < e.candidates.size()) return true;
  plan.fallback[e.mutant->id] = why;
  plan.switched.erase(plan.switched.begin() + static_cast<std::ptrdiff_t>(i));
  return false;
}

bool overlaps(const SwitchEdit& a, const SwitchEdit& b) { return a.begin < b.end && b.begin < a.end; }

// Two switches of one file must not overlap: the later mutant (catalog order) moves on.
void resolve_overlaps(SchemaPlan& plan) {
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t i = 0; i < plan.switched.size() && !changed; ++i)
      for (std::size_t j = i + 1; j < plan.switched.size() && !changed; ++j) {
        const auto& a = plan.switched[i];
        const auto& b = plan.switched[j];
        if (a.mutant->file != b.mutant->file) continue;
        const SwitchEdit& ea = a.candidates[a.chosen];
        const SwitchEdit& eb = b.candidates[b.chosen];
        const bool nested = (ea.begin <= eb.begin && eb.end <= ea.end) || (eb.begin <= ea.begin && ea.end <= eb.end);
        if (overlaps(ea, eb) && !nested) {
          demote(plan, j, "its switch would overlap " + a.mutant->id + "'s in " + a.mutant->file);
          changed = true;
        }
      }
  }
}

}  // namespace

SchemaPlan plan_schemata(const fs::path& root, const std::vector<const Mutant*>& mutants) {
  SchemaPlan plan;
  plan.ids_by_number.push_back("");
  for (const Mutant* m : mutants) {
    plan.ids_by_number.push_back(m->id);
    const int n = static_cast<int>(plan.ids_by_number.size()) - 1;
    const std::string ext = fs::path(m->file).extension().string();
    if (ext == ".cu" || ext == ".cuh") {
      plan.fallback[m->id] = "a CUDA source (device code cannot read the switch)";
      continue;
    }
    if (ext != ".cpp" && ext != ".cc" && ext != ".cxx" && ext != ".hpp" && ext != ".h" && ext != ".hh" && ext != ".inl") {
      plan.fallback[m->id] = "not a C++ source (a script or data file the gates read: patched as it is)";
      continue;
    }
    if (!plan.originals.count(m->file)) {
      try {
        plan.originals[m->file] = read_text(root / m->file);
      } catch (const std::exception& ex) {
        plan.fallback[m->id] = ex.what();
        continue;
      }
    }
    std::string why;
    auto cands = switch_candidates(plan.originals[m->file], *m, n, &why);
    if (cands.empty()) {
      plan.fallback[m->id] = why;
      continue;
    }
    plan.switched.push_back({m, n, std::move(cands), 0});
  }
  resolve_overlaps(plan);
  return plan;
}

std::vector<std::string> write_schemata(const fs::path& root, const SchemaPlan& plan, const fs::path& header) {
  std::vector<std::string> written;
  const std::string h = schema_header(plan.ids_by_number);
  std::error_code ec;
  fs::create_directories(header.parent_path(), ec);
  if (!fs::exists(header) || read_text(header) != h) write_text(header, h);
  for (const auto& [file, original] : plan.originals) {
    std::vector<SwitchEdit> edits;
    for (const auto& e : plan.switched)
      if (e.mutant->file == file) edits.push_back(e.candidates[e.chosen]);
    const std::string text = instrument_text(original, edits, header);
    const fs::path p = root / file;
    if (read_text(p) != text) {
      write_text(p, text);
      written.push_back(file);
    }
  }
  return written;
}

int demote_on_errors(SchemaPlan& plan, const std::vector<LogLocation>& errors, const fs::path& root,
                     std::ostream& log) {
  auto same_file = [&](const std::string& logged, const std::string& rel) {
    const std::string abs = (root / rel).lexically_normal().string();
    if (logged == rel || logged == abs) return true;
    const std::string tail = "/" + rel;
    return logged.size() > tail.size() && logged.compare(logged.size() - tail.size(), tail.size(), tail) == 0;
  };
  std::set<std::string> to_move;  // mutant ids
  std::map<std::string, std::string> where;
  for (const auto& loc : errors) {
    const SchemaPlan::Entry* inside = nullptr;
    const SchemaPlan::Entry* before = nullptr;
    bool file_instrumented = false;
    for (const auto& e : plan.switched) {
      if (!same_file(loc.file, e.mutant->file)) continue;
      file_instrumented = true;
      const auto& c = e.candidates[e.chosen];
      if (loc.line >= c.first_line && loc.line <= c.last_line &&
          (!inside || c.last_line - c.first_line <=
                          inside->candidates[inside->chosen].last_line - inside->candidates[inside->chosen].first_line))
        inside = &e;  // the innermost (nested switches share lines)
      if (c.last_line < loc.line && (!before || before->candidates[before->chosen].last_line < c.last_line))
        before = &e;
    }
    if (!file_instrumented) continue;
    // Several switches on the error's line (one nested in another's text, or two on one line): the
    // column picks the one whose `on(N)` comes last before it, so a switch sharing the line with a
    // failing one is not moved with it.
    if (inside && loc.column > 0) {
      std::vector<const SchemaPlan::Entry*> on_line;
      for (const auto& e : plan.switched) {
        const auto& c = e.candidates[e.chosen];
        if (same_file(loc.file, e.mutant->file) && loc.line >= c.first_line && loc.line <= c.last_line) on_line.push_back(&e);
      }
      if (on_line.size() > 1) {
        std::string text;
        try {
          text = read_text(root / inside->mutant->file);  // the instrumented file the compiler read
        } catch (const std::exception&) {
        }
        std::size_t ls = text.empty() ? std::string::npos : 0;
        for (int l = 1; l < loc.line && ls != std::string::npos; ++l) {
          const std::size_t nl = text.find('\n', ls);
          ls = nl == std::string::npos ? std::string::npos : nl + 1;
        }
        if (ls != std::string::npos) {
          const std::size_t le = text.find('\n', ls);
          const std::string_view line = std::string_view(text).substr(ls, (le == std::string::npos ? text.size() : le) - ls);
          const std::size_t col = static_cast<std::size_t>(loc.column - 1);
          std::size_t best = std::string_view::npos;
          for (const auto* e : on_line) {
            const std::size_t at = line.find("::kvgate_mutant_schema::on(" + std::to_string(e->number) + ")");
            if (at != std::string_view::npos && at <= col && (best == std::string_view::npos || at > best)) {
              best = at;
              inside = e;
            }
          }
        }
      }
    }
    const SchemaPlan::Entry* hit = inside ? inside : before;
    if (hit) {
      to_move.insert(hit->mutant->id);
      where.emplace(hit->mutant->id, loc.file + ":" + std::to_string(loc.line));
    } else {
      for (const auto& e : plan.switched)
        if (same_file(loc.file, e.mutant->file)) {
          to_move.insert(e.mutant->id);
          where.emplace(e.mutant->id, loc.file + ":" + std::to_string(loc.line));
        }
    }
  }
  int moved = 0;
  for (const auto& id : to_move) {
    for (std::size_t i = 0; i < plan.switched.size(); ++i) {
      if (plan.switched[i].mutant->id != id) continue;
      const SwitchForm was = plan.switched[i].candidates[plan.switched[i].chosen].form;
      const bool stays = demote(plan, i, "no switch form compiles (the " + std::string(to_string(was)) +
                                             " form failed at " + where[id] + ")");
      log << "kvgate mutate: schemata: " << id << ": the " << to_string(was) << " switch does not compile ("
          << where[id] << "); " << (stays ? "trying the statement form" : "patch-and-rebuild") << "\n";
      ++moved;
      break;
    }
  }
  resolve_overlaps(plan);
  return moved;
}

}  // namespace kvgate::mutate
