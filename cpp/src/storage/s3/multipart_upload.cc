#include "storage/s3/multipart_upload.h"

#include <optional>
#include <utility>
#include <vector>

namespace shardkeep::s3 {
namespace {

// S3 allows 10,000 parts.
constexpr int kMaxParts = 10000;

class S3PartUpload final : public PartUpload {
 public:
  S3PartUpload(std::shared_ptr<const S3Client> client, std::string key)
      : client_(std::move(client)), key_(std::move(key)) {}

  std::string Name() const override { return client_->Url(key_); }
  int max_parts() const override { return kMaxParts; }

  Status PutWhole(std::string_view data) override {
    return client_->PutObject(key_, data);
  }

  Status Begin() override {
    SK_ASSIGN_OR_RETURN(upload_id_, client_->CreateMultipartUpload(key_));
    return Status::Ok();
  }

  Result<std::string> PutPart(int number, std::string_view data) override {
    return client_->UploadPart(key_, upload_id_, number, data);
  }

  Status Complete(std::map<int, std::string> etags, uint64_t bytes) override {
    std::vector<CompletedPart> parts;
    parts.reserve(etags.size());
    for (auto& [number, etag] : etags) {
      parts.push_back(CompletedPart{number, std::move(etag)});
    }
    const Status completed =
        client_->CompleteMultipartUpload(key_, upload_id_, parts);
    if (completed.ok()) AbortOtherUploads();
    if (completed.code() != StatusCode::kCommitStateUnknown) return completed;
    // Our lost attempt completed it when the object has exactly our size
    // (before, it held the empty object OpenForAppend put there).
    Result<std::optional<uint64_t>> size = client_->HeadObject(key_);
    if (size.ok() && *size && **size == bytes && bytes > 0) return Status::Ok();
    return completed;
  }

  void Abort() override {
    (void)client_->AbortMultipartUpload(key_, upload_id_);
  }

 private:
  // A CreateMultipartUpload whose answer was lost, then sent again, leaves
  // an upload nobody completes, whose parts the store keeps (and bills).
  // The key is this writer's own (a new file in its folder), so every other
  // upload still open for it is such an orphan. Best effort.
  void AbortOtherUploads() {
    Result<std::vector<MultipartUploadsPage::Upload>> open =
        client_->ListMultipartUploads(key_);
    if (!open.ok()) return;
    for (const MultipartUploadsPage::Upload& upload : *open) {
      if (upload.key == key_ && upload.upload_id != upload_id_) {
        (void)client_->AbortMultipartUpload(key_, upload.upload_id);
      }
    }
  }

  const std::shared_ptr<const S3Client> client_;
  const std::string key_;
  std::string upload_id_;
};

}  // namespace

std::unique_ptr<WritableFile> NewMultipartWriter(
    std::shared_ptr<const S3Client> client, std::string key,
    MultipartOptions options) {
  return NewPartWriter(std::make_unique<S3PartUpload>(std::move(client), std::move(key)),
                       options);
}

}  // namespace shardkeep::s3
