// `kvgate field-report`: environment fingerprint + the preset matrix + the gate summary -> one folder
// (and a .tar.gz) to attach to an issue. `--compare A B` prints the per-format, per-metric
// differences of two bundles (folders or .tar.gz) with ratios.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

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

struct FieldOpts {
  bool quick = false, no_timing = false, no_gates = false;
  std::string out = "kvgate.out/field-report", formats, model, probe_model, gates_dir;
  std::vector<std::string> compare;
  int threads = 1;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Per format: a flat map of metric -> number|null (quality, probes, and timing per row).
json flatten(const json& m) {
  json out = json::array();
  for (const auto& f : m.value("formats", json::array())) {
    const std::string name = f.value("format", "");
    json mt = json::object();
    for (const char* k : {"kv_bytes_per_token", "capacity_tokens", "kl_mean", "kl_p99", "top1"}) mt[k] = f.value(k, json(nullptr));
    const json probes = f.value("probes", json::object());
    for (const auto& [pn, p] : probes.items()) {
      mt[pn + "_exact"] = p.value("exact", json(nullptr));
      mt[pn + "_same_as_f32"] = p.value("same_as_f32", json(nullptr));
    }
    for (const auto& r : m.value("rows", json::array())) {
      if (r.value("format", "") != name || r.value("status", "") != "ok") continue;
      const std::string at = "@" + r.value("device", "") + "/ctx" + std::to_string(r.value("context", 0)) + "/w" +
                             std::to_string(r.value("window", 0));
      for (const auto& c : matrix::row_columns())  // the row columns of the one matrix-row table
        if (c.measurement) mt[c.key + at] = r.value(c.key, json(nullptr));
    }
    out.push_back({{"format", name}, {"metrics", mt}});
  }
  return out;
}

fs::path self_exe() {
  std::error_code ec;
  const auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path("kvgate") : p;
}

int run_field(const FieldOpts& o) {
  const std::string src = matrix::default_source_dir();
  const std::string model_path = o.model.empty() ? matrix::find_model("stories260K/stories260K.bin", src) : o.model;
  if (model_path.empty()) throw std::invalid_argument("no --model and stories260K not found (set KVGATE_MODELS)");
  const Model model = load_model(model_path);
  matrix::ProvenanceOptions po;
  po.model = &model;
  po.threads = o.threads;
  po.seed = 1;
  po.source_dir = src;
  const json env = matrix::environment(po);
  const bool gpu = env.value("cuda_build", false) && !env.value("gpus", json::array()).empty();
  fs::create_directories(o.out);

  matrix::MatrixOptions mo = bench_options_from(model, o.quick, src);
  std::optional<Model> probe_subject;
  load_probe_subject(o.probe_model, src, o.quick, mo, probe_subject);
  if (!o.formats.empty()) mo.formats = matrix::split_csv(o.formats);
  mo.threads = o.threads;
  mo.timing = !o.no_timing;
  mo.devices = {"cpu"};
  if (gpu) mo.devices.push_back("cuda");
  mo.cache_dir = (fs::path(o.out) / ".kvcache").string();
  const json m = matrix::run_matrix(model, mo, env, progress_printer("field-report "));
  progress_done();
  std::error_code ec;
  fs::remove_all(mo.cache_dir, ec);
  matrix::write_matrix(m, o.out);

  json gsum = nullptr;
  if (!o.no_gates) {
    gates::GateRunOptions gopt;
    gopt.gates_dir = o.gates_dir.empty() ? (self_exe().parent_path() / "gates").string() : o.gates_dir;
    try {
      gsum = gates::summarize(gates::run_gates(gopt, true));
      write_file_atomic((fs::path(o.out) / "gates.json").string(), gsum.dump(2) + "\n");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "field-report: gates not run: %s\n", e.what());
    }
  }
  json fr;
  fr["schema"] = "kvgate.field-report/1";
  fr["kind"] = "field-report";
  fr["quick"] = o.quick;
  fr["environment"] = env;
  fr["formats"] = flatten(m);
  fr["gates"] = gsum.is_null() ? json(nullptr) : json({{"totals", gsum["totals"]}, {"per_format", gsum["per_format"]}});
  fr["files"] = {{"matrix", "matrix.json"}, {"summary", "README.md"}, {"html", "report.html"}};
  if (!gsum.is_null()) fr["files"]["gates"] = "gates.json";
  write_file_atomic((fs::path(o.out) / "field-report.json").string(), fr.dump(2, ' ', false, json::error_handler_t::replace) + "\n");

  reports::ReportInputs in;
  in.matrix = m;
  in.gates = gsum;
  in.title = "kvgate field report";
  reports::write_report(in, o.out, reports::default_web_dir());
  std::ostringstream md;
  md << "# kvgate field report\n\n";
  md << "- CPU: " << env.value("cpu_model", "") << " (" << env.value("cpu_cores", 0) << " cores), memory " << env.value("memory_total", "?") << "\n";
  std::string gpus;
  for (const auto& g : env.value("gpus", json::array())) gpus += (gpus.empty() ? "" : ", ") + g.value("name", "") + " " + g.value("memory", "");
  md << "- GPU: " << (gpus.empty() ? "none" : gpus) << "; driver " << (env["gpu_driver"].is_string() ? env["gpu_driver"].get<std::string>() : "–")
     << "; CUDA " << (env["cuda_version"].is_string() ? env["cuda_version"].get<std::string>() : "–") << "; CUDA build "
     << (env.value("cuda_build", false) ? "yes" : "no") << "\n";
  md << "- GPUs: " << env.value("gpu_count", 0) << (env["gpu_topology"].is_string() ? "; links " + env["gpu_topology"].get<std::string>() : "")
     << "\n";
  md << "- OS: " << env.value("os", "") << "; compiler " << env.value("compiler", "") << " `" << env.value("cxx_flags", "") << "`\n";
  const matrix::CommitStamp stamp = matrix::commit_stamp(env);
  md << "- kvgate commit " << (stamp.known() ? stamp.commit : std::string("–")) << (stamp.dirty ? " (dirty)" : "") << "\n";
  if (!gsum.is_null())
    md << "- gates: " << gsum["totals"]["passed"] << " passed, " << gsum["totals"]["failed"] << " failed, " << gsum["totals"]["skipped"] << " skipped\n";
  md << "\n" << matrix::matrix_markdown(m);
  write_file_atomic((fs::path(o.out) / "README.md").string(), md.str());

  const fs::path dir = fs::absolute(o.out).lexically_normal();
  const std::string tarball = dir.string() + ".tar.gz";
  const std::string cmd = "tar -czf " + quote(tarball) + " -C " + quote(dir.parent_path().string()) + " " + quote(dir.filename().string());
  const int rc = std::system(cmd.c_str());
  std::cout << md.str();
  std::fprintf(stderr, "field report: %s/ (field-report.json, README.md, matrix.*, gates.json, report.html)%s%s\n", o.out.c_str(),
               rc == 0 ? " and " : "", rc == 0 ? tarball.c_str() : "");
  return 0;
}

// A bundle: a folder holding field-report.json, or a .tar.gz of one.
json load_bundle(const std::string& path, std::vector<fs::path>& temps) {
  fs::path p(path);
  if (fs::is_regular_file(p) && p.string().ends_with(".tar.gz")) {
    char tmpl[] = "/tmp/kvgate-compare-XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d) throw std::runtime_error("mkdtemp failed");
    temps.emplace_back(d);
    const std::string cmd = "tar -xzf " + quote(p.string()) + " -C " + quote(d);
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("cannot extract " + path);
    for (const auto& e : fs::recursive_directory_iterator(d))
      if (e.path().filename() == "field-report.json") p = e.path();
  } else if (fs::is_directory(p)) {
    p /= "field-report.json";
  }
  std::ifstream f(p);
  if (!f) throw std::runtime_error("no field-report.json in '" + path + "'");
  return json::parse(f);
}

int run_compare(const FieldOpts& o) {
  std::vector<fs::path> temps;
  const json a = load_bundle(o.compare[0], temps), b = load_bundle(o.compare[1], temps);
  for (const auto& t : temps) {
    std::error_code ec;
    fs::remove_all(t, ec);
  }
  auto env_line = [](const json& e) {
    std::string gpus;
    for (const auto& g : e.value("gpus", json::array())) gpus += (gpus.empty() ? "" : ", ") + g.value("name", "");
    return e.value("cpu_model", "") + " / GPU " + (gpus.empty() ? "none" : gpus) + " / " + e.value("compiler", "") + " / commit " +
           (e["git_commit"].is_string() ? e["git_commit"].get<std::string>().substr(0, 12) : "–");
  };
  std::printf("# kvgate field-report comparison\n\nA: %s\nB: %s\n\n", env_line(a["environment"]).c_str(), env_line(b["environment"]).c_str());
  std::map<std::string, json> fa, fb;
  std::vector<std::string> order;
  for (const auto& f : a.value("formats", json::array())) {
    fa[f["format"]] = f["metrics"];
    order.push_back(f["format"]);
  }
  for (const auto& f : b.value("formats", json::array())) {
    fb[f["format"]] = f["metrics"];
    if (!fa.count(f["format"])) order.push_back(f["format"]);
  }
  std::printf("| format | metric | A | B | B/A | B-A |\n|---|---|---:|---:|---:|---:|\n");
  auto fmtnum = [](const json& v) {
    if (!v.is_number()) return std::string("–");
    char s[32];
    std::snprintf(s, sizeof s, "%.4g", v.get<double>());
    return std::string(s);
  };
  for (const auto& f : order) {
    const json ma = fa.count(f) ? fa[f] : json::object(), mb = fb.count(f) ? fb[f] : json::object();
    std::set<std::string> keys;
    for (const auto& [k, v] : ma.items()) keys.insert(k);
    for (const auto& [k, v] : mb.items()) keys.insert(k);
    for (const auto& k : keys) {
      const json va = ma.value(k, json(nullptr)), vb = mb.value(k, json(nullptr));
      std::string ratio = "–", diff = "–";
      if (va.is_number() && vb.is_number()) {
        char s[32];
        std::snprintf(s, sizeof s, "%+.4g", vb.get<double>() - va.get<double>());
        diff = s;
        if (va.get<double>() != 0) {
          std::snprintf(s, sizeof s, "%.3f", vb.get<double>() / va.get<double>());
          ratio = s;
        }
      }
      std::printf("| %s | %s | %s | %s | %s | %s |\n", f.c_str(), k.c_str(), fmtnum(va).c_str(), fmtnum(vb).c_str(), ratio.c_str(), diff.c_str());
    }
  }
  const json ga = a.value("gates", json(nullptr)), gb = b.value("gates", json(nullptr));
  if (ga.is_object() && gb.is_object())
    std::printf("\ngates: A %s, B %s\n", ga["totals"].dump().c_str(), gb["totals"].dump().c_str());
  return 0;
}

}  // namespace

void register_field_report(CLI::App& app) {
  auto o = std::make_shared<FieldOpts>();
  auto* sub = app.add_subcommand("field-report", "Environment + preset matrix + gate summary -> one folder and .tar.gz; --compare A B diffs two");
  sub->add_flag("--quick", o->quick, "quick matrix (about 2 minutes on CPU)");
  sub->add_option("--out", o->out, "bundle folder (a .tar.gz is written beside it)")->capture_default_str();
  sub->add_option("--formats", o->formats, "formats (default: every preset + k=q8_0,v=q4_0)");
  sub->add_option("--model", o->model, "model (default stories260K)");
  sub->add_option("--probe-model", o->probe_model,
                  "subject of the needle/counting/echo probes (default: datasets/models/probe; 'none' = --model)");
  sub->add_option("--threads", o->threads, "CPU threads")->capture_default_str();
  sub->add_option("--gates-dir", o->gates_dir, "folder with the gate_* programs (default <kvgate dir>/gates)");
  sub->add_flag("--no-gates", o->no_gates, "skip the gate summary");
  sub->add_flag("--no-timing", o->no_timing, "matrix without timing (reads no clock; for tests)");
  sub->add_option("--compare", o->compare, "compare two bundles (folders or .tar.gz): per format, per metric, with ratios")->expected(2);
  on_run(sub, [o] { return o->compare.size() == 2 ? run_compare(*o) : run_field(*o); });
}

}  // namespace kvgate::cli
