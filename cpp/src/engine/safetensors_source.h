// safetensors files seen as a shardkeep checkpointable: one pytree whose
// leaves are the tensors (key path = the escaped tensor name), each stored
// as one raw chunk at its byte range. The reader then plans, reads, casts
// and maps files for them as for its own chunks; only the checksums are
// missing (safetensors has none).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "format/checkpointable_meta.h"
#include "format/index.h"
#include "shardkeep/status.h"
#include "shardkeep/storage.h"

namespace shardkeep::internal {

struct SafetensorsSource {
  std::vector<std::string> files;  // paths in the storage; a chunk's data_file indexes them
  format::CheckpointableMeta meta;  // a pytree: a dict of tensor names
  std::vector<format::ChunkRecord> chunks;  // one per leaf, in leaf order
};

// `path` is a .safetensors file, a folder of them (every *.safetensors in
// it, by name), or an index JSON ({"weight_map": {tensor: file}}, files
// relative to its folder; each must be a plain file name). Headers are read
// and decoded in parallel. Corruption names the file for a bad header, a
// tensor in two files, or an index that places a tensor in a file that
// does not hold it; NotFound for a path holding no safetensors file.
Result<SafetensorsSource> OpenSafetensorsSource(Storage& storage, const std::string& path,
                                                int threads);

}  // namespace shardkeep::internal
