// Decoded meta.json documents kept between saves.
#pragma once

#include <memory>
#include <string>

#include "format/checkpointable_meta.h"
#include "shardkeep/status.h"

namespace shardkeep::internal {

// The save checks every checkpointable's meta.json against its shards,
// which needs the document decoded; for a tree of thousands of leaves that
// costs milliseconds. Saves in a training loop repeat one tree, and so one
// meta.json text: the last few decoded documents are kept, by their exact
// text (compared whole, not by a hash), so a repeated save decodes nothing.
// Documents longer than kMaxCachedMetaBytes are decoded every time, so
// what is kept stays small. Thread-safe.
inline constexpr size_t kMaxCachedMetaBytes = size_t{4} << 20;

// The decoded `json` (DecodeCheckpointableMeta; `file` names it in errors,
// which are never kept).
Result<std::shared_ptr<const format::CheckpointableMeta>> DecodeMetaCached(
    const std::string& json, const std::string& file);

// Keeps `meta` as the decoding of `json`, for a caller that built the text
// from a document it has just decoded (the Python binding's encode_meta):
// the save of that text then skips its decode. REQUIRES: `meta` is what
// DecodeCheckpointableMeta(json) gives.
void RememberDecodedMeta(const std::string& json,
                         std::shared_ptr<const format::CheckpointableMeta> meta);

}  // namespace shardkeep::internal
