// Fork-join over index ranges for the one-off bulk work of loading and writing models (the loaders'
// dtype conversion, the CUDA weight upload, `kvgate synth`): threads are started per call, which
// costs microseconds against conversions of megabytes. The forward pass has its own persistent
// pool (runtime/src/thread_pool.hpp). Which thread runs a piece never changes what the piece
// computes, so results do not depend on the thread count.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace kvgate {

// 0 (or less): the hardware concurrency (at least 1); else the number asked for.
inline int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

// Runs f(i) for every i in [0, n) on up to `threads` threads (0: all cores; the caller is one of
// them). Indices are claimed in increasing order. Returns when every claimed index has run; the
// first exception thrown by f is rethrown then (indices not yet claimed are skipped). When the OS
// refuses a thread, the threads already started (at least the caller) do all the work.
template <class F>
void parallel_indices(std::size_t n, int threads, F&& f) {
  const std::size_t t = std::min<std::size_t>(n, static_cast<std::size_t>(resolve_threads(threads)));
  if (t <= 1) {
    for (std::size_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    for (;;) {
      const std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n || failed.load(std::memory_order_relaxed)) return;
      try {
        f(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(error_mu);
        if (!error) error = std::current_exception();
        failed.store(true, std::memory_order_relaxed);
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(t - 1);
  for (std::size_t k = 1; k < t; ++k) {
    try {
      pool.emplace_back(work);
    } catch (const std::exception&) {
      break;  // fewer threads: the ones running claim the remaining indices
    }
  }
  work();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

// f(begin, end) for the pieces [k * grain, min(n, (k + 1) * grain)) of [0, n), as parallel_indices.
template <class F>
void parallel_ranges(std::size_t n, std::size_t grain, int threads, F&& f) {
  if (n == 0) return;
  grain = std::max<std::size_t>(grain, 1);
  parallel_indices((n + grain - 1) / grain, threads, [&](std::size_t k) { f(k * grain, std::min(n, (k + 1) * grain)); });
}

}  // namespace kvgate
