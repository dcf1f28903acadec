#include "kvgate_mutations/scratch.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <stdexcept>

#include "kvgate_mutations/catalog.hpp"
#include "kvgate_mutations/process.hpp"

namespace kvgate::mutate {

namespace fs = std::filesystem;

std::vector<std::string> list_source_files(const fs::path& src) {
  std::vector<std::string> out;
  const auto [rc, text] =
      capture_output({"git", "-C", src.string(), "ls-files", "-z", "--cached", "--others", "--exclude-standard"});
  if (rc == 0) {
    std::set<std::string> seen;
    std::size_t pos = 0;
    while (pos < text.size()) {
      const std::size_t z = text.find('\0', pos);
      std::string f = text.substr(pos, (z == std::string::npos ? text.size() : z) - pos);
      pos = z == std::string::npos ? text.size() : z + 1;
      if (f.empty() || !seen.insert(f).second) continue;
      const fs::path p = src / f;
      std::error_code ec;
      const auto st = fs::symlink_status(p, ec);
      if (ec) continue;  // deleted in the work tree
      if (fs::is_regular_file(st) || fs::is_symlink(st)) out.push_back(f);
    }
    return out;
  }
  // Not a git work tree: everything except VCS metadata, build folders and scratch copies.
  for (auto it = fs::recursive_directory_iterator(src); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() && (name == ".git" || name.rfind("build", 0) == 0 || name == ".scratch" ||
                               name == "node_modules" || name == "mutants.out")) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() || it->is_symlink()) out.push_back(fs::relative(it->path(), src).string());
  }
  return out;
}

namespace {
bool same_bytes(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  if (fs::file_size(a, ec) != fs::file_size(b, ec) || ec) return false;
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  char ba[65536], bb[65536];
  for (;;) {
    fa.read(ba, sizeof ba);
    fb.read(bb, sizeof bb);
    if (fa.gcount() != fb.gcount()) return false;
    if (fa.gcount() == 0) return true;
    if (std::char_traits<char>::compare(ba, bb, static_cast<std::size_t>(fa.gcount())) != 0) return false;
  }
}
}  // namespace

SyncStats sync_tree(const fs::path& src, const fs::path& dst, const std::vector<std::string>& files,
                    const std::vector<fs::path>& keep) {
  SyncStats st;
  fs::create_directories(dst);
  std::set<std::string> wanted(files.begin(), files.end());
  for (const auto& f : files) {
    const fs::path s = src / f, d = dst / f;
    std::error_code ec;
    const auto sst = fs::symlink_status(s, ec);
    if (ec) continue;
    if (fs::is_symlink(sst)) {
      const fs::path target = fs::read_symlink(s, ec);
      if (ec) continue;
      if (fs::is_symlink(fs::symlink_status(d, ec)) && fs::read_symlink(d, ec) == target) {
        ++st.unchanged;
        continue;
      }
      fs::remove_all(d, ec);
      fs::create_directories(d.parent_path());
      fs::create_symlink(target, d);
      ++st.copied;
      continue;
    }
    if (fs::is_regular_file(fs::symlink_status(d, ec)) && same_bytes(s, d)) {
      ++st.unchanged;
      continue;
    }
    if (fs::exists(fs::symlink_status(d, ec)) && !fs::is_regular_file(fs::symlink_status(d, ec))) fs::remove_all(d, ec);
    write_text(d, read_text(s));
    fs::permissions(d, fs::status(s).permissions(), ec);
    ++st.copied;
  }
  // Remove what is no longer in the source (keeping the build folders).
  std::vector<fs::path> keep_abs;
  for (const auto& k : keep) keep_abs.push_back(fs::weakly_canonical(k));
  std::vector<fs::path> doomed;
  for (auto it = fs::recursive_directory_iterator(dst); it != fs::recursive_directory_iterator(); ++it) {
    const fs::path canon = fs::weakly_canonical(it->path());
    bool kept = false;
    for (const auto& k : keep_abs) kept = kept || canon == k;
    if (kept) {
      if (it->is_directory() && !it->is_symlink()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_directory() && !it->is_symlink()) continue;
    const std::string rel = fs::relative(it->path(), dst).generic_string();
    if (!wanted.count(rel)) doomed.push_back(it->path());
  }
  for (const auto& p : doomed) {
    std::error_code ec;
    fs::remove(p, ec);
    ++st.removed;
  }
  return st;
}

std::uint64_t hash_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a 64 offset basis
  char buf[65536];
  while (in) {
    in.read(buf, sizeof buf);
    for (std::streamsize i = 0; i < in.gcount(); ++i) {
      h ^= static_cast<unsigned char>(buf[i]);
      h *= 1099511628211ull;
    }
  }
  return h;
}

ObjectSnapshot snapshot_objects(const fs::path& build_dir) {
  ObjectSnapshot s;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(build_dir, ec); it != fs::recursive_directory_iterator(); ++it) {
    if (!it->is_regular_file() || it->path().extension() != ".o") continue;
    ObjectInfo o;
    o.size = it->file_size();
    o.mtime = it->last_write_time();
    o.hash = hash_file(it->path());
    s[it->path().string()] = o;
  }
  return s;
}

ObjectChanges compare_objects(const fs::path& build_dir, ObjectSnapshot& base) {
  ObjectChanges c;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(build_dir, ec); it != fs::recursive_directory_iterator(); ++it) {
    if (!it->is_regular_file() || it->path().extension() != ".o") continue;
    const std::string key = it->path().string();
    auto b = base.find(key);
    const auto mt = it->last_write_time();
    if (b != base.end() && b->second.mtime == mt) continue;
    c.rebuilt.push_back(key);
    const std::uint64_t h = hash_file(it->path());
    const auto size = it->file_size();
    if (b == base.end()) {
      c.different.push_back(key);  // an object the baseline did not have
      continue;
    }
    if (h != b->second.hash || size != b->second.size) {
      c.different.push_back(key);
    } else {
      b->second.mtime = mt;
    }
  }
  return c;
}

ScratchLock::ScratchLock(const fs::path& lock_file) {
  fs::create_directories(lock_file.parent_path());
  fd_ = open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("cannot open lock file " + lock_file.string());
  if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    close(fd_);
    fd_ = -1;
    throw std::runtime_error("another `kvgate mutate` is using this scratch copy (lock " + lock_file.string() +
                             "); wait for it or pass --scratch/--build-dir to use another one");
  }
}
ScratchLock::~ScratchLock() {
  if (fd_ >= 0) {
    flock(fd_, LOCK_UN);
    close(fd_);
  }
}

}  // namespace kvgate::mutate
