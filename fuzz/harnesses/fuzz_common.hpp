// Shared pieces of the libFuzzer harnesses (fuzz/README.md): the input as a file (the loaders take
// paths), a scratch directory per process, and the rule for exceptions: a parser may refuse any
// input with an exception derived from std::exception (that is the contract under test); anything
// else -- a crash, a sanitizer report, a hang, an allocation beyond -rss_limit_mb -- is a finding.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

#include "kvgate/build_paths.hpp"

#ifndef KVGATE_SOURCE_DIR
#define KVGATE_SOURCE_DIR "."
#endif

namespace kvgate::fuzz {

// A scratch directory of this process (removed at exit), under $TMPDIR.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* t = std::getenv("TMPDIR");
    std::filesystem::path p = std::filesystem::path(t && *t ? t : "/tmp") /
                              ("kvgate-fuzz-" + std::to_string(static_cast<long>(::getpid())));
    std::filesystem::create_directories(p);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return p;
  }();
  return dir;
}

// Writes bytes to `path` (truncating it).
inline void write_file(const std::filesystem::path& path, const std::uint8_t* data, std::size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

// Copies a fixture beside the fuzzed input. libFuzzer's -timeout runs an interval timer whose
// SIGALRM can interrupt the copy's system calls (EINTR: std::filesystem::copy_file does not retry
// it and throws): retry an interrupted copy; any other error is the harness's own and throws.
inline void copy_file(const std::filesystem::path& from, const std::filesystem::path& to) {
  for (int attempt = 0;; ++attempt) {
    std::error_code ec;
    std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing, ec);
    if (!ec) return;
    if (ec != std::errc::interrupted || attempt == 100)
      throw std::filesystem::filesystem_error("fuzz harness: cannot copy a fixture", from, to, ec);
  }
}

// A file of the repository (fixtures the harness needs besides the fuzzed input).
inline std::filesystem::path source_file(std::string_view rel) {
  const char* d = std::getenv("KVGATE_SOURCE_DIR");
  return std::filesystem::path(d && *d ? d : KVGATE_SOURCE_DIR) / rel;
}

inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace kvgate::fuzz
