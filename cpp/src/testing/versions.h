// Checkpoints told apart by a version number: checkpointable "state" with
// one 4x4 float32 leaf "w" holding v, v+1, ..., v+15. Tests of replacing
// and recovering a checkpoint save versions and ask which one a path holds.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "shardkeep/status.h"
#include "shardkeep/storage.h"

namespace shardkeep::testdata {

// A forced save of version `version` at `path` (replacing what is there).
Status SaveVersion(std::shared_ptr<Storage> storage, const std::string& path, float version);

// The version of the whole checkpoint committed at `path`; nullopt when
// none opens or its values are not one version's.
std::optional<float> CommittedVersion(const std::shared_ptr<Storage>& storage,
                                      const std::string& path);

}  // namespace shardkeep::testdata
