// A meta.json tree (docs/FORMAT.md §4.1) built from where each leaf sits,
// given as a list of keys: nested dicts and lists. The one builder of
// such trees: CheckpointWriter builds its default tree from the leaves'
// key paths with it, and the Python front's readers of other formats
// (Orbax, PyTorch DCP), whose files name a leaf's place by its keys,
// through the binding. Pure, no I/O.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardkeep/status.h"

namespace shardkeep::format {

// One key of a leaf's place: a dict key (its unescaped string), or a list
// position (its decimal string) when `position`.
struct TreeKey {
  std::string name;
  bool position = false;
};

// What sits at an entry's keys: a leaf, or an empty container (which
// takes no leaf number).
enum class KeyedValue { kLeaf, kEmptyDict, kEmptyList };

struct KeyedEntry {
  std::vector<TreeKey> keys;
  KeyedValue value = KeyedValue::kLeaf;
};

// The tree holding, at each entry's keys, leaf node n for the n-th leaf
// entry (or the empty container). Dict keys keep the order of their first
// entry; a list's positions must be 0..n-1. An entry without keys is the
// whole tree and must be the only entry. Corruption, prefixed with
// `where`, when two entries claim one place, a node is used both as a
// dict and as a list or both as a leaf and a node, or a list's positions
// have gaps; places are named by key path (EscapedKeyPath).
Result<nlohmann::json> TreeFromKeys(const std::vector<KeyedEntry>& entries,
                                    std::string_view where);

// The escaped key path of `keys` (LeafInfo::path): each name escaped with
// EscapeKey, joined by '/'.
std::string EscapedKeyPath(const std::vector<TreeKey>& keys);

}  // namespace shardkeep::format
