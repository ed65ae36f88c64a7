// Maps a storage URL, read by ParseLocation, to a backend and a path
// inside it.

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "shardkeep/location.h"
#include "shardkeep/storage.h"
#include "storage/http/curl_transport.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_location.h"
#include "storage/s3/s3_storage.h"

namespace shardkeep {
namespace {

// One store for the whole process, so that "memory://x" names the same
// bytes wherever it is resolved (like a path on a shared file system).
std::shared_ptr<Storage> ProcessMemoryStorage() {
  static const std::shared_ptr<Storage> storage = NewMemoryStorage();
  return storage;
}

// The same for the object-store mode; its own keys, since the two modes
// disagree on what a directory is.
std::shared_ptr<Storage> ProcessMemoryObjectStorage() {
  static const std::shared_ptr<Storage> storage =
      NewMemoryStorage(MemoryStorageMode::kObjectStore);
  return storage;
}

// One storage per resolved configuration and bucket for the whole process,
// so that every checkpoint in a bucket shares one pool of connections.
Result<std::shared_ptr<Storage>> ProcessS3Storage(const s3::S3Url& url,
                                                  const S3Overrides& overrides) {
  SK_ASSIGN_OR_RETURN(
      s3::S3Config config,
      s3::ResolveS3Config(url.bucket, overrides,
                          s3::ProcessConfigEnvironment()));
  s3::S3ClientOptions options;
  options.timeout_s = overrides.timeout_s.value_or(s3::kDefaultTimeoutS);
  if (!(options.timeout_s > 0)) {
    return InvalidArgumentError("S3 timeout_s must be positive, not " +
                                std::to_string(options.timeout_s));
  }
  // The secret is part of the key (two secrets are two stores) but the key
  // is never printed.
  const std::string key =
      url.bucket + '\n' + config.endpoint + '\n' + config.region + '\n' +
      (config.path_style ? "path" : "host") + '\n' +
      config.credentials.access_key_id + '\n' +
      config.credentials.secret_access_key + '\n' +
      config.credentials.session_token + '\n' +
      std::to_string(options.timeout_s);
  static std::mutex mu;
  static auto* storages = new std::map<std::string, std::shared_ptr<Storage>>;
  static const std::shared_ptr<http::HttpTransport> transport =
      http::NewCurlTransport();
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<Storage>& storage = (*storages)[key];
  if (storage == nullptr) {
    storage = s3::NewS3Storage(std::make_shared<s3::S3Client>(
        std::move(config), url.bucket, transport, options));
  }
  return storage;
}

}  // namespace

Result<StorageLocation> ResolveStorage(const std::string& url,
                                       const S3Overrides& s3) {
  SK_ASSIGN_OR_RETURN(Location where, ParseLocation(url));
  std::shared_ptr<Storage> storage;
  if (where.scheme == "memory") {
    storage = ProcessMemoryStorage();
  } else if (where.scheme == "memory-objects") {
    storage = ProcessMemoryObjectStorage();
  } else if (where.scheme == "s3") {
    // Valid: ParseLocation checked it the same way.
    SK_ASSIGN_OR_RETURN(const s3::S3Url parsed, s3::ParseS3Url(url));
    SK_ASSIGN_OR_RETURN(storage, ProcessS3Storage(parsed, s3));
  } else if (where.local_path) {
    storage = NewFileStorage();
  } else {
    return InternalError("storage URL " + url + ": scheme '" + where.scheme +
                         "' has no backend in ResolveStorage");
  }
  return StorageLocation{std::move(storage), std::move(where.path)};
}

}  // namespace shardkeep
