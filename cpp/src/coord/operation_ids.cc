// The agreement of operation ids (the steps are in operation_ids.h).
#include "shardkeep/operation_ids.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <optional>
#include <sstream>
#include <vector>

#include "core/decimal.h"
#include "core/seconds_text.h"
#include "shardkeep/checkpoint.h"

namespace shardkeep {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kGo[] = "go";
constexpr char kVoid[] = "void";

// "[0, 2]", as Python prints a list: the errors reach Python users.
std::string ListOf(const std::vector<int>& processes) {
  std::string text = "[";
  for (size_t i = 0; i < processes.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(processes[i]);
  }
  return text + "]";
}

// "0,2" and back: the process lists of a "void" verdict.
std::string Encode(const std::vector<int>& processes) {
  std::string text;
  for (size_t i = 0; i < processes.size(); ++i) {
    text += (i ? "," : "") + std::to_string(processes[i]);
  }
  return text;
}

std::optional<std::vector<int>> Decode(const std::string& text) {
  std::vector<int> processes;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const std::optional<int64_t> process = DecimalValue(item, std::numeric_limits<int>::max());
    if (!process) return std::nullopt;
    processes.push_back(static_cast<int>(*process));
  }
  return processes;
}

// A "void" verdict: "void <arrived>;<missing>".
struct Void {
  std::vector<int> arrived;
  std::vector<int> missing;
};

std::string VoidVerdict(const Void& verdict) {
  return std::string(kVoid) + " " + Encode(verdict.arrived) + ";" + Encode(verdict.missing);
}

Result<Void> ParseVoid(const std::string& key, const std::string& verdict) {
  const std::string head = std::string(kVoid) + " ";
  const size_t split = verdict.find(';');
  std::optional<std::vector<int>> arrived, missing;
  if (verdict.starts_with(head) && split != std::string::npos) {
    arrived = Decode(verdict.substr(head.size(), split - head.size()));
    missing = Decode(verdict.substr(split + 1));
  }
  if (!arrived || !missing) {
    return CorruptionError("the verdict of operation '" + key + "' is neither \"go\" nor " +
                           "a \"void\" this version writes: '" + verdict +
                           "'; do all processes run the same shardkeep?");
  }
  return Void{std::move(*arrived), std::move(*missing)};
}

// The subject as 16 hex digits: keys stay short whatever the subject.
std::string Hash(const std::string& subject) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(ChunkChecksum(subject.data(), subject.size())));
  return hex;
}

double Left(Clock::time_point deadline) {
  return std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count());
}

// One attempt's keys, as seen by one process.
class Attempt {
 public:
  Attempt(Coordinator& coordinator, std::string id)
      : coordinator_(coordinator), id_(std::move(id)) {}

  Result<std::optional<std::string>> Verdict() {
    return coordinator_.KeyValueTryGet(VerdictKey());
  }

  // Records this process's arrival and returns the attempt's verdict
  // (steps 2 and 3).
  Result<std::string> Join(Clock::time_point deadline) {
    const int me = coordinator_.process_index();
    Status arrived = coordinator_.KeyValueSet(ArrivalKey(me), "1");
    // Set already: this process arrived here before (its record was lost).
    if (!arrived.ok() && arrived.code() != StatusCode::kAlreadyExists) return arrived;
    Status waited;
    if (me == 0) {
      for (int q = 1; q < coordinator_.process_count() && waited.ok(); ++q) {
        waited = coordinator_.KeyValueGet(ArrivalKey(q), Left(deadline)).status();
      }
      if (waited.ok()) SK_RETURN_IF_ERROR(Decide(kGo));
    } else {
      waited = coordinator_.KeyValueGet(VerdictKey(), Left(deadline)).status();
    }
    if (waited.code() == StatusCode::kTimeout) {
      SK_ASSIGN_OR_RETURN(std::vector<int> present, Arrivals());
      Void verdict{present, {}};
      for (int p = 0; p < coordinator_.process_count(); ++p) {
        if (!std::binary_search(present.begin(), present.end(), p)) {
          verdict.missing.push_back(p);
        }
      }
      SK_RETURN_IF_ERROR(Decide(verdict.missing.empty() ? kGo : VoidVerdict(verdict)));
    } else if (!waited.ok()) {
      return waited;
    }
    SK_ASSIGN_OR_RETURN(std::optional<std::string> verdict, Verdict());
    if (!verdict) {
      return InternalError("the verdict of operation '" + id_ +
                           "' vanished from the coordination service");
    }
    return std::move(*verdict);
  }

  // After reading a "go": deletes this process's arrival, and the verdict
  // once no arrival is left. Every process arrived before a "go" and reads
  // it before deleting its arrival, so whoever finds none left knows that
  // every process has read the verdict. Best effort: a key left behind
  // costs the store memory, nothing else.
  void Leave() {
    if (!coordinator_.KeyValueDelete(ArrivalKey(coordinator_.process_index())).ok()) return;
    Result<std::vector<int>> left = Arrivals();
    if (left.ok() && left->empty()) (void)coordinator_.KeyValueDelete(VerdictKey());
  }

 private:
  std::string VerdictKey() const { return id_ + "/verdict"; }
  std::string ArrivalsFolder() const { return id_ + "/arrived/"; }
  std::string ArrivalKey(int process) const {
    return ArrivalsFolder() + std::to_string(process);
  }

  // The first verdict written holds: AlreadyExists means another process
  // decided first.
  Status Decide(const std::string& verdict) {
    Status set = coordinator_.KeyValueSet(VerdictKey(), verdict);
    return set.code() == StatusCode::kAlreadyExists ? Status::Ok() : set;
  }

  // The processes recorded as arrived, in order.
  Result<std::vector<int>> Arrivals() {
    SK_ASSIGN_OR_RETURN(std::vector<std::string> keys,
                        coordinator_.KeyValueList(ArrivalsFolder()));
    std::vector<int> processes;
    for (const std::string& key : keys) {
      // The name after the last '/': services list whole keys or names.
      const std::optional<int64_t> process = DecimalValue(
          std::string_view(key).substr(key.rfind('/') + 1), std::numeric_limits<int>::max());
      if (process) processes.push_back(static_cast<int>(*process));
    }
    std::sort(processes.begin(), processes.end());
    return processes;
  }

  Coordinator& coordinator_;
  const std::string id_;
};

}  // namespace

OperationIds::OperationIds(std::shared_ptr<Coordinator> coordinator)
    : coordinator_(std::move(coordinator)) {}

Result<std::string> OperationIds::Agree(const std::string& kind, const std::string& subject,
                                        double timeout_s) {
  if (coordinator_->process_count() == 1) return std::string();
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::clamp(timeout_s, 0.0, 1e9)));
  const std::string base = "shardkeep/op/" + kind + "/" + Hash(subject);
  auto [n, a] = Seen(base);
  while (true) {
    const std::string id = base + "/" + std::to_string(n) + "." + std::to_string(a);
    Attempt attempt(*coordinator_, id);
    SK_ASSIGN_OR_RETURN(std::optional<std::string> decided, attempt.Verdict());
    std::string verdict;
    if (decided) {
      verdict = std::move(*decided);
    } else {
      SK_ASSIGN_OR_RETURN(verdict, attempt.Join(deadline));
    }
    if (verdict == kGo) {
      Note(base, {n + 1, 0});
      attempt.Leave();
      return id;
    }
    SK_ASSIGN_OR_RETURN(Void abandoned, ParseVoid(id, verdict));
    Note(base, {n, a + 1});
    if (std::binary_search(abandoned.arrived.begin(), abandoned.arrived.end(),
                           coordinator_->process_index())) {
      return TimeoutError(
          kind + " of '" + subject + "': processes " + ListOf(abandoned.missing) +
          " did not join it within " + SecondsText(timeout_s) + " (processes " +
          ListOf(abandoned.arrived) +
          " did); every process of the job must make the same collective calls, and this " +
          kind + " was made by some processes only (later calls made by all are unaffected)");
    }
    ++a;
  }
}

OperationIds::Position OperationIds::Seen(const std::string& base) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = seen_.find(base);
  return it == seen_.end() ? Position{0, 0} : it->second;
}

void OperationIds::Note(const std::string& base, Position position) {
  std::lock_guard<std::mutex> lock(mu_);
  Position& seen = seen_[base];
  seen = std::max(seen, position);
}

}  // namespace shardkeep
