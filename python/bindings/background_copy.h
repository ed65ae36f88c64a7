// Copies into an async save's staging buffer on native threads, while the
// training thread goes on staging the next shards.
#pragma once

#include <nanobind/nanobind.h>

namespace shardkeep::binding {

// Adds the class BackgroundCopy to the module.
void BindBackgroundCopy(nanobind::module_& m);

}  // namespace shardkeep::binding
