#include "storage/s3/s3_storage.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "storage/object_prefix.h"

namespace shardkeep::s3 {
namespace {

// DeleteObjects takes at most this many keys.
constexpr size_t kDeleteBatch = 1000;

class S3Storage final : public Storage {
 public:
  S3Storage(std::shared_ptr<const S3Client> client, S3StorageOptions options)
      : client_(std::move(client)), options_(options) {}

  StorageFeatures features() const override {
    StorageFeatures features;
    features.atomic_rename = false;
    features.durable_sync = true;  // a successful PUT is durable
    features.atomic_exchange = false;
    features.conditional_create = true;
    // Ranged GETs cost a round trip each, mostly waiting: many in flight
    // hide it (the engine's reads land straight in their destinations, so
    // more threads cost no buffers).
    features.parallel_reads = 32;
    features.min_efficient_read_bytes = 8ull << 20;
    features.remote = true;
    return features;
  }

  Status ReadAt(const std::string& path, uint64_t offset, uint64_t size,
                void* dst) override {
    SK_ASSIGN_OR_RETURN(const std::string key, ObjectKey(path));
    if (size == 0) {
      // Nothing to fetch, but a missing object is still NotFound.
      return FileSize(path).status();
    }
    SK_ASSIGN_OR_RETURN(
        S3Answer answer,
        client_->GetRange(key, offset, size, static_cast<char*>(dst)));
    return http::CheckRangedRead(answer.response, client_->Url(key), offset, size);
  }

  Result<std::string> ReadAll(const std::string& path) override {
    SK_ASSIGN_OR_RETURN(const std::string key, ObjectKey(path));
    return client_->GetObject(key);
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    SK_ASSIGN_OR_RETURN(const std::string key, ObjectKey(path));
    SK_ASSIGN_OR_RETURN(std::optional<uint64_t> size, client_->HeadObject(key));
    if (!size) return NotFoundError(client_->Url(key) + " does not exist");
    return *size;
  }

  Status WriteAll(const std::string& path, std::string_view data,
                  bool sync) override {
    (void)sync;  // every successful PUT is durable
    SK_ASSIGN_OR_RETURN(const std::string key, ObjectKey(path));
    if (data.size() < 2 * options_.multipart.part_size) {
      return client_->PutObject(key, data);
    }
    // Large objects go up in parallel parts, straight from `data`.
    std::unique_ptr<WritableFile> file =
        NewMultipartWriter(client_, key, options_.multipart);
    SK_RETURN_IF_ERROR(file->Append(data.data(), data.size()));
    return file->Close();
  }

  Status WriteIfAbsent(const std::string& path,
                       std::string_view data) override {
    SK_ASSIGN_OR_RETURN(const std::string key, ObjectKey(path));
    S3Request request;
    request.operation = "PutObject (If-None-Match)";
    request.method = "PUT";
    request.key = key;
    request.headers = {{"If-None-Match", "*"}};
    request.body = data;
    request.handled_statuses = {412};
    SK_ASSIGN_OR_RETURN(S3Answer answer, client_->Execute(request));
    if (answer.response.status != 412) return Status::Ok();
    const Status exists = AlreadyExistsError(
        client_->Url(key) + " exists already: another writer created it "
        "first (conditional PUT answered 412 PreconditionFailed)");
    if (!answer.earlier_attempt_may_have_applied) return exists;
    // An earlier attempt of ours may have created the object and lost its
    // answer: then the object holds exactly our bytes. Equal bytes from
    // another writer are indistinguishable and just as good to the caller.
    Result<std::string> stored = client_->GetObject(key);
    if (!stored.ok()) {
      return CommitStateUnknownError(
          client_->Url(key) + ": a conditional PUT may have succeeded before "
          "its answer was lost, and reading the object back failed: " +
          stored.status().ToString());
    }
    return *stored == data ? Status::Ok() : exists;
  }

  Result<std::unique_ptr<WritableFile>> OpenForAppend(
      const std::string& path) override {
    SK_ASSIGN_OR_RETURN(const std::string key, ObjectKey(path));
    // Creates now, only if absent, as the interface promises; the content
    // replaces this empty object when the file completes. A 412 may answer
    // this very request sent again (libcurl resends by itself when a reused
    // connection closes before any answer): an empty object there is this
    // placeholder, or one that nothing has filled, and is taken.
    const Status created = WriteIfAbsent(path, std::string_view());
    if (created.code() == StatusCode::kAlreadyExists) {
      SK_ASSIGN_OR_RETURN(const std::optional<uint64_t> size, client_->HeadObject(key));
      if (size != uint64_t{0}) return created;
    } else {
      SK_RETURN_IF_ERROR(created);
    }
    return NewMultipartWriter(client_, key, options_.multipart);
  }

  Result<bool> Exists(const std::string& path) override {
    const std::string key = ObjectKeyOf(path);
    if (!key.empty() && key.back() != '/') {
      SK_ASSIGN_OR_RETURN(std::optional<uint64_t> size,
                          client_->HeadObject(key));
      if (size) return true;
    }
    SK_ASSIGN_OR_RETURN(ListObjectsPage page,
                        client_->ListPage(DirectoryPrefix(path), "", 1, ""));
    return !page.objects.empty() || !page.common_prefixes.empty();
  }

  Result<std::vector<std::string>> List(const std::string& dir) override {
    const std::string prefix = DirectoryPrefix(dir);
    SK_ASSIGN_OR_RETURN(ListObjectsPage all, client_->ListAll(prefix, "/"));
    std::vector<std::string> keys;
    for (const ListedObject& object : all.objects) keys.push_back(object.key);
    std::vector<std::string> names = ChildNames(prefix, keys, all.common_prefixes);
    if (names.empty()) {
      return NotFoundError("nothing is stored under " + client_->Url(prefix));
    }
    return names;
  }

  // A server-side copy: the new checkpoint's object is whole on its own,
  // and its bytes never pass through this host. Objects past one
  // CopyObject's limit are left to the caller (it reads and writes them).
  Result<bool> Link(const std::string& from, const std::string& to) override {
    SK_ASSIGN_OR_RETURN(const std::string from_key, ObjectKey(from));
    SK_ASSIGN_OR_RETURN(const std::string to_key, ObjectKey(to));
    SK_ASSIGN_OR_RETURN(std::optional<uint64_t> size, client_->HeadObject(from_key));
    if (!size) return NotFoundError(client_->Url(from_key) + " does not exist");
    if (*size > kMaxCopyObjectBytes) return false;
    SK_ASSIGN_OR_RETURN(std::optional<uint64_t> existing, client_->HeadObject(to_key));
    if (existing) return AlreadyExistsError(client_->Url(to_key) + " exists already");
    // A store without server-side copies cannot link: the caller reads and
    // writes the bytes instead.
    return client_->CopyObject(from_key, to_key);
  }

  Status CreateDir(const std::string& dir) override {
    (void)dir;  // directories are key prefixes; nothing to create
    return Status::Ok();
  }

  Status DeleteFile(const std::string& path) override {
    SK_ASSIGN_OR_RETURN(const std::string key, ObjectKey(path));
    // DELETE answers success for a missing key; the interface wants
    // NotFound, so ask first (a racing deleter may still win in between,
    // which leaves the same outcome).
    SK_ASSIGN_OR_RETURN(std::optional<uint64_t> size, client_->HeadObject(key));
    if (!size) return NotFoundError(client_->Url(key) + " does not exist");
    return client_->DeleteObject(key);
  }

  Status DeleteRecursive(const std::string& path) override {
    const std::string key = ObjectKeyOf(path);
    const std::string prefix = DirectoryPrefix(path);
    std::vector<std::string> keys;
    if (!key.empty() && key.back() != '/') keys.push_back(key);
    SK_ASSIGN_OR_RETURN(ListObjectsPage all, client_->ListAll(prefix, ""));
    // Servers that keep folders (SeaweedFS) leave an empty one behind each
    // deleted key's parent, which listings would still show; deleting the
    // folder names, deepest first, removes them. Elsewhere those keys do
    // not exist and deleting them changes nothing.
    std::map<size_t, std::set<std::string>, std::greater<size_t>> folders;
    if (!prefix.empty()) folders[Depth(prefix)].insert(prefix);
    for (ListedObject& object : all.objects) {
      for (size_t slash = object.key.find('/', prefix.size());
           slash != std::string::npos;
           slash = object.key.find('/', slash + 1)) {
        std::string folder = object.key.substr(0, slash + 1);
        folders[Depth(folder)].insert(std::move(folder));
      }
      keys.push_back(std::move(object.key));
    }
    SK_RETURN_IF_ERROR(DeleteKeys(keys));
    // Uploads left open by writers that died mid-file hold parts the store
    // keeps (and bills) until they are aborted.
    SK_ASSIGN_OR_RETURN(std::vector<MultipartUploadsPage::Upload> uploads,
                        client_->ListMultipartUploads(key));
    for (const MultipartUploadsPage::Upload& upload : uploads) {
      if (upload.key == key || upload.key.rfind(prefix, 0) == 0) {
        SK_RETURN_IF_ERROR(
            client_->AbortMultipartUpload(upload.key, upload.upload_id));
      }
    }
    for (auto& [depth, level] : folders) {
      SK_RETURN_IF_ERROR(
          DeleteKeys(std::vector<std::string>(level.begin(), level.end())));
    }
    return Status::Ok();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    return StorageError(
        "cannot rename " + client_->Url(ObjectKeyOf(from)) + " to " +
        client_->Url(ObjectKeyOf(to)) +
        ": object stores have no rename (checkpoints are committed there "
        "with a conditional PUT)");
  }

  Status SyncDir(const std::string& dir) override {
    (void)dir;  // every successful PUT is durable already
    return Status::Ok();
  }

 private:
  // The key of a file. Keys ending in '/' are refused: some servers treat
  // them as directories.
  Result<std::string> ObjectKey(const std::string& path) const {
    std::string key = ObjectKeyOf(path);
    if (key.empty() || key.back() == '/') {
      return InvalidArgumentError("'" + path + "' in " + client_->Url("") +
                                  " names no object (empty or ending in '/')");
    }
    return key;
  }

  static size_t Depth(const std::string& key) {
    return static_cast<size_t>(std::count(key.begin(), key.end(), '/'));
  }

  // DeleteObjects batches of up to 1000 keys.
  Status DeleteKeys(const std::vector<std::string>& keys) const {
    for (size_t begin = 0; begin < keys.size(); begin += kDeleteBatch) {
      const size_t end = std::min(keys.size(), begin + kDeleteBatch);
      const std::vector<std::string> batch(keys.begin() + begin,
                                           keys.begin() + end);
      if (EncodeDeleteObjects(batch).ok()) {
        SK_RETURN_IF_ERROR(client_->DeleteObjects(batch));
        continue;
      }
      // A key XML cannot carry: one by one.
      for (const std::string& one : batch) {
        SK_RETURN_IF_ERROR(client_->DeleteObject(one));
      }
    }
    return Status::Ok();
  }

  const std::shared_ptr<const S3Client> client_;
  const S3StorageOptions options_;
};

}  // namespace

std::shared_ptr<Storage> NewS3Storage(std::shared_ptr<const S3Client> client,
                                      S3StorageOptions options) {
  return std::make_shared<S3Storage>(std::move(client), options);
}

}  // namespace shardkeep::s3
