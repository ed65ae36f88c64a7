// Parsing JSON files that may come from untrusted places.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "shardkeep/status.h"

namespace shardkeep::format {

// nlohmann's conversions and dump(), and the Python front's tree rebuild,
// recurse, so a hostile file nested thousands deep could overflow the
// stack; nothing legitimate nests deeper. Parsing itself does not recurse.
inline constexpr int kMaxJsonDepth = 512;

// The deepest nesting of arrays and objects in `bytes`, which need not be
// valid JSON (brackets inside strings do not count).
inline int JsonNestingDepth(std::string_view bytes) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// Parses `bytes` as a JSON object (Json is nlohmann::json or ordered_json).
// Corruption "<file>: ..." when it is not JSON, nests deeper than
// kMaxJsonDepth, or is not an object. The depth is checked by a scan
// before parsing: nlohmann's callback parser, which could check it while
// parsing, is several times slower, and meta.json of a large tree is big.
template <typename Json>
Result<Json> ParseJsonObject(std::string_view bytes, const std::string& file) {
  if (JsonNestingDepth(bytes) > kMaxJsonDepth) {
    return CorruptionError(file + ": JSON nested deeper than " +
                           std::to_string(kMaxJsonDepth));
  }
  Json j = Json::parse(bytes.begin(), bytes.end(), /*cb=*/nullptr,
                       /*allow_exceptions=*/false);
  if (j.is_discarded()) return CorruptionError(file + ": expected a JSON document");
  if (!j.is_object()) return CorruptionError(file + ": expected a JSON object");
  return j;
}

}  // namespace shardkeep::format
