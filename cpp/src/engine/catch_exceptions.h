// Keeps C++ exceptions from escaping engine threads. The core reports errors
// as Status values, but memory allocation (std::bad_alloc), the standard
// library and callbacks into user code (storage hooks, coordinators bridged
// to Python) can still throw; on a thread of our own an escaping exception
// would call std::terminate and take the whole process down.
#pragma once

#include <string_view>

#include "shardkeep/status.h"

namespace shardkeep::internal {

// The Status for the exception being handled: ResourceExhausted for
// std::bad_alloc, Internal for anything else, each naming `what` was
// running. REQUIRES: called inside a catch block.
Status StatusOfCurrentException(std::string_view what);

// Returns work(), or the Status of the exception it threw.
template <typename Work>
Status CallCatching(std::string_view what, Work&& work) {
  try {
    return work();
  } catch (...) {
    return StatusOfCurrentException(what);
  }
}

}  // namespace shardkeep::internal
