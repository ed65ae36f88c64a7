// A compact rendering of the sharding descriptions the Python front saves
// in meta.json (python/shardkeep/base/shardings.py, `describe`): C++ treats them
// as opaque JSON, so an unknown form is shown as its JSON text.
#pragma once

#include <string>

namespace shardkeep::cli {

// "null" → "-";
// {"type": "named", "axis_names": ["data", "model"], "mesh_shape": [4, 2],
//  "spec": ["data", null]} → "P(data, None) mesh(data=4, model=2)";
// a spec entry naming several axes → "(data, model)";
// {"type": "single_device", "device_id": 3} → "device 3";
// {"type": "other", "class": "GSPMDSharding"} → "GSPMDSharding".
std::string ShardingText(const std::string& sharding_json);

}  // namespace shardkeep::cli
