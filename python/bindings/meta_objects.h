// meta.json as Python objects. The core owns the format: it checks and
// encodes the meta a save hands over, and decodes what a load reads; the
// Python front only builds and reads the plain dicts and lists below.
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "shardkeep/contents.h"
#include "shardkeep/status.h"

namespace shardkeep::binding {

// A JSON value as Python objects (dicts, lists, str, int, float, None).
nanobind::object JsonToPython(const nlohmann::json& value);
// JSON text already checked by a core decoder, as Python objects with
// objects' members in the order of the text.
nanobind::object JsonTextToPython(std::string_view text);

// {"kind": "pytree", "tree": ..., "leaves": [...]} (plus "registered_kind"
// when set), leaves as docs/FORMAT.md §4 spells their fields.
nanobind::dict PytreeMetaToPython(const PytreeInfo& info);

// A meta.json text (any kind) as the dict it holds, checked by the core's
// decoder: Corruption naming `file` otherwise.
Result<nanobind::dict> MetaTextToPython(const std::string& meta_json,
                                         const std::string& file);

// meta.json's text for `meta`, a dict of the form above, checked by the
// core's decoder (InvalidArgument naming the leaf or node otherwise).
// REQUIRES: the GIL.
Result<std::string> EncodeMeta(nanobind::handle meta);

// Defines encode_meta and decode_meta in `m`.
void BindMetaFunctions(nanobind::module_& m);

}  // namespace shardkeep::binding
