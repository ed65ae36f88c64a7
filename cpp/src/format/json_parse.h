// Parsing JSON files that may come from untrusted places.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "shardkeep/status.h"

namespace shardkeep::format {

// nlohmann's conversions and dump(), and the Python front's tree rebuild,
// recurse, so a hostile file nested thousands deep could overflow the
// stack; nothing legitimate nests deeper. Parsing itself does not recurse.
inline constexpr int kMaxJsonDepth = 512;

// Parses `bytes` as a JSON object (Json is nlohmann::json or ordered_json).
// Corruption "<file>: ..." when it is not JSON, nests deeper than
// kMaxJsonDepth, or is not an object.
template <typename Json>
Result<Json> ParseJsonObject(std::string_view bytes, const std::string& file) {
  bool too_deep = false;
  Json j = Json::parse(
      bytes.begin(), bytes.end(),
      [&too_deep](int depth, typename Json::parse_event_t, Json&) {
        if (depth > kMaxJsonDepth) too_deep = true;
        return !too_deep;  // discard everything once too deep
      },
      /*allow_exceptions=*/false);
  if (too_deep) {
    return CorruptionError(file + ": JSON nested deeper than " +
                           std::to_string(kMaxJsonDepth));
  }
  if (j.is_discarded()) return CorruptionError(file + ": expected a JSON document");
  if (!j.is_object()) return CorruptionError(file + ": expected a JSON object");
  return j;
}

}  // namespace shardkeep::format
