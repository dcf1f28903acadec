// Files are replaced atomically: temp file in the same folder, write, flush, fsync, rename, fsync
// of the folder. A crash leaves either the old file or the new one, never a half-written file.
#pragma once
#include <string>
#include <string_view>

namespace kvgate {

// Throws std::runtime_error naming the path and the failing step (e.g. ENOSPC on write).
void write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace kvgate
