#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace kvgate::cli {

// Each register_* adds one subcommand and remembers its action; run_selected runs the parsed one.
void register_formats(CLI::App& app);
void register_gate(CLI::App& app);
void register_synth(CLI::App& app);
void register_run(CLI::App& app);
void register_logits(CLI::App& app);
void register_chat(CLI::App& app);
void register_mutate(CLI::App& app);
void register_probe(CLI::App& app);
void register_bench(CLI::App& app);
void register_report(CLI::App& app);
void register_signoff(CLI::App& app);
void register_field_report(CLI::App& app);
void on_run(CLI::App* sub, std::function<int()> action);
int run_selected(CLI::App& app);

}  // namespace kvgate::cli
