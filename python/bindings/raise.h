// How the binding reports a non-OK Status to Python: as the
// shardkeep.errors exception of its code, or as the KeyboardInterrupt
// (or SystemExit) a Python callback raised while the engine ran, which
// the engine saw as Cancelled. The one place a Status becomes an
// exception; defined in core_module.cc, which owns the interrupt state.
#pragma once

#include <utility>

#include "shardkeep/status.h"

namespace shardkeep::binding {

// REQUIRES: the GIL.
[[noreturn]] void Raise(const Status& status);

template <typename T>
T ValueOrRaise(Result<T> result) {
  if (!result.ok()) Raise(result.status());
  return std::move(result).value();
}

}  // namespace shardkeep::binding
