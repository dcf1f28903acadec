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
  // --mla-cache latent on an MLA model: the K half is checked against the latent's rows (one row of
  // kv_lora_rank) and the V half against the RoPE key's (qk_rope_head_dim), not the expanded heads.
  bool mla_latent = false;
};

struct ResolvedKv {
  KvFormat requested;            // what the user/checkpoint/default asked for
  std::string requested_source;  // "flag", "checkpoint:<file>:<field>", "default"
  KvFormat effective;            // what the store really holds
  std::string backend;
  std::string fallback_reason;   // empty unless effective != requested
  bool fell_back() const { return !fallback_reason.empty(); }
};

// Backend capability hook: a backend other than the CPU (e.g. "cuda") can refuse a half format for
// a geometry its kernels do not cover. resolve_kv consults it after the generic kvgate::supports
// check, for the requested halves and for the fallback halves alike. Registering nullptr removes
// the hook. The CPU backend needs none (the generic check is its capability).
using BackendCapability = Capability (*)(HalfFormat, const PageGeometry&);
void register_backend_capability(const std::string& backend, BackendCapability fn);

// Capability of one half on one backend: kvgate::supports, then the backend's hook when registered.
Capability backend_supports(const std::string& backend, HalfFormat f, const PageGeometry& g);

// Throws KvResolveError when strict and a fallback would happen, or when the declaration is not
// a known format (naming the file and field).
// Requested = req.flag > cfg.declared_kv (source "checkpoint:<cfg.declared_kv_source>") > f16.
// A refused half falls back to f16 (f32 when f16 is refused too) and fallback_reason is the
// capability reason ("row_not_multiple_of_32", "head_dim_not_power_of_two", or a backend's own);
// when both halves are refused for different reasons it reads "k:<reason>;v:<reason>".
// An unknown declaration is refused only when it would be used (no flag).
ResolvedKv resolve_kv(const KvRequest& req, const ModelConfig& cfg, int block_size);

// The page geometry of each half of a model's KV cache: its K/V heads, or, with the MLA latent
// cache (mla_latent and a model with MLA), one row per token of the latent c_kv (kv_lora_rank) for
// K and one of the shared RoPE key (qk_rope_head_dim) for V. The one place the resolver, the
// engine's store and the matrix's byte accounting read it from.
struct HalfGeometries {
  PageGeometry k, v;
};
HalfGeometries kv_half_geometries(const ModelConfig& cfg, int block_size, bool mla_latent);

}  // namespace kvgate
