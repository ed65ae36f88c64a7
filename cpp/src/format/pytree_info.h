// The public PytreeInfo (shardkeep/contents.h) and the meta.json of a
// pytree (checkpointable_meta.h) are one structure in two forms: the
// format's, with JSON values, and the API's, with JSON texts and typed
// dtypes. These convert between them, in one place.
#pragma once

#include <nlohmann/json.hpp>

#include "format/checkpointable_meta.h"
#include "shardkeep/contents.h"

namespace shardkeep::format {

// The API's view of a decoded pytree meta.json. stored_bytes is left
// empty: it depends on the index, not on meta.json.
PytreeInfo PytreeInfoOf(const CheckpointableMeta& meta);

// The meta.json document of `info`, unchecked: DecodeCheckpointableMetaDocument
// checks it. A JSON text of `info` that does not parse becomes a value the
// decoder rejects (a discarded value), naming the leaf or the tree.
nlohmann::json PytreeDocumentOf(const PytreeInfo& info);

}  // namespace shardkeep::format
