#include "format/checkpointable_meta.h"

#include <optional>
#include <set>
#include <unordered_set>

#include "format/json_parse.h"
#include "shardkeep/box.h"
#include "shardkeep/dtype.h"

namespace shardkeep::format {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr size_t kMaxRank = 64;
constexpr uint64_t kMaxLeafBytes = uint64_t{1} << 63;

constexpr std::pair<LeafKind, std::string_view> kLeafKinds[] = {
    {LeafKind::kArray, "array"},
    {LeafKind::kScalar, "scalar"},
    {LeafKind::kString, "string"},
    {LeafKind::kNone, "none"},
};

// A scalar leaf holds a JSON bool or number, or one of the strings that
// stand for non-finite floats.
bool IsScalarValue(const nlohmann::json& v) {
  return v.is_boolean() || v.is_number() ||
         (v.is_string() && (v == "nan" || v == "inf" || v == "-inf"));
}

// A leaf holds at most 2^63 bytes, and so does any box of it once its
// zero extents are set aside: box sizes, offsets and element counts the
// engine derives from a leaf then stay in 64 bits.
Status CheckLeafSize(const LeafMeta& leaf) {
  SK_ASSIGN_OR_RETURN(DType dtype, DTypeFromName(leaf.dtype));
  std::vector<uint64_t> nonzero;
  for (uint64_t extent : leaf.shape) {
    if (extent != 0) nonzero.push_back(extent);
  }
  std::optional<uint64_t> bytes = CheckedByteSize(nonzero, DTypeSize(dtype));
  if (!bytes || *bytes > kMaxLeafBytes) {
    return CorruptionError("shape " + nlohmann::json(leaf.shape).dump() + " of " +
                           leaf.dtype + " holds more than 2^63 bytes");
  }
  return Status::Ok();
}

// Checks the "tree" of a pytree's meta.json against FORMAT.md §4.1: every
// node's type and fields, keys/fields as many as children, dict keys
// unique, and every leaf of "leaves" referenced by exactly one leaf node.
// Errors name the node by its JSON pointer from the file's root, e.g.
// "/tree/children/1/children/0".
class TreeChecker {
 public:
  TreeChecker(size_t leaf_count, const std::string& file)
      : file_(file), used_at_(leaf_count) {}

  Status Check(const nlohmann::json& tree) {
    SK_RETURN_IF_ERROR(CheckNode(tree, "/tree"));
    for (size_t i = 0; i < used_at_.size(); ++i) {
      if (used_at_[i].empty()) {
        return CorruptionError(file_ + ": leaf " + std::to_string(i) +
                               " is not referenced by any node of \"tree\"");
      }
    }
    return Status::Ok();
  }

 private:
  // Nesting is bounded by kMaxJsonDepth, so the recursion is too.
  Status CheckNode(const nlohmann::json& node, const std::string& at) {
    auto bad = [&](const std::string& what) {
      return CorruptionError(file_ + ": tree node " + at + ": " + what);
    };
    if (!node.is_object()) return bad("expected an object");
    auto type = node.find("type");
    if (type == node.end() || !type->is_string()) {
      return bad("expected \"type\" to be a string");
    }
    const std::string& kind = type->get_ref<const std::string&>();
    if (kind == "leaf") return CheckLeafNode(node, at);
    const bool keyed = kind == "dict" || kind == "custom";
    const bool named = kind == "namedtuple" || kind == "custom";
    if (!keyed && !named && kind != "list" && kind != "tuple") {
      return bad("expected \"type\" to be leaf, dict, list, tuple, namedtuple "
                 "or custom, found \"" + kind + "\"");
    }
    auto children = node.find("children");
    if (children == node.end() || !children->is_array()) {
      return bad("expected \"children\" to be an array");
    }
    if (named) {
      auto name = node.find("name");
      if (name == node.end() || !name->is_string()) {
        return bad("expected \"name\" to be a string");
      }
    }
    if (keyed || kind == "namedtuple") {
      const char* field = keyed ? "keys" : "fields";
      auto keys = node.find(field);
      if (keys == node.end() || !keys->is_array()) {
        return bad(std::string("expected \"") + field + "\" to be an array");
      }
      if (keys->size() != children->size()) {
        return bad(std::string("has ") + std::to_string(keys->size()) + " " +
                   field + " but " + std::to_string(children->size()) + " children");
      }
      std::set<nlohmann::json> seen;
      for (const nlohmann::json& key : *keys) {
        const bool ok = keyed ? key.is_string() || key.is_number_integer()
                              : key.is_string();
        if (!ok) {
          return bad(std::string("expected ") + field + " to be " +
                     (keyed ? "strings or integers" : "strings") + ", found " +
                     key.dump());
        }
        if (keyed && !seen.insert(key).second) {
          return bad("duplicate key " + key.dump());
        }
      }
    }
    for (size_t i = 0; i < children->size(); ++i) {
      SK_RETURN_IF_ERROR(
          CheckNode((*children)[i], at + "/children/" + std::to_string(i)));
    }
    return Status::Ok();
  }

  Status CheckLeafNode(const nlohmann::json& node, const std::string& at) {
    auto leaf = node.find("leaf");
    // nlohmann holds non-negative integers as unsigned.
    if (leaf == node.end() || !leaf->is_number_unsigned() ||
        leaf->get<uint64_t>() >= used_at_.size()) {
      return CorruptionError(
          file_ + ": tree node " + at + ": expected \"leaf\" to be an integer in "
          "[0, " + std::to_string(used_at_.size()) + "), found " +
          (leaf == node.end() ? std::string("none") : leaf->dump()));
    }
    std::string& used_at = used_at_[leaf->get<uint64_t>()];
    if (!used_at.empty()) {
      return CorruptionError(file_ + ": tree node " + at + ": leaf " +
                             leaf->dump() + " is already used by node " + used_at);
    }
    used_at = at;
    return Status::Ok();
  }

  const std::string& file_;
  std::vector<std::string> used_at_;  // per leaf: the node using it, or ""
};

}  // namespace

nlohmann::ordered_json CheckpointableMetaToJson(const CheckpointableMeta& meta) {
  ordered_json j;
  j["kind"] = meta.kind;
  if (!meta.registered_kind.empty()) j["registered_kind"] = meta.registered_kind;
  if (meta.kind == "pytree") {
    j["tree"] = ordered_json(meta.tree);
    ordered_json leaves = ordered_json::array();
    for (const LeafMeta& leaf : meta.leaves) {
      ordered_json l;
      l["path"] = leaf.path;
      l["kind"] = LeafKindName(leaf.kind);
      l["dtype"] = leaf.dtype.empty() ? ordered_json(nullptr)
                                      : ordered_json(leaf.dtype);
      // Strings and None have no shape; scalars and 0-d arrays have [].
      const bool shaped =
          leaf.kind == LeafKind::kArray || leaf.kind == LeafKind::kScalar;
      l["shape"] = shaped ? ordered_json(leaf.shape) : ordered_json(nullptr);
      l["sharding"] = ordered_json(leaf.sharding);
      if (leaf.kind == LeafKind::kScalar || leaf.kind == LeafKind::kString) {
        l["value"] = ordered_json(leaf.value);
      }
      if (!leaf.prng_impl.empty()) l["prng_impl"] = leaf.prng_impl;
      leaves.push_back(std::move(l));
    }
    j["leaves"] = std::move(leaves);
  }
  return j;
}

std::string EncodeCheckpointableMeta(const CheckpointableMeta& meta) {
  // `replace` keeps dump() from throwing on invalid UTF-8 in user strings.
  return CheckpointableMetaToJson(meta).dump(2, ' ', false,
                                             ordered_json::error_handler_t::replace) +
         "\n";
}

Result<CheckpointableMeta> DecodeCheckpointableMeta(std::string_view bytes,
                                                    const std::string& file) {
  SK_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonObject<nlohmann::json>(bytes, file));
  return DecodeCheckpointableMetaDocument(std::move(j), file);
}

Result<CheckpointableMeta> DecodeCheckpointableMetaDocument(nlohmann::json j,
                                                            const std::string& file) {
  auto corrupt = [&file](const std::string& what) {
    return CorruptionError(file + ": " + what);
  };
  if (!j.is_object()) return corrupt("expected a JSON object");
  auto kind = j.find("kind");
  if (kind == j.end() || !kind->is_string()) {
    return corrupt("expected \"kind\" to be a string");
  }
  CheckpointableMeta meta;
  meta.kind = kind->get<std::string>();
  if (auto registered = j.find("registered_kind"); registered != j.end()) {
    if (!registered->is_string()) {
      return corrupt("expected \"registered_kind\" to be a string");
    }
    meta.registered_kind = registered->get<std::string>();
  }
  if (meta.kind != "pytree") return meta;  // json/bytes: nothing else here

  auto tree = j.find("tree");
  if (tree == j.end() || !tree->is_object()) {
    return corrupt("expected \"tree\" to be an object");
  }
  auto leaves = j.find("leaves");
  if (leaves == j.end() || !leaves->is_array()) {
    return corrupt("expected \"leaves\" to be an array");
  }
  meta.leaves.reserve(leaves->size());
  std::unordered_set<std::string> paths;
  for (size_t i = 0; i < leaves->size(); ++i) {
    nlohmann::json& l = (*leaves)[i];
    std::string where = "leaf " + std::to_string(i);
    auto bad = [&](const std::string& what) {
      return corrupt(where + ": " + what);
    };
    if (!l.is_object()) return bad("expected an object");
    auto path = l.find("path");
    if (path == l.end() || !path->is_string()) {
      return bad("expected \"path\" to be a string");
    }
    LeafMeta leaf;
    leaf.path = path->get<std::string>();
    where += " (\"" + leaf.path + "\")";
    if (!paths.insert(leaf.path).second) return bad("duplicate leaf path");

    auto lkind = l.find("kind");
    if (lkind == l.end() || !lkind->is_string()) {
      return bad("expected \"kind\" to be a string");
    }
    bool known_kind = false;
    for (const auto& [k, name] : kLeafKinds) {
      if (*lkind == name) leaf.kind = k, known_kind = true;
    }
    if (!known_kind) {
      return bad("expected \"kind\" to be array, scalar, string or none");
    }
    const bool shaped =
        leaf.kind == LeafKind::kArray || leaf.kind == LeafKind::kScalar;

    auto dtype = l.find("dtype");
    if (dtype != l.end() && !dtype->is_null()) {
      if (!dtype->is_string()) return bad("expected \"dtype\" to be a string");
      leaf.dtype = dtype->get<std::string>();
    }
    if (shaped && !DTypeFromName(leaf.dtype).ok()) {
      return bad("expected a known dtype, found \"" + leaf.dtype + "\"");
    }

    auto shape = l.find("shape");
    if (shape != l.end() && !shape->is_null()) {
      if (!shape->is_array() || shape->size() > kMaxRank) {
        return bad("expected \"shape\" to be an array of at most " +
                   std::to_string(kMaxRank) + " extents");
      }
      for (const nlohmann::json& extent : *shape) {
        if (!extent.is_number_unsigned()) {
          return bad("expected \"shape\" extents to be non-negative integers");
        }
        leaf.shape.push_back(extent.get<uint64_t>());
      }
    } else if (leaf.kind == LeafKind::kArray) {
      return bad("expected \"shape\" for an array leaf");
    }
    if (shaped) SK_RETURN_IF_ERROR(CheckLeafSize(leaf).WithContext(file + ": " + where));

    if (auto sharding = l.find("sharding"); sharding != l.end()) {
      leaf.sharding = std::move(*sharding);
    }
    if (leaf.kind == LeafKind::kScalar || leaf.kind == LeafKind::kString) {
      auto value = l.find("value");
      if (value == l.end()) return bad("expected a \"value\"");
      if (leaf.kind == LeafKind::kScalar && !IsScalarValue(*value)) {
        return bad("expected \"value\" to be a bool, a number, \"nan\", "
                   "\"inf\" or \"-inf\"");
      }
      if (leaf.kind == LeafKind::kString && !value->is_string()) {
        return bad("expected \"value\" to be a string");
      }
      leaf.value = std::move(*value);
    }
    if (auto prng = l.find("prng_impl"); prng != l.end()) {
      if (!prng->is_string()) return bad("expected \"prng_impl\" to be a string");
      leaf.prng_impl = prng->get<std::string>();
    }
    meta.leaves.push_back(std::move(leaf));
  }
  SK_RETURN_IF_ERROR(TreeChecker(meta.leaves.size(), file).Check(*tree));
  meta.tree = std::move(*tree);
  return meta;
}

}  // namespace shardkeep::format
