#include "storage/gcs/gcs_url.h"

#include <cctype>

#include "storage/object_prefix.h"

namespace shardkeep::gcs {
namespace {

std::string BucketNameProblem(std::string_view name) {
  const bool dotted = name.find('.') != std::string_view::npos;
  if (name.size() < 3 || name.size() > (dotted ? 222u : 63u)) {
    return "a bucket name has 3 to 63 characters (222 when dotted)";
  }
  for (const char c : name) {
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) {
      return "a bucket name has only lowercase letters, digits, '-', '_' and '.'";
    }
  }
  if (!std::isalnum(static_cast<unsigned char>(name.front())) ||
      !std::isalnum(static_cast<unsigned char>(name.back()))) {
    return "a bucket name starts and ends with a letter or a digit";
  }
  size_t start = 0;
  while (start <= name.size()) {
    const size_t end = std::min(name.find('.', start), name.size());
    if (end - start > 63) return "each dotted part of a bucket name has at most 63 characters";
    start = end + 1;
  }
  if (name.rfind("goog", 0) == 0) return "a bucket name may not start with \"goog\"";
  return "";
}

}  // namespace

Result<GcsUrl> ParseGcsUrl(std::string_view url) {
  constexpr std::string_view kScheme = "gs://";
  const auto invalid = [&](const std::string& why) {
    return InvalidArgumentError("invalid GCS URL '" + std::string(url) + "': " + why);
  };
  if (url.substr(0, kScheme.size()) != kScheme) return invalid("it does not start with gs://");
  const std::string_view rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  GcsUrl parsed;
  parsed.bucket = std::string(rest.substr(0, slash));
  const std::string problem = BucketNameProblem(parsed.bucket);
  if (!problem.empty()) return invalid(problem);
  ObjectPrefix prefix =
      CheckObjectPrefix(slash == std::string_view::npos ? "" : rest.substr(slash + 1));
  if (!prefix.problem.empty()) return invalid(prefix.problem);
  parsed.prefix = std::move(prefix.prefix);
  return parsed;
}

}  // namespace shardkeep::gcs
