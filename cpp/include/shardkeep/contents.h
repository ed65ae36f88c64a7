// What a committed checkpoint holds, in plain types: its commit record and,
// per pytree checkpointable, its tree and leaves. CheckpointReader returns
// these (Info(), Pytree()); C++ programs and the command-line tool use them
// instead of parsing meta.json or _SHARDKEEP themselves.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardkeep/dtype.h"

namespace shardkeep {

struct CheckpointableInfo {
  std::string name;  // also its folder name
  std::string kind;  // "pytree", "json" or "bytes"
};

// The decoded `_SHARDKEEP`.
struct CheckpointInfo {
  std::optional<int64_t> step;
  int64_t created_ns = 0;    // wall clock when the save started (Unix epoch)
  int64_t committed_ns = 0;  // wall clock when it committed
  int process_count = 1;     // processes that wrote it
  std::vector<CheckpointableInfo> checkpointables;  // in save order
  std::string custom_metadata_json = "{}";  // JSON objects, as saved
  std::string metrics_json = "{}";
};

enum class LeafKind {
  kArray,   // bytes in chunks; dtype and shape set
  kScalar,  // a Python bool/int/float: dtype set, shape [], value_json set
  kString,  // a Python str: value_json holds the JSON string
  kNone,    // Python None
};

// "array", "scalar", "string", "none".
std::string_view LeafKindName(LeafKind kind);

struct LeafInfo {
  uint32_t index = 0;  // position in the checkpointable's leaves
  // Key path: keys joined by '/', '~' escaped as "~0" and '/' as "~1".
  std::string path;
  LeafKind kind = LeafKind::kArray;
  std::optional<DType> dtype;   // arrays and scalars
  std::vector<uint64_t> shape;  // arrays; [] for scalars and 0-d arrays
  // The saved sharding's description as JSON ("null" when none); written
  // and interpreted by the Python front.
  std::string sharding_json = "null";
  std::string value_json;  // scalars and strings: the value as JSON
  std::string prng_impl;   // typed PRNG key data: the JAX implementation

  // Elements × itemsize for arrays (0 for other kinds).
  uint64_t nbytes() const;
};

struct PytreeInfo {
  // A kind registered in the Python front and saved as a pytree, or "".
  std::string registered_kind;
  // The tree's structure as JSON (node types, keys and leaf positions; see
  // docs/FORMAT.md), for programs that rebuild containers.
  std::string tree_json;
  std::vector<LeafInfo> leaves;  // in flattening order
  // Bytes of the leaves' chunks as stored (after compression), per leaf.
  std::vector<uint64_t> stored_bytes;

  // The leaf with this key path (escaped, as in LeafInfo::path), or null.
  const LeafInfo* Find(std::string_view path) const;
};

// Escapes one key for a key path ('~' → "~0", '/' → "~1") and back.
std::string EscapeKey(std::string_view key);
std::string UnescapeKey(std::string_view segment);

}  // namespace shardkeep
