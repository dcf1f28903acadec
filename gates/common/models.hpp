// Where gates find the shared test models (stories260K, ...): kvgate/model_paths.hpp, from the
// source tree the gate runs in. A missing model is a failure that says where it looked, never a
// silent skip. Also stories260K's verified greedy output.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kvgate/build_paths.hpp"
#include "kvgate/model_paths.hpp"

namespace kvgate::gates {

// stories260K's verified greedy output (README.md of stories260K: `run stories260K.bin -z
// tok512.bin -t 0.0 -n 64`): the CPU gates (gates/engine) and the GPU gates (gates/cuda) compare to it.
inline const std::vector<int> kStories260KGreedy64 = {
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408,
    419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426,
    338, 391, 266, 267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310};
inline constexpr const char* kStories260KGreedyText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a "
    "big, red ball. She wanted to play with it, but it was too high.\nLily";

// The source tree the gate runs in: $KVGATE_SOURCE_DIR (ctest sets it), else the tree it was
// built from (KVGATE_SOURCE_DIR_DEFAULT, when given).
inline std::string gate_source_dir() {
  if (const char* s = std::getenv("KVGATE_SOURCE_DIR"); s && *s) return s;
#ifdef KVGATE_SOURCE_DIR_DEFAULT
  return KVGATE_SOURCE_DIR_DEFAULT;
#else
  return {};
#endif
}

using kvgate::ModelLookup;

// Finds <rel> (e.g. "stories260K/stories260K.bin") with kvgate::find_model (kvgate/model_paths.hpp).
inline ModelLookup find_model(const std::string& rel) {
  ModelLookup r = kvgate::find_model(rel, gate_source_dir());
  if (!r.found()) r.message = "test " + r.message + " Or run through ctest (which sets KVGATE_SOURCE_DIR).";
  return r;
}

}  // namespace kvgate::gates
