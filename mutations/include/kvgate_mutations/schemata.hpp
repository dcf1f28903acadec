// Mutant schemata: every catalog mutant that can be written as a run-time switch is compiled into
// the scratch build once, behind `::kvgate_mutant_schema::on(N)`, and turned on for a gate run by
// KVGATE_MUTANT=<id> (read once per process). The catalog stays anchor + replacement: the switch
// is generated from it here. A mutant that cannot be expressed as a switch (a change at namespace
// or class scope, a type, a preprocessor line, a constant expression, CUDA device code, a comment)
// takes the patch-and-rebuild path, and the report says which path each mutant took and why.
//
// Three forms, tried in this order for each mutant (docs/MUTATIONS.md, "Schemata"):
//  - expression: the smallest expression slot around the changed tokens (between a `(`, `[`, `{`,
//    `,`, `=`, `return` or `;` and the matching `)`, `]`, `}`, `,` or `;`) becomes
//      (on(N) ? static_cast<same_t<decltype((OFF))>>(ON) : (OFF))
//    so the unmutated operand keeps its type, value category and precedence (an lvalue stays the
//    object itself: a reference returned or bound to it does not dangle);
//  - declaration: when those whole lines are one declaration `DECL = INIT;` of a plain variable
//    (by value, not static or constexpr) and only INIT changes, INIT becomes
//      [&]() { if (on(N)) return ON_INIT; return OFF_INIT; }()
//    so the name stays in scope for the code after it; both returns must deduce one type (a
//    mutant that changes the type fails to compile and moves on);
//  - statement: the whole lines that hold the change, when they are complete statements, become
//      if (on(N)) { ON } else { OFF }
// Both keep every original line where it was (the mutated text is folded onto the first line),
// so compiler messages, __LINE__ and the scratch build's line numbers stay those of the source.
// Which form compiles is decided by the compiler: the driver builds, reads the errors' file:line,
// moves each mutant named there to its next form (or to patch-and-rebuild), and builds again.
#pragma once
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvgate_mutations/catalog.hpp"

namespace kvgate::mutate {

// Per character of a C++ text: code, comment, string/char literal, or preprocessor line.
enum class CharClass : unsigned char { code, comment, literal, directive };
std::vector<CharClass> classify_chars(std::string_view text);

enum class SwitchForm { expression, declaration, statement };
const char* to_string(SwitchForm f);

// One way to write a mutant as a switch: replace text[begin, end) by `text`.
struct SwitchEdit {
  SwitchForm form = SwitchForm::expression;
  std::size_t begin = 0, end = 0;  // in the original file text
  int first_line = 1, last_line = 1;  // 1-based lines of [begin, end)
  std::string text;                // what goes in its place (keeps the line count)
  // Where the unmutated text [begin, end) sits, unchanged in length, inside `text`: a switch whose
  // region lies inside this one is written there (it is off whenever this one is on).
  std::size_t off_pos = 0;
};

// The candidate switches of mutant number `n` in `original` (its file's text), most preferred
// first; empty with `why` when the mutant cannot be a switch at all.
std::vector<SwitchEdit> switch_candidates(std::string_view original, const Mutant& m, int n, std::string* why);

// The generated header every instrumented file includes: the ID table and on(N).
std::string schema_header(const std::vector<std::string>& ids_by_number);

// The instrumented text of one file: the edits (non-overlapping) applied, and the header included
// on a blank or comment-only line at file scope before the first edit (so no line moves).
// Throws CatalogError when no such line exists.
std::string instrument_text(std::string_view original, std::vector<SwitchEdit> edits,
                            const std::filesystem::path& header);

// Every file:line(:col) an error (or the "required from" note of one) names in a compiler log:
// GCC/Clang `file:line:col: error` and NVCC `file(line): error`. Where several switches share the
// line, the column decides which one the error is in (the innermost whose `on(N)` precedes it).
struct LogLocation {
  std::string file;
  int line = 0;
  int column = 0;  // 1-based (GCC/Clang); 0 when the compiler gives none (NVCC)
};
std::vector<LogLocation> error_locations(std::string_view log);

// The whole plan of one run: which mutants are switches (and in which form), which are not.
struct SchemaPlan {
  struct Entry {
    const Mutant* mutant = nullptr;
    int number = 0;                    // N in on(N); 1-based
    std::vector<SwitchEdit> candidates;
    std::size_t chosen = 0;            // index into candidates
  };
  std::vector<Entry> switched;                      // currently compiled in
  std::map<std::string, std::string> fallback;      // mutant id -> why it is patched and rebuilt
  std::vector<std::string> ids_by_number;           // [0] = ""
  std::map<std::string, std::string> originals;     // file -> its unmutated text
  bool has(const std::string& id) const;
  const Entry* find(const std::string& id) const;
};

// The plan for `mutants` in the tree at `root` (the scratch copy): candidates per mutant, overlaps
// and files that cannot carry a switch sent to the fallback with the reason.
SchemaPlan plan_schemata(const std::filesystem::path& root, const std::vector<const Mutant*>& mutants);

// Writes every file of the plan into `root` (instrumented, or back to the original when none of
// its mutants is switched any more) and the header at `header`. Returns the files written.
std::vector<std::string> write_schemata(const std::filesystem::path& root, const SchemaPlan& plan,
                                        const std::filesystem::path& header);

// After a failed build: each switched mutant whose edit holds an error location moves to its next
// candidate form, or to the fallback when none is left. An error in an instrumented file outside
// every edit is charged to the nearest edit before it in that file (a declaration the statement
// form put out of scope). Returns the number of mutants moved (0: the errors are not the schema's).
int demote_on_errors(SchemaPlan& plan, const std::vector<LogLocation>& errors, const std::filesystem::path& root,
                     std::ostream& log);

}  // namespace kvgate::mutate
