#include "storage/part_writer.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace shardkeep {
namespace {

// Parts grow every 1,000 so that a file of any practical size fits in
// S3's 10,000 parts: 8 MiB parts reach 78 GiB at part 10,000 with a fixed
// size, and far beyond when doubling.
constexpr int kPartsPerSize = 1000;

class PartWriter final : public WritableFile {
 public:
  PartWriter(std::unique_ptr<PartUpload> upload, PartWriterOptions options)
      : upload_(std::move(upload)), options_(options) {}

  ~PartWriter() override {
    if (!finished_) {
      WaitForParts(/*borrowed_only=*/false);
      Abort();
    }
    StopWorkers();
  }

  Status Append(const void* data, size_t size) override {
    const Status status = AppendOrFail(data, size);
    if (!status.ok()) {
      // Nothing more will be uploaded: abort now rather than at Close.
      WaitForParts(/*borrowed_only=*/false);
      Abort();
    }
    return status;
  }

  Status Sync() override { return Finish(); }
  Status Close() override { return Finish(); }

 private:
  Status AppendOrFail(const void* data, size_t size) {
    if (finished_) {
      return InternalError("Append to " + upload_->Name() +
                           " after Sync or Close");
    }
    SK_RETURN_IF_ERROR(FirstError());
    bytes_ += size;
    std::string_view rest(static_cast<const char*>(data), size);
    // Tops up a partly filled buffer first, so parts stay in order.
    if (!buffer_.empty()) {
      const size_t take = std::min(rest.size(), PartSize() - buffer_.size());
      buffer_.append(rest.substr(0, take));
      rest.remove_prefix(take);
      if (buffer_.size() == PartSize()) SK_RETURN_IF_ERROR(SubmitBuffer());
    }
    // Whole parts straight from the caller's memory, which stays valid
    // until this call returns.
    bool borrowed = false;
    Status submitted;
    while (submitted.ok() && rest.size() >= PartSize()) {
      const size_t part = PartSize();
      submitted = Submit(std::string(), rest.substr(0, part));
      rest.remove_prefix(part);
      borrowed = true;
    }
    if (borrowed) {
      // Even on failure: workers may still be reading the caller's bytes.
      WaitForParts(/*borrowed_only=*/true);
      SK_RETURN_IF_ERROR(submitted);
      SK_RETURN_IF_ERROR(FirstError());
    }
    if (!rest.empty()) {
      if (buffer_.capacity() < PartSize()) buffer_.reserve(PartSize());
      buffer_.append(rest);
    }
    return Status::Ok();
  }

  struct Job {
    int number = 0;
    std::string owned;      // the part's bytes when buffered here
    std::string_view data;  // what to send: `owned`, or the caller's bytes
    bool borrowed = false;
  };

  size_t PartSize() const {
    const int next = next_part_;
    const int doublings = std::min((next - 1) / kPartsPerSize, 8);
    return options_.part_size << doublings;
  }

  Status FirstError() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

  Status SubmitBuffer() {
    std::string owned = std::move(buffer_);
    buffer_ = std::string();
    return Submit(std::move(owned), std::string_view());
  }

  // Queues one part (owned bytes, or borrowed ones when `owned` is empty),
  // waiting while `parts_in_flight` are queued or uploading.
  Status Submit(std::string owned, std::string_view borrowed) {
    if (!begun_) {
      const Status begun = upload_->Begin();
      if (!begun.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = begun;
        return error_;
      }
      begun_ = true;
    }
    if (next_part_ > upload_->max_parts()) {
      return InvalidArgumentError(upload_->Name() + ": more than " +
                                  std::to_string(upload_->max_parts()) +
                                  " parts");
    }
    std::unique_lock<std::mutex> lock(mu_);
    space_.wait(lock, [&] {
      return in_flight_ < std::max(1, options_.parts_in_flight) ||
             !error_.ok();
    });
    if (!error_.ok()) return error_;
    Job job;
    job.number = next_part_++;
    job.borrowed = owned.empty();
    job.owned = std::move(owned);
    job.data = job.borrowed ? borrowed : std::string_view(job.owned);
    if (job.borrowed) ++borrowed_in_flight_;
    ++in_flight_;
    jobs_.push_back(std::move(job));
    const size_t wanted = static_cast<size_t>(
        std::min(in_flight_, std::max(1, options_.parts_in_flight)));
    if (workers_.size() < wanted) {
      workers_.emplace_back([this] { Work(); });
    }
    work_.notify_one();
    return Status::Ok();
  }

  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      work_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_ and nothing left
      Job job = std::move(jobs_.front());
      jobs_.pop_front();
      // No point sending more parts after one failed.
      const Status earlier = error_;
      lock.unlock();
      Result<std::string> token =
          !earlier.ok()
              ? Result<std::string>(earlier)
              : upload_->PutPart(job.number, job.data);
      job.owned = std::string();  // frees the buffer before the next part
      lock.lock();
      if (token.ok()) {
        tokens_[job.number] = std::move(token).value();
      } else if (error_.ok()) {
        error_ = token.status();
      }
      --in_flight_;
      if (job.borrowed) --borrowed_in_flight_;
      space_.notify_all();
    }
  }

  void WaitForParts(bool borrowed_only) {
    std::unique_lock<std::mutex> lock(mu_);
    space_.wait(lock, [&] {
      return borrowed_only ? borrowed_in_flight_ == 0 : in_flight_ == 0;
    });
  }

  void StopWorkers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_.notify_all();
    for (std::thread& worker : workers_) worker.join();
    workers_.clear();
  }

  void Abort() {
    if (!begun_) return;
    // Best effort: the failure being reported matters more than this one.
    upload_->Abort();
    begun_ = false;
  }

  Status Finish() {
    if (finished_) return finish_status_;
    finished_ = true;
    finish_status_ = Complete();
    if (!finish_status_.ok()) {
      WaitForParts(/*borrowed_only=*/false);
      Abort();
    }
    StopWorkers();
    buffer_ = std::string();
    return finish_status_;
  }

  Status Complete() {
    SK_RETURN_IF_ERROR(FirstError());
    if (!begun_) return upload_->PutWhole(buffer_);  // smaller than a part
    if (!buffer_.empty()) SK_RETURN_IF_ERROR(SubmitBuffer());
    WaitForParts(/*borrowed_only=*/false);
    SK_RETURN_IF_ERROR(FirstError());
    const Status completed = upload_->Complete(std::move(tokens_), bytes_);
    // Once completed, or possibly completed (its answer lost), there is
    // nothing left to abort: aborting could remove a finished object's
    // parts, or the object itself.
    if (completed.ok() || completed.code() == StatusCode::kCommitStateUnknown) {
      begun_ = false;
    }
    return completed;
  }

  const std::unique_ptr<PartUpload> upload_;
  const PartWriterOptions options_;

  std::string buffer_;  // the part being gathered
  bool begun_ = false;  // Begin() succeeded and the upload is not over
  int next_part_ = 1;
  uint64_t bytes_ = 0;  // appended in all
  bool finished_ = false;
  Status finish_status_;

  std::mutex mu_;
  std::condition_variable work_;   // a job is queued, or stop_
  std::condition_variable space_;  // a job finished
  std::deque<Job> jobs_;
  std::vector<std::thread> workers_;
  int in_flight_ = 0;           // queued or uploading
  int borrowed_in_flight_ = 0;  // of those, sent from the caller's memory
  bool stop_ = false;
  std::map<int, std::string> tokens_;
  Status error_;  // the first failure: a part, or creating the upload
};

}  // namespace

std::unique_ptr<WritableFile> NewPartWriter(std::unique_ptr<PartUpload> upload,
                                            PartWriterOptions options) {
  return std::make_unique<PartWriter>(std::move(upload), options);
}

}  // namespace shardkeep
