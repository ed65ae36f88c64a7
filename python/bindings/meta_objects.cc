#include "meta_objects.h"

#include <cmath>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nlohmann/json.hpp>

#include "engine/decoded_meta_cache.h"
#include "format/checkpointable_meta.h"
#include "format/json_parse.h"
#include "raise.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace shardkeep::binding {
namespace {

// nlohmann::json and nlohmann::ordered_json alike.
template <typename Json>
nb::object ToPython(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return nb::none();
    case Json::value_t::boolean: return nb::bool_(j.template get<bool>());
    case Json::value_t::number_integer: return nb::int_(j.template get<int64_t>());
    case Json::value_t::number_unsigned: return nb::int_(j.template get<uint64_t>());
    case Json::value_t::number_float: return nb::float_(j.template get<double>());
    case Json::value_t::string: {
      const auto& s = j.template get_ref<const std::string&>();
      return nb::str(s.data(), s.size());
    }
    case Json::value_t::array: {
      nb::list out;
      for (const auto& item : j) out.append(ToPython(item));
      return out;
    }
    case Json::value_t::object: {
      nb::dict out;
      for (const auto& [key, value] : j.items()) {
        out[nb::str(key.data(), key.size())] = ToPython(value);
      }
      return out;
    }
    default: return nb::none();  // binary and discarded values: never decoded
  }
}

nb::object ParsedToPython(const std::string& json_text) {
  return ToPython(nlohmann::json::parse(json_text));
}

// Plain JSON values only: what the Python front puts into meta.json. The
// depth bound is the decoder's, whose recursion relies on it.
Result<nlohmann::json> FromPython(nb::handle obj, int depth) {
  if (depth > format::kMaxJsonDepth) {
    return InvalidArgumentError("meta nested deeper than " +
                                std::to_string(format::kMaxJsonDepth) + " levels");
  }
  if (obj.is_none()) return nlohmann::json(nullptr);
  if (nb::isinstance<nb::bool_>(obj)) return nlohmann::json(nb::cast<bool>(obj));
  if (nb::isinstance<nb::int_>(obj)) {
    // Non-negative integers are unsigned, as the text parser makes them.
    int64_t value;
    if (nb::try_cast<int64_t>(obj, value)) {
      return value >= 0 ? nlohmann::json(static_cast<uint64_t>(value))
                        : nlohmann::json(value);
    }
    uint64_t big;
    if (nb::try_cast<uint64_t>(obj, big)) return nlohmann::json(big);
    return InvalidArgumentError("integer " + nb::cast<std::string>(nb::str(obj)) +
                                " does not fit in 64 bits");
  }
  if (nb::isinstance<nb::float_>(obj)) {
    const double value = nb::cast<double>(obj);
    if (!std::isfinite(value)) {
      return InvalidArgumentError("a non-finite float cannot be written as JSON");
    }
    return nlohmann::json(value);
  }
  if (nb::isinstance<nb::str>(obj)) return nlohmann::json(nb::cast<std::string>(obj));
  if (nb::isinstance<nb::list>(obj) || nb::isinstance<nb::tuple>(obj)) {
    nlohmann::json out = nlohmann::json::array();
    for (nb::handle item : obj) {
      SK_ASSIGN_OR_RETURN(nlohmann::json value, FromPython(item, depth + 1));
      out.push_back(std::move(value));
    }
    return out;
  }
  if (nb::isinstance<nb::dict>(obj)) {
    nlohmann::json out = nlohmann::json::object();
    for (auto [key, value] : nb::cast<nb::dict>(obj)) {
      if (!nb::isinstance<nb::str>(key)) {
        return InvalidArgumentError("meta object keys must be strings");
      }
      SK_ASSIGN_OR_RETURN(out[nb::cast<std::string>(key)], FromPython(value, depth + 1));
    }
    return out;
  }
  return InvalidArgumentError("meta holds a " +
                              nb::cast<std::string>(nb::str(obj.type().attr("__name__"))) +
                              ", which is not a JSON value");
}

}  // namespace

nb::object JsonToPython(const nlohmann::json& value) { return ToPython(value); }

nb::object JsonTextToPython(std::string_view text) {
  return ToPython(nlohmann::ordered_json::parse(text));
}

nb::dict PytreeMetaToPython(const PytreeInfo& info) {
  nb::dict meta;
  meta["kind"] = "pytree";
  if (!info.registered_kind.empty()) meta["registered_kind"] = info.registered_kind;
  meta["tree"] = ParsedToPython(info.tree_json);
  nb::list leaves;
  for (const LeafInfo& leaf : info.leaves) {
    nb::dict l;
    l["path"] = leaf.path;
    const std::string_view kind = LeafKindName(leaf.kind);
    l["kind"] = nb::str(kind.data(), kind.size());
    if (leaf.dtype) {
      const std::string_view dtype = DTypeName(*leaf.dtype);
      l["dtype"] = nb::str(dtype.data(), dtype.size());
    } else {
      l["dtype"] = nb::none();
    }
    const bool shaped = leaf.kind == LeafKind::kArray || leaf.kind == LeafKind::kScalar;
    l["shape"] = shaped ? nb::object(nb::cast(leaf.shape)) : nb::none();
    l["sharding"] = leaf.sharding_json == "null" ? nb::none()
                                                 : ParsedToPython(leaf.sharding_json);
    if (!leaf.value_json.empty()) l["value"] = ParsedToPython(leaf.value_json);
    if (!leaf.prng_impl.empty()) l["prng_impl"] = leaf.prng_impl;
    leaves.append(l);
  }
  meta["leaves"] = leaves;
  return meta;
}

Result<nb::dict> MetaTextToPython(const std::string& meta_json, const std::string& file) {
  SK_ASSIGN_OR_RETURN(format::CheckpointableMeta meta,
                      format::DecodeCheckpointableMeta(meta_json, file));
  return nb::cast<nb::dict>(ToPython(nlohmann::json(format::CheckpointableMetaToJson(meta))));
}

Result<std::string> EncodeMeta(nb::handle meta) {
  SK_ASSIGN_OR_RETURN(nlohmann::json document, FromPython(meta, 0));
  Result<format::CheckpointableMeta> decoded = format::DecodeCheckpointableMetaDocument(
      std::move(document), "the meta.json of a checkpointable being saved");
  if (!decoded.ok()) return InvalidArgumentError(decoded.status().message());
  std::string text = format::EncodeCheckpointableMeta(*decoded);
  // The save checks its shards against the decoded meta: hand it over.
  internal::RememberDecodedMeta(
      text, std::make_shared<const format::CheckpointableMeta>(std::move(*decoded)));
  return text;
}

void BindMetaFunctions(nb::module_& m) {
  m.def(
      "encode_meta", [](nb::handle meta) { return ValueOrRaise(EncodeMeta(meta)); }, "meta"_a,
      "meta.json's text for a meta dict, checked and written by the core.");
  m.def(
      "decode_meta",
      [](const std::string& text, const std::string& file) {
        return ValueOrRaise(MetaTextToPython(text, file));
      },
      "text"_a, "file"_a,
      "The dict a meta.json text holds, checked by the core's decoder (CorruptionError naming"
      " file otherwise).");
}

}  // namespace shardkeep::binding
