// Running independent pieces of work on a few threads.
#pragma once

#include <cstddef>
#include <functional>

#include "shardkeep/status.h"

namespace shardkeep::internal {

// Calls work(i) for every i in [0, count) on at most `threads` threads
// (the calling thread is one of them) and joins them all before returning.
// Items are handed out in order. After the first error no new item starts;
// that error is returned.
Status ParallelFor(size_t count, int threads,
                   const std::function<Status(size_t)>& work);

}  // namespace shardkeep::internal
