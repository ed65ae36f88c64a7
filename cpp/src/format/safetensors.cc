#include "shardkeep/safetensors.h"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "format/json_parse.h"
#include "shardkeep/box.h"

namespace shardkeep {
namespace {

constexpr size_t kMaxRank = 64;

// Element types both sides hold one element per byte or more. Packed
// sub-byte types ("F4", "F6_E2M3", ...) have no shardkeep dtype.
constexpr std::pair<DType, std::string_view> kNames[] = {
    {DType::kBool, "BOOL"},       {DType::kUInt8, "U8"},
    {DType::kInt8, "I8"},         {DType::kInt16, "I16"},
    {DType::kUInt16, "U16"},      {DType::kInt32, "I32"},
    {DType::kUInt32, "U32"},      {DType::kInt64, "I64"},
    {DType::kUInt64, "U64"},      {DType::kFloat16, "F16"},
    {DType::kBFloat16, "BF16"},   {DType::kFloat32, "F32"},
    {DType::kFloat64, "F64"},     {DType::kComplex64, "C64"},
    {DType::kFloat8E5M2, "F8_E5M2"}, {DType::kFloat8E4M3FN, "F8_E4M3"},
    {DType::kFloat8E8M0FNU, "F8_E8M0"},
};

uint64_t LoadLittleEndian64(const char* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(p[i]);
  return value;
}

}  // namespace

std::optional<std::string_view> SafetensorsDTypeName(DType dtype) {
  for (const auto& [d, name] : kNames) {
    if (d == dtype) return name;
  }
  return std::nullopt;
}

std::optional<DType> DTypeFromSafetensorsName(std::string_view name) {
  for (const auto& [d, n] : kNames) {
    if (n == name) return d;
  }
  return std::nullopt;
}

Result<uint64_t> DecodeSafetensorsHeaderLength(std::string_view first_8_bytes,
                                               uint64_t file_size,
                                               const std::string& file) {
  if (first_8_bytes.size() < 8 || file_size < 8) {
    return CorruptionError(file + ": not a safetensors file: shorter than the "
                           "8-byte header length");
  }
  const uint64_t length = LoadLittleEndian64(first_8_bytes.data());
  if (length > kMaxSafetensorsHeaderBytes) {
    return CorruptionError(file + ": safetensors header length " +
                           std::to_string(length) + " is over the " +
                           std::to_string(kMaxSafetensorsHeaderBytes) + "-byte limit");
  }
  if (length > file_size - 8) {
    return CorruptionError(file + ": safetensors header length " +
                           std::to_string(length) + " runs past the end of the " +
                           std::to_string(file_size) + "-byte file");
  }
  return length;
}

Result<SafetensorsHeader> DecodeSafetensorsHeader(std::string_view header_json,
                                                  uint64_t file_size,
                                                  const std::string& file) {
  SK_ASSIGN_OR_RETURN(nlohmann::ordered_json j,
                      format::ParseJsonObject<nlohmann::ordered_json>(header_json, file));
  SafetensorsHeader header;
  header.data_start = 8 + header_json.size();
  if (header.data_start > file_size) {
    return CorruptionError(file + ": safetensors header runs past the end of the file");
  }
  const uint64_t data_size = file_size - header.data_start;
  for (auto item = j.begin(); item != j.end(); ++item) {
    // (Not a structured binding: clang 14 cannot capture one in `bad`.)
    const std::string& name = item.key();
    const nlohmann::ordered_json& spec = item.value();
    if (name == "__metadata__") {
      if (!spec.is_object()) {
        return CorruptionError(file + ": \"__metadata__\" must be an object of strings");
      }
      for (auto& [key, value] : spec.items()) {
        if (!value.is_string()) {
          return CorruptionError(file + ": \"__metadata__\" value of \"" + key +
                                 "\" must be a string");
        }
        header.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return CorruptionError(file + ": tensor \"" + name + "\": " + what);
    };
    if (!spec.is_object()) return bad("expected an object");
    SafetensorsTensor tensor;
    tensor.name = name;
    auto dtype = spec.find("dtype");
    if (dtype == spec.end() || !dtype->is_string()) {
      return bad("expected \"dtype\" to be a string");
    }
    std::optional<DType> known = DTypeFromSafetensorsName(dtype->get<std::string>());
    if (!known) {
      return bad("dtype \"" + dtype->get<std::string>() +
                 "\" is unknown or packed below one byte per element");
    }
    tensor.dtype = *known;
    auto shape = spec.find("shape");
    if (shape == spec.end() || !shape->is_array() || shape->size() > kMaxRank) {
      return bad("expected \"shape\" to be an array of at most " +
                 std::to_string(kMaxRank) + " extents");
    }
    for (const auto& extent : *shape) {
      if (!extent.is_number_unsigned()) {
        return bad("expected \"shape\" extents to be non-negative integers");
      }
      tensor.shape.push_back(extent.get<uint64_t>());
    }
    auto offsets = spec.find("data_offsets");
    if (offsets == spec.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return bad("expected \"data_offsets\" to be two non-negative integers");
    }
    const uint64_t begin = (*offsets)[0].get<uint64_t>();
    const uint64_t end = (*offsets)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                 "] are not a range inside the " + std::to_string(data_size) +
                 "-byte data area");
    }
    std::optional<uint64_t> bytes = CheckedByteSize(tensor.shape, DTypeSize(tensor.dtype));
    if (!bytes || *bytes != end - begin) {
      return bad("shape " + shape->dump() + " of " + dtype->get<std::string>() +
                 " does not fill its " + std::to_string(end - begin) + " bytes");
    }
    tensor.offset = header.data_start + begin;
    tensor.length = end - begin;
    header.tensors.push_back(std::move(tensor));
  }
  // No two tensors may share bytes: a hostile file could otherwise alias
  // one tensor's data into another's.
  std::vector<const SafetensorsTensor*> by_offset;
  for (const auto& t : header.tensors) {
    if (t.length > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorsTensor& prev = *by_offset[i - 1];
    if (prev.offset + prev.length > by_offset[i]->offset) {
      return CorruptionError(file + ": tensors \"" + prev.name + "\" and \"" +
                             by_offset[i]->name + "\" overlap");
    }
  }
  return header;
}

std::string EncodeSafetensorsHeader(std::vector<SafetensorsTensor>& tensors,
                                    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t at = 0;
  for (SafetensorsTensor& t : tensors) {
    j[t.name] = {{"dtype", std::string(SafetensorsDTypeName(t.dtype).value_or("?"))},
                 {"shape", t.shape},
                 {"data_offsets", {at, at + t.length}}};
    t.offset = at;
    at += t.length;
  }
  std::string text = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t data_start = 8 + text.size();
  for (SafetensorsTensor& t : tensors) t.offset += data_start;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  return out + text;
}

}  // namespace shardkeep
