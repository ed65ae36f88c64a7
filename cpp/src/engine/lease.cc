#include "engine/lease.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <vector>

namespace shardkeep::internal {
namespace {

int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string FirstLineOf(const char* file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

// Field 22 of /proc/<pid>/stat (the start time in clock ticks since boot);
// 0 when the process does not exist or the file cannot be read. The
// command name (field 2) may hold spaces, so fields count from its ')'.
uint64_t ProcessStartTime(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (fields >> field); ++i) {
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

std::string RandomOwner() {
  std::random_device device;
  char digits[17];
  std::snprintf(digits, sizeof(digits), "%08x%08x", device(), device());
  return digits;
}

std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f s", s);
  return text;
}

std::string HolderOf(const format::LeaseRecord& lease) {
  return "pid " + std::to_string(lease.pid) + " on host " + lease.host;
}

// The owners of the leases this process holds (LeaseHolders renewing
// them). A lease of this process's that is not among them has no holder
// any more: the save that took it ended without deleting it.
// Never destroyed: a save abandoned at interpreter exit may still stop
// its lease after static destructors have run.
std::mutex& HeldMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::set<std::string>& HeldHere() {
  static auto* owners = new std::set<std::string>;
  return *owners;
}

bool IsHeldHere(const std::string& owner) {
  std::lock_guard lock(HeldMutex());
  return HeldHere().contains(owner);
}

// Whether the lease's holder runs on the judge's machine, in its pid
// namespace, and is still running (still holding it, when that is the
// judge's own process); nullopt when that cannot be told from here
// (another machine, another namespace).
std::optional<bool> HolderRuns(const format::LeaseRecord& lease,
                               const format::LeaseRecord& judge) {
  if (lease.boot_id.empty() || lease.boot_id != judge.boot_id ||
      lease.pid_namespace.empty() || lease.pid_namespace != judge.pid_namespace ||
      lease.pid <= 0) {
    return std::nullopt;
  }
  if (lease.pid == judge.pid && lease.pid_start == judge.pid_start) {
    return IsHeldHere(lease.owner);
  }
  if (::kill(static_cast<pid_t>(lease.pid), 0) != 0 && errno == ESRCH) return false;
  // Running, unless its pid was reused by a process started later.
  const uint64_t started = ProcessStartTime(lease.pid);
  if (started == 0) return false;
  return lease.pid_start == 0 || started == lease.pid_start;
}

// The lease files in `folder`, newest first.
Result<std::vector<std::pair<uint64_t, std::string>>> LeaseFiles(Storage& storage,
                                                                 const std::string& folder) {
  std::vector<std::pair<uint64_t, std::string>> files;
  Result<std::vector<std::string>> names = storage.List(folder);
  if (names.status().code() == StatusCode::kNotFound) return files;
  SK_RETURN_IF_ERROR(names.status());
  for (const std::string& name : *names) {
    if (std::optional<uint64_t> sequence = format::LeaseSequenceOf(name)) {
      files.emplace_back(*sequence, name);
    }
  }
  std::sort(files.rbegin(), files.rend());
  return files;
}

// The newest decodable lease in `folder`, if any.
Result<std::optional<format::LeaseRecord>> NewestLease(Storage& storage,
                                                       const std::string& folder) {
  SK_ASSIGN_OR_RETURN(auto files, LeaseFiles(storage, folder));
  for (const auto& [sequence, name] : files) {
    const std::string file = Join(folder, name);
    Result<std::string> bytes = storage.ReadAll(file);
    // Replaced by a renewal since the listing: a newer one exists.
    if (bytes.status().code() == StatusCode::kNotFound) return NewestLease(storage, folder);
    SK_RETURN_IF_ERROR(bytes.status());
    Result<format::LeaseRecord> lease = format::DecodeLease(*bytes, file);
    if (lease.ok()) return std::optional<format::LeaseRecord>(std::move(*lease));
  }
  return std::optional<format::LeaseRecord>();
}

}  // namespace

format::LeaseRecord ThisProcess() {
  format::LeaseRecord me;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) me.host = host;
  me.boot_id = FirstLineOf("/proc/sys/kernel/random/boot_id");
  char ns[128] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  if (n > 0) me.pid_namespace.assign(ns, static_cast<size_t>(n));
  me.pid = ::getpid();
  me.pid_start = ProcessStartTime(me.pid);
  return me;
}

LeaseView JudgeLease(const format::LeaseRecord& lease, int64_t now_ns,
                     const format::LeaseRecord& judge, double clock_allowance_s) {
  LeaseView view;
  view.newest = lease;
  const std::string holder = HolderOf(lease);
  if (std::optional<bool> runs = HolderRuns(lease, judge)) {
    view.verdict = *runs ? LeaseVerdict::kLive : LeaseVerdict::kExpired;
    view.description = "held by " + holder + (*runs ? ", which is running" : ", which is gone");
    return view;
  }
  const double age_s = static_cast<double>(now_ns - lease.renewed_ns) / 1e9;
  const double limit_s = lease.duration_s + clock_allowance_s;
  view.verdict = age_s > limit_s ? LeaseVerdict::kExpired : LeaseVerdict::kLive;
  view.description = "held by " + holder + ", last renewed " + Seconds(age_s) +
                     " ago by this machine's clock (expired after " + Seconds(limit_s) +
                     ": its " + Seconds(lease.duration_s) + " plus " +
                     Seconds(clock_allowance_s) + " for clocks that disagree)";
  return view;
}

Result<LeaseView> ReadLease(Storage& storage, const std::string& folder,
                            const LeaseTiming& timing) {
  SK_ASSIGN_OR_RETURN(std::optional<format::LeaseRecord> newest,
                      NewestLease(storage, folder));
  if (!newest) return LeaseView{};
  return JudgeLease(*newest, WallNs(), ThisProcess(), timing.clock_allowance_s);
}

LeaseHolder::LeaseHolder(Storage& storage, std::string folder, const LeaseTiming& timing)
    : storage_(storage), folder_(std::move(folder)), timing_(timing) {
  record_ = ThisProcess();
  record_.owner = RandomOwner();
  record_.duration_s = timing_.duration_s;
  std::lock_guard lock(HeldMutex());
  HeldHere().insert(record_.owner);
}

Result<std::unique_ptr<LeaseHolder>> LeaseHolder::Acquire(Storage& storage,
                                                          std::string folder,
                                                          const LeaseTiming& timing) {
  std::unique_ptr<LeaseHolder> holder(new LeaseHolder(storage, std::move(folder), timing));
  {
    std::lock_guard lock(holder->mu_);
    SK_RETURN_IF_ERROR(holder->WriteNext().WithContext("taking the lease of " +
                                                       holder->folder_));
  }
  holder->renewer_ = std::thread([h = holder.get()] { h->RenewLoop(); });
  return holder;
}

LeaseHolder::~LeaseHolder() { StopRenewing(); }

Status LeaseHolder::WriteNext() {
  format::LeaseRecord next = record_;
  next.sequence = record_.sequence + (record_.renewed_ns == 0 ? 0 : 1);
  next.renewed_ns = WallNs();
  const auto attempted_at = std::chrono::steady_clock::now();
  SK_RETURN_IF_ERROR(storage_.WriteAll(Join(folder_, format::LeaseFileName(next.sequence)),
                                       format::EncodeLease(next), /*sync=*/false));
  if (next.sequence != record_.sequence) {
    (void)storage_.DeleteFile(Join(folder_, format::LeaseFileName(record_.sequence)));
  }
  record_ = next;
  renewed_at_ = attempted_at;
  return Status::Ok();
}

void LeaseHolder::RenewLoop() {
  std::unique_lock lock(mu_);
  const auto every = std::chrono::duration<double>(timing_.renew_every_s);
  while (!wake_.wait_for(lock, every, [this] { return stopping_; })) {
    if (!lost_.ok()) continue;
    // Another process may have judged the lease expired (this process was
    // stalled past its duration) and removed or replaced it: renewing then
    // would cover files that are being deleted.
    Result<std::optional<format::LeaseRecord>> newest = NewestLease(storage_, folder_);
    if (newest.ok() && (!*newest || (*newest)->owner != record_.owner)) {
      lost_ = LeaseLostError("the lease of " + folder_ + " was " +
                             (*newest ? "taken over by " + HolderOf(**newest)
                                      : std::string("removed")) +
                             " while this process held it");
      continue;
    }
    // A failed renewal is retried at the next turn; Check() fails once the
    // lease has gone unrenewed for its whole duration.
    (void)WriteNext();
  }
}

Status LeaseHolder::Check() {
  std::lock_guard lock(mu_);
  if (!lost_.ok()) return lost_;
  const double unrenewed_s = std::chrono::duration<double>(
                                 std::chrono::steady_clock::now() - renewed_at_)
                                 .count();
  if (unrenewed_s > timing_.duration_s) {
    return LeaseLostError("the lease of " + folder_ + " was not renewed for " +
                          Seconds(unrenewed_s) + ", longer than its " +
                          Seconds(timing_.duration_s) +
                          ", so another process may have collected its files");
  }
  SK_ASSIGN_OR_RETURN(std::optional<format::LeaseRecord> newest,
                      NewestLease(storage_, folder_));
  if (!newest || newest->owner != record_.owner) {
    return LeaseLostError("the lease of " + folder_ + " was " +
                          (newest ? "taken over by " + HolderOf(*newest)
                                  : std::string("removed")) +
                          " by another process (one that judged it expired, or `shardkeep "
                          "rm --force`)");
  }
  return Status::Ok();
}

void LeaseHolder::StopRenewing() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (renewer_.joinable()) renewer_.join();
  std::lock_guard lock(HeldMutex());
  HeldHere().erase(record_.owner);
}

void LeaseHolder::Release(const std::string& folder_now) {
  StopRenewing();
  std::lock_guard lock(mu_);
  (void)storage_.DeleteFile(Join(folder_now, format::LeaseFileName(record_.sequence)));
}

}  // namespace shardkeep::internal
