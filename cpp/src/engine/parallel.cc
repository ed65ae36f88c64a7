#include "engine/parallel.h"

#include <pthread.h>
#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "engine/catch_exceptions.h"
#include "shardkeep/cancellation.h"

namespace shardkeep::internal {
namespace {

// The calling thread's nice value (Linux has one per thread); 0 elsewhere.
int CallersNice() {
#ifdef __linux__
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  return errno == 0 ? nice : 0;
#else
  return 0;
#endif
}

// Threads kept for ParallelFor between calls, so that a save or a load
// does not pay for starting and joining its threads (a fixed cost that
// matters for small ones). A job is handed to an idle thread, or to a new
// one; never queued, so every job handed out starts at once and a caller
// that waits for its jobs waits only for work under way. A thread idle
// for kIdleExit leaves. Threads are detached and the pool is never
// destroyed: at exit, idle threads simply stop with the process.
//
// One pool per CPU priority (nice value) of the calling threads: a thread
// inherits its creator's priority and, unprivileged, cannot raise it again,
// so helpers started for a background save (which runs at a lower
// priority) must not later work for a load at normal priority, nor the
// other way round. The caller's priority picks the pool, and every thread
// of that pool was started by a caller with that priority.
class ThreadPool {
 public:
  static ThreadPool& ForCallersPriority() {
    static std::mutex* const pools_mu = new std::mutex;
    static std::map<int, ThreadPool*>* const pools = [] {
      // A forked child has none of the parent's threads.
      pthread_atfork(nullptr, nullptr, [] {
        new (pools_mu) std::mutex;  // another thread of the parent may have held it
        for (auto& [nice, pool] : *pools) pool->ForgetThreadsAfterFork();
      });
      return new std::map<int, ThreadPool*>;
    }();
    std::lock_guard<std::mutex> lock(*pools_mu);
    ThreadPool*& pool = (*pools)[CallersNice()];
    if (pool == nullptr) pool = new ThreadPool;
    return *pool;
  }

  // Runs `job` on a thread of the pool at once. False when no thread can
  // be started (the caller then does the work itself).
  bool Run(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      Worker* worker = idle_.back();
      idle_.pop_back();
      worker->job = std::move(job);
      worker->cv.notify_one();
      return true;
    }
    auto* worker = new Worker{{}, std::move(job)};
    try {
      std::thread([this, worker] { Loop(worker); }).detach();
    } catch (const std::system_error&) {
      delete worker;
      return false;
    }
    return true;
  }

  size_t IdleThreads() {
    std::lock_guard<std::mutex> lock(mu_);
    return idle_.size();
  }

 private:
  static constexpr std::chrono::seconds kIdleExit{30};

  struct Worker {
    std::condition_variable cv;
    std::function<void()> job;  // set while it has one to run
  };

  void Loop(Worker* worker) {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      std::function<void()> job = std::move(worker->job);
      worker->job = nullptr;
      lock.unlock();
      job();
      job = nullptr;  // what it holds goes before the thread is idle again
      lock.lock();
      idle_.push_back(worker);
      if (!worker->cv.wait_for(lock, kIdleExit, [&] { return worker->job != nullptr; })) {
        idle_.erase(std::find(idle_.begin(), idle_.end(), worker));
        break;
      }
    }
    lock.unlock();
    delete worker;
  }

  // In a forked child: the idle threads listed were the parent's.
  void ForgetThreadsAfterFork() {
    new (&mu_) std::mutex;  // another thread of the parent may have held it
    idle_.clear();
  }

  std::mutex mu_;
  std::vector<Worker*> idle_;  // threads waiting for a job
};

}  // namespace

bool RunOnPool(std::function<void()> job) {
  return ThreadPool::ForCallersPriority().Run(std::move(job));
}

size_t IdlePoolThreads() { return ThreadPool::ForCallersPriority().IdleThreads(); }

Status ParallelFor(size_t count, int threads,
                   const std::function<Status(size_t)>& work, std::string_view what) {
  const CancellationToken token = CancellationScope::Current();
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable helpers_done;
  size_t helpers_running = 0;
  Status first_error;
  auto fail = [&](Status status) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.ok()) first_error = std::move(status);
    failed = true;
  };
  auto run = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t i = next.fetch_add(1);
      if (i >= count) return;
      if (token.cancelled()) {
        return fail(CancelledError(std::string(what) + " " + std::to_string(i) + " of " +
                                   std::to_string(count) + " not started: cancelled"));
      }
      Status status;
      try {
        status = work(i);
      } catch (...) {
        status = StatusOfCurrentException(std::string(what) + " " + std::to_string(i));
      }
      if (!status.ok()) fail(std::move(status));
    }
  };
  const size_t helpers =
      std::min<size_t>(count, static_cast<size_t>(std::max(threads, 1))) - (count ? 1 : 0);
  for (size_t t = 0; t < helpers; ++t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++helpers_running;
    }
    const bool started = ThreadPool::ForCallersPriority().Run([&] {
      {
        CancellationScope scope(token);
        run();
      }
      std::lock_guard<std::mutex> lock(mu);
      if (--helpers_running == 0) helpers_done.notify_all();
    });
    if (!started) {
      // Out of threads: the ones started and this one share the work.
      std::lock_guard<std::mutex> lock(mu);
      --helpers_running;
      break;
    }
  }
  run();
  std::unique_lock<std::mutex> lock(mu);
  helpers_done.wait(lock, [&] { return helpers_running == 0; });
  return first_error;
}

}  // namespace shardkeep::internal
