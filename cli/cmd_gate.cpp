// `kvgate gate`: runs the gate programs, prints a per-format summary (per family: passed /
// failed / skipped) and optionally writes it as JSON. Non-zero exit on any failure.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "commands.hpp"
#include "gate_runner.hpp"
#include "kvgate/atomic_file.hpp"

namespace kvgate::cli {

namespace {

struct GateOpts {
  std::string gates_dir, json_path, junit_path, format, families;
  bool list = false;
};

std::string default_gates_dir() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("build/gates") : (self.parent_path() / "gates").string();
}

std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

int run_gate(const GateOpts& o) {
  gates::GateRunOptions opt;
  opt.gates_dir = o.gates_dir.empty() ? default_gates_dir() : o.gates_dir;
  if (!o.format.empty()) opt.tag_filter = "[fmt:" + o.format + "]";
  opt.families = split_csv(o.families);
  const auto results = gates::run_gates(opt, true);
  if (results.empty()) {
    std::fprintf(stderr, "kvgate gate: no gate matched (format '%s', families '%s')\n", o.format.c_str(),
                 o.families.c_str());
    return 2;
  }
  const auto summary = gates::summarize(results);
  if (o.list) {
    for (const auto& r : results) std::printf("%-8s %-28s %s\n", r.status.c_str(), r.id.c_str(), r.name.c_str());
  }
  std::printf("\n%-22s", "format");
  const char* fams[] = {"ENV", "INV", "ORA", "PAR", "STO", "MOD", "PRB"};
  for (const char* f : fams) std::printf(" %-9s", f);
  std::printf("\n");
  for (const auto& [fmt, per_family] : summary["per_format"].items()) {
    std::printf("%-22s", fmt.c_str());
    for (const char* f : fams) {
      if (!per_family.contains(f)) {
        std::printf(" %-9s", "-");
        continue;
      }
      const auto& c = per_family[f];
      char cell[32];
      if (c["failed"].get<int>() > 0) std::snprintf(cell, sizeof cell, "FAIL%d/%d", c["failed"].get<int>(), c["passed"].get<int>() + c["failed"].get<int>());
      else if (c["passed"].get<int>() == 0) std::snprintf(cell, sizeof cell, "skip%d", c["skipped"].get<int>());
      else std::snprintf(cell, sizeof cell, "ok%d", c["passed"].get<int>());
      std::printf(" %-9s", cell);
    }
    std::printf("\n");
  }
  const auto& t = summary["totals"];
  std::printf("\ngates: %d passed, %d failed, %d skipped\n", t["passed"].get<int>(), t["failed"].get<int>(),
              t["skipped"].get<int>());
  for (const auto& r : results)
    if (r.status == "failed") std::printf("FAILED %s (%s): %s\n", r.id.c_str(), r.executable.c_str(), r.message.c_str());
    else if (r.status == "skipped") std::printf("SKIPPED %s: %s\n", r.id.c_str(), r.message.c_str());
  if (!o.json_path.empty()) write_file_atomic(o.json_path, summary.dump(2) + "\n");
  if (!o.junit_path.empty()) write_file_atomic(o.junit_path, gates::junit_of_gates(results));
  return t["failed"].get<int>() > 0 ? 1 : 0;
}

}  // namespace

void register_gate(CLI::App& app) {
  auto o = std::make_shared<GateOpts>();
  auto* sub = app.add_subcommand("gate", "Run the gates (CPU; CUDA gates skip without a device) and summarize per format");
  sub->add_option("--gates-dir", o->gates_dir, "folder with the gate_* programs (default: <kvgate dir>/gates)");
  sub->add_option("--format", o->format, "only gates tagged [fmt:<name>]");
  sub->add_option("--family", o->families, "only these families, comma-separated (ENV,INV,ORA,PAR,STO,MOD,PRB)");
  sub->add_option("--json", o->json_path, "write the summary as JSON to this file (atomically)");
  sub->add_option("--junit", o->junit_path,
                  "write JUnit XML to this file (atomically): one testcase per gate, a failed gate's output in its "
                  "<failure>");
  sub->add_flag("--list", o->list, "print every gate with its status");
  on_run(sub, [o] { return run_gate(*o); });
}

}  // namespace kvgate::cli
