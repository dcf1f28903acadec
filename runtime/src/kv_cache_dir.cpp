#include "kvgate/kv_cache_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "kvgate/engine.hpp"

namespace kvgate {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kExt = ".kvf";

std::int64_t mtime_ns_of(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
}

int open_lock(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw std::runtime_error("kv cache: cannot open lock file '" + path + "': " + std::strerror(errno));
  return fd;
}

}  // namespace

std::uint64_t parse_byte_size(std::string_view text) {
  const std::string t(text);
  std::size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  if (i == 0) throw std::invalid_argument("byte size '" + t + "': expected a number such as 1GiB, 512MiB or 1000000");
  // One number, whole: std::stod alone would read "1.5.5GiB" as 1.5 and drop the rest.
  if (std::count(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(i), '.') > 1 || t[0] == '.' || t[i - 1] == '.')
    throw std::invalid_argument("byte size '" + t + "': '" + t.substr(0, i) +
                                "' is not a number (one decimal point at most, digits on both sides)");
  double num = 0;
  try {
    std::size_t used = 0;
    num = std::stod(t.substr(0, i), &used);
    if (used != i) throw std::invalid_argument("partial");
  } catch (const std::exception&) {
    throw std::invalid_argument("byte size '" + t + "': bad number");
  }
  std::string unit = t.substr(i);
  std::erase(unit, ' ');
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mul = 1;
  if (unit.empty() || unit == "b") mul = 1;
  else if (unit == "k" || unit == "kib") mul = 1024.0;
  else if (unit == "m" || unit == "mib") mul = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") mul = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mul = 1e3;
  else if (unit == "mb") mul = 1e6;
  else if (unit == "gb") mul = 1e9;
  else if (unit == "tb") mul = 1e12;
  else throw std::invalid_argument("byte size '" + t + "': unknown unit '" + t.substr(i) + "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  const double v = std::floor(num * mul);
  if (!(v >= 0) || v > 1.8e19) throw std::invalid_argument("byte size '" + t + "' is out of range");
  return static_cast<std::uint64_t>(v);
}

std::string format_bytes(std::uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

bool valid_conv_id(std::string_view id) {
  if (id.empty() || id.size() > 128 || id[0] == '.') return false;
  for (char c : id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

KvCacheDir::KvCacheDir(std::string dir, std::uint64_t budget) : dir_(std::move(dir)), budget_(budget) {
  if (dir_.empty()) throw std::invalid_argument("kv cache: empty folder path (--kv-cache-dir)");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    throw std::runtime_error("kv cache: cannot create folder '" + dir_ + "': " + ec.message());
}

std::string KvCacheDir::path_for(std::string_view conv_id) const {
  if (!valid_conv_id(conv_id))
    throw std::invalid_argument("conversation id '" + std::string(conv_id) +
                                "' is not valid: use 1-128 characters of A-Z a-z 0-9 . _ - (not starting with '.')");
  return (fs::path(dir_) / (std::string(conv_id) + std::string(kExt))).string();
}

std::string KvCacheDir::lock_path_for(std::string_view conv_id) const {
  return path_for(conv_id) + ".lock";
}

std::vector<KvCacheEntry> KvCacheDir::entries() const {
  std::vector<KvCacheEntry> out;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir_, ec)) {
    const std::string name = de.path().filename().string();
    if (name.size() <= kExt.size() || !name.ends_with(kExt) || name[0] == '.') continue;
    struct stat st {};
    if (::stat(de.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    out.push_back({name.substr(0, name.size() - kExt.size()), de.path().string(), static_cast<std::uint64_t>(st.st_size),
                   mtime_ns_of(st)});
  }
  std::sort(out.begin(), out.end(), [](const KvCacheEntry& a, const KvCacheEntry& b) {
    return a.mtime_ns != b.mtime_ns ? a.mtime_ns < b.mtime_ns : a.conv_id < b.conv_id;
  });
  return out;
}

void KvCacheDir::touch(const std::string& path) const {
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  std::int64_t stamp = static_cast<std::int64_t>(now.tv_sec) * 1000000000LL + now.tv_nsec;
  for (const KvCacheEntry& e : entries())
    if (e.path != path) stamp = std::max(stamp, e.mtime_ns + 1);  // strictly the most recent of the folder
  struct timespec ts[2];
  ts[0].tv_sec = ts[1].tv_sec = static_cast<time_t>(stamp / 1000000000LL);
  ts[0].tv_nsec = ts[1].tv_nsec = static_cast<long>(stamp % 1000000000LL);
  ::utimensat(AT_FDCWD, path.c_str(), ts, 0);
}

KvBudgetReport KvCacheDir::enforce_budget(std::string_view in_use) const {
  KvBudgetReport r;
  r.budget = budget_;
  const std::vector<KvCacheEntry> all = entries();
  for (const KvCacheEntry& e : all) r.bytes_before += e.bytes;
  std::uint64_t total = r.bytes_before;
  for (const KvCacheEntry& e : all) {
    if (total <= budget_) break;
    if (e.conv_id == in_use) {
      r.kept_busy.push_back(e.conv_id);
      continue;
    }
    Lock l = lock(e.conv_id, false);  // a conversation running elsewhere keeps its file
    if (!l.held()) {
      r.kept_busy.push_back(e.conv_id);
      continue;
    }
    if (::unlink(e.path.c_str()) != 0) continue;
    total -= e.bytes;
    r.evicted.push_back(e);
    r.message += "kv cache: evicted " + e.conv_id + std::string(kExt) + " (" + format_bytes(e.bytes) +
                 ", least recently used) to keep " + dir_ + " under its budget of " + format_bytes(budget_) + "\n";
  }
  r.bytes_after = total;
  r.over_budget = total > budget_;
  if (r.over_budget) {
    std::string busy;
    for (const auto& b : r.kept_busy) busy += (busy.empty() ? "" : ", ") + b;
    r.message += "kv cache: " + dir_ + " holds " + format_bytes(total) + ", over its budget of " + format_bytes(budget_) +
                 "; kept the files in use (" + busy + ")\n";
  }
  return r;
}

KvCacheDir::Lock::Lock(Lock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
KvCacheDir::Lock& KvCacheDir::Lock::operator=(Lock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}
KvCacheDir::Lock::~Lock() {
  if (fd_ >= 0) ::close(fd_);
}

KvCacheDir::Lock KvCacheDir::lock(std::string_view conv_id, bool wait, const WaitNotice& on_wait) const {
  Lock l;
  const int fd = open_lock(lock_path_for(conv_id));
  if (wait) {  // try first: when another turn holds it, say what is waited for, then block
    int r;
    while ((r = ::flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
    }
    if (r == 0) {
      l.fd_ = fd;
      return l;
    }
    if (errno == EWOULDBLOCK) {
      const std::string msg = "kvgate: conversation '" + std::string(conv_id) + "' is in use: waiting for the lock " +
                              lock_path_for(conv_id) +
                              " (another kvgate run/chat of this conversation holds it until its turn ends; Ctrl-C "
                              "to stop)";
      if (on_wait) on_wait(msg);
      else std::fprintf(stderr, "%s\n", msg.c_str());
    }
  }
  for (;;) {
    if (::flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB)) == 0) break;
    if (errno == EINTR) continue;
    const int e = errno;
    ::close(fd);
    if (e == EWOULDBLOCK) return l;
    throw std::runtime_error("kv cache: cannot lock '" + lock_path_for(conv_id) + "': " + std::strerror(e));
  }
  l.fd_ = fd;
  return l;
}

int KvCacheDir::remove_stale_temps(std::string_view conv_id) const {
  // write_file_atomic's temp files: .<id>.kvf.tmp.XXXXXX
  std::string prefix(1, '.');
  prefix.append(conv_id).append(kExt).append(".tmp.");
  int removed = 0;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir_, ec)) {
    const std::string name = de.path().filename().string();
    if (name.starts_with(prefix) && name.size() == prefix.size() + 6 && ::unlink(de.path().c_str()) == 0) ++removed;
  }
  return removed;
}

Conversation::Conversation(const KvCacheDir& dir, std::string conv_id, bool wait_for_lock)
    : dir_(dir), id_(std::move(conv_id)), path_(dir.path_for(id_)) {
  lock_ = dir_.lock(id_, wait_for_lock);
  if (!lock_.held())
    throw std::runtime_error("conversation '" + id_ + "' is in use by another process (lock " +
                             dir_.lock_path_for(id_) + "); wait for its turn to finish");
  dir_.remove_stale_temps(id_);
  std::error_code ec;
  if (fs::exists(path_, ec)) file_ = read_kv_file(path_);
}

std::vector<int> Conversation::transcript() const { return file_ ? file_->tokens : std::vector<int>{}; }

int Conversation::hydrate(Engine& engine, std::span<const int> prompt) {
  return hydrate([&engine](const KvFile& f, std::span<const int> p) { return engine.hydrate(f, p); }, prompt);
}

KvBudgetReport Conversation::save(const Engine& engine, std::span<const int> pending) {
  return save([&engine, pending](const std::string& path) { engine.save_kv(path, pending); });
}

int Conversation::hydrate(const std::function<int(const KvFile&, std::span<const int>)>& restore,
                          std::span<const int> prompt) {
  if (!file_) return 0;
  const int n = restore(*file_, prompt);
  dir_.touch(path_);
  return n;
}

KvBudgetReport Conversation::save(const std::function<void(const std::string&)>& write) {
  write(path_);
  dir_.touch(path_);
  return dir_.enforce_budget(id_);
}

}  // namespace kvgate
