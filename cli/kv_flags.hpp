// Flags shared by `kvgate run` and `kvgate chat` for persistent conversations and streamed KV:
// --conv-id, --kv-cache-dir, --kv-cache-budget, --kv-resident.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvgate/kv_cache_dir.hpp"

namespace kvgate::cli {

struct KvCacheFlags {
  std::string conv_id;
  std::string cache_dir;
  std::string budget = "1GiB";
  int resident = 0;
};

// $KVGATE_KV_CACHE_DIR, else $XDG_CACHE_HOME/kvgate/kv, else ~/.cache/kvgate/kv, else ./.kvgate-kv.
inline std::string default_kv_cache_dir() {
  if (const char* e = std::getenv("KVGATE_KV_CACHE_DIR"); e && *e) return e;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/kvgate/kv";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kvgate/kv";
  return ".kvgate-kv";
}

inline void add_kv_cache_flags(CLI::App* sub, KvCacheFlags& f) {
  sub->add_option("--conv-id", f.conv_id,
                  "conversation id: hydrate the saved KV of this conversation, prefill only the new tokens, save "
                  "after the turn");
  sub->add_option("--kv-cache-dir", f.cache_dir,
                  "folder of conversation KV files (default $KVGATE_KV_CACHE_DIR, $XDG_CACHE_HOME/kvgate/kv or "
                  "~/.cache/kvgate/kv)");
  sub->add_option("--kv-cache-budget", f.budget,
                  "byte budget of the folder; least recently used files are evicted (e.g. 1GiB, 256MiB)")
      ->capture_default_str();
  sub->add_option("--kv-resident", f.resident,
                  "stream the KV: keep a window of N tokens' blocks per layer in the device pool and every block in "
                  "a host mirror (0 = all resident)")
      ->capture_default_str();
}

inline KvCacheDir open_kv_cache(const KvCacheFlags& f) {
  return KvCacheDir(f.cache_dir.empty() ? default_kv_cache_dir() : f.cache_dir, parse_byte_size(f.budget));
}

}  // namespace kvgate::cli
