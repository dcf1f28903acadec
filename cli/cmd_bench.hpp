// Helpers of cmd_bench.cpp shared by `kvgate signoff` and `kvgate field-report`.
#pragma once
#include <functional>
#include <optional>
#include <string>

#include "kvgate/matrix.hpp"

namespace kvgate::cli {
std::function<void(const std::string&)> progress_printer(const std::string& prefix);
void progress_done();
// Quick/full matrix defaults for a model, with the committed KL corpus when present.
matrix::MatrixOptions bench_options_from(const Model& model, bool quick, const std::string& source_dir);
// The subject of the needle/counting/echo probes: --probe-model PATH, 'none' (the matrix model), or
// by default datasets/models/probe when present. Loads it into `holder`, points mo at it and sets the
// probe defaults for its context.
void load_probe_subject(const std::string& flag, const std::string& source_dir, bool quick, matrix::MatrixOptions& mo,
                        std::optional<Model>& holder);
}  // namespace kvgate::cli
