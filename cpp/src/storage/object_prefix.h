// Keys of object stores (S3, GCS): the rule both schemes apply to the
// prefix a URL names (s3://bucket/PREFIX, gs://bucket/PREFIX), and how a
// backend's '/'-separated paths become keys and "directories".
#pragma once

#include <string>
#include <string_view>

namespace shardkeep {

// `prefix` without its trailing '/'s; `problem` says why it is refused
// (empty when it is fine): an empty, "." or ".." segment would name a
// different key than a file system path spelled the same.
struct ObjectPrefix {
  std::string prefix;
  std::string problem;
};
ObjectPrefix CheckObjectPrefix(std::string_view prefix);

// A path as a key: leading '/' dropped (paths are relative to the bucket).
std::string ObjectKeyOf(const std::string& path);
// The prefix that holds a directory's keys: "dir/", or "" for the bucket.
std::string DirectoryPrefix(const std::string& path);

}  // namespace shardkeep
