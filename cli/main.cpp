// kvgate: thin front that wires subcommands to the libraries.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kv_aliases.hpp"

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
  // llama.cpp's -ctk/-ctv (two-letter short flags CLI11 cannot declare) in their long form.
  if (argc > 0) app.name(argv[0]);  // as parse(argc, argv) would
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) {  // CLI11 takes the arguments in reverse order
    const std::string a = argv[i];
    args.push_back(kvgate::cli::long_form_of_llama_short_flag(a).value_or(a));
  }
  try {
    app.parse(args);
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
