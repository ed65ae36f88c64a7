#include "format/checkpointable_meta.h"

#include <unordered_set>

#include "format/json_parse.h"
#include "shardkeep/dtype.h"

namespace shardkeep::format {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr size_t kMaxRank = 64;

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

}  // namespace

std::string_view LeafKindName(LeafKind kind) {
  for (const auto& [k, name] : kLeafKinds) {
    if (k == kind) return name;
  }
  return "unknown";
}

std::string EncodeCheckpointableMeta(const CheckpointableMeta& meta) {
  ordered_json j;
  j["kind"] = meta.kind;
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
      leaves.push_back(std::move(l));
    }
    j["leaves"] = std::move(leaves);
  }
  // `replace` keeps dump() from throwing on invalid UTF-8 in user strings.
  return j.dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

Result<CheckpointableMeta> DecodeCheckpointableMeta(std::string_view bytes,
                                                    const std::string& file) {
  auto corrupt = [&file](const std::string& what) {
    return CorruptionError(file + ": " + what);
  };
  SK_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonObject<nlohmann::json>(bytes, file));
  auto kind = j.find("kind");
  if (kind == j.end() || !kind->is_string()) {
    return corrupt("expected \"kind\" to be a string");
  }
  CheckpointableMeta meta;
  meta.kind = kind->get<std::string>();
  if (meta.kind != "pytree") return meta;  // json/bytes: nothing else here

  auto tree = j.find("tree");
  if (tree == j.end() || !tree->is_object()) {
    return corrupt("expected \"tree\" to be an object");
  }
  meta.tree = std::move(*tree);
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
    meta.leaves.push_back(std::move(leaf));
  }
  return meta;
}

}  // namespace shardkeep::format
