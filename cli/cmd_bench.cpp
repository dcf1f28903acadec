// `kvgate bench`: the A/B matrix (bench/matrix): formats x context x streaming window x device, with
// quality columns (KL/top-1 vs f32, probes) on every row and provenance on every record.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "cmd_bench.hpp"
#include "commands.hpp"
#include "kvgate/json_limits.hpp"
#include "kvgate/matrix.hpp"
#include "kvgate_mutations/catalog.hpp"
#include "kvgate_mutations/shard.hpp"

namespace kvgate::cli {

namespace {

struct BenchOpts {
  std::string model, tokenizer, probe_model, formats, lengths, windows, devices = "cpu", corpus, out = "kvgate.out/bench";
  std::string layer_ablation;  // --layer-ablation FMT[,FMT]
  std::string mla_cache = "expanded";  // --mla-cache expanded|latent (MLA models)
  std::string needle_lengths, needle_depths, needle_seeds, counting_n, echo_seeds, shard;
  int decode_steps = 0, repeats = 0, threads = 1;
  double budget_mib = 1024;
  std::uint64_t seed = 1;
  bool quick = false, no_timing = false, no_probes = false, no_quality = false, json = false;
};

}  // namespace

// Shared with signoff / field-report: a progress printer (one rewritten line on a terminal).
std::function<void(const std::string&)> progress_printer(const std::string& prefix) {
  const bool tty = isatty(STDERR_FILENO);
  return [tty, prefix](const std::string& line) {
    if (tty) std::fprintf(stderr, "\r\033[K%s%s", prefix.c_str(), line.substr(0, 150).c_str());
    else std::fprintf(stderr, "%s%s\n", prefix.c_str(), line.c_str());
    std::fflush(stderr);
  };
}
void progress_done() {
  if (isatty(STDERR_FILENO)) std::fprintf(stderr, "\r\033[K");
}

matrix::MatrixOptions bench_options_from(const Model& model, bool quick, const std::string& source_dir) {
  matrix::MatrixOptions mo = matrix::default_matrix_options(model, quick);
  // The default corpus holds stories260K's token ids: it is the default only for that model (another
  // model's vocabulary may not cover its ids; pass --corpus FILE sampled from that model instead).
  const auto corpus = std::filesystem::path(source_dir) / "datasets" / "corpora" / "stories260K_tf.json";
  if (std::filesystem::exists(corpus)) {
    const matrix::Corpus c = matrix::load_corpus(corpus.string());
    bool fits = true;
    for (const auto& seq : c.sequences)
      for (int id : seq) fits = fits && id >= 0 && id < model.config.vocab_size;
    if (fits) mo.corpus_path = corpus.string();
  }
  return mo;
}

void load_probe_subject(const std::string& flag, const std::string& source_dir, bool quick, matrix::MatrixOptions& mo,
                        std::optional<Model>& holder) {
  const std::string path = flag.empty() ? matrix::find_probe_model(source_dir) : flag == "none" ? "" : flag;
  if (path.empty()) {
    if (flag.empty())
      std::fprintf(stderr, "note: the probe model (datasets/models/probe) was not found: the probes run on the matrix model\n");
    return;
  }
  holder.emplace(load_model(path));
  for (auto k : {probes::ProbeKind::needle, probes::ProbeKind::counting, probes::ProbeKind::echo})
    mo.probe_specs[probes::to_string(k)] = matrix::default_probe_spec(k, *holder, quick);
  mo.probe_model = &*holder;  // holder outlives the matrix run (owned by the caller)
  mo.probe_model_path = path;
}

namespace {

int run_bench(const BenchOpts& o) {
  const std::string src = matrix::default_source_dir();
  const std::string model_path = o.model.empty() ? matrix::find_model("stories260K/stories260K.bin", src) : o.model;
  if (model_path.empty()) throw std::invalid_argument("no --model and stories260K not found (set KVGATE_MODELS)");
  const Model model = load_model(model_path, o.tokenizer);
  matrix::MatrixOptions mo = bench_options_from(model, o.quick, src);
  std::optional<Model> probe_subject;
  load_probe_subject(o.probe_model, src, o.quick, mo, probe_subject);
  if (!o.formats.empty()) mo.formats = matrix::split_csv(o.formats);
  if (!o.layer_ablation.empty()) mo.layer_ablation = matrix::split_csv(o.layer_ablation);
  std::optional<mutate::ShardSpec> shard;
  std::vector<std::string> all_formats;
  if (!o.shard.empty()) {  // the formats by position mod n; f32 (the baseline) on every shard
    std::string err;
    shard = mutate::parse_shard(o.shard, &err);
    if (!shard) throw std::invalid_argument(err);
    all_formats = matrix::shard_formats(mo.formats, 0, 1);
    mo.formats = matrix::shard_formats(mo.formats, shard->index, shard->count);
  }
  if (!o.lengths.empty()) mo.lengths = matrix::parse_int_list(o.lengths);
  if (!o.windows.empty()) mo.windows = matrix::parse_int_list(o.windows);
  mo.devices = matrix::split_csv(o.devices);
  mo.mla_cache = o.mla_cache;
  if (o.decode_steps > 0) mo.decode_steps = o.decode_steps;
  if (o.repeats > 0) mo.repeats = o.repeats;
  mo.budget_bytes = static_cast<std::size_t>(o.budget_mib * 1024.0 * 1024.0);
  mo.threads = o.threads;
  mo.timing = !o.no_timing;
  mo.probes = !o.no_probes;
  mo.quality = !o.no_quality;
  mo.seed = o.seed;
  if (!o.corpus.empty()) mo.corpus_path = o.corpus == "none" ? "" : o.corpus;
  mo.cache_dir = (std::filesystem::path(o.out) / ".kvcache").string();
  auto& nd = mo.probe_specs["needle"];
  if (!o.needle_lengths.empty()) nd.lengths = matrix::parse_int_list(o.needle_lengths);
  if (!o.needle_depths.empty()) nd.depths = matrix::parse_double_list(o.needle_depths);
  if (!o.needle_seeds.empty()) nd.seeds = matrix::parse_seed_list(o.needle_seeds);
  if (!o.counting_n.empty()) mo.probe_specs["counting"].lengths = matrix::parse_int_list(o.counting_n);
  if (!o.echo_seeds.empty()) mo.probe_specs["echo"].seeds = matrix::parse_seed_list(o.echo_seeds);

  matrix::ProvenanceOptions po;
  po.model = &model;
  po.seed = o.seed;
  po.threads = o.threads;
  po.source_dir = src;
  const auto prov = matrix::provenance(po);
  auto m = matrix::run_matrix(model, mo, prov, progress_printer("bench "));
  if (shard) m["shard"] = {{"index", shard->index}, {"count", shard->count}, {"formats", all_formats}};
  progress_done();
  std::error_code ec;
  std::filesystem::remove_all(mo.cache_dir, ec);
  const auto files = matrix::write_matrix(m, o.out);
  if (o.json) {
    std::cout << m.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << matrix::matrix_markdown(m);
    for (const auto& f : files) std::fprintf(stderr, "wrote %s\n", f.c_str());
  }
  return 0;
}

int run_bench_merge(const std::vector<std::string>& dirs, const std::string& out, bool json) {
  std::vector<std::pair<std::string, nlohmann::json>> shards;
  for (const auto& d : dirs) {
    const std::filesystem::path f =
        std::filesystem::is_directory(d) ? std::filesystem::path(d) / "matrix.json" : std::filesystem::path(d);
    nlohmann::json doc;
    try {
      doc = limits::parse_json(mutate::read_text(f), f.string());  // size and depth limits
      limits::check_records(doc, f.string());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvgate bench merge: %s: field / is not a readable JSON document (%s); fix: pass the complete output folder of kvgate bench --shard k/n\nkvgate bench merge: nothing written\n",
                   f.c_str(), e.what());
      return 1;
    }
    shards.emplace_back(f.string(), std::move(doc));
  }
  nlohmann::json m;
  try {
    m = matrix::merge_matrices(shards);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvgate bench merge: %s\nkvgate bench merge: nothing written\n", e.what());
    return 1;
  }
  const auto files = matrix::write_matrix(m, out);
  if (json) std::cout << m.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  else std::cout << matrix::matrix_markdown(m);
  for (const auto& f : files) std::fprintf(stderr, "wrote %s\n", f.c_str());
  return 0;
}

}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOpts>();
  auto* sub = app.add_subcommand("bench", "A/B matrix: KV formats x context x streaming window x device (JSON, JSONL, CSV, Markdown)");
  sub->add_option("--model", o->model, "model (default: stories260K)");
  sub->add_option("--probe-model", o->probe_model,
                  "subject of the needle/counting/echo probes (default: datasets/models/probe; 'none' = --model)");
  sub->add_option("--tokenizer", o->tokenizer, "tokenizer file when it is not beside the model");
  sub->add_option("--formats", o->formats, "presets and pairs, e.g. f16,int8,k8v4,k=q8_0;v=q4_0 (default: every preset + k=q8_0,v=q4_0)");
  sub->add_option("--lengths", o->lengths, "context lengths of the timing rows");
  sub->add_option("--layer-ablation", o->layer_ablation,
                  "formats measured one layer at a time, the other layers on f32 (KL/top-1 per layer vs f32 KV over "
                  "the corpus: which layer the loss comes from), e.g. q4_0,int8");
  sub->add_option("--windows", o->windows, "--kv-resident windows in tokens (0 = resident); used when the engine streams");
  sub->add_option("--devices", o->devices, "cpu[,cuda]")->capture_default_str();
  sub->add_option("--mla-cache", o->mla_cache,
                  "MLA models: expanded (per-head K/V rows) or latent (the latent and the RoPE key, each half in its "
                  "format; bytes and capacity of the latent rows)")
      ->capture_default_str();
  sub->add_option("--decode-steps", o->decode_steps, "decode tokens timed at depth (default 32)");
  sub->add_option("--repeats", o->repeats, "timing repeats, median (default 3 with --quick, else 5)");
  sub->add_option("--budget-mib", o->budget_mib, "KV memory budget for the capacity column (MiB)")->capture_default_str();
  sub->add_option("--threads", o->threads, "CPU threads")->capture_default_str();
  sub->add_option("--seed", o->seed, "seed recorded in the provenance")->capture_default_str();
  sub->add_option("--corpus", o->corpus, "KL/top-1 corpus (default datasets/corpora/stories260K_tf.json; 'none' = off)");
  sub->add_option("--needle-lengths", o->needle_lengths, "needle context lengths");
  sub->add_option("--needle-depths", o->needle_depths, "needle depths");
  sub->add_option("--needle-seeds", o->needle_seeds, "needle seeds");
  sub->add_option("--counting-n", o->counting_n, "counting N values");
  sub->add_option("--echo-seeds", o->echo_seeds, "echo seeds (1..N)");
  sub->add_flag("--quick", o->quick, "quick defaults (a full CPU run on stories260K in a few minutes)");
  sub->add_flag("--no-timing", o->no_timing, "read no clock: timing columns are null (for tests)");
  sub->add_flag("--no-probes", o->no_probes, "skip the probe columns");
  sub->add_flag("--no-quality", o->no_quality, "skip KL/top-1");
  sub->add_option("--out", o->out, "output folder (matrix.json, .jsonl, .csv, .md)")->capture_default_str();
  sub->add_flag("--json", o->json, "print the canonical JSON instead of Markdown");
  sub->add_option("--shard", o->shard,
                  "k/n: only the formats at positions i with i mod n == k (f32, the baseline, on every shard); join "
                  "the n output folders with `kvgate bench merge`");
  struct MergeArgs {
    std::vector<std::string> dirs;
    std::string out;
    bool json = false;
  };
  auto ma = std::make_shared<MergeArgs>();
  auto* merge = sub->add_subcommand("merge", "Join the output folders of `kvgate bench --shard k/n` into one matrix (the "
                                             "unsharded row order); refuses a missing or doubled shard, other commits, "
                                             "models, options (nothing is written then)");
  merge->add_option("DIR", ma->dirs, "the shard output folders (or their matrix.json)")->required();
  merge->add_option("--out", ma->out, "the merged output folder")->required();
  merge->add_flag("--json", ma->json, "print the canonical JSON instead of Markdown");
  on_run(sub, [o, ma, merge] { return merge->parsed() ? run_bench_merge(ma->dirs, ma->out, ma->json) : run_bench(*o); });
}

}  // namespace kvgate::cli
