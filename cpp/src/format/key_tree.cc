#include "format/key_tree.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>

#include "core/decimal.h"
#include "shardkeep/contents.h"

namespace shardkeep::format {
namespace {

// A node while the tree is built: a leaf (or an empty container, which is
// a leaf of the building: nothing may go below it) or a container whose
// children are named in the order of their first entry.
struct Node {
  enum class Kind { kValue, kDict, kList } kind = Kind::kValue;
  KeyedValue value = KeyedValue::kLeaf;
  size_t leaf = 0;
  std::vector<std::string> names;
  std::vector<Node> children;
};

std::string Named(const std::vector<TreeKey>& keys, size_t count) {
  const std::vector<TreeKey> prefix(keys.begin(), keys.begin() + count);
  const std::string path = EscapedKeyPath(prefix);
  return "'" + (path.empty() ? std::string("<root>") : path) + "'";
}

// The number a name of decimal digits spells, or nullopt.
std::optional<uint64_t> Number(const std::string& name) {
  const std::optional<int64_t> value =
      DecimalValue(name, std::numeric_limits<int64_t>::max());
  if (!value) return std::nullopt;
  return static_cast<uint64_t>(*value);
}

Node ValueNode(KeyedValue value, size_t leaf) {
  Node node;
  node.value = value;
  node.leaf = leaf;
  return node;
}

Result<nlohmann::json> Encode(const Node& node, std::vector<TreeKey>& keys,
                              std::string_view where) {
  if (node.kind == Node::Kind::kValue) {
    switch (node.value) {
      case KeyedValue::kLeaf: return nlohmann::json{{"type", "leaf"}, {"leaf", node.leaf}};
      case KeyedValue::kEmptyDict:
        return nlohmann::json{{"type", "dict"},
                              {"keys", nlohmann::json::array()},
                              {"children", nlohmann::json::array()}};
      case KeyedValue::kEmptyList:
        return nlohmann::json{{"type", "list"}, {"children", nlohmann::json::array()}};
    }
  }
  const bool list = node.kind == Node::Kind::kList;
  // A list's children go in position order: the names must be exactly
  // "0".."n-1" (no gaps, no leading zeros).
  std::vector<size_t> order(node.names.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (list) {
    std::vector<std::optional<size_t>> slot(node.names.size());
    bool complete = true;
    for (size_t i = 0; i < node.names.size(); ++i) {
      const std::string& name = node.names[i];
      const size_t p = Number(name).value_or(node.names.size());
      if (p >= node.names.size() || std::to_string(p) != name || slot[p]) {
        complete = false;
        break;
      }
      slot[p] = i;
    }
    if (!complete) {
      // Numbers in order, after anything that is not one.
      auto number = [](const std::string& name) {
        const std::optional<uint64_t> n = Number(name);
        return n ? static_cast<int64_t>(*n) : int64_t{-1};
      };
      std::vector<std::string> positions = node.names;
      std::stable_sort(positions.begin(), positions.end(),
                       [&](const auto& a, const auto& b) { return number(a) < number(b); });
      std::string listed;
      for (const std::string& p : positions) listed += (listed.empty() ? "'" : ", '") + p + "'";
      return CorruptionError(std::string(where) + ": list " + Named(keys, keys.size()) +
                             " has positions [" + listed + "], not 0.." +
                             std::to_string(static_cast<long long>(positions.size()) - 1));
    }
    for (size_t p = 0; p < slot.size(); ++p) order[p] = *slot[p];
  }
  nlohmann::json children = nlohmann::json::array();
  nlohmann::json names = nlohmann::json::array();
  for (size_t i : order) {
    keys.push_back({node.names[i], list});
    Result<nlohmann::json> child = Encode(node.children[i], keys, where);
    keys.pop_back();
    SK_RETURN_IF_ERROR(child.status());
    children.push_back(std::move(*child));
    names.push_back(node.names[i]);
  }
  if (list) return nlohmann::json{{"type", "list"}, {"children", std::move(children)}};
  return nlohmann::json{{"type", "dict"}, {"keys", std::move(names)},
                        {"children", std::move(children)}};
}

}  // namespace

std::string EscapedKeyPath(const std::vector<TreeKey>& keys) {
  std::string path;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i) path += '/';
    path += EscapeKey(keys[i].name);
  }
  return path;
}

Result<nlohmann::json> TreeFromKeys(const std::vector<KeyedEntry>& entries,
                                    std::string_view where) {
  const std::string prefix(where);
  size_t leaves = 0;
  std::optional<Node> root;
  for (const KeyedEntry& entry : entries) {
    const size_t leaf = leaves;
    if (entry.value == KeyedValue::kLeaf) ++leaves;
    if (entry.keys.empty()) {
      if (entries.size() != 1) {
        return CorruptionError(prefix + ": a leaf at the root beside other leaves");
      }
      root = ValueNode(entry.value, leaf);
      break;
    }
    if (!root) {
      root.emplace();
      root->kind = entry.keys[0].position ? Node::Kind::kList : Node::Kind::kDict;
    }
    Node* node = &*root;
    for (size_t depth = 0; depth < entry.keys.size(); ++depth) {
      const TreeKey& key = entry.keys[depth];
      if (node->kind == Node::Kind::kValue) {
        return CorruptionError(prefix + ": " + Named(entry.keys, depth) +
                               " is both a leaf and a node");
      }
      if ((node->kind == Node::Kind::kList) != key.position) {
        return CorruptionError(prefix + ": " + Named(entry.keys, depth) +
                               " is used both as a list and as a dict");
      }
      const auto it = std::find(node->names.begin(), node->names.end(), key.name);
      const bool last = depth + 1 == entry.keys.size();
      if (it == node->names.end()) {
        node->names.push_back(key.name);
        if (last) {
          node->children.push_back(ValueNode(entry.value, leaf));
        } else {
          Node child;
          child.kind = entry.keys[depth + 1].position ? Node::Kind::kList : Node::Kind::kDict;
          node->children.push_back(std::move(child));
        }
        node = &node->children.back();
        continue;
      }
      node = &node->children[it - node->names.begin()];
      if (last) {
        return CorruptionError(prefix + ": two leaves at " + Named(entry.keys, depth + 1));
      }
    }
  }
  if (!root) {  // nothing at all: an empty dict
    root.emplace();
    root->kind = Node::Kind::kDict;
  }
  std::vector<TreeKey> keys;
  return Encode(*root, keys, where);
}

}  // namespace shardkeep::format
