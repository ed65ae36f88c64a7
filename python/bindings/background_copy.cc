// BackgroundCopy: memcpy on threads that never take the GIL.
//
// Copies made by Python threads (numpy) do not overlap the training
// thread's staging: each np.copyto call needs the GIL to start, and a
// thread waiting for the GIL gets it only once per switch interval
// (sys.getswitchinterval()), so a copy thread copies about one shard per
// interval (docs/DESIGN_NOTES.md, "Staging memory kept between saves").
#include "background_copy.h"

#include <nanobind/ndarray.h>

#include <algorithm>
#include <cstring>

namespace nb = nanobind;
using namespace nb::literals;

namespace shardkeep::binding {

BackgroundCopy::BackgroundCopy(int threads, size_t batch_bytes) : batch_bytes_(batch_bytes) {
  for (int i = 0; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { Work(); });
}

BackgroundCopy::~BackgroundCopy() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void BackgroundCopy::Add(const uint8_t* from, uint8_t* to, size_t size) {
  batch_.push_back({from, to, size});
  batch_size_ += size;
  if (batch_size_ >= batch_bytes_) Submit();
}

void BackgroundCopy::Finish() {
  Submit();
  nb::gil_scoped_release release;
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return queued_.empty() && busy_ == 0; });
}

void BackgroundCopy::Submit() {
  if (batch_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_.push_back(std::move(batch_));
  }
  batch_ = {};
  batch_size_ = 0;
  ready_.notify_one();
}

void BackgroundCopy::Work() {
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

void BindBackgroundCopy(nb::module_& m) {
  using Bytes = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  using ConstBytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  nb::class_<BackgroundCopy>(
      m, "BackgroundCopy",
      "Copies byte arrays on native threads (never taking the GIL) while the caller goes"
      " on; every source and destination must stay alive until finish() returns.")
      .def(nb::init<int, size_t>(), "threads"_a, "batch_bytes"_a = size_t{4} << 20)
      .def(
          "add",
          [](BackgroundCopy& self, ConstBytes from, Bytes to) {
            if (from.size() != to.size()) {
              throw nb::value_error("BackgroundCopy.add: source and destination sizes differ");
            }
            self.Add(from.data(), to.data(), from.size());
          },
          "source"_a, "destination"_a,
          "Queues a copy of source (uint8, contiguous) into destination (same size).")
      .def("finish", &BackgroundCopy::Finish,
           "Waits, without the GIL, until every queued copy is done.");
}

}  // namespace shardkeep::binding
