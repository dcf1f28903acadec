// Compile-ahead: the patch-and-rebuild mutants' objects compiled into ccache on the spare core while
// the driver runs other mutants, so that each mutant's own rebuild is a cache hit.
//
// A rebuild mutant costs a compile of every object that includes its file (seconds for the large
// runtime TUs), then the gates; the switch mutants before it cost only gate runs, which leave a
// core idle on a small machine. The compile-ahead worker works on a copy of the scratch *sources*
// (a sibling folder "<scratch>.ahead", so that paths relative to ccache's base_dir are the same):
// for each queued mutant in run order it writes the mutated file there, runs the scratch build's
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
  double seconds = 0;    // wall time of the compiles
  std::string disabled;  // why the worker did nothing, or empty
};

class CompileAhead {
 public:
  // Copies the scratch sources (every file outside `build`) to "<scratch>.ahead" now, in the
  // caller's thread (the scratch is unpatched at this point), then starts the worker.
  // `build_env`: the environment of the scratch build (its CCACHE_BASEDIR is mapped to the copy
  // when it is the scratch itself). `nice`: the worker's compile priority (nice -n).
  CompileAhead(std::filesystem::path scratch, std::filesystem::path build,
               std::vector<std::pair<std::string, std::string>> build_env, std::vector<AheadJob> jobs, int nice = 10);
  ~CompileAhead();  // stop(): waits for the compile under way, never starts another
  CompileAhead(const CompileAhead&) = delete;
  CompileAhead& operator=(const CompileAhead&) = delete;

  // The driver is about to rebuild mutant `id`: jobs queued before it are skipped; if the worker
  // is compiling this one, wait for it (its objects then land in ccache before the rebuild asks);
  // if the worker has not reached it, it is skipped. Returns true when its objects were compiled
  // ahead.
  bool reach(const std::string& id);
  void stop();
  AheadStats stats() const;
  const std::filesystem::path& copy_dir() const { return side_; }

  // Exposed for the unit tests: the command with every occurrence of the scratch path (as a
  // path: followed by '/', a quote, a space or the end) replaced by the copy's.
  static std::string retarget(const std::string& command, const std::string& from, const std::string& to);

 private:
  void work();
  std::filesystem::path scratch_, build_, side_;
  std::vector<std::pair<std::string, std::string>> env_;
  std::vector<AheadJob> jobs_;
  int nice_ = 10;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::size_t next_ = 0;           // the first job not yet started by the worker
  std::size_t reached_ = 0;        // jobs before this index are passed by the driver
  std::ptrdiff_t running_ = -1;    // the job the worker compiles now
  std::vector<char> done_;         // per job: compiled ahead
  bool stop_ = false;
  AheadStats stats_;
  std::thread worker_;
};

}  // namespace kvgate::mutate
