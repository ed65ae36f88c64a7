// `<checkpointable>/meta.json`: the kind and, for pytrees, the tree
// structure and one spec per leaf. Pure encode/decode, no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardkeep/contents.h"
#include "shardkeep/status.h"

namespace shardkeep::format {

inline constexpr char kMetaFileName[] = "meta.json";

using ::shardkeep::LeafKind;  // public: shardkeep/contents.h

struct LeafMeta {
  std::string path;               // escaped key path, e.g. "params/w"
  LeafKind kind = LeafKind::kArray;
  std::string dtype;              // numpy name; "" for kString and kNone
  std::vector<uint64_t> shape;    // [] for scalars and 0-d arrays
  nlohmann::json sharding;        // saved sharding description, or null
  nlohmann::json value;           // the value of scalar/string leaves
  std::string prng_impl;          // typed PRNG key data: JAX's impl name
};

struct CheckpointableMeta {
  std::string kind;  // "pytree", "json", "bytes"
  // A kind registered in the Python front, saved as the built-in `kind`.
  std::string registered_kind;
  // For kind "pytree" only: the structure as built by the Python front
  // (docs/FORMAT.md §4.1; checked by the decoder, rebuilt into containers
  // by the Python front) and the leaves in order.
  nlohmann::json tree;
  std::vector<LeafMeta> leaves;
};

// meta.json's text: CheckpointableMetaToJson, indented by two spaces.
std::string EncodeCheckpointableMeta(const CheckpointableMeta& meta);
// The document meta.json holds, fields in the order of docs/FORMAT.md §4.
nlohmann::ordered_json CheckpointableMetaToJson(const CheckpointableMeta& meta);

// Checks types, dtype names (must be known to DTypeFromName for arrays and
// scalars), rank ≤ 64, leaf sizes ≤ 2^63 bytes, unique leaf paths, and
// the tree: node types and fields, as many keys as children, every leaf
// referenced by exactly one leaf node. Errors are Corruption naming `file`
// and the leaf or the tree node (as a JSON pointer, "/tree/children/0").
Result<CheckpointableMeta> DecodeCheckpointableMeta(std::string_view bytes,
                                                    const std::string& file);
// The same checks on a document already parsed (the Python front hands
// the meta of a save over as objects, converted by the binding).
Result<CheckpointableMeta> DecodeCheckpointableMetaDocument(
    nlohmann::json document, const std::string& file);

}  // namespace shardkeep::format
