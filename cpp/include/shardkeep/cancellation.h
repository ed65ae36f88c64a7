// Cooperative cancellation of engine work (a save's writes, a load's reads).
//
// Whoever may cancel holds a CancellationToken; the work runs inside a
// CancellationScope of the same token and checks it between units of work
// (a chunk written, a range read), returning Cancelled once it is set. A
// unit already under way finishes first, so a cancelled call still returns
// only when no thread of it touches the caller's memory or files any more.
#pragma once

#include <atomic>
#include <memory>

namespace shardkeep {

// Copies share one flag. Thread-safe.
class CancellationToken {
 public:
  CancellationToken() : flag_(std::make_shared<std::atomic<bool>>(false)) {}
  void Cancel() const { flag_->store(true, std::memory_order_relaxed); }
  bool cancelled() const { return flag_->load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<std::atomic<bool>> flag_;
};

// Makes `token` the one that engine work started on this thread obeys,
// until the scope ends (scopes nest; the engine passes the token on to the
// helper threads it starts). Without a scope, work cannot be cancelled.
class CancellationScope {
 public:
  explicit CancellationScope(CancellationToken token);
  ~CancellationScope();
  CancellationScope(const CancellationScope&) = delete;
  CancellationScope& operator=(const CancellationScope&) = delete;

  // The token of the innermost scope on this thread, or a token nobody can
  // cancel.
  static CancellationToken Current();

 private:
  CancellationToken token_;
  CancellationScope* const outer_;
};

}  // namespace shardkeep
