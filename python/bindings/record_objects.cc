#include "record_objects.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "meta_objects.h"
#include "raise.h"
#include "shardkeep/checkpoint_root.h"

namespace nb = nanobind;

namespace shardkeep::binding {
namespace {

std::optional<std::string> MessageOf(const Status& status) {
  if (status.ok()) return std::nullopt;
  return status.message();
}

}  // namespace

Result<CommitRecordObject> DecodeCommitRecordObject(std::string text, const std::string& file) {
  SK_ASSIGN_OR_RETURN(format::CommitRecord record, format::DecodeCommitRecord(text, file));
  return CommitRecordObject{std::move(record), std::move(text)};
}

void BindRecordObjects(nb::module_& m) {
  nb::class_<CommitRecordObject>(
      m, "CommitRecord",
      "A checkpoint's _SHARDKEEP, decoded and checked by the core (docs/FORMAT.md §3).")
      .def_prop_ro("step", [](const CommitRecordObject& c) { return c.record.step; },
                   "The step saved with the checkpoint, or None.")
      .def_prop_ro("created_ns", [](const CommitRecordObject& c) { return c.record.created_ns; },
                   "Wall clock when the save started (ns since the Unix epoch).")
      .def_prop_ro("committed_ns",
                   [](const CommitRecordObject& c) { return c.record.committed_ns; },
                   "Wall clock when it committed.")
      .def_prop_ro("process_count",
                   [](const CommitRecordObject& c) { return c.record.process_count; },
                   "The processes that wrote it.")
      .def_prop_ro("data_folder",
                   [](const CommitRecordObject& c) { return c.record.data_folder; },
                   "The generation folder holding the checkpointables (object stores), or None.")
      .def_prop_ro(
          "checkpointables",
          [](const CommitRecordObject& c) {
            nb::dict kinds;  // Python dicts keep the save order
            for (const format::CheckpointableEntry& entry : c.record.checkpointables) {
              kinds[nb::str(entry.name.data(), entry.name.size())] =
                  nb::str(entry.kind.data(), entry.kind.size());
            }
            return kinds;
          },
          nb::sig("def checkpointables(self) -> dict[str, str]"),
          "Name -> kind (pytree, json or bytes) of each checkpointable, in save order.")
      .def_prop_ro(
          "custom_metadata",
          [](const CommitRecordObject& c) { return JsonToPython(c.record.custom_metadata); },
          nb::sig("def custom_metadata(self) -> dict"), "The custom metadata saved with it.")
      .def_prop_ro("metrics",
                   [](const CommitRecordObject& c) { return JsonToPython(c.record.metrics); },
                   nb::sig("def metrics(self) -> dict"), "The metrics the manager saved with it.")
      .def(
          "document", [](const CommitRecordObject& c) { return JsonTextToPython(c.text); },
          nb::sig("def document(self) -> dict"),
          "The record as stored, every field in file order (checksums included).")
      .def("__repr__", [](const CommitRecordObject& c) {
        return "CommitRecord(step=" +
               (c.record.step ? std::to_string(*c.record.step) : std::string("None")) +
               ", checkpointables=" + std::to_string(c.record.checkpointables.size()) + ")";
      });

  nb::enum_<EntryState>(m, "EntryState", "What an entry directly under a root is.")
      .value("COMMITTED", EntryState::kCommitted, "Its _SHARDKEEP exists and decodes.")
      .value("REJECTED", EntryState::kRejected, "Its _SHARDKEEP exists but does not decode.")
      .value("TEMPORARY", EntryState::kTemporary, "A save's temporary folder.")
      .value("REPLACED", EntryState::kReplaced, "The checkpoint a forced save replaced.")
      .value("ONLY_COPY", EntryState::kOnlyCopy,
             "A replaced folder holding the only copy of its checkpoint: never removed.")
      .value("BEING_DELETED", EntryState::kBeingDeleted, "A deletion's renamed folder.")
      .value("UNFINISHED", EntryState::kUnfinished,
             "Object stores: generations of unfinished saves, no _SHARDKEEP.")
      .value("OTHER", EntryState::kOther, "Anything else.");

  nb::enum_<CollectedEntry::Outcome>(m, "CollectOutcome",
                                     "What collect_leftovers did with one entry.")
      .value("REMOVED", CollectedEntry::Outcome::kRemoved, "A leftover, removed.")
      .value("NOT_LEFTOVER", CollectedEntry::Outcome::kNotLeftover,
             "An only copy or a rejected checkpoint: never removed.")
      .value("TOO_RECENT", CollectedEntry::Outcome::kTooRecent,
             "A leftover younger than the minimum age.")
      .value("AGE_UNKNOWN", CollectedEntry::Outcome::kAgeUnknown,
             "A leftover of unknown age, with a minimum age set.")
      .value("FAILED", CollectedEntry::Outcome::kFailed, "Its removal failed (see problem).")
      .value("IN_USE", CollectedEntry::Outcome::kInUse,
             "A save in flight holds a lease on it, or it committed meanwhile.");

  nb::class_<RootEntry>(m, "RootEntry", "One entry directly under a checkpoint root.")
      .def_ro("name", &RootEntry::name, "The entry's name under the root (not a path).")
      .def_ro("state", &RootEntry::state, "What the entry is.")
      .def_prop_ro("step",
                   [](const RootEntry& e) {
                     return e.state == EntryState::kCommitted ? e.step : std::nullopt;
                   },
                   "A committed checkpoint's step (None when its record has none).")
      .def_prop_ro("commit",
                   [](const RootEntry& e) -> std::optional<CommitRecordObject> {
                     if (e.state != EntryState::kCommitted) return std::nullopt;
                     return ValueOrRaise(
                         DecodeCommitRecordObject(e.commit_json, e.name + "/_SHARDKEEP"));
                   },
                   "A committed checkpoint's _SHARDKEEP, decoded (None for other entries).")
      .def_prop_ro("problem", [](const RootEntry& e) { return MessageOf(e.problem); },
                   "A rejected checkpoint: why the decoder refuses its record.")
      .def("__repr__", [](const RootEntry& e) {
        return "RootEntry(" + e.name + ", " + EntryStateName(e.state) + ")";
      });
  nb::class_<CollectedEntry>(m, "CollectedEntry", "What collect_leftovers did with one entry.")
      .def_ro("name", &CollectedEntry::name)
      .def_ro("state", &CollectedEntry::state)
      .def_ro("outcome", &CollectedEntry::outcome)
      .def_prop_ro("problem", [](const CollectedEntry& c) { return MessageOf(c.problem); },
                   "failed: why; an only copy: how to recover it.");
}

}  // namespace shardkeep::binding
