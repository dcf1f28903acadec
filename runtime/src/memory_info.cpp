// Host memory available to a load (kvgate/memory_info.hpp).
#include "kvgate/memory_info.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace kvgate {

namespace {

bool read_u64_file(const char* path, std::uint64_t* out) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s.empty()) return false;
  for (char ch : s)
    if (ch < '0' || ch > '9') return false;  // "max" (no limit) or garbage
  *out = std::strtoull(s.c_str(), nullptr, 10);
  return true;
}

}  // namespace

MemoryAvailable host_memory_available() {
  if (const char* e = std::getenv("KVGATE_MEMORY_AVAILABLE"); e && *e) {
    for (const char* p = e; *p; ++p)
      if (*p < '0' || *p > '9')
        throw std::runtime_error(std::string("environment KVGATE_MEMORY_AVAILABLE = '") + e +
                                 "' is not a byte count (digits only); unset it to use /proc/meminfo");
    return {std::strtoull(e, nullptr, 10), "KVGATE_MEMORY_AVAILABLE"};
  }
  MemoryAvailable m;
  {
    std::ifstream f("/proc/meminfo");
    std::string key;
    std::uint64_t kb = 0;
    std::string unit;
    while (f >> key >> kb) {
      std::getline(f, unit);
      if (key == "MemAvailable:") {
        m.bytes = kb * 1024;
        m.source = "/proc/meminfo MemAvailable";
        break;
      }
    }
  }
  std::uint64_t max = 0, cur = 0;
  if (read_u64_file("/sys/fs/cgroup/memory.max", &max) && read_u64_file("/sys/fs/cgroup/memory.current", &cur)) {
    const std::uint64_t left = max > cur ? max - cur : 0;
    if (m.source.empty() || left < m.bytes) {
      m.bytes = left;
      m.source = "the cgroup limit (/sys/fs/cgroup/memory.max - memory.current)";
    }
  }
  if (m.source.empty()) {
    m.bytes = UINT64_MAX;  // nothing to read: no refusal on a guess
    m.source = "unknown (no /proc/meminfo MemAvailable)";
  }
  return m;
}

std::string format_bytes_exact(std::uint64_t b) {
  char s[96];
  std::snprintf(s, sizeof s, "%.1f GiB (%llu bytes)", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0),
                static_cast<unsigned long long>(b));
  return s;
}

}  // namespace kvgate
