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

// stories260K's verified greedy output (README.md of stories260K: `run stories260K.bin -z
// tok512.bin -t 0.0 -n 64`): the CPU gates (gates/model) and the GPU gates (gates/cuda) compare to it.
inline const std::vector<int> kStories260KGreedy64 = {
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408,
    419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426,
    338, 391, 266, 267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310};
inline constexpr const char* kStories260KGreedyText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a "
    "big, red ball. She wanted to play with it, but it was too high.\nLily";

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
