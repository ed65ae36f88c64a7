// BackgroundCopy: memcpy on threads that never take the GIL.
//
// Copies made by Python threads (numpy) do not overlap the training
// thread's staging: each np.copyto call needs the GIL to start, and a
// thread waiting for the GIL gets it only once per switch interval
// (sys.getswitchinterval()), so a copy thread copies about one shard per
// interval (docs/DESIGN_NOTES.md, "Staging memory kept between saves").
// Here `add` (called with the GIL) only records two pointers; batches go
// to native workers, and `finish` waits for them without the GIL. The
// caller keeps every source and destination alive until `finish` returns.
#include "background_copy.h"

#include <nanobind/ndarray.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace shardkeep::binding {
namespace {

using Bytes = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using ConstBytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

struct Piece {
  const uint8_t* from;
  uint8_t* to;
  size_t size;
};

class BackgroundCopy {
 public:
  BackgroundCopy(int threads, size_t batch_bytes) : batch_bytes_(batch_bytes) {
    for (int i = 0; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { Work(); });
  }

  ~BackgroundCopy() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  BackgroundCopy(const BackgroundCopy&) = delete;
  BackgroundCopy& operator=(const BackgroundCopy&) = delete;

  void Add(ConstBytes from, Bytes to) {
    if (from.size() != to.size()) {
      throw nb::value_error("BackgroundCopy.add: source and destination sizes differ");
    }
    batch_.push_back({from.data(), to.data(), from.size()});
    batch_size_ += from.size();
    if (batch_size_ >= batch_bytes_) Submit();
  }

  // Waits, without the GIL, until every piece added is copied.
  void Finish() {
    Submit();
    nb::gil_scoped_release release;
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return queued_.empty() && busy_ == 0; });
  }

 private:
  void Submit() {
    if (batch_.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queued_.push_back(std::move(batch_));
    }
    batch_ = {};
    batch_size_ = 0;
    ready_.notify_one();
  }

  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ready_.wait(lock, [&] { return stopping_ || !queued_.empty(); });
      if (queued_.empty()) return;  // stopping
      std::vector<Piece> pieces = std::move(queued_.front());
      queued_.pop_front();
      ++busy_;
      lock.unlock();
      for (const Piece& piece : pieces) std::memcpy(piece.to, piece.from, piece.size);
      lock.lock();
      --busy_;
      if (queued_.empty() && busy_ == 0) done_.notify_all();
    }
  }

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

}  // namespace

void BindBackgroundCopy(nb::module_& m) {
  nb::class_<BackgroundCopy>(
      m, "BackgroundCopy",
      "Copies byte arrays on native threads (never taking the GIL) while the caller goes"
      " on; every source and destination must stay alive until finish() returns.")
      .def(nb::init<int, size_t>(), "threads"_a, "batch_bytes"_a = size_t{4} << 20)
      .def("add", &BackgroundCopy::Add, "source"_a, "destination"_a,
           "Queues a copy of source (uint8, contiguous) into destination (same size).")
      .def("finish", &BackgroundCopy::Finish,
           "Waits, without the GIL, until every queued copy is done.");
}

}  // namespace shardkeep::binding
