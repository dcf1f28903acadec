#include "kvgate_mutations/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <thread>

namespace kvgate::mutate {

namespace {

volatile std::sig_atomic_t g_interrupted = 0;
struct sigaction g_old_int, g_old_term;

extern "C" void on_interrupt(int) { g_interrupted = 1; }

using Clock = std::chrono::steady_clock;

struct Running {
  pid_t pid = -1;
  Clock::time_point t0;
  double timeout_s = 0;
  bool killed_for_timeout = false;
  bool killed_for_interrupt = false;
  bool killed_for_stop = false;
};

pid_t spawn(const ProcSpec& s) {
  // Everything the child needs is prepared before fork (no allocation after it).
  std::vector<char*> argv;
  for (const auto& a : s.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    setpgid(0, 0);
    struct sigaction dfl{};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGINT, &dfl, nullptr);
    sigaction(SIGTERM, &dfl, nullptr);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    const int out = s.log_path.empty() ? open("/dev/null", O_WRONLY)
                                       : open(s.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out >= 0) {
      dup2(out, 1);
      dup2(out, 2);
    }
    if (!s.cwd.empty() && chdir(s.cwd.c_str()) != 0) {
      const char* msg = "kvgate mutate: chdir failed\n";
      (void)!write(2, msg, std::strlen(msg));
      _exit(127);
    }
    for (const auto& [k, v] : s.env) setenv(k.c_str(), v.c_str(), 1);
    execvp(argv[0], argv.data());
    const char* msg = "kvgate mutate: exec failed: ";
    (void)!write(2, msg, std::strlen(msg));
    (void)!write(2, argv[0], std::strlen(argv[0]));
    (void)!write(2, "\n", 1);
    _exit(127);
  }
  setpgid(pid, pid);  // also in the parent: no race with the first kill(-pid)
  return pid;
}

// Non-blocking: true when the child has ended (then r is filled and the child reaped). The group
// is killed while the leader is still a zombie, so the group id cannot have been reused.
bool poll_child(Running& run, ProcResult& r) {
  const double elapsed = std::chrono::duration<double>(Clock::now() - run.t0).count();
  if (!run.killed_for_timeout && !run.killed_for_interrupt && !run.killed_for_stop) {
    if (g_interrupted) {
      run.killed_for_interrupt = true;
      kill(-run.pid, SIGKILL);
    } else if (run.timeout_s > 0 && elapsed > run.timeout_s) {
      run.killed_for_timeout = true;
      kill(-run.pid, SIGKILL);
    }
  }
  siginfo_t info{};
  info.si_pid = 0;
  if (waitid(P_PID, static_cast<id_t>(run.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    if (errno == EINTR) return false;
    r.spawn_failed = true;
    return true;
  }
  if (info.si_pid == 0) return false;
  kill(-run.pid, SIGKILL);  // stray grandchildren of the gate, if any
  int st = 0;
  while (waitpid(run.pid, &st, 0) < 0 && errno == EINTR) {
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - run.t0).count();
  r.timed_out = run.killed_for_timeout;
  r.interrupted = run.killed_for_interrupt;
  r.stopped = run.killed_for_stop;
  if (WIFEXITED(st)) r.exit_code = WEXITSTATUS(st);
  if (WIFSIGNALED(st) && !run.killed_for_timeout && !run.killed_for_interrupt && !run.killed_for_stop)
    r.term_signal = WTERMSIG(st);
  if (r.exit_code == 127 && r.seconds < 0.5) {
    // exec failures report 127 from the child; keep the code, the log says why
  }
  return true;
}

}  // namespace

std::string ProcResult::describe() const {
  if (spawn_failed) return "could not start";
  if (interrupted) return "interrupted";
  if (stopped) return "stopped (an earlier result ended the run)";
  if (timed_out) return "timed out";
  if (term_signal) return std::string("killed by signal ") + std::to_string(term_signal) + " (" + strsignal(term_signal) + ")";
  return "exit " + std::to_string(exit_code);
}

std::vector<ProcResult> run_processes(const std::vector<ProcSpec>& specs, int jobs, const StopWhen& stop_when) {
  if (jobs < 1) jobs = 1;
  std::vector<ProcResult> results(specs.size());
  std::vector<std::pair<std::size_t, Running>> running;
  std::size_t next = 0;
  bool stop = false;
  while (next < specs.size() || !running.empty()) {
    while (next < specs.size() && static_cast<int>(running.size()) < jobs && !g_interrupted && !stop) {
      Running r;
      r.t0 = Clock::now();
      r.timeout_s = specs[next].timeout_s;
      r.pid = spawn(specs[next]);
      if (r.pid < 0) {
        results[next].spawn_failed = true;
      } else {
        running.emplace_back(next, r);
      }
      ++next;
    }
    if ((g_interrupted || stop) && running.empty()) {
      for (; next < specs.size(); ++next) (g_interrupted ? results[next].interrupted : results[next].stopped) = true;
      break;
    }
    bool progressed = false;
    for (std::size_t i = 0; i < running.size();) {
      const std::size_t k = running[i].first;
      if (poll_child(running[i].second, results[k])) {
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
        progressed = true;
        if (!stop && stop_when && !results[k].stopped && stop_when(k, results[k])) {
          stop = true;
          for (auto& [_, run] : running)
            if (!run.killed_for_timeout && !run.killed_for_interrupt) {
              run.killed_for_stop = true;
              kill(-run.pid, SIGKILL);
            }
        }
      } else {
        ++i;
      }
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return results;
}

ProcResult run_process(const ProcSpec& spec) { return run_processes({spec}, 1).front(); }

std::pair<int, std::string> capture_output(const std::vector<std::string>& argv, const std::string& cwd) {
  int fds[2];
  if (pipe(fds) != 0) return {-1, {}};
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return {-1, {}};
  }
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 1);
    const int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, 0);
      dup2(devnull, 2);
    }
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(127);
    execvp(av[0], av.data());
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  close(fds[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

InterruptGuard::InterruptGuard() {
  g_interrupted = 0;
  struct sigaction sa{};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}
InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}
bool interrupted() { return g_interrupted != 0; }
void request_interrupt() { g_interrupted = 1; }
void clear_interrupt() { g_interrupted = 0; }

}  // namespace kvgate::mutate
