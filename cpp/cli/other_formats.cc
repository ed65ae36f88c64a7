#include "other_formats.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <system_error>
#include <utility>
#include <vector>

#include "shardkeep/location.h"

namespace shardkeep::cli {
namespace {

namespace fs = std::filesystem;

// An Orbax item holds _METADATA (its tree); a step folder written by
// Orbax's CheckpointManager holds _CHECKPOINT_METADATA; a DCP checkpoint
// holds .metadata.
constexpr char kOrbaxItem[] = "_METADATA";
constexpr char kOrbaxStep[] = "_CHECKPOINT_METADATA";
constexpr char kDcpMetadata[] = ".metadata";

bool HasFile(const fs::path& folder, const char* name) {
  std::error_code error;
  return fs::is_regular_file(folder / name, error);
}

// The step of an Orbax step folder's name ("<step>" or "<prefix>_<step>").
std::optional<int64_t> StepOfName(const std::string& name) {
  const size_t underscore = name.rfind('_');
  const std::string digits = underscore == std::string::npos ? name : name.substr(underscore + 1);
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

std::optional<int64_t> OrbaxStep(const fs::path& folder) {
  if (!HasFile(folder, kOrbaxStep)) return std::nullopt;
  return StepOfName(folder.filename().string());
}

OtherFormat Found(std::string format, std::string description, std::string brief) {
  OtherFormat found;
  found.format = std::move(format);
  found.description = std::move(description);
  found.brief = std::move(brief);
  return found;
}

}  // namespace

std::optional<OtherFormat> FindOtherFormat(const std::string& path) {
  const fs::path folder(path);
  std::error_code error;
  if (!fs::is_directory(folder, error)) return std::nullopt;
  if (HasFile(folder, kOrbaxStep) || HasFile(folder, kOrbaxItem)) {
    OtherFormat found = Found("orbax", "an Orbax checkpoint", "orbax checkpoint, read-only");
    found.step = OrbaxStep(folder);
    if (found.step) {
      found.description += " (CheckpointManager step " + std::to_string(*found.step) + ")";
      found.brief = "orbax step " + std::to_string(*found.step) + ", read-only";
    }
    return found;
  }
  if (HasFile(folder, kDcpMetadata)) {
    return Found("dcp", "a PyTorch DCP checkpoint", "PyTorch DCP checkpoint, read-only");
  }
  std::vector<std::pair<int64_t, std::string>> steps;
  bool item = false;
  for (const fs::directory_entry& child : fs::directory_iterator(folder, error)) {
    if (std::optional<int64_t> step = OrbaxStep(child.path())) {
      steps.emplace_back(*step, child.path().filename().string());
    }
    item = item || HasFile(child.path(), kOrbaxItem);
  }
  if (!steps.empty()) {
    std::sort(steps.begin(), steps.end());
    std::string listed;
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps.size() > 8 && i == 3) {  // the first and last three
        listed += ", ...";
        i = steps.size() - 3;
      }
      listed += (listed.empty() ? "" : ", ") + std::to_string(steps[i].first);
    }
    OtherFormat found = Found("orbax",
                              "the root of an Orbax CheckpointManager (" +
                                  std::to_string(steps.size()) + " step(s): " + listed + ")",
                              "orbax CheckpointManager root, read-only");
    found.root = true;
    return found;
  }
  if (item) return Found("orbax", "an Orbax checkpoint", "orbax checkpoint, read-only");
  return std::nullopt;
}

bool ExplainOtherFormat(const std::string& command, const std::string& url) {
  Result<Location> location = ParseLocation(url);
  if (!location.ok() || !location->local_path) return false;
  const std::optional<OtherFormat> found = FindOtherFormat(*location->local_path);
  if (!found) return false;
  std::cerr << "shardkeep " << command << ": " << url << " is " << found->description
            << ", not a shardkeep checkpoint; `shardkeep " << command
            << "` works on shardkeep checkpoints. shardkeep reads this one (read-only) from "
               "Python: ";
  if (found->root) {
    std::cerr << "`shardkeep ls " << url << "` lists its steps, shardkeep.load_orbax('" << url
              << "/<step>', target) loads one, `shardkeep convert " << url
              << "/<step> DST` converts one, and shardkeep.CheckpointManager('" << url
              << "') resumes the run from them\n";
    return true;
  }
  const std::string call = found->format == "dcp"
                               ? "shardkeep.load_dcp('" + url + "', target, allow_pickle=True)"
                               : "shardkeep.load_orbax('" + url + "', target)";
  std::cerr << call << " loads it, `shardkeep convert " << url << " DST"
            << (found->format == "dcp" ? " --allow-pickle" : "")
            << "` converts it into a shardkeep checkpoint\n";
  return true;
}

}  // namespace shardkeep::cli
