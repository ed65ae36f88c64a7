// `shardkeep info CKPT [--checkpointable NAME] [--json]`: a checkpoint's
// commit record and, per pytree checkpointable, its leaves with dtype,
// shape, saved sharding, size and compression.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli_support.h"
#include "command.h"
#include "other_formats.h"
#include "sharding_text.h"
#include "shardkeep/checkpoint.h"

namespace shardkeep::cli {
namespace {

using json = nlohmann::ordered_json;

// Raw bytes over stored bytes; null when nothing is stored.
json Ratio(uint64_t raw, uint64_t stored) {
  if (stored == 0) return nullptr;
  return static_cast<double>(raw) / static_cast<double>(stored);
}

std::string RatioText(uint64_t raw, uint64_t stored) {
  if (stored == 0) return "-";
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", static_cast<double>(raw) / stored);
  return text;
}

// JSON text saved by the Python front, parsed; kept as a string if it is
// not JSON after all.
json Parsed(const std::string& text) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return value.is_discarded() ? json(text) : value;
}

std::string ShapeText(const LeafInfo& leaf) {
  if (leaf.kind != LeafKind::kArray && leaf.kind != LeafKind::kScalar) return "-";
  std::string text = "[";
  for (size_t i = 0; i < leaf.shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(leaf.shape[i]);
  }
  return text + "]";
}

struct Totals {
  uint64_t leaves = 0, arrays = 0, bytes = 0, stored = 0;
};

struct PytreeReport {
  json j;
  Totals totals;
  Table table{{"KEY PATH", "KIND", "DTYPE", "SHAPE", "SIZE", "STORED", "RATIO",
               "SHARDING / VALUE"}};
};

PytreeReport DescribePytree(const PytreeInfo& tree) {
  PytreeReport report;
  report.j["leaves"] = json::array();
  for (size_t i = 0; i < tree.leaves.size(); ++i) {
    const LeafInfo& leaf = tree.leaves[i];
    const uint64_t stored = i < tree.stored_bytes.size() ? tree.stored_bytes[i] : 0;
    const bool array = leaf.kind == LeafKind::kArray;
    ++report.totals.leaves;
    if (array) {
      ++report.totals.arrays;
      report.totals.bytes += leaf.nbytes();
      report.totals.stored += stored;
    }
    json l;
    l["path"] = leaf.path;
    l["kind"] = std::string(LeafKindName(leaf.kind));
    l["dtype"] = leaf.dtype ? json(std::string(DTypeName(*leaf.dtype))) : json(nullptr);
    l["shape"] = (array || leaf.kind == LeafKind::kScalar) ? json(leaf.shape) : json(nullptr);
    l["sharding"] = Parsed(leaf.sharding_json);
    l["sharding_text"] = ShardingText(leaf.sharding_json);
    l["bytes"] = array ? json(leaf.nbytes()) : json(nullptr);
    l["stored_bytes"] = array ? json(stored) : json(nullptr);
    l["ratio"] = array ? Ratio(leaf.nbytes(), stored) : json(nullptr);
    l["value"] = leaf.value_json.empty() ? json(nullptr) : Parsed(leaf.value_json);
    l["prng_impl"] = leaf.prng_impl.empty() ? json(nullptr) : json(leaf.prng_impl);
    report.j["leaves"].push_back(std::move(l));

    std::string kind(LeafKindName(leaf.kind));
    if (!leaf.prng_impl.empty()) kind += " (key<" + leaf.prng_impl + ">)";
    report.table.Add({leaf.path.empty() ? "(root)" : leaf.path, kind,
                      leaf.dtype ? std::string(DTypeName(*leaf.dtype)) : "-", ShapeText(leaf),
                      array ? HumanBytes(leaf.nbytes()) : "-", array ? HumanBytes(stored) : "-",
                      array ? RatioText(leaf.nbytes(), stored) : "-",
                      array ? ShardingText(leaf.sharding_json)
                            : (leaf.value_json.empty() ? "-" : leaf.value_json)});
  }
  const Totals& t = report.totals;
  report.j["totals"] = {{"leaves", t.leaves},
                        {"arrays", t.arrays},
                        {"bytes", t.bytes},
                        {"stored_bytes", t.stored},
                        {"ratio", Ratio(t.bytes, t.stored)}};
  return report;
}

}  // namespace

int RunInfo(const InfoArgs& args) {
  Result<OpenedLocation> location = OpenLocation(args.url);
  if (!location.ok()) {
    PrintError("info", args.url, location.status());
    return kFailed;
  }
  Result<std::unique_ptr<CheckpointReader>> opened =
      CheckpointReader::Open(location->storage, location->path);
  if (!opened.ok()) {
    if (!ExplainOtherFormat("info", args.url)) PrintError("info", args.url, opened.status());
    return kFailed;
  }
  CheckpointReader& reader = **opened;
  const CheckpointInfo& info = reader.Info();

  std::vector<CheckpointableInfo> chosen;
  for (const CheckpointableInfo& c : info.checkpointables) {
    if (args.checkpointable.empty() || c.name == args.checkpointable) chosen.push_back(c);
  }
  if (!args.checkpointable.empty() && chosen.empty()) {
    std::string names;
    for (const CheckpointableInfo& c : info.checkpointables) {
      names += (names.empty() ? "" : ", ") + c.name;
    }
    PrintError("info", args.url,
               NotFoundError("no checkpointable named \"" + args.checkpointable +
                             "\"; it holds: " + names));
    return kFailed;
  }

  json out;
  out["url"] = location->url;
  out["step"] = info.step ? json(*info.step) : json(nullptr);
  out["created_ns"] = info.created_ns;
  out["committed_ns"] = info.committed_ns;
  out["created"] = IsoTime(info.created_ns);
  out["committed"] = IsoTime(info.committed_ns);
  out["process_count"] = info.process_count;
  out["custom_metadata"] = Parsed(info.custom_metadata_json);
  out["metrics"] = Parsed(info.metrics_json);
  out["checkpointables"] = json::array();

  if (!args.json) {
    Table head({"checkpoint", location->url});
    head.Add({"step", info.step ? std::to_string(*info.step) : "- (none)"});
    head.Add({"created", HumanTime(info.created_ns)});
    head.Add({"committed", HumanTime(info.committed_ns) + " (the save took " +
                               HumanDuration((info.committed_ns - info.created_ns) / 1e9) + ")"});
    head.Add({"processes", std::to_string(info.process_count)});
    head.Add({"custom metadata", Parsed(info.custom_metadata_json).dump()});
    head.Add({"metrics", Parsed(info.metrics_json).dump()});
    head.Print();
  }

  int exit_code = kOk;
  for (const CheckpointableInfo& c : chosen) {
    json cj{{"name", c.name}, {"kind", c.kind}, {"bytes", nullptr}};
    if (c.kind == "pytree") {
      Result<PytreeInfo> tree = reader.Pytree(c.name);
      if (!tree.ok()) {
        PrintError("info", JoinUrl(location->url, c.name), tree.status());
        exit_code = kFailed;
        continue;
      }
      PytreeReport report = DescribePytree(*tree);
      cj.update(report.j);
      cj["bytes"] = report.totals.bytes;
      if (!args.json) {
        const Totals& t = report.totals;
        std::cout << "\n" << c.name << " (pytree): " << t.leaves << " leaves, " << t.arrays
                  << " arrays\n";
        report.table.Print("  ");
        std::cout << "  total: " << HumanBytes(t.bytes) << " in arrays, "
                  << HumanBytes(t.stored) << " stored, compression ratio "
                  << RatioText(t.bytes, t.stored) << "\n";
      }
    } else {
      // json and bytes (and kinds this build does not know): one value.
      Result<std::string> value = reader.ReadValue(c.name);
      if (!value.ok()) {
        PrintError("info", JoinUrl(location->url, c.name), value.status());
        exit_code = kFailed;
        continue;
      }
      cj["bytes"] = value->size();
      if (!args.json) {
        std::cout << "\n" << c.name << " (" << c.kind << "): " << HumanBytes(value->size())
                  << "\n";
      }
    }
    out["checkpointables"].push_back(std::move(cj));
  }
  if (args.json) PrintJson(out);
  return exit_code;
}

}  // namespace shardkeep::cli
