#include "kvgate_mutations/gate_files.hpp"

#include <algorithm>
#include <sstream>

#include "kvgate_mutations/catalog.hpp"
#include "kvgate_mutations/ninja_deps.hpp"
#include "kvgate_mutations/process.hpp"
#include "kvgate_mutations/scratch.hpp"

namespace kvgate::mutate {

namespace fs = std::filesystem;

GateFiles::GateFiles(const fs::path& build_dir) {
  const fs::path list = build_dir / "gates" / "gate_closure.txt";
  std::error_code ec;
  if (!fs::exists(list, ec)) return;
  std::istringstream in(read_text(list));
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string x; std::getline(ls, x, '\t');) f.push_back(x);
    if (f.size() == 2 && f[0] == "root") root_ = fs::path(f[1]).lexically_normal();
    if (f.size() != 3) continue;
    if (f[0] == "gate") closure_[f[1]].insert(f[2]);
    if (f[0] == "source") files_[f[1]].insert(rel_inside(f[2], root_));
    if (f[0] == "dir") {
      const std::string d = rel_inside(f[2], root_);
      if (!d.empty()) dirs_[f[1]].push_back(d);
    }
  }
  loaded_ = !root_.empty();
  if (!loaded_ || !fs::exists(build_dir / "build.ninja", ec)) return;
  // Headers: ninja's deps log (ninja_deps.hpp), each object's files under its CMake target.
  for (const NinjaDeps& d : read_ninja_deps(build_dir, root_)) {
    // "<dir>/CMakeFiles/<target>.dir/<source>.o" (no <dir>/ for the top folder's targets)
    const std::string& o = d.object;
    std::size_t pos = o.rfind("CMakeFiles/", 0) == 0 ? 0 : o.find("/CMakeFiles/");
    if (pos == std::string::npos) continue;
    pos = o.find("CMakeFiles/", pos) + 11;
    const auto dot = o.find(".dir/", pos);
    if (dot == std::string::npos) continue;
    const std::string target = o.substr(pos, dot - pos);
    built_.insert(target);
    files_[target].insert(d.files.begin(), d.files.end());
  }
}

std::vector<std::string> GateFiles::gate_programs() const {
  std::vector<std::string> g;
  for (const auto& [k, _] : closure_) g.push_back(k);
  return g;
}

std::vector<std::string> GateFiles::gates_compiling(const std::string& file, const std::vector<std::string>& gates) const {
  std::vector<std::string> out;
  const std::string f = fs::path(file).lexically_normal().generic_string();
  for (const auto& [gate, targets] : closure_) {
    if (!gates.empty() && std::find(gates.begin(), gates.end(), gate) == gates.end()) continue;
    bool hit = false;
    for (const auto& t : targets) {
      if (const auto it = files_.find(t); it != files_.end() && it->second.count(f)) hit = true;
      if (!hit && !built_.count(t))
        if (const auto it = dirs_.find(t); it != dirs_.end())
          for (const auto& d : it->second) hit = hit || f.rfind(d + "/", 0) == 0;
      if (hit) break;
    }
    if (hit) out.push_back(gate);
  }
  return out;
}

}  // namespace kvgate::mutate
