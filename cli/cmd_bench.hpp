// Helpers of cmd_bench.cpp shared by `kvgate signoff` and `kvgate field-report`.
#pragma once
#include <functional>
#include <string>

#include "kvgate/matrix.hpp"

namespace kvgate::cli {
std::function<void(const std::string&)> progress_printer(const std::string& prefix);
void progress_done();
// Quick/full matrix defaults for a model, with the committed KL corpus when present.
matrix::MatrixOptions bench_options_from(const Model& model, bool quick, const std::string& source_dir);
}  // namespace kvgate::cli
