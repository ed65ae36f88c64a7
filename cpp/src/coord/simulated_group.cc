#include "coord/simulated_group.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

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

// "0.5 s", "600 s": as a person would write the timeout.
std::string Seconds(double timeout_s) {
  std::ostringstream out;
  out << timeout_s << " s";
  return out.str();
}

std::string ProcessName(int i) { return "process " + std::to_string(i); }

}  // namespace

class SimulatedGroup::State {
 public:
  explicit State(int process_count)
      : process_count_(process_count), dead_(process_count, false) {}

  int process_count() const { return process_count_; }

  void Kill(int i) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      dead_[i] = true;
      for (auto& [key, barrier] : barriers_) {
        if (barrier.outcome == Outcome::kPending) barrier.arrived[i] = false;
      }
    }
    changed_.notify_all();
  }

  Status Barrier(int i, const std::string& key, double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    if (dead_[i]) return Dead(i);
    auto [it, inserted] = barriers_.try_emplace(key, process_count_);
    BarrierState& barrier = it->second;
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
    if (std::count(barrier.arrived.begin(), barrier.arrived.end(), true) ==
        process_count_) {
      barrier.outcome = Outcome::kCompleted;
      changed_.notify_all();
      return Status::Ok();
    }
    // `barrier` stays valid while waiting: map entries are never erased.
    const bool decided = changed_.wait_until(lock, Deadline(timeout_s), [&] {
      return dead_[i] || barrier.outcome != Outcome::kPending;
    });
    if (dead_[i]) return Dead(i);
    if (!decided) {
      barrier.outcome = Outcome::kFailed;
      barrier.failure = TimeoutError("barrier '" + key + "' timed out after " +
                                     Seconds(timeout_s) + "; " +
                                     Missing(barrier) + " did not arrive");
      changed_.notify_all();
    }
    return barrier.outcome == Outcome::kCompleted ? Status::Ok() : barrier.failure;
  }

  Status KeyValueSet(int i, const std::string& key, const std::string& value) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (dead_[i]) return Dead(i);
      if (!values_.try_emplace(key, value).second) {
        return AlreadyExistsError("key '" + key + "' is already set");
      }
    }
    changed_.notify_all();
    return Status::Ok();
  }

  Result<std::string> KeyValueGet(int i, const std::string& key,
                                  double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    const bool decided = changed_.wait_until(lock, Deadline(timeout_s), [&] {
      return dead_[i] || values_.count(key) > 0;
    });
    if (dead_[i]) return Dead(i);
    if (!decided) {
      return TimeoutError("key '" + key + "' was not set within " +
                          Seconds(timeout_s));
    }
    return values_.at(key);
  }

  Result<std::optional<std::string>> KeyValueTryGet(int i,
                                                    const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    if (dead_[i]) return Dead(i);
    const auto it = values_.find(key);
    if (it == values_.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }

 private:
  enum class Outcome { kPending, kCompleted, kFailed };

  struct BarrierState {
    explicit BarrierState(int process_count) : arrived(process_count, false) {}
    std::vector<bool> arrived;
    Outcome outcome = Outcome::kPending;
    Status failure;  // when kFailed
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
  std::condition_variable changed_;  // any barrier, key or death changed
  std::vector<bool> dead_;
  std::map<std::string, BarrierState> barriers_;
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

}  // namespace shardkeep
