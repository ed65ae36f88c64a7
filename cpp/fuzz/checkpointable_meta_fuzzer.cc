// Fuzzes DecodeCheckpointableMeta (leaves and tree). A meta.json that
// decodes must encode to a document that decodes to the same content.
#include <cstdint>
#include <string>

#include "format/checkpointable_meta.h"
#include "fuzz_check.h"

using shardkeep::format::CheckpointableMeta;

namespace {

bool Same(const CheckpointableMeta& a, const CheckpointableMeta& b) {
  if (a.kind != b.kind || a.tree != b.tree || a.leaves.size() != b.leaves.size()) {
    return false;
  }
  for (size_t i = 0; i < a.leaves.size(); ++i) {
    const auto& x = a.leaves[i];
    const auto& y = b.leaves[i];
    // Only arrays and scalars have a shape; the encoder drops any other.
    const bool shaped = x.kind == shardkeep::format::LeafKind::kArray ||
                        x.kind == shardkeep::format::LeafKind::kScalar;
    if (x.path != y.path || x.kind != y.kind || x.dtype != y.dtype ||
        (shaped && x.shape != y.shape) || x.sharding != y.sharding ||
        x.value != y.value) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto meta = shardkeep::format::DecodeCheckpointableMeta(bytes, "meta.json");
  if (!meta.ok()) return 0;
  auto again = shardkeep::format::DecodeCheckpointableMeta(
      shardkeep::format::EncodeCheckpointableMeta(*meta), "meta.json");
  SK_FUZZ_CHECK(again.ok());
  SK_FUZZ_CHECK(Same(*meta, *again));
  return 0;
}
