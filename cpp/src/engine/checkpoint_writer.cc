#include "shardkeep/checkpoint_writer.h"

#include <cmath>
#include <map>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "engine/decoded_meta_cache.h"
#include "engine/tiling.h"
#include "format/checkpointable_meta.h"
#include "format/commit_record.h"  // CheckCheckpointableName
#include "format/json_parse.h"
#include "format/key_tree.h"
#include "shardkeep/contents.h"

namespace shardkeep {
namespace {

constexpr size_t kMaxRank = 64;

// Parses a caller's JSON text; InvalidArgument naming `what` unless it is
// JSON (and, with `object`, a JSON object).
Result<nlohmann::json> ParseCallerJson(const std::string& text, const std::string& what,
                                       bool object = false) {
  if (format::JsonNestingDepth(text) > format::kMaxJsonDepth) {
    return InvalidArgumentError(what + " nests deeper than " +
                                std::to_string(format::kMaxJsonDepth));
  }
  nlohmann::json j = nlohmann::json::parse(text, /*cb=*/nullptr,
                                           /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(what + " is not JSON: " + text);
  if (object && !j.is_object()) {
    return InvalidArgumentError(what + " must be a JSON object, got " + text);
  }
  return j;
}

// A key path's segments, still escaped ("" has the one segment "").
std::vector<std::string> Segments(std::string_view path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t slash = path.find('/', start);
    out.emplace_back(path.substr(start, slash - start));
    if (slash == std::string_view::npos) return out;
    start = slash + 1;
  }
}

bool IsCanonicalSegment(const std::string& segment) {
  return EscapeKey(UnescapeKey(segment)) == segment;
}

// 's', for names in messages.
std::string Quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '\'';
  out += s;
  out += '\'';
  return out;
}

}  // namespace

struct PytreeBuilder::State {
  // One declared leaf and this process's shards of it.
  struct DeclaredLeaf {
    format::LeafMeta meta;
    std::optional<DType> dtype;  // arrays
    // The shards: memory (`data`) or sources (`fill`); leaf, dtype unset.
    std::vector<ShardData> shards;
  };

  std::string name;
  const bool* started = nullptr;  // the writer's: no changes once it started
  std::vector<DeclaredLeaf> leaves;  // in declaration order
  std::map<std::string, size_t, std::less<>> by_path;
  std::optional<nlohmann::json> tree;  // SetTree's
  // Owned shard memory. Moving a vector keeps its buffer, so the pointers
  // in `shards` stay valid when this grows and when the save takes it.
  std::vector<std::vector<uint8_t>> owned;

  std::string Where(std::string_view path) const {
    return "leaf " + Quote(path) + " of checkpointable " + Quote(name);
  }

  Status CheckOpen() const {
    if (*started) {
      return InvalidArgumentError("checkpointable " + Quote(name) +
                                  ": the writer has already started its save");
    }
    return Status::Ok();
  }

  // Adds a leaf after checking its path against the others.
  Status Declare(DeclaredLeaf leaf) {
    SK_RETURN_IF_ERROR(CheckOpen());
    const std::string& path = leaf.meta.path;
    for (const std::string& segment : Segments(path)) {
      if (!IsCanonicalSegment(segment)) {
        return InvalidArgumentError(Where(path) + ": segment " + Quote(segment) +
                                    " is not an escaped key ('~' must be written "
                                    "\"~0\" and '/' inside a key \"~1\")");
      }
    }
    if (by_path.count(path)) return InvalidArgumentError(Where(path) + " is declared twice");
    if (path.empty() && !by_path.empty()) {
      return InvalidArgumentError(Where(path) + ": the root leaf \"\" must be the only "
                                  "leaf, but " + Quote(by_path.begin()->first) +
                                  " is declared");
    }
    if (by_path.count("")) {
      return InvalidArgumentError(Where(path) + ": the root leaf \"\" is declared, so "
                                  "the tree can have no other leaf");
    }
    for (size_t slash = path.find('/'); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
      const std::string_view prefix = std::string_view(path).substr(0, slash);
      if (by_path.find(prefix) != by_path.end()) {
        return InvalidArgumentError(Where(path) + ": leaf " + Quote(prefix) +
                                    " is a prefix of its path (a leaf cannot also "
                                    "hold other leaves)");
      }
    }
    const std::string below = path + "/";
    if (auto it = by_path.lower_bound(below);
        it != by_path.end() && it->first.starts_with(below)) {
      return InvalidArgumentError(Where(path) + " is a prefix of leaf " +
                                  Quote(it->first) + " (a leaf cannot also hold "
                                  "other leaves)");
    }
    by_path.emplace(path, leaves.size());
    leaves.push_back(std::move(leaf));
    return Status::Ok();
  }

  Status DeclareValue(std::string path, LeafKind kind, std::string dtype,
                      nlohmann::json value) {
    DeclaredLeaf leaf;
    leaf.meta.path = std::move(path);
    leaf.meta.kind = kind;
    leaf.meta.dtype = std::move(dtype);
    leaf.meta.value = std::move(value);
    return Declare(std::move(leaf));
  }

  // The array leaf `path` if a shard of `dtype` and `box` fits it.
  Result<DeclaredLeaf*> LeafForShard(std::string_view path, DType dtype, const Box& box) {
    SK_RETURN_IF_ERROR(CheckOpen());
    auto it = by_path.find(path);
    if (it == by_path.end()) {
      return InvalidArgumentError(Where(path) + " has not been declared (AddArray)");
    }
    DeclaredLeaf& leaf = leaves[it->second];
    if (leaf.meta.kind != LeafKind::kArray) {
      return InvalidArgumentError(Where(path) + " is a " +
                                  std::string(LeafKindName(leaf.meta.kind)) +
                                  ", not an array: it has no shards");
    }
    if (dtype != *leaf.dtype) {
      return InvalidArgumentError(Where(path) + ": shard of dtype " +
                                  std::string(DTypeName(dtype)) + " but the leaf is " +
                                  leaf.meta.dtype);
    }
    const Box whole{std::vector<uint64_t>(leaf.meta.shape.size(), 0), leaf.meta.shape};
    if (box.origin.size() != box.shape.size() || box.rank() != whole.rank() ||
        !Contains(whole, box)) {
      return InvalidArgumentError(Where(path) + ": shard box " + box.ToString() +
                                  " lies outside shape " + whole.ToString());
    }
    return &leaf;
  }

  Status AddShard(std::string_view path, DType dtype, Box box, const uint8_t* data,
                  size_t size) {
    SK_ASSIGN_OR_RETURN(DeclaredLeaf* leaf, LeafForShard(path, dtype, box));
    // Inside a leaf of at most 2^63 bytes: the product cannot overflow.
    const uint64_t expected = box.NumElements() * DTypeSize(dtype);
    if (size != expected) {
      return InvalidArgumentError(Where(path) + ": shard box " + box.ToString() +
                                  " of " + leaf->meta.dtype + " needs " +
                                  std::to_string(expected) + " bytes, got " +
                                  std::to_string(size));
    }
    if (data == nullptr && expected > 0) {
      return InvalidArgumentError(Where(path) + ": shard box " + box.ToString() +
                                  " has no data");
    }
    ShardData shard;
    shard.dtype = dtype;
    shard.box = std::move(box);
    shard.data = data;
    leaf->shards.push_back(std::move(shard));
    return Status::Ok();
  }

  Status AddShardSource(std::string_view path, DType dtype, Box box,
                        std::function<Status(const Box&, uint8_t*)> fill) {
    SK_ASSIGN_OR_RETURN(DeclaredLeaf* leaf, LeafForShard(path, dtype, box));
    if (!fill) return InvalidArgumentError(Where(path) + ": shard source is empty");
    ShardData shard;
    shard.dtype = dtype;
    shard.box = std::move(box);
    shard.fill = std::move(fill);
    leaf->shards.push_back(std::move(shard));
    return Status::Ok();
  }
};

PytreeBuilder::PytreeBuilder(std::unique_ptr<State> state) : state_(std::move(state)) {}
PytreeBuilder::~PytreeBuilder() = default;

Status PytreeBuilder::AddArray(std::string path, DType dtype, std::vector<uint64_t> shape,
                               std::string sharding_json) {
  const std::string where = state_->Where(path);
  if (shape.size() > kMaxRank) {
    return InvalidArgumentError(where + ": rank " + std::to_string(shape.size()) +
                                " exceeds " + std::to_string(kMaxRank));
  }
  std::vector<uint64_t> nonzero;
  for (uint64_t extent : shape) {
    if (extent != 0) nonzero.push_back(extent);
  }
  std::optional<uint64_t> bytes = CheckedByteSize(nonzero, DTypeSize(dtype));
  if (!bytes || *bytes > (uint64_t{1} << 63)) {
    return InvalidArgumentError(where + ": shape " + Box{shape, shape}.ToString() +
                                " holds more than 2^63 bytes");
  }
  SK_ASSIGN_OR_RETURN(nlohmann::json sharding,
                      ParseCallerJson(sharding_json, where + ": the sharding description"));
  // The Python front reads a description as a dict (or None).
  if (!sharding.is_null() && !sharding.is_object()) {
    return InvalidArgumentError(where + ": the sharding description must be null or a "
                                "JSON object, got " + sharding_json);
  }
  State::DeclaredLeaf leaf;
  leaf.meta.path = std::move(path);
  leaf.meta.kind = LeafKind::kArray;
  leaf.meta.dtype = std::string(DTypeName(dtype));
  leaf.meta.shape = std::move(shape);
  leaf.meta.sharding = std::move(sharding);
  leaf.dtype = dtype;
  return state_->Declare(std::move(leaf));
}

Status PytreeBuilder::AddBool(std::string path, bool value) {
  return state_->DeclareValue(std::move(path), LeafKind::kScalar, "bool", value);
}

Status PytreeBuilder::AddInt(std::string path, int64_t value) {
  return state_->DeclareValue(std::move(path), LeafKind::kScalar, "int64", value);
}

Status PytreeBuilder::AddFloat(std::string path, double value) {
  // JSON has no non-finite numbers: FORMAT.md §4 spells them as strings.
  nlohmann::json v = value;
  if (std::isnan(value)) {
    v = "nan";
  } else if (std::isinf(value)) {
    v = value > 0 ? "inf" : "-inf";
  }
  return state_->DeclareValue(std::move(path), LeafKind::kScalar, "float64", std::move(v));
}

Status PytreeBuilder::AddString(std::string path, std::string value) {
  return state_->DeclareValue(std::move(path), LeafKind::kString, "", std::move(value));
}

Status PytreeBuilder::AddNone(std::string path) {
  return state_->DeclareValue(std::move(path), LeafKind::kNone, "", nullptr);
}

Status PytreeBuilder::AddShard(std::string_view path, DType dtype, Box box,
                               const void* data, size_t size) {
  return state_->AddShard(path, dtype, std::move(box), static_cast<const uint8_t*>(data),
                          size);
}

Status PytreeBuilder::AddShard(std::string_view path, DType dtype, Box box,
                               std::vector<uint8_t> data) {
  const uint8_t* bytes = data.data();
  const size_t size = data.size();
  SK_RETURN_IF_ERROR(state_->AddShard(path, dtype, std::move(box), bytes, size));
  state_->owned.push_back(std::move(data));
  return Status::Ok();
}

Status PytreeBuilder::AddShardSource(std::string_view path, DType dtype, Box box,
                                     std::function<Status(const Box&, uint8_t*)> fill) {
  return state_->AddShardSource(path, dtype, std::move(box), std::move(fill));
}

Status PytreeBuilder::SetTree(std::string tree_json) {
  SK_RETURN_IF_ERROR(state_->CheckOpen());
  SK_ASSIGN_OR_RETURN(
      nlohmann::json tree,
      ParseCallerJson(tree_json, "the tree of checkpointable " + Quote(state_->name)));
  state_->tree = std::move(tree);
  return Status::Ok();
}

namespace {

// Numbers the leaves in the tree's depth-first order (FORMAT.md §4.1) while
// the tree is built or checked: `order[i]` is the declared leaf that
// becomes leaf i of meta.json.
struct LeafNumbering {
  explicit LeafNumbering(const PytreeBuilder::State& state)
      : state(state), used(state.leaves.size(), false) {}

  const PytreeBuilder::State& state;
  std::vector<size_t> order;
  std::vector<bool> used;

  nlohmann::json LeafNode(size_t declared) {
    used[declared] = true;
    order.push_back(declared);
    return {{"type", "leaf"}, {"leaf", order.size() - 1}};
  }
};

// Walks a caller's tree, giving each leaf node the number of the declared
// leaf its position names. Errors name the node by its JSON pointer.
class TreeMatcher {
 public:
  explicit TreeMatcher(LeafNumbering& numbering) : numbering_(numbering) {}

  Status Match(nlohmann::json& node, const std::string& at, const std::string& path,
               int depth) {
    const std::string where = "the tree of checkpointable " +
                              Quote(numbering_.state.name) + ", node " +
                              (at.empty() ? "/" : at);
    if (depth > format::kMaxJsonDepth) {
      return InvalidArgumentError(where + ": nested too deep");
    }
    if (!node.is_object() || !node.contains("type") || !node["type"].is_string()) {
      return InvalidArgumentError(where + ": expected an object with a string \"type\"");
    }
    const std::string type = node["type"].get<std::string>();
    if (type == "leaf") {
      auto it = numbering_.state.by_path.find(path);
      if (it == numbering_.state.by_path.end()) {
        return InvalidArgumentError(where + ": its key path " + Quote(path) +
                                    " is not a declared leaf");
      }
      if (numbering_.used[it->second]) {
        return InvalidArgumentError(where + ": a second node for leaf " + Quote(path));
      }
      node = numbering_.LeafNode(it->second);
      return Status::Ok();
    }
    if (!node.contains("children") || !node["children"].is_array()) {
      return InvalidArgumentError(where + ": expected \"children\" to be an array");
    }
    nlohmann::json& children = node["children"];
    std::vector<std::string> segments;
    if (type == "list" || type == "tuple") {
      for (size_t i = 0; i < children.size(); ++i) segments.push_back(std::to_string(i));
    } else if (type == "dict" || type == "custom" || type == "namedtuple") {
      const char* field = type == "namedtuple" ? "fields" : "keys";
      if (!node.contains(field) || !node[field].is_array() ||
          node[field].size() != children.size()) {
        return InvalidArgumentError(where + ": expected \"" + field +
                                    "\", an array as long as \"children\"");
      }
      for (const nlohmann::json& key : node[field]) {
        if (key.is_string()) {
          segments.push_back(EscapeKey(key.get<std::string>()));
        } else if (key.is_number_integer() && type != "namedtuple") {
          segments.push_back(key.dump());
        } else {
          return InvalidArgumentError(where + ": key " + key.dump() +
                                      " is not a string or integer");
        }
      }
    } else {
      return InvalidArgumentError(where + ": unknown node type \"" + type + "\"");
    }
    for (size_t i = 0; i < children.size(); ++i) {
      // Keys are joined by '/': the root's children have no '/' before.
      const std::string child_path = depth == 0 ? segments[i] : path + "/" + segments[i];
      SK_RETURN_IF_ERROR(Match(children[i], at + "/children/" + std::to_string(i),
                               child_path, depth + 1));
    }
    return Status::Ok();
  }

 private:
  LeafNumbering& numbering_;
};

// The checkpointable's meta.json and its shards, leaves numbered as in
// meta.json. Checks the shards of each array leaf: no two overlap and,
// when `whole` (this process writes everything), they tile the leaf.
Result<CheckpointablePayload> EncodePytree(const PytreeBuilder::State& state,
                                           const std::string& checkpoint, bool whole) {
  LeafNumbering numbering{state};
  format::CheckpointableMeta meta;
  meta.kind = "pytree";
  if (state.tree) {
    meta.tree = *state.tree;
    SK_RETURN_IF_ERROR(TreeMatcher(numbering).Match(meta.tree, "", "", 0));
    for (size_t i = 0; i < state.leaves.size(); ++i) {
      if (!numbering.used[i]) {
        return InvalidArgumentError("the tree of checkpointable " + Quote(state.name) +
                                    " has no leaf node for declared leaf " +
                                    Quote(state.leaves[i].meta.path));
      }
    }
  } else {
    // Nested dicts from the key paths, numbered as a caller's tree is.
    // Declare() keeps leaves from also being containers, so this builds.
    std::vector<format::KeyedEntry> entries(state.leaves.size());
    for (size_t i = 0; i < state.leaves.size(); ++i) {
      const std::string& path = state.leaves[i].meta.path;
      if (path.empty()) continue;  // the root leaf
      for (const std::string& segment : Segments(path)) {
        entries[i].keys.push_back({UnescapeKey(segment), false});
      }
    }
    SK_ASSIGN_OR_RETURN(meta.tree, format::TreeFromKeys(entries, "checkpointable " +
                                                                    Quote(state.name)));
    SK_RETURN_IF_ERROR(TreeMatcher(numbering).Match(meta.tree, "", "", 0));
  }
  CheckpointablePayload part;
  part.name = state.name;
  part.kind = "pytree";
  for (size_t number = 0; number < numbering.order.size(); ++number) {
    const PytreeBuilder::State::DeclaredLeaf& leaf = state.leaves[numbering.order[number]];
    meta.leaves.push_back(leaf.meta);
    std::vector<const Box*> boxes;
    for (const ShardData& shard : leaf.shards) boxes.push_back(&shard.box);
    if (leaf.meta.kind == LeafKind::kArray) {
      if (auto fault = internal::FindTilingFault(leaf.meta.shape, boxes)) {
        const std::string where = state.Where(leaf.meta.path) + " of " + checkpoint;
        if (fault->overlap) {
          return InvalidArgumentError(
              where + ": shards " + boxes[fault->overlap->first]->ToString() + " and " +
              boxes[fault->overlap->second]->ToString() + " overlap");
        }
        if (whole) {
          return InvalidArgumentError(
              where + ": the shards cover " + std::to_string(fault->covered) + " of its " +
              std::to_string(fault->total) + " elements (this process writes the "
              "whole checkpoint, so they must cover every element)");
        }
      }
    }
    for (ShardData shard : leaf.shards) {
      shard.leaf = static_cast<uint32_t>(number);
      part.shards.push_back(std::move(shard));
    }
  }
  part.meta_json = format::EncodeCheckpointableMeta(meta);
  // Decoding what was encoded checks what the caller's tree may still get
  // wrong (FORMAT.md §4.1); the engine's own check then finds it decoded.
  auto decoded = internal::DecodeMetaCached(part.meta_json, part.name + "/meta.json");
  if (!decoded.ok()) {
    return InvalidArgumentError("checkpointable " + Quote(state.name) + " of " +
                                checkpoint + " would not load: " +
                                decoded.status().message());
  }
  return part;
}

}  // namespace

struct CheckpointWriter::State {
  std::shared_ptr<Storage> storage;
  std::string path;
  std::shared_ptr<Coordinator> coordinator;
  struct Part {
    std::string name;
    std::string kind;
    std::unique_ptr<PytreeBuilder> pytree;  // kind "pytree"
    std::string value;                      // kinds "json" and "bytes"
  };
  std::vector<Part> parts;
  std::optional<int64_t> step;
  std::string custom_metadata_json = "{}";
  std::string metrics_json = "{}";
  bool force = false;
  std::string operation_id;
  bool started = false;

  Status CheckNewPart(const std::string& name) const {
    if (started) {
      return InvalidArgumentError("checkpoint " + path +
                                  ": the writer has already started its save");
    }
    SK_RETURN_IF_ERROR(format::CheckCheckpointableName(name));
    for (const Part& part : parts) {
      if (part.name == name) {
        return InvalidArgumentError("checkpointable " + Quote(name) + " of " + path +
                                    " is added twice");
      }
    }
    return Status::Ok();
  }
};

CheckpointWriter::CheckpointWriter(std::shared_ptr<Storage> storage, std::string path)
    : state_(std::make_unique<State>()) {
  state_->storage = std::move(storage);
  state_->path = std::move(path);
}

CheckpointWriter::~CheckpointWriter() = default;

Result<PytreeBuilder*> CheckpointWriter::AddPytree(std::string name) {
  SK_RETURN_IF_ERROR(state_->CheckNewPart(name));
  auto builder_state = std::make_unique<PytreeBuilder::State>();
  builder_state->name = name;
  builder_state->started = &state_->started;
  std::unique_ptr<PytreeBuilder> builder(new PytreeBuilder(std::move(builder_state)));
  PytreeBuilder* out = builder.get();
  state_->parts.push_back({std::move(name), "pytree", std::move(builder), ""});
  return out;
}

Status CheckpointWriter::AddJson(std::string name, std::string json) {
  SK_RETURN_IF_ERROR(state_->CheckNewPart(name));
  SK_RETURN_IF_ERROR(ParseCallerJson(json, "the value of checkpointable " + Quote(name))
                         .status());
  state_->parts.push_back({std::move(name), "json", nullptr, std::move(json)});
  return Status::Ok();
}

Status CheckpointWriter::AddBytes(std::string name, std::string bytes) {
  SK_RETURN_IF_ERROR(state_->CheckNewPart(name));
  state_->parts.push_back({std::move(name), "bytes", nullptr, std::move(bytes)});
  return Status::Ok();
}

void CheckpointWriter::SetStep(int64_t step) { state_->step = step; }

Status CheckpointWriter::SetCustomMetadata(std::string json_object) {
  SK_RETURN_IF_ERROR(
      ParseCallerJson(json_object, "custom metadata", /*object=*/true).status());
  state_->custom_metadata_json = std::move(json_object);
  return Status::Ok();
}

Status CheckpointWriter::SetMetrics(std::string json_object) {
  SK_RETURN_IF_ERROR(ParseCallerJson(json_object, "metrics", /*object=*/true).status());
  state_->metrics_json = std::move(json_object);
  return Status::Ok();
}

void CheckpointWriter::SetForce(bool force) { state_->force = force; }

void CheckpointWriter::SetCoordinator(std::shared_ptr<Coordinator> coordinator) {
  state_->coordinator = std::move(coordinator);
}

void CheckpointWriter::SetOperationId(std::string operation_id) {
  state_->operation_id = std::move(operation_id);
}

Result<std::unique_ptr<SaveHandle>> CheckpointWriter::Start(const Options& options) {
  State& s = *state_;
  if (s.started) {
    return InvalidArgumentError("checkpoint " + s.path +
                                ": the writer has already started its save");
  }
  const bool whole = s.coordinator == nullptr || s.coordinator->process_count() == 1;
  SaveRequest request;
  request.path = s.path;
  request.step = s.step;
  request.custom_metadata_json = s.custom_metadata_json;
  request.metrics_json = s.metrics_json;
  request.force = s.force;
  request.operation_id = s.operation_id;
  for (const State::Part& part : s.parts) {
    if (part.kind == "pytree") {
      SK_ASSIGN_OR_RETURN(CheckpointablePayload payload,
                          EncodePytree(*part.pytree->state_, s.path, whole));
      request.parts.push_back(std::move(payload));
    } else {
      format::CheckpointableMeta meta;
      meta.kind = part.kind;
      request.parts.push_back(
          {part.name, part.kind, format::EncodeCheckpointableMeta(meta), {}, ""});
    }
  }
  // Every check passed (until here the caller may fix the input and call
  // again). From here on the values and the owned shard memory belong to
  // the save.
  s.started = true;
  auto owned = std::make_shared<std::vector<std::vector<uint8_t>>>();
  for (size_t i = 0; i < s.parts.size(); ++i) {
    State::Part& part = s.parts[i];
    request.parts[i].value = std::move(part.value);
    if (!part.pytree) continue;
    for (std::vector<uint8_t>& buffer : part.pytree->state_->owned) {
      owned->push_back(std::move(buffer));
    }
    part.pytree->state_->owned.clear();
  }
  request.keepalive = std::move(owned);
  return StartSave(s.storage, s.coordinator, std::move(request), options);
}

Status CheckpointWriter::Commit(const Options& options) {
  SK_ASSIGN_OR_RETURN(std::unique_ptr<SaveHandle> handle, Start(options));
  return *handle->future().Wait(-1);
}

}  // namespace shardkeep
