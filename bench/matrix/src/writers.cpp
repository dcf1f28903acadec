// Matrix outputs: canonical JSON (sorted keys, 2-space indent), JSONL and CSV (one line per row),
// Markdown (a format summary and the timing rows).
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "kvgate/atomic_file.hpp"
#include "kvgate/matrix.hpp"

namespace kvgate::matrix {

namespace {

const std::vector<std::string> kCsvColumns = {
    "format", "effective", "fallback_reason", "device", "context", "window", "status", "reason",
    "kv_bytes_per_token", "kv_bytes_vs_f32", "pool_bytes", "capacity_tokens", "budget_bytes", "ttft_cold_ms",
    "ttft_warm_ms", "prefill_tok_s", "decode_tok_s", "decode_vs_f32", "decode_steps", "kl_mean", "kl_p99", "top1",
    "needle_exact", "needle_same_as_f32", "counting_exact", "counting_same_as_f32", "counting_repeated", "echo_exact",
    "echo_same_as_f32", "echo_dropped_digits", "kv_block_lookups", "kv_block_misses"};
const std::vector<std::string> kProvColumns = {"git_commit", "cpu_model", "cpu_cores", "gpu", "gpu_driver", "cuda_version",
                                               "compiler", "cxx_flags", "seed", "threads", "model_sha256"};

std::string cell(const nlohmann::json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_float()) {
    char b[32];
    std::snprintf(b, sizeof b, "%.6g", v.get<double>());
    return b;
  }
  return v.dump();
}

std::string csv_quote(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string md(const nlohmann::json& v, const char* fmt = "%.3g") {
  if (v.is_null()) return "–";
  if (v.is_number_float()) {
    char b[32];
    std::snprintf(b, sizeof b, fmt, v.get<double>());
    return b;
  }
  return cell(v);
}

std::string pct(const nlohmann::json& v) {
  if (!v.is_number()) return "–";
  char b[16];
  std::snprintf(b, sizeof b, "%.0f%%", 100.0 * v.get<double>());
  return b;
}

}  // namespace

std::string rows_jsonl(const nlohmann::json& m) {
  std::string out;
  for (const auto& r : m.at("rows")) out += r.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  return out;
}

std::string rows_csv(const nlohmann::json& m) {
  std::ostringstream o;
  bool first = true;
  for (const auto& c : kCsvColumns) o << (first ? "" : ",") << c, first = false;
  for (const auto& c : kProvColumns) o << "," << c;
  o << "\n";
  for (const auto& r : m.at("rows")) {
    first = true;
    for (const auto& c : kCsvColumns) o << (first ? "" : ",") << csv_quote(cell(r.value(c, nlohmann::json(nullptr)))), first = false;
    const auto& p = r.value("provenance", nlohmann::json::object());
    for (const auto& c : kProvColumns) o << "," << csv_quote(cell(p.value(c, nlohmann::json(nullptr))));
    o << "\n";
  }
  return o.str();
}

const std::vector<RowColumn>& row_columns() {
  static const std::vector<RowColumn> c{
      {"format", "format", "", false, "the KV format the row ran"},
      {"device", "device", "", false, "cpu or cuda"},
      {"context", "context", "", false, "tokens of context before the timed decode"},
      {"window", "window", "", false, "resident window in tokens (0: the whole context is resident)"},
      {"status", "status", "", false, "ok, or why the row did not run (with the reason)"},
      {"pool bytes", "pool_bytes", "", false, "bytes of the paged KV pool"},
      {"KV held bytes", "kv_bytes", "", false,
       "KV bytes the sequence holds after the row's run: below context x B/token when the pages outside every "
       "layer's attention window went back to the pool"},
      {"TTFT cold ms", "ttft_cold_ms", "%.2f", true, "time to the first token from an empty cache"},
      {"TTFT warm ms", "ttft_warm_ms", "%.2f", true, "a second turn after the context was restored from a KV file"},
      {"prefill tok/s", "prefill_tok_s", "%.0f", true, "prefill throughput"},
      {"decode tok/s", "decode_tok_s", "%.0f", true, "decode throughput"},
      {"decode vs f32", "decode_vs_f32", "%.2f", false, "decode tok/s over the f32 row's at the same device, context and window"},
  };
  return c;
}

std::string rows_markdown(const nlohmann::json& rows, const RowTable& t) {
  std::vector<const RowColumn*> cols;
  if (t.keys.empty())
    for (const auto& c : row_columns()) cols.push_back(&c);
  for (const auto& k : t.keys) {
    const RowColumn* hit = nullptr;
    for (const auto& c : row_columns()) hit = k == c.key ? &c : hit;
    if (!hit) throw std::invalid_argument("rows_markdown: no matrix row column '" + k + "' (row_columns() lists them)");
    cols.push_back(hit);
  }
  auto right = [](const RowColumn& c) {
    const std::string k = c.key;
    return k != "format" && k != "device" && k != "status";
  };
  std::ostringstream o;
  o << "|";
  for (const auto* c : cols) o << " " << c->header << " |";
  o << "\n|";
  for (const auto* c : cols) o << (right(*c) ? "---:|" : "---|");
  o << "\n";
  for (const auto& r : rows) {
    if (!t.format.empty() && r.value("format", "") != t.format) continue;
    o << "|";
    for (const auto* c : cols) {
      const nlohmann::json v = r.value(c->key, nlohmann::json(nullptr));
      std::string s = *c->printf ? md(v, c->printf) : v.is_null() ? std::string("–") : cell(v);
      if (std::string(c->key) == "status" && !r.value("reason", "").empty()) s += " (" + r.value("reason", "") + ")";
      for (auto& ch : s)
        if (ch == '|' || ch == '\n') ch = ' ';
      o << " " << s << " |";
    }
    o << "\n";
  }
  return o.str();
}

std::string matrix_markdown(const nlohmann::json& m) {
  std::ostringstream o;
  const auto& p = m.at("provenance");
  o << "# kvgate bench: KV format matrix\n\n";
  const auto& model = p.value("model", nlohmann::json(nullptr));
  if (model.is_object())
    o << "Model `" << model.value("name", "") << "` (fingerprint `" << model.value("fingerprint", "") << "`, sha256 `"
      << model.value("sha256", "").substr(0, 16) << "…`). ";
  // Outside a git work tree (an installed kvgate, an unpacked release, a scratch copy) the
  // provenance holds null for both: say so instead of reading null as a bool.
  const CommitStamp stamp = commit_stamp(p);
  if (stamp.known())
    o << "Commit `" << stamp.commit.substr(0, 12) << (stamp.dirty ? "` (dirty)" : "`");
  else
    o << "Commit: none (not a git work tree)";
  o << ", CPU " << p.value("cpu_model", "") << " ("
    << p.value("cpu_cores", 0) << " cores, " << p.value("threads", 1) << " threads)";
  std::string gpus;
  for (const auto& g : p.value("gpus", nlohmann::json::array())) gpus += (gpus.empty() ? "" : ", ") + g.value("name", "");
  o << ", GPU " << (gpus.empty() ? "none" : gpus) << ", " << p.value("compiler", "") << ", seed " << p.value("seed", 0)
    << ".\n\n";
  o << "> " << m.value("subject_note", "") << "\n\n";
  for (const auto& n : m.value("notes", nlohmann::json::array())) o << "- note: " << n.get<std::string>() << "\n";
  o << "\n## Per format (quality vs the f32 KV baseline)\n\n";
  o << "| format | effective | B/token | vs f32 | capacity @ budget | KL mean | KL p99 | top-1 | needle | counting | echo | same as f32 (n/c/e) |\n";
  o << "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  double f32_bytes = 0;
  for (const auto& f : m.at("formats"))
    if (f.value("format", "") == "f32") f32_bytes = f.value("kv_bytes_per_token", 0.0);
  for (const auto& f : m.at("formats")) {
    const auto& pr = f.value("probes", nlohmann::json::object());
    auto probe = [&](const char* k) { return pr.contains(k) ? pct(pr[k]["exact"]) : std::string("–"); };
    auto same = [&](const char* k) { return pr.contains(k) ? pct(pr[k]["same_as_f32"]) : std::string("–"); };
    std::string eff = f.value("effective", "");
    if (!f.value("fallback_reason", "").empty()) eff += " (fallback: " + f.value("fallback_reason", "") + ")";
    char ratio[16];
    std::snprintf(ratio, sizeof ratio, "%.3f", f32_bytes > 0 ? f.value("kv_bytes_per_token", 0.0) / f32_bytes : 0.0);
    o << "| " << f.value("format", "") << " | " << eff << " | " << cell(f["kv_bytes_per_token"]) << " | " << ratio << " | "
      << cell(f["capacity_tokens"]) << " | " << md(f["kl_mean"]) << " | " << md(f["kl_p99"]) << " | " << pct(f["top1"])
      << " | " << probe("needle") << " | " << probe("counting") << " | " << probe("echo") << " | " << same("needle")
      << " / " << same("counting") << " / " << same("echo") << " |\n";
  }
  if (m.contains("layer_ablation")) {
    o << "\n## Per-layer ablation (one layer in the format, the others f32; vs the f32 KV baseline)\n\n";
    o << "| format | layer | map | layer B/token | KL mean | KL p99 | top-1 |\n|---|---:|---|---:|---:|---:|---:|\n";
    for (const auto& a : m.at("layer_ablation"))
      o << "| " << a.value("format", "") << " | " << cell(a["layer"]) << " | " << a.value("map", "") << " | "
        << cell(a["layer_kv_bytes_per_token"]) << " | " << md(a["kl_mean"]) << " | " << md(a["kl_p99"]) << " | "
        << pct(a["top1"]) << " |\n";
  }
  o << "\n## Timing rows\n\n" << rows_markdown(m.at("rows"));
  o << "\nTTFT warm: a second turn of " << m["config"].value("warm_turn", 0)
    << " new tokens after the context was restored from a KV file. Single runs unless `repeats` > 1 (median): read "
       "differences of a few percent as noise.\n";
  return o.str();
}

std::vector<std::string> write_matrix(const nlohmann::json& m, const std::string& dir) {
  std::filesystem::create_directories(dir);
  const auto p = [&](const char* f) { return (std::filesystem::path(dir) / f).string(); };
  write_file_atomic(p("matrix.json"), m.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  write_file_atomic(p("matrix.jsonl"), rows_jsonl(m));
  write_file_atomic(p("matrix.csv"), rows_csv(m));
  write_file_atomic(p("matrix.md"), matrix_markdown(m));
  return {p("matrix.json"), p("matrix.jsonl"), p("matrix.csv"), p("matrix.md")};
}

}  // namespace kvgate::matrix
