// shardkeep::Storage over one GCS bucket. Paths are object names ('/'
// separated, no leading '/'); a "directory" is the set of names under
// "dir/", so CreateDir and SyncDir have nothing to do and there is no
// rename: checkpoints commit with a create-only upload (WriteIfAbsent).
//
//   ReadAt          ranged GET (alt=media) straight into the caller's buffer
//   ReadAll         GET, checked against the object's CRC32C
//   FileSize        the object's metadata
//   WriteAll        one upload with its CRC32C; large ones in parallel parts
//   WriteIfAbsent   upload with ifGenerationMatch=0 (exactly one racer wins)
//   OpenForAppend   parts uploaded in parallel as objects of their own,
//                   joined by compose (32 at a time) and then deleted
//   Exists          the object's metadata, else a one-name listing of "path/"
//   List            objects.list with delimiter '/', every page
//   Link            rewrite: a server-side copy
//   DeleteFile      DELETE; DeleteRecursive: every name under "path/"
//
// Why compose for large files: the JSON API has no parallel multipart
// upload, and a resumable upload is one stream; parts as objects go up
// side by side, each with its own CRC32C, and compose joins them on the
// server without moving their bytes again (GCS's own "parallel composite
// uploads").
#pragma once

#include <memory>

#include "shardkeep/storage.h"
#include "storage/gcs/gcs_client.h"
#include "storage/part_writer.h"

namespace shardkeep::gcs {

// A save writes 8 data files at once (StorageFeatures::parallel_writes),
// each rolled over past 16 MiB (StorageFeatures::data_file_bytes), so
// that each goes up in one request: parts of 80 MiB are larger than any
// file the writer makes from chunks of up to 64 MiB (Options::chunk_bytes'
// default). Only a file written otherwise (larger chunks, WriteAll of a
// large object) is uploaded in parts and composed.
inline constexpr uint64_t kGcsDataFileBytes = uint64_t{16} << 20;

struct GcsStorageOptions {
  PartWriterOptions parts{size_t{80} << 20, 2};
};

std::shared_ptr<Storage> NewGcsStorage(std::shared_ptr<const GcsClient> client,
                                       GcsStorageOptions options = {});

}  // namespace shardkeep::gcs
