// KV format resolution (kvgate/resolve.hpp): precedence, capability check per half, fallback with a
// stable reason, strict mode. The effective format is what the store holds and what every stat and
// report shows; a fallback is never reported as the requested format.
#include "kvgate/resolve.hpp"

#include <map>
#include <mutex>

namespace kvgate {

namespace {

std::mutex& hooks_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, BackendCapability>& hooks() {
  static std::map<std::string, BackendCapability> h;
  return h;
}

BackendCapability hook_for(const std::string& backend) {
  std::lock_guard<std::mutex> lock(hooks_mutex());
  auto it = hooks().find(backend);
  return it == hooks().end() ? nullptr : it->second;
}

std::string geometry_text(const PageGeometry& g) {
  return "n_kv_heads=" + std::to_string(g.n_kv_heads) + ", head_dim=" + std::to_string(g.head_dim) +
         ", block_size=" + std::to_string(g.block_size);
}

// Presets whose both halves this backend supports at these geometries (for the strict-mode fix hint).
std::string supported_presets(const std::string& backend, const PageGeometry& gk, const PageGeometry& gv) {
  std::string out;
  for (const Preset& p : presets()) {
    if (!backend_supports(backend, p.fmt.k, gk).ok || !backend_supports(backend, p.fmt.v, gv).ok) continue;
    if (!out.empty()) out += ", ";
    out += p.name;
  }
  return out;
}

struct HalfOutcome {
  HalfFormat effective;
  Capability refusal;  // ok when the requested half is kept
};

HalfOutcome resolve_half(const std::string& backend, HalfFormat want, const PageGeometry& g) {
  const Capability c = backend_supports(backend, want, g);
  if (c.ok) return {want, {}};
  for (HalfFormat fb : {HalfFormat::f16, HalfFormat::f32})
    if (backend_supports(backend, fb, g).ok) return {fb, c};
  throw KvResolveError("no KV half format can hold this model on backend '" + backend + "' (" + geometry_text(g) +
                       "): " + c.reason + (c.detail.empty() ? "" : " -- " + c.detail));
}

}  // namespace

void register_backend_capability(const std::string& backend, BackendCapability fn) {
  std::lock_guard<std::mutex> lock(hooks_mutex());
  if (fn)
    hooks()[backend] = fn;
  else
    hooks().erase(backend);
}

Capability backend_supports(const std::string& backend, HalfFormat f, const PageGeometry& g) {
  Capability c = supports(f, g);
  if (!c.ok) return c;
  if (BackendCapability hook = hook_for(backend)) {
    c = hook(f, g);
    if (!c.ok && c.reason.empty()) c.reason = backend + "_unsupported";
  }
  return c;
}

ResolvedKv resolve_kv(const KvRequest& req, const ModelConfig& cfg, int block_size) {
  if (req.backend != "cpu" && req.backend != "cuda")
    throw KvResolveError("unknown KV backend '" + req.backend + "' (expected cpu or cuda)");
  if (req.backend != "cpu" && !hook_for(req.backend))
    throw KvResolveError("backend '" + req.backend +
                         "' has no registered capability check (this build has no " + req.backend +
                         " backend, or it was not initialized); run on the cpu backend");

  ResolvedKv r;
  r.backend = req.backend;
  if (req.flag) {
    r.requested = *req.flag;
    r.requested_source = "flag";
  } else if (!cfg.declared_kv.empty()) {
    const std::string src = cfg.declared_kv_source.empty() ? std::string("checkpoint") : cfg.declared_kv_source;
    const std::optional<KvFormat> f = parse_kv_format(cfg.declared_kv);
    if (!f)
      throw KvResolveError(src + " declares KV cache format '" + cfg.declared_kv +
                           "', which kvgate does not know (known: " + known_formats_text() +
                           "); pass --kv to choose a format explicitly");
    r.requested = *f;
    r.requested_source = "checkpoint:" + src;
  } else {
    r.requested = KvFormat{HalfFormat::f16, HalfFormat::f16};
    r.requested_source = "default";
  }

  // The rows each half holds: the model's K/V heads, or (the MLA latent cache) the latent for K and
  // the RoPE key for V.
  const bool latent = req.mla_latent && cfg.mla.any();
  const HalfGeometries hg = kv_half_geometries(cfg, block_size, req.mla_latent);
  const PageGeometry &g = hg.k, &gv = hg.v;
  const HalfOutcome k = resolve_half(req.backend, r.requested.k, g);
  const HalfOutcome v = resolve_half(req.backend, r.requested.v, gv);
  r.effective = KvFormat{k.effective, v.effective};
  if (!k.refusal.ok && !v.refusal.ok && k.refusal.reason != v.refusal.reason)
    r.fallback_reason = "k:" + k.refusal.reason + ";v:" + v.refusal.reason;
  else if (!k.refusal.ok)
    r.fallback_reason = k.refusal.reason;
  else if (!v.refusal.ok)
    r.fallback_reason = v.refusal.reason;

  if (r.fell_back() && req.strict) {
    const Capability& c = !k.refusal.ok ? k.refusal : v.refusal;
    const std::string which = latent ? (!k.refusal.ok && !v.refusal.ok ? "K (latent) and V (RoPE key) halves"
                                        : (!k.refusal.ok ? "K half (the latent)" : "V half (the RoPE key)"))
                                     : (!k.refusal.ok && !v.refusal.ok ? "K and V halves" : (!k.refusal.ok ? "K half" : "V half"));
    const std::string ok = supported_presets(req.backend, g, gv);
    const std::string shape = latent ? "--mla-cache latent: latent rows " + std::to_string(g.head_dim) + ", RoPE rows " +
                                           std::to_string(gv.head_dim) + ", block_size=" + std::to_string(block_size)
                                     : geometry_text(g);
    throw KvResolveError("--strict-kv: requested KV format '" + r.requested.name() + "' (from " + r.requested_source +
                         ") is not supported on backend '" + req.backend + "' for this model (" + shape +
                         "): " + which + " refused, reason " + r.fallback_reason +
                         (c.detail.empty() ? "" : " (" + c.detail + ")") + "; it would fall back to '" +
                         r.effective.name() + "'. Fix: drop --strict-kv to accept the fallback, or choose --kv " +
                         (ok.empty() ? std::string("<another format>") : "one of: " + ok));
  }
  return r;
}

HalfGeometries kv_half_geometries(const ModelConfig& cfg, int block_size, bool mla_latent) {
  if (mla_latent && cfg.mla.any())
    return {{block_size, 1, cfg.mla.kv_lora_rank}, {block_size, 1, cfg.mla.rope_dim}};
  const PageGeometry g{block_size, cfg.n_kv_heads, cfg.head_dim};
  return {g, g};
}

}  // namespace kvgate
