// kvgate: thin front that wires subcommands to the libraries.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvgate: verification and benchmark harness for quantized LLM KV caches"};
  app.require_subcommand(1);
  kvgate::cli::register_formats(app);
  kvgate::cli::register_gate(app);
  kvgate::cli::register_synth(app);
  kvgate::cli::register_run(app);
  kvgate::cli::register_logits(app);
  kvgate::cli::register_chat(app);
  kvgate::cli::register_mutate(app);
  kvgate::cli::register_probe(app);
  kvgate::cli::register_bench(app);
  kvgate::cli::register_report(app);
  kvgate::cli::register_signoff(app);
  kvgate::cli::register_field_report(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return kvgate::cli::run_selected(app);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvgate: error: %s\n", e.what());
    return 1;
  }
}
