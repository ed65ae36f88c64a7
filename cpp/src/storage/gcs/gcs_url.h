// Reading "gs://bucket/prefix".
#pragma once

#include <string>
#include <string_view>

#include "shardkeep/status.h"

namespace shardkeep::gcs {

struct GcsUrl {
  std::string bucket;
  std::string prefix;  // no trailing '/'
};

// InvalidArgument naming `url` when it is not "gs://", the bucket name
// breaks GCS's rules (3-63 characters of a-z 0-9 - _ ., up to 222 when
// dotted with no part over 63, starting and ending with a letter or digit,
// no "goog" prefix), or the prefix has an empty, "." or ".." segment.
Result<GcsUrl> ParseGcsUrl(std::string_view url);

}  // namespace shardkeep::gcs
