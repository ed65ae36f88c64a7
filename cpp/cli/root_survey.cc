#include "root_survey.h"

#include <memory>
#include <utility>

#include "shardkeep/checkpoint.h"

namespace shardkeep::cli {

Result<std::vector<SurveyedEntry>> SurveyRoot(const OpenedLocation& root) {
  SK_ASSIGN_OR_RETURN(std::vector<RootEntry> entries,
                      ListCheckpoints(*root.storage, root.path));
  std::vector<SurveyedEntry> surveyed(entries.size());
  std::vector<std::vector<std::string>> to_measure;
  std::vector<size_t> measured;  // index in `surveyed` of each to_measure
  for (size_t i = 0; i < entries.size(); ++i) {
    SurveyedEntry& s = surveyed[i];
    s.entry = std::move(entries[i]);
    s.url = JoinUrl(root.url, s.entry.name);
    if (s.entry.state != EntryState::kOther) {
      to_measure.push_back({root.path + "/" + s.entry.name});
      measured.push_back(i);
    }
  }
  // Commit records and local modification times, in parallel.
  ParallelFor(surveyed.size(), IoThreads(*root.storage), [&](size_t i) {
    SurveyedEntry& s = surveyed[i];
    const std::string path = root.path + "/" + s.entry.name;
    if (s.entry.state == EntryState::kCommitted) {
      Result<std::unique_ptr<CheckpointReader>> reader =
          CheckpointReader::Open(root.storage, path);
      if (reader.ok()) {
        s.info = (*reader)->Info();
      } else {
        s.problem = reader.status();
      }
    }
    if (root.local && s.entry.state != EntryState::kOther) {
      s.modified_ns = NewestLocalModificationNs(path);
    }
  });
  std::vector<FolderUsage> usage = MeasureUsage(*root.storage, to_measure);
  for (size_t k = 0; k < measured.size(); ++k) {
    SurveyedEntry& s = surveyed[measured[k]];
    if (s.problem.ok() && !usage[k].status.ok()) s.problem = usage[k].status;
    s.usage = std::move(usage[k]);
  }
  return surveyed;
}

}  // namespace shardkeep::cli
