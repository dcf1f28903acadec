// A fresh temporary folder for a gate's files ($TMPDIR, else /tmp; mkdtemp), removed with everything
// in it when the object goes out of scope. The one implementation behind the gates' temp folders.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace kvgate::gates {

class ScratchDir {
 public:
  // `prefix` names the folder ("kvgate-par" -> /tmp/kvgate-par.AbC123).
  explicit ScratchDir(const std::string& prefix) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + prefix + ".XXXXXX";
    if (!::mkdtemp(tmpl.data()))
      throw std::runtime_error("gate scratch folder: mkdtemp failed for " + tmpl + " (set TMPDIR to a writable folder)");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::string sub(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace kvgate::gates
