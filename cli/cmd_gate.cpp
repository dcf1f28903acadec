// `kvgate gate`: placeholder registered so the CLI links; implemented in the gates step.
#include "commands.hpp"
namespace kvgate::cli {
void register_gate(CLI::App& app) { (void)app; }
}  // namespace kvgate::cli
