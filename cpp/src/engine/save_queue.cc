// A save's lifecycle, owned by one SaveQueue per process (the Python front
// keeps one; its futures are thin views of QueuedSave):
//
//  1. Enqueue, on the caller's thread, after the front has staged the
//     shards (the only work training waits for). The save is now owned by
//     the queue, whether or not the caller keeps its future.
//  2. Start, on the queue's starter thread, in call order: the core's part
//     of the blocking phase (StartSave: handing the shards over, preparing
//     the temporary folder, in a job the first barrier). A save cancelled
//     before its turn never starts; one cancelled while its start ran is
//     cancelled as soon as the start returns. The starter runs at a lower
//     CPU priority, which the save's own thread and writers inherit.
//  3. The background phase, on the save's own thread (save.cc). Its future
//     tells the queue of its end (Future::OnReady): nothing polls.
//  4. End, on the queue's finisher thread: the save's thread is joined,
//     on_finished runs with the outcome and the committed created_ns (it
//     returns the staging memory, reports the end, and for a manager's
//     save records the commit and applies retention), and the outcome is
//     published; only then do Wait and Done see it. A failure nobody
//     collected — no wait was under way or reported it, on_finished did
//     not report it, and the save was not cancelled by an interrupted
//     wait — goes to Hooks::log_failure.
//  5. Exit: the front waits (WaitForUninterrupted) at most the longest
//     timeout_s of the uninterrupted saves still running, letting signals
//     in, then Close leaves whatever still runs to the end of the process.
//     Saves cancelled by an interrupted wait cannot commit, so exit does
//     not wait for them.
//
// Waiting so that Python signal handlers run (Ctrl-C) is the front's
// concern: it waits in slices (the binding's WaitLettingSignalsIn).
#include "engine/save_queue.h"

#include <exception>
#include <utility>

#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#endif

namespace shardkeep::internal {
namespace {

// Lowers the calling thread's CPU priority by `nice` (Linux, where threads
// have their own; elsewhere setpriority would change the whole process).
// Where training and writing compete for cores, the training step right
// after a save is slowed less and the background writes take longer.
int64_t LowerPriorityOfThisThread(int nice) {
#if defined(__linux__)
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  if (nice != 0) {
    errno = 0;
    const int current = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
    // A sandbox may forbid it: the thread then keeps its priority.
    if (errno == 0) (void)setpriority(PRIO_PROCESS, static_cast<id_t>(tid), current + nice);
  }
  return tid;
#else
  (void)nice;
  return 0;
#endif
}

Result<std::unique_ptr<SaveHandle>> RunStart(const QueuedSave::Start& start) {
  try {
    return start();
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("out of memory while starting the save");
  } catch (const std::exception& e) {
    return InternalError(std::string("starting the save threw an exception: ") + e.what());
  }
}

}  // namespace

QueuedSave::QueuedSave(std::string path, double timeout_s, Start start,
                       OnFinished on_finished)
    : path_(std::move(path)),
      timeout_s_(timeout_s),
      start_(std::move(start)),
      on_finished_(std::move(on_finished)) {}

std::optional<Status> QueuedSave::Wait(double timeout_s) const {
  std::unique_lock<std::mutex> lock(mu_);
  auto ended = [&] { return outcome_.has_value(); };
  if (timeout_s < 0) {
    ended_cv_.wait(lock, ended);
  } else if (!ended_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), ended)) {
    return std::nullopt;
  }
  return *outcome_;
}

bool QueuedSave::Done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outcome_.has_value();
}

std::optional<int64_t> QueuedSave::CommittedCreatedNs() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!outcome_ || !outcome_->ok()) return std::nullopt;  // only a started save commits
  return created_ns_;
}

void QueuedSave::StartAwaiting() {
  std::lock_guard<std::mutex> lock(mu_);
  ++awaiting_;
}

bool QueuedSave::StopAwaiting() {
  std::lock_guard<std::mutex> lock(mu_);
  --awaiting_;
  return outcome_.has_value();
}

void QueuedSave::MarkCollected() {
  std::lock_guard<std::mutex> lock(mu_);
  collected_ = true;
}

bool QueuedSave::interrupted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancel_requested_;
}

Status QueuedSave::Cancel() {
  std::shared_ptr<SaveHandle> handle;
  bool started;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_requested_ = true;
    started = started_;
    handle = handle_;
  }
  if (queue_ != nullptr) queue_->Changed();
  // Not started: the starter skips it, or cancels it once its start
  // returns.
  if (!started) return Status::Ok();
  if (handle) return handle->Cancel();
  // Its start failed, or it has ended: nothing left to stop.
  const Status outcome = *Wait(-1);
  return outcome.ok() ? AlreadyExistsError("the save to " + path_ + " had committed")
                      : Status::Ok();
}

void QueuedSave::LeaveToProcessEnd() {
  std::lock_guard<std::mutex> lock(mu_);
  // Neither joined nor freed: the thread may still run, and on_finished's
  // captures keep alive the memory it reads.
  if (handle_) (void)new std::shared_ptr<SaveHandle>(std::move(handle_));
  if (on_finished_) (void)new OnFinished(std::move(on_finished_));
  if (start_) (void)new Start(std::move(start_));
}

SaveQueue::SaveQueue(Hooks hooks) : hooks_(std::move(hooks)) {}

SaveQueue::~SaveQueue() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!closed_) {
    cv_.wait(lock, [&] { return running_.empty(); });
    closed_ = true;
  }
  cv_.notify_all();
  lock.unlock();
  if (starter_.joinable()) starter_.join();
  if (finisher_.joinable()) finisher_.join();
}

std::shared_ptr<QueuedSave> SaveQueue::Enqueue(std::string path, double timeout_s,
                                               QueuedSave::Start start,
                                               QueuedSave::OnFinished on_finished) {
  auto save = std::make_shared<QueuedSave>(std::move(path), timeout_s, std::move(start),
                                           std::move(on_finished));
  save->queue_ = this;
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) {
    save->started_ = true;
    save->start_ = nullptr;
    save->outcome_ = CancelledError("the save to " + save->path() +
                                             " was asked for after the process's saves"
                                             " were closed (interpreter exit)");
    save->collected_ = true;
    return save;
  }
  // Started with the first save and kept: a thread per save would cost
  // the blocking phase its start-up.
  if (!starter_.joinable()) starter_ = std::thread([this] { RunStarts(); });
  if (!finisher_.joinable()) finisher_ = std::thread([this] { RunEnds(); });
  running_.push_back(save);
  starts_.push_back(save);
  cv_.notify_all();
  return save;
}

bool SaveQueue::Closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

void SaveQueue::Changed() {
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

void SaveQueue::RunStarts() {
  const int64_t tid = LowerPriorityOfThisThread(hooks_.background_nice);
  {
    std::lock_guard<std::mutex> lock(mu_);
    starter_tid_ = tid;
  }
  while (true) {
    std::shared_ptr<QueuedSave> save;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return closed_ || !starts_.empty(); });
      if (closed_) return;
      save = std::move(starts_.front());
      starts_.pop_front();
    }
    QueuedSave::Start start;
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock(save->mu_);
      start = std::move(save->start_);
      save->start_ = nullptr;
      cancelled = save->cancel_requested_;
    }
    Result<std::unique_ptr<SaveHandle>> started =
        cancelled ? Result<std::unique_ptr<SaveHandle>>(CancelledError(
                        "save to '" + save->path() + "' cancelled before it started"))
                  : RunStart(start);
    start = nullptr;  // its captures, the staged shards' owners among them
    if (!started.ok()) {
      {
        std::lock_guard<std::mutex> lock(save->mu_);
        save->started_ = true;
        save->result_ = started.status();
      }
      Ended(save);
      continue;
    }
    const Future future = (*started)->future();
    bool cancel;
    std::shared_ptr<SaveHandle> handle = std::move(*started);
    {
      std::lock_guard<std::mutex> lock(save->mu_);
      save->handle_ = handle;
      save->created_ns_ = handle->created_ns();
      save->started_ = true;
      cancel = save->cancel_requested_;
    }
    if (cancel) {
      // An interrupted wait asked while the start ran: it must not commit.
      Status cancelled_now = handle->Cancel();
      if (!cancelled_now.ok() && hooks_.log_failure) {
        hooks_.log_failure(save->path(),
                           "it could not be cancelled: its commit was under way (it may have"
                           " committed): " + cancelled_now.ToString());
      }
    }
    std::weak_ptr<QueuedSave> weak = save;
    handle.reset();
    future.OnReady([this, weak] {
      if (std::shared_ptr<QueuedSave> ended = weak.lock()) Ended(ended);
    });
  }
}

void SaveQueue::Ended(const std::shared_ptr<QueuedSave>& save) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  ends_.push_back(save);
  cv_.notify_all();
}

void SaveQueue::RunEnds() {
  while (true) {
    std::shared_ptr<QueuedSave> save;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return closed_ || !ends_.empty(); });
      if (closed_) return;
      save = std::move(ends_.front());
      ends_.pop_front();
    }
    QueuedSave::OnFinished on_finished;
    std::shared_ptr<SaveHandle> handle;
    {
      std::lock_guard<std::mutex> lock(save->mu_);
      on_finished = std::move(save->on_finished_);
      save->on_finished_ = nullptr;
      handle = std::move(save->handle_);
    }
    QueuedSave::End end{handle ? *handle->future().Wait(-1) : *save->result_, 0};
    if (end.outcome.ok()) end.created_ns = handle->created_ns();
    handle.reset();  // joins the save's thread (or a Cancel under way does)
    bool reported = false;
    if (on_finished) {
      try {
        reported = on_finished(end);
      } catch (const std::exception&) {
        // The front's callbacks report their own errors.
      }
      on_finished = nullptr;
    }
    const Status& outcome = end.outcome;
    bool report;
    {
      std::lock_guard<std::mutex> lock(save->mu_);
      save->outcome_ = outcome;
      // A wait under way sees the outcome (or, timing out at this moment,
      // StopAwaiting tells it that the save ended) and collects it.
      report = !outcome.ok() && !reported && !save->collected_ &&
               !save->cancel_requested_ && save->awaiting_ == 0;
    }
    save->ended_cv_.notify_all();
    if (report && hooks_.log_failure && !Closed()) {
      hooks_.log_failure(save->path(), outcome.message());
    }
    {
      // Logged first, so that whoever sees it gone from Running sees the log.
      std::lock_guard<std::mutex> lock(mu_);
      std::erase(running_, save);
      cv_.notify_all();
    }
  }
}

std::vector<std::shared_ptr<QueuedSave>> SaveQueue::Running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

bool SaveQueue::WaitForUninterrupted(double timeout_s) const {
  std::unique_lock<std::mutex> lock(mu_);
  auto idle = [&] {
    for (const auto& save : running_) {
      if (!save->interrupted()) return false;
    }
    return true;
  };
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), idle);
}

std::vector<std::shared_ptr<QueuedSave>> SaveQueue::Close() {
  std::vector<std::shared_ptr<QueuedSave>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    left = running_;
    cv_.notify_all();
  }
  for (const auto& save : left) save->LeaveToProcessEnd();
  // Not joined: either may be inside a start or an on_finished that waits
  // for the interpreter; an idle one returns at once.
  if (starter_.joinable()) starter_.detach();
  if (finisher_.joinable()) finisher_.detach();
  return left;
}

int64_t SaveQueue::starter_thread_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return starter_tid_;
}

}  // namespace shardkeep::internal
