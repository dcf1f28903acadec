// Nothing lost:
//   PAR.atomic.enospc       a save that fails midway (ENOSPC injected at the write) leaves the
//                           previous file intact, readable and hydratable; no temp file remains
//   PAR.atomic.kill9.*      a writer process killed with SIGKILL mid-write or just before the
//                           rename leaves the previous file intact; the next turn removes its temp
//   PAR.lock.two_writers    two processes taking turns on one conv-id lose no turn, and a reader
//                           never sees a partial file
//   PAR.lock.last_writer_wins  without the lock, atomic renames still leave one complete file
//   PAR.cache.*             the folder's LRU byte budget: evicts least recently used files, never
//                           the one in use or one locked by another process, and says so
// No test reads a clock: processes synchronise through pipes and waitpid.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "kvgate/atomic_file.hpp"
#include "par_common.hpp"

using namespace kvgate;
using namespace kvgate::par;

namespace {

const KvFormat kFmt = fmt_of("int8");

struct HookGuard {
  explicit HookGuard(const AtomicWriteHooks& h) : hooks(h) { set_atomic_write_hooks(&hooks); }
  ~HookGuard() { set_atomic_write_hooks(nullptr); }
  AtomicWriteHooks hooks;
};

// One conversation turn through the CLI's path: hydrate, prefill the new tokens (+ steps), save.
void turn(const KvCacheDir& cache, const std::string& id, std::span<const int> new_tokens, int steps = 2) {
  const Model& m = stories();
  Engine e(m, options(m, kFmt));
  Conversation c(cache, id);
  std::vector<int> prompt = c.transcript();
  prompt.insert(prompt.end(), new_tokens.begin(), new_tokens.end());
  const int n = c.hydrate(e, prompt);
  Trace tr;
  const int pending = greedy_turn(e, std::span<const int>(prompt).subspan(static_cast<std::size_t>(n)), steps, tr);
  const int pend[1] = {pending};
  c.save(e, pend);
}

// Reads `path` over and over while the two writer processes `pids` run, until both have exited:
// `reads` clean reads, `bad` refused ones (a reader saw a partial file), each writer's wait status.
// `skip_missing`: no read while the file does not exist yet (before the first save).
struct ReadsWhileWriting {
  int reads = 0, bad = 0;
  int status[2] = {0, 0};
};
ReadsWhileWriting read_while_writing(const std::string& path, pid_t (&pids)[2], bool skip_missing) {
  ReadsWhileWriting r;
  int alive = 2;
  while (alive > 0) {
    if (!skip_missing || std::filesystem::exists(path)) {
      try {
        read_kv_file(path);
        ++r.reads;
      } catch (const KvFileError&) {
        ++r.bad;
      }
    }
    for (int w = 0; w < 2; ++w)
      if (pids[w] > 0 && ::waitpid(pids[w], &r.status[w], WNOHANG) == pids[w]) {
        pids[w] = 0;
        --alive;
      }
  }
  return r;
}

std::vector<std::string> temp_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& de : std::filesystem::directory_iterator(dir)) {
    const std::string n = de.path().filename().string();
    if (n.find(".tmp.") != std::string::npos) out.push_back(n);
  }
  return out;
}

// Logits of one more token after hydrating the conversation's file.
std::vector<float> probe(const std::string& path) {
  const Model& m = stories();
  const KvFile file = read_kv_file(path);
  Engine e(m, options(m, kFmt));
  std::vector<int> prompt = file.tokens;
  prompt.push_back(7);
  const int n = e.hydrate(file, prompt);
  return e.prefill(std::span<const int>(prompt).subspan(static_cast<std::size_t>(n)));
}

[[noreturn]] void child_exit(const std::function<void()>& body) {
  int rc = 0;
  try {
    body();
  } catch (...) {
    rc = 3;
  }
  std::fflush(nullptr);
  _exit(rc);
}

// Runs a writer turn in a child process that stops (and tells the parent through a pipe) at the
// hook point, then kills it with SIGKILL.
void kill_writer_at(const KvCacheDir& cache, const std::string& id, std::span<const int> toks, bool before_rename) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    child_exit([&] {
      AtomicWriteHooks h;
      auto stop = [&] {
        const char x = 'x';
        if (::write(fds[1], &x, 1) != 1) _exit(4);
        for (;;) pause();
      };
      if (before_rename) {
        h.before_rename = [&](const std::string&) { stop(); };
      } else {
        h.write = [&](int fd, const char* data, std::size_t n) -> long {
          if (::write(fd, data, n / 2) < 0) _exit(5);  // half of the file reaches the disk
          stop();
          return -1;
        };
      }
      HookGuard g(h);
      turn(cache, id, toks);
    });
  }
  ::close(fds[1]);
  char x = 0;
  const bool reached = ::read(fds[0], &x, 1) == 1;  // the child is midway
  ::close(fds[0]);
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(reached);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
}

}  // namespace

TEST_CASE("PAR.atomic.enospc a save failing with ENOSPC midway leaves the previous file intact and readable",
          "[gate:PAR][fmt:int8]") {
  const auto turns = three_turns(stories());
  TempDir dir;
  KvCacheDir cache(dir.path);
  turn(cache, "c", turns[0]);
  const std::string path = cache.path_for("c");
  const auto before = read_bytes(path);
  const auto logits_before = probe(path);
  int calls = 0;
  AtomicWriteHooks h;
  h.write = [&](int fd, const char* data, std::size_t n) -> long {
    if (++calls == 1) return ::write(fd, data, n / 3);  // a third reaches the disk, then the disk is full
    errno = ENOSPC;
    return -1;
  };
  {
    HookGuard g(h);
    CHECK_THROWS_WITH(turn(cache, "c", turns[1]), kvgate_catch::contains("No space left on device"));
  }
  CHECK(calls >= 2);  // anti-vacuity: the failure struck after part of the file was written
  CHECK(read_bytes(path) == before);
  CHECK(temp_files(dir.path).empty());
  CHECK(bitwise_equal(probe(path), logits_before));
  turn(cache, "c", turns[1]);  // and the conversation goes on
  CHECK(read_kv_file(path).header.used_tokens > parse_kv_file(before, "before").header.used_tokens);
}

TEST_CASE("PAR.atomic.kill9 a writer killed by SIGKILL mid-write or before its rename leaves the previous file",
          "[gate:PAR][fmt:int8]") {
  const auto turns = three_turns(stories());
  for (bool before_rename : {false, true}) {
    INFO((before_rename ? "killed before the rename" : "killed mid-write"));
    TempDir dir;
    KvCacheDir cache(dir.path);
    turn(cache, "c", turns[0]);
    const std::string path = cache.path_for("c");
    const auto before = read_bytes(path);
    const auto logits_before = probe(path);
    kill_writer_at(cache, "c", turns[1], before_rename);
    CHECK(read_bytes(path) == before);
    CHECK(temp_files(dir.path).size() == 1);  // anti-vacuity: the killed writer had started its file
    CHECK(bitwise_equal(probe(path), logits_before));
    turn(cache, "c", turns[1]);  // the next turn takes the (released) lock and removes the leftover
    CHECK(temp_files(dir.path).empty());
    CHECK(read_kv_file(path).header.used_tokens > parse_kv_file(before, "before").header.used_tokens);
  }
}

TEST_CASE("PAR.lock.two_writers two processes on one conv-id lose no turn; readers never see a partial file",
          "[gate:PAR][fmt:int8]") {
  const auto turns = three_turns(stories());
  TempDir dir;
  KvCacheDir cache(dir.path);
  turn(cache, "shared", turns[0], 0);
  const std::string path = cache.path_for("shared");
  const std::size_t start = read_kv_file(path).tokens.size();
  constexpr int kTurns = 6;
  const int markers[2] = {10, 11};
  auto count = [](const std::vector<int>& v, int x) { return std::count(v.begin(), v.end(), x); };
  const auto base = read_kv_file(path).tokens;
  pid_t pids[2];
  for (int w = 0; w < 2; ++w) {
    pids[w] = fork();
    REQUIRE(pids[w] >= 0);
    if (pids[w] == 0)
      child_exit([&] {
        const int tok[1] = {markers[w]};
        for (int i = 0; i < kTurns; ++i) turn(cache, "shared", tok, 0);
      });
  }
  // Meanwhile, read the file over and over: every read is one complete turn.
  const ReadsWhileWriting r = read_while_writing(path, pids, false);
  CHECK(r.bad == 0);
  CHECK(r.reads > 0);
  for (int w = 0; w < 2; ++w) CHECK((WIFEXITED(r.status[w]) && WEXITSTATUS(r.status[w]) == 0));
  const KvFile final_file = read_kv_file(path);
  // Each turn appended its marker and a pending sample: 2 ids per turn, none lost.
  CHECK(final_file.tokens.size() == start + 2 * 2 * kTurns);
  CHECK(count(final_file.tokens, markers[0]) - count(base, markers[0]) >= kTurns);
  CHECK(count(final_file.tokens, markers[1]) - count(base, markers[1]) >= kTurns);
  CHECK(final_file.header.used_tokens + 1 == static_cast<int>(final_file.tokens.size()));
}

TEST_CASE("PAR.lock.last_writer_wins without the lock, concurrent saves still leave one complete file",
          "[gate:PAR][fmt:int8]") {
  const Model& m = stories();
  const auto turns = three_turns(m);
  TempDir dir;
  const std::string path = dir.file("x.kvf");
  pid_t pids[2];
  for (int w = 0; w < 2; ++w) {
    pids[w] = fork();
    REQUIRE(pids[w] >= 0);
    if (pids[w] == 0)
      child_exit([&] {
        Engine e(m, options(m, kFmt));
        e.prefill(turns[static_cast<std::size_t>(w)]);
        e.save_kv(dir.file("ref" + std::to_string(w) + ".kvf"));
        for (int i = 0; i < 25; ++i) e.save_kv(path);  // no lock: plain atomic saves racing
      });
  }
  const ReadsWhileWriting r = read_while_writing(path, pids, true);
  CHECK(r.bad == 0);
  for (int w = 0; w < 2; ++w) CHECK((WIFEXITED(r.status[w]) && WEXITSTATUS(r.status[w]) == 0));
  const auto final_bytes = read_bytes(path);
  CHECK((final_bytes == read_bytes(dir.file("ref0.kvf")) || final_bytes == read_bytes(dir.file("ref1.kvf"))));
  CHECK(temp_files(dir.path).empty());
}

TEST_CASE("PAR.cache.lru the budget evicts least recently used files and says which", "[gate:PAR][fmt:int8]") {
  const auto turns = three_turns(stories());
  TempDir dir;
  std::uint64_t one = 0;
  {
    KvCacheDir probe_dir(dir.file("probe"));
    turn(probe_dir, "p", turns[0]);
    one = std::filesystem::file_size(probe_dir.path_for("p"));
  }
  KvCacheDir cache(dir.file("cache"), one * 2 + one / 2);  // room for two files
  turn(cache, "a", turns[0]);
  turn(cache, "b", turns[0]);
  CHECK(cache.entries().size() == 2);
  {  // c pushes the folder over: a (least recently used) goes
    const Model& m = stories();
    Engine e(m, options(m, kFmt));
    Conversation c(cache, "c");
    Trace tr;
    const int pending = greedy_turn(e, turns[0], 2, tr);
    const int pend[1] = {pending};
    const KvBudgetReport r = c.save(e, pend);
    REQUIRE(r.evicted.size() == 1);
    CHECK(r.evicted[0].conv_id == "a");
    CHECK_THAT(r.message, kvgate_catch::contains("evicted a.kvf"));
    CHECK_THAT(r.message, kvgate_catch::contains("least recently used"));
    CHECK_FALSE(r.over_budget);
  }
  // Using b (a hydrate) makes c the least recently used one.
  {
    const Model& m = stories();
    Engine e(m, options(m, kFmt));
    Conversation c(cache, "b");
    std::vector<int> prompt = c.transcript();
    prompt.push_back(9);
    CHECK(c.hydrate(e, prompt) > 0);
  }
  turn(cache, "d", turns[0]);
  std::vector<std::string> ids;
  for (const auto& e : cache.entries()) ids.push_back(e.conv_id);
  CHECK(ids == std::vector<std::string>{"b", "d"});
}

TEST_CASE("PAR.cache.in_use the file in use and files locked by another conversation are never evicted",
          "[gate:PAR][fmt:int8]") {
  const auto turns = three_turns(stories());
  TempDir dir;
  KvCacheDir big(dir.path);  // default budget: 1 GiB
  CHECK(big.budget() == kDefaultKvCacheBudget);
  turn(big, "old", turns[0]);
  turn(big, "busy", turns[0]);
  KvCacheDir tiny(dir.path, 100);  // smaller than any file
  const KvCacheDir::Lock held = tiny.lock("busy");  // a conversation running elsewhere
  REQUIRE(held.held());
  const Model& m = stories();
  KvBudgetReport r;
  {
    Engine e(m, options(m, kFmt));
    Conversation c(tiny, "now");
    e.prefill(turns[0]);
    r = c.save(e, {});
  }
  std::vector<std::string> evicted;
  for (const auto& x : r.evicted) evicted.push_back(x.conv_id);
  CHECK(evicted == std::vector<std::string>{"old"});
  CHECK(std::filesystem::exists(tiny.path_for("now")));
  CHECK(std::filesystem::exists(tiny.path_for("busy")));
  CHECK(r.over_budget);
  CHECK_THAT(r.message, kvgate_catch::contains("kept the files in use"));
  CHECK_THAT(r.message, kvgate_catch::contains("busy"));
  CHECK_THAT(r.message, kvgate_catch::contains("now"));
  // The in-use file is kept on its own account, not only because its conversation is locked
  // (its turn has ended: nobody holds its lock now).
  const KvBudgetReport r2 = tiny.enforce_budget("now");
  CHECK(r2.evicted.empty());
  CHECK(std::filesystem::exists(tiny.path_for("now")));
}

TEST_CASE("PAR.cache.flags byte sizes and conversation ids", "[gate:PAR][fmt:none]") {
  CHECK(parse_byte_size("1GiB") == kDefaultKvCacheBudget);
  CHECK(parse_byte_size("512MiB") == 512ull << 20);
  CHECK(parse_byte_size("64k") == 65536u);
  CHECK(parse_byte_size("2GB") == 2000000000ull);
  CHECK(parse_byte_size("12345") == 12345u);
  CHECK_THROWS_WITH(parse_byte_size("lots"), kvgate_catch::contains("lots"));
  CHECK_THROWS_WITH(parse_byte_size("3 parsecs"), kvgate_catch::contains("unknown unit"));
  CHECK(valid_conv_id("chat-1.a_b"));
  CHECK_FALSE(valid_conv_id("../etc/passwd"));
  CHECK_FALSE(valid_conv_id(".hidden"));
  CHECK_FALSE(valid_conv_id(""));
  TempDir dir;
  KvCacheDir cache(dir.path);
  CHECK_THROWS_WITH(cache.path_for("a/b"), kvgate_catch::contains("not valid"));
}
