// A small fork-join pool for the CPU forward pass: `parallel_for(n, f)` splits [0, n) into
// contiguous parts and returns when all are done. Parts are claimed dynamically (the caller claims
// too), so a worker the OS has not scheduled yet never holds the caller up: on a busy machine the
// caller simply does more parts itself. The split depends only on n and the pool size, and each
// part is computed by the same code whoever runs it, so results do not depend on scheduling.
//
// Publication is a seqlock: the generation is odd while the caller rewrites the job fields, and a
// worker registers as a reader and re-checks the generation before it reads them; the caller
// waits for readers to leave before it rewrites. Workers spin briefly between jobs (decode issues
// many tiny jobs per token), then sleep on a condition variable. No allocation per job.
#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVGATE_CPU_RELAX() _mm_pause()
#else
#define KVGATE_CPU_RELAX() ((void)0)
#endif

namespace kvgate::detail {

// A worker thread could not be started; the message says how many were and what to lower.
class ThreadStartError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ThreadPool {
 public:
  // When a start fails (the OS refuses another thread: a pids or process limit), the workers
  // already started are stopped and joined before the error leaves the constructor: they wait on
  // members that unwinding would otherwise destroy under them (a hang with no message).
  explicit ThreadPool(int n_threads) : n_(n_threads < 1 ? 1 : n_threads) {
    try {
      for (int i = 1; i < n_; ++i) workers_.emplace_back([this] { loop(); });
    } catch (const std::exception& e) {
      const std::size_t started = workers_.size();
      shutdown();
      throw ThreadStartError("cannot start CPU worker thread " + std::to_string(started + 1) + " of " +
                             std::to_string(n_ - 1) + " (" + e.what() + "): the machine or a process limit " +
                             "refuses more threads; lower --threads (at most " + std::to_string(started + 1) +
                             " ran here)");
    }
  }
  ~ThreadPool() { shutdown(); }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_; }

  // f(begin, end) for contiguous ranges covering [0, n). Runs inline when one part suffices.
  template <class F>
  void parallel_for(int n, F&& f, int min_per_part = 1) {
    int parts = std::min(n, n_ * 2);  // a few more parts than threads: balance when a thread is late
    if (min_per_part > 1) parts = std::min(parts, std::max(1, n / min_per_part));
    if (parts <= 1 || n_ == 1) {
      if (n > 0) f(0, n);
      return;
    }
    begin_publish();
    job_ctx_ = &f;
    job_call_ = [](const void* ctx, int begin, int end) {
      (*static_cast<const std::remove_reference_t<F>*>(ctx))(begin, end);
    };
    job_n_ = n;
    job_parts_ = parts;
    next_part_.store(0, std::memory_order_relaxed);
    done_parts_.store(0, std::memory_order_relaxed);
    end_publish();
    work();
    for (int spins = 0; done_parts_.load(std::memory_order_acquire) < parts; ++spins) {
      if (spins < 4000) KVGATE_CPU_RELAX();
      else std::this_thread::yield();
    }
  }

 private:
  void shutdown() {
    begin_publish();
    stop_ = true;
    end_publish();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }
  void begin_publish() {
    gen_.fetch_add(1, std::memory_order_seq_cst);  // odd: fields are being rewritten
    for (int spins = 0; readers_.load(std::memory_order_seq_cst) != 0; ++spins) {
      if (spins < 4000) KVGATE_CPU_RELAX();
      else std::this_thread::yield();
    }
  }
  void end_publish() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      gen_.fetch_add(1, std::memory_order_seq_cst);  // even: a new job
    }
    cv_.notify_all();
  }
  // Claims and runs parts of the current job until none is left.
  void work() {
    for (;;) {
      const int p = next_part_.fetch_add(1, std::memory_order_relaxed);
      if (p >= job_parts_) return;
      const int begin = static_cast<int>(static_cast<std::int64_t>(job_n_) * p / job_parts_);
      const int end = static_cast<int>(static_cast<std::int64_t>(job_n_) * (p + 1) / job_parts_);
      job_call_(job_ctx_, begin, end);
      done_parts_.fetch_add(1, std::memory_order_release);
    }
  }
  void loop() {
    std::uint64_t seen = 0;
    for (;;) {
      std::uint64_t g = gen_.load(std::memory_order_acquire);
      if (g == seen || (g & 1)) {
        int spins = 0;
        while (((g = gen_.load(std::memory_order_acquire)) == seen || (g & 1)) && spins < 20000) {
          KVGATE_CPU_RELAX();
          ++spins;
        }
        if (g == seen || (g & 1)) {
          std::unique_lock<std::mutex> lk(mu_);
          cv_.wait(lk, [&] {
            const std::uint64_t x = gen_.load(std::memory_order_acquire);
            return x != seen && !(x & 1);
          });
        }
        continue;
      }
      readers_.fetch_add(1, std::memory_order_seq_cst);
      if (gen_.load(std::memory_order_seq_cst) != g) {  // republished meanwhile: retry
        readers_.fetch_sub(1, std::memory_order_seq_cst);
        continue;
      }
      seen = g;
      const bool stop = stop_;
      if (!stop) work();
      readers_.fetch_sub(1, std::memory_order_seq_cst);
      if (stop) return;
    }
  }

  int n_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<std::uint64_t> gen_{0};
  std::atomic<int> readers_{0};
  std::atomic<int> next_part_{0};
  std::atomic<int> done_parts_{0};
  bool stop_ = false;
  const void* job_ctx_ = nullptr;
  void (*job_call_)(const void*, int, int) = nullptr;
  int job_n_ = 0;
  int job_parts_ = 0;
};

}  // namespace kvgate::detail
