// The self-contained HTML page: tables plus Vega-Lite plots, with vega, vega-lite and vega-embed
// inlined from reports/web/node_modules (npm), so the page works offline.
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "kvgate/atomic_file.hpp"
#include "coverage_view.hpp"
#include "json_field.hpp"
#include "kvgate/reports.hpp"

namespace kvgate::reports {

namespace {

using json = nlohmann::json;

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

// A vendored bundle inside <script>: only "</script" can close the element; it occurs in strings
// only, where "<\/script" means the same.
std::string bundle_safe(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' && i + 8 <= s.size() && s[i + 1] == '/') {
      std::string w = s.substr(i + 2, 6);
      for (auto& c : w) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (w == "script") {
        o += "<\\/";
        ++i;
        continue;
      }
    }
    o += s[i];
  }
  return o;
}

// JSON data inside <script>: "</" occurs only in strings, where "<\/" means the same.
std::string script_safe(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' && i + 1 < s.size() && s[i + 1] == '/') o += "<\\";
    else o += s[i];
  }
  return o;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return {};
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string cell(const json& v, const char* fmt = "%.3g") {
  if (v.is_null()) return "–";
  if (v.is_number_float()) {
    char b[32];
    std::snprintf(b, sizeof b, fmt, v.get<double>());
    return b;
  }
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

json base_spec(const std::string& title) {
  return {{"$schema", "https://vega.github.io/schema/vega-lite/v6.json"},
          {"title", title},
          {"config", {{"view", {{"stroke", "transparent"}}}, {"font", "sans-serif"}}}};
}

}  // namespace

std::vector<std::pair<std::string, json>> plot_specs(const ReportInputs& in) {
  std::vector<std::pair<std::string, json>> out;
  const json& m = in.matrix;
  if (m.is_object()) {
    // 1. decode tok/s vs context per format.
    json rows = json::array();
    for (const auto& r : m.value("rows", json::array()))
      if (r.value("status", "") == "ok" && field(r, "decode_tok_s").is_number())
        rows.push_back({{"format", field(r, "format")}, {"context", field(r, "context")}, {"window", "window " + std::to_string(int_field(r, "window"))},
                        {"device", field(r, "device")}, {"decode_tok_s", field(r, "decode_tok_s")}});
    if (!rows.empty()) {
      json s = base_spec("Decode tok/s vs context, per format");
      s["width"] = 560;
      s["height"] = 300;
      s["data"] = {{"values", rows}};
      s["mark"] = {{"type", "line"}, {"point", true}};
      s["encoding"] = {{"x", {{"field", "context"}, {"type", "quantitative"}, {"title", "context (tokens)"}}},
                       {"y", {{"field", "decode_tok_s"}, {"type", "quantitative"}, {"title", "decode tok/s"}}},
                       {"color", {{"field", "format"}, {"type", "nominal"}}},
                       {"strokeDash", {{"field", "window"}, {"type", "nominal"}}},
                       {"tooltip", json::array({{{"field", "format"}}, {{"field", "context"}}, {{"field", "window"}}, {{"field", "decode_tok_s"}, {"format", ".0f"}}})}};
      out.emplace_back("decode", s);
    }
    // 2. needle heatmap (depth x length) per format.
    json grid = json::array();
    for (const auto& f : m.value("formats", json::array())) {
      const auto& pr = f.value("probes", json::object());
      if (!pr.contains("needle")) continue;
      for (const auto& c : field(pr, "needle").value("summary", json::object()).value("grid", json::array()))
        grid.push_back({{"format", field(f, "format")}, {"length", field(c, "length")}, {"depth", field(c, "depth")}, {"exact", field(c, "exact")}});
    }
    if (!grid.empty()) {
      json s = base_spec("Needle retrieval: exact fraction, depth x length, per format");
      s["data"] = {{"values", grid}};
      s["columns"] = 5;
      s["facet"] = {{"field", "format"}, {"type", "nominal"}, {"title", nullptr}};
      s["spec"] = {{"width", 120},
                   {"height", 90},
                   {"mark", "rect"},
                   {"encoding", {{"x", {{"field", "depth"}, {"type", "ordinal"}}},
                                 {"y", {{"field", "length"}, {"type", "ordinal"}, {"sort", "descending"}}},
                                 {"color", {{"field", "exact"}, {"type", "quantitative"}, {"scale", {{"domain", {0, 1}}, {"scheme", "redyellowgreen"}}}}},
                                 {"tooltip", json::array({{{"field", "format"}}, {{"field", "length"}}, {{"field", "depth"}}, {{"field", "exact"}}})}}}};
      out.emplace_back("needle", s);
    }
    // 3. KL and top-1 per format; 4. bytes per token.
    json q = json::array(), bytes = json::array();
    for (const auto& f : m.value("formats", json::array())) {
      if (field(f, "kl_mean").is_number())
        q.push_back({{"format", field(f, "format")}, {"kl_mean", field(f, "kl_mean")}, {"kl_p99", field(f, "kl_p99")}, {"top1", field(f, "top1")}});
      bytes.push_back({{"format", field(f, "format")}, {"bytes", field(f, "kv_bytes_per_token")}});
    }
    if (!q.empty()) {
      json s = base_spec("KL divergence vs f32 KV (mean and p99, nats) and top-1 agreement, per format");
      s["data"] = {{"values", q}};
      json kl = {{"width", 360}, {"height", 220}, {"mark", "bar"},
                 {"transform", json::array({{{"fold", {"kl_mean", "kl_p99"}}, {"as", {"stat", "kl"}}}})},
                 {"encoding", {{"x", {{"field", "format"}, {"type", "nominal"}, {"sort", nullptr}}},
                               {"xOffset", {{"field", "stat"}}},
                               {"y", {{"field", "kl"}, {"type", "quantitative"}, {"scale", {{"type", "symlog"}, {"constant", 0.001}}}, {"title", "KL (nats, symlog)"}}},
                               {"color", {{"field", "stat"}, {"type", "nominal"}}}}}};
      json top1 = {{"width", 360}, {"height", 220}, {"mark", "bar"},
                   {"encoding", {{"x", {{"field", "format"}, {"type", "nominal"}, {"sort", nullptr}}},
                                 {"y", {{"field", "top1"}, {"type", "quantitative"}, {"scale", {{"domain", {0, 1}}}}, {"title", "top-1 agreement"}}}}}};
      s["hconcat"] = {kl, top1};
      out.emplace_back("quality", s);
    }
    if (!bytes.empty()) {
      json s = base_spec("KV bytes per token (all layers, K+V, scales included)");
      s["width"] = 560;
      s["height"] = 220;
      s["data"] = {{"values", bytes}};
      s["mark"] = "bar";
      s["encoding"] = {{"x", {{"field", "format"}, {"type", "nominal"}, {"sort", nullptr}}},
                       {"y", {{"field", "bytes"}, {"type", "quantitative"}, {"title", "bytes / token"}}}};
      out.emplace_back("bytes", s);
    }
  }
  // 6. mutation kill matrix (mutant x gate); gates that killed something or were expected to.
  if (in.mutants.is_object() && in.mutants.contains("mutants")) {
    std::set<std::string> keep;
    for (const auto& mu : field(in.mutants, "mutants")) {
      for (const auto& e : mu.value("expect_killed_by", json::array())) keep.insert(e.get<std::string>());
      for (const auto& k : mu.value("killed_by", json::array())) keep.insert(k.get<std::string>());
    }
    json cells = json::array();
    for (const auto& mu : field(in.mutants, "mutants")) {
      const json mg = mu.value("gates", json::object());
      for (const auto& [gid, g] : mg.items())
        if (keep.count(gid))
          cells.push_back({{"mutant", mu.value("id", "")}, {"gate", gid}, {"status", g.value("status", "")}, {"mutant_status", mu.value("status", "")}});
    }
    if (!cells.empty()) {
      json s = base_spec("Mutation kill matrix (a red cell: the gate killed the mutant)");
      s["data"] = {{"values", cells}};
      s["mark"] = "rect";
      s["encoding"] = {{"x", {{"field", "gate"}, {"type", "nominal"}, {"axis", {{"labelAngle", -60}}}}},
                       {"y", {{"field", "mutant"}, {"type", "nominal"}}},
                       {"color", {{"field", "status"}, {"type", "nominal"},
                                  {"scale", {{"domain", {"failed", "crashed", "timeout", "passed", "skipped", "not_run"}},
                                             {"range", {"#d62728", "#8c1d1d", "#ff7f0e", "#e8e8e8", "#c7c7ff", "#ffffff"}}}}}},
                       {"tooltip", json::array({{{"field", "mutant"}}, {{"field", "gate"}}, {{"field", "status"}}, {{"field", "mutant_status"}}})}};
      out.emplace_back("kills", s);
    }
  }
  return out;
}

std::string html_page(const ReportInputs& in, const std::string& web_dir, std::string* warning) {
  const auto nm = std::filesystem::path(web_dir) / "node_modules";
  const std::string vega = read_file(nm / "vega" / "build" / "vega.min.js");
  const std::string vl = read_file(nm / "vega-lite" / "build" / "vega-lite.min.js");
  const std::string embed = read_file(nm / "vega-embed" / "build" / "vega-embed.min.js");
  const bool have_js = !vega.empty() && !vl.empty() && !embed.empty();
  if (!have_js && warning)
    *warning = "Vega bundles not found under " + nm.string() + ": the HTML page has tables only (run `npm ci` in " + web_dir + ")";
  const auto specs = plot_specs(in);

  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << html_escape(in.title) << "</title>\n"
    << "<style>body{font-family:sans-serif;margin:24px;max-width:1400px}table{border-collapse:collapse;margin:8px 0 20px}"
       "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}th{background:#f3f3f3}"
       ".PASS{background:#d9f2d9}.FAIL{background:#f7c6c6}.NOT-VALIDATED{background:#fff0c2}.NOT-MEASURED{background:#fff0c2}.OVER-BUDGET{background:#f7c6c6}.DOES-NOT-CONFORM{background:#f7c6c6}.plot{margin:16px 0}"
       "#kvgate-errors{color:#b00;white-space:pre}</style>\n";
  // Error capture first, so that a failure while loading the bundles is recorded too.
  o << "<script>window.kvgateErrors=[];window.addEventListener('error',function(e){window.kvgateErrors.push(String(e.message))});"
       "(function(){var ce=console.error;console.error=function(){window.kvgateErrors.push(Array.prototype.join.call(arguments,' '));"
       "return ce.apply(console,arguments)}})();</script>\n";
  if (have_js) o << "<script>" << bundle_safe(vega) << "</script>\n<script>" << bundle_safe(vl) << "</script>\n<script>" << bundle_safe(embed) << "</script>\n";
  o << "</head><body>\n<h1>" << html_escape(in.title) << "</h1>\n";

  const json& prov = in.signoff.is_object() ? field(in.signoff, "provenance") : in.matrix.is_object() ? field(in.matrix, "provenance") : json(nullptr);
  if (prov.is_object()) {
    std::string gpus;
    for (const auto& g : prov.value("gpus", json::array())) gpus += (gpus.empty() ? "" : ", ") + g.value("name", "");
    o << "<p>commit <code>" << html_escape(cell(prov.value("git_commit", json(nullptr)))) << "</code> · CPU " << html_escape(prov.value("cpu_model", ""))
      << " (" << int_field(prov, "cpu_cores") << " cores) · GPU " << html_escape(gpus.empty() ? "none" : gpus) << " · "
      << html_escape(prov.value("compiler", "")) << " · seed " << int_field(prov, "seed");
    if (field(prov, "model").is_object())
      o << " · model <code>" << html_escape(field(prov, "model").value("name", "")) << "</code> sha256 <code>"
        << html_escape(field(prov, "model").value("sha256", "")) << "</code>";
    o << "</p>\n";
  }
  if (in.signoff.is_object()) {
    if (in.signoff.contains("policy")) {
      o << "<h2>Verdicts</h2>\n<p>Baseline <b>" << html_escape(in.signoff.value("baseline", "?")) << "</b>, policy <code>"
        << html_escape(field(in.signoff, "policy").value("path", "")) << "</code>, exit code " << int_field(in.signoff, "exit_code") << ". "
        << html_escape(in.signoff.value("exit_codes", "")) << "</p>\n";
      o << "<table><tr><th>format</th><th>verdict</th><th>conformance</th><th>fit</th><th>deciding policy line</th><th>KL mean</th>"
           "<th>top-1</th><th>1-TV</th><th>ppl delta</th></tr>\n";
      for (const auto& v : in.signoff.value("verdicts", json::array())) {
        const json q = v.value("quality", json(nullptr));
        const json a = q.is_object() ? field(q, "all") : json(nullptr);
        auto qv = [&](const char* k) { return a.is_object() ? cell(a.value(k, json(nullptr))) : std::string("–"); };
        o << "<tr><td>" << html_escape(v.value("format", "")) << "</td><td class=\"" << v.value("verdict", "") << "\">"
          << v.value("verdict", "") << "</td><td>" << html_escape(v.contains("conformance") ? field(v, "conformance").value("verdict", "") : "")
          << "</td><td>" << html_escape(v.contains("fit") ? field(v, "fit").value("verdict", "") : "") << "</td><td>"
          << html_escape(v.value("deciding_line", "")) << "</td><td>" << qv("kl_mean") << "</td><td>" << qv("top1") << "</td><td>"
          << qv("one_minus_tv") << "</td><td>" << qv("ppl_delta") << "</td></tr>\n";
      }
      const json nf = in.signoff.value("noise_floor", json(nullptr));
      if (nf.is_object()) {
        const json w = nf.value("worst", json::object());
        o << "<tr><td>noise floor</td><td></td><td></td><td></td><td>worst of the float runs that should agree</td><td>"
          << cell(w.value("kl_mean", json(nullptr))) << "</td><td>" << cell(w.value("top1", json(nullptr))) << "</td><td>"
          << cell(w.value("one_minus_tv", json(nullptr))) << "</td><td>" << cell(w.value("ppl_delta", json(nullptr))) << "</td></tr>\n";
      }
      o << "</table>\n<h2>Gates and mutation proof</h2>\n";
    }
    if (!in.signoff.contains("policy")) o << "<h2>Verdicts</h2>\n";
    o << "<table><tr><th>format</th><th>verdict</th><th>gates p/f/s</th><th>mutants killed/survived/not run</th><th>reasons</th></tr>\n";
    for (const auto& v : in.signoff.value("verdicts", json::array())) {
      std::string reasons;
      for (const auto& r : v.value("reasons", json::array())) reasons += (reasons.empty() ? "" : "; ") + r.get<std::string>();
      const auto& g = field(v, "gates");
      const auto& mu = field(v, "mutation");
      o << "<tr><td>" << html_escape(v.value("format", "")) << "</td><td class=\"" << v.value("verdict", "") << "\">" << v.value("verdict", "")
        << "</td><td>" << int_field(g, "passed") << "/" << int_field(g, "failed") << "/" << int_field(g, "skipped") << "</td><td>"
        << mu.value("killed", json::array()).size() << "/" << mu.value("survived", json::array()).size() << "/"
        << mu.value("not_run", json::array()).size() << "</td><td>" << html_escape(reasons) << "</td></tr>\n";
    }
    o << "</table>\n";
  }
  if (in.matrix.is_object()) {
    o << "<p><em>" << html_escape(in.matrix.value("subject_note", "")) << "</em></p>\n";
    o << "<h2>Formats against f32</h2>\n<table><tr><th>format</th><th>effective</th><th>B/token</th><th>KL mean</th><th>KL p99</th><th>top-1</th>"
         "<th>needle</th><th>counting</th><th>echo</th><th>same greedy output as f32 (n/c/e)</th></tr>\n";
    for (const auto& f : in.matrix.value("formats", json::array())) {
      const auto& p = f.value("probes", json::object());
      auto pe = [&](const char* k, const char* key) { return p.contains(k) ? cell(field(field(p, k), key), "%.2f") : std::string("–"); };
      o << "<tr><td>" << html_escape(f.value("format", "")) << "</td><td>" << html_escape(f.value("effective", "")) << "</td><td>"
        << cell(field(f, "kv_bytes_per_token")) << "</td><td>" << cell(field(f, "kl_mean")) << "</td><td>" << cell(field(f, "kl_p99")) << "</td><td>"
        << cell(field(f, "top1")) << "</td><td>" << pe("needle", "exact") << "</td><td>" << pe("counting", "exact") << "</td><td>"
        << pe("echo", "exact") << "</td><td>" << pe("needle", "same_as_f32") << " / " << pe("counting", "same_as_f32") << " / "
        << pe("echo", "same_as_f32") << "</td></tr>\n";
    }
    o << "</table>\n";
  }
  o << "<h2>Plots</h2>\n";
  if (!have_js) o << "<p>Plots need the vendored Vega bundles (npm ci in reports/web); this page was written without them.</p>\n";
  for (const auto& [id, spec] : specs) o << "<div class=\"plot\" id=\"plot-" << id << "\"></div>\n";
  if (in.gates.is_object()) {
    o << "<h2>Gates</h2>\n<table><tr><th>format</th>";
    const char* fams[] = {"ENV", "INV", "ORA", "PAR", "STO", "MOD", "PRB"};
    for (const char* f : fams) o << "<th>" << f << "</th>";
    o << "</tr>\n";
    const json per_format = in.gates.value("per_format", json::object());
    for (const auto& [fmt, per] : per_format.items()) {
      o << "<tr><td>" << html_escape(fmt) << "</td>";
      for (const char* f : fams) {
        if (!per.contains(f)) {
          o << "<td>–</td>";
          continue;
        }
        const auto& c = per[f];
        const long long p = int_field(c, "passed"), fl = int_field(c, "failed"), sk = int_field(c, "skipped");
        o << "<td class=\"" << (fl ? "FAIL" : p ? "PASS" : "NOT-VALIDATED") << "\">" << (fl ? "FAIL " + std::to_string(fl) + "/" + std::to_string(p + fl) : p ? "ok " + std::to_string(p) : "skip " + std::to_string(sk)) << "</td>";
      }
      o << "</tr>\n";
    }
    o << "</table>\n<details><summary>every gate</summary><table><tr><th>gate</th><th>formats</th><th>status</th><th>message</th></tr>\n";
    for (const auto& g : in.gates.value("gates", json::array())) {
      std::string fm;
      for (const auto& x : g.value("formats", json::array())) fm += (fm.empty() ? "" : ",") + x.get<std::string>();
      o << "<tr><td>" << html_escape(g.value("id", "")) << "</td><td>" << html_escape(fm) << "</td><td>" << g.value("status", "") << "</td><td>"
        << html_escape(g.value("message", "").substr(0, 200)) << "</td></tr>\n";
    }
    o << "</table></details>\n";
  }
  const CoverageView cv = coverage_view(in.signoff);
  if (cv.present) {
    o << "<h2>Coverage of the shipped code by the gate suite</h2>\n<p>" << html_escape(cv.headline) << "</p>\n";
    if (!cv.parts.empty()) {
      o << "<table><tr><th>part</th><th>what</th><th>files</th><th>lines reached</th><th>lines</th><th>branches</th></tr>\n";
      for (const auto& r : cv.parts) {
        o << "<tr>";
        for (const auto& x : r) o << "<td>" << html_escape(x) << "</td>";
        o << "</tr>\n";
      }
      o << "</table>\n";
    }
    if (!cv.unreached.empty()) {
      o << "<details><summary>runtime/ files with unreached lines</summary><table><tr><th>file</th><th>unreached</th><th>lines</th>"
           "<th>unreached line numbers</th></tr>\n";
      for (const auto& r : cv.unreached) {
        o << "<tr>";
        for (const auto& x : r) o << "<td>" << html_escape(x) << "</td>";
        o << "</tr>\n";
      }
      o << "</table></details>\n";
    }
    o << "<p>" << html_escape(cv.provenance) << "</p>\n";
  }
  o << "<div id=\"kvgate-errors\"></div>\n";
  json all = json::object();
  for (const auto& [id, spec] : specs) all["plot-" + id] = spec;
  o << "<script>\n(function(){var specs=" << script_safe(all.dump(-1, ' ', true, json::error_handler_t::replace)) << ";\n"
    << "var done=0,ids=Object.keys(specs);\n"
    << "function finish(){document.body.setAttribute('data-rendered',String(done));document.body.setAttribute('data-plots',String(ids.length));"
       "document.getElementById('kvgate-errors').textContent=window.kvgateErrors.join('\\n');}\n"
    << "if(typeof vegaEmbed!=='function'){finish();return;}\n"
    << "Promise.all(ids.map(function(id){return vegaEmbed('#'+id,specs[id],{renderer:'svg',actions:false}).then(function(){done++;});}))"
       ".catch(function(e){window.kvgateErrors.push(String(e));}).then(finish);\n"
    << "})();\n</script>\n</body></html>\n";
  return o.str();
}

std::vector<std::string> write_report(const ReportInputs& in, const std::string& out_dir, const std::string& web_dir, std::string* warning) {
  std::filesystem::create_directories(out_dir);
  std::vector<std::string> files;
  auto put = [&](const std::string& name, const std::string& text) {
    const auto p = (std::filesystem::path(out_dir) / name).string();
    write_file_atomic(p, text);
    files.push_back(p);
  };
  put("index.md", index_markdown(in));
  std::set<std::string> fmts;
  if (in.signoff.is_object())
    for (const auto& v : in.signoff.value("verdicts", json::array())) fmts.insert(v.value("format", ""));
  if (in.matrix.is_object())
    for (const auto& f : in.matrix.value("formats", json::array())) fmts.insert(f.value("format", ""));
  for (const auto& f : fmts) put(file_name_for(f) + ".md", format_markdown(in, f));
  put("report.html", html_page(in, web_dir, warning));
  return files;
}

}  // namespace kvgate::reports
