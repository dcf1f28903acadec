// What CI systems read from a mutation run (docs/MUTATIONS.md "CI"): JUnit XML with one testcase
// per mutant (`--junit FILE`) and GitHub Actions annotations (`--format github`).
#pragma once
#include <iosfwd>
#include <string>

#include "kvgate_mutations/report.hpp"

namespace kvgate::mutate {

// One testcase per mutant, the canary first (classname: the mutated file). killed: passed, the
// killing gates in <system-out>; survived and timeout: <failure> naming the gates that stayed
// green and the expected killers; unviable and noop: <error>; skipped and interrupted: <skipped>.
std::string junit_of_mutants(const RunResult& r);

// One `::error file=F,line=L,title=...::message` line per survived or timed-out mutant, at its
// anchor's first line (read from ctx.files_root, else ctx.source_dir), and one `::notice::` line
// with the counts. Workflow commands: GitHub turns them into annotations on the pull request.
std::string github_annotations(const RunResult& r, const ReportContext& ctx);

// The Markdown GitHub shows on the run's summary page (appended to $GITHUB_STEP_SUMMARY with
// --format github): the counts and one row per survivor or timeout (file:line, expected killers).
std::string github_step_summary(const RunResult& r, const ReportContext& ctx);

// The CI outputs the options ask for: the JUnit file (atomically) and, with --format github, the
// annotations on `out` (stdout: where the Actions runner reads workflow commands) and the step
// summary appended to $GITHUB_STEP_SUMMARY when that is set.
void write_ci_outputs(const RunResult& r, const ReportContext& ctx, std::ostream& out, std::ostream& log);

}  // namespace kvgate::mutate
