#include "storage/gcs/gcs_storage.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "storage/object_prefix.h"

namespace shardkeep::gcs {
namespace {

// A composite object has at most 1,024 components.
constexpr int kMaxParts = 1024;

// Parts of `object` go up as objects beside it, named so that a save's
// listing shows whose they are; they live only until compose joins them
// (a save that dies leaves them in its own folder, which its cleanup
// deletes).
std::string PartName(const std::string& object, int number) {
  return object + ".part-" + std::to_string(number);
}

class GcsPartUpload final : public PartUpload {
 public:
  GcsPartUpload(std::shared_ptr<const GcsClient> client, std::string object)
      : client_(std::move(client)), object_(std::move(object)) {}

  std::string Name() const override { return client_->Url(object_); }
  int max_parts() const override { return kMaxParts; }

  Status PutWhole(std::string_view data) override {
    return client_->Upload(object_, data, std::nullopt).status();
  }

  Status Begin() override { return Status::Ok(); }

  Result<std::string> PutPart(int number, std::string_view data) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      uploaded_.insert(number);
    }
    SK_RETURN_IF_ERROR(client_->Upload(PartName(object_, number), data, std::nullopt).status());
    return PartName(object_, number);
  }

  Status Complete(std::map<int, std::string> parts, uint64_t bytes) override {
    std::vector<std::string> names;
    for (auto& [number, name] : parts) names.push_back(std::move(name));
    // The first 32 parts make the object; each later compose appends up to
    // 31 more to it.
    size_t next = 0;
    ObjectInfo info;
    while (next < names.size()) {
      std::vector<std::string> sources;
      if (next > 0) sources.push_back(object_);
      while (next < names.size() && sources.size() < kMaxComposeSources) {
        sources.push_back(names[next++]);
      }
      SK_ASSIGN_OR_RETURN(info, client_->Compose(sources, object_));
    }
    if (info.size != bytes) {
      return StorageError(Name() + ": composed of " + std::to_string(names.size()) +
                          " parts, it holds " + std::to_string(info.size) +
                          " bytes, not the " + std::to_string(bytes) + " written");
    }
    Abort();  // the parts, no longer needed
    return Status::Ok();
  }

  void Abort() override {
    std::set<int> uploaded;
    {
      std::lock_guard<std::mutex> lock(mu_);
      uploaded.swap(uploaded_);
    }
    // Best effort: a part left behind lies in the save's own folder.
    for (const int number : uploaded) (void)client_->Delete(PartName(object_, number));
  }

 private:
  const std::shared_ptr<const GcsClient> client_;
  const std::string object_;
  std::mutex mu_;
  std::set<int> uploaded_;  // parts that may exist on the server
};

class GcsStorage final : public Storage {
 public:
  GcsStorage(std::shared_ptr<const GcsClient> client, GcsStorageOptions options)
      : client_(std::move(client)), options_(options) {}

  StorageFeatures features() const override {
    StorageFeatures features;
    features.durable_sync = true;  // a finished upload is durable
    features.conditional_create = true;
    // Each ranged GET costs a round trip, mostly waiting: many in flight
    // hide it.
    features.parallel_reads = 32;
    // Uploads too: more files in flight than cores (each upload mostly
    // waits on the network), each file's parts 2 at a time.
    features.parallel_writes = 8;
    features.data_file_bytes = kGcsDataFileBytes;
    features.min_efficient_read_bytes = 8ull << 20;
    features.remote = true;
    return features;
  }

  Status ReadAt(const std::string& path, uint64_t offset, uint64_t size,
                void* dst) override {
    SK_ASSIGN_OR_RETURN(const std::string object, ObjectName(path));
    if (size == 0) return FileSize(path).status();  // a missing object is still NotFound
    SK_ASSIGN_OR_RETURN(GcsAnswer answer,
                        client_->GetRange(object, offset, size, static_cast<char*>(dst)));
    return http::CheckRangedRead(answer.response, client_->Url(object), offset, size);
  }

  Result<std::string> ReadAll(const std::string& path) override {
    SK_ASSIGN_OR_RETURN(const std::string object, ObjectName(path));
    return client_->GetObject(object);
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    SK_ASSIGN_OR_RETURN(const std::string object, ObjectName(path));
    SK_ASSIGN_OR_RETURN(std::optional<ObjectInfo> info, client_->GetInfo(object));
    if (!info) return NotFoundError(client_->Url(object) + " does not exist");
    return info->size;
  }

  Status WriteAll(const std::string& path, std::string_view data, bool sync) override {
    (void)sync;  // every finished upload is durable
    SK_ASSIGN_OR_RETURN(const std::string object, ObjectName(path));
    if (data.size() < 2 * options_.parts.part_size) {
      return client_->Upload(object, data, std::nullopt).status();
    }
    std::unique_ptr<WritableFile> file = Writer(object);
    SK_RETURN_IF_ERROR(file->Append(data.data(), data.size()));
    return file->Close();
  }

  Status WriteIfAbsent(const std::string& path, std::string_view data) override {
    SK_ASSIGN_OR_RETURN(const std::string object, ObjectName(path));
    return client_->Upload(object, data, /*if_generation_match=*/0).status();
  }

  Result<std::unique_ptr<WritableFile>> OpenForAppend(const std::string& path) override {
    SK_ASSIGN_OR_RETURN(const std::string object, ObjectName(path));
    // Creates now, only if absent, as the interface promises; compose
    // replaces this empty object when the file completes.
    const Status created = client_->Upload(object, std::string_view(), 0).status();
    if (created.code() == StatusCode::kAlreadyExists) {
      // An empty object there is this placeholder (its answer lost and the
      // upload sent again), or one that nothing has filled: taken.
      SK_ASSIGN_OR_RETURN(std::optional<ObjectInfo> info, client_->GetInfo(object));
      if (!info || info->size != 0) return created;
    } else {
      SK_RETURN_IF_ERROR(created);
    }
    return Writer(object);
  }

  Result<bool> Exists(const std::string& path) override {
    const std::string key = ObjectKeyOf(path);
    if (!key.empty() && key.back() != '/') {
      SK_ASSIGN_OR_RETURN(std::optional<ObjectInfo> info, client_->GetInfo(key));
      if (info) return true;
    }
    SK_ASSIGN_OR_RETURN(ListPage page, client_->ListPageOf(DirectoryPrefix(path), "", 1, ""));
    return !page.objects.empty() || !page.prefixes.empty();
  }

  Result<std::vector<std::string>> List(const std::string& dir) override {
    const std::string prefix = DirectoryPrefix(dir);
    SK_ASSIGN_OR_RETURN(ListPage all, client_->ListAll(prefix, "/"));
    std::vector<std::string> keys;
    for (const auto& [name, size] : all.objects) keys.push_back(name);
    std::vector<std::string> names = ChildNames(prefix, keys, all.prefixes);
    if (names.empty()) return NotFoundError("nothing is stored under " + client_->Url(prefix));
    return names;
  }

  // A server-side copy: the new checkpoint's object is whole on its own,
  // and its bytes never pass through this host.
  Result<bool> Link(const std::string& from, const std::string& to) override {
    SK_ASSIGN_OR_RETURN(const std::string from_object, ObjectName(from));
    SK_ASSIGN_OR_RETURN(const std::string to_object, ObjectName(to));
    SK_ASSIGN_OR_RETURN(std::optional<ObjectInfo> source, client_->GetInfo(from_object));
    if (!source) return NotFoundError(client_->Url(from_object) + " does not exist");
    SK_ASSIGN_OR_RETURN(std::optional<ObjectInfo> existing, client_->GetInfo(to_object));
    if (existing) return AlreadyExistsError(client_->Url(to_object) + " exists already");
    SK_RETURN_IF_ERROR(client_->Rewrite(from_object, to_object));
    return true;
  }

  Status CreateDir(const std::string& dir) override {
    (void)dir;  // directories are name prefixes; nothing to create
    return Status::Ok();
  }

  Status DeleteFile(const std::string& path) override {
    SK_ASSIGN_OR_RETURN(const std::string object, ObjectName(path));
    return client_->Delete(object);
  }

  Status DeleteRecursive(const std::string& path) override {
    const std::string key = ObjectKeyOf(path);
    std::vector<std::string> names;
    if (!key.empty() && key.back() != '/') names.push_back(key);
    SK_ASSIGN_OR_RETURN(ListPage all, client_->ListAll(DirectoryPrefix(path), ""));
    for (auto& [name, size] : all.objects) names.push_back(std::move(name));
    for (const std::string& name : names) {
      const Status deleted = client_->Delete(name);
      // Absent already (the path itself, or a racing deleter): the outcome
      // is the one asked for.
      if (!deleted.ok() && deleted.code() != StatusCode::kNotFound) return deleted;
    }
    return Status::Ok();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    return StorageError("cannot rename " + client_->Url(ObjectKeyOf(from)) + " to " +
                        client_->Url(ObjectKeyOf(to)) +
                        ": object stores have no rename (checkpoints are committed there "
                        "with a create-only upload)");
  }

  Status SyncDir(const std::string& dir) override {
    (void)dir;  // every finished upload is durable already
    return Status::Ok();
  }

 private:
  std::unique_ptr<WritableFile> Writer(const std::string& object) const {
    return NewPartWriter(std::make_unique<GcsPartUpload>(client_, object), options_.parts);
  }

  // The name of a file. Names ending in '/' are refused: tools show them as
  // folders.
  Result<std::string> ObjectName(const std::string& path) const {
    std::string key = ObjectKeyOf(path);
    if (key.empty() || key.back() == '/') {
      return InvalidArgumentError("'" + path + "' in " + client_->Url("") +
                                  " names no object (empty or ending in '/')");
    }
    return key;
  }

  const std::shared_ptr<const GcsClient> client_;
  const GcsStorageOptions options_;
};

}  // namespace

std::shared_ptr<Storage> NewGcsStorage(std::shared_ptr<const GcsClient> client,
                                       GcsStorageOptions options) {
  return std::make_shared<GcsStorage>(std::move(client), options);
}

}  // namespace shardkeep::gcs
