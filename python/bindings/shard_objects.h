// The boxes the Python front names to the engine: a shard to save (its
// leaf, dtype, box and bytes) and a read request share LeafBox. Shared by
// the module and host staging, which builds shards natively.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <vector>

#include "shardkeep/box.h"
#include "shardkeep/dtype.h"

namespace shardkeep::binding {

// The box of a leaf in a dtype that a shard or a read request names. The
// dtype is checked when set; origin and shape when used (setting one, then
// the other, passes through a mismatch).
struct LeafBox {
  uint32_t leaf = 0;
  DType dtype{};
  std::vector<uint64_t> origin;
  std::vector<uint64_t> shape;

  // InvalidArgument when origin and shape differ in rank.
  Box ToBox() const;
};

// _core.Shard: a box this process saves, and its bytes: a flat uint8 array,
// or a callable fill(origin, shape) -> flat uint8 array that the writer
// threads call chunk by chunk, or a StoredIn.
struct PyShard : LeafBox {
  nanobind::object data;
  // A StoredIn or None (ShardData::compare_with).
  nanobind::object compare_with = nanobind::none();
};

}  // namespace shardkeep::binding
