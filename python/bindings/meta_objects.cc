#include "meta_objects.h"

#include <cmath>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nlohmann/json.hpp>

#include "engine/decoded_meta_cache.h"
#include "format/checkpointable_meta.h"
#include "format/json_parse.h"
#include "format/pytree_info.h"
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

// Checks a meta.json document as the decoder checks a file's
// (InvalidArgument naming the leaf or node) and writes its text.
Result<std::string> EncodeDocument(nlohmann::json document) {
  Result<format::CheckpointableMeta> decoded = format::DecodeCheckpointableMetaDocument(
      std::move(document), "the meta.json of a checkpointable being saved");
  if (!decoded.ok()) return InvalidArgumentError(decoded.status().message());
  std::string text = format::EncodeCheckpointableMeta(*decoded);
  // The save checks its shards against the decoded meta: hand it over.
  internal::RememberDecodedMeta(
      text, std::make_shared<const format::CheckpointableMeta>(std::move(*decoded)));
  return text;
}

// The JSON text of a Python value, for a field of LeafInfo or PytreeInfo
// (InvalidArgumentError naming `field` when it is not JSON).
std::string JsonTextOf(nb::handle value, const char* field) {
  Result<nlohmann::json> json = FromPython(value, 0);
  if (!json.ok()) Raise(InvalidArgumentError(std::string(field) + ": " + json.status().message()));
  // `replace` keeps dump() from throwing on invalid UTF-8 in user strings.
  return json->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// A JSON text of LeafInfo or PytreeInfo as Python objects ("" is None).
nb::object PythonOf(const std::string& text) {
  return text.empty() ? nb::none() : ToPython(nlohmann::json::parse(text));
}

void SetDType(LeafInfo& leaf, const std::string& name) {
  if (name.empty()) {
    leaf.dtype.reset();
    return;
  }
  Result<DType> dtype = DTypeFromName(name);
  if (!dtype.ok()) Raise(InvalidArgumentError("LeafInfo.dtype: " + dtype.status().message()));
  leaf.dtype = *dtype;
}

// Checks `info` as the decoder checks a meta.json (InvalidArgument naming
// the leaf or node) and writes its text.
Result<std::string> EncodePytreeMeta(const PytreeInfo& info) {
  return EncodeDocument(format::PytreeDocumentOf(info));
}

}  // namespace

Result<std::string> RegisteredKind(const std::string& meta_json, const std::string& file) {
  SK_ASSIGN_OR_RETURN(format::CheckpointableMeta meta,
                      format::DecodeCheckpointableMeta(meta_json, file));
  return std::move(meta.registered_kind);
}

nb::object JsonToPython(const nlohmann::json& value) { return ToPython(value); }

nb::object JsonTextToPython(std::string_view text) {
  return ToPython(nlohmann::ordered_json::parse(text));
}

void BindMetaObjects(nb::module_& m) {
  nb::enum_<LeafKind>(m, "LeafKind", "What a pytree leaf holds (docs/FORMAT.md §4).")
      .value("ARRAY", LeafKind::kArray, "An array: dtype and shape, bytes in chunks.")
      .value("SCALAR", LeafKind::kScalar, "A Python bool, int or float: dtype and value.")
      .value("STRING", LeafKind::kString, "A Python str: its value.")
      .value("NONE", LeafKind::kNone, "Python None.");

  nb::class_<LeafInfo>(m, "LeafInfo", "One leaf of a pytree's meta.json (docs/FORMAT.md §4).")
      .def(
          "__init__",
          [](LeafInfo* self, std::string path, LeafKind kind,
             const std::string& dtype, std::vector<uint64_t> shape,
             nb::handle sharding, nb::handle value, std::string prng_impl) {
            LeafInfo leaf;
            leaf.path = std::move(path);
            leaf.kind = kind;
            SetDType(leaf, dtype);
            leaf.shape = std::move(shape);
            leaf.sharding_json = JsonTextOf(sharding, "LeafInfo.sharding");
            if (!value.is_none()) leaf.value_json = JsonTextOf(value, "LeafInfo.value");
            leaf.prng_impl = std::move(prng_impl);
            new (self) LeafInfo(std::move(leaf));
          },
          "path"_a, "kind"_a, "dtype"_a = "", "shape"_a = std::vector<uint64_t>{},
          "sharding"_a = nb::none(), "value"_a = nb::none(), "prng_impl"_a = "")
      .def_ro("index", &LeafInfo::index, "Its position in the pytree's leaves.")
      .def_rw("path", &LeafInfo::path, "Its key path: keys escaped and joined by '/'.")
      .def_rw("kind", &LeafInfo::kind)
      .def_prop_rw(
          "dtype",
          [](const LeafInfo& leaf) {
            return leaf.dtype ? std::string(DTypeName(*leaf.dtype)) : std::string();
          },
          SetDType, "The numpy dtype name of an array or scalar, else \"\".")
      .def_rw("shape", &LeafInfo::shape, "An array's shape; [] for scalars and other kinds.")
      .def_prop_rw(
          "sharding", [](const LeafInfo& leaf) { return PythonOf(leaf.sharding_json); },
          [](LeafInfo& leaf, nb::handle value) {
            leaf.sharding_json = JsonTextOf(value, "LeafInfo.sharding");
          },
          nb::for_getter(nb::sig("def sharding(self, /) -> typing.Any")),
          nb::for_setter(nb::sig("def sharding(self, value: typing.Any, /) -> None")),
          nb::for_setter(nb::arg("value").none()),
          "The saved sharding's description (shardings.describe), or None.")
      .def_prop_rw(
          "value", [](const LeafInfo& leaf) { return PythonOf(leaf.value_json); },
          [](LeafInfo& leaf, nb::handle value) {
            leaf.value_json = value.is_none() ? "" : JsonTextOf(value, "LeafInfo.value");
          },
          nb::for_getter(nb::sig("def value(self, /) -> typing.Any")),
          nb::for_setter(nb::sig("def value(self, value: typing.Any, /) -> None")),
          nb::for_setter(nb::arg("value").none()),
          "A scalar's or string's value as saved (non-finite floats as \"nan\", \"inf\","
          " \"-inf\"), else None.")
      .def_rw("prng_impl", &LeafInfo::prng_impl,
              "JAX's PRNG implementation of typed key data, else \"\".")
      .def_prop_ro("nbytes", &LeafInfo::nbytes, "An array's size in bytes, else 0.")
      .def("__repr__", [](const LeafInfo& leaf) {
        return "LeafInfo(" + nb::cast<std::string>(nb::repr(nb::str(leaf.path.c_str()))) + ", " +
               std::string(LeafKindName(leaf.kind)) + ")";
      });

  nb::class_<PytreeInfo>(m, "PytreeInfo",
                         "A pytree checkpointable's meta.json: its tree and its leaves.")
      .def(
          "__init__",
          [](PytreeInfo* self, nb::handle tree, std::vector<LeafInfo> leaves,
             std::string registered_kind) {
            PytreeInfo info;
            info.tree_json = JsonTextOf(tree, "PytreeInfo.tree");
            info.leaves = std::move(leaves);
            for (size_t i = 0; i < info.leaves.size(); ++i) {
              info.leaves[i].index = static_cast<uint32_t>(i);
            }
            info.registered_kind = std::move(registered_kind);
            new (self) PytreeInfo(std::move(info));
          },
          "tree"_a, "leaves"_a, "registered_kind"_a = "")
      .def_prop_ro(
          "tree", [](const PytreeInfo& info) { return PythonOf(info.tree_json); },
          nb::sig("def tree(self, /) -> typing.Any"),
          "The structure (docs/FORMAT.md §4.1) as dicts and lists.")
      .def_ro("leaves", &PytreeInfo::leaves, "The leaves, in flattening order.")
      .def_ro("registered_kind", &PytreeInfo::registered_kind,
              "The kind registered in the Python front it was saved as, or \"\".")
      .def_ro("stored_bytes", &PytreeInfo::stored_bytes,
              "Per leaf, its chunks' bytes as stored (read from a checkpoint; else empty).");

  m.def(
      "encode_pytree_meta",
      [](const PytreeInfo& info) { return ValueOrRaise(EncodePytreeMeta(info)); }, "info"_a,
      "meta.json's text for a pytree, checked and written by the core (InvalidArgumentError"
      " naming the leaf or tree node otherwise).");
  m.def(
      "encode_value_meta",
      [](const std::string& kind, const std::string& registered_kind) {
        nlohmann::json document{{"kind", kind}};
        if (!registered_kind.empty()) document["registered_kind"] = registered_kind;
        return ValueOrRaise(EncodeDocument(std::move(document)));
      },
      "kind"_a, "registered_kind"_a = "",
      "meta.json's text for a json or bytes checkpointable (registered_kind: the kind"
      " registered in the Python front it is saved as, or \"\").");
  m.def(
      "registered_kind",
      [](const std::string& text, const std::string& file) {
        return ValueOrRaise(RegisteredKind(text, file));
      },
      "text"_a, "file"_a,
      "The kind registered in the Python front that a meta.json text was saved as, or \"\""
      " (CorruptionError naming file when the text does not decode).");
  m.def(
      "decode_pytree_meta",
      [](const std::string& text, const std::string& file) {
        return format::PytreeInfoOf(
            ValueOrRaise(format::DecodeCheckpointableMeta(text, file)));
      },
      "text"_a, "file"_a,
      "The pytree a meta.json text holds, checked by the core's decoder (CorruptionError"
      " naming file otherwise).");
}

}  // namespace shardkeep::binding
