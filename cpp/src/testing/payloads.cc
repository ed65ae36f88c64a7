#include "testing/payloads.h"

#include "format/checkpointable_meta.h"

namespace shardkeep::testdata {

std::string PytreeMetaJson(const std::vector<ArrayLeaf>& leaves) {
  format::CheckpointableMeta meta;
  meta.kind = "pytree";
  // A flat dict: {path: leaf, ...}.
  meta.tree = {{"type", "dict"}, {"keys", nlohmann::json::array()},
               {"children", nlohmann::json::array()}};
  for (const ArrayLeaf& leaf : leaves) {
    meta.tree["keys"].push_back(leaf.path);
    meta.tree["children"].push_back(
        {{"type", "leaf"}, {"leaf", meta.leaves.size()}});
    format::LeafMeta entry;
    entry.path = leaf.path;
    entry.dtype = leaf.dtype;
    entry.shape = leaf.shape;
    meta.leaves.push_back(std::move(entry));
  }
  return format::EncodeCheckpointableMeta(meta);
}

CheckpointablePayload PytreePayload(const std::string& name,
                                    const std::vector<ArrayLeaf>& leaves) {
  CheckpointablePayload payload;
  payload.name = name;
  payload.kind = "pytree";
  payload.meta_json = PytreeMetaJson(leaves);
  return payload;
}

CheckpointablePayload BytesPayload(const std::string& name, const std::string& value) {
  CheckpointablePayload payload;
  payload.name = name;
  payload.kind = "bytes";
  payload.meta_json = R"({"kind": "bytes"})";
  payload.value = value;
  return payload;
}

}  // namespace shardkeep::testdata
