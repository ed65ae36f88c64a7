// Maps a storage URL, read by ParseLocation, to a backend and a path
// inside it.

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "shardkeep/location.h"
#include "shardkeep/storage.h"
#include "storage/gcs/gcs_client.h"
#include "storage/gcs/gcs_credentials.h"
#include "storage/gcs/gcs_storage.h"
#include "storage/gcs/gcs_url.h"
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

// One pool of connections for every store of the process.
std::shared_ptr<http::HttpTransport> ProcessTransport() {
  static const std::shared_ptr<http::HttpTransport> transport = http::NewCurlTransport();
  return transport;
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
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<Storage>& storage = (*storages)[key];
  if (storage == nullptr) {
    storage = s3::NewS3Storage(std::make_shared<s3::S3Client>(
        std::move(config), url.bucket, ProcessTransport(), options));
  }
  return storage;
}

// The endpoint and credentials of gs:// URLs: the caller's settings, then
// STORAGE_EMULATOR_HOST (as google-cloud-storage and gcsfs read it: an
// emulator, "host:port" or a URL, reached without credentials), then GCS.
// One storage per configuration and bucket, so that each credential's
// token is fetched once and shared.
Result<std::shared_ptr<Storage>> ProcessGcsStorage(const gcs::GcsUrl& url,
                                                   const GcsOverrides& overrides) {
  std::string endpoint = gcs::kDefaultEndpoint;
  gcs::CredentialsOptions credentials;
  credentials.credentials_file = overrides.credentials_file;
  credentials.anonymous = overrides.anonymous.value_or(false);
  const char* emulator = std::getenv("STORAGE_EMULATOR_HOST");
  if (overrides.endpoint) {
    endpoint = *overrides.endpoint;
  } else if (emulator != nullptr && *emulator != '\0') {
    endpoint = emulator;
    if (endpoint.find("://") == std::string::npos) endpoint = "http://" + endpoint;
    credentials.anonymous = !credentials.credentials_file;
  }
  gcs::GcsClientOptions options;
  options.timeout_s = overrides.timeout_s.value_or(gcs::kDefaultTimeoutS);
  if (!(options.timeout_s > 0)) {
    return InvalidArgumentError("GCS timeout_s must be positive, not " +
                                std::to_string(options.timeout_s));
  }
  credentials.timeout_s = options.timeout_s;
  const std::string key = url.bucket + '\n' + endpoint + '\n' +
                          credentials.credentials_file.value_or("") + '\n' +
                          (credentials.anonymous ? "anonymous" : "found") + '\n' +
                          std::to_string(options.timeout_s);
  static std::mutex mu;
  static auto* storages = new std::map<std::string, std::shared_ptr<Storage>>;
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<Storage>& storage = (*storages)[key];
  if (storage == nullptr) {
    SK_ASSIGN_OR_RETURN(std::shared_ptr<gcs::Credentials> found,
                        gcs::FindCredentials(credentials, gcs::ProcessCredentialsEnvironment(),
                                             ProcessTransport()));
    storage = gcs::NewGcsStorage(std::make_shared<gcs::GcsClient>(
        endpoint, url.bucket, std::move(found), ProcessTransport(), options));
  }
  return storage;
}

}  // namespace

Result<StorageLocation> ResolveStorage(const std::string& url,
                                       const S3Overrides& s3,
                                       const GcsOverrides& gcs) {
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
  } else if (where.scheme == "gs") {
    SK_ASSIGN_OR_RETURN(const gcs::GcsUrl parsed, gcs::ParseGcsUrl(url));
    SK_ASSIGN_OR_RETURN(storage, ProcessGcsStorage(parsed, gcs));
  } else if (where.local_path) {
    storage = NewFileStorage();
  } else {
    return InternalError("storage URL " + url + ": scheme '" + where.scheme +
                         "' has no backend in ResolveStorage");
  }
  return StorageLocation{std::move(storage), std::move(where.path)};
}

}  // namespace shardkeep
