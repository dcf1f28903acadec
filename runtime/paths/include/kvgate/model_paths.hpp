// The one answer to "where is the test model?" (stories260K, ...), for the gates, the benchmarks,
// the matrix, the CLI and the mutation driver. The shared models are not in the repository; they
// are looked for, in this order, in
//   1. $KVGATE_MODELS (the folder that holds stories260K/),
//   2. <source>/../shared/models (a checkout next to the shared model folder),
//   3. <source>/.models (scripts/setup.sh downloads there when neither exists).
// <source> is the kvgate source tree the caller names (gates: $KVGATE_SOURCE_DIR, which ctest sets;
// the CLI: the git work tree around the current directory). Header-only, in its own CMake target
// (kvgate::model_paths), so the mutation driver can use it without linking the runtime.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace kvgate {

// Candidate model folders, in lookup order (an empty source_dir contributes no folder).
inline std::vector<std::string> model_dirs(const std::string& source_dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> d;
  if (const char* m = std::getenv("KVGATE_MODELS"); m && *m) d.push_back(m);
  if (!source_dir.empty()) {
    d.push_back((fs::path(source_dir) / ".." / "shared" / "models").lexically_normal().string());
    d.push_back((fs::path(source_dir) / ".models").lexically_normal().string());
  }
  return d;
}

struct ModelLookup {
  std::string path;     // the file found, or empty
  std::string message;  // when not found: what was looked for, where, and how to fix it
  bool found() const { return !path.empty(); }
};

// Finds <rel> (e.g. "stories260K/stories260K.bin") in the first candidate folder that has it.
inline ModelLookup find_model(const std::string& rel, const std::string& source_dir) {
  namespace fs = std::filesystem;
  ModelLookup r;
  std::string looked;
  for (const auto& d : model_dirs(source_dir)) {
    const fs::path p = fs::path(d) / rel;
    std::error_code ec;
    if (fs::exists(p, ec)) {
      r.path = p.string();
      return r;
    }
    looked += (looked.empty() ? "" : ", ") + p.string();
  }
  r.message = "model '" + rel + "' not found; looked at: " + (looked.empty() ? "(nowhere)" : looked) +
              ". Set KVGATE_MODELS to the folder that holds " + fs::path(rel).begin()->string() + "/.";
  return r;
}

// The first candidate folder that exists (what a child process should get as $KVGATE_MODELS), or empty.
inline std::string existing_model_dir(const std::string& source_dir) {
  for (const auto& d : model_dirs(source_dir)) {
    std::error_code ec;
    if (std::filesystem::is_directory(d, ec)) return d;
  }
  return {};
}

}  // namespace kvgate
