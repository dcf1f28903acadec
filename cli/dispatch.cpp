#include <map>

#include "commands.hpp"

namespace kvgate::cli {

namespace {
std::map<CLI::App*, std::function<int()>>& actions() {
  static std::map<CLI::App*, std::function<int()>> a;
  return a;
}
}  // namespace

void on_run(CLI::App* sub, std::function<int()> action) { actions()[sub] = std::move(action); }

int run_selected(CLI::App& app) {
  for (auto& [sub, action] : actions())
    if (sub->parsed()) return action();
  return 2;
}

}  // namespace kvgate::cli
