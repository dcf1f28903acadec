// KV format resolution: requested (flag) > checkpoint declaration > default f16, then a capability
// check that yields the effective format, the backend and a reason when it falls back.
// A fallback is never reported as the requested format (field notes 002, 004).
#pragma once
#include <optional>
#include <stdexcept>
#include <string>

#include "kvgate/format.hpp"
#include "kvgate/model.hpp"

namespace kvgate {

class KvResolveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct KvRequest {
  std::optional<KvFormat> flag;  // --kv PRESET or --kv-k/--kv-v
  bool strict = false;           // --strict-kv: a fallback is an error
  std::string backend = "cpu";   // "cpu" | "cuda"
};

struct ResolvedKv {
  KvFormat requested;            // what the user/checkpoint/default asked for
  std::string requested_source;  // "flag", "checkpoint:<file>:<field>", "default"
  KvFormat effective;            // what the store really holds
  std::string backend;
  std::string fallback_reason;   // empty unless effective != requested
  bool fell_back() const { return !fallback_reason.empty(); }
};

// Throws KvResolveError when strict and a fallback would happen, or when the declaration is not
// a known format (naming the file and field).
ResolvedKv resolve_kv(const KvRequest& req, const ModelConfig& cfg, int block_size);

}  // namespace kvgate
