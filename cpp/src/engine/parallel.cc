#include "engine/parallel.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace shardkeep::internal {

Status ParallelFor(size_t count, int threads,
                   const std::function<Status(size_t)>& work) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first_error;
  auto run = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t i = next.fetch_add(1);
      if (i >= count) return;
      Status status = work(i);
      if (!status.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = std::move(status);
        failed = true;
      }
    }
  };
  const size_t helpers =
      std::min<size_t>(count, static_cast<size_t>(std::max(threads, 1))) - (count ? 1 : 0);
  std::vector<std::thread> pool;
  pool.reserve(helpers);
  for (size_t t = 0; t < helpers; ++t) pool.emplace_back(run);
  run();
  for (auto& thread : pool) thread.join();
  return first_error;
}

}  // namespace shardkeep::internal
