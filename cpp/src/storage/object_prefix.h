// Keys of object stores (S3, GCS): the rule both schemes apply to the
// prefix a URL names (s3://bucket/PREFIX, gs://bucket/PREFIX), and how a
// backend's '/'-separated paths become keys and "directories".
#pragma once

#include <string>
#include <string_view>
#include <vector>

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

// The sorted, distinct names of a directory's children, from a listing of
// `prefix` with delimiter '/': the keys of its objects and the common
// prefixes of its subdirectories, each less `prefix` (and their '/').
std::vector<std::string> ChildNames(const std::string& prefix,
                                    const std::vector<std::string>& keys,
                                    const std::vector<std::string>& common_prefixes);

}  // namespace shardkeep
