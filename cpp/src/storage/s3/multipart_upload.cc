#include "storage/s3/multipart_upload.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace shardkeep::s3 {
namespace {

// S3 allows 10,000 parts. Parts grow every 1,000 so that a file of any
// practical size fits: 8 MiB parts reach 78 GiB at part 10,000 with a
// fixed size, and far beyond when doubling.
constexpr int kMaxParts = 10000;
constexpr int kPartsPerSize = 1000;

class MultipartWriter final : public WritableFile {
 public:
  MultipartWriter(std::shared_ptr<const S3Client> client, std::string key,
                  MultipartOptions options)
      : client_(std::move(client)),
        key_(std::move(key)),
        options_(options) {}

  ~MultipartWriter() override {
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
      return InternalError("Append to " + client_->Url(key_) +
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
    if (upload_id_.empty()) {
      Result<std::string> id = client_->CreateMultipartUpload(key_);
      if (!id.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = id.status();
        return error_;
      }
      upload_id_ = std::move(id).value();
    }
    if (next_part_ > kMaxParts) {
      return InvalidArgumentError(client_->Url(key_) +
                                  ": more than 10000 parts");
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
      Result<std::string> etag =
          !earlier.ok()
              ? Result<std::string>(earlier)
              : client_->UploadPart(key_, upload_id_, job.number, job.data);
      job.owned = std::string();  // frees the buffer before the next part
      lock.lock();
      if (etag.ok()) {
        etags_[job.number] = std::move(etag).value();
      } else if (error_.ok()) {
        error_ = etag.status();
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
    if (upload_id_.empty()) return;
    // Best effort: the failure being reported matters more than this one.
    (void)client_->AbortMultipartUpload(key_, upload_id_);
    upload_id_.clear();
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

  // A CreateMultipartUpload whose answer was lost, then sent again, leaves
  // an upload nobody completes, whose parts the store keeps (and bills).
  // The key is this writer's own (a new file in its folder), so every other
  // upload still open for it is such an orphan. Best effort.
  void AbortOtherUploads() {
    Result<std::vector<MultipartUploadsPage::Upload>> open =
        client_->ListMultipartUploads(key_);
    if (!open.ok()) return;
    for (const MultipartUploadsPage::Upload& upload : *open) {
      if (upload.key == key_) (void)client_->AbortMultipartUpload(key_, upload.upload_id);
    }
  }

  Status Complete() {
    SK_RETURN_IF_ERROR(FirstError());
    if (upload_id_.empty()) {
      // Smaller than a part: one PUT.
      return client_->PutObject(key_, buffer_);
    }
    if (!buffer_.empty()) SK_RETURN_IF_ERROR(SubmitBuffer());
    WaitForParts(/*borrowed_only=*/false);
    SK_RETURN_IF_ERROR(FirstError());
    std::vector<CompletedPart> parts;
    parts.reserve(etags_.size());
    for (auto& [number, etag] : etags_) {
      parts.push_back(CompletedPart{number, std::move(etag)});
    }
    const Status completed =
        client_->CompleteMultipartUpload(key_, upload_id_, parts);
    if (completed.ok()) {
      upload_id_.clear();  // nothing left to abort
      AbortOtherUploads();
    }
    if (completed.code() != StatusCode::kCommitStateUnknown) return completed;
    // Our lost attempt completed it when the object has exactly our size
    // (before, it held the empty object OpenForAppend put there).
    Result<std::optional<uint64_t>> size = client_->HeadObject(key_);
    if (size.ok() && *size && **size == bytes_ && bytes_ > 0) {
      upload_id_.clear();  // nothing left to abort
      return Status::Ok();
    }
    return completed;
  }

  const std::shared_ptr<const S3Client> client_;
  const std::string key_;
  const MultipartOptions options_;

  std::string buffer_;  // the part being gathered
  std::string upload_id_;
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
  std::map<int, std::string> etags_;
  Status error_;  // the first failure: a part, or creating the upload
};

}  // namespace

std::unique_ptr<WritableFile> NewMultipartWriter(
    std::shared_ptr<const S3Client> client, std::string key,
    MultipartOptions options) {
  return std::make_unique<MultipartWriter>(std::move(client), std::move(key),
                                           options);
}

}  // namespace shardkeep::s3
