#include "tree_keys.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>
#include <vector>

#include "format/key_tree.h"
#include "meta_objects.h"
#include "raise.h"
#include "shardkeep/contents.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace shardkeep::binding {
namespace {

// (keys, value): keys as (name, is a list position) pairs.
using PyKeyedEntry =
    std::tuple<std::vector<std::tuple<std::string, bool>>, format::KeyedValue>;

// format::TreeFromKeys of `entries`, as Python dicts and lists.
Result<nb::object> TreeFromKeys(const std::string& where,
                                const std::vector<PyKeyedEntry>& entries) {
  std::vector<format::KeyedEntry> keyed;
  keyed.reserve(entries.size());
  for (const auto& [keys, value] : entries) {
    format::KeyedEntry entry;
    entry.value = value;
    for (const auto& [name, position] : keys) entry.keys.push_back({name, position});
    keyed.push_back(std::move(entry));
  }
  SK_ASSIGN_OR_RETURN(nlohmann::json tree, format::TreeFromKeys(keyed, where));
  return JsonToPython(tree);
}

}  // namespace

void BindTreeKeys(nb::module_& m) {
  nb::enum_<format::KeyedValue>(m, "KeyedValue",
                                "What sits at an entry's keys in tree_of_keys.")
      .value("LEAF", format::KeyedValue::kLeaf, "A leaf: the next leaf number.")
      .value("EMPTY_DICT", format::KeyedValue::kEmptyDict, "An empty dict (no leaf).")
      .value("EMPTY_LIST", format::KeyedValue::kEmptyList, "An empty list (no leaf).");
  m.def("escape_key", [](const std::string& key) { return EscapeKey(key); }, "key"_a,
        "One key as a key path segment: '~' as \"~0\", '/' as \"~1\".");
  m.def("unescape_key", [](const std::string& segment) { return UnescapeKey(segment); },
        "segment"_a, "The key a key path segment escapes.");
  m.def(
      "key_path",
      [](const std::vector<std::string>& names) {
        std::vector<format::TreeKey> keys;
        keys.reserve(names.size());
        for (const std::string& name : names) keys.push_back({name, false});
        return format::EscapedKeyPath(keys);
      },
      "keys"_a, "A leaf's key path: its keys (strings, unescaped) escaped and joined by '/'.");
  m.def(
      "tree_of_keys",
      [](const std::string& where, const std::vector<PyKeyedEntry>& entries) {
        return ValueOrRaise(TreeFromKeys(where, entries));
      },
      "where"_a, "entries"_a,
      "The meta.json tree of nested dicts and lists holding, at each entry's keys ((name, is a"
      " list position) pairs), the next leaf number or an empty container; CorruptionError"
      " prefixed with where when two entries conflict.");
}

}  // namespace shardkeep::binding
