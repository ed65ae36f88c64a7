// `shardkeep diff A B`: compares two checkpoints leaf by leaf
// (DiffCheckpoints). Exit codes: 0 identical, 1 they differ, 3 either could
// not be read.
#include <cmath>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "command.h"
#include "other_formats.h"
#include "shardkeep/diff.h"

namespace shardkeep::cli {
namespace {

nlohmann::json Number(double value) {
  return std::isnan(value) ? nlohmann::json(nullptr) : nlohmann::json(value);
}

nlohmann::json LeafJson(const LeafDiff& leaf) {
  nlohmann::json out = {{"checkpointable", leaf.checkpointable},
                        {"leaf", leaf.path},
                        {"change", LeafChangeName(leaf.change)},
                        {"type_a", leaf.type_a.empty() ? nlohmann::json(nullptr)
                                                       : nlohmann::json(leaf.type_a)},
                        {"type_b", leaf.type_b.empty() ? nlohmann::json(nullptr)
                                                       : nlohmann::json(leaf.type_b)},
                        {"bytes_read", leaf.bytes_read}};
  if (leaf.change == LeafChange::kDiffers && !leaf.path.empty()) {
    out["differing_elements"] = leaf.differing_elements;
    out["max_abs_diff"] = Number(leaf.max_abs_diff);
    out["max_rel_diff"] = Number(leaf.max_rel_diff);
  }
  return out;
}

std::string Describe(const LeafDiff& leaf) {
  switch (leaf.change) {
    case LeafChange::kIdentical: return "identical";
    case LeafChange::kChangedType: return "changed: " + leaf.type_a + " -> " + leaf.type_b;
    case LeafChange::kOnlyInA: return "only in A (" + leaf.type_a + ")";
    case LeafChange::kOnlyInB: return "only in B (" + leaf.type_b + ")";
    case LeafChange::kDiffers: break;
  }
  if (leaf.path.empty() || leaf.type_a.rfind('[') == std::string::npos) return "differs";
  char stats[96] = "";
  if (!std::isnan(leaf.max_abs_diff)) {
    std::snprintf(stats, sizeof(stats), "; max abs diff %.6g, max rel diff %.6g",
                  leaf.max_abs_diff, leaf.max_rel_diff);
  }
  return "differs: " + std::to_string(leaf.differing_elements) + " elements" + stats;
}

void PrintText(const DiffArgs& args, const DiffReport& report) {
  size_t same = 0;
  for (const LeafDiff& leaf : report.leaves) {
    if (leaf.change == LeafChange::kIdentical) {
      ++same;
      if (!args.all) continue;
    }
    const std::string name =
        leaf.checkpointable + (leaf.path.empty() ? "" : "/" + leaf.path);
    std::cout << name << ": " << Describe(leaf) << "\n";
  }
  std::cout << (report.identical() ? "identical" : "different") << ": " << same << " of "
            << report.leaves.size() << " leaves identical; " << report.bytes_read
            << " bytes read\n";
}

}  // namespace

int RunDiff(const DiffArgs& args) {
  Result<StorageLocation> a = ResolveStorage(args.a);
  Result<StorageLocation> b = a.ok() ? ResolveStorage(args.b) : a;
  if (!a.ok() || !b.ok()) {
    std::cerr << "shardkeep diff: " << (a.ok() ? b : a).status().ToString() << "\n";
    return kFailed;
  }
  DiffOptions options;
  options.threads = args.threads;
  Result<DiffReport> report =
      DiffCheckpoints(a->storage, a->path, b->storage, b->path, options);
  if (!report.ok()) {
    // Each side is explained, when it is another format's checkpoint.
    const bool explained_a = ExplainOtherFormat("diff", args.a);
    if (ExplainOtherFormat("diff", args.b) || explained_a) return kFailed;
    std::cerr << "shardkeep diff: " << report.status().ToString() << "\n";
    return kFailed;
  }
  if (args.json) {
    nlohmann::json out = {{"a", args.a},
                          {"b", args.b},
                          {"identical", report->identical()},
                          {"bytes_read", report->bytes_read},
                          {"leaves", nlohmann::json::array()}};
    for (const LeafDiff& leaf : report->leaves) out["leaves"].push_back(LeafJson(leaf));
    std::cout << out.dump(2) << "\n";
  } else {
    PrintText(args, *report);
  }
  return report->identical() ? kOk : kProblemsFound;
}

}  // namespace shardkeep::cli
