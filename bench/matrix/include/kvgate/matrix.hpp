// The A/B matrix behind `kvgate bench` (and the probe runner behind `kvgate probe`): formats x
// context lengths x streaming window x device -> memory, TTFT, prefill/decode throughput at depth,
// KL/top-1 against f32 KV on the committed corpus, and the needle/counting/echo probes.
// Every record carries provenance (commit, CPU, GPU, compiler and flags, seed, model hash).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/kv_damage.hpp"
#include "kvgate/model.hpp"
#include "kvgate/probes.hpp"
#include "kvgate/signoff.hpp"

namespace kvgate::cuda {
class CudaModel;  // kvgate/cuda/engine.hpp (CUDA builds)
}

namespace kvgate::matrix {

inline constexpr const char* kMatrixSchema = "kvgate.matrix/1";
inline constexpr const char* kProbeSchema = "kvgate.run/1";

// --- provenance --------------------------------------------------------------------------------
std::string sha256_hex(const void* data, std::size_t n);
std::string sha256_file(const std::string& path);  // empty when unreadable

struct ProvenanceOptions {
  std::string source_dir;        // git work tree to read the commit from (default: compile-time source)
  std::uint64_t seed = 0;
  const Model* model = nullptr;  // path, SHA-256 of the file(s), fingerprint
  int threads = 1;
};
// {git_commit, git_dirty, kvgate_version, cpu_model, cpu_cores, os, gpus[], gpu_driver, cuda_runtime,
//  compiler, cxx_flags, build_type, cuda_build, seed, threads, model{path, kind, sha256, fingerprint, ...}}
nlohmann::json provenance(const ProvenanceOptions& o);
// The commit a provenance (or an environment record) names, read the one way every renderer reads
// it. Outside a git work tree (an installed kvgate, an unpacked release, a scratch copy) both
// git_commit and git_dirty are null: commit is then empty and dirty false.
struct CommitStamp {
  std::string commit;  // full hash; empty: not a git work tree
  bool dirty = false;  // uncommitted changes to tracked files
  bool known() const { return !commit.empty(); }
};
CommitStamp commit_stamp(const nlohmann::json& provenance);
// The per-row subset (llama-bench style): commit, cpu, gpu, compiler, seed, model hash.
nlohmann::json provenance_brief(const nlohmann::json& full);
// The environment fingerprint of field reports: provenance plus memory and nvidia-smi lines.
nlohmann::json environment(const ProvenanceOptions& o);
// How the GPUs of a machine are linked, from the text of `nvidia-smi topo -m` with n GPUs: "" for
// none, "single" for one, else every pair's link as nvidia-smi names it ("GPU0-GPU1:NV18,
// GPU0-GPU2:SYS, ..."; NV# = NVLink bonds, PIX/PXB/PHB/NODE/SYS = PCIe paths). A pair the text
// does not give is "?". The provenance's gpu_topology.
std::string gpu_topology(const std::string& topo_m, int n_gpus);

// --- models and corpora -------------------------------------------------------------------------
// Where the shared models live: kvgate::model_dirs (kvgate/model_paths.hpp), the source tree
// defaulting to default_source_dir().
std::vector<std::string> model_dirs(const std::string& source_dir);
// "stories260K/stories260K.bin" -> the first existing candidate, or empty.
std::string find_model(const std::string& rel, const std::string& source_dir);
std::string default_source_dir();  // the git work tree around the cwd, else the configured source
// The probe model (datasets/models/probe, a Hugging Face directory): $KVGATE_PROBE_MODEL,
// else <source>/datasets/models/probe when its config.json exists; empty when neither is there.
std::string find_probe_model(const std::string& source_dir);

struct Corpus {
  std::string path, model_fingerprint;
  std::vector<std::vector<int>> sequences;
};
Corpus load_corpus(const std::string& path);  // datasets/corpora/*.json

// --- probes on the engine ------------------------------------------------------------------------
struct ProbeSpec {
  probes::ProbeKind kind = probes::ProbeKind::needle;
  std::vector<int> lengths;            // needle: context L; counting: N (empty: defaults for the model)
  std::vector<double> depths;          // needle only
  std::vector<std::uint64_t> seeds;    // needle and echo
  int echo_per_seed = 1;               // echo numbers per seed
};
// Defaults that fit the model's context (stories260K: short lengths; a long-context model: 512..8K).
ProbeSpec default_probe_spec(probes::ProbeKind kind, const Model& m, bool quick);
// One note about what the probe can measure on this subject (stories260K cannot pass them).
std::string subject_note(const Model& m);

// Runs every case greedily on a fresh sequence of one engine. The JSON is the `kvgate probe --json`
// record: probe, kv, kv_requested, fallback_reason, subject, cases, passed, skipped, results[...].
using Progress = std::function<void(const std::string& line)>;
// Where the probes run: "cpu" (kvgate::Engine, the default) or "cuda" (kvgate::cuda::CudaEngine,
// `weights` shared when set, else uploaded as `cuda_weights`).
struct ProbeDevice {
  std::string device = "cpu";
  std::string cuda_weights = "f32";
  std::shared_ptr<const cuda::CudaModel> weights;
};
nlohmann::json run_probe(const Model& model, const EngineOptions& eo, const ProbeSpec& spec,
                         const Progress& progress = {}, const ProbeDevice* device = nullptr);
// One upload of `model`'s weights to the GPU ("f32" | "bf16") for several engines; throws in a
// build without the CUDA backend.
std::shared_ptr<const cuda::CudaModel> shared_cuda_weights(const Model& model, const std::string& weights);

// --- probe sensitivity: KV damage of known size (kvgate/kv_damage.hpp) ---------------------------
// The CPU engine applies it on the store read (KvReadHook), the CUDA engine to the stored rows
// (CudaEngineOptions::damage, float KV halves only).
using DamageKind = KvDamageKind;
using Damage = KvDamage;
std::shared_ptr<const KvReadHook> make_damage_hook(const Damage& d, int head_dim);
// The format's relative envelope: the largest |x^ - x| / amax(cell) its rounding allows (half an
// ulp for the floats; s/2 = amax/254 for int8 and q8_0; |d|/2 = amax/16 for q4_0).
double format_envelope(HalfFormat f);
struct SensitivityOptions {
  int max_cases = 2;   // undamaged passing cases the ladder reruns (the shortest first)
  int max_tries = 6;   // undamaged cases tried to find them
  double envelope = 1.0 / 16;
  std::string envelope_format = "q4_0";
  std::vector<double> v_noise = {0.25, 1, 4, 16, 64, 256, 1024};  // x envelope
  std::vector<double> v_repeat = {1.0 / 64, 1.0 / 16, 0.25, 1.0};
  std::vector<double> k_noise = {0.05, 0.25, 1, 4};     // x amax of the cell
};
// The envelope of the lossiest format among `formats` (q4_0 when none parses).
SensitivityOptions sensitivity_options_for(const std::vector<std::string>& formats);
// Runs the ladder of every damage family with `base_eo` (the baseline KV) and judges it
// (signoff::judge_sensitivity). Each family's ladder stops at its first red rung. The undamaged
// cases are run here, or read from `baseline_cases` (the matrix's cases_detail of the baseline
// format, run on the probe device): a baseline that passes none costs no damaged run. The engine:
// the CPU engine (damage on the store read), or with `device` "cuda" one CUDA engine (its weights
// shared when set) whose damage is set before each case (damage on the stored rows; the baseline
// must be a float KV format, as its `base_eo.kv` resolves for backend "cuda"). The result's engine
// field names it.
signoff::ProbeSensitivity probe_sensitivity(const Model& model, const EngineOptions& base_eo, const ProbeSpec& spec,
                                            const SensitivityOptions& so, const Progress& progress = {},
                                            const nlohmann::json* baseline_cases = nullptr,
                                            const ProbeDevice* device = nullptr);

// --- KL / top-1 against f32 KV ---------------------------------------------------------------------
struct Quality {
  double kl_mean = 0, kl_p99 = 0, kl_max = 0, top1 = 0;
  long long positions = 0;
};
// Teacher-forced logits of every corpus position at `fmt` vs `ref` (logits per sequence at f32 KV).
std::vector<std::vector<float>> corpus_logits(const Model& model, const EngineOptions& eo, const Corpus& corpus);
Quality compare_logits(const std::vector<std::vector<float>>& ref, const std::vector<std::vector<float>>& got,
                       int vocab);

// --- the matrix ---------------------------------------------------------------------------------------
struct MatrixOptions {
  std::vector<std::string> formats;      // presets or k=<h>,v=<h>; f32 is always added as the baseline
  std::vector<int> lengths;              // context lengths (prompt tokens) for the timing rows
  std::vector<int> windows = {0};        // --kv-resident tokens (0 = resident); ignored when unsupported
  std::vector<std::string> devices = {"cpu"};
  int decode_steps = 32;                 // decode tok/s measured over this many tokens at depth
  int warm_turn = 16;                    // new tokens of the warm (second) turn
  int repeats = 1;                       // timing repeats (median)
  std::size_t budget_bytes = std::size_t(1) << 30;  // capacity at this KV memory budget
  int threads = 1;
  bool timing = true;                    // false: no clock is read; timing fields are null
  bool probes = true;
  bool quality = true;
  bool quick = false;
  std::string corpus_path;               // KL/top-1 corpus (empty: no KL)
  std::string cache_dir;                 // scratch for the warm-TTFT KV files
  std::uint64_t seed = 1;
  std::map<std::string, ProbeSpec> probe_specs;  // by probe name; missing: defaults
  // Subject of the needle/counting/echo probes when it is not the matrix model (the probe model;
  // stories260K cannot follow the prompts). KL/top-1 and timing stay on the matrix model.
  const Model* probe_model = nullptr;
  std::string probe_model_path;
  // The engine of the per-format probes: "cpu" or "cuda" (kvgate::cuda::CudaEngine, every format's
  // engine on one upload of the weights, `cuda_weights` f32 | bf16).
  std::string probe_device = "cpu";
  // MLA models (DeepSeek-V2/V3): "expanded" or "latent" (EngineOptions::mla_cache, --mla-cache): every
  // row of the matrix model runs over that cache; bytes and capacity are the latent's rows. The probe
  // subject keeps its own (it runs latent only when it is an MLA model itself).
  std::string mla_cache = "expanded";
  std::string cuda_weights = "f32";
  // Probe sensitivity (injected KV damage, CPU engine): the KV format the damage is applied on top
  // of (empty: not measured) and the ladder.
  std::string sensitivity_baseline;
  SensitivityOptions sensitivity;
  // Per-layer ablation (`--layer-ablation`): each of these formats on one layer at a time, every other
  // layer on the f32 baseline (a per-layer map, kvgate/kv_layer_map.hpp), KL / top-1 against f32 KV
  // over the corpus: which layer a format's quality loss comes from. CPU engine; needs the corpus.
  std::vector<std::string> layer_ablation;
};

// Overrides of the matrix grids from the command line (empty / 0: keep the defaults).
struct GridOverrides {
  std::string needle_lengths, needle_depths, needle_seeds, counting_n, echo_seeds, bench_lengths;
  int repeats = 0;
};
void apply_grid(MatrixOptions& mo, const GridOverrides& g);
// The engine of the sign-off's matrix: "cpu" (timing rows and probes on kvgate::Engine, KL/top-1
// against f32 KV on the corpus) or "cuda" (timing rows and probes on kvgate::cuda::CudaEngine with
// `cuda_weights`; the matrix's CPU KL is off: the sign-off measures quality on the CUDA engine).
void set_device(MatrixOptions& mo, const std::string& device, const std::string& cuda_weights);
// The quality run of the sign-off for `device`: windows of 512 positions; the engines' context is
// the longest sequence (cut to quality_tokens when > 0); the decode-path noise run covers
// decode_path_tokens per sequence (< 0: all on cpu, the first 2048 on cuda, where one decode step per
// token of a long sequence would dominate the run).
signoff::QualityOptions quality_options_for(const Model& m, const std::string& device, const std::vector<std::vector<int>>& corpus,
                                            int quality_tokens, int decode_path_tokens);
std::string quality_path_text(const std::string& device, int prefill_chunk);  // the record's quality_method.path
// The prefill chunk of the sign-off's engines on `device`: default_prefill_chunk (kvgate/engine.hpp),
// 128 tokens on the CPU, 512 (one quality window) on CUDA, as `kvgate run` / `chat` take.
int signoff_prefill_chunk(const std::string& device);
// `format` as the backend of `device` ("cpu" | "cuda") would hold it for this model: on "cuda" the
// CUDA kernels' capability (resolve_kv backend "cuda"), so a format without CUDA kernels shows its
// fallback here. Throws std::runtime_error for "cuda" in a build without the CUDA backend.
// mla_latent: the MLA latent cache (--mla-cache latent), resolved against the latent's and the RoPE
// key's rows (KvRequest::mla_latent), not the expanded heads.
ResolvedKv resolve_on_device(const ModelConfig& cfg, const KvFormat& format, int block_size, const std::string& device,
                             bool mla_latent = false);

// Elapsed time per stage of a long run (the sign-off's): done(name) prints the stage's and the
// total elapsed seconds to stderr and records them.
class StageClock {
 public:
  StageClock();
  void done(const std::string& stage);
  nlohmann::json to_json() const;  // [{stage, seconds}]

 private:
  double t0_, last_;
  nlohmann::json stages_ = nlohmann::json::array();
};

// Quick defaults for a model (a full CPU run on stories260K in a few minutes).
MatrixOptions default_matrix_options(const Model& m, bool quick);
bool engine_supports_streaming();
bool engine_supports_conversations();

nlohmann::json run_matrix(const Model& model, const MatrixOptions& o, const nlohmann::json& provenance,
                          const Progress& progress = {});

// --- outputs ------------------------------------------------------------------------------------------
std::string rows_jsonl(const nlohmann::json& matrix);
std::string rows_csv(const nlohmann::json& matrix);
std::string matrix_markdown(const nlohmann::json& matrix);

// The one Markdown renderer of matrix rows (`kvgate bench`'s matrix.md, the sign-off report's
// per-format pages, the field report): one table of columns {header, row key, printf format,
// measurement?, description}. A new row column is one line of row_columns().
struct RowColumn {
  const char* header;       // "TTFT cold ms"
  const char* key;          // the row's field: "ttft_cold_ms"
  const char* printf;       // for floating-point values ("%.2f"); "" prints the value as it is
  bool measurement;         // a per-row measurement (field-report --compare diffs these)
  const char* description;
};
const std::vector<RowColumn>& row_columns();
struct RowTable {
  std::vector<std::string> keys;  // the columns, by key, in order (empty: every column)
  std::string format;             // only rows of this format (empty: every row)
};
// A Markdown table of `rows` (matrix.json "rows"); the status cell carries the row's reason.
std::string rows_markdown(const nlohmann::json& rows, const RowTable& table = {});
// Writes matrix.json (canonical), matrix.jsonl, matrix.csv, matrix.md into `dir`; returns the paths.
std::vector<std::string> write_matrix(const nlohmann::json& matrix, const std::string& dir);

// `kvgate bench --shard k/n`: the formats asked for (f32 left out: the baseline runs on every
// shard) at positions i with i mod n == k. `merge_matrices`: the shards' matrix.json documents
// (file name, document) back into one matrix in the unsharded row order; refuses (std::runtime_error
// naming the file, the field and the fix) a missing or doubled shard, shards of other commits,
// models, options or format lists, a document that is not a sharded matrix.
std::vector<std::string> shard_formats(const std::vector<std::string>& formats, int index, int count);
nlohmann::json merge_matrices(const std::vector<std::pair<std::string, nlohmann::json>>& shards);

std::vector<std::string> split_csv(const std::string& s);
std::vector<int> parse_int_list(const std::string& s);
std::vector<double> parse_double_list(const std::string& s);
std::vector<std::uint64_t> parse_seed_list(const std::string& s);  // "1,2,3" or "1..8"

}  // namespace kvgate::matrix
