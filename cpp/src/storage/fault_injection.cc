#include "storage/fault_injection.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

namespace shardkeep {

class FaultInjectionStorage::State {
 public:
  void SetHook(Hook hook) {
    std::lock_guard<std::mutex> lock(mu_);
    hook_ = std::move(hook);
  }

  void SetAnswerHook(Hook hook) {
    std::lock_guard<std::mutex> lock(mu_);
    answer_hook_ = std::move(hook);
  }

  // After a call that changed the storage answered `answer`: the answer
  // the caller gets.
  Status After(std::string_view op, const std::string& path, Status answer) {
    if (!answer.ok()) return answer;
    Hook hook;
    {
      std::lock_guard<std::mutex> lock(mu_);
      hook = answer_hook_;
    }
    return hook ? hook(op, path) : answer;
  }

  void SetCorruptHook(CorruptHook hook) {
    std::lock_guard<std::mutex> lock(mu_);
    corrupt_hook_ = std::move(hook);
  }

  // After a read of `size` bytes at `offset` of `path` filled `bytes`:
  // damages them when the corrupt hook says so.
  void Received(std::string_view op, const std::string& path, uint64_t offset,
                uint64_t size, void* bytes) {
    CorruptHook hook;
    {
      std::lock_guard<std::mutex> lock(mu_);
      hook = corrupt_hook_;
    }
    if (size > 0 && hook && hook(op, path, offset, size)) *static_cast<uint8_t*>(bytes) ^= 1;
  }

  void SetFeatures(StorageFeatures features) {
    std::lock_guard<std::mutex> lock(mu_);
    features_ = features;
  }

  std::optional<StorageFeatures> features() const {
    std::lock_guard<std::mutex> lock(mu_);
    return features_;
  }

  int Count(std::string_view op) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = counts_.find(op);
    return it == counts_.end() ? 0 : it->second;
  }

  // Counts the call and asks the hook whether it may proceed.
  Status Before(std::string_view op, const std::string& path) {
    Hook hook;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = counts_.find(op);
      if (it == counts_.end()) {
        counts_.emplace(std::string(op), 1);
      } else {
        ++it->second;
      }
      hook = hook_;
    }
    // Called unlocked: the hook may block or call back into Count().
    return hook ? hook(op, path) : Status::Ok();
  }

 private:
  mutable std::mutex mu_;
  Hook hook_;
  Hook answer_hook_;
  CorruptHook corrupt_hook_;
  std::optional<StorageFeatures> features_;
  std::map<std::string, int, std::less<>> counts_;
};

namespace {

class FaultInjectionWritableFile final : public WritableFile {
 public:
  using State = FaultInjectionStorage::State;

  FaultInjectionWritableFile(std::unique_ptr<WritableFile> base,
                             std::shared_ptr<State> state, std::string path)
      : base_(std::move(base)),
        state_(std::move(state)),
        path_(std::move(path)) {}

  Status Append(const void* data, size_t size) override {
    SK_RETURN_IF_ERROR(state_->Before("Append", path_));
    return base_->Append(data, size);
  }
  Status Sync() override {
    SK_RETURN_IF_ERROR(state_->Before("Sync", path_));
    return base_->Sync();
  }
  Status Close() override {
    SK_RETURN_IF_ERROR(state_->Before("Close", path_));
    return base_->Close();
  }

 private:
  const std::unique_ptr<WritableFile> base_;
  const std::shared_ptr<State> state_;
  const std::string path_;
};

}  // namespace

FaultInjectionStorage::FaultInjectionStorage(std::shared_ptr<Storage> base)
    : base_(std::move(base)), state_(std::make_shared<State>()) {}

FaultInjectionStorage::~FaultInjectionStorage() = default;

void FaultInjectionStorage::FailOn(Hook hook) {
  state_->SetHook(std::move(hook));
}

int FaultInjectionStorage::Count(std::string_view op) const {
  return state_->Count(op);
}

void FaultInjectionStorage::LoseAnswerOn(Hook hook) {
  state_->SetAnswerHook(std::move(hook));
}

void FaultInjectionStorage::CorruptReadsOn(CorruptHook hook) {
  state_->SetCorruptHook(std::move(hook));
}

void FaultInjectionStorage::OverrideFeatures(StorageFeatures features) {
  state_->SetFeatures(features);
}

StorageFeatures FaultInjectionStorage::features() const {
  return state_->features().value_or(base_->features());
}

Status FaultInjectionStorage::ReadAt(const std::string& path, uint64_t offset,
                                     uint64_t size, void* dst) {
  SK_RETURN_IF_ERROR(state_->Before("ReadAt", path));
  SK_RETURN_IF_ERROR(base_->ReadAt(path, offset, size, dst));
  state_->Received("ReadAt", path, offset, size, dst);
  return Status::Ok();
}

Status FaultInjectionStorage::ReadScatter(const std::string& path, uint64_t offset,
                                          const std::vector<ScatterPiece>& pieces) {
  SK_RETURN_IF_ERROR(state_->Before("ReadScatter", path));
  return base_->ReadScatter(path, offset, pieces);
}

Result<std::string> FaultInjectionStorage::ReadAll(const std::string& path) {
  SK_RETURN_IF_ERROR(state_->Before("ReadAll", path));
  SK_ASSIGN_OR_RETURN(std::string bytes, base_->ReadAll(path));
  state_->Received("ReadAll", path, 0, bytes.size(), bytes.data());
  return bytes;
}

Result<uint64_t> FaultInjectionStorage::FileSize(const std::string& path) {
  SK_RETURN_IF_ERROR(state_->Before("FileSize", path));
  return base_->FileSize(path);
}

Status FaultInjectionStorage::WriteAll(const std::string& path,
                                       std::string_view data, bool sync) {
  SK_RETURN_IF_ERROR(state_->Before("WriteAll", path));
  return state_->After("WriteAll", path, base_->WriteAll(path, data, sync));
}

Result<std::unique_ptr<WritableFile>> FaultInjectionStorage::OpenForAppend(
    const std::string& path) {
  SK_RETURN_IF_ERROR(state_->Before("OpenForAppend", path));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                      base_->OpenForAppend(path));
  return std::unique_ptr<WritableFile>(
      std::make_unique<FaultInjectionWritableFile>(std::move(file), state_,
                                                   path));
}

Result<bool> FaultInjectionStorage::Exists(const std::string& path) {
  SK_RETURN_IF_ERROR(state_->Before("Exists", path));
  return base_->Exists(path);
}

Result<std::vector<std::string>> FaultInjectionStorage::List(
    const std::string& dir) {
  SK_RETURN_IF_ERROR(state_->Before("List", dir));
  return base_->List(dir);
}

Status FaultInjectionStorage::CreateDir(const std::string& dir) {
  SK_RETURN_IF_ERROR(state_->Before("CreateDir", dir));
  return state_->After("CreateDir", dir, base_->CreateDir(dir));
}

Status FaultInjectionStorage::DeleteFile(const std::string& path) {
  SK_RETURN_IF_ERROR(state_->Before("DeleteFile", path));
  return state_->After("DeleteFile", path, base_->DeleteFile(path));
}

Status FaultInjectionStorage::DeleteRecursive(const std::string& path) {
  SK_RETURN_IF_ERROR(state_->Before("DeleteRecursive", path));
  return state_->After("DeleteRecursive", path, base_->DeleteRecursive(path));
}

Status FaultInjectionStorage::Rename(const std::string& from,
                                     const std::string& to) {
  SK_RETURN_IF_ERROR(state_->Before("Rename", from));
  return state_->After("Rename", from, base_->Rename(from, to));
}

Status FaultInjectionStorage::SyncDir(const std::string& dir) {
  SK_RETURN_IF_ERROR(state_->Before("SyncDir", dir));
  return base_->SyncDir(dir);
}

Result<bool> FaultInjectionStorage::Exchange(const std::string& a,
                                             const std::string& b) {
  SK_RETURN_IF_ERROR(state_->Before("Exchange", a));
  if (!features().atomic_exchange) return false;
  return base_->Exchange(a, b);
}

Result<bool> FaultInjectionStorage::Link(const std::string& from,
                                         const std::string& to) {
  SK_RETURN_IF_ERROR(state_->Before("Link", from));
  return base_->Link(from, to);
}

Status FaultInjectionStorage::WriteIfAbsent(const std::string& path,
                                            std::string_view data) {
  SK_RETURN_IF_ERROR(state_->Before("WriteIfAbsent", path));
  return state_->After("WriteIfAbsent", path, base_->WriteIfAbsent(path, data));
}

}  // namespace shardkeep
