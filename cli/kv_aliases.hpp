// The KV-cache flags users type from other engines, mapped onto kvgate's formats (docs/FORMATS.md,
// "Flag aliases"): vLLM's --kv-cache-dtype and llama.cpp's --cache-type-k/-v (-ctk/-ctv). A value
// with an exact kvgate equivalent maps to it; one without is refused naming the nearest format and
// why it is not the same; "auto" means what it means in vLLM: the model's own KV (no --kv at all).
#pragma once
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace kvgate::cli {

struct KvAlias {
  const char* value;    // as the other engine spells it
  const char* kvgate;   // the kvgate half/preset, or nullptr: no exact equivalent
  const char* nearest;  // when kvgate is nullptr: the nearest kvgate format and the difference
};

// vLLM --kv-cache-dtype (vllm/config/cache.py CacheDType). fp8 and fp8_e4m3 are E4M3 with one scale
// per tensor (the checkpoint's k_scale/v_scale, else 1.0): kvgate's fp8 preset.
inline constexpr KvAlias kVllmKvCacheDtype[] = {
    {"auto", "", nullptr},
    {"bfloat16", "bf16", nullptr},
    {"fp8", "fp8", nullptr},
    {"fp8_e4m3", "fp8", nullptr},
    {"fp8_e5m2", "fp8_e5m2", nullptr},
    {"fp8_inc", nullptr, "fp8 (fp8_inc is Intel Gaudi's calibrated E4M3 with its own scale files)"},
    {"fp8_ds_mla", nullptr,
     "k=fp8_block128,v=bf16 with --mla-cache latent (the same latent bytes: fp8 with a scale per 128-element "
     "tile, the RoPE key in bf16; named as the pair because the alias means nothing without an MLA latent cache)"},
};

// llama.cpp --cache-type-k / --cache-type-v (common/arg.cpp kv_cache_types). Their q8_0 and q4_0
// blocks are kvgate's q8_0 and q4_0 (32 elements, one f16 scale).
inline constexpr KvAlias kLlamaCacheType[] = {
    {"f32", "f32", nullptr},
    {"f16", "f16", nullptr},
    {"bf16", "bf16", nullptr},
    {"q8_0", "q8_0", nullptr},
    {"q4_0", "q4_0", nullptr},
    {"q4_1", nullptr, "q4_0 (q4_1 adds a per-block minimum that q4_0 does not store)"},
    {"iq4_nl", nullptr, "q4_0 (iq4_nl maps codes through a non-linear table)"},
    {"q5_0", nullptr, "q8_0 or q4_0 (kvgate has no 5-bit block format)"},
    {"q5_1", nullptr, "q8_0 or q4_0 (kvgate has no 5-bit block format; q5_1 also stores a minimum)"},
};

template <std::size_t N>
std::string alias_choices(const KvAlias (&table)[N]) {
  std::string s;
  for (const KvAlias& a : table) s += (s.empty() ? "" : ", ") + std::string(a.value);
  return s;
}

// The kvgate spelling of `value` under `flag` ("" for vLLM's auto); throws naming the flag, the value
// and the nearest format (or the accepted values).
template <std::size_t N>
std::string map_kv_alias(const KvAlias (&table)[N], std::string_view flag, std::string_view value) {
  for (const KvAlias& a : table) {
    if (value != a.value) continue;
    if (a.kvgate) return a.kvgate;
    throw std::invalid_argument(std::string(flag) + " " + std::string(value) +
                                " has no exact kvgate equivalent; the nearest is " + a.nearest +
                                ": pass --kv with it if that is what you mean");
  }
  throw std::invalid_argument(std::string(flag) + " " + std::string(value) + " is not a value " + std::string(flag) +
                              " takes (" + alias_choices(table) + ")");
}

// The --kv value the aliases mean ("" when none is given or vLLM's auto), after checking that at most
// one way of naming the KV format is used. llama.cpp's default for the half not given is f16.
inline std::string kv_from_aliases(const std::string& kv, const std::string& kv_cache_dtype,
                                   const std::string& cache_type_k, const std::string& cache_type_v) {
  const bool llama = !cache_type_k.empty() || !cache_type_v.empty();
  const int ways = !kv.empty() + !kv_cache_dtype.empty() + llama;
  if (ways > 1)
    throw std::invalid_argument(
        "name the KV format one way: --kv, --kv-cache-dtype (vLLM) or --cache-type-k/-v (llama.cpp), not several");
  if (!kv_cache_dtype.empty()) return map_kv_alias(kVllmKvCacheDtype, "--kv-cache-dtype", kv_cache_dtype);
  if (llama) {
    const std::string k = cache_type_k.empty() ? "f16" : map_kv_alias(kLlamaCacheType, "--cache-type-k", cache_type_k);
    const std::string v = cache_type_v.empty() ? "f16" : map_kv_alias(kLlamaCacheType, "--cache-type-v", cache_type_v);
    return "k=" + k + ",v=" + v;
  }
  return kv;
}

// llama.cpp's two-letter short flags, which CLI11 (one-letter short options) cannot declare:
// "-ctk X" / "-ctk=X" -> "--cache-type-k X" / "--cache-type-k=X", the same for -ctv.
inline std::optional<std::string> long_form_of_llama_short_flag(std::string_view arg) {
  for (const auto& [s, l] : {std::pair<std::string_view, std::string_view>{"-ctk", "--cache-type-k"},
                             std::pair<std::string_view, std::string_view>{"-ctv", "--cache-type-v"}}) {
    if (arg == s) return std::string(l);
    if (arg.size() > s.size() && arg.substr(0, s.size()) == s && arg[s.size()] == '=')
      return std::string(l) + std::string(arg.substr(s.size()));
  }
  return std::nullopt;
}

}  // namespace kvgate::cli
