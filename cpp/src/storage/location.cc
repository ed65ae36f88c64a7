// Reads a storage URL into a Location (shardkeep/location.h). The schemes
// this build knows are listed once, here; ResolveStorage gives each its
// backend.

#include "shardkeep/location.h"

#include <cctype>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <vector>

#include "storage/gcs/gcs_url.h"
#include "storage/s3/s3_location.h"

namespace shardkeep {
namespace {

struct SchemeTraits {
  std::string_view name;
  bool local;         // a path of this machine's file system
  bool object_store;  // keys only, no rename
};

constexpr SchemeTraits kSchemes[] = {
    {"file", true, false},
    {"memory", false, false},
    {"memory-objects", false, true},
    {"s3", false, true},
    {"gs", false, true},
};

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

std::string_view StripTrailingSlashes(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  return path;
}

// `path` made absolute against the working directory, its "", "." and ".."
// segments resolved lexically (symbolic links are not followed: a link's
// ".." is the link's parent, as os.path.abspath and `cd` read it).
Result<std::string> AbsoluteNormalPath(const std::string& url, std::string_view path) {
  std::string absolute;
  if (path.front() != '/') {
    std::error_code error;
    const std::filesystem::path cwd = std::filesystem::current_path(error);
    if (error) {
      return StorageError("storage URL '" + url +
                          "' is relative, and the working directory cannot be read: " +
                          error.message());
    }
    absolute = cwd.string() + "/";
  }
  absolute += path;
  std::vector<std::string_view> segments;
  std::string_view rest = absolute;
  while (!rest.empty()) {
    const size_t slash = rest.find('/');
    const std::string_view segment = rest.substr(0, slash);
    rest = slash == std::string_view::npos ? "" : rest.substr(slash + 1);
    if (segment.empty() || segment == ".") continue;
    if (segment == "..") {
      if (!segments.empty()) segments.pop_back();
      continue;
    }
    segments.push_back(segment);
  }
  std::string normal;
  for (const std::string_view segment : segments) {
    normal += '/';
    normal += segment;
  }
  return normal.empty() ? "/" : normal;
}

}  // namespace

Result<Location> ParseLocation(const std::string& url) {
  Location location;
  location.url = url;
  std::string_view scheme = "file";
  std::string_view path = url;
  const size_t separator = url.find("://");
  if (separator != std::string::npos && IsScheme(std::string_view(url).substr(0, separator))) {
    scheme = std::string_view(url).substr(0, separator);
    path = std::string_view(url).substr(separator + 3);
  }
  const SchemeTraits* traits = nullptr;
  for (const SchemeTraits& known : kSchemes) {
    if (known.name == scheme) traits = &known;
  }
  if (traits == nullptr) {
    return InvalidArgumentError("storage URL " + url + ": unknown scheme '" +
                                std::string(scheme) + "'");
  }
  if (path.empty()) {
    return InvalidArgumentError("storage URL '" + url + "' names no path");
  }
  location.scheme = traits->name;
  location.object_store = traits->object_store;
  if (traits->local) {
    // The backend opens the key itself: were it handed "/b/../a", the
    // file system would need /b to exist and would follow /b if it is a
    // link, and the key would not name what is opened.
    location.storage = "file";
    SK_ASSIGN_OR_RETURN(location.key, AbsoluteNormalPath(url, path));
    location.path = location.key;
    location.local_path = location.key;
    return location;
  }
  if (scheme == "s3") {
    SK_ASSIGN_OR_RETURN(s3::S3Url parsed, s3::ParseS3Url(url));
    if (parsed.prefix.empty()) {
      return InvalidArgumentError("storage URL '" + url + "' names a bucket but no path in it");
    }
    location.storage = "s3://" + parsed.bucket;
    location.path = std::move(parsed.prefix);
    location.key = location.storage + "/" + location.path;
    return location;
  }
  if (scheme == "gs") {
    SK_ASSIGN_OR_RETURN(gcs::GcsUrl parsed, gcs::ParseGcsUrl(url));
    if (parsed.prefix.empty()) {
      return InvalidArgumentError("storage URL '" + url + "' names a bucket but no path in it");
    }
    location.storage = "gs://" + parsed.bucket;
    location.path = std::move(parsed.prefix);
    location.key = location.storage + "/" + location.path;
    return location;
  }
  // A process-wide memory store: one per scheme.
  location.storage = location.scheme;
  location.path = StripTrailingSlashes(path);
  location.key = location.scheme + "://" + location.path;
  return location;
}

}  // namespace shardkeep
