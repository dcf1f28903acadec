// ninja's deps log (`ninja -t deps`): which files each object was compiled from, read once for the
// two places that need it (gate_files.hpp: the gate programs' sources and headers; compile_ahead.hpp:
// the objects a mutated file makes stale).
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace kvgate::mutate {

// `p` ("a/b/../c") relative to `root`, in generic form, or "" when it lies outside root.
std::string rel_inside(const std::filesystem::path& p, const std::filesystem::path& root);

struct NinjaDeps {
  std::string object;              // the log's target, as ninja names it (relative to the build folder)
  std::vector<std::string> files;  // its dependencies relative to `root`, those outside root left out
};

// The deps log of the build folder (its "<object>: #deps N, ..." lines, each followed by one
// indented dependency per line; a relative dependency is relative to the build folder). Empty when
// ninja fails (no build.ninja, no log yet).
std::vector<NinjaDeps> read_ninja_deps(const std::filesystem::path& build, const std::filesystem::path& root);

}  // namespace kvgate::mutate
