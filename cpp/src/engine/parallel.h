// Running independent pieces of work on a few threads.
#pragma once

#include <cstddef>
#include <functional>
#include <string_view>

#include "shardkeep/status.h"

namespace shardkeep::internal {

// Calls work(i) for every i in [0, count) on at most `threads` threads
// (the calling thread is one of them) and joins them all before returning.
// Items are handed out in order. After the first error no new item starts;
// that error is returned. An exception thrown by work(i) becomes that
// item's error (ResourceExhausted for std::bad_alloc, Internal otherwise),
// naming `what` and i. Once the CancellationScope token of the calling
// thread is cancelled no new item starts and Cancelled is returned; the
// helper threads run in that scope too. Helper threads come from a pool
// kept between calls (a thread idle for half a minute leaves it), so that
// a small save or load does not pay for starting threads; a helper starts
// at once, never behind other calls' work, so calls may nest. If threads
// cannot be started, the calling thread does all the work.
Status ParallelFor(size_t count, int threads,
                   const std::function<Status(size_t)>& work,
                   std::string_view what = "work item");

// Runs `job` at once on a thread of the same pool (of the caller's
// priority), never behind other work. False when no thread can be started:
// the job has not run, and the caller should run it itself. Lets a caller
// wait for work on another thread (to let Python signal handlers run) without
// starting a thread per call.
bool RunOnPool(std::function<void()> job);

// How many threads of that pool wait for a job now (they exit after 30 s
// without one). Lets a test wait for a thread to be idle again.
size_t IdlePoolThreads();

}  // namespace shardkeep::internal
