// Unit tests of the CPU thread pool's failure path: when the OS refuses a worker thread the pool
// must say so and unwind, never hang. The refusal is made real by interposing pthread_create (the
// call std::thread makes), which then fails with EAGAIN as it does under a pids/process limit.
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <string>

#include "catch_compat.hpp"
#include "thread_pool.hpp"

namespace {
// Number of further pthread_create calls that succeed; negative = no limit.
std::atomic<int> g_thread_budget{-1};
}  // namespace

extern "C" int pthread_create(pthread_t* t, const pthread_attr_t* attr, void* (*fn)(void*), void* arg) {
  using Real = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "pthread_create"));
  int budget = g_thread_budget.load();
  while (budget >= 0) {
    if (budget == 0) return EAGAIN;
    if (g_thread_budget.compare_exchange_weak(budget, budget - 1)) break;
  }
  return real(t, attr, fn, arg);
}

TEST_CASE("thread_pool a refused worker start is reported and unwinds (no hang)", "[unit][thread_pool]") {
  // Anti-vacuity: the interposer is the one std::thread reaches (a refused start must be seen).
  g_thread_budget = 0;
  bool refused = false;
  try {
    std::thread t([] {});
    t.join();
  } catch (const std::system_error&) {
    refused = true;
  }
  REQUIRE(refused);

  for (int allowed : {0, 1, 3}) {
    g_thread_budget = allowed;
    std::string msg;
    try {
      kvgate::detail::ThreadPool pool(8);
    } catch (const kvgate::detail::ThreadStartError& e) {
      msg = e.what();
    }
    g_thread_budget = -1;
    INFO("allowed=" << allowed << " message: " << msg);
    REQUIRE(!msg.empty());
    CHECK(msg.find("--threads") != std::string::npos);
    CHECK(msg.find("thread " + std::to_string(allowed + 1) + " of 7") != std::string::npos);
  }
}

TEST_CASE("thread_pool a pool that started works and stops", "[unit][thread_pool]") {
  g_thread_budget = -1;
  kvgate::detail::ThreadPool pool(4);
  std::atomic<long long> sum{0};
  pool.parallel_for(1000, [&](int b, int e) {
    long long s = 0;
    for (int i = b; i < e; ++i) s += i;
    sum += s;
  });
  REQUIRE(sum.load() == 999LL * 1000 / 2);
}
