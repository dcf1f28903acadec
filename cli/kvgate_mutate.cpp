// kvgate-mutate: `kvgate mutate` as a program of its own -- the driver library and the
// subcommand's options (cmd_mutate.cpp), without the rest of the CLI. A fresh machine builds it
// in a few TUs (scripts/mutate-gpu.sh: the device run spends its minutes on the mutants, not on
// compiling every subcommand). `kvgate-mutate ARGS...` behaves exactly like `kvgate mutate ARGS...`.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <vector>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvgate-mutate: the mutation driver of kvgate (docs/MUTATIONS.md); same options as `kvgate mutate`"};
  app.require_subcommand(1);
  kvgate::cli::register_mutate(app);
  std::vector<char*> av{argv[0], const_cast<char*>("mutate")};
  for (int i = 1; i < argc; ++i) av.push_back(argv[i]);
  try {
    app.parse(static_cast<int>(av.size()), av.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return kvgate::cli::run_selected(app);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvgate-mutate: error: %s\n", e.what());
    return 1;
  }
}
