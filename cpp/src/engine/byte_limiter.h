// Bounds the memory a pipeline allocates for itself (Options::
// host_memory_limit): every buffer the engine allocates is held in a
// ByteLimiter while it exists: read and decompression buffers, the
// writers' gather buffers, zstd output and working memory.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace shardkeep::internal {

class ByteLimiter {
 public:
  explicit ByteLimiter(uint64_t limit) : limit_(limit) {}

  // Blocks until `bytes` fit under the limit. A request larger than the
  // whole limit is admitted alone (when nothing else is held), so one huge
  // chunk cannot deadlock the pipeline.
  void Acquire(uint64_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return used_ == 0 || used_ + bytes <= limit_; });
    used_ += bytes;
    peak_ = std::max(peak_, used_);
  }
  void Release(uint64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      used_ -= bytes;
    }
    cv_.notify_all();
  }
  uint64_t used() const {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }
  // The most bytes held at once so far.
  uint64_t peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }

 private:
  const uint64_t limit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t used_ = 0;
  uint64_t peak_ = 0;
};

// Holds `bytes` of a limiter for the lifetime of the object.
class ScopedBytes {
 public:
  ScopedBytes(ByteLimiter& limiter, uint64_t bytes)
      : limiter_(limiter), bytes_(bytes) {
    limiter_.Acquire(bytes_);
  }
  ~ScopedBytes() { limiter_.Release(bytes_); }
  ScopedBytes(const ScopedBytes&) = delete;
  ScopedBytes& operator=(const ScopedBytes&) = delete;

 private:
  ByteLimiter& limiter_;
  uint64_t bytes_;
};

}  // namespace shardkeep::internal
