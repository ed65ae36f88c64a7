// The process's saves, from the call that asks for one to its end: see the
// lifecycle described atop save_queue.cc.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "shardkeep/checkpoint.h"
#include "shardkeep/status.h"

namespace shardkeep::internal {

class SaveQueue;

// One save owned by a SaveQueue. Thread-safe.
class QueuedSave {
 public:
  // Runs the blocking phase the core does (StartSave) and returns the
  // started save, or the error that stopped it.
  using Start = std::function<Result<std::unique_ptr<SaveHandle>>()>;
  // What a save's end tells its on_finished.
  struct End {
    Status outcome;
    // The created_ns of the checkpoint it committed (SaveHandle::created_ns)
    // when `outcome` is ok, else 0: the commit's bookkeeping needs it
    // before CommittedCreatedNs can answer (the outcome is not yet public).
    int64_t created_ns = 0;
  };
  // Runs at the save's end (before Wait sees it). Returns true when it has
  // reported a failure itself (its owner raises it later), so that the
  // queue does not log it as uncollected.
  using OnFinished = std::function<bool(const End&)>;

  QueuedSave(std::string path, double timeout_s, Start start,
             OnFinished on_finished);
  QueuedSave(const QueuedSave&) = delete;
  QueuedSave& operator=(const QueuedSave&) = delete;

  const std::string& path() const { return path_; }
  double timeout_s() const { return timeout_s_; }

  // The outcome once the save has ended (its on_finished has run), or
  // nullopt if it has not within `timeout_s` seconds (negative: no limit).
  std::optional<Status> Wait(double timeout_s) const;
  bool Done() const;
  // The created_ns of the checkpoint it committed (SaveHandle::created_ns)
  // once it has ended committed; nullopt before, or if it failed.
  std::optional<int64_t> CommittedCreatedNs() const;

  // The caller has seen the outcome (or will: an interrupted wait), so a
  // failure is not logged.
  void MarkCollected();
  // Brackets a wait that reports the outcome: a save ending meanwhile is
  // not logged. StopAwaiting returns whether it has ended, so that a wait
  // timing out as it ends reports it rather than dropping it.
  void StartAwaiting();
  bool StopAwaiting();

  // Stops the save from committing, as an interrupted wait does. Ok: it
  // will not commit (not started yet: it never starts). AlreadyExists: its
  // commit was under way; Wait's outcome says whether it succeeded. Other
  // errors: whether it commits cannot be known. Idempotent.
  Status Cancel();
  bool interrupted() const;

 private:
  friend class SaveQueue;

  // Close: the thread is neither joined nor freed, nor is what
  // on_finished's captures keep alive (the memory the save reads).
  void LeaveToProcessEnd();

  const std::string path_;
  const double timeout_s_;
  mutable std::mutex mu_;
  mutable std::condition_variable ended_cv_;
  Start start_;                        // dropped once run
  OnFinished on_finished_;  // dropped once run
  SaveQueue* queue_ = nullptr;  // told when a cancel changes what exit waits for
  std::shared_ptr<SaveHandle> handle_;  // shared with a Cancel under way
  int64_t created_ns_ = 0;              // handle_->created_ns(), kept past its end
  bool started_ = false;  // the start has run (handle_ set, or it failed)
  bool cancel_requested_ = false;
  bool collected_ = false;
  int awaiting_ = 0;
  std::optional<Status> result_;   // why the start failed
  std::optional<Status> outcome_;  // set once the save has ended
};

class SaveQueue {
 public:
  struct Hooks {
    // A save ended with a failure nobody collected, or a cancel came too
    // late (`failure` says which). Called on the queue's thread.
    std::function<void(const std::string& path, const std::string& failure)> log_failure;
    // How much lower the starter thread runs (Linux only; 0: the creator's
    // priority). The save threads it starts, and their writers, inherit it.
    int background_nice = 0;
  };

  explicit SaveQueue(Hooks hooks);
  // Waits for every save to end (Close first to leave them instead).
  ~SaveQueue();
  SaveQueue(const SaveQueue&) = delete;
  SaveQueue& operator=(const SaveQueue&) = delete;

  // Takes a save: `start` runs on the starter thread after the starts
  // enqueued before it; `on_finished` (may be empty) runs on the finisher
  // thread at its end, whatever the outcome, which it is given. The ends
  // of all saves run on that one thread, in the order the saves end: work
  // done in an on_finished (a manager's bookkeeping and deletions) delays
  // the ends after it.
  std::shared_ptr<QueuedSave> Enqueue(std::string path, double timeout_s,
                                      QueuedSave::Start start,
                                      QueuedSave::OnFinished on_finished);

  // Saves that have not ended yet (interrupted ones winding down too).
  std::vector<std::shared_ptr<QueuedSave>> Running() const;
  // Waits until no uninterrupted save is running, at most `timeout_s`
  // seconds; true if none is.
  bool WaitForUninterrupted(double timeout_s) const;

  // At exit: the saves still running are left to the end of the process
  // (their threads are not joined, their on_finished never runs, the
  // memory they read is not freed); the queue's threads stop, no hook or
  // callback starts after this returns, and saves enqueued later fail.
  // Returns the saves left. A closed queue is never destroyed: a start or
  // on_finished under way may still be using it.
  std::vector<std::shared_ptr<QueuedSave>> Close();

  // The kernel's id of the starter thread (0 before the first save).
  int64_t starter_thread_id() const;

 private:
  friend class QueuedSave;
  void Changed();  // wakes WaitForUninterrupted
  bool Closed() const;
  void RunStarts();
  void RunEnds();
  void Ended(const std::shared_ptr<QueuedSave>& save);  // to the finisher

  const Hooks hooks_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // starts_, ends_, running_ or closed_ changed
  std::deque<std::shared_ptr<QueuedSave>> starts_;
  std::deque<std::shared_ptr<QueuedSave>> ends_;
  std::vector<std::shared_ptr<QueuedSave>> running_;
  bool closed_ = false;
  int64_t starter_tid_ = 0;
  std::thread starter_;
  std::thread finisher_;
};

}  // namespace shardkeep::internal
