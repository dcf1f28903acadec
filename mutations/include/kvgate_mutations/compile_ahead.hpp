// Compile-ahead: the patch-and-rebuild mutants' objects compiled into ccache on the spare core while
// the driver runs other mutants, so that each mutant's own rebuild is a cache hit.
//
// A rebuild mutant costs a compile of every object that includes its file (seconds for the large
// runtime TUs), then the gates; the switch mutants before it cost only gate runs, which leave a
// core idle on a small machine. Each compile-ahead worker works on its own copy of the scratch
// *sources* (sibling folders "<scratch>.ahead", "<scratch>.ahead1", ..., so that paths relative to
// ccache's base_dir are the same): for each queued mutant in run order it writes the mutated file
// there, runs the scratch build's
// own compile command of each object that depends on the file (from ninja's deps log and
// `ninja -t commands -s`), with the scratch path replaced by the copy's, at a lower priority, and
// puts the file back. The real rebuild in the scratch then finds the object in ccache.
//
// Nothing it does can change a verdict: ccache keys an object by the compiler, its arguments and
// the full preprocessed input, so a prefetch of the wrong text is a miss, never a wrong object. It
// only works when the build compiles through ccache without -g (ccache hashes the working folder
// for debug info); otherwise it reports why it did nothing.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace kvgate::mutate {

struct AheadJob {
  std::string id;    // the mutant
  std::string file;  // relative to the scratch tree
  std::string text;  // the whole mutated file
};

struct AheadStats {
  int jobs = 0;          // queued
  int compiled = 0;      // jobs whose every object was compiled ahead
  int passed = 0;        // jobs the driver reached before the worker did (skipped)
  int objects = 0;       // compile commands run
  int failed = 0;        // compile commands that failed (the mutant's own rebuild will say why)
  double seconds = 0;    // wall time of the compiles, summed over the workers
  double waited = 0;     // the driver's time waiting for a job under way (counted in that mutant's build_s)
  std::string disabled;  // why the worker did nothing, or empty
};

class CompileAhead {
 public:
  // Copies the scratch sources (every file outside `build`) to one sibling folder per worker now,
  // in the caller's thread (the scratch is unpatched at this point), then starts the workers.
  // `build_env`: the environment of the scratch build (its CCACHE_BASEDIR is mapped to the copy
  // when it is the scratch itself). `workers`: compiles at a time (the driver's -j: while it waits
  // for a job, every core compiles). `nice`: the compile priority (nice -n), below the gate runs.
  CompileAhead(std::filesystem::path scratch, std::filesystem::path build,
               std::vector<std::pair<std::string, std::string>> build_env, std::vector<AheadJob> jobs,
               int workers = 1, int nice = 10);
  ~CompileAhead();  // stop(): waits for the compile under way, never starts another
  CompileAhead(const CompileAhead&) = delete;
  CompileAhead& operator=(const CompileAhead&) = delete;

  // The driver is about to rebuild mutant `id`: jobs queued before it are skipped; if a worker
  // is compiling this one, wait for it (its objects then land in ccache before the rebuild asks);
  // if no worker has reached it, it is skipped. Returns true when its objects were compiled ahead.
  bool reach(const std::string& id);
  void stop();
  AheadStats stats() const;
  const std::filesystem::path& copy_dir(std::size_t worker = 0) const { return sides_.at(worker); }

  // Exposed for the unit tests: the command with every occurrence of the scratch path (as a
  // path: followed by '/', a quote, a space or the end) replaced by the copy's.
  static std::string retarget(const std::string& command, const std::string& from, const std::string& to);

 private:
  void work(std::size_t w);
  std::filesystem::path scratch_, build_;
  std::vector<std::filesystem::path> sides_;  // one copy per worker
  std::vector<std::vector<std::pair<std::string, std::string>>> envs_;  // per worker
  std::vector<AheadJob> jobs_;
  int nice_ = 10;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::size_t next_ = 0;           // the first job not yet started by the worker
  std::size_t reached_ = 0;        // jobs before this index are passed by the driver
  std::vector<char> running_;      // per job: a worker compiles it now
  std::vector<char> done_;         // per job: compiled ahead
  bool stop_ = false;
  AheadStats stats_;
  std::vector<std::thread> workers_;
};

}  // namespace kvgate::mutate
