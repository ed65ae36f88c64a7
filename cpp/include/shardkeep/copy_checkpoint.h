// Copying a committed checkpoint to another place, on the same or another
// storage backend (a local folder to s3:// and back, one folder to
// another), committing at the destination as a save would.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "shardkeep/status.h"
#include "shardkeep/storage.h"

namespace shardkeep {

struct CopyOptions {
  // Replace whatever is at the destination (a committed checkpoint or
  // other files). Without it such a destination is refused.
  bool force = false;
  // Files copied at once; 0: one per core (at most 16), and at least what
  // either storage asks for (StorageFeatures::parallel_reads).
  int threads = 0;
  // Each thread streams its file through a buffer of this many bytes, so a
  // copy holds about threads × piece_bytes, whatever the file sizes.
  uint64_t piece_bytes = 8ull << 20;
  // Called with the bytes copied so far and the total, from the copying
  // threads but never by two at once. May be empty.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct CopyReport {
  uint64_t files = 0;            // files written, the commit record included
  uint64_t bytes = 0;            // their bytes
  uint64_t chunks_verified = 0;  // chunks whose checksum was checked on the way
};

// Copies the checkpoint committed at `from_path` in `from` to `to_path` in
// `to`: exactly the files its commit record names (meta.json, index and
// data files, values), each streamed in pieces, several at once.
//
// What is checked on the way: the commit record, every meta.json and index
// decode, and every chunk's XXH3-64 checksum is computed from the bytes as
// they pass and compared with its index record; a mismatch (or a chunk past
// the end of its file) fails the copy with a Corruption error naming the
// file, leaf number and offset. Not checked: the tiling of leaves and zstd
// frames (VerifyCheckpoint checks everything), and value files, which carry
// no checksum.
//
// The destination is committed as a save commits (docs/FORMAT.md §1): on
// storage that renames, the files go to <to_path>.shardkeep-tmp, the commit
// record last, and the folder is renamed into place (exchanged with what is
// there, with `force`); on storage without rename (object stores), into a
// fresh generation folder inside <to_path>, committed by creating
// <to_path>/_SHARDKEEP conditionally. A reader never sees a partial copy;
// a failed copy removes what it wrote. The commit record is copied as it
// is, except its "data_folder", which names the destination's generation
// (or is dropped): then the record is re-encoded, and fields this build
// does not know are not carried over.
//
// NotFound: no committed checkpoint at `from_path`. AlreadyExists: the
// destination holds something and `force` is false.
Result<CopyReport> CopyCheckpoint(std::shared_ptr<Storage> from, const std::string& from_path,
                                  std::shared_ptr<Storage> to, const std::string& to_path,
                                  const CopyOptions& options = {});

}  // namespace shardkeep
