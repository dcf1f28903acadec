// Files are replaced atomically: temp file in the same folder, write, flush, fsync, rename, fsync
// of the folder. A crash leaves either the old file or the new one, never a half-written file.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace kvgate {

// Throws std::runtime_error naming the path and the failing step (e.g. ENOSPC on write).
void write_file_atomic(const std::string& path, std::string_view bytes);

// Fault injection for tests (process-wide; install, test, then uninstall with nullptr).
struct AtomicWriteHooks {
  // Replaces ::write(fd, data, n) for each chunk of the temp file (at most 1 MiB): return the bytes
  // written, or -1 with errno set (e.g. ENOSPC). Empty: ::write.
  std::function<long(int fd, const char* data, std::size_t n)> write;
  // Called with the temp file's path once it is complete and fsynced, just before the rename.
  std::function<void(const std::string& temp_path)> before_rename;
};
void set_atomic_write_hooks(const AtomicWriteHooks* hooks);

}  // namespace kvgate
