#include "storage/process_faults.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <chrono>
#include <mutex>
#include <random>
#include <regex>
#include <thread>

#include "storage/fault_injection.h"

namespace shardkeep {
namespace {

struct ArmedRule {
  FaultRule rule;
  std::regex path;
  int64_t matched = 0;
};

struct Plan {
  std::mutex mu;
  std::vector<ArmedRule> rules;
  std::map<std::string, int64_t> counts;
};

Plan& ThePlan() {
  static Plan* plan = new Plan();  // never destroyed: hooks may run at exit
  return *plan;
}

std::atomic<bool> ever_armed{false};

[[noreturn]] void KillNow(const std::string& why) {
  const std::string line = "shardkeep fault plan: SIGKILL " + why + "\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
  ::kill(::getpid(), SIGKILL);
  std::abort();  // not reached: SIGKILL cannot be caught
}

// Counts the call and returns the action of the first rule that acts on it.
std::optional<FaultRule> Decide(std::string_view op, const std::string& path) {
  Plan& plan = ThePlan();
  std::lock_guard<std::mutex> lock(plan.mu);
  ++plan.counts[std::string(op)];
  for (ArmedRule& armed : plan.rules) {
    const FaultRule& rule = armed.rule;
    if (rule.op != "*" && rule.op != op) continue;
    if (!rule.path_regex.empty() && !std::regex_search(path, armed.path)) continue;
    const int64_t n = ++armed.matched;
    if (n >= rule.nth && (rule.times < 0 || n < rule.nth + rule.times)) return rule;
  }
  return std::nullopt;
}

Status Act(std::string_view op, const std::string& path) {
  const std::optional<FaultRule> rule = Decide(op, path);
  if (!rule) return Status::Ok();
  const std::string call = std::string(op) + " " + path;
  switch (rule->action) {
    case FaultRule::Action::kFail:
      return StorageError("injected failure of " + call);
    case FaultRule::Action::kKill:
      KillNow("before " + call);
    case FaultRule::Action::kKillDuring: {
      std::random_device seed;
      const int64_t delay = std::uniform_int_distribution<int64_t>(
          0, std::max<int64_t>(rule->max_delay_us, 0))(seed);
      std::thread([call, delay] {
        std::this_thread::sleep_for(std::chrono::microseconds(delay));
        KillNow("during " + call + " (after " + std::to_string(delay) + " us)");
      }).detach();
      return Status::Ok();
    }
  }
  return Status::Ok();
}

}  // namespace

Status ArmProcessFaults(std::vector<FaultRule> rules) {
  std::vector<ArmedRule> armed;
  for (FaultRule& rule : rules) {
    std::regex path;
    try {
      path = std::regex(rule.path_regex, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return InvalidArgumentError("fault rule path regex '" + rule.path_regex +
                                  "': " + e.what());
    }
    armed.push_back({std::move(rule), std::move(path), 0});
  }
  Plan& plan = ThePlan();
  std::lock_guard<std::mutex> lock(plan.mu);
  plan.rules = std::move(armed);
  plan.counts.clear();
  ever_armed.store(true);
  return Status::Ok();
}

void DisarmProcessFaults() {
  Plan& plan = ThePlan();
  std::lock_guard<std::mutex> lock(plan.mu);
  plan.rules.clear();
}

std::map<std::string, int64_t> ProcessFaultCounts() {
  Plan& plan = ThePlan();
  std::lock_guard<std::mutex> lock(plan.mu);
  return plan.counts;
}

std::shared_ptr<Storage> WithProcessFaults(std::shared_ptr<Storage> storage) {
  if (!ever_armed.load(std::memory_order_relaxed)) return storage;
  auto wrapped = std::make_shared<FaultInjectionStorage>(std::move(storage));
  wrapped->FailOn(Act);
  return wrapped;
}

}  // namespace shardkeep
