#include "kvgate/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace kvgate {

namespace {
const AtomicWriteHooks* g_hooks = nullptr;

[[noreturn]] void fail(const std::string& path, const char* step, int err) {
  throw std::runtime_error("cannot write '" + path + "': " + step + " failed: " + std::strerror(err) +
                           " (the previous file, if any, is unchanged)");
}
}  // namespace

void set_atomic_write_hooks(const AtomicWriteHooks* hooks) { g_hooks = hooks; }

void write_file_atomic(const std::string& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string tmpl = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  const int fd = mkstemp(tmpl.data());
  if (fd < 0) fail(path, "create temp file", errno);
  std::size_t off = 0;
  while (off < bytes.size()) {
    const std::size_t chunk = std::min<std::size_t>(bytes.size() - off, std::size_t{1} << 20);
    const ssize_t n = g_hooks && g_hooks->write ? static_cast<ssize_t>(g_hooks->write(fd, bytes.data() + off, chunk))
                                                : ::write(fd, bytes.data() + off, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      ::unlink(tmpl.c_str());
      fail(path, "write", e);
    }
    off += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmpl.c_str());
    fail(path, "fsync", e);
  }
  ::fchmod(fd, 0644);
  ::close(fd);
  if (g_hooks && g_hooks->before_rename) g_hooks->before_rename(tmpl);
  if (::rename(tmpl.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmpl.c_str());
    fail(path, "rename", e);
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace kvgate
