// Checkpointable payloads for engine tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardkeep/checkpoint.h"

namespace shardkeep::testdata {

struct ArrayLeaf {
  std::string path;
  std::string dtype;
  std::vector<uint64_t> shape;  // {} for a 0-d array
};

// A pytree meta.json with these array leaves, in order.
std::string PytreeMetaJson(const std::vector<ArrayLeaf>& leaves);

// A checkpointable of kind "pytree" with these array leaves and no shards
// yet (the test adds the shards it saves).
CheckpointablePayload PytreePayload(const std::string& name,
                                    const std::vector<ArrayLeaf>& leaves);

// A checkpointable of kind "bytes" holding `value`.
CheckpointablePayload BytesPayload(const std::string& name, const std::string& value);

}  // namespace shardkeep::testdata
