#include "format/pytree_info.h"

#include "shardkeep/dtype.h"

namespace shardkeep::format {
namespace {

nlohmann::json Parsed(const std::string& text) {
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

}  // namespace

PytreeInfo PytreeInfoOf(const CheckpointableMeta& meta) {
  PytreeInfo info;
  info.registered_kind = meta.registered_kind;
  info.tree_json = meta.tree.dump();
  info.leaves.reserve(meta.leaves.size());
  for (size_t i = 0; i < meta.leaves.size(); ++i) {
    const LeafMeta& leaf = meta.leaves[i];
    LeafInfo out;
    out.index = static_cast<uint32_t>(i);
    out.path = leaf.path;
    out.kind = leaf.kind;
    // The decoder has checked the names of array and scalar dtypes.
    if (auto dtype = DTypeFromName(leaf.dtype); dtype.ok()) out.dtype = *dtype;
    out.shape = leaf.shape;
    out.sharding_json = leaf.sharding.dump();
    if (!leaf.value.is_null()) out.value_json = leaf.value.dump();
    out.prng_impl = leaf.prng_impl;
    info.leaves.push_back(std::move(out));
  }
  return info;
}

nlohmann::json PytreeDocumentOf(const PytreeInfo& info) {
  nlohmann::json j;
  j["kind"] = "pytree";
  if (!info.registered_kind.empty()) j["registered_kind"] = info.registered_kind;
  j["tree"] = Parsed(info.tree_json);
  nlohmann::json leaves = nlohmann::json::array();
  for (const LeafInfo& leaf : info.leaves) {
    nlohmann::json l;
    l["path"] = leaf.path;
    l["kind"] = LeafKindName(leaf.kind);
    l["dtype"] = leaf.dtype ? nlohmann::json(DTypeName(*leaf.dtype)) : nlohmann::json(nullptr);
    const bool shaped = leaf.kind == LeafKind::kArray || leaf.kind == LeafKind::kScalar;
    l["shape"] = shaped ? nlohmann::json(leaf.shape) : nlohmann::json(nullptr);
    l["sharding"] = Parsed(leaf.sharding_json);
    if (!leaf.value_json.empty()) l["value"] = Parsed(leaf.value_json);
    if (!leaf.prng_impl.empty()) l["prng_impl"] = leaf.prng_impl;
    leaves.push_back(std::move(l));
  }
  j["leaves"] = std::move(leaves);
  return j;
}

}  // namespace shardkeep::format
