// What every process of a save must agree on before anything is written:
// the checkpointables (names, kinds, order) and each one's meta.json. Only
// the primary's meta.json is written, so a process that computed another
// tree or shapes would otherwise have its shards described by a meta.json
// that is not its own.
#pragma once

#include <string>
#include <vector>

#include "shardkeep/checkpoint.h"

namespace shardkeep::internal {

// One line per checkpointable, in order: "<name> <kind> <hash of
// meta.json>". Short, so that a thousand processes can publish theirs
// through the coordinator's key-value store.
std::string MetaDigest(const std::vector<CheckpointablePayload>& parts);

// "" when every digest equals digests[0] (the primary's); otherwise a
// sentence naming the processes that differ from process 0 and how, e.g.
// "processes 2, 3 differ from process 0 in the meta.json of 'state'".
// digests[i] is process i's MetaDigest.
std::string DescribeDisagreement(const std::vector<std::string>& digests);

}  // namespace shardkeep::internal
