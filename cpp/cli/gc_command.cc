// `shardkeep gc ROOT [--older-than DURATION] [--dry-run]`: removes the
// leftovers of failed saves under a root, never a committed checkpoint nor
// the only copy of one (CollectLeftovers decides, checkpoint_root.h).
//
// A save under way looks exactly like a leftover (its temporary or
// generation folder has no commit record yet), but it holds a lease on its
// folder, which gc honours: such a folder is kept, and gc names the
// lease's holder. `--older-than` adds a condition on the time of the last
// write, for saves by versions without leases; where the storage does not
// report modification times (object stores, through the Storage
// interface) a leftover's age is unknown and it is then kept.
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "cli_support.h"
#include "command.h"
#include "root_survey.h"
#include "shardkeep/checkpoint_root.h"

namespace shardkeep::cli {
namespace {

// The line gc prints for one entry it kept.
std::string WhyKept(const CollectedEntry& c, const SurveyedEntry& s, const GcArgs& options,
                    const std::string& root_url) {
  using Outcome = CollectedEntry::Outcome;
  switch (c.outcome) {
    case Outcome::kNotLeftover:
      if (c.state == EntryState::kOnlyCopy) {
        return "NOT a leftover: " + OnlyCopyAdvice(s.url);
      }
      return "not a leftover, it may be a newer version's checkpoint; `shardkeep rm "
             "--force` deletes it";
    case Outcome::kInUse:
      return c.problem.message();
    case Outcome::kAgeUnknown:
      return "its age is unknown on this storage; --older-than 0 removes it, when no save "
             "is writing under " + root_url;
    case Outcome::kTooRecent:
      return "last written " + HumanDuration(c.age_s.value_or(0)) +
             " ago, newer than --older-than " + HumanDuration(options.min_age_s) +
             " (a save may still be writing it)";
    default:
      return "";
  }
}

}  // namespace

int RunGc(const GcArgs& args) {
  Result<OpenedLocation> root = OpenLocation(args.url);
  if (!root.ok()) {
    PrintError("gc", args.url, root.status());
    return kFailed;
  }
  Result<std::vector<SurveyedEntry>> surveyed = SurveyRoot(*root);
  if (!surveyed.ok()) {
    PrintError("gc", args.url, surveyed.status());
    return kFailed;
  }
  std::map<std::string, const SurveyedEntry*> by_name;
  std::vector<RootEntry> entries;
  for (const SurveyedEntry& s : *surveyed) {
    by_name[s.entry.name] = &s;
    entries.push_back(s.entry);
  }
  CollectOptions collect;
  collect.min_age_s = args.min_age_s;
  collect.dry_run = args.dry_run;
  collect.modified_ns = [&by_name](const std::string& name) {
    return by_name.at(name)->modified_ns;
  };
  const std::vector<CollectedEntry> collected =
      CollectLeftovers(*root->storage, root->path, entries, collect);

  int exit_code = kOk;
  uint64_t removed = 0, removed_bytes = 0, kept = 0;
  const char* verb = args.dry_run ? "would remove" : "removed";
  for (const CollectedEntry& c : collected) {
    const SurveyedEntry& s = *by_name.at(c.name);
    const std::string state = EntryStateName(c.state);
    if (c.outcome == CollectedEntry::Outcome::kFailed) {
      PrintError("gc", s.url, c.problem);
      exit_code = kFailed;
      continue;
    }
    if (c.outcome != CollectedEntry::Outcome::kRemoved) {
      ++kept;
      std::cout << "kept " << s.url << " (" << state;
      if (c.state == EntryState::kRejected) std::cout << ": " << s.entry.problem.ToString();
      std::cout << "): " << WhyKept(c, s, args, root->url) << "\n";
      continue;
    }
    const uint64_t bytes = s.usage ? s.usage->bytes : 0;
    ++removed;
    removed_bytes += bytes;
    std::cout << verb << " " << s.url << " (" << state << ", " << HumanBytes(bytes) << ")\n";
  }
  std::cout << verb << " " << removed << " leftover" << (removed == 1 ? "" : "s") << ", "
            << HumanBytes(removed_bytes) << "; kept " << kept << "\n";
  return exit_code;
}

}  // namespace shardkeep::cli
