// What memory a load may ask of the machine, and the refusal when a model's weights need more.
#pragma once
#include <cstdint>
#include <string>

namespace kvgate {

struct MemoryAvailable {
  std::uint64_t bytes = 0;
  std::string source;  // where the figure came from, for messages
};

// Host memory a process can still take: /proc/meminfo MemAvailable (free + reclaimable page cache),
// capped by the cgroup v2 limit (memory.max - memory.current) when one is set. The environment
// variable KVGATE_MEMORY_AVAILABLE (bytes, digits only) replaces the reading: for containers whose
// /proc/meminfo shows the host's memory, and for tests.
MemoryAvailable host_memory_available();

// "12.3 GiB (13212345678 bytes)"
std::string format_bytes_exact(std::uint64_t b);

}  // namespace kvgate
