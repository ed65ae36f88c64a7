// A one-shot, thread-safe result slot for the background phase of a save.
// The producer calls Set() exactly once; any number of consumers may wait.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "shardkeep/status.h"

namespace shardkeep {

class Future {
 public:
  Future() : state_(std::make_shared<State>()) {}

  // Resolves the future and runs the OnReady callbacks on this thread.
  // Later calls are ignored (the first outcome wins).
  void Set(Status status) const {
    std::vector<std::function<void()>> callbacks;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->status) return;
      state_->status = std::move(status);
      callbacks.swap(state_->callbacks);
    }
    state_->cv.notify_all();
    for (auto& callback : callbacks) callback();
  }
  // Runs `callback` once the future is resolved: on the thread that
  // resolves it, or at once on this one if it already is. Lets an owner of
  // many futures learn of each end without a thread waiting on each.
  void OnReady(std::function<void()> callback) const {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (!state_->status) {
        state_->callbacks.push_back(std::move(callback));
        return;
      }
    }
    callback();
  }
  bool Ready() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->status.has_value();
  }
  // Waits at most `timeout_s` seconds (negative: forever). Returns nullopt on
  // timeout, the outcome otherwise.
  std::optional<Status> Wait(double timeout_s) const {
    std::unique_lock<std::mutex> lock(state_->mu);
    auto ready = [&] { return state_->status.has_value(); };
    if (timeout_s < 0) {
      state_->cv.wait(lock, ready);
    } else if (!state_->cv.wait_for(
                   lock, std::chrono::duration<double>(timeout_s), ready)) {
      return std::nullopt;
    }
    return *state_->status;
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Status> status;
    std::vector<std::function<void()>> callbacks;  // run (and dropped) by Set
  };
  std::shared_ptr<State> state_;
};

}  // namespace shardkeep
