// A small fork-join pool for the CPU forward pass: `parallel_for(n, f)` splits [0, n) into one
// contiguous range per thread (the caller is thread 0) and returns when all are done. Workers spin
// briefly between jobs (decode dispatches many tiny jobs per token), then sleep on a condition
// variable. No allocation per job. Each item is computed by exactly one thread with the same code,
// so results do not depend on the thread count.
#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
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

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads) : n_(n_threads < 1 ? 1 : n_threads) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_; }

  // f(begin, end) for contiguous ranges covering [0, n). Runs inline when one thread suffices.
  template <class F>
  void parallel_for(int n, F&& f, int min_per_thread = 1) {
    int parts = n_;
    if (min_per_thread > 1) parts = std::min(parts, std::max(1, n / min_per_thread));
    parts = std::min(parts, n);
    if (parts <= 1) {
      if (n > 0) f(0, n);
      return;
    }
    auto call = [](const void* ctx, int begin, int end) { (*static_cast<const std::remove_reference_t<F>*>(ctx))(begin, end); };
    job_ctx_ = &f;
    job_call_ = call;
    job_n_ = n;
    job_parts_ = parts;
    // Every worker acknowledges every job (even without a part), so the job fields are never
    // rewritten while a worker may still read them.
    pending_.store(n_ - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lk(mu_);
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    run_part(0);
    // Spin briefly, then yield: on a loaded machine a worker may be descheduled.
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
      if (spins < 4000) KVGATE_CPU_RELAX();
      else std::this_thread::yield();
    }
  }

 private:
  void run_part(int part) {
    if (part >= job_parts_) return;
    const int begin = static_cast<int>(static_cast<std::int64_t>(job_n_) * part / job_parts_);
    const int end = static_cast<int>(static_cast<std::int64_t>(job_n_) * (part + 1) / job_parts_);
    job_call_(job_ctx_, begin, end);
  }
  void loop(int idx) {
    std::uint64_t seen = 0;
    for (;;) {
      // Spin a little (jobs come back-to-back during a forward pass), then sleep.
      int spins = 0;
      while (gen_.load(std::memory_order_acquire) == seen && spins < 20000) {
        KVGATE_CPU_RELAX();
        ++spins;
      }
      if (gen_.load(std::memory_order_acquire) == seen) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
      }
      seen = gen_.load(std::memory_order_acquire);
      if (stop_) return;
      run_part(idx);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  int n_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<std::uint64_t> gen_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
  const void* job_ctx_ = nullptr;
  void (*job_call_)(const void*, int, int) = nullptr;
  int job_n_ = 0;
  int job_parts_ = 0;
};

}  // namespace kvgate::detail
