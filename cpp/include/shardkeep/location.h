// Where a checkpoint lives, as its URL says: the one reading of a storage
// URL that every caller (the resolver, the command line, the Python front)
// asks, so that "is this local", "are these one store" and "are these one
// checkpoint" have a single answer. Parsing opens nothing; ResolveStorage
// (storage.h) turns a location into a backend.
//
// Spellings of one checkpoint share a key (docs/DESIGN_NOTES.md, "One
// Location"): a local path is made absolute and normalised lexically
// ("/a", "/a/", "file:///a", "/b/../a", "a" run in "/" are one key, "/a"),
// and the file backend opens that key, so the key is what is opened;
// a URL of another store keeps its path as written but for trailing '/'
// (an object key's ".." or "//" is a different key, not a step up).
#pragma once

#include <optional>
#include <string>

#include "shardkeep/status.h"

namespace shardkeep {

struct Location {
  // The URL as given.
  std::string url;
  // "file" (plain paths and file:// URLs), "s3", "gs", "memory" or
  // "memory-objects".
  std::string scheme;
  // What makes two locations one store, so that a checkpoint in one may
  // name files of the other (a save reusing an earlier one's arrays):
  // "file" for the local file system, "s3://<bucket>" or "gs://<bucket>" for a bucket (the
  // endpoint and credentials come from the call's settings, shared by both
  // paths), the scheme for the process-wide memory stores.
  std::string storage;
  // The canonical spelling: equal keys are one checkpoint. A local path's
  // key is its absolute, normalised path ("/a/b"); another store's is
  // "<scheme>://<path>" without trailing '/'.
  std::string key;
  // The path inside the store that ResolveStorage hands its backend: a
  // local path's key (so what is opened is what the key names), an S3 key
  // prefix, a memory store's name and path; never a trailing '/'.
  std::string path;
  // The absolute, normalised path on this machine's file system when the
  // scheme is "file" (equal to `key`), else nullopt.
  std::optional<std::string> local_path;
  // Keys only, no rename (S3, GCS, memory-objects): saves commit by generation
  // folders, and loads read once per job and broadcast by default.
  bool object_store = false;
};

// InvalidArgument naming `url` for an unknown scheme, an empty path, or an
// s3:// or gs:// URL that the store refuses (a bad bucket name, no key prefix, an empty,
// "." or ".." segment); Storage when a relative path cannot be made
// absolute (the working directory is gone). A string whose part before
// "://" is no scheme (RFC 3986: a letter, then letters, digits, '+', '-',
// '.') is a plain path: "dir/a://b".
Result<Location> ParseLocation(const std::string& url);

}  // namespace shardkeep
