// Copies into an async save's staging buffer on native threads, while the
// training thread goes on staging the next shards.
#pragma once

#include <nanobind/nanobind.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace shardkeep::binding {

// memcpy on threads that never take the GIL: Add (called with the GIL)
// only records two pointers, batches of about batch_bytes go to native
// workers, and Finish waits for them without the GIL. The caller keeps
// every source and destination alive until Finish returns.
class BackgroundCopy {
 public:
  BackgroundCopy(int threads, size_t batch_bytes);
  ~BackgroundCopy();
  BackgroundCopy(const BackgroundCopy&) = delete;
  BackgroundCopy& operator=(const BackgroundCopy&) = delete;

  // REQUIRES: the GIL (it guards the batch being filled).
  void Add(const uint8_t* from, uint8_t* to, size_t size);
  // Waits, releasing the GIL, until every piece added is copied.
  void Finish();

 private:
  struct Piece {
    const uint8_t* from;
    uint8_t* to;
    size_t size;
  };

  void Submit();
  void Work();

  const size_t batch_bytes_;
  std::vector<Piece> batch_;  // touched only with the GIL held
  size_t batch_size_ = 0;
  std::mutex mu_;
  std::condition_variable ready_, done_;
  std::deque<std::vector<Piece>> queued_;
  int busy_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// Adds the class BackgroundCopy to the module.
void BindBackgroundCopy(nanobind::module_& m);

}  // namespace shardkeep::binding
