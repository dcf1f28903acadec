// The sign-off rules (`kvgate signoff`): two verdicts per format and their roll-up.
//
//   conformance  CONFORMS / DOES-NOT-CONFORM / NOT-VALIDATED   the gates tagged with the format, the
//                mutation proof of their mutants, no fallback: the implementation matches the format.
//   fit          FITS / OVER-BUDGET / NOT-MEASURED            the format's quality against the baseline
//                KV on the subject model, judged by a release policy (reports/policy/default.json).
//   overall      PASS only when the format conforms and fits.
//
// Every record passed between the stages is a typed struct; JSON appears only at the edge
// (parse_policy reads one, to_json writes the records). The functions here are pure: no file
// system, no clock, no engine (load_policy_file and load_corpus_file are the two readers).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <span>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvgate/verdict_record.hpp"

namespace kvgate {
struct Model;
}

namespace kvgate::signoff {

// --- verdicts and exit codes ---------------------------------------------------------------------
enum class Conformance { conforms, does_not_conform, not_validated };
enum class Fit { fits, over_budget, not_measured };
enum class Overall { pass, does_not_conform, over_budget, not_validated, not_measured };

std::string to_string(Conformance c);  // "CONFORMS", "DOES-NOT-CONFORM", "NOT-VALIDATED"
std::string to_string(Fit f);          // "FITS", "OVER-BUDGET", "NOT-MEASURED"
std::string to_string(Overall o);      // "PASS", "DOES-NOT-CONFORM", "OVER-BUDGET", "NOT-VALIDATED", "NOT-MEASURED"

// Exit codes of `kvgate signoff` (README, `kvgate signoff --help`). Bad input (an unreadable or
// refused policy, corpus or flag) exits 1 before anything is written.
inline constexpr int kExitPass = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitDoesNotConform = 2;
inline constexpr int kExitOverBudget = 3;
inline constexpr int kExitNotDecided = 4;  // NOT-VALIDATED or NOT-MEASURED
const char* exit_codes_help();

// PASS only when both verdicts hold. A format that does not conform is DOES-NOT-CONFORM whatever
// its quality; one that is over budget is OVER-BUDGET even when its conformance was not validated
// (a measured miss is decisive); otherwise anything not decided leaves the overall undecided.
Overall roll_up(Conformance c, Fit f);
int exit_code(Overall o);
// The most severe verdict over all formats decides the exit code:
// DOES-NOT-CONFORM > OVER-BUDGET > NOT-VALIDATED / NOT-MEASURED > PASS.
int exit_code(const std::vector<Overall>& all);

// --- conformance ------------------------------------------------------------------------------------
struct GateCounts {
  int passed = 0, failed = 0, skipped = 0;
  std::vector<std::string> failing, skipped_ids;
};

struct MutationOutcome {
  std::string status = "none";             // "run", "read", "not_run", "none"
  std::vector<std::string> mutants;        // the catalog's mutants that target gates of the format
  std::vector<std::string> killed, survived, not_run;
  std::vector<std::string> undecided;      // "id (status)" for timeout / unviable / noop / ...
  std::vector<std::string> missing;        // mutants absent from the outcomes
  std::string not_run_reason;              // when status is not_run / none
  bool baseline_green = true;              // the unmutated gates were green and the canary killed them all
  std::string baseline_message;
};

struct ConformanceInput {
  GateCounts gates;
  std::string gate_error;                  // the gates could not run at all
  MutationOutcome mutation;
  std::string fallback_reason;             // the format fell back to another on this model
  std::string fallback_effective;
  std::vector<std::string> not_validated;  // other reasons (e.g. no CUDA device for --device cuda)
};

struct ConformanceVerdict {
  Conformance verdict = Conformance::not_validated;
  std::vector<std::string> reasons;        // why it does not conform / was not validated
};

ConformanceVerdict conformance_verdict(const ConformanceInput& in);

// --- quality: per position, bucketed by depth ---------------------------------------------------------
// One teacher-forced position: the baseline's and the format's next-token distributions.
struct PositionMetrics {
  std::int64_t depth = 0;          // tokens before this one in its sequence (0 = first position)
  double kl = 0;                   // KL(baseline || format), nats
  double tv = 0;                   // total variation distance, 0.5 * sum |p - q|
  bool top1_agree = false;         // same argmax
  bool has_target = false;         // the sequence continues (perplexity counts this position)
  double nll_base = 0, nll_fmt = 0;  // -log p(next token)
};

// Compares two logit rows of `vocab` entries; `target` is the next token (-1: none).
PositionMetrics compare_position(const float* base, const float* got, int vocab, int target, std::int64_t depth);
// Every position of every sequence: logits[s] is [n][vocab] for tokens[s] (n <= tokens[s].size()).
std::vector<PositionMetrics> compare_sequences(const std::vector<std::vector<float>>& base,
                                               const std::vector<std::vector<float>>& got,
                                               const std::vector<std::vector<int>>& tokens, int vocab);

struct DepthBucket {
  std::string name;                // "0-1K"
  std::int64_t lo = 0, hi = -1;    // [lo, hi); hi < 0: open
  bool contains(std::int64_t d) const { return d >= lo && (hi < 0 || d < hi); }
};
// 0-1K, 1K-4K, 4K-16K, 16K+ (K = 1024 tokens).
std::vector<DepthBucket> default_buckets();

struct QualityStats {
  std::int64_t positions = 0;      // 0: empty (every field below is meaningless)
  std::int64_t ppl_positions = 0;  // positions with a next token
  double kl_mean = 0, kl_p99 = 0, kl_max = 0;
  double top1 = 0;                 // agreement, fraction
  double one_minus_tv = 0;         // mean 1 - TV: the expected speculative-decoding acceptance
  double ppl_base = 0, ppl_fmt = 0;
  double ppl_delta = 0;            // ppl_fmt / ppl_base - 1 (fraction)
  bool empty() const { return positions == 0; }
};
QualityStats summarize(const std::vector<PositionMetrics>& pm);

struct BucketQuality {
  DepthBucket bucket;
  QualityStats stats;              // empty when no position fell in the bucket (reported, never dropped)
};
struct QualityReport {
  QualityStats all;
  std::vector<BucketQuality> buckets;  // one per bucket given, in order
};
QualityReport bucket_quality(const std::vector<PositionMetrics>& pm, const std::vector<DepthBucket>& buckets);

// --- release policy ---------------------------------------------------------------------------------
enum class Metric { kl_mean, kl_p99, top1, one_minus_tv, ppl_delta, probe_parity, kv_saving, decode_speedup };
enum class Direction { at_most, at_least };  // the value must be <= (at_most) or >= (at_least) the bound

struct MetricInfo {
  Metric metric;
  const char* key;                 // the policy file's name for it
  const char* unit;                // what the policy must declare
  Direction direction;
  const char* bound_key;           // "max" or "min"
  double lo, hi;                   // the bound's admissible range (inclusive)
  bool quality;                    // bucketed teacher-forced quality metric (has a noise floor)
  const char* what;
};
const std::vector<MetricInfo>& metrics();
const MetricInfo& info(Metric m);
std::optional<Metric> parse_metric(const std::string& key);

struct Budget {
  Metric metric = Metric::kl_mean;
  double bound = 0;
  std::string source;              // where the number comes from (required)
  std::vector<std::string> devices;  // empty: every device; else only these ("cuda")
  bool disabled = false;           // null in the file: the metric is not budgeted for this format
};

class PolicyError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct Policy {
  std::string path;                // where it was read from (for the messages and the report)
  std::string name, description;
  std::string baseline = "auto";   // "auto" or a float preset (f16, bf16, f32)
  std::vector<Budget> defaults;
  std::map<std::string, std::vector<Budget>> overrides;  // format name -> budgets replacing defaults
};

// Schema-checked: every refusal names the file, the field and the fix (PolicyError).
Policy parse_policy(const nlohmann::json& doc, const std::string& path);
Policy load_policy_file(const std::string& path);  // reads + parse_policy; unreadable/bad JSON -> PolicyError

struct EffectiveBudget {
  Budget budget;
  std::string origin;              // "defaults.kl_mean" or "formats.q4_0.kl_mean"
};
// The budgets that apply to `format`: each metric's default, replaced by the format's override.
std::vector<EffectiveBudget> budgets_for(const Policy& p, const std::string& format);
// "formats.q4_0.kl_mean: kl_mean <= 0.05 nats" (one line of the policy, as the report shows it).
std::string describe(const EffectiveBudget& b);

// --- baseline ---------------------------------------------------------------------------------------
// `flag` (--baseline) over the policy's baseline over the default: the 16-bit KV a user's engine would
// run (f16 on cpu, bf16 on cuda). Refused (PolicyError) unless it is the preset f16, bf16 or f32.
std::string resolve_baseline(const std::string& flag, const std::string& policy_baseline, const std::string& device);

// --- noise floor ------------------------------------------------------------------------------------
struct NoiseRun {
  std::string name;                // "f32 vs f16", "f16 chunk 1 vs chunk 128"
  QualityReport quality;
};
struct NoiseFloor {
  std::vector<NoiseRun> runs;
  // The worst value of a quality metric over the runs (all positions); nullopt when no run measured it.
  std::optional<double> worst(Metric m) const;
};
std::optional<double> value_of(const QualityStats& s, Metric m);  // nullopt: not a quality metric / empty

// --- fit --------------------------------------------------------------------------------------------
struct FitInput {
  std::string format;
  std::string device = "cpu";
  std::optional<QualityReport> quality;        // nullopt: not measured
  std::optional<int> probe_regressions;        // probe cases the baseline passes and the format fails
  std::optional<double> kv_saving;             // 1 - format bytes / baseline bytes
  std::optional<double> decode_speedup;        // format decode tok/s / baseline's, on `device`
  std::string not_measured_reason;             // for the quality columns when quality is nullopt
  std::string unmeasured_reason;               // for every line: nothing of this format was measured
                                               // (it falls back to another format on the device)
  NoiseFloor noise;
};

enum class LineStatus { within, over, not_measured, refused, not_applicable };
std::string to_string(LineStatus s);

struct LineResult {
  EffectiveBudget budget;
  std::string scope;               // "all" or a depth bucket name; "" for unbucketed metrics
  std::optional<double> value;
  std::optional<double> noise;     // the noise floor of the metric, beside the value
  LineStatus status = LineStatus::not_measured;
  std::string reason;
  double margin = 0;               // signed headroom relative to the bound (< 0: over)
};

struct FitVerdict {
  Fit verdict = Fit::not_measured;
  std::vector<LineResult> lines;
  int deciding = -1;               // index into lines: the line that decided the verdict
  std::vector<std::string> reasons;
};

// One line against one measured value (pure; the table-driven gates call it directly).
LineResult judge_line(const EffectiveBudget& b, std::optional<double> value, std::optional<double> noise,
                      const std::string& device, const std::string& scope);
FitVerdict fit_verdict(const Policy& p, const FitInput& in);

// --- the whole verdict of one format ---------------------------------------------------------------
struct FormatVerdict {
  std::string format;
  ConformanceVerdict conformance;
  FitVerdict fit;
  Overall overall = Overall::not_validated;
  std::vector<std::string> notes;
};
FormatVerdict decide(const std::string& format, const ConformanceInput& c, const Policy& p, const FitInput& f);
// The policy line that decided the verdict, as the report's first table shows it.
std::string deciding_line(const FormatVerdict& v);

// --- corpus files (--corpus) ------------------------------------------------------------------------
// A corpus JSON (datasets/corpora/*.json: {"sequences": [{"tokens": [...]}, ...]}), a token-id file
// (integers separated by spaces, commas or newlines; a blank line starts a new sequence) or a text
// file (tokenized with the model's tokenizer). Refused (PolicyError: file, field, fix) when empty, when
// an id is outside the model's vocabulary, or text without a tokenizer. Sequences longer than
// `max_context` are split.
std::vector<std::vector<int>> load_corpus_file(const std::string& path, const Model& model, int max_context);

// --- JSON at the edge ------------------------------------------------------------------------------
nlohmann::json to_json(const QualityStats& s);
nlohmann::json to_json(const QualityReport& q);
nlohmann::json to_json(const NoiseFloor& n);
nlohmann::json to_json(const LineResult& l);
nlohmann::json to_json(const ConformanceVerdict& c);
nlohmann::json to_json(const FitVerdict& f);
nlohmann::json to_json(const GateCounts& g);
nlohmann::json to_json(const MutationOutcome& m);
nlohmann::json to_json(const Policy& p);
nlohmann::json to_json(const FormatVerdict& v);  // records::to_json(to_record(v))

// The typed records of signoff.json's verdicts (kvgate/verdict_record.hpp, one field table each);
// the to_json above of the same types write these.
records::VerdictLineRecord to_record(const LineResult& l);
records::ConformanceRecord to_record(const ConformanceVerdict& c);
records::FitRecord to_record(const FitVerdict& f);
records::GateCountsRecord to_record(const GateCounts& g);
records::MutationProofRecord to_record(const MutationOutcome& m);  // not_run: not run, then missing, then undecided IDs
// The verdict, its reasons (conformance then fit) and notes; gates, mutation, matrix and quality are
// the caller's to fill (they come from other stages).
records::FormatVerdictRecord to_record(const FormatVerdict& v);

}  // namespace kvgate::signoff

// --- probe sensitivity (pure) ---------------------------------------------------------------------
namespace kvgate::signoff {

// A probe proves it can go red: KV damage of known size is injected on the store read of the
// baseline and the cases the undamaged baseline passes are run again. One rung of a damage ladder:
// the family ("v_noise": V noise at size x the format's envelope; "v_repeat": a fraction `size` of V
// rows replaced by the previous row; "k_noise_needle": keys at the probe's payload positions
// perturbed by size x their cell's largest magnitude), the size, and how many of those cases ran and
// still passed. The probe is red at a rung when any of them fails.
struct DamageStep {
  std::string family;
  double size = 0;
  int ran = 0, passed = 0;
  bool red() const { return ran > 0 && passed < ran; }
};
struct FamilySensitivity {
  std::string family;
  std::optional<double> smallest_red;  // the smallest size that turned the probe red; none: no rung did
  std::vector<DamageStep> steps;       // in the order run (ascending size)
};
struct ProbeSensitivity {
  std::string probe;
  int baseline_ran = 0, baseline_passed = 0;  // the undamaged cases the ladder starts from
  std::vector<FamilySensitivity> families;
  bool vacuous = true;  // no damage turned it red (or the baseline passes none of its cases)
  std::string reason;   // why vacuous, or the smallest damage per family that turned it red
  std::string engine;   // where the damaged runs ran ("cpu")
  std::string envelope_format;  // v_noise sizes are multiples of this format's envelope
};
// Judges a probe from its undamaged baseline counts and every rung run (any order, any family).
ProbeSensitivity judge_sensitivity(const std::string& probe, int baseline_ran, int baseline_passed,
                                   const std::vector<DamageStep>& steps);
nlohmann::json to_json(const ProbeSensitivity& p);

}  // namespace kvgate::signoff

// --- measurement (runs the CPU engine; not pure) ---------------------------------------------------
namespace kvgate::signoff {

// Teacher-forced quality of every format against the baseline, on the decode path: each sequence
// goes through Engine::forward_all_logits, a chunked prefill whose every chunk writes its K/V rows
// into the paged store in the format and then attends over the store (its own chunk included), so
// every position's logits come from K/V that were quantized, stored and read back. Two noise runs
// beside it: the other float KV (f32, or f16 when the baseline is f32) against the baseline, and the
// baseline decoded token by token (prefill chunk 1) against its chunked prefill.
struct QualityRun {
  std::map<std::string, QualityReport> by_format;
  std::map<std::string, std::string> effective;  // format -> what the store held (a fallback shows here)
  NoiseFloor noise;
  std::int64_t positions = 0;
  std::size_t sequences = 0;
  std::string device = "cpu";              // the engine the logits came from
  std::int64_t decode_path_positions = 0;  // positions of the decode-path noise run
};
QualityRun measure_quality(const Model& model, const std::vector<std::string>& formats, const std::string& baseline,
                           const std::vector<std::vector<int>>& corpus, int threads, const std::vector<DepthBucket>& buckets,
                           const std::function<void(const std::string&)>& progress = {});

// The engine behind one quality run: teacher-forces tokens appended to its sequence and returns the
// logits of every one ([n][vocab]). Path chunked_prefill: chunks that write their K/V rows into the
// store in the format, then attend over the store; decode_steps: one token at a time through the
// engine's decode step (the path generation takes). Either way every position's logits come from
// K/V that were stored in the format and read back.
enum class QualityPath { chunked_prefill, decode_steps };
const char* to_string(QualityPath p);
class LogitsEngine {
 public:
  virtual ~LogitsEngine() = default;
  virtual void reset() = 0;
  virtual std::vector<float> append(std::span<const int> tokens) = 0;
  virtual int max_context() const = 0;
  virtual std::string effective() const = 0;  // what the store holds (a fallback shows here)
};
// Makes the engine of a format for a path; throws PolicyError for an unknown format.
using EngineFactory = std::function<std::unique_ptr<LogitsEngine>(const std::string& format, QualityPath path)>;

struct QualityOptions {
  std::string device = "cpu";   // the engine the factory makes (recorded)
  int window = 512;             // positions appended and compared at once (window x vocab floats per engine)
  int decode_path_tokens = 0;   // the decode-path noise run covers the first N tokens of a sequence (0: all)
  int max_tokens = 0;           // sequences are cut to this many tokens (0: the engines' context)
  int compare_threads = 0;      // threads of the per-position comparison (0: every core)
  int prefill_chunk = 128;      // recorded; the factory applies it
};
// The CPU engine (kvgate::Engine) for every format, `threads` threads, prefill chunk `chunk`,
// context `max_context` (0: the model's); mla_latent: an MLA model's cache holds the latent and the
// RoPE key, each half in the format (--mla-cache latent).
EngineFactory cpu_engine_factory(const Model& model, int threads, int chunk = 128, int max_context = 0,
                                 bool mla_latent = false);
// The engine of `device`: "cpu" (cpu_engine_factory), "cuda" (kvgate::cuda::CudaEngine, every
// format's engine sharing one upload of the weights, `cuda_weights` "f32" or "bf16"; refused with
// the reason when this build has no CUDA backend or no device is usable).
EngineFactory device_engine_factory(const Model& model, const std::string& device, int threads, int chunk,
                                    int max_context, const std::string& cuda_weights = "f32", bool mla_latent = false);
// The measurement over any engine: every sequence is appended window by window to one engine per
// format, the baseline's and the two noise runs' (the other float KV chunked; the baseline on the
// decode path), all in step, and compared position by position; nothing larger than one window of
// logits per engine is held.
QualityRun measure_quality(const EngineFactory& make, const std::vector<std::string>& formats, const std::string& baseline,
                           const std::vector<std::vector<int>>& corpus, const std::vector<DepthBucket>& buckets,
                           const QualityOptions& qo, const std::function<void(const std::string&)>& progress = {});

}  // namespace kvgate::signoff
