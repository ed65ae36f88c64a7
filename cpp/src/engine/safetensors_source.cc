#include "engine/safetensors_source.h"

#include <map>
#include <nlohmann/json.hpp>

#include "engine/parallel.h"
#include "format/json_parse.h"
#include "shardkeep/safetensors.h"
#include "shardkeep/contents.h"

namespace shardkeep::internal {
namespace {

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(),
                                                suffix) == 0;
}

std::string FolderOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

std::string Join(const std::string& folder, const std::string& name) {
  return folder.empty() ? name : folder + "/" + name;
}

// A file name an index may name: one plain path component.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\\') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// The files of an index JSON, in the order they first appear, and the
// file each tensor is said to be in.
Status ReadIndex(Storage& storage, const std::string& path, std::vector<std::string>& files,
                 std::map<std::string, std::string>& placed) {
  SK_ASSIGN_OR_RETURN(std::string text, storage.ReadAll(path));
  SK_ASSIGN_OR_RETURN(nlohmann::ordered_json index,
                      format::ParseJsonObject<nlohmann::ordered_json>(text, path));
  auto map = index.find("weight_map");
  if (map == index.end() || !map->is_object()) {
    return CorruptionError(path + ": expected \"weight_map\" to be an object");
  }
  const std::string folder = FolderOf(path);
  std::map<std::string, bool> seen;
  for (auto item = map->begin(); item != map->end(); ++item) {
    if (!item.value().is_string() || !IsPlainFileName(item.value().get<std::string>())) {
      return CorruptionError(path + ": tensor \"" + item.key() +
                             "\" must map to a file name in the index's folder");
    }
    const std::string file = Join(folder, item.value().get<std::string>());
    if (!seen[file]) files.push_back(file), seen[file] = true;
    placed[item.key()] = file;
  }
  return Status::Ok();
}

Result<SafetensorsHeader> ReadHeader(Storage& storage, const std::string& file) {
  SK_ASSIGN_OR_RETURN(uint64_t size, storage.FileSize(file));
  std::string first(8, '\0');
  if (size >= 8) SK_RETURN_IF_ERROR(storage.ReadAt(file, 0, 8, first.data()));
  SK_ASSIGN_OR_RETURN(uint64_t length,
                      DecodeSafetensorsHeaderLength(first, size, file));
  std::string header(length, '\0');
  SK_RETURN_IF_ERROR(storage.ReadAt(file, 8, length, header.data()));
  return DecodeSafetensorsHeader(header, size, file);
}

}  // namespace

Result<SafetensorsSource> OpenSafetensorsSource(Storage& storage, const std::string& path,
                                                int threads) {
  SafetensorsSource source;
  std::map<std::string, std::string> placed;  // from an index: tensor -> file
  if (EndsWith(path, ".json")) {
    SK_RETURN_IF_ERROR(ReadIndex(storage, path, source.files, placed));
  } else if (EndsWith(path, ".safetensors")) {
    source.files.push_back(path);
  } else {
    SK_ASSIGN_OR_RETURN(std::vector<std::string> names, storage.List(path));
    for (const std::string& name : names) {
      if (EndsWith(name, ".safetensors")) source.files.push_back(Join(path, name));
    }
  }
  if (source.files.empty()) {
    return NotFoundError(path + " holds no .safetensors file");
  }
  std::vector<SafetensorsHeader> headers(source.files.size());
  SK_RETURN_IF_ERROR(ParallelFor(source.files.size(), threads, [&](size_t i) -> Status {
    SK_ASSIGN_OR_RETURN(headers[i], ReadHeader(storage, source.files[i]));
    return Status::Ok();
  }));

  source.meta.kind = "pytree";
  nlohmann::json keys = nlohmann::json::array();
  nlohmann::json children = nlohmann::json::array();
  std::map<std::string, size_t> file_of;  // tensor -> index into files
  for (size_t f = 0; f < headers.size(); ++f) {
    for (SafetensorsTensor& tensor : headers[f].tensors) {
      auto [it, fresh] = file_of.emplace(tensor.name, f);
      if (!fresh) {
        return CorruptionError("tensor \"" + tensor.name + "\" is in both " +
                               source.files[it->second] + " and " + source.files[f]);
      }
      const uint32_t leaf = static_cast<uint32_t>(source.meta.leaves.size());
      format::LeafMeta meta;
      meta.path = EscapeKey(tensor.name);
      meta.kind = LeafKind::kArray;
      meta.dtype = std::string(DTypeName(tensor.dtype));
      meta.shape = tensor.shape;
      source.meta.leaves.push_back(std::move(meta));
      keys.push_back(tensor.name);
      children.push_back({{"type", "leaf"}, {"leaf", leaf}});
      format::ChunkRecord chunk;
      chunk.leaf = leaf;
      chunk.data_file = static_cast<uint32_t>(f);
      chunk.offset = tensor.offset;
      chunk.stored_length = chunk.raw_length = tensor.length;
      chunk.box = Box{std::vector<uint64_t>(tensor.shape.size(), 0), tensor.shape};
      source.chunks.push_back(std::move(chunk));
    }
  }
  for (const auto& [tensor, file] : placed) {
    auto it = file_of.find(tensor);
    if (it == file_of.end() || source.files[it->second] != file) {
      return CorruptionError(path + ": places tensor \"" + tensor + "\" in " + file +
                             ", which does not hold it");
    }
  }
  source.meta.tree = {{"type", "dict"}, {"keys", std::move(keys)},
                      {"children", std::move(children)}};
  return source;
}

}  // namespace shardkeep::internal
