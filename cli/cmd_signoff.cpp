// `kvgate signoff --format F | --all`: gates for F (gate_runner, tag [fmt:F]), the mutation proof for
// F's mutants (kvgate mutate --only ..., or an existing outcomes.json), the matrix against f32 ->
// a verdict per format (PASS / FAIL / NOT-VALIDATED with reasons), the report folder, exit 1 on FAIL.
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
#include "kvgate/reports.hpp"

namespace kvgate::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct SignoffOpts {
  std::vector<std::string> formats;
  bool all = false, quick = false, no_timing = false;
  std::string device = "cpu", out = "kvgate.out/signoff", mutants, gates_dir, model, probe_model, catalog, scratch;
  int threads = 1;
  int jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));  // kvgate mutate -j
};

fs::path self_exe() {
  std::error_code ec;
  const auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path("kvgate") : p;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
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

struct Verdict {
  std::string format;
  std::vector<std::string> fail, not_validated, notes;
  json gates = {{"passed", 0}, {"failed", 0}, {"skipped", 0}, {"failing", json::array()}, {"skipped_ids", json::array()}};
  json mutation = {{"status", "none"}, {"mutants", json::array()}, {"killed", json::array()}, {"survived", json::array()}, {"not_run", json::array()}};
  json matrix = json::object();
  std::string verdict() const { return !fail.empty() ? "FAIL" : !not_validated.empty() ? "NOT-VALIDATED" : "PASS"; }
};

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string o;
  for (const auto& x : v) o += (o.empty() ? "" : sep) + x;
  return o;
}

int run_signoff(const SignoffOpts& o) {
  const std::string src = matrix::default_source_dir();
  std::vector<std::string> formats = o.formats;
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
  fs::create_directories(o.out);
  std::map<std::string, Verdict> V;
  for (const auto& f : formats) V[f].format = f;

  // Model and provenance.
  const std::string model_path = o.model.empty() ? matrix::find_model("stories260K/stories260K.bin", src) : o.model;
  std::optional<Model> model;
  if (!model_path.empty()) model.emplace(load_model(model_path));
  matrix::ProvenanceOptions po;
  po.model = model ? &*model : nullptr;
  po.threads = o.threads;
  po.seed = 1;
  po.source_dir = src;
  const json prov = matrix::provenance(po);
  const bool cuda_present = prov.value("cuda_build", false) && !prov.value("gpus", json::array()).empty();
  if (o.device == "cuda" && !cuda_present)
    for (auto& [f, v] : V)
      v.not_validated.push_back(std::string("no CUDA device") + (prov.value("cuda_build", false) ? "" : " (and this build has no CUDA backend)") +
                                ": the CUDA gates and matrix columns did not run");

  // 1. Gates (one run; results attributed by their [fmt:] tags).
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
  const json gsum = gates::summarize(results);
  write_file_atomic((fs::path(o.out) / "gates.json").string(), gsum.dump(2) + "\n");
  std::map<std::string, std::set<std::string>> gate_ids;  // format -> gate IDs tagged with it
  for (const auto& r : results) {
    for (auto& [f, v] : V) {
      const bool tagged = std::find(r.formats.begin(), r.formats.end(), f) != r.formats.end();
      // A gate program that crashed outside any test case hides its gates: it counts for every format.
      const bool untagged_fail = r.formats.empty() && r.status == "failed" && r.name.ends_with("(process)");
      if (!tagged && !untagged_fail) continue;
      if (tagged) gate_ids[f].insert(r.id);
      v.gates[r.status] = v.gates[r.status].get<int>() + 1;
      if (r.status == "failed") v.gates["failing"].push_back(r.id);
      if (r.status == "skipped") v.gates["skipped_ids"].push_back(r.id);
    }
  }
  for (auto& [f, v] : V) {
    if (!gate_error.empty()) v.not_validated.push_back("gates not run: " + gate_error);
    const int failed = v.gates["failed"].get<int>(), passed = v.gates["passed"].get<int>(), skipped = v.gates["skipped"].get<int>();
    if (failed > 0) {
      std::vector<std::string> ids;
      for (const auto& x : v.gates["failing"]) ids.push_back(x.get<std::string>());
      v.fail.push_back("failing gates: " + join(ids));
    }
    if (gate_error.empty() && passed + failed == 0) v.not_validated.push_back("no gate tagged [fmt:" + f + "] ran");
    if (skipped > 0) v.notes.push_back(std::to_string(skipped) + " gates skipped (e.g. [cuda] without a device)");
  }

  // 2. Mutation proof: the catalog's mutants whose expected killers are gates of F.
  const fs::path catalog = o.catalog.empty() ? fs::path(src) / "mutations" / "catalog.json" : fs::path(o.catalog);
  const json cat = read_json_file(catalog);
  std::map<std::string, std::vector<std::string>> mutants_of;
  std::set<std::string> all_ids;
  // A mutant that only a GPU gate can kill (requires: cuda-device) belongs to a --device cuda
  // sign-off: on a CPU sign-off its gates skip, so it proves nothing about the CPU path.
  std::map<std::string, int> gpu_only_left_out;
  if (cat.is_object())
    for (const auto& m : cat.value("mutants", json::array())) {
      if (m.value("category", "") == "canary") continue;
      bool needs_device = false;
      for (const auto& r : m.value("requires", json::array())) needs_device = needs_device || r == "cuda-device";
      if (needs_device && o.device != "cuda") {
        for (auto& [f, v] : V)
          for (const auto& g : m.value("expect_killed_by", json::array()))
            if (gate_ids[f].count(g.get<std::string>())) {
              ++gpu_only_left_out[f];
              break;
            }
        continue;
      }
      for (auto& [f, v] : V) {
        bool mine = false;
        for (const auto& g : m.value("expect_killed_by", json::array())) mine = mine || gate_ids[f].count(g.get<std::string>());
        if (mine) {
          mutants_of[f].push_back(m.value("id", ""));
          all_ids.insert(m.value("id", ""));
        }
      }
    }
  json outcomes = nullptr;
  std::string mutation_source;
  if (!o.mutants.empty()) {
    fs::path p(o.mutants);
    if (fs::is_directory(p)) p /= "outcomes.json";
    outcomes = read_json_file(p);
    mutation_source = "read from " + p.string();
    if (outcomes.is_null()) mutation_source = "could not read " + p.string();
  } else if (!o.quick && !all_ids.empty()) {
    const fs::path mdir = fs::path(o.out) / "mutants";
    std::string ids;
    for (const auto& id : all_ids) ids += (ids.empty() ? "" : ",") + id;
    const std::string cmd = quote(self_exe().string()) + " mutate --only " + quote(ids) + " --out " + quote(mdir.string()) +
                            " -j " + std::to_string(std::max(1, o.jobs)) + (o.scratch.empty() ? "" : " --scratch " + quote(o.scratch));
    std::fprintf(stderr, "signoff: mutation proof: %s\n", cmd.c_str());
    const int rc = std::system(cmd.c_str());
    const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
    outcomes = read_json_file(mdir / "outcomes.json");
    mutation_source = "kvgate mutate --only (" + std::to_string(all_ids.size()) + " mutants), exit " + std::to_string(code);
  } else {
    mutation_source = o.quick ? "not run (--quick)" : "no mutant in the catalog";
  }
  std::map<std::string, std::string> mstatus;
  std::map<std::string, std::vector<std::string>> expect_miss;  // mutant -> expected killers that stayed green
  bool baseline_ok = true;
  std::string baseline_msg;
  if (outcomes.is_object()) {
    for (const auto& m : outcomes.value("mutants", json::array())) {
      mstatus[m.value("id", "")] = m.value("status", "");
      for (const auto& g : m.value("expected_not_killing", json::array())) expect_miss[m.value("id", "")].push_back(g.get<std::string>());
    }
    if (outcomes.contains("baseline") && outcomes["baseline"].is_object() && !outcomes["baseline"].value("green", true)) {
      baseline_ok = false;
      baseline_msg = "mutation baseline not green";
    }
    if (!outcomes.value("canary_survivors", json::array()).empty()) {
      baseline_ok = false;
      baseline_msg = "the canary left gates green";
    }
  }
  for (auto& [f, v] : V) {
    const auto& ids = mutants_of[f];
    for (const auto& id : ids) v.mutation["mutants"].push_back(id);
    if (gpu_only_left_out[f] > 0)
      v.notes.push_back(std::to_string(gpu_only_left_out[f]) +
                        " GPU mutant(s) (requires: cuda-device) are not part of a CPU sign-off; --device cuda runs them");
    if (ids.empty()) {
      v.mutation["status"] = "none";
      v.not_validated.push_back(cat.is_object() ? "no catalog mutant targets a gate of " + f : "mutation catalog not found at " + catalog.string());
      continue;
    }
    if (outcomes.is_null()) {
      v.mutation["status"] = "not_run";
      for (const auto& id : ids) v.mutation["not_run"].push_back(id);
      v.not_validated.push_back(o.quick && o.mutants.empty() ? "mutation proof not run" : "mutation proof: " + mutation_source);
      continue;
    }
    v.mutation["status"] = o.mutants.empty() ? "run" : "read";
    std::vector<std::string> survived, other, missing;
    for (const auto& id : ids) {
      const auto it = mstatus.find(id);
      const std::string st = it == mstatus.end() ? "" : it->second;
      if (expect_miss.count(id))
        v.notes.push_back("catalog expectation: " + id + " was not killed by " + join(expect_miss[id]) + " (killed by other gates)");
      if (st == "killed") v.mutation["killed"].push_back(id);
      else if (st == "survived") v.mutation["survived"].push_back(id), survived.push_back(id);
      else if (st.empty()) v.mutation["not_run"].push_back(id), missing.push_back(id);
      else v.mutation["not_run"].push_back(id), other.push_back(id + " (" + st + ")");
    }
    if (!survived.empty()) v.fail.push_back("survived mutants: " + join(survived));
    if (!missing.empty()) v.not_validated.push_back("mutants not in the outcomes: " + join(missing));
    if (!other.empty()) v.not_validated.push_back("mutants not decided: " + join(other));
    if (!baseline_ok) v.not_validated.push_back(baseline_msg);
  }

  // 3. Matrix against f32 (CPU rows; CUDA columns are reported not_run).
  json mj = nullptr;
  if (!model) {
    for (auto& [f, v] : V) v.not_validated.push_back("matrix not run: stories260K not found (set KVGATE_MODELS or --model)");
  } else {
    matrix::MatrixOptions mo = bench_options_from(*model, o.quick, src);
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
    mo.formats = formats;
    mo.threads = o.threads;
    mo.timing = !o.no_timing;
    mo.devices = {"cpu"};
    if (o.device == "cuda") mo.devices.push_back("cuda");
    mo.cache_dir = (fs::path(o.out) / ".kvcache").string();
    mj = matrix::run_matrix(*model, mo, prov, progress_printer("signoff matrix "));
    progress_done();
    std::error_code ec;
    fs::remove_all(mo.cache_dir, ec);
    matrix::write_matrix(mj, o.out);
    for (auto& [f, v] : V) {
      for (const auto& fe : mj["formats"]) {
        if (fe.value("format", "") != f) continue;
        json s;
        s["effective"] = fe["effective"];
        s["kv_bytes_per_token"] = fe["kv_bytes_per_token"];
        s["kl_mean"] = fe["kl_mean"];
        s["kl_p99"] = fe["kl_p99"];
        s["top1"] = fe["top1"];
        for (const auto& [pn, p] : fe["probes"].items()) {
          s[pn + "_exact"] = p["exact"];
          s[pn + "_same_as_f32"] = p["same_as_f32"];
        }
        int ctx = -1, cuda_ctx = -1;
        std::string cuda_why;
        for (const auto& r : mj["rows"]) {
          if (r.value("format", "") != f || r.value("window", 0) != 0) continue;
          const bool ok = r.value("status", "") == "ok";
          if (r.value("device", "") == "cpu" && ok && r.value("context", 0) > ctx) {
            ctx = r.value("context", 0);
            s["kv_bytes_vs_f32"] = r.value("kv_bytes_vs_f32", json(nullptr));
            s["decode_vs_f32"] = r.value("decode_vs_f32", json(nullptr));
            s["decode_context"] = ctx;
          } else if (r.value("device", "") == "cuda") {
            if (ok && r.value("context", 0) > cuda_ctx) {
              cuda_ctx = r.value("context", 0);
              s["cuda_decode_vs_f32"] = r.value("decode_vs_f32", json(nullptr));
              s["cuda_decode_tok_s"] = r.value("decode_tok_s", json(nullptr));
              s["cuda_decode_context"] = cuda_ctx;
            } else if (!ok && cuda_why.empty()) {
              cuda_why = r.value("reason", "");
            }
          }
        }
        if (o.device == "cuda" && cuda_ctx < 0)
          v.notes.push_back("no CUDA timing row ran" + (cuda_why.empty() ? std::string() : ": " + cuda_why));
        v.matrix = s;
        if (!fe.value("fallback_reason", "").empty())
          v.not_validated.push_back("falls back to " + fe.value("effective", "") + " on this model (" + fe.value("fallback_reason", "") +
                                    "): the format itself was not measured");
      }
    }
  }

  // Record, report, verdicts.
  json so;
  so["schema"] = "kvgate.signoff/1";
  so["kind"] = "signoff";
  so["device"] = o.device;
  so["quick"] = o.quick;
  so["provenance"] = prov;
  so["mutation_source"] = mutation_source;
  json verdicts = json::array();
  int exit_code = 0;
  for (const auto& f : formats) {
    const auto& v = V[f];
    std::vector<std::string> reasons = v.fail;
    reasons.insert(reasons.end(), v.not_validated.begin(), v.not_validated.end());
    json notes = v.notes;
    verdicts.push_back({{"format", f}, {"verdict", v.verdict()}, {"reasons", reasons}, {"notes", notes},
                        {"gates", v.gates}, {"mutation", v.mutation}, {"matrix", v.matrix}});
    if (v.verdict() == "FAIL") exit_code = 1;
  }
  so["verdicts"] = verdicts;
  so["exit_code"] = exit_code;
  so["files"] = {{"signoff", "signoff.json"}, {"gates", "gates.json"}, {"index", "index.md"}, {"html", "report.html"}};
  if (!mj.is_null()) so["files"]["matrix"] = "matrix.json";
  write_file_atomic((fs::path(o.out) / "signoff.json").string(), so.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
  reports::ReportInputs in;
  in.matrix = mj;
  in.gates = gsum;
  in.mutants = outcomes;
  in.signoff = so;
  in.title = "kvgate sign-off (" + o.device + (o.quick ? ", quick" : "") + ")";
  std::string warning;
  reports::write_report(in, o.out, reports::default_web_dir(), &warning);
  if (!warning.empty()) std::fprintf(stderr, "signoff: %s\n", warning.c_str());

  std::printf("\n%-16s %-14s %s\n", "format", "verdict", "reasons");
  for (const auto& vj : verdicts) {
    std::string reasons;
    for (const auto& r : vj["reasons"]) reasons += (reasons.empty() ? "" : "; ") + r.get<std::string>();
    std::printf("%-16s %-14s %s\n", vj["format"].get<std::string>().c_str(), vj["verdict"].get<std::string>().c_str(), reasons.c_str());
  }
  std::printf("\nreport: %s/index.md, %s/report.html (signoff.json, gates.json, matrix.json)\n", o.out.c_str(), o.out.c_str());
  return exit_code;
}

}  // namespace

void register_signoff(CLI::App& app) {
  auto o = std::make_shared<SignoffOpts>();
  auto* sub = app.add_subcommand("signoff", "Per-format verdict from the gates, the mutation proof and the matrix vs f32; exit 1 on FAIL");
  sub->add_option("--format", o->formats, "format to sign off (repeatable)");
  sub->add_flag("--all", o->all, "every preset");
  sub->add_option("--device", o->device, "cpu | cuda")->capture_default_str();
  sub->add_option("--out", o->out, "report folder")->capture_default_str();
  sub->add_flag("--quick", o->quick, "quick matrix; without --mutants the mutation proof is skipped (verdict NOT-VALIDATED)");
  sub->add_option("--mutants", o->mutants, "read the mutation proof from this outcomes.json (or its folder) instead of running kvgate mutate");
  sub->add_option("--gates-dir", o->gates_dir, "folder with the gate_* programs (default <kvgate dir>/gates)");
  sub->add_option("--mutate-scratch", o->scratch, "scratch tree for kvgate mutate (default: mutate's own)");
  sub->add_option("--catalog", o->catalog, "mutant catalog (default mutations/catalog.json)");
  sub->add_option("--model", o->model, "matrix model (default stories260K)");
  sub->add_option("--probe-model", o->probe_model,
                  "subject of the needle/counting/echo probes (default: datasets/models/probe; 'none' = --model)");
  sub->add_option("--threads", o->threads, "CPU threads for the matrix")->capture_default_str();
  sub->add_option("--jobs,-j", o->jobs, "parallel jobs for kvgate mutate")->capture_default_str();
  sub->add_flag("--no-timing", o->no_timing, "matrix without timing (reads no clock; for tests)");
  on_run(sub, [o] { return run_signoff(*o); });
}

}  // namespace kvgate::cli
