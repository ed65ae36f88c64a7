// The one alignment rule host data follows across the core and the Python
// front.
#pragma once

#include <cstdint>

namespace shardkeep {

// XLA's CPU client adopts a host buffer without copying it only when its
// address is a multiple of this. So every chunk in a data file starts at a
// multiple of it (a mapped chunk can become an array as it is), and so
// does every staging copy and load buffer (Python reads it as
// _core.XLA_ALIGNMENT).
inline constexpr uint64_t kXlaAlignment = 64;

}  // namespace shardkeep
