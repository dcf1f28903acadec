// Markdown renderers: one page per format and an index (the sign-off summary).
#include <cctype>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "kvgate/matrix.hpp"
#include "coverage_view.hpp"
#include "json_field.hpp"
#include "kvgate/reports.hpp"

namespace kvgate::reports {

namespace {

using json = nlohmann::json;

std::string num(const json& v, const char* fmt = "%.3g") {
  if (!v.is_number()) return "–";
  char b[32];
  std::snprintf(b, sizeof b, fmt, v.get<double>());
  return b;
}
std::string pct(const json& v) {
  if (!v.is_number()) return "–";
  char b[16];
  std::snprintf(b, sizeof b, "%.0f%%", 100.0 * v.get<double>());
  return b;
}
std::string str(const json& v) { return v.is_string() ? v.get<std::string>() : v.is_null() ? "–" : v.dump(); }
std::string join(const json& arr, const std::string& sep = ", ") {
  std::string o;
  if (!arr.is_array()) return o;
  for (const auto& x : arr) o += (o.empty() ? "" : sep) + str(x);
  return o;
}

const json* format_entry(const json& matrix, const std::string& f) {
  if (!matrix.is_object() || !matrix.contains("formats")) return nullptr;
  for (const auto& e : field(matrix, "formats"))
    if (e.value("format", "") == f) return &e;
  return nullptr;
}
const json* verdict_entry(const json& signoff, const std::string& f) {
  if (!signoff.is_object() || !signoff.contains("verdicts")) return nullptr;
  for (const auto& e : field(signoff, "verdicts"))
    if (e.value("format", "") == f) return &e;
  return nullptr;
}

std::string provenance_line(const json& p) {
  if (!p.is_object()) return "";
  std::ostringstream o;
  std::string gpus;
  for (const auto& g : p.value("gpus", json::array())) gpus += (gpus.empty() ? "" : ", ") + g.value("name", "");
  // Outside a git work tree the provenance holds null for the commit and the dirty flag.
  const matrix::CommitStamp stamp = matrix::commit_stamp(p);
  o << (stamp.known() ? "commit `" + stamp.commit.substr(0, 12) + "`" : std::string("no commit (not a git work tree)"))
    << (stamp.dirty ? " (dirty)" : "")
    << " · CPU " << p.value("cpu_model", "?") << " (" << int_field(p, "cpu_cores") << " cores) · GPU "
    << (gpus.empty() ? "none" : gpus) << " · driver " << str(p.value("gpu_driver", json(nullptr))) << " · CUDA "
    << str(p.value("cuda_version", json(nullptr))) << " · " << p.value("compiler", "") << " `" << p.value("cxx_flags", "")
    << "` · seed " << int_field(p, "seed");
  const auto& m = p.value("model", json(nullptr));
  if (m.is_object())
    o << " · model `" << m.value("name", "") << "` sha256 `" << m.value("sha256", "").substr(0, 16) << "…` fingerprint `"
      << m.value("fingerprint", "") << "`";
  return o.str();
}

std::vector<std::string> formats_of(const ReportInputs& in) {
  std::vector<std::string> f;
  std::set<std::string> seen;
  auto add = [&](const std::string& s) {
    if (seen.insert(s).second) f.push_back(s);
  };
  if (in.signoff.is_object())
    for (const auto& v : in.signoff.value("verdicts", json::array())) add(v.value("format", ""));
  if (in.matrix.is_object())
    for (const auto& e : in.matrix.value("formats", json::array())) add(e.value("format", ""));
  return f;
}

// Decode tok/s ratio vs f32 at the largest context, resident, cpu.
json decode_ratio(const json& matrix, const std::string& f) {
  json best = nullptr;
  int ctx = -1;
  if (!matrix.is_object()) return best;
  for (const auto& r : matrix.value("rows", json::array()))
    if (r.value("format", "") == f && int_field(r, "window") == 0 && r.value("status", "") == "ok" && int_field(r, "context") > ctx) {
      ctx = int_field(r, "context");
      best = r.value("decode_vs_f32", json(nullptr));
    }
  return best;
}


// Each probe's sensitivity: the smallest injected KV damage per family that turned it red, and
// whether it is vacuous (no damage did, or the baseline passes none of its cases).
void sensitivity_table(std::ostringstream& o, const json& ps) {
  if (!ps.is_object()) return;
  o << "### Probe sensitivity (injected KV damage on the " << ps.value("baseline", "?") << " store read, "
    << ps.value("engine", "cpu") << " engine)\n\n";
  o << "| probe | verdict | baseline cases passed | v_noise (x envelope) | v_repeat (fraction of V rows) | k_noise_payload (x cell amax) | reason |\n";
  o << "|---|---|---:|---:|---:|---:|---|\n";
  for (const auto& p : ps.value("probes", json::array())) {
    auto fam = [&](const char* name) -> std::string {
      for (const auto& f : p.value("families", json::array()))
        if (f.value("family", "") == name) return f["smallest_red"].is_number() ? num(f["smallest_red"]) : std::string("not red");
      return "–";
    };
    o << "| " << p.value("probe", "") << " | **" << (p.value("vacuous", true) ? "VACUOUS" : "SENSITIVE") << "** | "
      << int_field(p, "baseline_passed") << "/" << int_field(p, "baseline_ran") << " | " << fam("v_noise") << " | " << fam("v_repeat")
      << " | " << fam("k_noise_payload") << " | " << p.value("reason", "") << " |\n";
  }
  std::string envf;
  for (const auto& p : ps.value("probes", json::array())) envf = p.value("envelope_format", envf);
  o << "\nv_noise sizes are multiples of the " << (envf.empty() ? "format's" : envf) << " envelope (the lossiest format signed off).\n\n";
}

// The sign-off's first table: per format both verdicts and the policy line that decided it, with the
// quality over all positions and the noise floor beside it.
void verdict_table(std::ostringstream& o, const ReportInputs& in) {
  const json& so = in.signoff;
  if (!so.is_object() || !so.contains("policy")) return;
  const json nf = so.value("noise_floor", json(nullptr));
  const json worst = nf.is_object() ? nf.value("worst", json::object()) : json::object();
  o << "Baseline: **" << so.value("baseline", "?") << "**. Policy: `" << field(so, "policy").value("path", "") << "`. Exit code "
    << int_field(so, "exit_code") << ".\n\n";
  o << "| format | verdict | conformance | fit | deciding policy line | KL mean | KL p99 | top-1 | 1-TV | ppl delta | KV saving |\n";
  o << "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& v : so.value("verdicts", json::array())) {
    const json q = v.value("quality", json(nullptr));
    const json a = q.is_object() ? field(q, "all") : json(nullptr);
    auto qv = [&](const char* k) { return a.is_object() ? num(a.value(k, json(nullptr))) : std::string("–"); };
    const std::string f = v.value("format", "");
    o << "| [" << f << "](" << file_name_for(f) << ".md) | **" << v.value("verdict", "?") << "** | "
      << (v.contains("conformance") ? field(v, "conformance").value("verdict", "?") : "–") << " | "
      << (v.contains("fit") ? field(v, "fit").value("verdict", "?") : "–") << " | " << v.value("deciding_line", "–") << " | " << qv("kl_mean")
      << " | " << qv("kl_p99") << " | " << (a.is_object() ? pct(field(a, "top1")) : "–") << " | " << qv("one_minus_tv") << " | "
      << qv("ppl_delta") << " | " << num(v.value("matrix", json::object()).value("kv_saving_vs_baseline", json(nullptr))) << " |\n";
  }
  o << "| noise floor (worst of " << (nf.is_object() ? field(nf, "runs").size() : 0) << " float runs) | | | | | " << num(worst.value("kl_mean", json(nullptr)))
    << " | " << num(worst.value("kl_p99", json(nullptr))) << " | " << pct(worst.value("top1", json(nullptr))) << " | "
    << num(worst.value("one_minus_tv", json(nullptr))) << " | " << num(worst.value("ppl_delta", json(nullptr))) << " | |\n\n";
  if (nf.is_object())
    for (const auto& r : field(nf, "runs")) o << "- noise run: " << r.value("name", "") << "\n";
  const json qm = so.value("quality_method", json::object());
  if (!qm.empty())
    o << "- quality: " << qm.value("path", "") << "; corpus " << join(qm.value("corpus", json::array()), " + ") << " ("
      << int_field(qm, "positions") << " positions); depth buckets " << join(qm.value("buckets", json::array())) << "\n";
  o << "- " << so.value("exit_codes", "") << "\n\n";
  sensitivity_table(o, so.value("probe_sensitivity", json(nullptr)));
}

// Per format: the fit lines (every budget, per depth bucket) and the bucket table.
void fit_section(std::ostringstream& o, const json& v) {
  if (!v.contains("fit")) return;
  const json& fit = field(v, "fit");
  o << "## Fit: " << fit.value("verdict", "?") << " (conformance: " << field(v, "conformance").value("verdict", "?") << ")\n\n";
  o << "Deciding line: " << v.value("deciding_line", "–") << "\n\n";
  const json q = v.value("quality", json(nullptr));
  if (q.is_object()) {
    o << "| depth | positions | KL mean | KL p99 | top-1 | 1-TV | ppl baseline | ppl format | ppl delta |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    auto row = [&](const std::string& name, const json& s) {
      if (s.value("empty", false)) {
        o << "| " << name << " | 0 (empty) | | | | | | | |\n";
        return;
      }
      o << "| " << name << " | " << int_field(s, "positions") << " | " << num(s["kl_mean"]) << " | " << num(s["kl_p99"]) << " | "
        << pct(s["top1"]) << " | " << num(s["one_minus_tv"]) << " | " << num(s["ppl_base"]) << " | " << num(s["ppl_format"])
        << " | " << num(s["ppl_delta"]) << " |\n";
    };
    row("all", field(q, "all"));
    for (const auto& b : field(q, "buckets")) row(b.value("bucket", ""), b);
    o << "\n";
  }
  o << "| policy line | scope | value | noise floor | status | source |\n|---|---|---:|---:|---|---|\n";
  for (const auto& l : fit.value("lines", json::array())) {
    std::string src = l.value("source", "");
    for (auto& c : src)
      if (c == '|' || c == '\n') c = ' ';
    o << "| " << l.value("line", "") << " | " << l.value("scope", "") << " | " << num(field(l, "value")) << " | " << num(field(l, "noise_floor"))
      << " | " << l.value("status", "") << (l.value("status", "") == "within" ? "" : " (" + l.value("reason", "") + ")") << " | "
      << src.substr(0, 120) << (src.size() > 120 ? "…" : "") << " |\n";
  }
  o << "\n";
}

}  // namespace

std::string file_name_for(const std::string& format) {
  std::string o;
  for (char c : format) o += (c == '=') ? '-' : (c == ',') ? '_' : (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-') ? c : '_';
  return o;
}

std::string format_markdown(const ReportInputs& in, const std::string& f) {
  std::ostringstream o;
  o << "# " << in.title << ": `" << f << "`\n\n";
  if (const json* v = verdict_entry(in.signoff, f)) {
    o << "**Verdict: " << v->value("verdict", "?") << "**";
    const auto& reasons = v->value("reasons", json::array());
    if (!reasons.empty()) o << " — " << join(reasons, "; ");
    o << "\n\n";
    fit_section(o, *v);
  }
  const json* fe = format_entry(in.matrix, f);
  if (fe) {
    o << "## Against the f32 baseline\n\n";
    o << "| metric | value |\n|---|---|\n";
    o << "| effective format | " << fe->value("effective", "") << (fe->value("fallback_reason", "").empty() ? "" : " (fallback: " + fe->value("fallback_reason", "") + ")") << " |\n";
    o << "| KV bytes per token | " << str(field((*fe), "kv_bytes_per_token")) << " |\n";
    o << "| capacity at the budget (tokens) | " << str(field((*fe), "capacity_tokens")) << " |\n";
    o << "| KL mean / p99 / max (nats) | " << num(field((*fe), "kl_mean")) << " / " << num(field((*fe), "kl_p99")) << " / " << num(fe->value("kl_max", json(nullptr))) << " |\n";
    o << "| top-1 agreement | " << pct(field((*fe), "top1")) << " over " << int_field((*fe), "kl_positions") << " positions |\n";
    const json probes = fe->value("probes", json::object());
    for (const auto& [pn, p] : probes.items()) {
      o << "| probe " << pn << " | exact " << pct(field(p, "exact")) << " (" << int_field(p, "passed") << "/" << int_field(p, "ran")
        << " ran, " << int_field(p, "skipped") << " skipped), same greedy output as f32 " << pct(field(p, "same_as_f32"));
      const auto& s = p.value("summary", json::object());
      if (s.contains("repeated")) o << ", repeated numbers " << str(s["repeated"]);
      if (s.contains("dropped_digits")) o << ", dropped digits " << str(s["dropped_digits"]);
      o << " |\n";
    }
    o << "\n";
    const auto& needle = fe->value("probes", json::object()).value("needle", json::object());
    if (needle.contains("summary") && field(needle, "summary").contains("grid")) {
      o << "Needle grid (exact fraction, length × depth): ";
      for (const auto& c : field(field(needle, "summary"), "grid")) o << "L" << int_field(c, "length") << "@" << num(field(c, "depth"), "%.2g") << "=" << pct(field(c, "exact")) << " ";
      o << "\n\n";
    }
  }
  if (in.matrix.is_object()) {
    // The one renderer of matrix rows (kvgate_matrix), this format's rows, without the format column.
    o << "## Timing rows\n\n"
      << matrix::rows_markdown(in.matrix.value("rows", json::array()),
                               {{"device", "context", "window", "status", "ttft_cold_ms", "ttft_warm_ms", "prefill_tok_s",
                                 "decode_tok_s", "decode_vs_f32"},
                                f});
    o << "\n";
  }
  if (in.gates.is_object()) {
    o << "## Gates\n\n| gate | family | status | message |\n|---|---|---|---|\n";
    int n = 0;
    for (const auto& g : in.gates.value("gates", json::array())) {
      bool mine = false;
      for (const auto& x : g.value("formats", json::array())) mine = mine || x == f;
      if (!mine) continue;
      ++n;
      std::string msg = g.value("message", "");
      for (auto& c : msg)
        if (c == '\n' || c == '|') c = ' ';
      o << "| " << g.value("id", "") << " | " << g.value("family", "") << " | " << g.value("status", "") << " | " << msg.substr(0, 160) << " |\n";
    }
    if (n == 0) o << "| (no gate tagged [fmt:" << f << "]) | | | |\n";
    o << "\n";
  }
  if (const json* v = verdict_entry(in.signoff, f)) {
    for (const auto& n : v->value("notes", json::array())) o << "- note: " << str(n) << "\n";
    if (!v->value("notes", json::array()).empty()) o << "\n";
    const auto& m = v->value("mutation", json::object());
    o << "## Mutation proof\n\nStatus: " << m.value("status", "none") << ". Mutants: " << m.value("mutants", json::array()).size()
      << "; killed: " << join(m.value("killed", json::array())) << "; survived: " << join(m.value("survived", json::array()))
      << "; not run: " << join(m.value("not_run", json::array())) << ".\n\n";
  }
  const json& prov = in.signoff.is_object() ? field(in.signoff, "provenance") : in.matrix.is_object() ? field(in.matrix, "provenance") : json(nullptr);
  if (prov.is_object()) o << "## Provenance\n\n" << provenance_line(prov) << "\n";
  return o.str();
}

std::string index_markdown(const ReportInputs& in) {
  std::ostringstream o;
  o << "# " << in.title << "\n\n";
  const json& prov = in.signoff.is_object() ? field(in.signoff, "provenance") : in.matrix.is_object() ? field(in.matrix, "provenance") : json(nullptr);
  if (prov.is_object()) o << provenance_line(prov) << "\n\n";
  if (in.signoff.is_object())
    o << "Device: " << in.signoff.value("device", "cpu") << (in.signoff.value("quick", false) ? " (quick)" : "")
      << ". Mutation proof: " << in.signoff.value("mutation_source", "") << ".\n\n";
  verdict_table(o, in);
  if (in.signoff.is_object() && in.signoff.contains("policy")) o << "## Gates, mutation proof and the matrix (against f32)\n\n";
  o << "| format | verdict | gates passed/failed/skipped | mutants killed/survived/not run | B/token | vs f32 | KL mean | top-1 | decode vs f32 | reasons |\n";
  o << "|---|---|---|---|---:|---:|---:|---:|---:|---|\n";
  double f32_bytes = 0;
  if (const json* b = format_entry(in.matrix, "f32")) f32_bytes = b->value("kv_bytes_per_token", 0.0);
  for (const auto& f : formats_of(in)) {
    const json* v = verdict_entry(in.signoff, f);
    const json* fe = format_entry(in.matrix, f);
    o << "| [" << f << "](" << file_name_for(f) << ".md) | " << (v ? "**" + v->value("verdict", "?") + "**" : std::string("–")) << " | ";
    if (v) {
      const auto& g = field((*v), "gates");
      o << int_field(g, "passed") << "/" << int_field(g, "failed") << "/" << int_field(g, "skipped") << " | ";
      const auto& m = field((*v), "mutation");
      o << m.value("killed", json::array()).size() << "/" << m.value("survived", json::array()).size() << "/"
        << m.value("not_run", json::array()).size() << " | ";
    } else {
      o << "– | – | ";
    }
    if (fe) {
      char r[16];
      std::snprintf(r, sizeof r, "%.3f", f32_bytes > 0 ? fe->value("kv_bytes_per_token", 0.0) / f32_bytes : 0.0);
      o << str(field((*fe), "kv_bytes_per_token")) << " | " << r << " | " << num(field((*fe), "kl_mean")) << " | " << pct(field((*fe), "top1")) << " | "
        << num(decode_ratio(in.matrix, f), "%.2f") << " | ";
    } else {
      o << "– | – | – | – | – | ";
    }
    o << (v ? join(v->value("reasons", json::array()), "; ") : std::string()) << " |\n";
  }
  o << "\n";
  if (in.matrix.is_object()) {
    o << "> " << in.matrix.value("subject_note", "") << "\n\n";
    for (const auto& n : in.matrix.value("notes", json::array())) o << "- note: " << str(n) << "\n";
  }
  if (in.gates.is_object()) {
    const auto& t = field(in.gates, "totals");
    o << "\nGates: " << int_field(t, "passed") << " passed, " << int_field(t, "failed") << " failed, " << int_field(t, "skipped") << " skipped.\n";
  }
  const CoverageView cv = coverage_view(in.signoff);
  if (cv.present) {
    o << "\n## Coverage of the shipped code by the gate suite\n\n" << cv.headline << "\n\n";
    if (!cv.parts.empty()) {
      o << "| part | what | files | lines reached | lines | branches |\n|---|---|---:|---:|---:|---:|\n";
      for (const auto& r : cv.parts) o << "| " << r[0] << " | " << r[1] << " | " << r[2] << " | " << r[3] << " | " << r[4] << " | " << r[5] << " |\n";
      o << "\n";
    }
    if (!cv.unreached.empty()) {
      o << "runtime/ files with unreached lines:\n\n| file | unreached | lines | unreached line numbers |\n|---|---:|---:|---|\n";
      for (const auto& r : cv.unreached) o << "| " << r[0] << " | " << r[1] << " | " << r[2] << " | " << r[3] << " |\n";
      o << "\n";
    }
    o << cv.provenance << "\n";
  }
  return o.str();
}

}  // namespace kvgate::reports
