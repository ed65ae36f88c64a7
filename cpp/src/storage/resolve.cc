// Maps a storage URL to a backend and a path inside it.

#include <cctype>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "shardkeep/storage.h"
#include "storage/s3/curl_transport.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_location.h"
#include "storage/s3/s3_storage.h"

namespace shardkeep {
namespace {

// RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ). Anything else before
// "://" means the string is a path that happens to contain "://".
bool IsScheme(std::string_view s) {
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0]))) {
    return false;
  }
  for (const char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' &&
        c != '-' && c != '.') {
      return false;
    }
  }
  return true;
}

std::string StripTrailingSlashes(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  return std::string(path);
}

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
  static const std::shared_ptr<s3::HttpTransport> transport =
      s3::NewCurlTransport();
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<Storage>& storage = (*storages)[key];
  if (storage == nullptr) {
    storage = s3::NewS3Storage(std::make_shared<s3::S3Client>(
        std::move(config), url.bucket, transport, options));
  }
  return storage;
}

// The URL's scheme ("" for a plain path) and what follows "://".
std::pair<std::string_view, std::string_view> SplitScheme(std::string_view url) {
  const size_t separator = url.find("://");
  if (separator == std::string_view::npos || !IsScheme(url.substr(0, separator))) {
    return {"", url};
  }
  return {url.substr(0, separator), url.substr(separator + 3)};
}

}  // namespace

std::optional<std::string> LocalFilePath(const std::string& url) {
  const auto [scheme, path] = SplitScheme(url);
  if (!scheme.empty() && scheme != "file") return std::nullopt;
  return StripTrailingSlashes(path);
}

Result<StorageLocation> ResolveStorage(const std::string& url,
                                       const S3Overrides& s3) {
  std::shared_ptr<Storage> storage;
  const auto [scheme, path] = SplitScheme(url);
  if (!scheme.empty()) {
    if (scheme == "memory") {
      storage = ProcessMemoryStorage();
    } else if (scheme == "memory-objects") {
      storage = ProcessMemoryObjectStorage();
    } else if (scheme == "file") {
      storage = NewFileStorage();
    } else if (scheme == "s3") {
      SK_ASSIGN_OR_RETURN(s3::S3Url parsed, s3::ParseS3Url(url));
      if (parsed.prefix.empty()) {
        return InvalidArgumentError("storage URL '" + url +
                                    "' names a bucket but no path in it");
      }
      SK_ASSIGN_OR_RETURN(storage, ProcessS3Storage(parsed, s3));
      return StorageLocation{std::move(storage), parsed.prefix};
    } else {
      return InvalidArgumentError("storage URL " + url + ": unknown scheme '" +
                                  std::string(scheme) + "'");
    }
  } else {
    storage = NewFileStorage();
  }
  if (path.empty()) {
    return InvalidArgumentError("storage URL '" + url + "' names no path");
  }
  return StorageLocation{std::move(storage), StripTrailingSlashes(path)};
}

}  // namespace shardkeep
