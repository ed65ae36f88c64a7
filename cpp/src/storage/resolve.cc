// Maps a storage URL to a backend and a path inside it.

#include <cctype>
#include <memory>
#include <string>
#include <string_view>

#include "shardkeep/storage.h"

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

}  // namespace

Result<StorageLocation> ResolveStorage(const std::string& url,
                                       const S3Overrides& s3) {
  (void)s3;  // used once the S3 backend resolves s3:// URLs
  std::shared_ptr<Storage> storage;
  std::string_view path = url;
  const size_t separator = url.find("://");
  const std::string_view scheme = std::string_view(url).substr(0, separator);
  if (separator != std::string::npos && IsScheme(scheme)) {
    path.remove_prefix(separator + 3);
    if (scheme == "memory") {
      storage = ProcessMemoryStorage();
    } else if (scheme == "memory-objects") {
      storage = ProcessMemoryObjectStorage();
    } else if (scheme == "file") {
      storage = NewFileStorage();
    } else if (scheme == "s3") {
      return InvalidArgumentError("storage URL " + url +
                                  ": s3:// is not supported yet");
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
