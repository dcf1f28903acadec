// STO.resolve.matrix: the precedence table of the KV format and its fp8 scales, every combination of
//   --kv flag (none, fp8, int8, q8_0) x checkpoint declaration (none, fp8, int8, q8_0) x checkpoint
//   per-layer scales (none, given) x scale flags (none, K only, V only, both) x --strict-kv (off, on)
//   x geometry (one every format holds, one whose rows of 24 floats q8_0 cannot hold)
// -> the requested format and its source, the effective format, the fallback or the refusal, and
// the per-layer K and V scales the store gets. The class it closes: one rule of the precedence
// order applied in the wrong order or to the wrong half (checkpoint scales over the flags, V taking
// K's scales, a declaration over the flag, strict ignored for one source).
//
// The expected column is written from the rules (README "KV format resolution", docs/FORMATS.md),
// never from a run:
//  - requested = the flag, else the checkpoint's declaration, else f16 (source "flag",
//    "checkpoint:<where>", "default");
//  - each half is kept when the geometry holds it; q8_0 needs rows (n_kv_heads * head_dim) that are
//    a multiple of 32 (FORMATS.md, q8_0), fp8 / int8 / f16 hold any row; a refused half falls back
//    to f16 with a reason; with --strict-kv a fallback is refused (KvResolveError) instead;
//  - scales, per half independently: the flag's value (one value, repeated per layer), else the
//    checkpoint's per-layer list, else none (1.0).
// Every fixture has distinct values per layer and K != V, so a half or a layer taken from the wrong
// list shows. Compared exactly (strings, binary32 values copied, not computed).
#include <optional>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/model.hpp"
#include "kvgate/resolve.hpp"

using namespace kvgate;

namespace {

struct Geometry {
  const char* name;
  int n_kv_heads, head_dim;
  bool holds_q8_0;  // rows a multiple of 32
};

const std::vector<float> kCkptK = {0.5f, 0.25f, 2.0f}, kCkptV = {0.125f, 4.0f, 1.0f};
constexpr float kFlagK = 8.0f, kFlagV = 0.0625f;

HalfFormat expected_half(HalfFormat want, const Geometry& g, bool* refused) {
  if (want == HalfFormat::q8_0 && !g.holds_q8_0) {
    *refused = true;
    return HalfFormat::f16;
  }
  return want;
}

}  // namespace

TEST_CASE("STO.resolve.matrix flag x declaration x checkpoint scales x scale flags x strict -> format and scales",
          "[gate:STO][fmt:fp8][fmt:int8][fmt:q8_0][fmt:f16]") {
  const Geometry geos[] = {{"4 x 64 (rows of 256)", 4, 64, true}, {"2 x 12 (rows of 24)", 2, 12, false}};
  const std::vector<std::optional<std::string>> kvs = {std::nullopt, "fp8", "int8", "q8_0"};
  int rows = 0, refusals = 0, fallbacks = 0, flag_scales = 0, ckpt_scales = 0;
  for (const Geometry& g : geos)
    for (const auto& flag : kvs)
      for (const auto& decl : kvs)
        for (const bool ckpt : {false, true})
          for (const int sf : {0, 1, 2, 3})  // bit 0: --k-scale, bit 1: --v-scale
            for (const bool strict : {false, true}) {
              ++rows;
              Model m;
              m.config.n_layers = 3;
              m.config.n_kv_heads = g.n_kv_heads;
              m.config.head_dim = g.head_dim;
              m.config.n_heads = g.n_kv_heads;
              m.config.max_seq_len = 64;
              if (decl) {
                m.config.declared_kv = *decl;
                m.config.declared_kv_source = "config.json:quantization_config.kv_cache_quant_algo";
              }
              if (ckpt) {
                m.config.k_scale = kCkptK;
                m.config.v_scale = kCkptV;
              }
              KvRequest req;
              if (flag) req.flag = parse_kv_format(*flag);
              req.strict = strict;
              const std::string row = std::string(g.name) + " flag=" + flag.value_or("-") + " decl=" + decl.value_or("-") +
                                      " ckpt_scales=" + (ckpt ? "yes" : "no") + " scale_flags=" +
                                      (sf == 0 ? "none" : sf == 1 ? "k" : sf == 2 ? "v" : "k+v") + " strict=" +
                                      (strict ? "on" : "off");
              INFO(row);
              // expected, from the rules
              const std::string want_name = flag ? *flag : decl ? *decl : "f16";
              const std::string want_source = flag ? "flag" : decl ? "checkpoint:" + m.config.declared_kv_source : "default";
              const KvFormat want_req = *parse_kv_format(want_name);
              bool refused = false;
              const KvFormat want_eff{expected_half(want_req.k, g, &refused), expected_half(want_req.v, g, &refused)};
              if (refused && strict) {
                ++refusals;
                CHECK_THROWS_AS(resolve_kv(req, m.config, 16), KvResolveError);
                continue;
              }
              const ResolvedKv r = resolve_kv(req, m.config, 16);
              CHECK(r.requested == want_req);
              CHECK(r.requested_source == want_source);
              CHECK(r.effective == want_eff);
              CHECK(r.fell_back() == refused);
              fallbacks += refused;

              EngineOptions o;
              o.kv = r;
              if (sf & 1) o.k_scale = {kFlagK};
              if (sf & 2) o.v_scale = {kFlagV};
              const StoreConfig sc = make_store_config(m, o, 64, "engine");
              const std::vector<float> want_k = (sf & 1) ? std::vector<float>(3, kFlagK) : ckpt ? kCkptK : std::vector<float>{};
              const std::vector<float> want_v = (sf & 2) ? std::vector<float>(3, kFlagV) : ckpt ? kCkptV : std::vector<float>{};
              CHECK(sc.k_scale == want_k);
              CHECK(sc.v_scale == want_v);
              CHECK(sc.format == want_eff);
              flag_scales += (sf != 0 && ckpt);
              ckpt_scales += (sf != 3 && ckpt);
            }
  // Anti-vacuity: the table has every combination, refusals and fallbacks both occur, and the rows
  // where checkpoint scales and scale flags are given together are there.
  CHECK(rows == 2 * 4 * 4 * 2 * 4 * 2);
  CHECK(refusals > 0);
  CHECK(fallbacks > 0);
  CHECK(flag_scales > 0);
  CHECK(ckpt_scales > 0);
}
