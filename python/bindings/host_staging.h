// Host staging: the boxes a save writes of each leaf, carved natively out
// of the host arrays that hold them (a numpy leaf, the host view of a
// device shard), in one call per tree instead of Python work per box.
#pragma once

#include <nanobind/nanobind.h>

namespace shardkeep::binding {

// Adds LeafLayout and carve_shards to the module. The Shard class must be
// bound before carve_shards is called.
void BindHostStaging(nanobind::module_& m);

}  // namespace shardkeep::binding
