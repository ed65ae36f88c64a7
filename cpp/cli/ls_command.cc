// `shardkeep ls ROOT [--json]`: the checkpoints under a root, and the
// leftovers of failed saves beside them.
#include <iostream>
#include <optional>
#include <string>

#include "cli_support.h"
#include "command.h"
#include "other_formats.h"
#include "root_survey.h"
#include "shardkeep/checkpoint_root.h"
#include "shardkeep/location.h"

namespace shardkeep::cli {
namespace {

using json = nlohmann::ordered_json;

// An entry that is no shardkeep checkpoint may be an Orbax or DCP one
// (local roots only): a run moved from Orbax holds its steps.
std::optional<OtherFormat> OtherFormatOf(const SurveyedEntry& s) {
  if (s.entry.state != EntryState::kOther) return std::nullopt;
  Result<Location> location = ParseLocation(s.url);
  if (!location.ok() || !location->local_path) return std::nullopt;
  return FindOtherFormat(*location->local_path);
}

// What a leftover is, for the listing's last column.
std::string Describe(const SurveyedEntry& s) {
  switch (s.entry.state) {
    case EntryState::kTemporary: return "a save that failed, or one still writing";
    case EntryState::kReplaced: return "the replaced checkpoint of a cut-short forced save";
    case EntryState::kOnlyCopy: return "NOT a leftover: " + OnlyCopyAdvice(s.url);
    case EntryState::kBeingDeleted: return "a deletion cut short";
    case EntryState::kUnfinished: return "saves that never committed (or one still writing)";
    case EntryState::kRejected: return s.entry.problem.ToString();
    case EntryState::kOther: {
      const std::optional<OtherFormat> other = OtherFormatOf(s);
      return other ? other->brief : "not a checkpoint";
    }
    case EntryState::kCommitted: break;
  }
  return "";
}

json EntryJson(const SurveyedEntry& s) {
  json j;
  j["name"] = s.entry.name;
  j["url"] = s.url;
  j["state"] = EntryStateName(s.entry.state);
  j["leftover"] = IsLeftover(s.entry.state);
  j["step"] = nullptr;
  j["created_ns"] = nullptr;
  j["committed_ns"] = nullptr;
  j["committed"] = nullptr;
  j["process_count"] = nullptr;
  j["checkpointables"] = nullptr;
  // "orbax" or "dcp" for another format's checkpoint (read-only), else null.
  j["format"] = s.info ? json("shardkeep") : json(nullptr);
  if (const std::optional<OtherFormat> other = OtherFormatOf(s)) {
    j["format"] = other->format;
    if (other->step) j["step"] = *other->step;
  }
  if (s.info) {
    if (s.info->step) j["step"] = *s.info->step;
    j["created_ns"] = s.info->created_ns;
    j["committed_ns"] = s.info->committed_ns;
    j["committed"] = IsoTime(s.info->committed_ns);
    j["process_count"] = s.info->process_count;
    j["checkpointables"] = json::array();
    for (const CheckpointableInfo& c : s.info->checkpointables) {
      j["checkpointables"].push_back({{"name", c.name}, {"kind", c.kind}});
    }
  }
  j["bytes"] = s.usage ? json(s.usage->bytes) : json(nullptr);
  j["files"] = s.usage ? json(s.usage->files) : json(nullptr);
  j["modified_ns"] = s.modified_ns ? json(*s.modified_ns) : json(nullptr);
  if (!s.entry.problem.ok()) {
    j["problem"] = s.entry.problem.ToString();
  } else if (!s.problem.ok()) {
    j["problem"] = s.problem.ToString();
  } else {
    j["problem"] = nullptr;
  }
  return j;
}

std::string Checkpointables(const CheckpointInfo& info) {
  std::string text;
  for (const CheckpointableInfo& c : info.checkpointables) {
    if (!text.empty()) text += ", ";
    text += c.name + ":" + c.kind;
  }
  return text.empty() ? "-" : text;
}

void PrintText(const std::string& root, const std::vector<SurveyedEntry>& entries) {
  Table table({"NAME", "STATE", "STEP", "COMMITTED", "SIZE", "PROCS", "CHECKPOINTABLES"});
  uint64_t committed = 0, committed_bytes = 0, leftovers = 0, leftover_bytes = 0,
           only_copies = 0, others = 0;
  const int64_t now = NowNs();
  for (const SurveyedEntry& s : entries) {
    const std::string size = s.usage ? HumanBytes(s.usage->bytes) : "-";
    if (s.info) {
      ++committed;
      committed_bytes += s.usage ? s.usage->bytes : 0;
      table.Add({s.entry.name, "committed", s.info->step ? std::to_string(*s.info->step) : "-",
                 HumanTime(s.info->committed_ns), size, std::to_string(s.info->process_count),
                 Checkpointables(*s.info)});
      continue;
    }
    std::string note = Describe(s);
    if (s.entry.state == EntryState::kOnlyCopy) ++only_copies;
    if (IsLeftover(s.entry.state)) {
      ++leftovers;
      leftover_bytes += s.usage ? s.usage->bytes : 0;
      if (s.modified_ns) {
        note += "; last written " + HumanDuration((now - *s.modified_ns) / 1e9) + " ago";
      }
    }
    const std::optional<OtherFormat> other = OtherFormatOf(s);
    if (other) ++others;
    const std::string step = other && other->step ? std::to_string(*other->step) : "-";
    table.Add({s.entry.name, EntryStateName(s.entry.state), step, "-", size, "-", note});
  }
  if (table.size() == 0) {
    std::cout << "no checkpoints under " << root << "\n";
    return;
  }
  for (const SurveyedEntry& s : entries) {
    if (s.entry.name == "_SHARDKEEP") {
      std::cout << root << " is itself a checkpoint: `shardkeep info " << root
                << "` describes it\n\n";
    }
  }
  table.Print();
  std::cout << "\n" << committed << " checkpoint" << (committed == 1 ? "" : "s") << ", "
            << HumanBytes(committed_bytes);
  if (leftovers > 0) {
    std::cout << "; " << leftovers << " leftover" << (leftovers == 1 ? "" : "s")
              << " of failed saves, " << HumanBytes(leftover_bytes)
              << " (`shardkeep gc` removes them)";
  }
  std::cout << "\n";
  if (others > 0) {
    std::cout << others << " Orbax or DCP checkpoint" << (others == 1 ? "" : "s")
              << ", read-only: shardkeep reads them from Python (shardkeep.load_orbax, "
                 "shardkeep.load_dcp; shardkeep.CheckpointManager resumes from Orbax steps) and "
                 "`shardkeep convert` converts them\n";
  }
  if (only_copies > 0) {
    std::cout << only_copies << " only cop" << (only_copies == 1 ? "y" : "ies")
              << " of a checkpoint whose forced replacement was cut short: rename each "
                 "back to its name (see above); nothing removes them\n";
  }
}

}  // namespace

int RunLs(const LsArgs& args) {
  Result<OpenedLocation> root = OpenLocation(args.url);
  if (!root.ok()) {
    PrintError("ls", args.url, root.status());
    return kFailed;
  }
  if (root->local) {
    // An object store has no empty folders, so there a missing root simply
    // holds nothing; on a file system it is most likely a typo.
    Result<bool> exists = root->storage->Exists(root->path);
    if (!exists.ok() || !*exists) {
      PrintError("ls", args.url, exists.ok() ? NotFoundError("no such folder") : exists.status());
      return kFailed;
    }
  }
  Result<std::vector<SurveyedEntry>> entries = SurveyRoot(*root);
  if (!entries.ok()) {
    PrintError("ls", args.url, entries.status());
    return kFailed;
  }
  int exit_code = kOk;
  for (const SurveyedEntry& s : *entries) {
    if (!s.problem.ok()) {
      PrintError("ls", s.url, s.problem);
      exit_code = kFailed;
    }
  }
  if (args.json) {
    json out;
    out["root"] = root->url;
    out["entries"] = json::array();
    for (const SurveyedEntry& s : *entries) out["entries"].push_back(EntryJson(s));
    PrintJson(out);
  } else {
    PrintText(root->url, *entries);
  }
  return exit_code;
}

}  // namespace shardkeep::cli
