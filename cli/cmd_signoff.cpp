// `kvgate signoff --format F | --all`: a thin front over the sign-off rules (reports/signoff,
// kvgate::signoff). It gathers the gates for F (gate_runner, tag [fmt:F]), the mutation proof for F's
// mutants (kvgate mutate --only ..., or an existing outcomes.json), the matrix (bytes, probes, timing)
// and the teacher-forced quality against the baseline, turns them into typed records, and lets the
// library decide: conformance, fit under the release policy, the roll-up and the exit code.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "cmd_bench.hpp"
#include "commands.hpp"
#include "gate_runner.hpp"
#include "kvgate/atomic_file.hpp"
#include "kvgate/matrix.hpp"
#include "kvgate/outcomes.hpp"
#include "kvgate/reports.hpp"
#include "kvgate/signoff.hpp"
#include "kvgate/signoff_coverage.hpp"
#include "kvgate/signoff_probes.hpp"
#include "kvgate/signoff_proof.hpp"

namespace kvgate::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
namespace so = kvgate::signoff;

struct SignoffOpts {
  std::vector<std::string> formats;
  bool all = false, quick = false, no_timing = false;
  std::string device = "cpu", out = "kvgate.out/signoff", mutants, gates_dir, model, probe_model, catalog, scratch;
  std::string policy, baseline, corpus, coverage;
  bool no_project_corpus = false;
  matrix::GridOverrides grid;  // --needle-lengths, --bench-lengths, ... (matrix::apply_grid)
  std::string cuda_weights = "f32";
  std::string mla_cache = "expanded";  // --mla-cache expanded|latent (MLA models)
  int quality_tokens = 0, decode_path_tokens = -1;
  bool no_sensitivity = false;
  bool mutate_full_matrix = false;  // kvgate mutate without --bail (every reached gate of every mutant)
  int threads = 1;
  int jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));  // kvgate mutate -j
};

fs::path self_exe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return fs::path("kvgate");
  // A binary replaced while it runs (rebuilt during a sign-off) reads "<path> (deleted)": the
  // program to start is the one now at <path>.
  const std::string s = p.string(), tag = " (deleted)";
  if (s.size() > tag.size() && s.compare(s.size() - tag.size(), tag.size(), tag) == 0) p = s.substr(0, s.size() - tag.size());
  return p;
}

json read_json_file(const fs::path& p) {
  std::ifstream f(p);
  if (!f) return nullptr;
  try {
    return json::parse(f);
  } catch (const std::exception&) {
    return nullptr;
  }
}

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string o;
  for (const auto& x : v) o += (o.empty() ? "" : sep) + x;
  return o;
}

// decode tok/s of `f` over the baseline's at the largest context both ran on `device` (resident).
std::optional<double> decode_speedup(const json& mj, const std::string& f, const std::string& base, const std::string& device) {
  std::map<int, double> fr, br;
  for (const auto& r : mj.value("rows", json::array())) {
    if (r.value("device", "") != device || r.value("window", 0) != 0 || r.value("status", "") != "ok") continue;
    if (!r["decode_tok_s"].is_number()) continue;
    if (r.value("format", "") == f) fr[r.value("context", 0)] = r["decode_tok_s"].get<double>();
    if (r.value("format", "") == base) br[r.value("context", 0)] = r["decode_tok_s"].get<double>();
  }
  for (auto it = fr.rbegin(); it != fr.rend(); ++it)
    if (br.count(it->first) && br[it->first] > 0) return it->second / br[it->first];
  return std::nullopt;
}

// One sign-off, as a list of steps (run_signoff below calls them in order). What one step
// hands to the next lives here, typed; JSON appears only in the records the last steps write.
struct SignoffRun {
  explicit SignoffRun(const SignoffOpts& opts) : o(opts) {}
  const SignoffOpts& o;
  std::string src = matrix::default_source_dir();
  std::vector<std::string> formats;  // canonical names, each once
  // inputs (read_inputs: every one checked before anything is written)
  so::Policy policy;
  std::string baseline;
  std::optional<Model> model;
  std::vector<std::vector<int>> corpus;
  std::vector<std::string> corpus_sources;
  std::optional<matrix::MatrixOptions> mo_base;
  std::optional<records::OutcomesRecord> outcomes;  // the mutation proof (--mutants, or kvgate mutate's)
  std::string mutation_source;
  so::CoverageSummary coverage = so::coverage_not_measured();  // --coverage (scripts/coverage.sh's folder)
  // per format: what conformance is decided from, and notes for the report
  std::map<std::string, so::ConformanceInput> C;
  std::map<std::string, std::vector<std::string>> notes;
  json prov;
  json gsum;                                               // gates.json
  std::map<std::string, std::set<std::string>> gate_ids;   // format -> gate IDs tagged with it
  fs::path catalog;
  json cat;
  std::map<std::string, std::vector<std::string>> mutants_of;  // format -> its catalog mutants
  std::set<std::string> all_ids;
  // A mutant that only a GPU gate can kill (requires: cuda-device) belongs to a --device cuda
  // sign-off: on a CPU sign-off its gates skip, so it proves nothing about the CPU path.
  std::map<std::string, int> gpu_only_left_out;
  std::map<std::string, int> cuda_build_left_out;  // requires: cuda, on a build without the CUDA backend
  // Formats the backend of --device would not hold as asked (resolve_kv on that backend): the engine
  // would run the fallback, so no probe, timing or quality of theirs is measured (format -> fallback).
  struct DeviceFallback {
    std::string effective, reason;
  };
  std::map<std::string, DeviceFallback> device_fallback;
  std::vector<std::string> measured;  // formats minus device_fallback, in order
  std::string device_missing;         // why --device cuda cannot run here (empty: it can)
  json mj = nullptr;                                       // matrix.json
  std::optional<so::QualityRun> qrun;
  std::string quality_missing;
  std::vector<so::DepthBucket> buckets = so::default_buckets();
  std::vector<so::FormatVerdict> verdicts;
  json vjs = json::array();
  std::vector<so::Overall> overall;
  int exit_code = 0;
  json rec;                                                // signoff.json
  matrix::StageClock stages;                               // elapsed time per stage, printed as each ends

  // --format / --all -> canonical format names; --device checked.
  void resolve_formats() {
    formats = o.formats;
    if (o.all)
      for (const auto& p : presets()) formats.emplace_back(p.name);
    {
      std::vector<std::string> uniq;
      for (const auto& f : formats) {
        const auto k = parse_kv_format(f);
        if (!k) throw std::invalid_argument("unknown format '" + f + "'; known: " + known_formats_text());
        const std::string n = k->name();
        if (std::find(uniq.begin(), uniq.end(), n) == uniq.end()) uniq.push_back(n);
      }
      formats = uniq;
    }
    if (formats.empty()) throw std::invalid_argument("give --format F (repeatable) or --all");
    if (o.device != "cpu" && o.device != "cuda") throw std::invalid_argument("--device must be cpu or cuda");
  }

  // Policy, baseline, model, corpus and --mutants: refused here, before anything is written.
  void read_inputs() {
    const std::string policy_path =
        o.policy.empty() ? (fs::path(src) / "reports" / "policy" / "default.json").string() : o.policy;
    policy = so::load_policy_file(policy_path);
    {  // the record names a policy inside the source tree by its repository path
      const std::string root = fs::weakly_canonical(src).string() + "/";
      const std::string abs = fs::weakly_canonical(policy_path).string();
      if (abs.rfind(root, 0) == 0) policy.path = abs.substr(root.size());
    }
    baseline = so::resolve_baseline(o.baseline, policy.baseline, o.device);
    const std::string model_path = o.model.empty() ? matrix::find_model("stories260K/stories260K.bin", src) : o.model;
    if (!model_path.empty()) model.emplace(load_model(model_path));
    if (o.mla_cache == "latent" && (!model || !model->config.mla.any()))
      throw std::invalid_argument("--mla-cache latent applies to multi-head latent attention models (DeepSeek-V2/V3: "
                                  "kv_lora_rank in config.json); the sign-off model (" +
                                  (model ? model->config.arch : std::string("none found")) + ") has none: drop the flag");
    if (o.mla_cache == "latent" && o.device == "cuda")
      throw std::invalid_argument("--mla-cache latent: a CUDA sign-off of the latent cache is not offered yet (the CUDA "
                                  "engine runs it, gated by MOD.cuda.hf.deepseek_v3*.latent, but the sign-off's probe "
                                  "sensitivity damages expanded K/V rows, which the latent cache does not have on the "
                                  "GPU, and its CUDA path has not been run over a latent model); sign the latent cache "
                                  "off with --device cpu, or drop the flag");
    if (model) {
      mo_base = bench_options_from(*model, o.quick, src);
      mo_base->mla_cache = o.mla_cache;
      if (!mo_base->corpus_path.empty() && !o.no_project_corpus) {
        const auto c = matrix::load_corpus(mo_base->corpus_path);
        for (const auto& s : c.sequences) corpus.push_back(s);
        corpus_sources.push_back(fs::path(mo_base->corpus_path).filename().string() + " (project corpus, " +
                                 std::to_string(c.sequences.size()) + " sequences)");
      }
      if (!o.corpus.empty()) {
        const auto extra = so::load_corpus_file(o.corpus, *model, std::max(2, model->config.max_seq_len));
        corpus.insert(corpus.end(), extra.begin(), extra.end());
        corpus_sources.push_back(o.corpus + " (--corpus, " + std::to_string(extra.size()) + " sequences)");
      }
    } else if (!o.corpus.empty()) {
      throw std::invalid_argument("--corpus " + o.corpus + ": no model to check it against (stories260K not found; set KVGATE_MODELS or --model)");
    }

    resolve_on_device();

    // --mutants: the mutation proof, as its typed record (checked on read)
    if (!o.mutants.empty()) {
      fs::path p(o.mutants);
      if (fs::is_directory(p)) p /= "outcomes.json";
      outcomes = records::read_outcomes(p);
      mutation_source = "read from " + p.string();
    }
    // --coverage: the gate suite's coverage of the shipped code (checked on read)
    if (!o.coverage.empty()) coverage = so::load_coverage(o.coverage);
  }

  // Each format as the backend of --device holds it for the model. A format without kernels there
  // (e.g. the MX / NVFP4 formats on cuda) falls back; measuring it would measure the fallback under its
  // name. A baseline that falls back is refused: every format is judged against it.
  void resolve_on_device() {
    measured = formats;
    if (!model) return;
    auto fallback_of = [&](const std::string& f) -> std::optional<DeviceFallback> {
      try {
        const ResolvedKv r =
            matrix::resolve_on_device(model->config, *parse_kv_format(f), 16, o.device, o.mla_cache == "latent");
        if (r.fell_back()) return DeviceFallback{r.effective.name(), r.fallback_reason};
      } catch (const std::runtime_error&) {
        // --device cuda in a build without the CUDA backend: NOT-VALIDATED (record_provenance)
      }
      return std::nullopt;
    };
    if (const auto b = fallback_of(baseline))
      throw std::invalid_argument("--baseline " + baseline + ": on device " + o.device + " this model's KV would fall back to " +
                                  b->effective + " (" + b->reason + "); choose a baseline the device holds (--baseline f16|bf16|f32)");
    measured.clear();
    for (const auto& f : formats) {
      if (const auto b = fallback_of(f)) device_fallback[f] = *b;
      else measured.push_back(f);
    }
  }

  // Provenance; without a CUDA device a --device cuda sign-off is NOT-VALIDATED.
  void record_provenance() {
    for (const auto& f : formats) C[f] = {};

    matrix::ProvenanceOptions po;
    po.model = model ? &*model : nullptr;
    po.threads = o.threads;
    po.seed = 1;
    po.source_dir = src;
    prov = matrix::provenance(po);
    if (o.mla_cache == "latent") {
      // The latent cache changes what every format means here: the record and each format say so.
      prov["mla_cache"] = o.mla_cache;
      for (const auto& f : formats)
        notes[f].push_back("MLA latent cache (--mla-cache latent): " + f +
                           " holds the latent c_kv and the shared RoPE key of each token, not per-head K/V");
    }
    const bool cuda_present = prov.value("cuda_build", false) && !prov.value("gpus", json::array()).empty();
    if (o.device == "cuda" && !cuda_present)
      device_missing = std::string("no CUDA device") + (prov.value("cuda_build", false) ? "" : " (this build has no CUDA backend)");
    if (o.device == "cuda" && !cuda_present)
      for (auto& [f, c] : C)
        c.not_validated.push_back(std::string("no CUDA device") + (prov.value("cuda_build", false) ? "" : " (and this build has no CUDA backend)") +
                                  ": the CUDA gates and matrix columns did not run");
  }

  // 1. Gates (one run; results attributed by their [fmt:] tags) -> gates.json.
  void run_gate_step() {
    std::fprintf(stderr, "signoff: gates\n");
    gates::GateRunOptions gopt;
    gopt.gates_dir = o.gates_dir.empty() ? (self_exe().parent_path() / "gates").string() : o.gates_dir;
    {  // only gates tagged with a format being signed off (Catch: a comma is OR)
      std::string filter;
      for (const auto& f : formats) filter += (filter.empty() ? "" : ",") + std::string("[fmt:") + f + "]";
      gopt.tag_filter = filter;
    }
    std::vector<gates::GateResult> results;
    std::string gate_error;
    try {
      results = gates::run_gates(gopt, true);
    } catch (const std::exception& e) {
      gate_error = e.what();
    }
    gsum = gates::summarize(results);
    write_file_atomic((fs::path(o.out) / "gates.json").string(), gsum.dump(2) + "\n");
    for (const auto& r : results) {
      for (auto& [f, c] : C) {
        const bool tagged = std::find(r.formats.begin(), r.formats.end(), f) != r.formats.end();
        // A gate program that crashed outside any test case hides its gates: it counts for every format.
        const bool untagged_fail = r.formats.empty() && r.status == "failed" && r.name.ends_with("(process)");
        if (!tagged && !untagged_fail) continue;
        if (tagged) gate_ids[f].insert(r.id);
        if (r.status == "passed") ++c.gates.passed;
        if (r.status == "failed") ++c.gates.failed, c.gates.failing.push_back(r.id);
        if (r.status == "skipped") ++c.gates.skipped, c.gates.skipped_ids.push_back(r.id);
      }
    }
    for (auto& [f, c] : C) {
      c.gate_error = gate_error;
      if (c.gates.skipped > 0) notes[f].push_back(std::to_string(c.gates.skipped) + " gates skipped (e.g. [cuda] without a device)");
    }
  }

  // 2a. The catalog's mutants whose expected killers are gates of each format.
  void select_mutants() {
    catalog = o.catalog.empty() ? fs::path(src) / "mutations" / "catalog.json" : fs::path(o.catalog);
    cat = read_json_file(catalog);
    // The plan (kvgate/signoff_proof.hpp, gated by SGN.proof.*): the mutants whose expected killers
    // are gates of each format; GPU-only mutants on a CPU sign-off and CUDA-build mutants on a build
    // without the CUDA backend are left out with a note instead of leaving the format NOT-VALIDATED.
    std::map<std::string, std::set<std::string>> ids_of;
    for (const auto& [f, c] : C) ids_of[f] = gate_ids[f];
    so::ProofSelection sel = so::select_proof_mutants(cat, ids_of, o.device, prov.value("cuda_build", false));
    mutants_of = std::move(sel.mutants_of);
    all_ids = std::move(sel.all_ids);
    gpu_only_left_out = std::move(sel.gpu_only_left_out);
    cuda_build_left_out = std::move(sel.cuda_build_left_out);
  }

  // 2b. The proof: read (--mutants), or run by kvgate mutate --only, then per format.
  void mutation_proof() {
    // The proof as its typed record (kvgate/outcomes.hpp): a --mutants file that is corrupt, of another
    // format_version or breaks mutations/schema/outcomes.schema.json is refused (exit 1) naming the
    // file and the field; JSON appears again only when the report is written.
    if (outcomes) {
      // read with the other inputs, before anything was written
    } else if (!o.quick && !all_ids.empty()) {
      const fs::path mdir = fs::path(o.out) / "mutants";
      // --bail (default): each mutant stops at its first kill. The verdict needs only killed or not;
      // the full kill matrix (--mutate-full-matrix) runs every reached gate of every mutant.
      const std::string cmd = so::proof_mutate_command(
          {self_exe().string(), mdir.string(), o.jobs, o.scratch, o.mutate_full_matrix, prov.value("cuda_build", false)},
          all_ids);
      std::fprintf(stderr, "signoff: mutation proof: %s\n", cmd.c_str());
      const int rc = std::system(cmd.c_str());
      const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
      mutation_source = "kvgate mutate --only (" + std::to_string(all_ids.size()) + " mutants), exit " + std::to_string(code);
      try {
        outcomes = records::read_outcomes(mdir / "outcomes.json");
      } catch (const records::RecordError& e) {
        mutation_source += "; " + std::string(e.what());
      }
    } else {
      mutation_source = o.quick ? "not run (--quick)" : "no mutant in the catalog";
    }
    std::map<std::string, std::string> mstatus;
    std::map<std::string, std::vector<std::string>> expect_miss;  // mutant -> expected killers that stayed green
    bool baseline_ok = true;
    std::string baseline_msg;
    if (outcomes) {
      for (const auto& m : outcomes->mutants) {
        mstatus[m.id] = m.status;
        if (!m.expected_not_killing.empty()) expect_miss[m.id] = m.expected_not_killing;
      }
      if (!outcomes->baseline.green) {
        baseline_ok = false;
        baseline_msg = "mutation baseline not green";
      }
      if (!outcomes->canary_survivors.empty()) {
        baseline_ok = false;
        baseline_msg = "the canary left gates green";
      }
    }
    for (auto& [f, c] : C) {
      auto& mo = c.mutation;
      mo.mutants = mutants_of[f];
      if (gpu_only_left_out[f] > 0)
        notes[f].push_back(std::to_string(gpu_only_left_out[f]) +
                           " GPU mutant(s) (requires: cuda-device) are not part of a CPU sign-off; --device cuda runs them");
      if (cuda_build_left_out[f] > 0)
        notes[f].push_back(std::to_string(cuda_build_left_out[f]) +
                           " mutant(s) of code only a CUDA build compiles (requires: cuda) are left out: this kvgate has no "
                           "CUDA backend (a -DKVGATE_CUDA=ON build runs them)");
      if (mo.mutants.empty()) {
        mo.status = "none";
        mo.not_run_reason = cat.is_object() ? "no catalog mutant targets a gate of " + f : "mutation catalog not found at " + catalog.string();
        continue;
      }
      if (!outcomes) {
        mo.status = "not_run";
        mo.not_run = mo.mutants;
        mo.not_run_reason = o.quick && o.mutants.empty() ? "mutation proof not run (--quick)" : "mutation proof: " + mutation_source;
        continue;
      }
      mo.status = o.mutants.empty() ? "run" : "read";
      mo.baseline_green = baseline_ok;
      mo.baseline_message = baseline_msg;
      for (const auto& id : mo.mutants) {
        const auto it = mstatus.find(id);
        const std::string st = it == mstatus.end() ? "" : it->second;
        if (expect_miss.count(id))
          notes[f].push_back("catalog expectation: " + id + " was not killed by " + join(expect_miss[id]) + " (killed by other gates)");
        if (st == "killed") mo.killed.push_back(id);
        else if (st == "survived") mo.survived.push_back(id);
        else if (st.empty()) mo.missing.push_back(id);
        else mo.undecided.push_back(id + " (" + st + ")");
      }
    }
  }

  // 3. Matrix (bytes, probes, timing) with the baseline among its formats, and the quality of every
  //    format against the baseline, teacher-forced on the decode path, bucketed by depth.
  void matrix_and_quality() {
    if (!model) {
      quality_missing = "quality not measured: stories260K not found (set KVGATE_MODELS or --model)";
      for (auto& [f, c] : C) c.not_validated.push_back("matrix not run: stories260K not found (set KVGATE_MODELS or --model)");
    } else if (!device_missing.empty()) {
      quality_missing = "quality not measured: " + device_missing + "; run on a machine with a GPU, or --device cpu";
      std::fprintf(stderr, "signoff: matrix and quality not run: %s\n", device_missing.c_str());
    } else {
      matrix::MatrixOptions mo = *mo_base;
      std::optional<Model> probe_subject;
      load_probe_subject(o.probe_model, src, o.quick, mo, probe_subject);
      if (probe_subject && !o.quick) {
        // The sign-off grid: every length class up to 8K at five depths, one seed (the full 165-case
        // grid of `kvgate probe` / `kvgate bench` takes ~10x longer per format on two cores).
        auto& nd = mo.probe_specs["needle"];
        std::vector<int> lengths;
        for (int L : nd.lengths)
          if (L == 512 || L == 2048 || L == nd.lengths.back()) lengths.push_back(L);
        nd.lengths = lengths;
        nd.depths = {0.0, 0.25, 0.5, 0.75, 1.0};
        nd.seeds = {1};
        auto& ec = mo.probe_specs["echo"];
        if (ec.seeds.size() > 50) ec.seeds.resize(50);
      }
      mo.formats = measured;
      if (std::find(mo.formats.begin(), mo.formats.end(), baseline) == mo.formats.end()) mo.formats.push_back(baseline);
      mo.threads = o.threads;
      mo.timing = !o.no_timing;
      matrix::set_device(mo, o.device, o.cuda_weights);  // cuda: probes and timing rows on the CUDA engine
      if (!o.no_sensitivity) {
        mo.sensitivity_baseline = baseline;
        mo.sensitivity = matrix::sensitivity_options_for(measured);
      }
      matrix::apply_grid(mo, o.grid);
      mo.cache_dir = (fs::path(o.out) / ".kvcache").string();
      mj = matrix::run_matrix(*model, mo, prov, progress_printer("signoff matrix "));
      progress_done();
      std::error_code ec;
      fs::remove_all(mo.cache_dir, ec);
      matrix::write_matrix(mj, o.out);
      stages.done("matrix (probes, sensitivity, timing)");
      if (corpus.empty()) {
        quality_missing = "quality not measured: no corpus fits the model's vocabulary (give --corpus FILE)";
      } else {
        const so::QualityOptions qo =
            matrix::quality_options_for(*model, o.device, corpus, o.quality_tokens, o.decode_path_tokens);
        qrun = so::measure_quality(
            so::device_engine_factory(*model, o.device, o.threads, qo.prefill_chunk, qo.max_tokens, o.cuda_weights,
                                      o.mla_cache == "latent"),
            measured,
            baseline, corpus, buckets, qo, progress_printer("signoff "));
        progress_done();
      }
      stages.done("quality (" + o.device + " engine)");
    }
  }

  // 4. Verdicts: the library decides (kvgate::signoff::decide); the exit code from the worst.
  void decide_verdicts() {
    auto fentry = [&](const std::string& f) -> const json* {
      if (!mj.is_object()) return nullptr;
      for (const auto& fe : mj["formats"])
        if (fe.value("format", "") == f) return &fe;
      return nullptr;
    };
    for (const auto& f : formats) {
      so::ConformanceInput& c = C[f];
      so::FitInput fi;
      fi.format = f;
      fi.device = o.device;
      fi.not_measured_reason = quality_missing;
      json s = json::object();
      if (const auto fb = device_fallback.find(f); fb != device_fallback.end()) {
        c.fallback_reason = "on " + o.device + ": " + fb->second.reason;
        c.fallback_effective = fb->second.effective;
        fi.not_measured_reason = fi.unmeasured_reason = "not measured: on " + o.device + " the engine holds " + fb->second.effective + " for " + f +
                                 " (" + fb->second.reason + "), so its probes, timing and quality would be " +
                                 fb->second.effective + "'s";
        s["effective"] = fb->second.effective;
        s["fallback_reason"] = c.fallback_reason;
      } else if (const json* fe = fentry(f)) {
        if (!fe->value("fallback_reason", "").empty()) {
          c.fallback_reason = fe->value("fallback_reason", "");
          c.fallback_effective = fe->value("effective", "");
        }
        fi.probe_regressions = so::probe_regressions(fentry(baseline) ? *fentry(baseline) : json(nullptr), *fe);
        const json* be = fentry(baseline);
        if (be && (*be)["kv_bytes_per_token"].is_number() && (*be)["kv_bytes_per_token"].get<double>() > 0)
          fi.kv_saving = 1.0 - (*fe)["kv_bytes_per_token"].get<double>() / (*be)["kv_bytes_per_token"].get<double>();
        fi.decode_speedup = decode_speedup(mj, f, baseline, o.device);
        s["effective"] = fe->value("effective", "");
        s["kv_bytes_per_token"] = (*fe)["kv_bytes_per_token"];
        s["kv_saving_vs_baseline"] = fi.kv_saving ? json(*fi.kv_saving) : json(nullptr);
        s["probe_regressions"] = fi.probe_regressions ? json(*fi.probe_regressions) : json(nullptr);
        s["decode_vs_baseline"] = fi.decode_speedup ? json(*fi.decode_speedup) : json(nullptr);
        if (o.device == "cpu") s["cpu_decode_vs_baseline"] = s["decode_vs_baseline"];
        const json probes = fe->value("probes", json::object());
        for (const auto& [pn, p] : probes.items()) {
          s[pn + "_exact"] = p["exact"];
          s[pn + "_same_as_f32"] = p["same_as_f32"];
        }
        std::string cuda_why;
        bool cuda_ran = false;
        for (const auto& r : mj["rows"])
          if (r.value("format", "") == f && r.value("device", "") == "cuda") {
            if (r.value("status", "") == "ok") cuda_ran = true;
            else if (cuda_why.empty()) cuda_why = r.value("reason", "");
          }
        if (o.device == "cuda" && !cuda_ran) notes[f].push_back("no CUDA timing row ran" + (cuda_why.empty() ? std::string() : ": " + cuda_why));
      }
      if (qrun && qrun->by_format.count(f)) {
        fi.quality = qrun->by_format.at(f);
        fi.noise = qrun->noise;
      }
      so::FormatVerdict v = so::decide(f, c, policy, fi);
      v.notes = notes[f];
      overall.push_back(v.overall);
      kvgate::records::FormatVerdictRecord vr = so::to_record(v);
      vr.gates = so::to_record(c.gates);
      vr.mutation = so::to_record(c.mutation);
      vr.matrix = s;
      vr.quality = fi.quality ? so::to_json(*fi.quality) : json(nullptr);
      vjs.push_back(kvgate::records::to_json(vr));
      verdicts.push_back(std::move(v));
    }
    exit_code = so::exit_code(overall);
  }

  // 5. signoff.json, then index.md and report.html from the records.
  void write_records() {
    rec["schema"] = "kvgate.signoff/2";
    rec["kind"] = "signoff";
    rec["device"] = o.device;
    rec["quick"] = o.quick;
    rec["provenance"] = prov;
    rec["mutation_source"] = mutation_source;
    rec["baseline"] = baseline;
    rec["policy"] = so::to_json(policy);
    rec["noise_floor"] = qrun ? so::to_json(qrun->noise) : json(nullptr);
    json bnames = json::array();
    for (const auto& b : buckets) bnames.push_back(b.name);
    rec["quality_method"] = {
        {"path", matrix::quality_path_text(o.device, matrix::signoff_prefill_chunk(o.device))},
        {"device", o.device},
        {"decode_path_positions", qrun ? json(qrun->decode_path_positions) : json(0)},
        {"corpus", corpus_sources},
        {"sequences", qrun ? json(qrun->sequences) : json(0)},
        {"positions", qrun ? json(qrun->positions) : json(0)},
        {"buckets", bnames},
        {"missing", quality_missing}};
    rec["verdicts"] = vjs;
    rec["probe_sensitivity"] = mj.is_object() && mj.contains("probe_sensitivity") ? mj["probe_sensitivity"] : json(nullptr);
    rec["coverage"] = so::to_json(coverage);
    if (coverage.measured && !coverage.commit.empty() && prov.is_object() && prov.value("git_commit", json()).is_string() &&
        coverage.commit.rfind(prov["git_commit"].get<std::string>(), 0) != 0)
      rec["coverage"]["note"] = coverage.note + "; measured on commit " + coverage.commit + ", not on this sign-off's commit " +
                                prov["git_commit"].get<std::string>();
    rec["stages"] = stages.to_json();
    rec["exit_code"] = exit_code;
    rec["exit_codes"] = so::exit_codes_help();
    rec["files"] = {{"signoff", "signoff.json"}, {"gates", "gates.json"}, {"index", "index.md"}, {"html", "report.html"}};
    if (!mj.is_null()) rec["files"]["matrix"] = "matrix.json";
    write_file_atomic((fs::path(o.out) / "signoff.json").string(), rec.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
    reports::ReportInputs in;
    in.matrix = mj;
    in.gates = gsum;
    in.mutants = outcomes ? records::to_json(*outcomes) : json(nullptr);
    in.signoff = rec;
    in.title = "kvgate sign-off (" + o.device + (o.quick ? ", quick" : "") + ")";
    std::string warning;
    reports::write_report(in, o.out, reports::default_web_dir(), &warning);
    if (!warning.empty()) std::fprintf(stderr, "signoff: %s\n", warning.c_str());
  }

  // The verdict table on stdout.
  void print_summary() const {
    std::printf("\nbaseline %s, policy %s\n", baseline.c_str(), policy.path.c_str());
    std::printf("%-16s %-16s %-16s %-12s %s\n", "format", "verdict", "conformance", "fit", "deciding policy line");
    for (const auto& v : verdicts)
      std::printf("%-16s %-16s %-16s %-12s %s\n", v.format.c_str(), so::to_string(v.overall).c_str(),
                  so::to_string(v.conformance.verdict).c_str(), so::to_string(v.fit.verdict).c_str(), so::deciding_line(v).c_str());
    std::printf("\nreport: %s/index.md, %s/report.html (signoff.json, gates.json, matrix.json); exit %d\n", o.out.c_str(), o.out.c_str(),
                exit_code);
  }
};

int run_signoff(const SignoffOpts& o) {
  SignoffRun s(o);
  s.resolve_formats();
  s.read_inputs();
  fs::create_directories(o.out);
  s.record_provenance();
  s.stages.done("inputs (model load, corpus, provenance)");
  s.run_gate_step();
  s.stages.done("gates");
  s.select_mutants();
  s.mutation_proof();
  s.stages.done("mutation proof");
  s.matrix_and_quality();
  s.decide_verdicts();
  s.write_records();
  s.print_summary();
  return s.exit_code;
}

}  // namespace

void register_signoff(CLI::App& app) {
  auto o = std::make_shared<SignoffOpts>();
  auto* sub = app.add_subcommand(
      "signoff",
      "Two verdicts per format -- conformance (gates + mutation proof) and fit (quality against the baseline under a "
      "release policy) -- rolled up to PASS only when both hold");
  sub->footer(kvgate::signoff::exit_codes_help());
  sub->add_option("--format", o->formats, "format to sign off (repeatable)");
  sub->add_flag("--all", o->all, "every preset");
  sub->add_option("--device", o->device, "cpu | cuda")->capture_default_str();
  sub->add_option("--out", o->out, "report folder")->capture_default_str();
  sub->add_flag("--quick", o->quick, "quick matrix; without --mutants the mutation proof is skipped (verdict NOT-VALIDATED)");
  sub->add_option("--mutants", o->mutants, "read the mutation proof from this outcomes.json (or its folder) instead of running kvgate mutate");
  sub->add_option("--gates-dir", o->gates_dir, "folder with the gate_* programs (default <kvgate dir>/gates)");
  sub->add_option("--mutate-scratch", o->scratch, "scratch tree for kvgate mutate (default: mutate's own)");
  sub->add_flag("--mutate-full-matrix", o->mutate_full_matrix,
                "run every reached gate of every mutant (the full kill matrix) instead of stopping each mutant at its first "
                "kill (kvgate mutate --bail, the default: the verdict needs only killed or not)");
  sub->add_option("--catalog", o->catalog, "mutant catalog (default mutations/catalog.json)");
  sub->add_option("--model", o->model, "matrix model (default stories260K)");
  sub->add_option("--probe-model", o->probe_model,
                  "subject of the needle/counting/echo probes (default: datasets/models/probe; 'none' = --model)");
  sub->add_option("--threads", o->threads, "CPU threads for the matrix")->capture_default_str();
  sub->add_option("--jobs,-j", o->jobs, "parallel jobs for kvgate mutate")->capture_default_str();
  sub->add_flag("--no-timing", o->no_timing, "matrix without timing (reads no clock; for tests)");
  sub->add_option("--policy", o->policy, "release policy JSON (default reports/policy/default.json; schema reports/schema/policy.schema.json)");
  sub->add_option("--coverage", o->coverage,
                  "the folder scripts/coverage.sh wrote (or its coverage.json): the gate suite's line and branch coverage "
                  "of the shipped code goes into the report, with the runtime/ bar (>= 95% of lines)");
  sub->add_option("--baseline", o->baseline,
                  "baseline KV the formats are judged against: f16 | bf16 | f32 (default: the policy's, else f16 on cpu, bf16 on cuda)");
  sub->add_option("--corpus", o->corpus,
                  "extra quality corpus: a text file (the model's tokenizer), a token-id file (ids separated by spaces/commas; a "
                  "blank line starts a sequence) or a corpus JSON");
  sub->add_flag("--no-project-corpus", o->no_project_corpus, "judge quality on --corpus only (not the project's corpus)");
  sub->add_option("--cuda-weights", o->cuda_weights, "--device cuda: weights on the GPU, f32 | bf16")->capture_default_str();
  sub->add_option("--mla-cache", o->mla_cache,
                  "MLA models (DeepSeek-V2/V3): expanded (per-head K/V rows) or latent (the latent and the RoPE key, "
                  "each half in the format signed off: matrix, probes and quality all on that cache)")
      ->check(CLI::IsMember({"expanded", "latent"}))
      ->capture_default_str();
  sub->add_option("--quality-tokens", o->quality_tokens, "cut every quality sequence to N tokens (0: the model's context)");
  sub->add_option("--decode-path-tokens", o->decode_path_tokens,
                  "the decode-path noise run covers the first N tokens of each sequence (default: all on cpu, 2048 on cuda)");
  sub->add_flag("--no-sensitivity", o->no_sensitivity, "skip the probes' sensitivity to injected KV damage");
  // The grids of the matrix (defaults: the model's, matrix::default_matrix_options).
  sub->add_option("--needle-lengths", o->grid.needle_lengths, "needle context lengths, e.g. 512,2048,8192,32768");
  sub->add_option("--needle-depths", o->grid.needle_depths, "needle depths in [0, 1], e.g. 0,0.5,1");
  sub->add_option("--counting-n", o->grid.counting_n, "counting lengths N, e.g. 10,30");
  sub->add_option("--echo-seeds", o->grid.echo_seeds, "echo seeds, e.g. 1..10");
  sub->add_option("--bench-lengths", o->grid.bench_lengths, "context lengths of the timing rows, e.g. 4096,32768");
  sub->add_option("--repeats", o->grid.repeats, "timing repeats per row (median)");
  on_run(sub, [o] { return run_signoff(*o); });
}

}  // namespace kvgate::cli
