// meta.json as Python objects. The core owns the format: it checks and
// encodes the meta a save hands over, and decodes what a load reads. The
// Python front builds and reads the core's own PytreeInfo and LeafInfo
// (shardkeep/contents.h), bound here with LeafKind, never dicts.
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "shardkeep/status.h"

namespace shardkeep::binding {

// A JSON value as Python objects (dicts, lists, str, int, float, None).
nanobind::object JsonToPython(const nlohmann::json& value);
// JSON text already checked by a core decoder, as Python objects with
// objects' members in the order of the text.
nanobind::object JsonTextToPython(std::string_view text);

// The registered_kind of a meta.json text ("" when none): Corruption
// naming `file` when the text does not decode.
Result<std::string> RegisteredKind(const std::string& meta_json, const std::string& file);

// Defines LeafKind, LeafInfo, PytreeInfo, encode_pytree_meta,
// encode_value_meta, registered_kind and decode_pytree_meta in `m`.
void BindMetaObjects(nanobind::module_& m);

}  // namespace shardkeep::binding
