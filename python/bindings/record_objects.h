// The commit record and the states of a root's entries as Python objects:
// a bound CommitRecord (decoded by the core's decoder, never by json.loads
// in Python) and enums for an entry's state and what a collection did
// with it.
#pragma once

#include <nanobind/nanobind.h>

#include <string>

#include "format/commit_record.h"
#include "shardkeep/status.h"

namespace shardkeep::binding {

// A decoded `_SHARDKEEP` with the text it was decoded from (the record
// as stored, which CommitRecord.document() shows).
struct CommitRecordObject {
  format::CommitRecord record;
  std::string text;
};

// Decodes `text`, the `_SHARDKEEP` at `file`, with the core's decoder.
Result<CommitRecordObject> DecodeCommitRecordObject(std::string text, const std::string& file);

// Defines CommitRecord, EntryState, CollectOutcome, RootEntry and
// CollectedEntry in `m`: before the functions that take or return them.
void BindRecordObjects(nanobind::module_& m);

}  // namespace shardkeep::binding
