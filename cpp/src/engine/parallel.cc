#include "engine/parallel.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "engine/catch_exceptions.h"
#include "shardkeep/cancellation.h"

namespace shardkeep::internal {

Status ParallelFor(size_t count, int threads,
                   const std::function<Status(size_t)>& work, std::string_view what) {
  const CancellationToken token = CancellationScope::Current();
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first_error;
  auto fail = [&](Status status) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.ok()) first_error = std::move(status);
    failed = true;
  };
  auto run = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t i = next.fetch_add(1);
      if (i >= count) return;
      if (token.cancelled()) {
        return fail(CancelledError(std::string(what) + " " + std::to_string(i) + " of " +
                                   std::to_string(count) + " not started: cancelled"));
      }
      Status status;
      try {
        status = work(i);
      } catch (...) {
        status = StatusOfCurrentException(std::string(what) + " " + std::to_string(i));
      }
      if (!status.ok()) fail(std::move(status));
    }
  };
  const size_t helpers =
      std::min<size_t>(count, static_cast<size_t>(std::max(threads, 1))) - (count ? 1 : 0);
  std::vector<std::thread> pool;
  pool.reserve(helpers);
  try {
    for (size_t t = 0; t < helpers; ++t) {
      pool.emplace_back([&] {
        CancellationScope scope(token);
        run();
      });
    }
  } catch (const std::system_error&) {
    // Out of threads: the ones started and this one share the work.
  }
  run();
  for (auto& thread : pool) thread.join();
  return first_error;
}

}  // namespace shardkeep::internal
