// The limits policy: the maximum of every size a file or a flag can ask for, in one place. Every
// parser checks a size read from untrusted input against its limit here *before* it allocates or
// multiplies with it, and multiplies with the checked helpers below. A refusal names the file or
// flag, the field, the value, the limit and the override (an environment variable per limit,
// KVGATE_LIMIT_<NAME>=N, for a legitimate file larger than anything kvgate was tried on).
// Header-only with no dependency, so the leaf libraries (json_schema, mutations) can use it too.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kvgate::limits {

// A refusal by the limits policy. Derives from std::runtime_error so every CLI catch reports it.
class LimitError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Limit {
  const char* name;         // the NAME of KVGATE_LIMIT_<NAME>
  const char* what;         // one phrase for the message
  std::uint64_t max;        // the default maximum
};

// --- model geometry (llama2.c header, GGUF metadata, config.json) -----------------------------
inline constexpr Limit kVocab{"VOCAB", "vocabulary size", 1u << 22};               // 4 M tokens (largest real: 256 K)
inline constexpr Limit kLayers{"LAYERS", "number of layers", 1024};
inline constexpr Limit kDim{"DIM", "model dimension", 1u << 16};                   // 65536
inline constexpr Limit kHiddenDim{"HIDDEN_DIM", "feed-forward dimension", 1u << 18};
inline constexpr Limit kHeads{"HEADS", "number of attention heads", 1024};
inline constexpr Limit kHeadDim{"HEAD_DIM", "head dimension", 4096};
inline constexpr Limit kContext{"CONTEXT", "context length (positions)", 1u << 20};  // 1 M positions
inline constexpr Limit kExperts{"EXPERTS", "number of experts", 1024};
// The product n_kv_heads * head_dim (one token row of a KV half).
inline constexpr Limit kKvRow{"KV_ROW", "KV row elements (n_kv_heads * head_dim)", 1u << 20};
// --- tensors and file containers ------------------------------------------------------------
inline constexpr Limit kTensorElems{"TENSOR_ELEMS", "elements of one tensor", 1ull << 36};
inline constexpr Limit kTensorCount{"TENSORS", "number of tensors", 1u << 20};
inline constexpr Limit kTensorRank{"TENSOR_RANK", "tensor rank", 8};
inline constexpr Limit kMetadataCount{"METADATA", "number of metadata entries", 1u << 20};
inline constexpr Limit kArrayLen{"ARRAY_LEN", "metadata array length", 1u << 24};
inline constexpr Limit kStringBytes{"STRING_BYTES", "bytes of one string", 1u << 24};
inline constexpr Limit kHeaderBytes{"HEADER_BYTES", "bytes of a file header", 1ull << 30};
// --- tokenizers -------------------------------------------------------------------------------
inline constexpr Limit kTokenId{"TOKEN_ID", "token id", (1u << 22) - 1};  // added_tokens[].id, special ids
inline constexpr Limit kTokenBytes{"TOKEN_BYTES", "bytes of one token piece", 1u << 16};
inline constexpr Limit kMerges{"MERGES", "number of BPE merges", 1u << 23};
// --- JSON documents (config.json, tokenizer.json, catalogs, policies, reports) -----------------
inline constexpr Limit kJsonDepth{"JSON_DEPTH", "JSON nesting depth", 128};
inline constexpr Limit kJsonBytes{"JSON_BYTES", "bytes of a JSON document", 1ull << 30};
inline constexpr Limit kPatternSubject{"PATTERN_SUBJECT", "bytes of a string matched against a schema pattern", 4096};
inline constexpr Limit kCatalogMutants{"CATALOG_MUTANTS", "mutants in a catalog", 100000};
inline constexpr Limit kReportRecords{"REPORT_RECORDS", "records in a report", 1000000};
// --- engine flags --------------------------------------------------------------------------------
inline constexpr Limit kBlockSize{"BLOCK_SIZE", "tokens per KV page (--block-size)", 4096};
inline constexpr Limit kThreads{"THREADS", "CPU threads (--threads)", 4096};
// The GPU forward holds [chunk][vocab] FP32 logits (4 GiB at 8192 x 128256): a larger chunk is a typo.
inline constexpr Limit kPrefillChunk{"PREFILL_CHUNK", "tokens per prefill step (--prefill-chunk)", 8192};
inline constexpr Limit kTopK{"TOP_K", "--top-k", 1u << 22};
inline constexpr Limit kKvPoolBytes{"KV_POOL_BYTES", "KV pool bytes (--kv-cache-memory)", 1ull << 40};  // 1 TiB
inline constexpr Limit kCacheBudgetBytes{"CACHE_BUDGET_BYTES", "KV cache folder budget (--kv-cache-budget)",
                                         1ull << 50};

// The limit in force: the default, or KVGATE_LIMIT_<NAME> when set to a positive integer (digits
// only: strtoull alone would read "-5" as 2^64 - 5, lifting the limit).
inline std::uint64_t max_of(const Limit& l) {
  const std::string env = std::string("KVGATE_LIMIT_") + l.name;
  if (const char* e = std::getenv(env.c_str()); e && *e >= '0' && *e <= '9') {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(e, &end, 10);
    if (end && *end == '\0' && v > 0) return v;
  }
  return l.max;
}

inline std::string override_hint(const Limit& l) {
  return "set KVGATE_LIMIT_" + std::string(l.name) + "=N to allow more";
}

// "<where>: <field> = <value> exceeds the limit <max> on the <what> (set KVGATE_LIMIT_..=N ...)"
[[noreturn]] inline void refuse(const Limit& l, std::string_view where, std::string_view field, std::string_view value) {
  throw LimitError(std::string(where) + ": " + std::string(field) + " = " + std::string(value) +
                   " exceeds the limit " + std::to_string(max_of(l)) + " on the " + l.what + " (" +
                   override_hint(l) + ")");
}

// Checks 0 <= v <= limit for a signed or unsigned value; returns it as uint64.
template <class T>
std::uint64_t check(const Limit& l, T v, std::string_view where, std::string_view field) {
  if constexpr (std::numeric_limits<T>::is_signed) {
    if (v < 0)
      throw LimitError(std::string(where) + ": " + std::string(field) + " = " + std::to_string(v) +
                       " is negative (it is a " + l.what + ")");
  }
  const auto u = static_cast<std::uint64_t>(v);
  if (u > max_of(l)) refuse(l, where, field, std::to_string(v));
  return u;
}

// Checks 1 <= v <= limit (a count or dimension that must be positive).
template <class T>
std::uint64_t check_positive(const Limit& l, T v, std::string_view where, std::string_view field) {
  if (v <= 0)
    throw LimitError(std::string(where) + ": " + std::string(field) + " = " + std::to_string(v) + " must be >= 1 (the " +
                     l.what + ")");
  return check(l, v, where, field);
}

// Overflow-checked size arithmetic: false when the exact result does not fit.
inline bool mul_ok(std::uint64_t a, std::uint64_t b, std::uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }
inline bool add_ok(std::uint64_t a, std::uint64_t b, std::uint64_t* out) { return !__builtin_add_overflow(a, b, out); }

// a * b, or a LimitError naming where/field when it overflows 64 bits.
inline std::uint64_t mul(std::uint64_t a, std::uint64_t b, std::string_view where, std::string_view field) {
  std::uint64_t r = 0;
  if (!mul_ok(a, b, &r))
    throw LimitError(std::string(where) + ": " + std::string(field) + " = " + std::to_string(a) + " * " +
                     std::to_string(b) + " overflows 64 bits");
  return r;
}
inline std::uint64_t add(std::uint64_t a, std::uint64_t b, std::string_view where, std::string_view field) {
  std::uint64_t r = 0;
  if (!add_ok(a, b, &r))
    throw LimitError(std::string(where) + ": " + std::string(field) + " = " + std::to_string(a) + " + " +
                     std::to_string(b) + " overflows 64 bits");
  return r;
}

// A double from a file or flag as an integer in [lo, hi]: false for NaN, inf or out of range, so
// no float->int conversion of an unrepresentable value happens (undefined behaviour).
template <class I>
bool double_to_int(double d, I lo, I hi, I* out) {
  // hi + 1.0 is exact for 32-bit types and rounds to 2^63 for 64-bit ones: both exclusive bounds.
  if (!(d >= static_cast<double>(lo) && d < static_cast<double>(hi) + 1.0)) return false;
  *out = static_cast<I>(d);
  return true;
}

}  // namespace kvgate::limits
