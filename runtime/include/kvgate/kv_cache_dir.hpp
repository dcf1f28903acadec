// The conversation cache folder (`--kv-cache-dir`, `--kv-cache-budget`): one KV file per
// conversation id (<dir>/<id>.kvf), a byte budget over the folder (default 1 GiB) enforced by
// evicting least-recently-used files -- never the one in use, never one whose conversation is
// running in another process -- and a per-conversation lock.
//
// Concurrency (docs/KV_FILE.md): a turn holds an exclusive flock(2) on <dir>/<id>.lock from the
// moment it reads the file until its save is renamed into place, so two writers of one conv-id run
// their turns one after the other and neither turn is lost. Saves are atomic renames besides, so
// even where flock is not honoured (some network file systems) the file is always one complete
// turn: the last writer wins, never a mix.
//
// LRU order is the files' modification times: every use (hydrate or save) stamps the file with a
// time strictly later than any other file's in the folder, so the order is exact even on file
// systems with coarse timestamps.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvgate/kv_file.hpp"

namespace kvgate {

class Engine;

inline constexpr std::uint64_t kDefaultKvCacheBudget = std::uint64_t{1} << 30;  // 1 GiB

// "1073741824", "1GiB", "512MiB", "64KiB", "1G", "500M", "2k" (K/M/G/T = powers of 1024, KB/MB/GB/TB
// = powers of 1000). Throws std::invalid_argument naming the text.
std::uint64_t parse_byte_size(std::string_view text);
std::string format_bytes(std::uint64_t n);  // "1.0 GiB", "12.3 KiB", "512 B"

// A conversation id: 1..128 characters of [A-Za-z0-9._-], not starting with '.'.
bool valid_conv_id(std::string_view id);

struct KvCacheEntry {
  std::string conv_id;
  std::string path;
  std::uint64_t bytes = 0;
  std::int64_t mtime_ns = 0;  // LRU stamp
};

struct KvBudgetReport {
  std::uint64_t budget = 0;
  std::uint64_t bytes_before = 0, bytes_after = 0;
  std::vector<KvCacheEntry> evicted;  // in eviction order (least recently used first)
  std::vector<std::string> kept_busy; // over budget but in use here or locked by another process
  bool over_budget = false;           // still over after evicting everything it could
  std::string message;                // one line per eviction (or the over-budget note); empty if nothing happened
};

class KvCacheDir {
 public:
  // Creates the folder if needed. Throws std::runtime_error when it cannot.
  explicit KvCacheDir(std::string dir, std::uint64_t budget = kDefaultKvCacheBudget);
  const std::string& dir() const { return dir_; }
  std::uint64_t budget() const { return budget_; }

  std::string path_for(std::string_view conv_id) const;  // throws std::invalid_argument on a bad id
  std::string lock_path_for(std::string_view conv_id) const;
  std::vector<KvCacheEntry> entries() const;  // *.kvf files, least recently used first
  // Stamps the file as the most recently used of the folder.
  void touch(const std::string& path) const;
  // Evicts least-recently-used files until the folder fits the budget; `in_use` (a conv id) is never
  // evicted, nor any conversation another process holds the lock of.
  KvBudgetReport enforce_budget(std::string_view in_use) const;

  // Exclusive lock of one conversation (flock on <dir>/<id>.lock), released on destruction.
  class Lock {
   public:
    Lock() = default;
    Lock(Lock&& o) noexcept;
    Lock& operator=(Lock&& o) noexcept;
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;
    ~Lock();
    bool held() const { return fd_ >= 0; }

   private:
    friend class KvCacheDir;
    int fd_ = -1;
  };
  // wait = true blocks until the lock is free, after saying so once: `on_wait` gets one sentence
  // naming the conversation and the lock file (default: printed to stderr), so a held lock never
  // waits silently. wait = false returns an unheld Lock when it is busy.
  using WaitNotice = std::function<void(const std::string&)>;
  Lock lock(std::string_view conv_id, bool wait = true, const WaitNotice& on_wait = {}) const;
  // Removes temp files that a killed writer of this conversation left (call with its lock held).
  int remove_stale_temps(std::string_view conv_id) const;

 private:
  std::string dir_;
  std::uint64_t budget_;
};

// One turn of a conversation, as `kvgate run --conv-id` and `kvgate chat` do it:
//   Conversation c(dir, id);                  // lock, clean up, read and verify the file (if any)
//   prompt = c.transcript() + new tokens;     // or BOS + new tokens when c.transcript() is empty
//   c.hydrate(engine, prompt);                // restore the matched prefix
//   engine.generate(prompt[hydrated:], ...);  // prefill only the rest
//   c.save(engine, {last sampled token});     // atomic; then the budget
class Conversation {
 public:
  // Throws KvFileError when the file exists but is damaged or of an unreadable version.
  Conversation(const KvCacheDir& dir, std::string conv_id, bool wait_for_lock = true);
  const std::string& conv_id() const { return id_; }
  const std::string& path() const { return path_; }
  bool has_file() const { return file_.has_value(); }
  const KvFile* file() const { return file_ ? &*file_ : nullptr; }
  // The token ids saved by the previous turn (prompt + reply); empty when there is no file.
  std::vector<int> transcript() const;
  // engine.hydrate() from the file (0 when there is none). Throws KvFileError on a mismatch.
  int hydrate(Engine& engine, std::span<const int> prompt);
  // engine.save_kv() to this conversation's file, stamps it, then enforces the folder's budget.
  KvBudgetReport save(const Engine& engine, std::span<const int> pending);
  // The same for any engine (the CUDA engine): `restore(file, prompt)` hydrates and returns the
  // tokens restored; `write(path)` writes the KV file atomically.
  int hydrate(const std::function<int(const KvFile&, std::span<const int>)>& restore, std::span<const int> prompt);
  KvBudgetReport save(const std::function<void(const std::string&)>& write);

 private:
  const KvCacheDir& dir_;
  std::string id_, path_;
  KvCacheDir::Lock lock_;
  std::optional<KvFile> file_;
};

}  // namespace kvgate
