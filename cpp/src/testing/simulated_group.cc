#include "testing/simulated_group.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "core/seconds_text.h"

namespace shardkeep {
namespace {

using Clock = std::chrono::steady_clock;

// Far enough to mean "never" without overflowing the clock.
constexpr double kMaxTimeoutS = 365.0 * 24 * 3600;

Clock::time_point Deadline(double timeout_s) {
  const double clamped = std::clamp(timeout_s, 0.0, kMaxTimeoutS);
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(clamped));
}

std::string ProcessName(int i) { return "process " + std::to_string(i); }

}  // namespace

// One mutex guards everything; each barrier and each awaited key has a
// condition variable of its own, so an arrival or a set wakes only the
// members waiting for it. With n members a barrier or a key costs O(n)
// wake-ups in all, not O(n) per event.
class SimulatedGroup::State {
 public:
  explicit State(int process_count)
      : process_count_(process_count), dead_(process_count, false) {}

  int process_count() const { return process_count_; }

  void Kill(int i) {
    std::lock_guard<std::mutex> lock(mu_);
    dead_[i] = true;
    for (auto& [key, barrier] : barriers_) {
      if (barrier.outcome == Outcome::kPending && barrier.arrived[i]) {
        barrier.arrived[i] = false;
        --barrier.arrived_count;
      }
      barrier.changed.notify_all();
    }
    for (auto& [key, waiters] : key_waiters_) waiters.changed.notify_all();
  }

  Status Barrier(int i, const std::string& key, double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    if (dead_[i]) return Dead(i);
    // Constructed in place: a condition variable cannot move, and map
    // entries are never erased, so `barrier` stays valid while waiting.
    BarrierState& barrier =
        barriers_.try_emplace(key, process_count_).first->second;
    switch (barrier.outcome) {
      case Outcome::kPending:
        break;
      case Outcome::kCompleted:
        return InvalidArgumentError("barrier '" + key +
                                    "' has already completed; barrier keys "
                                    "must be unique per operation");
      case Outcome::kFailed:
        return barrier.failure;
    }
    if (barrier.arrived[i]) {
      return InvalidArgumentError(ProcessName(i) + " arrived twice at barrier '" +
                                  key + "'");
    }
    barrier.arrived[i] = true;
    if (++barrier.arrived_count == process_count_) {
      barrier.outcome = Outcome::kCompleted;
      barrier.changed.notify_all();
      return Status::Ok();
    }
    const bool decided = barrier.changed.wait_until(lock, Deadline(timeout_s), [&] {
      return dead_[i] || barrier.outcome != Outcome::kPending;
    });
    if (dead_[i]) return Dead(i);
    if (!decided) {
      barrier.outcome = Outcome::kFailed;
      barrier.failure = TimeoutError("barrier '" + key + "' timed out after " +
                                     SecondsText(timeout_s) + "; " +
                                     Missing(barrier) + " did not arrive");
      barrier.changed.notify_all();
    }
    return barrier.outcome == Outcome::kCompleted ? Status::Ok() : barrier.failure;
  }

  Status KeyValueSet(int i, const std::string& key, const std::string& value) {
    std::lock_guard<std::mutex> lock(mu_);
    if (dead_[i]) return Dead(i);
    if (!values_.try_emplace(key, value).second) {
      return AlreadyExistsError("key '" + key + "' is already set");
    }
    const auto waiters = key_waiters_.find(key);
    if (waiters != key_waiters_.end()) waiters->second.changed.notify_all();
    return Status::Ok();
  }

  Result<std::string> KeyValueGet(int i, const std::string& key,
                                  double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    if (dead_[i]) return Dead(i);
    if (values_.count(key) == 0) {
      const auto entry = key_waiters_.try_emplace(key).first;
      ++entry->second.count;
      entry->second.changed.wait_until(lock, Deadline(timeout_s), [&] {
        return dead_[i] || values_.count(key) > 0;
      });
      // The last waiter removes the entry, so waited-for keys do not pile up.
      if (--entry->second.count == 0) key_waiters_.erase(entry);
    }
    if (dead_[i]) return Dead(i);
    const auto it = values_.find(key);
    if (it == values_.end()) {
      return TimeoutError("key '" + key + "' was not set within " +
                          SecondsText(timeout_s));
    }
    return it->second;
  }

  Result<std::optional<std::string>> KeyValueTryGet(int i,
                                                    const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    if (dead_[i]) return Dead(i);
    const auto it = values_.find(key);
    if (it == values_.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }

  Result<std::vector<std::string>> KeyValueList(int i, const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu_);
    if (dead_[i]) return Dead(i);
    std::vector<std::string> keys;
    for (auto it = values_.lower_bound(prefix);
         it != values_.end() && it->first.starts_with(prefix); ++it) {
      keys.push_back(it->first);
    }
    return keys;
  }

  Status KeyValueDelete(int i, const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    if (dead_[i]) return Dead(i);
    values_.erase(key);
    return Status::Ok();
  }

  // The number of keys set now (tests check that protocols clean up).
  size_t KeyCount() {
    std::lock_guard<std::mutex> lock(mu_);
    return values_.size();
  }

 private:
  enum class Outcome { kPending, kCompleted, kFailed };

  struct BarrierState {
    explicit BarrierState(int process_count) : arrived(process_count, false) {}
    std::vector<bool> arrived;
    int arrived_count = 0;
    Outcome outcome = Outcome::kPending;
    Status failure;  // when kFailed
    std::condition_variable changed;  // outcome or a waiter's death
  };

  // The members blocked in KeyValueGet for one key.
  struct KeyWaiters {
    int count = 0;
    std::condition_variable changed;  // key set or a waiter's death
  };

  static Status Dead(int i) {
    return CancelledError(ProcessName(i) + " was killed");
  }

  // "process 3" or "processes 2, 3". REQUIRES: mu_ held.
  std::string Missing(const BarrierState& barrier) const {
    std::string list;
    int missing = 0;
    for (int p = 0; p < process_count_; ++p) {
      if (barrier.arrived[p]) continue;
      list += (missing++ ? ", " : "") + std::to_string(p);
    }
    return (missing == 1 ? "process " : "processes ") + list;
  }

  const int process_count_;
  std::mutex mu_;
  std::vector<bool> dead_;
  std::map<std::string, BarrierState> barriers_;
  std::map<std::string, KeyWaiters> key_waiters_;
  std::map<std::string, std::string> values_;
};

namespace {

class GroupMember final : public Coordinator {
 public:
  GroupMember(std::shared_ptr<SimulatedGroup::State> state, int index)
      : state_(std::move(state)), index_(index) {}

  int process_index() const override { return index_; }
  int process_count() const override { return state_->process_count(); }
  Status Barrier(const std::string& key, double timeout_s) override {
    return state_->Barrier(index_, key, timeout_s);
  }
  Status KeyValueSet(const std::string& key, const std::string& value) override {
    return state_->KeyValueSet(index_, key, value);
  }
  Result<std::string> KeyValueGet(const std::string& key,
                                  double timeout_s) override {
    return state_->KeyValueGet(index_, key, timeout_s);
  }
  Result<std::optional<std::string>> KeyValueTryGet(
      const std::string& key) override {
    return state_->KeyValueTryGet(index_, key);
  }
  Result<std::vector<std::string>> KeyValueList(const std::string& prefix) override {
    return state_->KeyValueList(index_, prefix);
  }
  Status KeyValueDelete(const std::string& key) override {
    return state_->KeyValueDelete(index_, key);
  }

 private:
  const std::shared_ptr<SimulatedGroup::State> state_;
  const int index_;
};

}  // namespace

SimulatedGroup::SimulatedGroup(int process_count)
    : state_(std::make_shared<State>(process_count)) {
  for (int i = 0; i < process_count; ++i) {
    members_.push_back(std::make_shared<GroupMember>(state_, i));
  }
}

SimulatedGroup::~SimulatedGroup() = default;

int SimulatedGroup::process_count() const { return state_->process_count(); }

std::shared_ptr<Coordinator> SimulatedGroup::Member(int i) const {
  return members_.at(i);
}

void SimulatedGroup::Kill(int i) { state_->Kill(i); }

size_t SimulatedGroup::KeyCount() const { return state_->KeyCount(); }

}  // namespace shardkeep
