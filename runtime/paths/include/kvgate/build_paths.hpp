// The absolute paths of the build a program comes from. CMake's kvgate_build_paths(<target> ...)
// (cmake/KvgateHelpers.cmake) defines them in one generated file per target and defines the
// target's path macros (KVGATE_SOURCE_DIR_DEFAULT, KVGATE_CLI_BIN, ...) as calls of these functions,
// so that no other compile command carries an absolute path and ccache reuses those objects in a
// fresh clone or the mutation driver's scratch copy. A file that uses such a macro includes this.
#pragma once

namespace kvgate::build_paths {
const char* source_dir();  // the source tree (CMake's PROJECT_SOURCE_DIR)
const char* cli_bin();     // the kvgate binary (only in targets that ask for CLI_BIN)
const char* binary_dir();  // the target's build folder (only in targets that ask for BINARY_DIR)
}  // namespace kvgate::build_paths
