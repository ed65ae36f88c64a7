// Comparing two checkpoints leaf by leaf: which are identical, which differ
// and by how much, which changed shape or dtype, which only one has.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardkeep/status.h"
#include "shardkeep/storage.h"

namespace shardkeep {

enum class LeafChange {
  kIdentical,    // the same kind, dtype, shape and bits (or value)
  kDiffers,      // the same kind, dtype and shape; some elements differ
  kChangedType,  // another kind, dtype or shape
  kOnlyInA,
  kOnlyInB,
};

// "identical", "differs", "changed", "only in A", "only in B".
std::string_view LeafChangeName(LeafChange change);

// One leaf of a pytree checkpointable, or a json/bytes checkpointable as a
// whole (`path` empty), compared.
struct LeafDiff {
  std::string checkpointable;
  std::string path;  // the leaf's key path; "" for a json/bytes value
  LeafChange change = LeafChange::kIdentical;
  std::string type_a, type_b;  // "float32[16,8]", "scalar int64", "json" ("" when absent)
  // kDiffers, arrays: how many elements differ (bit for bit), and for
  // float and integer dtypes the largest |a - b| and |a - b| / max(|a|, |b|)
  // over them (NaN where undefined: other dtypes, or NaN/inf elements only).
  uint64_t differing_elements = 0;
  double max_abs_diff = 0;
  double max_rel_diff = 0;
  // Bytes of stored chunks read to decide; 0 when the indexes decided
  // (every chunk of A has a chunk of B with the same box, codec and
  // checksum: the XXH3-64 of their stored bytes, so "identical" then
  // holds with all but a 2^-64 chance per chunk).
  uint64_t bytes_read = 0;
};

struct DiffReport {
  // Checkpointables in A's order then B's; leaves in A's order then B's.
  std::vector<LeafDiff> leaves;
  uint64_t bytes_read = 0;
  bool identical() const;
};

struct DiffOptions {
  // Chunks read at once; 0: one per core (at most 16).
  int threads = 0;
};

// Compares the checkpoints at `a` and `b` (each in its own storage). Reads
// only the chunks whose checksums do not already show them identical.
// Errors: either cannot be opened, or a chunk is corrupt.
Result<DiffReport> DiffCheckpoints(std::shared_ptr<Storage> a_storage, const std::string& a,
                                   std::shared_ptr<Storage> b_storage, const std::string& b,
                                   const DiffOptions& options = DiffOptions());

}  // namespace shardkeep
