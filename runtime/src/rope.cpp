// RoPE variants (rope.hpp) and their config.json reader (rope_json.hpp). Formulas as transformers'
// modeling_rope_utils.py computes them: tensors in float32, scalars in Python doubles.
#include "kvgate/rope.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "kvgate/model.hpp"
#include "rope_json.hpp"

namespace kvgate {

const char* rope_type_name(RopeType t) {
  switch (t) {
    case RopeType::plain: return "default";
    case RopeType::linear: return "linear";
    case RopeType::dynamic: return "dynamic";
    case RopeType::yarn: return "yarn";
    case RopeType::llama3: return "llama3";
    case RopeType::longrope: return "longrope";
  }
  return "?";
}

int rope_rotary_dim(const RopeConfig& r, int head_dim) { return r.rotary_dim > 0 ? r.rotary_dim : head_dim; }

namespace {

constexpr double kPi = 3.14159265358979323846;

// yarn: the (fractional) pair index whose wavelength completes `rotations` turns over `len`.
double yarn_correction_dim(double rotations, int dim, double base, double len) {
  return (dim * std::log(len / (rotations * 2 * kPi))) / (2 * std::log(base));
}

double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

}  // namespace

RopeFrequencies rope_frequencies(const RopeConfig& r, float model_theta, int head_dim, int seq_len) {
  const int dim = rope_rotary_dim(r, head_dim), half = dim / 2;
  const float theta = r.theta > 0 ? static_cast<float>(r.theta) : model_theta;
  RopeFrequencies f;
  f.inv_freq.resize(static_cast<std::size_t>(half));
  // 2i / dim in binary32 (torch.arange(0, dim, 2).float() / dim), base^that in binary32.
  auto expo = [&](int i) { return static_cast<float>(2 * i) / static_cast<float>(dim); };
  for (int i = 0; i < half; ++i)  // as run.c: 1 / theta^(2i / dim), in binary32
    f.inv_freq[static_cast<std::size_t>(i)] = 1.0f / std::pow(theta, expo(i));
  const float factor = static_cast<float>(r.factor);
  switch (r.type) {
    case RopeType::plain:
      break;
    case RopeType::linear:  // positions / factor == inv_freq / factor
      for (float& v : f.inv_freq) v /= factor;
      break;
    case RopeType::dynamic: {
      // transformers' dynamic update: L = max(seq_len, max_position); below it the plain table.
      if (seq_len > r.max_position) {
        const float L = static_cast<float>(seq_len);
        float a = factor * L / static_cast<float>(r.max_position) - static_cast<float>(r.factor - 1);
        a = std::pow(a, static_cast<float>(static_cast<double>(dim) / (dim - 2)));
        const float base = theta * a;
        for (int i = 0; i < half; ++i) f.inv_freq[static_cast<std::size_t>(i)] = 1.0f / std::pow(base, expo(i));
      }
      break;
    }
    case RopeType::yarn: {
      const double fac = r.factor > 0 ? r.factor : static_cast<double>(r.max_position) / r.original_max;
      const float ff = static_cast<float>(fac);
      double low = yarn_correction_dim(r.beta_fast, dim, theta, r.original_max);
      double high = yarn_correction_dim(r.beta_slow, dim, theta, r.original_max);
      if (r.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(dim - 1));
      if (low == high) high += 0.001;  // transformers: prevent a singular ramp
      for (int i = 0; i < half; ++i) {
        const float pos_freq = std::pow(theta, expo(i));
        const float extra = 1.0f / pos_freq, interp = 1.0f / (ff * pos_freq);
        float ramp = (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low);
        ramp = std::min(1.0f, std::max(0.0f, ramp));
        const float extra_w = 1.0f - ramp;  // 1 - ramp: weight of the unscaled (extrapolated) frequency
        f.inv_freq[static_cast<std::size_t>(i)] = interp * (1.0f - extra_w) + extra * extra_w;
      }
      double af = r.attention_factor;
      if (!(af > 0)) {
        if (r.mscale > 0 && r.mscale_all_dim > 0) af = yarn_mscale(fac, r.mscale) / yarn_mscale(fac, r.mscale_all_dim);
        else af = yarn_mscale(fac, 1.0);
      }
      f.attention_scaling = static_cast<float>(af);
      break;
    }
    case RopeType::llama3: {
      const double old_ctx = r.original_max;
      const float low_wl = static_cast<float>(old_ctx / r.low_freq_factor);
      const float high_wl = static_cast<float>(old_ctx / r.high_freq_factor);
      const float lf = static_cast<float>(r.low_freq_factor), hf = static_cast<float>(r.high_freq_factor);
      for (float& inv : f.inv_freq) {
        const float wavelen = static_cast<float>(2 * kPi) / inv;
        // wavelength above the low-frequency band edge: divided by factor; below the high edge: as is.
        const float scaled = wavelen > low_wl ? inv / factor : inv;
        const bool medium = !(wavelen < high_wl) && !(wavelen > low_wl);
        if (medium) {
          const float smooth = (static_cast<float>(old_ctx) / wavelen - lf) / (hf - lf);
          inv = (1.0f - smooth) * scaled / factor + smooth * scaled;
        } else {
          inv = scaled;
        }
      }
      break;
    }
    case RopeType::longrope: {
      const bool use_long = seq_len > r.original_max;
      const std::vector<float>& ext = use_long ? r.long_factor : r.short_factor;
      for (int i = 0; i < half; ++i)
        f.inv_freq[static_cast<std::size_t>(i)] = 1.0f / (ext[static_cast<std::size_t>(i)] * std::pow(theta, expo(i)));
      double af = r.attention_factor;
      if (!(af > 0)) {
        const double fac = r.factor > 0 ? r.factor : static_cast<double>(r.max_position) / r.original_max;
        af = fac <= 1.0 ? 1.0 : std::sqrt(1 + std::log(fac) / std::log(static_cast<double>(r.original_max)));
      }
      f.attention_scaling = static_cast<float>(af);
      break;
    }
  }
  if (!r.freq_divisors.empty())
    for (int i = 0; i < half; ++i) f.inv_freq[static_cast<std::size_t>(i)] /= r.freq_divisors[static_cast<std::size_t>(i)];
  return f;
}

void validate_rope(const RopeConfig& r, int head_dim, const std::string& where, const std::string& field) {
  auto bad = [&](const std::string& sub, const std::string& why) {
    throw ModelError("'" + where + "': field '" + field + (sub.empty() ? "" : "." + sub) + "' " + why);
  };
  const int dim = rope_rotary_dim(r, head_dim);
  if (dim < 2 || dim > head_dim || dim % 2 != 0)
    bad("partial_rotary_factor", "gives " + std::to_string(dim) + " rotated dims of head_dim " + std::to_string(head_dim) +
                                     "; it must be an even count in [2, head_dim] (fix partial_rotary_factor)");
  if (r.theta < 0 || !std::isfinite(r.theta)) bad("rope_theta", "must be a positive finite number");
  const bool needs_factor =
      r.type == RopeType::linear || r.type == RopeType::dynamic || r.type == RopeType::llama3;
  if (needs_factor && !(r.factor > 0 && std::isfinite(r.factor)))
    bad("factor", "= " + std::to_string(r.factor) + " must be a finite number > 0 for rope_type \"" +
                      rope_type_name(r.type) + "\" (the scaling factor; 1 means no scaling)");
  if ((r.type == RopeType::yarn || r.type == RopeType::longrope) && !(r.factor >= 0 && std::isfinite(r.factor)))
    bad("factor", "= " + std::to_string(r.factor) + " must be a finite number > 0 (or absent: max / original length)");
  if (r.type == RopeType::dynamic && r.max_position < 1)
    bad("", "rope_type \"dynamic\" needs max_position_embeddings >= 1 (its reference length); add it to config.json");
  if (r.type == RopeType::yarn || r.type == RopeType::llama3 || r.type == RopeType::longrope) {
    if (r.original_max < 1)
      bad("original_max_position_embeddings",
          "is missing: rope_type \"" + std::string(rope_type_name(r.type)) +
              "\" needs the pre-training context length (add original_max_position_embeddings, e.g. 8192 for Llama 3.1)");
    if ((r.type == RopeType::yarn || r.type == RopeType::longrope) && r.factor == 0 && r.max_position < 1)
      bad("factor", "is missing and no max_position_embeddings gives the default (max / original length)");
  }
  if (r.type == RopeType::yarn) {
    if (!(r.beta_fast > 0) || !(r.beta_slow > 0))
      bad("beta_fast", "and beta_slow must be > 0 (defaults 32 and 1)");
    if (r.attention_factor < 0) bad("attention_factor", "must be > 0");
  }
  if (r.type == RopeType::llama3) {
    if (!(r.low_freq_factor > 0) || !(r.high_freq_factor > 0))
      bad("low_freq_factor", "and high_freq_factor must be > 0 (Llama 3.1: 1 and 4)");
    if (!(r.high_freq_factor > r.low_freq_factor))
      bad("high_freq_factor", "= " + std::to_string(r.high_freq_factor) + " must be greater than low_freq_factor = " +
                                  std::to_string(r.low_freq_factor) + " (Llama 3.1: 4 > 1)");
  }
  if (r.type == RopeType::longrope) {
    const std::size_t want = static_cast<std::size_t>(dim / 2);
    for (const auto* v : {&r.short_factor, &r.long_factor}) {
      const char* name = v == &r.short_factor ? "short_factor" : "long_factor";
      if (v->size() != want)
        bad(name, "has " + std::to_string(v->size()) + " entries; rope_type \"longrope\" needs rotary_dim / 2 = " +
                      std::to_string(want) + " (one per rotated pair)");
      for (float x : *v)
        if (!(x > 0) || !std::isfinite(x)) bad(name, "has an entry <= 0 or not finite (" + std::to_string(x) + ")");
    }
    if (r.attention_factor < 0) bad("attention_factor", "must be > 0");
  }
  if (!r.freq_divisors.empty()) {
    if (r.freq_divisors.size() != static_cast<std::size_t>(dim / 2))
      bad("rope_freqs", "has " + std::to_string(r.freq_divisors.size()) + " entries, expected rotary_dim / 2 = " +
                            std::to_string(dim / 2));
    for (float x : r.freq_divisors)
      if (!(x > 0) || !std::isfinite(x)) bad("rope_freqs", "has an entry <= 0 or not finite");
  }
}

std::string describe_rope(const RopeConfig& r) {
  if (r.is_plain() && r.theta == 0) return {};
  char b[256];
  std::string s = rope_type_name(r.type);
  auto add = [&](const char* k, double v) {
    std::snprintf(b, sizeof b, " %s=%.9g", k, v);
    s += b;
  };
  if (r.theta > 0) add("theta", r.theta);
  if (r.rotary_dim > 0) add("rotary_dim", r.rotary_dim);
  switch (r.type) {
    case RopeType::plain: break;
    case RopeType::linear: add("factor", r.factor); break;
    case RopeType::dynamic: add("factor", r.factor), add("max_position", r.max_position); break;
    case RopeType::yarn:
      if (r.factor > 0) add("factor", r.factor);
      else s += " factor=max/original";
      add("original", r.original_max), add("beta_fast", r.beta_fast), add("beta_slow", r.beta_slow);
      if (r.attention_factor > 0) add("attention_factor", r.attention_factor);
      if (r.mscale > 0) add("mscale", r.mscale), add("mscale_all_dim", r.mscale_all_dim);
      if (!r.truncate) s += " truncate=false";
      if (r.factor == 0) add("max_position", r.max_position);
      break;
    case RopeType::llama3:
      add("factor", r.factor), add("low", r.low_freq_factor), add("high", r.high_freq_factor),
          add("original", r.original_max);
      break;
    case RopeType::longrope: {
      if (r.factor > 0) add("factor", r.factor);
      else s += " factor=max/original";
      add("original", r.original_max);
      if (r.factor == 0) add("max_position", r.max_position);
      if (r.attention_factor > 0) add("attention_factor", r.attention_factor);
      double hs = 0, hl = 0;  // a digest of the factor arrays
      for (std::size_t i = 0; i < r.short_factor.size(); ++i) hs += (i + 1) * static_cast<double>(r.short_factor[i]);
      for (std::size_t i = 0; i < r.long_factor.size(); ++i) hl += (i + 1) * static_cast<double>(r.long_factor[i]);
      add("short_digest", hs), add("long_digest", hl);
      break;
    }
  }
  if (!r.freq_divisors.empty()) {
    double h = 0;
    for (std::size_t i = 0; i < r.freq_divisors.size(); ++i) h += (i + 1) * static_cast<double>(r.freq_divisors[i]);
    add("freq_divisors_digest", h);
  }
  return s;
}

// ---- config.json -------------------------------------------------------------------------------------

namespace {

using json = nlohmann::json;

struct RopeReader {
  const json& d;       // the RoPE dict (rope_parameters, or one per-layer-type entry, or rope_scaling)
  std::string path;    // config.json
  std::string field;   // "rope_parameters", "rope_parameters.sliding_attention", "rope_scaling"

  [[noreturn]] void bad(const std::string& k, const std::string& why) const {
    throw ModelError("'" + path + "': field '" + field + (k.empty() ? "" : "." + k) + "' " + why);
  }
  bool has(const char* k) const { return d.contains(k) && !d[k].is_null(); }
  double num(const char* k, double def) const {
    if (!has(k)) return def;
    if (!d[k].is_number()) bad(k, "= " + d[k].dump() + " is not a number");
    const double v = d[k].get<double>();
    if (!std::isfinite(v)) bad(k, "is not finite");
    return v;
  }
  double positive(const char* k, double def, const std::string& fix) const {
    const double v = num(k, def);
    if (has(k) && !(v > 0)) bad(k, "= " + d[k].dump() + " must be > 0 (" + fix + ")");
    return v;
  }
  int length(const char* k) const {
    if (!has(k)) return 0;
    if (!d[k].is_number_integer() || d[k].get<long long>() < 1 || d[k].get<long long>() > (1ll << 30))
      bad(k, "= " + d[k].dump() + " must be a positive integer (a context length in tokens)");
    return static_cast<int>(d[k].get<long long>());
  }
  std::vector<float> floats(const char* k) const {
    if (!has(k)) bad(k, "is missing (rope_type \"longrope\" needs short_factor and long_factor lists)");
    if (!d[k].is_array()) bad(k, "is not a list of numbers");
    std::vector<float> v;
    for (const auto& x : d[k]) {
      if (!x.is_number()) bad(k, "has a non-number entry " + x.dump());
      v.push_back(static_cast<float>(x.get<double>()));
    }
    return v;
  }
};

// One RoPE dict -> RopeConfig. top: the whole config.json (top-level fallbacks).
RopeConfig read_one(const RopeReader& rr, const json& top, const std::string& path, int max_position) {
  RopeConfig r;
  std::string type = "default";
  const char* type_key = rr.has("rope_type") ? "rope_type" : rr.has("type") ? "type" : nullptr;
  if (type_key) {
    if (!rr.d[type_key].is_string()) rr.bad(type_key, "is not a string");
    type = rr.d[type_key].get<std::string>();
  }
  if (type == "default" || type == "none") r.type = RopeType::plain;
  else if (type == "linear") r.type = RopeType::linear;
  else if (type == "dynamic") r.type = RopeType::dynamic;
  else if (type == "yarn") r.type = RopeType::yarn;
  else if (type == "llama3") r.type = RopeType::llama3;
  else if (type == "longrope" || type == "su") r.type = RopeType::longrope;
  else
    rr.bad(type_key ? type_key : "rope_type",
           "= \"" + type + "\" is not a RoPE type kvgate implements (default, linear, dynamic, yarn, llama3, longrope)");
  for (const char* k : {"mrope_section", "mrope_interleaved"})
    if (rr.has(k)) rr.bad(k, "is set: multimodal RoPE (M-RoPE) is not supported");
  if (rr.has("rope_theta")) r.theta = rr.positive("rope_theta", 0, "the RoPE base");
  r.factor = rr.num("factor", 0);
  if (rr.has("factor") && !(r.factor > 0))
    rr.bad("factor", "= " + rr.d["factor"].dump() + " must be > 0 (the RoPE scaling factor; 1 means no scaling)");
  if (!rr.has("factor") && (r.type == RopeType::linear || r.type == RopeType::dynamic || r.type == RopeType::llama3))
    rr.bad("factor", "is missing: rope_type \"" + type + "\" needs a scaling factor");
  r.max_position = max_position;
  // transformers gives a top-level original_max_position_embeddings priority (Phi-3 keeps it there).
  const bool top_orig = top.contains("original_max_position_embeddings") && !top["original_max_position_embeddings"].is_null();
  if (top_orig) {
    if (!top["original_max_position_embeddings"].is_number_integer() ||
        top["original_max_position_embeddings"].get<long long>() < 1)
      throw ModelError("'" + path + "': field 'original_max_position_embeddings' = " +
                       top["original_max_position_embeddings"].dump() + " must be a positive integer");
    r.original_max = static_cast<int>(top["original_max_position_embeddings"].get<long long>());
  } else {
    r.original_max = rr.length("original_max_position_embeddings");
  }
  r.attention_factor = rr.positive("attention_factor", 0, "the attention scaling; remove it for the default");
  r.beta_fast = rr.positive("beta_fast", 32, "yarn's extrapolation boundary, default 32");
  r.beta_slow = rr.positive("beta_slow", 1, "yarn's interpolation boundary, default 1");
  r.mscale = rr.num("mscale", 0);
  r.mscale_all_dim = rr.num("mscale_all_dim", 0);
  if (rr.has("truncate")) {
    if (!rr.d["truncate"].is_boolean()) rr.bad("truncate", "is not a boolean");
    r.truncate = rr.d["truncate"].get<bool>();
  }
  r.low_freq_factor = rr.num("low_freq_factor", r.type == RopeType::llama3 && !rr.has("low_freq_factor") ? -1 : 1);
  r.high_freq_factor = rr.num("high_freq_factor", r.type == RopeType::llama3 && !rr.has("high_freq_factor") ? -1 : 4);
  if (r.type == RopeType::llama3) {
    if (!rr.has("low_freq_factor")) rr.bad("low_freq_factor", "is missing (rope_type \"llama3\" needs it; Llama 3.1: 1)");
    if (!rr.has("high_freq_factor")) rr.bad("high_freq_factor", "is missing (rope_type \"llama3\" needs it; Llama 3.1: 4)");
  }
  if (r.type == RopeType::longrope) {
    r.short_factor = rr.floats("short_factor");
    r.long_factor = rr.floats("long_factor");
  }
  return r;
}

int rotary_dim_from(double prf, int head_dim, const std::string& path, const std::string& field) {
  if (!(prf > 0 && prf <= 1))
    throw ModelError("'" + path + "': field '" + field + "' = " + std::to_string(prf) + " must be in (0, 1]");
  const int d = static_cast<int>(head_dim * prf);  // int(head_dim * factor), as transformers
  if (d == head_dim) return 0;
  if (d < 2 || d % 2 != 0)
    throw ModelError("'" + path + "': field '" + field + "' = " + std::to_string(prf) + " gives " + std::to_string(d) +
                     " rotated dims of head_dim " + std::to_string(head_dim) + "; RoPE needs an even count >= 2");
  return d;
}

bool is_layer_type_dict(const json& rp) {
  if (!rp.is_object() || rp.empty()) return false;
  for (auto it = rp.begin(); it != rp.end(); ++it)
    if (it.key() != "full_attention" && it.key() != "sliding_attention" && it.key() != "chunked_attention") return false;
  return true;
}

}  // namespace

void read_hf_rope(const nlohmann::json& cj, const std::string& path, ModelConfig& c) {
  // Top-level fallbacks (transformers: rope_theta / partial_rotary_factor attributes).
  double top_theta = 10000.0;
  if (cj.contains("rope_theta") && !cj["rope_theta"].is_null()) {
    if (!cj["rope_theta"].is_number() || !(cj["rope_theta"].get<double>() > 0) ||
        !std::isfinite(cj["rope_theta"].get<double>()))
      throw ModelError("'" + path + "': field 'rope_theta' must be a positive finite number");
    top_theta = cj["rope_theta"].get<double>();
  }
  double top_prf = 0;
  if (cj.contains("partial_rotary_factor") && !cj["partial_rotary_factor"].is_null()) {
    if (!cj["partial_rotary_factor"].is_number())
      throw ModelError("'" + path + "': field 'partial_rotary_factor' is not a number");
    top_prf = cj["partial_rotary_factor"].get<double>();
  }
  int max_position = 2048;
  if (cj.contains("max_position_embeddings") && cj["max_position_embeddings"].is_number_integer())
    max_position = cj["max_position_embeddings"].get<int>();

  // legacy rope_scaling wins over rope_parameters (transformers: rope_scaling or rope_parameters).
  const json empty = json::object();
  const json* src = &empty;
  std::string field = "rope_parameters";
  for (const char* k : {"rope_scaling", "rope_parameters"}) {
    if (!cj.contains(k) || cj[k].is_null()) continue;
    if (!cj[k].is_object()) throw ModelError("'" + path + "': field '" + k + "' = " + cj[k].dump() + " is not an object");
    if (cj[k].empty()) continue;
    src = &cj[k];
    field = k;
    break;
  }
  auto finish = [&](RopeConfig r, const json& d, const std::string& f) {
    const double prf = top_prf > 0 ? top_prf
                                   : (d.contains("partial_rotary_factor") && d["partial_rotary_factor"].is_number()
                                          ? d["partial_rotary_factor"].get<double>()
                                          : 0.0);
    if (prf > 0) r.rotary_dim = rotary_dim_from(prf, c.head_dim, path, top_prf > 0 ? "partial_rotary_factor" : f + ".partial_rotary_factor");
    validate_rope(r, c.head_dim, path, f);
    return r;
  };
  if (is_layer_type_dict(*src)) {
    // Per layer type (Gemma 3): full_attention for global layers, sliding_attention for windowed ones.
    const json& rp = *src;
    if (!rp.contains("full_attention") || !rp["full_attention"].is_object())
      throw ModelError("'" + path + "': field '" + field + "' is per layer type but has no 'full_attention' object");
    const RopeReader g{rp["full_attention"], path, field + ".full_attention"};
    c.rope = finish(read_one(g, cj, path, max_position), rp["full_attention"], g.field);
    c.rope_theta = static_cast<float>(c.rope.theta > 0 ? c.rope.theta : top_theta);
    c.rope.theta = 0;
    if (rp.contains("sliding_attention")) {
      if (!rp["sliding_attention"].is_object())
        throw ModelError("'" + path + "': field '" + field + ".sliding_attention' is not an object");
      const RopeReader s{rp["sliding_attention"], path, field + ".sliding_attention"};
      c.rope_local = finish(read_one(s, cj, path, max_position), rp["sliding_attention"], s.field);
      if (c.rope_local.theta == 0) c.rope_local.theta = top_theta;
      c.has_rope_local = true;
    }
  } else {
    const RopeReader g{*src, path, field};
    c.rope = finish(read_one(g, cj, path, max_position), *src, field);
    c.rope_theta = static_cast<float>(c.rope.theta > 0 ? c.rope.theta : top_theta);
    c.rope.theta = 0;  // the model's rope_theta
  }
  // Dynamic NTK exists to run past max_position_embeddings: the usable context is factor times it.
  if (c.rope.type == RopeType::dynamic)
    c.max_seq_len = std::max(c.max_seq_len, static_cast<int>(std::min(1e9, c.rope.factor * max_position)));
  // Gemma 3 (legacy spelling): rope_local_base_freq is the plain RoPE base of the sliding layers.
  if (!c.has_rope_local && cj.contains("rope_local_base_freq") && !cj["rope_local_base_freq"].is_null()) {
    if (!cj["rope_local_base_freq"].is_number() || !(cj["rope_local_base_freq"].get<double>() > 0))
      throw ModelError("'" + path + "': field 'rope_local_base_freq' must be a positive number");
    c.rope_local = RopeConfig{};
    c.rope_local.theta = cj["rope_local_base_freq"].get<double>();
    c.rope_local.rotary_dim = c.rope.rotary_dim;
    c.has_rope_local = true;
  }
}

}  // namespace kvgate
