// Where gates find the shared test models (stories260K, ...): $KVGATE_MODELS, else
// $KVGATE_SOURCE_DIR/../shared/models (ctest sets KVGATE_SOURCE_DIR for every gate), else the
// source tree the gate was built from (compile definition KVGATE_SOURCE_DIR_DEFAULT, when given).
// A missing model is a failure that says where it looked, never a silent skip.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace kvgate::gates {

// Candidate model folders, in lookup order.
inline std::vector<std::string> model_dirs() {
  namespace fs = std::filesystem;
  std::vector<std::string> d;
  if (const char* m = std::getenv("KVGATE_MODELS"); m && *m) d.push_back(m);
  std::string src;
  if (const char* s = std::getenv("KVGATE_SOURCE_DIR"); s && *s) src = s;
#ifdef KVGATE_SOURCE_DIR_DEFAULT
  if (src.empty()) src = KVGATE_SOURCE_DIR_DEFAULT;
#endif
  if (!src.empty()) d.push_back((fs::path(src) / ".." / "shared" / "models").lexically_normal().string());
  return d;
}

struct ModelLookup {
  std::string path;     // the file found, or empty
  std::string message;  // when not found: what was looked for and where
  bool found() const { return !path.empty(); }
};

// Finds <rel> (e.g. "stories260K/stories260K.bin") in the first candidate folder that has it.
inline ModelLookup find_model(const std::string& rel) {
  namespace fs = std::filesystem;
  ModelLookup r;
  std::string looked;
  for (const auto& d : model_dirs()) {
    const fs::path p = fs::path(d) / rel;
    if (fs::exists(p)) {
      r.path = p.string();
      return r;
    }
    looked += (looked.empty() ? "" : ", ") + p.string();
  }
  r.message = "test model '" + rel + "' not found; looked at: " + (looked.empty() ? "(nowhere)" : looked) +
              ". Set KVGATE_MODELS to the folder that holds stories260K/, or run through ctest "
              "(which sets KVGATE_SOURCE_DIR).";
  return r;
}

}  // namespace kvgate::gates
