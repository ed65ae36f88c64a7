// meta.json text for engine tests that save array leaves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardkeep::testdata {

struct ArrayLeaf {
  std::string path;
  std::string dtype;
  std::vector<uint64_t> shape;  // {} for a 0-d array
};

// A pytree meta.json with these array leaves, in order.
std::string PytreeMetaJson(const std::vector<ArrayLeaf>& leaves);

}  // namespace shardkeep::testdata
