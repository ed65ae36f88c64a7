#include <xxhash.h>

#include "shardkeep/checkpoint.h"

namespace shardkeep {

uint64_t ChunkChecksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

}  // namespace shardkeep
