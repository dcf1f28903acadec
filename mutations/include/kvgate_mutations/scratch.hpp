// The persistent scratch copy the driver mutates (never the user's tree): an rsync-like mirror of
// the source tree's tracked and untracked-but-not-ignored files, plus snapshots of the scratch
// build's object files for the noop check.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace kvgate::mutate {

// Files to mirror, relative to src: `git ls-files --cached --others --exclude-standard`
// (existing regular files and symlinks only); a plain walk when src is not a git work tree.
std::vector<std::string> list_source_files(const std::filesystem::path& src);

struct SyncStats {
  int copied = 0, removed = 0, unchanged = 0;
};
// Makes dst mirror src for `files`: copies a file only when its bytes differ (so the scratch
// build stays incremental), removes files under dst that are not in the list, except below the
// paths in `keep` (the scratch build folder).
SyncStats sync_tree(const std::filesystem::path& src, const std::filesystem::path& dst,
                    const std::vector<std::string>& files, const std::vector<std::filesystem::path>& keep);

struct ObjectInfo {
  std::uintmax_t size = 0;
  std::uint64_t hash = 0;
  std::filesystem::file_time_type mtime{};
};
using ObjectSnapshot = std::map<std::string, ObjectInfo>;  // path -> info, every *.o under the build

ObjectSnapshot snapshot_objects(const std::filesystem::path& build_dir);

struct ObjectChanges {
  std::vector<std::string> rebuilt;    // objects whose mtime changed since the snapshot
  std::vector<std::string> different;  // ... and whose bytes differ from the snapshot
};
// Compares the build's objects with the baseline snapshot; objects rebuilt to identical bytes get
// their new mtime recorded so they are not re-hashed next time.
ObjectChanges compare_objects(const std::filesystem::path& build_dir, ObjectSnapshot& baseline);

std::uint64_t hash_file(const std::filesystem::path& p);

// Exclusive advisory lock (flock) on <path>; throws when another driver holds it.
class ScratchLock {
 public:
  explicit ScratchLock(const std::filesystem::path& lock_file);
  ~ScratchLock();
  ScratchLock(const ScratchLock&) = delete;
  ScratchLock& operator=(const ScratchLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace kvgate::mutate
