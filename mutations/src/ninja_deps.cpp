#include "kvgate_mutations/ninja_deps.hpp"

#include <sstream>

#include "kvgate_mutations/process.hpp"

namespace kvgate::mutate {

namespace fs = std::filesystem;

std::string rel_inside(const fs::path& p, const fs::path& root) {
  const fs::path r = p.lexically_normal().lexically_relative(root);
  if (r.empty() || *r.begin() == "..") return {};
  return r.generic_string();
}

std::vector<NinjaDeps> read_ninja_deps(const fs::path& build, const fs::path& root) {
  std::vector<NinjaDeps> out;
  const auto [rc, text] = capture_output({"ninja", "-C", build.string(), "-t", "deps"});
  if (rc != 0) return out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (line[0] != ' ') {
      const auto colon = line.find(": #deps");
      out.push_back({colon == std::string::npos ? std::string() : line.substr(0, colon), {}});
      continue;
    }
    if (out.empty() || out.back().object.empty()) continue;
    const fs::path dep(line.substr(line.find_first_not_of(' ')));
    const std::string r = rel_inside(dep.is_absolute() ? dep : build / dep, root);
    if (!r.empty()) out.back().files.push_back(r);
  }
  std::erase_if(out, [](const NinjaDeps& d) { return d.object.empty(); });
  return out;
}

}  // namespace kvgate::mutate
