#include "kvgate_mutations/compile_ahead.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <sstream>

#include "kvgate_mutations/catalog.hpp"
#include "kvgate_mutations/ninja_deps.hpp"
#include "kvgate_mutations/process.hpp"

namespace kvgate::mutate {

namespace fs = std::filesystem;

namespace {

// Every source or header (relative to `scratch`) -> the objects (relative to `build`) that depend
// on it (ninja_deps.hpp).
std::map<std::string, std::vector<std::string>> objects_by_file(const fs::path& build, const fs::path& scratch) {
  std::map<std::string, std::vector<std::string>> out;
  for (const NinjaDeps& d : read_ninja_deps(build, scratch))
    if (d.object.ends_with(".o"))
      for (const std::string& f : d.files) out[f].push_back(d.object);
  return out;
}

}  // namespace

std::string CompileAhead::retarget(const std::string& command, const std::string& from, const std::string& to) {
  if (from.empty()) return command;
  std::string out;
  std::size_t pos = 0;
  for (;;) {
    const std::size_t hit = command.find(from, pos);
    if (hit == std::string::npos) break;
    const std::size_t end = hit + from.size();
    const bool path_end = end == command.size() || command[end] == '/' || command[end] == ' ' ||
                          command[end] == '"' || command[end] == '\'' || command[end] == '\\';
    out.append(command, pos, hit - pos);
    out += path_end ? to : from;
    pos = end;
  }
  out.append(command, pos, std::string::npos);
  return out;
}

CompileAhead::CompileAhead(fs::path scratch, fs::path build, std::vector<std::pair<std::string, std::string>> build_env,
                           std::vector<AheadJob> jobs, int workers, int nice)
    : scratch_(std::move(scratch)), build_(std::move(build)), jobs_(std::move(jobs)), nice_(nice) {
  done_.assign(jobs_.size(), 0);
  running_.assign(jobs_.size(), 0);
  stats_.jobs = static_cast<int>(jobs_.size());
  if (jobs_.empty()) {
    stats_.disabled = "no patch-and-rebuild mutant to compile";
    return;
  }
  if (rel_inside(build_, scratch_).empty()) {  // the copy mirrors the build's place in the scratch
    stats_.disabled = "the build folder is outside the scratch tree (--build-dir): not compiled ahead";
    return;
  }
  const std::size_t n = static_cast<std::size_t>(std::clamp(workers, 1, 8));
  for (std::size_t w = 0; w < n; ++w) {
    const fs::path side =
        scratch_.parent_path() / (scratch_.filename().string() + ".ahead" + (w == 0 ? std::string() : std::to_string(w)));
    // The copy of the sources, taken now while the scratch is unpatched: every file outside the
    // build folder, rewritten only where its bytes differ.
    std::error_code ec;
    fs::create_directories(side, ec);
    for (auto it = fs::recursive_directory_iterator(scratch_, ec); it != fs::recursive_directory_iterator(); ++it) {
      const fs::path& p = it->path();
      if (it->is_directory() && (p == build_ || p.filename() == ".git")) {
        it.disable_recursion_pending();
        continue;
      }
      if (!it->is_regular_file()) continue;
      const fs::path dst = side / fs::relative(p, scratch_);
      std::error_code e2;
      if (fs::exists(dst, e2) && fs::file_size(dst, e2) == it->file_size() && read_text(dst) == read_text(p)) continue;
      fs::create_directories(dst.parent_path(), e2);
      fs::copy_file(p, dst, fs::copy_options::overwrite_existing, e2);
    }
    auto env = build_env;
    for (auto& [k, v] : env)
      if (k == "CCACHE_BASEDIR" && fs::path(v).lexically_normal() == scratch_.lexically_normal()) v = side.string();
    sides_.push_back(side);
    envs_.push_back(std::move(env));
  }
  for (std::size_t w = 0; w < n; ++w) workers_.emplace_back([this, w] { work(w); });
}

CompileAhead::~CompileAhead() { stop(); }

void CompileAhead::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
}

bool CompileAhead::reach(const std::string& id) {
  std::unique_lock<std::mutex> lk(mu_);
  std::size_t k = 0;
  while (k < jobs_.size() && jobs_[k].id != id) ++k;
  if (k == jobs_.size()) return false;
  reached_ = std::max(reached_, k + 1);
  const auto t0 = std::chrono::steady_clock::now();
  cv_.wait(lk, [&] { return running_[k] == 0; });
  stats_.waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (next_ <= k) {  // not started (nor those before it): the worker goes on after it
    stats_.passed += static_cast<int>(k + 1 - next_);
    next_ = k + 1;
  }
  return done_[k] != 0;
}

AheadStats CompileAhead::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void CompileAhead::work(std::size_t w) {
  const fs::path& side = sides_[w];
  const auto& env = envs_[w];
  const auto map = objects_by_file(build_, scratch_);
  std::map<std::string, std::string> commands;  // object -> its compile command in this copy
  const auto command_of = [&](const std::string& object) -> std::string {
    if (const auto it = commands.find(object); it != commands.end()) return it->second;
    const auto [rc, text] = capture_output({"ninja", "-C", build_.string(), "-t", "commands", "-s", object});
    std::string cmd = rc == 0 ? text.substr(0, text.find('\n')) : std::string();
    // Only a ccache compile helps, and only one without debug info (ccache hashes the working
    // folder then, which differs in the copy).
    if (cmd.find("ccache") == std::string::npos || cmd.find(" -g") != std::string::npos) cmd.clear();
    return commands[object] = retarget(cmd, scratch_.string(), side.string());
  };
  for (;;) {
    std::size_t k;
    {
      std::unique_lock<std::mutex> lk(mu_);
      next_ = std::max(next_, reached_);
      if (stop_ || next_ >= jobs_.size()) return;
      k = next_++;
      running_[k] = 1;
    }
    const AheadJob& job = jobs_[k];
    bool all = true;
    int compiled = 0, failed = 0;
    double secs = 0;
    bool disabled = false;
    const auto it = map.find(fs::path(job.file).lexically_normal().generic_string());
    const fs::path file = side / job.file;
    std::string original;
    std::error_code ec;
    std::string error;
    if (it != map.end() && fs::exists(file, ec)) try {
      original = read_text(file);
      write_text(file, job.text);
      for (const auto& object : it->second) {
        {
          std::lock_guard<std::mutex> lk(mu_);
          if (stop_ || reached_ > k + 1) break;  // the driver went past it: the rest is waste
        }
        const std::string cmd = command_of(object);
        if (cmd.empty()) {
          disabled = true;
          all = false;
          continue;
        }
        fs::create_directories((side / fs::relative(build_, scratch_) / object).parent_path(), ec);
        const ProcResult r = run_process({{"nice", "-n", std::to_string(nice_), "/bin/sh", "-c", cmd},
                                          (side / fs::relative(build_, scratch_)).string(), env, "", 600});
        secs += r.seconds;
        ++compiled;
        if (!r.ok()) {
          ++failed;
          all = false;
        }
      }
      write_text(file, original);
    } catch (const std::exception& ex) {  // a copy it cannot read or write: this worker stops
      error = ex.what();
      all = false;
    } else {
      all = false;  // a file no object depends on (a script the gates read): nothing to compile
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error.empty()) {
        stats_.disabled = "a compile-ahead worker stopped: " + error;
        running_[k] = 0;
        cv_.notify_all();
        return;
      }
      stats_.objects += compiled;
      stats_.failed += failed;
      stats_.seconds += secs;
      if (disabled && stats_.disabled.empty())
        stats_.disabled = "some objects are not compiled through ccache, or with -g: not compiled ahead";
      if (all && compiled > 0) {
        done_[k] = 1;
        stats_.compiled += 1;
      }
      running_[k] = 0;
    }
    cv_.notify_all();
  }
}

}  // namespace kvgate::mutate
