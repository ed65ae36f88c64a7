// Key paths and trees built from keys, as the core writes them
// (format/key_tree.h, shardkeep/contents.h): the Python front's saves and
// its readers of other formats use these instead of spelling the escaping
// or the tree's node types themselves.
#pragma once

#include <nanobind/nanobind.h>

namespace shardkeep::binding {

// Defines KeyedValue, escape_key, unescape_key, key_path and tree_of_keys
// in `m`.
void BindTreeKeys(nanobind::module_& m);

}  // namespace shardkeep::binding
