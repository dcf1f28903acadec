// Child processes for builds and gate runs: each in its own process group, stdout+stderr to a
// log file, a wall-clock timeout that kills the whole group, and Ctrl-C (SIGINT/SIGTERM) turned
// into a flag the driver polls so that it can restore the scratch tree and still write results.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace kvgate::mutate {

struct ProcSpec {
  std::vector<std::string> argv;
  std::string cwd;                                          // empty: inherit
  std::vector<std::pair<std::string, std::string>> env;     // overrides
  std::string log_path;                                     // stdout+stderr; empty: /dev/null
  double timeout_s = 0;                                     // 0: none
};

struct ProcResult {
  int exit_code = -1;    // valid when term_signal == 0 and !timed_out
  int term_signal = 0;   // signal that ended the child (not ours)
  bool timed_out = false;
  bool interrupted = false;  // killed because the driver was interrupted
  bool stopped = false;      // killed, or never started, because the caller's stop_when said so
  bool spawn_failed = false;
  double seconds = 0;
  bool ok() const { return ended_normally() && exit_code == 0; }
  bool ended_normally() const { return !spawn_failed && !timed_out && !interrupted && !stopped && term_signal == 0; }
  std::string describe() const;
};

// Called as each process ends, with its index in `specs` and its result. Returning true stops the
// run: the processes still running are killed and the ones not yet started are not started; both
// come back with `stopped` set.
using StopWhen = std::function<bool(std::size_t, const ProcResult&)>;

// Runs all specs with at most `jobs` at a time, in the order given; results in spec order.
std::vector<ProcResult> run_processes(const std::vector<ProcSpec>& specs, int jobs, const StopWhen& stop_when = {});
ProcResult run_process(const ProcSpec& spec);

// Runs a short command and returns {exit code (or -1), stdout}.
std::pair<int, std::string> capture_output(const std::vector<std::string>& argv, const std::string& cwd = {});

// SIGINT/SIGTERM set a flag instead of killing the driver (installed for the lifetime of the guard).
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
};
bool interrupted();
void request_interrupt();  // for tests
void clear_interrupt();

}  // namespace kvgate::mutate
