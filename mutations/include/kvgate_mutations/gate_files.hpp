// Which source files the gate programs compile: a mutant in a file that no gate target compiles
// cannot be killed (it would come back "noop"), so the catalog check refuses it by name instead.
//
// The build writes <build>/gates/gate_closure.txt (mutations/CMakeLists.txt): per gate program, the
// targets of its link closure with their sources and folders. A source file of one of those
// targets is compiled; a header is compiled when ninja's deps log records it for an object of one
// of them (exact once they are built); for a target none of whose objects is built yet, a header in
// its source or include folders counts (by location).
#pragma once
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace kvgate::mutate {

class GateFiles {
 public:
  // Reads <build>/gates/gate_closure.txt and `ninja -t deps`; loaded() is false when the build has
  // no closure file (a tree older than it, or one configured without the mutations folder).
  explicit GateFiles(const std::filesystem::path& build_dir);
  bool loaded() const { return loaded_; }
  // The gate programs that compile `file` (relative to the source tree the build was configured
  // from), restricted to `gates` when it is not empty.
  std::vector<std::string> gates_compiling(const std::string& file, const std::vector<std::string>& gates = {}) const;
  std::vector<std::string> gate_programs() const;
  const std::filesystem::path& root() const { return root_; }  // the source tree the build was configured from

 private:
  bool loaded_ = false;
  std::filesystem::path root_;                                   // the configured source tree
  std::map<std::string, std::set<std::string>> closure_;         // gate program -> targets
  std::map<std::string, std::set<std::string>> files_;           // target -> sources and deps (relative)
  std::map<std::string, std::vector<std::string>> dirs_;         // target -> folders (relative), for unbuilt targets
  std::set<std::string> built_;                                  // targets with an object in the deps log
};

}  // namespace kvgate::mutate
