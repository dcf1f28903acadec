// A conversation lock held by another turn: the waiter says what it waits for (the conversation
// and the lock file) before it blocks, then gets the lock once the holder lets go. Synchronized by
// the notice itself (a condition variable), not by time.
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>

#include "catch_compat.hpp"
#include "kvgate/kv_cache_dir.hpp"

TEST_CASE("kv cache lock: a held lock is waited for with a notice naming the conversation and the lock file") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kvgate_lock_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const kvgate::KvCacheDir cache(dir.string());
  kvgate::KvCacheDir::Lock holder = cache.lock("conv1");
  REQUIRE(holder.held());
  REQUIRE_FALSE(cache.lock("conv1", false).held());  // busy: the non-waiting form gives up

  std::mutex m;
  std::condition_variable cv;
  bool noticed = false, acquired = false;
  std::string notice;
  std::thread waiter([&] {
    kvgate::KvCacheDir::Lock l = cache.lock("conv1", true, [&](const std::string& s) {
      std::lock_guard<std::mutex> g(m);
      noticed = true;
      notice = s;
      cv.notify_all();
    });
    std::lock_guard<std::mutex> g(m);
    acquired = l.held();
  });
  {
    std::unique_lock<std::mutex> g(m);
    cv.wait(g, [&] { return noticed; });
    CHECK_FALSE(acquired);  // still waiting: the holder has not let go
  }
  holder = kvgate::KvCacheDir::Lock();  // release
  waiter.join();
  CHECK(acquired);
  CHECK_THAT(notice, kvgate_catch::contains("conv1"));
  CHECK_THAT(notice, kvgate_catch::contains(cache.lock_path_for("conv1")));
  CHECK_THAT(notice, kvgate_catch::contains("waiting"));
  // A free lock is taken without a notice.
  bool second_notice = false;
  const auto free_lock = cache.lock("conv2", true, [&](const std::string&) { second_notice = true; });
  CHECK(free_lock.held());
  CHECK_FALSE(second_notice);
  fs::remove_all(dir);
}
